"""Cache-line-aligned NumPy buffers.

NumPy aligns an array's data to 16 bytes. The kernels store and load 64-byte rows of their
register tiles; on a buffer that starts 16 or 48 bytes into a cache line every such row
straddles two lines, and the stores of a 1x1 convolution's output cost up to a quarter of its
time (docs/tuning.md, "Aligned buffers"). Every buffer asymo allocates starts on a cache line:
packed operands and arenas always (the packers require it), arrays returned to a caller from
`RESULT_ALIGN_BYTES` on (a few tile rows straddle little, and the aligned view costs a few
microseconds a small call would notice).
"""
import math
import numbers

import numpy as np

__all__ = ["CACHE_LINE", "RESULT_ALIGN_BYTES", "empty_aligned", "empty_result"]

#: bytes: the alignment of every buffer asymo allocates
CACHE_LINE = 64
#: bytes: smaller arrays returned to callers keep NumPy's own alignment
RESULT_ALIGN_BYTES = 4096


def empty_aligned(shape, dtype=np.float32):
    """An uninitialised C-contiguous array whose data starts on a cache line.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : data-type, default float32

    Returns
    -------
    numpy.ndarray
        Writable and C-contiguous, a view of a slightly larger buffer (``base`` keeps it
        alive) with ``ctypes.data % CACHE_LINE == 0``.

    Raises
    ------
    ValueError
        When a dimension is negative.
    """
    return _aligned(*_layout(shape, dtype))


def empty_result(shape, dtype=np.float32):
    """An uninitialised C-contiguous array to return to a caller: `empty_aligned` from
    `RESULT_ALIGN_BYTES` on, `numpy.empty` below."""
    shape, dtype, nbytes = _layout(shape, dtype)
    if nbytes < RESULT_ALIGN_BYTES:
        return np.empty(shape, dtype)
    return _aligned(shape, dtype, nbytes)


def _layout(shape, dtype):
    """(shape tuple, dtype, bytes) of an array request; negative dimensions rejected."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape, dtype, math.prod(shape) * dtype.itemsize


def _aligned(shape, dtype, nbytes):
    raw = np.empty(nbytes + CACHE_LINE, np.uint8)
    return np.ndarray(shape, dtype, raw, -raw.__array_interface__["data"][0] % CACHE_LINE)
