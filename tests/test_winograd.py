"""Winograd F(2x2, 3x3) and F(4x4, 3x3) (asymo.ops.winograd): error bounds against float64,
torch, every task path and ISA variant, epilogues, the transformed-weight cache."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asymo
import asymo.ops.conv as conv_mod
from asymo.ops.conv import conv2d
from asymo.ops import winograd

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - torch is optional
    torch = None

EPS = float(np.finfo(np.float32).eps)
# Max-norm error bound, in units of eps * max(conv(|x|, |w|)) (float64 references). Measured
# worst cases (docs/winograd.md): 1.5 for F(2x2), 31 for F(4x4), 1.5 for the GEMM path.
BOUND = {2: 8.0, 4: 128.0}


def ref_conv(x, w, pad):
    """float64 3x3 stride-1 convolution of float64 copies (sliding windows + einsum)."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    (pt, pb), (pl, pr) = pad
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    return np.einsum("ncyxij,kcij->nkyx", win, w)


def check_bound(y, x, w, pad, tile, bias=None, residual=None, activation=None):
    r = ref_conv(x, w, pad)
    a = ref_conv(np.abs(x), np.abs(w), pad)
    if bias is not None:
        r = r + bias.astype(np.float64)[:, None, None]
        a = a + np.abs(bias.astype(np.float64))[:, None, None]
    if residual is not None:
        r = r + residual
        a = a + np.abs(residual)
    if activation == "relu":
        r = np.maximum(r, 0)
    elif activation == "relu6":
        r = np.clip(r, 0, 6)
    scale = max(float(a.max()) if a.size else 0.0, 1e-30)
    err = float(np.abs(y - r).max()) if r.size else 0.0
    assert err <= BOUND[tile] * EPS * scale, (err / (EPS * scale), tile)


@pytest.fixture
def force_tile(monkeypatch):
    def force(tile):
        monkeypatch.setattr(conv_mod, "WINOGRAD", tile)
    return force


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 2), c=st.integers(1, 20), k=st.integers(1, 20), h=st.integers(1, 15),
       w=st.integers(1, 15), pt=st.integers(0, 2), pb=st.integers(0, 2), pl=st.integers(0, 2),
       pr=st.integers(0, 2), tile=st.sampled_from([2, 4]),
       epi=st.sampled_from(["none", "bias", "relu", "relu6+residual"]),
       scale=st.sampled_from([1.0, 1e-3, 1e3]), seed=st.integers(0, 2**16))
def test_random_layers_within_error_bound(force_tile, n, c, k, h, w, pt, pb, pl, pr, tile, epi,
                                          scale, seed):
    if h + pt + pb < 3 or w + pl + pr < 3:
        return
    force_tile(tile)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, h, w)) * scale).astype(np.float32)
    wt = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    oh, ow = h + pt + pb - 2, w + pl + pr - 2
    bias = rng.standard_normal(k).astype(np.float32) if epi != "none" else None
    res = (rng.standard_normal((n, k, oh, ow)) * scale).astype(np.float32) \
        if "residual" in epi else None
    act = {"relu": "relu", "relu6+residual": "relu6"}.get(epi)
    pad = ((pt, pb), (pl, pr))
    # asymmetric padding through "same"-like explicit pairs is not in conv2d's API: pad
    # the input instead when the pairs differ (the kernel then sees padding 0 there)
    if pt == pb and pl == pr:
        y = conv2d(x, wt, bias, padding=(pt, pl), activation=act, residual=res)
        assert conv_mod._winograd_tile((n, c, h, w), wt.shape, np.dtype(np.float32), (1, 1),
                                       pad, (1, 1), 1) == tile
    else:
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        y = conv2d(xp, wt, bias, activation=act, residual=res)
        x, pad = xp, ((0, 0), (0, 0))
    check_bound(y, x, wt, pad, tile, bias, res, act)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("epi", ["none", "relu6", "relu+residual", "residual"])
