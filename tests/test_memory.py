"""asymo.runtime.memory: buffers asymo allocates start on a cache line."""
import numpy as np
import pytest

import asymo
from asymo.runtime.memory import CACHE_LINE, RESULT_ALIGN_BYTES, empty_aligned, empty_result


@pytest.mark.parametrize("shape", [(), 1, 7, (3, 5), (1, 64, 56, 56), (0, 4), (2, 0, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8])
def test_empty_aligned_shape_dtype_alignment(shape, dtype):
    a = empty_aligned(shape, dtype)
    want = (shape,) if isinstance(shape, int) else shape
    assert a.shape == want and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable
    if a.size:
        assert a.ctypes.data % CACHE_LINE == 0
        a[...] = 3  # the whole view is writable memory
        assert np.all(a == 3)


def test_empty_aligned_keeps_its_buffer_alive():
    a = empty_aligned((1000,), np.float64)
    a[:] = np.arange(1000)
    base = a.base
    del base
    assert a[999] == 999.0


def test_empty_aligned_rejects_negative_dimensions():
    with pytest.raises(ValueError, match="negative dimension"):
        empty_aligned((3, -1))


def test_empty_result_aligns_from_the_threshold_on():
    small = RESULT_ALIGN_BYTES // 4 - 1
    assert empty_result((small,)).base is None  # NumPy's own array below the threshold
    for n in (RESULT_ALIGN_BYTES // 4, 10_000):
        assert empty_result((n,)).ctypes.data % CACHE_LINE == 0


def test_results_of_the_drop_in_operators_are_aligned():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    y = asymo.conv2d(x, w)
    np.testing.assert_allclose(y, np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x), rtol=1e-4,
                               atol=1e-4)
    assert y.ctypes.data % CACHE_LINE == 0
    a = rng.standard_normal((96, 40)).astype(np.float32)
    b = rng.standard_normal((40, 70)).astype(np.float32)
    for c in (asymo.matmul(a, b), asymo.matmul(a, b)):  # first call plans, the second is fast
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        assert c.ctypes.data % CACHE_LINE == 0
    p = asymo.max_pool2d(rng.standard_normal((1, 16, 40, 40)).astype(np.float32), 2)
    assert p.ctypes.data % CACHE_LINE == 0
