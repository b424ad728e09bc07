"""bind_conv2d: a convolution bound once to its arrays gives conv2d's result on every call,
for every kernel path, as the input's contents change."""
import numpy as np
import pytest

import asymo
from asymo.ops.conv import BoundConv2d, PackedConvWeight, bind_conv2d, conv2d
from asymo.runtime.pool import hold

# (x shape, w shape, stride, padding, groups): depthwise, Winograd, 1x1, implicit im2col,
# the explicit im2col stem, grouped
CASES = [
    ((2, 16, 12, 12), (16, 1, 3, 3), 1, 1, 16),
    ((2, 16, 13, 11), (16, 1, 3, 3), 2, 1, 16),
    ((2, 16, 12, 12), (24, 16, 3, 3), 1, 1, 1),
    ((2, 24, 9, 9), (40, 24, 1, 1), 1, 0, 1),
    ((2, 12, 15, 15), (20, 12, 5, 5), 1, 2, 1),
    ((2, 3, 33, 33), (16, 3, 7, 7), 2, 3, 1),
    ((2, 16, 10, 10), (32, 4, 3, 3), 1, 1, 4),
]


@pytest.mark.parametrize("xs,ws,stride,pad,groups", CASES)
@pytest.mark.parametrize("act,with_res", [(None, False), ("relu6", True), ("relu", False)])
def test_bound_matches_conv2d(xs, ws, stride, pad, groups, act, with_res):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    ref0 = conv2d(x, w, b, stride, pad, groups=groups, activation=act)
    res = rng.standard_normal(ref0.shape).astype(np.float32) if with_res else None
    out = np.full(ref0.shape, np.nan, np.float32)
    pool = asymo.get_pool()
    bound = bind_conv2d(x, PackedConvWeight(w), b, stride, pad, groups=groups, activation=act,
                        residual=res, out=out, pool=pool)
    assert isinstance(bound, BoundConv2d)
    assert bound._fallback is None  # the direct path, not conv2d per call
    for trial in range(3):
        x[...] = rng.standard_normal(xs)           # new contents, same memory
        if res is not None:
            res[...] = rng.standard_normal(res.shape)
        with hold(pool):
            bound()
        ref = conv2d(x, w, b, stride, pad, groups=groups, activation=act, residual=res)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_bound_residual_aliasing_output_falls_back_correctly():
    # the arena may give the output the residual's memory: the same array is added in place
    # (its path writes each output once: tests/test_residual_in_place.py); an output that
    # overlaps the residual otherwise is bound through conv2d (a copy)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 8, 1, 1)).astype(np.float32)
    buf = rng.standard_normal((1, 9, 6, 6)).astype(np.float32)
    pool = asymo.get_pool()
    for residual, out, fallback in ((buf[:, :8], buf[:, :8], False),
                                    (buf[:, :8], buf[:, 1:], True)):
        bound = bind_conv2d(x, w, None, residual=residual, out=out, pool=pool)
        assert (bound._fallback is not None) is fallback
        for _ in range(2):
            buf[...] = rng.standard_normal(buf.shape)
            ref = conv2d(x, w, None, residual=residual.copy())
            with hold(pool):
                bound()
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_bound_into_channel_slice():
    # a concat's input written in place: the output is a channel slice of a larger array
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 8, 7, 7)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    cat = np.zeros((1, 20, 7, 7), np.float32)
    pool = asymo.get_pool()
    bound = bind_conv2d(x, w, None, padding=1, out=cat[:, 4:10], pool=pool)
    with hold(pool):
        bound()
    np.testing.assert_allclose(cat[:, 4:10], conv2d(x, w, None, padding=1), rtol=1e-5,
                               atol=1e-4)
    assert not cat[:, :4].any() and not cat[:, 10:].any()


def test_bind_checks_like_conv2d():
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(ValueError, match="channels"):
        bind_conv2d(x, np.zeros((4, 2, 3, 3), np.float32), out=np.zeros((1, 4, 6, 6),
                                                                          np.float32),
                    pool=asymo.get_pool())
    with pytest.raises(ValueError, match="out has shape"):
        bind_conv2d(x, np.zeros((4, 3, 3, 3), np.float32), out=np.zeros((1, 4, 8, 8),
                                                                          np.float32),
                    pool=asymo.get_pool())


@pytest.mark.parametrize("m,k,n", [(13, 37, 50), (64, 147, 300), (6, 8, 16), (100, 20, 7)])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_gemm_epilogue_in_the_store(m, k, n, act):
    # C = act(A @ B + bias[:, None] + R), applied by the GEMM to each block of C
    from asymo.plan.gemm import plan_gemm
    from asymo.runtime.ffi import ffi, lib

    rng = np.random.default_rng(m * n + act)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bm = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32) * 4
    c = np.full((m, n), np.nan, np.float32)
    pool = asymo.get_pool()
    plan = plan_gemm(m, k, n, "float32", pool)
    assert plan.kind == "mm"
    g = ffi.new("asymo_gemm_args *")
    g.dtype, g.m, g.k, g.n, g.nbatch = 0, m, k, n, 1
    g.a, g.rsa, g.csa = ffi.from_buffer(a), k, 1
    g.b, g.rsb, g.csb = ffi.from_buffer(bm), n, 1
    g.c, g.rsc, g.csc = ffi.from_buffer(c), n, 1
    g.row_bias, g.residual, g.rs_residual, g.activation = (ffi.from_buffer(bias),
                                                           ffi.from_buffer(res), n, act)
    with hold(pool):
        assert lib.asymo_gemm(pool._handle, g, plan.cdata()) == 0
    ref = a.astype(np.float64) @ bm + bias[:, None] + res
    ref = {0: ref, 1: np.maximum(ref, 0), 2: np.clip(ref, 0, 6)}[act]
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-4)
    g.activation = 3                       # not an activation: refused
    with hold(pool):
        assert lib.asymo_gemm(pool._handle, g, plan.cdata()) == lib.ASYMO_EINVAL


@pytest.mark.parametrize("shape", [((1, 3, 30, 30), (8, 3, 7, 7), 2, 3),     # explicit im2col
                                   ((1, 16, 20, 20), (8, 16, 1, 1), 2, 0),   # strided 1x1
                                   ((1, 8, 20, 20), (8, 8, 5, 5), 1, 2)])    # implicit
def test_bound_calls_keep_their_plan_when_the_plan_cache_evicts(shape, monkeypatch):
    """The plan owns C data a bound call points at (column bounds, task counts): evicting it
    from the plan cache (it is cleared when full) must not free that under the bound call."""
    import gc
    import weakref

    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "_plan_cache", weakref.WeakKeyDictionary())
    xs, ws, stride, pad = shape
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    pool = asymo.Pool(topology="c0:0@1")
    try:
        ref = conv2d(x.astype(np.float64), w.astype(np.float64), None, stride, pad)
        out = np.empty(ref.shape, np.float32)
        bound = bind_conv2d(x, w, None, stride, pad, out=out, pool=pool)
        (plan,) = conv_mod._plan_cache[pool].values()
        alive = weakref.ref(plan)
        del plan
        conv_mod._plan_cache[pool].clear()
        gc.collect()
        assert alive() is not None
        bound()
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    finally:
        pool.close()