def test_wide_planes_every_tile_run(force_tile, tile, epi):
    """Planes wide enough for runs of 8 whole tiles side by side (the vector scatter), with
    widths leaving 0..m-1 columns of partial tiles and runs broken by the row's end, with
    and without a residual, within the error bound."""
    force_tile(tile)
    rng = np.random.default_rng(17)
    for w_ in (8 * tile, 8 * tile + 1, 8 * tile + tile - 1, 17 * tile + 1, 3 * 8 * tile + 2):
        for h in (tile + 2, 3 * tile + 1):
            x = rng.standard_normal((1, 5, h, w_)).astype(np.float32)
            wt = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
            b = rng.standard_normal(7).astype(np.float32)
            res = rng.standard_normal((1, 7, h, w_)).astype(np.float32) \
                if "residual" in epi else None
            act = {"relu6": "relu6", "relu+residual": "relu"}.get(epi)
            y = conv2d(x, wt, b, padding=1, activation=act, residual=res)
            check_bound(y, x, wt, ((1, 1), (1, 1)), tile, b, res, act)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("method", [0, 1])
def test_both_task_methods_and_isas(force_tile, monkeypatch, tile, method):
    """The Winograd body on every ISA variant this CPU runs, and the task's direct fallback."""
    force_tile(tile)
    monkeypatch.setattr(conv_mod, "WINOGRAD_METHOD", method)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 13, 17, 23)).astype(np.float32)
    w = rng.standard_normal((29, 13, 3, 3)).astype(np.float32)
    b = rng.standard_normal(29).astype(np.float32)
    isas = [i for i in ("portable", "avx2_fma", "avx512") if _isa_ok(i)]
    for isa in isas:
        with conv_mod.use_kernel_isa(isa):
            y = conv2d(x, w, b, padding=1, activation="relu")
        check_bound(y, x, w, ((1, 1), (1, 1)), tile, b, None, "relu")


def _isa_ok(name):
    try:
        with conv_mod.use_kernel_isa(name):
            return True
    except ValueError:
        return False


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("shape", [(64, 64, 20), (32, 48, 7), (16, 24, 13)])
def test_auto_choice_matches_torch(shape):
    c, k, h = shape
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    tile = conv_mod._winograd_tile(x.shape, w.shape, x.dtype, (1, 1), ((1, 1), (1, 1)),
                                   (1, 1), 1)
    assert tile in (2, 4)
    y = conv2d(x, w, b, padding=1)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                   padding=1).numpy()
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-4 * np.abs(ref).max())


def test_weights_changed_in_place_are_transformed_again(force_tile):
    force_tile(4)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    y1 = conv2d(x, w, padding=1)
    w[3, 5, 1, 2] += 1.0          # one element: the cache must notice
    y2 = conv2d(x, w, padding=1)
    check_bound(y2, x, w, ((1, 1), (1, 1)), 4)
    assert not np.allclose(y1, y2)
    w *= 2.0
    check_bound(conv2d(x, w, padding=1), x, w, ((1, 1), (1, 1)), 4)


