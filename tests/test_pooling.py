"""asymo.ops.pooling (C max / average pooling) against the direct reference and torch."""
import os

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
    y = max_pool2d(x, cfg["k"], cfg["s"], cfg["p"], ceil_mode=cfg["ceil"])
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
    np.testing.assert_array_equal(max_pool2d(x, k, s, p, ceil_mode=ceil),
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


def _torch_pools(x, k, s, p, ceil):
    t = torch.from_numpy(x)
    avg = {cip: F.avg_pool2d(t, k, s, p, ceil_mode=ceil, count_include_pad=cip).numpy()
           for cip in (True, False)}
    return F.max_pool2d(t, k, s, p, ceil_mode=ceil).numpy(), avg


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_planes_every_geometry_like_torch(dtype):
    # planes of 1x1 .. 9x9 (and a 3x9 / 9x3 pair) with kernels 1-3, padding up to half the
    # kernel, strides 1-3 and both ceil modes: the flat path (stride 1), the row path (the
    # rest) and their clipped edges
    rng = np.random.default_rng(5)
    sizes = [(n, n) for n in range(1, 10)] + [(3, 9), (9, 3)]
    for h, w in sizes:
        x = rng.standard_normal((2, 3, h, w)).astype(dtype)
        for k in (1, 2, 3):
            for p in range(k // 2 + 1):
                if k > min(h, w) + 2 * p:
                    continue
                for s in (1, 2, 3):
                    for ceil in (False, True):
                        tmax, tavg = _torch_pools(x, k, s, p, ceil)
                        np.testing.assert_array_equal(max_pool2d(x, k, s, p, ceil_mode=ceil), tmax,
                                                      err_msg=f"{h}x{w} k{k} s{s} p{p} {ceil}")
                        for cip in (True, False):
                            np.testing.assert_allclose(
                                avg_pool2d(x, k, s, p, ceil, cip), tavg[cip],
                                rtol=1e-12 if dtype == np.float64 else 1e-5, atol=1e-6,
                                err_msg=f"avg {h}x{w} k{k} s{s} p{p} {ceil} {cip}")


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride2_max_pooling_of_small_planes_like_torch(dtype):
    # stride-2 max pooling of planes up to 33 wide takes the flat path (rows padded with -inf
    # to an even pitch, one stride-2 pass over all of them); odd and even sizes, kernels 2-3,
    # padding, both ceil modes, non-square planes, and one NaN / inf per plane at a random
    # place (each plane checked on its own); 70 x 70 and 9 x 90 take the row path
    rng = np.random.default_rng(11)
    sizes = [(n, n) for n in (2, 3, 4, 5, 7, 8, 13, 14, 15, 27, 28, 31, 33)] + \
        [(5, 33), (33, 5), (2, 17), (70, 70), (9, 90)]
    for h, w in sizes:
        x = rng.standard_normal((2, 6, h, w)).astype(dtype)
        for i, value in enumerate((np.nan, np.inf, -np.inf)):
            x[1, i, rng.integers(h), rng.integers(w)] = value
        x[1, 3] = -np.inf  # a plane of -inf only
        for k in (2, 3):
            for p in range(k // 2 + 1):
                if k > min(h, w) + 2 * p:
                    continue
                for ceil in (False, True):
                    want = F.max_pool2d(torch.from_numpy(x), k, 2, p, ceil_mode=ceil).numpy()
                    np.testing.assert_array_equal(max_pool2d(x, k, 2, p, ceil_mode=ceil), want,
                                                  err_msg=f"{h}x{w} k{k} p{p} {ceil}")


@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (2, 5, 7, 7), (1, 4, 13, 13), (1, 3, 3, 40),
                                   (1, 2, 2, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_pools(shape, dtype):
    x = np.random.default_rng(6).standard_normal(shape).astype(dtype)
    hw = shape[2:]
    np.testing.assert_array_equal(max_pool2d(x, hw, 1), x.max(axis=(2, 3), keepdims=True))
    for ceil in (False, True):
        got = avg_pool2d(x, hw, 1, 0, ceil)
        ref = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
        np.testing.assert_allclose(got, ref, rtol=1e-12 if dtype == np.float64 else 1e-5)
    x[0, 0, -1, -1] = np.nan
    y = max_pool2d(x, hw, 1)
    assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y.ravel()[1:]).any()
    assert np.isnan(avg_pool2d(x, hw)[0, 0, 0, 0])


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("hw", [(7, 7), (14, 14), (5, 40)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pooling_nan_and_inf_at_every_position_like_torch(hw, dtype):
    # one NaN (then one +inf, one -inf) at every position class of a plane: corners, edges and
    # interior rows / columns; 7x7 and 14x14 planes take the flat path, 5x40 the row path
    h, w = hw
    rng = np.random.default_rng(7)
    base = rng.standard_normal((1, 1, h, w)).astype(dtype)
    rows = sorted({0, 1, h // 2, h - 2, h - 1})
    cols = sorted({0, 1, w // 2, w - 2, w - 1})
    configs = [(3, 1, 1, False), (3, 2, 1, True), (2, 1, 1, False), (3, 2, 0, True)]
    for value in (np.nan, np.inf, -np.inf):
        xs = []
        for r in rows:
            for c in cols:
                x = base.copy()
                x[0, 0, r, c] = value
                xs.append(x)
        x = np.concatenate(xs, axis=1)  # one plane per position: each checked on its own
        for k, s, p, ceil in configs:
            np.testing.assert_array_equal(
                max_pool2d(x, k, s, p, ceil_mode=ceil),
                F.max_pool2d(torch.from_numpy(x), k, s, p, ceil_mode=ceil).numpy(),
                err_msg=f"{value} k{k} s{s} p{p} {ceil}")


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_max_pooling_inf_planes_and_mixed_signs():
    # +inf and -inf in one plane make the NaN check's sum NaN (a false alarm: the plane is
    # redone with the NaN-propagating max), all -inf planes stay -inf
    x = np.random.default_rng(8).standard_normal((1, 4, 9, 40)).astype(np.float32)
    x[0, 0] = -np.inf
    x[0, 1, 2, 3], x[0, 1, 6, 30] = np.inf, -np.inf
    x[0, 2, :, :5] = np.inf
    x[0, 3, 4, 4] = np.nan
    for shape in ((1, 4, 9, 40), (1, 4, 9, 8)):
        xs = np.ascontiguousarray(x[..., :shape[-1]])
        for k, s, p in ((3, 1, 1), (3, 2, 1), (2, 2, 0)):
            np.testing.assert_array_equal(
                max_pool2d(xs, k, s, p), F.max_pool2d(torch.from_numpy(xs), k, s, p).numpy())


def test_repeated_calls_reuse_checked_signature():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    b = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    ya = max_pool2d(a, 3, 1, 1)
    yb = max_pool2d(b, 3, 1, 1)  # same signature, other data
    np.testing.assert_array_equal(ya, reference.max_pool2d(a, 3, 1, 1))
    np.testing.assert_array_equal(yb, reference.max_pool2d(b, 3, 1, 1))
    out = np.empty_like(yb)
    assert max_pool2d(b, 3, 1, 1, out=out) is out
    np.testing.assert_array_equal(out, yb)
    # arguments equal to a cached call's but of other types or shapes still get their errors
    with pytest.raises(TypeError, match="kernel_size"):
        max_pool2d(b, 3.0, 1, 1)
    with pytest.raises(TypeError, match="stride"):
        max_pool2d(b, 3, True, 1)
    with pytest.raises(ValueError, match="out must have shape"):
        max_pool2d(b, 3, 1, 1, out=np.empty((1, 3, 7, 6), np.float32))
    with pytest.raises(ValueError, match="out must have shape"):
        max_pool2d(b, 3, 1, 1, out=np.empty((1, 3, 7, 7), np.float64))
    with pytest.raises(TypeError, match="pool"):
        max_pool2d(b, 3, 1, 1, pool="no pool")
    # a non-contiguous out is written through a temporary
    big = np.zeros((1, 3, 7, 14), np.float32)
    max_pool2d(b, 3, 1, 1, out=big[..., ::2])
    np.testing.assert_array_equal(big[..., ::2], yb)
    # avg with the divisor rule switched on the same shapes
    np.testing.assert_allclose(avg_pool2d(a, 3, 1, 1, False, False),
                               reference.avg_pool2d(a, 3, 1, 1, False, False), rtol=1e-5)
    np.testing.assert_allclose(avg_pool2d(a, 3, 1, 1, False, True),
                               reference.avg_pool2d(a, 3, 1, 1, False, True), rtol=1e-5)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cpus")
def test_cached_call_follows_the_pool_and_its_limit():
    # one signature's cached call on pools of one and two clusters, and under a thread limit:
    # its task split is remade for each (counts of the pool's clusters, tasks of its workers)
    import asymo
    from asymo.ops import pooling

    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 64, 28, 28)).astype(np.float32)
    ref = reference.max_pool2d(x, 2, 2, 0)
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    pools = [asymo.Pool(f"fast:{c0}", spin_us=0), asymo.Pool(f"big:{c0}@1.0,little:{c1}@0.5")]
    try:
        for pool in pools + pools[::-1]:
            np.testing.assert_array_equal(max_pool2d(x, 2, 2, 0, pool=pool), ref)
        two = pools[1]
        two.limit = 1
        np.testing.assert_array_equal(max_pool2d(x, 2, 2, 0, pool=two), ref)
        call = next(c for c in pooling._local.entries.values() if c.shape == ref.shape)
        assert call.split(two)[1] * call.split(two)[0] >= call.planes
        two.limit = None
        np.testing.assert_array_equal(max_pool2d(x, 2, 2, 0, pool=two), ref)
    finally:
        for pool in pools:
            pool.close()


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_output_aliasing_the_input_gives_the_right_answer(kind):
    """out=x (a stride-1 pool keeps the shape) and out overlapping x: the input is read before
    any of it is overwritten; first call and repeated (cached) call alike."""
    fn = max_pool2d if kind == "max" else avg_pool2d
    rng = np.random.default_rng(9)
    for h in (7, 64, 100):
        for _ in range(2):
            x = rng.standard_normal((1, 4, h, h)).astype(np.float32)
            ref = fn(x.copy(), 3, 1, 1)
            y = fn(x, 3, 1, 1, out=x)
            assert y is x
            np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    big = rng.standard_normal((1, 3, 64, 66)).astype(np.float32)
    x, out = big[..., :64], big[..., 2:]  # out overlaps x, shifted by two columns
    ref = fn(x.copy(), 3, 1, 1)
    np.testing.assert_allclose(fn(x, 3, 1, 1, out=out), ref, rtol=1e-6, atol=1e-6)


def test_read_only_or_non_array_out_is_an_error():
    """First and repeated (cached) calls alike: a read-only out raises instead of being
    written, a list is a TypeError."""
    x = np.random.default_rng(2).standard_normal((1, 2, 8, 8)).astype(np.float32)
    max_pool2d(x, 2)  # the signature is cached
    ro = np.zeros((1, 2, 4, 4), np.float32)
    ro.flags.writeable = False
    for _ in range(2):
        with pytest.raises(ValueError, match="read-only"):
            max_pool2d(x, 2, out=ro)
        assert not ro.any()
    with pytest.raises(TypeError, match="out must be a numpy array"):
        avg_pool2d(x, 2, out=[[0.0]])


@pytest.mark.parametrize("kind,shape,k,s,p,ceil,include", [
    ("avg", (1, 1280, 7, 7), (7, 7), 1, 0, False, True),      # MobileNet V2's global pool
    ("avg", (1, 1000, 13, 13), (13, 13), 1, 0, False, True),  # SqueezeNet's
    ("max", (1, 64, 111, 111), 3, 2, 0, True, True),          # SqueezeNet's first max pool
    ("max", (1, 832, 7, 7), 3, 1, 1, False, True),
    ("avg", (2, 5, 9, 6), (3, 2), (2, 1), (1, 1), True, False),
    ("avg", (3, 4, 4), 2, None, 0, False, True),              # unbatched, stride = kernel
])
def test_bound_pooling_recomputes_from_the_current_input(kind, shape, k, s, p, ceil, include):
    import asymo
    from asymo.ops.pooling import bind_pool2d

    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    ref_fn = reference.max_pool2d if kind == "max" else reference.avg_pool2d
    args = (x[None] if x.ndim == 3 else x, k, k if s is None else s, p, ceil) + (
        () if kind == "max" else (include,))
    y = np.full(ref_fn(*args).shape[4 - x.ndim:], np.nan, np.float32)
    for pool in (asymo.Pool("fast:0", spin_us=0), asymo.get_pool()):
        step = bind_pool2d(kind, x, k, s, p, ceil, include, out=y, pool=pool)
        assert np.isnan(y).all()  # binding computes nothing
        for _ in range(2):  # the same arrays, new contents
            x[...] = rng.standard_normal(shape)
            step()
            ref = ref_fn(*args).reshape(y.shape)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
        y[...] = np.nan


def test_bound_pooling_falls_back_and_checks():
    import asymo
    from asymo.ops.pooling import bind_pool2d

    pool = asymo.Pool("fast:0", spin_us=0)
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 10)).astype(np.float32)
    # a non-contiguous output (a slice of a concatenation): the unbound call, same numbers
    cat = np.zeros((1, 8, 4, 5), np.float32)
    step = bind_pool2d("max", x, 2, 2, out=cat[:, 2:6], pool=pool)
    step()
    np.testing.assert_array_equal(cat[:, 2:6], reference.max_pool2d(x, 2, 2, 0, False))
    assert not cat[:, :2].any() and not cat[:, 6:].any()
    with pytest.raises(ValueError, match="kind"):
        bind_pool2d("min", x, 2, out=np.empty((1, 4, 4, 5), np.float32), pool=pool)
    with pytest.raises(ValueError, match="out must have shape"):
        bind_pool2d("max", x, 2, out=np.empty((1, 4, 4, 4), np.float32), pool=pool)
    with pytest.raises(TypeError, match="out must be a numpy array"):
        bind_pool2d("avg", x, 2, out=None, pool=pool)
    with pytest.raises(ValueError, match="pool is required"):
        bind_pool2d("avg", x, 2, out=np.empty((1, 4, 4, 5), np.float32), pool=None)
    with pytest.raises(TypeError, match="float32 or float64"):
        bind_pool2d("avg", x.astype(np.int32), 2, out=np.empty((1, 4, 4, 5), np.int32),
                    pool=pool)


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("isa", ["default", "portable"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_3x3_max_pooling_strips_like_torch(isa, dtype):
    # 3x3 max pooling with stride 1 or 2 walks strips of one vector of outputs down the plane
    # (pool_plane_3x3): widths from just over one vector of outputs (8 float32 / 4 float64
    # lanes) to several with an overlapping last strip, left padding (a shuffled stand-in
    # column), right padding and ceil-mode columns past the row (one and two of them),
    # heights from one row to several with padding and ceil rows below, and in each plane one
    # NaN / +inf / -inf at a random place or a plane of -inf only (each plane checked alone)
    from asymo.ops.conv import use_kernel_isa

    rng = np.random.default_rng(12)
    sizes = [(h, w) for w in (5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 33, 34, 38)
             for h in (1, 2, 3, 4, 7)] + [(11, 37), (28, 28), (14, 14), (55, 55), (30, 112)]
    ctx = use_kernel_isa("portable") if isa == "portable" else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for h, w in sizes:
            x = rng.standard_normal((1, 6, h, w)).astype(dtype)
            for i, value in enumerate((np.nan, np.inf, -np.inf, np.nan)):
                x[0, i, rng.integers(h), rng.integers(w)] = value
            x[0, 4] = -np.inf
            for s in (1, 2):
                for p in (0, 1):
                    if 3 > min(h, w) + 2 * p:
                        continue
                    for ceil in (False, True):
                        want = F.max_pool2d(torch.from_numpy(x), 3, s, p, ceil_mode=ceil).numpy()
                        np.testing.assert_array_equal(max_pool2d(x, 3, s, p, ceil_mode=ceil), want,
                                                      err_msg=f"{h}x{w} s{s} p{p} {ceil}")
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_3x3_max_pooling_nan_at_every_column_of_a_strip():
    # a NaN in every column in turn, on the first, a middle and the last row: the NaN check
    # of the strips must see each column a window reads (the last strip's last column, the
    # padding stand-ins, the columns of the ceil-mode window)
    for dtype in (np.float32, np.float64):
        for h, w in ((5, 19), (6, 18), (5, 24)):
            base = np.random.default_rng(13).standard_normal((1, 1, h, w)).astype(dtype)
            xs = []
            for r in (0, h // 2, h - 1):
                for c in range(w):
                    x = base.copy()
                    x[0, 0, r, c] = np.nan
                    xs.append(x)
            x = np.concatenate(xs, axis=1)
            for s, p, ceil in ((1, 0, False), (1, 1, False), (2, 0, True), (2, 1, False),
                               (2, 1, True), (2, 0, False)):
                np.testing.assert_array_equal(
                    max_pool2d(x, 3, s, p, ceil_mode=ceil),
                    F.max_pool2d(torch.from_numpy(x), 3, s, p, ceil_mode=ceil).numpy(),
                    err_msg=f"{dtype.__name__} {h}x{w} s{s} p{p} {ceil}")


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_3x3_max_pooling_reads_nothing_past_the_input():
    # the strips' vector loads near the last column of the last row: the input ends a page
    # (a load past it faults), the shapes of the CNNs' pools (the wide ones in bands of
    # output rows) and odd widths with ceil-mode and padded windows
    import mmap

    rng = np.random.default_rng(14)
    for dtype in (np.float32, np.float64):
        for c, h, w, s, p, ceil in ((3, 111, 111, 2, 0, True), (2, 112, 112, 2, 1, False),
                                    (2, 111, 111, 1, 1, False), (2, 28, 28, 1, 1, True),
                                    (1, 9, 37, 2, 1, True), (1, 13, 17, 1, 1, True),
                                    (1, 10, 33, 2, 0, True), (1, 10, 34, 2, 1, True)):
            nbytes = c * h * w * np.dtype(dtype).itemsize
            buf = mmap.mmap(-1, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
            x = np.frombuffer(buf, dtype, offset=len(buf) - nbytes).reshape(1, c, h, w)
            x[...] = rng.standard_normal(x.shape)
            np.testing.assert_array_equal(
                max_pool2d(x, 3, s, p, ceil_mode=ceil),
                F.max_pool2d(torch.from_numpy(x.copy()), 3, s, p, ceil_mode=ceil).numpy(),
                err_msg=f"{dtype.__name__} {c}x{h}x{w} s{s} p{p} {ceil}")
            # a NaN on the rows where the wide planes' bands of output rows meet
            x[0, 0, 33:37:2, w // 3] = np.nan
            np.testing.assert_array_equal(
                max_pool2d(x, 3, s, p, ceil_mode=ceil),
                F.max_pool2d(torch.from_numpy(x.copy()), 3, s, p, ceil_mode=ceil).numpy(),
                err_msg=f"NaN {dtype.__name__} {c}x{h}x{w} s{s} p{p} {ceil}")


def test_torch_argument_order_tensors_and_flags():
    # torch.nn.functional's order: max_pool2d(input, kernel_size, stride, padding, dilation,
    # ceil_mode); a fifth positional argument was taken as ceil_mode (silently another shape)
    x = np.random.default_rng(4).standard_normal((1, 2, 9, 9)).astype(np.float32)
    with pytest.raises(ValueError, match="dilation 2 is not supported"):
        max_pool2d(x, 3, 1, 1, 2)
    with pytest.raises(TypeError, match="max_pool2d: dilation"):
        max_pool2d(x, 3, 2, 1, True)  # ceil_mode is the sixth, as in torch
    np.testing.assert_array_equal(max_pool2d(x, 3, 2, 1, 1, True),
                                  reference.max_pool2d(x, 3, 2, 1, True))
    with pytest.raises(TypeError, match="avg_pool2d: count_include_pad must be a bool"):
        avg_pool2d(x, 3, 2, 1, False, 2)
    with pytest.raises(TypeError, match="max_pool2d: ceil_mode must be a bool"):
        max_pool2d(x, 3, ceil_mode="yes")
    with pytest.raises(ValueError, match="^max_pool2d: kernel_size must be >= 1"):
        max_pool2d(x, 0)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x).requires_grad_(True)
    for ours, theirs in ((max_pool2d(t, 3, 2, 1, ceil_mode=True),
                          torch.nn.functional.max_pool2d(t, 3, 2, 1, ceil_mode=True)),
                         (avg_pool2d(t, 3, 2, 1, True, False),
                          torch.nn.functional.avg_pool2d(t, 3, 2, 1, True, False))):
        assert isinstance(ours, torch.Tensor) and ours.dtype == torch.float32
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-6,
                                   atol=1e-6)
    out = torch.empty(1, 2, 3, 3)
    assert avg_pool2d(t, 3, out=out) is out
    np.testing.assert_allclose(out.numpy(), torch.nn.functional.avg_pool2d(t, 3)
                               .detach().numpy(), rtol=1e-6, atol=1e-6)
