"""Pre-packed constant operands: `prepack` packs a matrix that is reused across many products
(layer weights, a fixed projection) once into the micro-panel layout of the GEMM kernels.

A `PackedOperand` is accepted wherever its matrix is by `asymo.matmul` (as ``b``, or as ``a``
when packed with ``side="a"``) and by `asymo.ops.matmul.gemm`. A plan's clusters each use the
layout of their kernel and K block (``kc``); a layout is made the first time a plan needs it and
kept (at most `MAX_LAYOUTS`), so every later call skips the packing of that operand. Calls the
packed layout cannot serve -- a matrix-vector plan, a batch of products, other dtypes -- use the
operand's own copy of the matrix and give the same result as the unpacked product.

The matrix is copied when packed: later changes to the caller's array do not reach the packed
operand.
"""
from __future__ import annotations

import threading

import numpy as np

from asymo.runtime.ffi import ffi, lib

__all__ = ["PackedOperand", "prepack", "MAX_LAYOUTS"]

#: layouts kept per operand (the C driver reads at most this many)
MAX_LAYOUTS = 8

_SIDES = {"a": lib.ASYMO_PACK_A, "b": lib.ASYMO_PACK_B}
_DTYPES = {np.dtype(np.float32): lib.ASYMO_DTYPE_F32, np.dtype(np.float64): lib.ASYMO_DTYPE_F64}
_ALIGN = 64


class PackedOperand:
    """A constant 2-D float32/float64 matrix packed for asymo's GEMM (see `prepack`).

    Attributes
    ----------
    array : ndarray
        Read-only C-contiguous copy of the matrix.
    side : {"a", "b"}
        Which operand of ``a @ b`` it is packed as.
    shape, dtype, ndim : as of ``array``
    """

    __slots__ = ("array", "side", "_struct", "_buffers", "_lock", "__weakref__")

    def __init__(self, array, side):
        self.array = array
        self.side = side
        self._buffers = {}
        self._lock = threading.Lock()
        s = ffi.new("asymo_gemm_packed *")
        s.side = _SIDES[side]
        s.dtype = _DTYPES[array.dtype]
        if side == "a":
            s.dim, s.k = array.shape
        else:
            s.k, s.dim = array.shape
        self._struct = s

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def ndim(self):
        return 2

    def __repr__(self):
        return (f"PackedOperand(side={self.side!r}, shape={self.shape}, dtype={self.dtype}, "
                f"layouts={sorted(self._buffers)})")

    def __array__(self, dtype=None, copy=None):
        # np.asarray(packed) gives the matrix (read-only), so NumPy functions accept it
        return self.array if dtype is None else self.array.astype(dtype)

    @property
    def layouts(self):
        """The (isa value, kc) pairs packed so far."""
        return tuple(self._buffers)

    def cdata_for(self, plan):
        """The ``asymo_gemm_packed *`` holding the layouts ``plan``'s clusters use (made now
        for those missing, while fewer than `MAX_LAYOUTS` exist)."""
        isa = plan.cdata().isa
        K = plan.shape[1]
        for (lo, hi), (_mc, _nc, kc) in zip(plan.cluster_ranges, plan.blocks):
            if hi <= lo:
                continue
            key = (isa, min(int(kc), max(K, 1)))  # every kc >= K is one block: one layout
            if key not in self._buffers:
                self._pack(*key)
        return self._struct

    def _pack(self, isa, kc):
        with self._lock:
            if (isa, kc) in self._buffers or len(self._buffers) >= MAX_LAYOUTS:
                return
            s = self._struct
            nbytes = lib.asymo_gemm_packed_bytes(isa, s.dtype, s.side, s.dim, s.k)
            if nbytes < 0:
                raise ValueError(f"prepack: the kernel family {isa} cannot pack this operand")
            raw = np.empty(nbytes + _ALIGN, np.uint8)
            off = (-raw.ctypes.data) % _ALIGN
            buf = raw[off:off + nbytes]
            x = self.array
            es = x.itemsize
            rc = lib.asymo_gemm_pack(isa, s.dtype, s.side, s.dim, s.k, kc,
                                     ffi.cast("void *", x.ctypes.data), x.strides[0] // es,
                                     x.strides[1] // es,
                                     ffi.cast("void *", buf.ctypes.data))
            if rc != lib.ASYMO_OK:
                raise ValueError(f"prepack: packing failed ({rc})")
            n = s.nlayouts
            s.isa[n] = isa
            s.kc[n] = kc
            s.data[n] = ffi.cast("void *", buf.ctypes.data)
            self._buffers[(isa, kc)] = raw  # keeps the memory alive
            s.nlayouts = n + 1


def prepack(x, *, side="b"):
    """Pack a constant matrix once for repeated products.

    Parameters
    ----------
    x : array_like, 2-D, float32 or float64
        The matrix: ``b`` of ``a @ b`` (shape (K, N)) for ``side="b"``, ``a`` (shape (M, K))
        for ``side="a"``.
    side : {"a", "b"}, keyword-only
        The operand position it will take.

    Returns
    -------
    PackedOperand
        Accepted by `asymo.matmul` (in that position) and `asymo.ops.matmul.gemm`.

    Raises
    ------
    ValueError
        When ``x`` is not 2-D or ``side`` is not "a" or "b".
    TypeError
        When ``x`` is not float32 or float64.

    Examples
    --------
    >>> w = asymo.prepack(weights)          # (K, N)
    >>> y = asymo.matmul(x, w)              # same result as asymo.matmul(x, weights)
    """
    if side not in _SIDES:
        raise ValueError(f"prepack: side must be 'a' or 'b', not {side!r}")
    if isinstance(x, PackedOperand):
        if x.side == side:
            return x
        x = x.array
    arr = np.array(x, copy=True, order="C")
    if arr.ndim != 2:
        raise ValueError(f"prepack: the matrix must be 2-D, got shape {arr.shape}")
    if arr.dtype not in _DTYPES or not arr.dtype.isnative:
        raise TypeError(f"prepack: the matrix must be float32 or float64, got {arr.dtype}")
    arr.flags.writeable = False
    return PackedOperand(arr, side)