def test_packed_weight_object(force_tile):
    force_tile(4)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    pw = asymo.prepack_conv(w)
    w[:] = 0.0                    # the packed object holds its own copy
    y = conv2d(x, pw, padding=1)
    check_bound(y, x, pw.array, ((1, 1), (1, 1)), 4)
    assert not pw.array.flags.writeable
    # other paths take it too (here: the GEMM path of a strided layer)
    y2 = conv2d(x, pw, stride=2, padding=1)
    np.testing.assert_allclose(y2, conv2d(x, pw.array.copy(), stride=2, padding=1))
    with pytest.raises(ValueError, match="4-D"):
        asymo.prepack_conv(np.zeros((3, 3), np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        asymo.prepack_conv(np.zeros((1, 1, 3, 3), np.int32))


def test_out_unbatched_and_strided_output(force_tile):
    force_tile(4)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((10, 11, 12)).astype(np.float32)
    w = rng.standard_normal((9, 10, 3, 3)).astype(np.float32)
    y = conv2d(x, w, padding=1)
    check_bound(y[None], x[None], w, ((1, 1), (1, 1)), 4)
    big = np.zeros((2, 9, 11, 24), np.float32)
    out = big[:, :, :, ::2]                # not contiguous: a temporary, then copied
    xb = np.stack([x, 2 * x])
    conv2d(xb, w, padding=1, out=out)
    check_bound(out, xb, w, ((1, 1), (1, 1)), 4)
    assert np.all(big[:, :, :, 1::2] == 0)


def test_other_layers_do_not_take_winograd():
    f32 = np.dtype(np.float32)
    one = ((1, 1), (1, 1))
    assert conv_mod._winograd_tile((1, 16, 9, 9), (16, 16, 3, 3), f32, (2, 2), one, (1, 1), 1) == 0
    assert conv_mod._winograd_tile((1, 16, 9, 9), (16, 16, 3, 3), f32, (1, 1), one, (2, 2), 1) == 0
    assert conv_mod._winograd_tile((1, 16, 9, 9), (8, 8, 3, 3), f32, (1, 1), one, (1, 1), 2) == 0
    assert conv_mod._winograd_tile((1, 16, 9, 9), (16, 16, 3, 3), np.dtype(np.float64), (1, 1),
                                   one, (1, 1), 1) == 0
    assert conv_mod._winograd_tile((1, 16, 9, 9), (16, 16, 5, 5), f32, (1, 1), one, (1, 1), 1) == 0
    assert conv_mod._winograd_tile((1, 64, 56, 56), (64, 64, 3, 3), f32, (1, 1), one, (1, 1),
                                   1) == 4
    assert conv_mod._winograd_tile((1, 512, 7, 7), (512, 512, 3, 3), f32, (1, 1), one, (1, 1),
                                   1) == 2


def test_nan_propagates(force_tile):
    force_tile(4)
    x = np.ones((1, 8, 8, 8), np.float32)
    x[0, 2, 3, 3] = np.nan
    w = np.ones((8, 8, 3, 3), np.float32)
    y = conv2d(x, w, padding=1, activation="relu")
    assert np.isnan(y[0, :, 3, 3]).all()
    assert np.isfinite(y[0, :, 7, 0]).all()


def test_two_cluster_pool(force_tile):
    from asymo.hw.topology import parse_spec

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    force_tile(4)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 24, 30, 30)).astype(np.float32)
    w = rng.standard_normal((40, 24, 3, 3)).astype(np.float32)
    res = rng.standard_normal((1, 40, 30, 30)).astype(np.float32)
    with asymo.Pool(topology=parse_spec(f"big:{cpus[0]}@1.0,little:{cpus[1]}@0.5")) as pool:
        y = conv2d(x, w, padding=1, residual=res, activation="relu", pool=pool)
    check_bound(y, x, w, ((1, 1), (1, 1)), 4, None, res, "relu")


@pytest.mark.parametrize("speed, tasks, counts", [(0.5, 3, [2, 1]), (0.33, 2, [2, 0]),
                                                   (None, 2, None)])
def test_few_tasks_are_cut_so_the_slower_cluster_is_not_last(speed, tasks, counts):
    """Two channel blocks on a fast and a half-speed core would give each one (the job as slow
    as on the fast core alone): a third block lets the split follow capacity. A job that rounds
    to the fastest cluster alone is left so."""
    from asymo.hw.topology import Cluster, Topology, parse_spec

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    top = (parse_spec(f"big:{cpus[0]}@1.0,little:{cpus[1]}@{speed}") if speed
           else Topology(clusters=(Cluster("c0", tuple(cpus[:2]), capacity=1.0),)))
    xshape, wshape = (1, 512, 7, 7), (512, 512, 3, 3)
    with asymo.Pool(topology=top) as pool:
        plan = winograd.WinogradPlan(pool, xshape, wshape, ((1, 1), (1, 1)), 2, None)
        assert plan.ntasks == tasks
        assert (None if plan.counts is None else list(plan.counts[0:2])) == counts
        if speed == 0.5:  # the three channel blocks give the right answer
            rng = np.random.default_rng(12)
            x = rng.standard_normal(xshape).astype(np.float32)
            w = rng.standard_normal(wshape).astype(np.float32)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(conv_mod, "WINOGRAD", 2)
                y = conv2d(x, w, padding=1, pool=pool)
            check_bound(y, x, w, ((1, 1), (1, 1)), 2)


