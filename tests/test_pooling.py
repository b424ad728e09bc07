"""asymo.ops.pooling (C max / average pooling) against the direct reference and torch."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asymo.models import reference
from asymo.ops.pooling import avg_pool2d, max_pool2d

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = None


@st.composite
def pool_configs(draw):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    h = draw(st.integers(max(1, k[0] - 2 * p[0]), 13))
    w = draw(st.integers(max(1, k[1] - 2 * p[1]), 13))
    return dict(shape=(draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w), k=k, s=s, p=p,
                ceil=draw(st.booleans()), include=draw(st.booleans()),
                dtype=draw(st.sampled_from([np.float32, np.float64])),
                seed=draw(st.integers(0, 2**31)))


@settings(max_examples=120, deadline=None)
@given(pool_configs())
def test_pooling_matches_reference_and_torch(cfg):
    x = np.random.default_rng(cfg["seed"]).standard_normal(cfg["shape"]).astype(cfg["dtype"])
    y = max_pool2d(x, cfg["k"], cfg["s"], cfg["p"], cfg["ceil"])
    ref = reference.max_pool2d(x, cfg["k"], cfg["s"], cfg["p"], cfg["ceil"])
    np.testing.assert_array_equal(y, ref.astype(cfg["dtype"]))
    a = avg_pool2d(x, cfg["k"], cfg["s"], cfg["p"], cfg["ceil"], cfg["include"])
    aref = reference.avg_pool2d(x, cfg["k"], cfg["s"], cfg["p"], cfg["ceil"], cfg["include"])
    np.testing.assert_allclose(a, aref, rtol=1e-5, atol=1e-6)
    if torch is not None:
        t = torch.from_numpy(x)
        np.testing.assert_array_equal(
            y, F.max_pool2d(t, cfg["k"], cfg["s"], cfg["p"], ceil_mode=cfg["ceil"]).numpy())
        np.testing.assert_allclose(
            a, F.avg_pool2d(t, cfg["k"], cfg["s"], cfg["p"], ceil_mode=cfg["ceil"],
                            count_include_pad=cfg["include"]).numpy(), rtol=1e-5, atol=1e-6)


def test_pooling_unbatched_out_and_errors():
    x = np.arange(2 * 5 * 5, dtype=np.float32).reshape(2, 5, 5)
    y = max_pool2d(x, 2)
    assert y.shape == (2, 2, 2)
    np.testing.assert_array_equal(y, reference.max_pool2d(x[None], 2)[0])
    out = np.empty((2, 2, 2), np.float32)
    assert avg_pool2d(x, 2, out=out) is out
    with pytest.raises(TypeError, match="int32"):
        max_pool2d(x.astype(np.int32), 2)
    with pytest.raises(ValueError, match="half the kernel"):
        max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match=r"\(2, 5, 5\)"):
        max_pool2d(x, 7)
    with pytest.raises(ValueError, match=r"\(5, 5\)"):
        max_pool2d(x[0], 2)


@pytest.mark.parametrize("shape,k,s,p,ceil", [
    ((1, 2, 3, 1300), (3, 3), (2, 2), (1, 1), True),     # rows wider than one column block
    ((1, 2, 5, 1031), (1, 5), (1, 3), (0, 2), False),
    ((2, 3, 13, 13), (13, 13), (1, 1), (0, 0), False),   # a global window
    ((1, 4, 7, 600), (7, 600), (1, 1), (0, 0), False),   # a global window wider than a block
])
def test_pooling_wide_rows_and_global_windows(shape, k, s, p, ceil):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(max_pool2d(x, k, s, p, ceil),
                                  reference.max_pool2d(x, k, s, p, ceil))
    for include in (True, False):
        np.testing.assert_allclose(avg_pool2d(x, k, s, p, ceil, include),
                                   reference.avg_pool2d(x, k, s, p, ceil, include),
                                   rtol=1e-5, atol=1e-6)


def test_max_pooling_propagates_nan_like_torch():
    x = np.random.default_rng(4).standard_normal((1, 2, 9, 9)).astype(np.float32)
    x[0, 0, 4, 4] = np.nan
    x[0, 1, 0, 8] = np.nan
    y = max_pool2d(x, 3, 2, 1)
    # with a 3x3 window, stride 2, pad 1: row and column 4 lie in output 2 only, column 8 in
    # output 4 only, row 0 in output 0 only
    expect = np.zeros(y.shape, bool)
    expect[0, 0, 2, 2] = expect[0, 1, 0, 4] = True
    np.testing.assert_array_equal(np.isnan(y), expect)
    np.testing.assert_array_equal(y[~expect], max_pool2d(np.nan_to_num(x, nan=-9), 3, 2, 1)[~expect])
    if torch is not None:
        np.testing.assert_array_equal(y, F.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy())