def test_transform_weights_reference_identity():
    """A^T [(G g G^T) (.) (B^T d B)] A equals the 3x3 correlation on one tile (float64)."""
    rng = np.random.default_rng(4)
    for m in (2, 4):
        a = m + 2
        d = rng.standard_normal((a, a))
        g = rng.standard_normal((3, 3))
        u = winograd.G[m] @ g @ winograd.G[m].T
        v = winograd.BT[m] @ d @ winograd.BT[m].T
        y = winograd.AT[m] @ (u * v) @ winograd.AT[m].T
        direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)]
                           for i in range(m)])
        np.testing.assert_allclose(y, direct, rtol=1e-12, atol=1e-12)
    packed = winograd.transform_weights(rng.standard_normal((7, 5, 3, 3)), 4)
    assert packed.shape == (36, 2, 5, winograd.MR) and packed.dtype == np.float32
    assert np.all(packed[:, 1, :, 1:] == 0)      # channels 7..11 are padding
    with pytest.raises(ValueError):
        winograd.transform_weights(np.zeros((2, 2, 5, 5)), 4)
    with pytest.raises(ValueError):
        winograd.transform_weights(np.zeros((2, 2, 3, 3)), 3)


def test_packed_weight_without_copy_and_models_hold_packed_weights():
    w = np.ones((4, 4, 3, 3), np.float32)
    assert asymo.prepack_conv(w, copy=False).array is not w     # writeable: copied anyway
    w.setflags(write=False)
    assert asymo.prepack_conv(w, copy=False).array is w
    from asymo import models

    model = models.get("squeezenet", image_size=64)
    step = next(s for layer in model.layers for s in layer.weighted if len(s.kernel) == 2)
    pw, b = model.packed_parameters(step)
    assert isinstance(pw, asymo.PackedConvWeight)
    assert pw.array is model.parameters(step)[0]
    assert model.packed_parameters(step)[0] is pw


@pytest.mark.parametrize("case", ["pointwise", "implicit", "explicit", "grouped"])
def test_packed_weight_on_the_gemm_paths(case, monkeypatch):
    """A PackedConvWeight feeds the GEMM its pre-packed A panels (asymo.prepack) on the
    one-group GEMM paths; the result is the unpacked one."""
    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "ROWS", "off")  # (the rows path would take the strided ones)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    rng = np.random.default_rng(12)
    xs, ws, stride, pad, groups = {
        "pointwise": ((1, 160, 20, 20), (208, 160, 1, 1), 1, 0, 1),  # (130 KB: the GEMM)
        "implicit": ((1, 32, 20, 20), (48, 32, 3, 3), 2, 1, 1),
        "explicit": ((1, 8, 40, 40), (16, 8, 7, 7), 2, 3, 1),
        "grouped": ((1, 16, 12, 12), (16, 8, 3, 3), 2, 1, 2)}[case]
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    pw = asymo.prepack_conv(w)
    y = conv2d(x, pw, b, stride, pad, 1, groups, activation="relu")
    ref = conv2d(x, w, b, stride, pad, 1, groups, activation="relu")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    made = "gemm" in pw._transforms
    assert made == (groups == 1)
    if made:
        assert pw._transforms["gemm"].layouts   # the packed layouts were used
