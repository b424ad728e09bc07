"""asymo.conv2d against the direct reference and torch; validation of bad input."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asymo
from asymo.ops.conv import conv2d
from asymo.models import reference
from _conv_checks import check_layer, input_at_mapping_end

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}


def _close(y, ref, dtype):
    """Compare with a tolerance scaled to the result's magnitude (float32 sums of K terms)."""
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    tol = TOL[dtype]
    np.testing.assert_allclose(y, ref, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _torch_conv(x, w, b, stride, padding, dilation, groups, activation=None):
    y = F.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                 None if b is None else torch.from_numpy(b), stride, padding, dilation, groups)
    if activation == "relu":
        y = y.relu()
    elif activation == "relu6":
        y = y.clamp(0, 6)
    return y.numpy()


@st.composite
def conv_configs(draw):
    depthwise = draw(st.booleans())
    if depthwise:
        c = draw(st.integers(1, 6))
        groups = c
        cin_g = 1
        cout = c * draw(st.integers(1, 2))
    else:
        groups = draw(st.integers(1, 3))
        cin_g = draw(st.integers(1, 4))
        c = cin_g * groups
        cout = groups * draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    eff = (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)
    h = draw(st.integers(max(1, eff[0] - 2 * padding[0]), 14))
    w = draw(st.integers(max(1, eff[1] - 2 * padding[1]), 14))
    return dict(n=draw(st.integers(1, 2)), c=c, h=h, w=w, cout=cout, cin_g=cin_g, kh=kh, kw=kw,
                stride=stride, padding=padding, dilation=dilation, groups=groups,
                dtype=draw(st.sampled_from([np.float32, np.float64])),
                bias=draw(st.booleans()),
                activation=draw(st.sampled_from([None, "relu", "relu6"])),
                seed=draw(st.integers(0, 2**31)))


def _make(cfg):
    rng = np.random.default_rng(cfg["seed"])
    dt = cfg["dtype"]
    x = rng.standard_normal((cfg["n"], cfg["c"], cfg["h"], cfg["w"])).astype(dt)
    w = rng.standard_normal((cfg["cout"], cfg["cin_g"], cfg["kh"], cfg["kw"])).astype(dt)
    b = rng.standard_normal(cfg["cout"]).astype(dt) if cfg["bias"] else None
    return x, w, b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs())
def test_random_configs_match_reference(cfg):
    x, w, b = _make(cfg)
    y = conv2d(x, w, b, cfg["stride"], cfg["padding"], cfg["dilation"], cfg["groups"],
               activation=cfg["activation"])
    ref = reference.conv2d(x, w, b, cfg["stride"], cfg["padding"], cfg["dilation"],
                           cfg["groups"], cfg["activation"])
    assert y.dtype == cfg["dtype"]
    assert y.shape == ref.shape
    _close(y, ref, cfg["dtype"])


@needs_torch
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs())
def test_random_configs_match_torch(cfg):
    x, w, b = _make(cfg)
    y = conv2d(x, w, b, cfg["stride"], cfg["padding"], cfg["dilation"], cfg["groups"],
               activation=cfg["activation"])
    ref = _torch_conv(x, w, b, cfg["stride"], cfg["padding"], cfg["dilation"], cfg["groups"],
                      cfg["activation"])
    _close(y, ref, cfg["dtype"])


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("k,d", [(1, 1), (2, 1), (3, 1), (4, 2), (5, 1), ((2, 3), (1, 2))])
def test_padding_same_and_valid(k, d):
    rng = np.random.default_rng(3)
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((2, 4, 9, 11)).astype(np.float32)
    w = rng.standard_normal((5, 4, kh, kw)).astype(np.float32)
    y = conv2d(x, w, padding="same", dilation=d)
    assert y.shape[2:] == x.shape[2:]
    dh, dw = (d, d) if isinstance(d, int) else d
    th, tw = dh * (kh - 1), dw * (kw - 1)
    ref = reference.conv2d(x, w, None, 1, ((th // 2, th - th // 2), (tw // 2, tw - tw // 2)),
                           d)
    _close(y, ref, np.float32)
    if torch is not None:
        _close(y, _torch_conv(x, w, None, 1, "same", d, 1), np.float32)
    valid = conv2d(x, w, padding="valid", dilation=d)
    _close(valid, reference.conv2d(x, w, None, 1, 0, d), np.float32)


def test_unbatched_input_gives_unbatched_output():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    y = conv2d(x, w, padding=1)
    assert y.shape == (4, 8, 8)
    _close(y, reference.conv2d(x[None], w, None, 1, 1)[0], np.float64)


def test_out_argument_and_non_contiguous_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 10, 12)).astype(np.float32)[:, ::2, :, ::-1]
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    big = np.full((2, 9, 10, 12), 7.0, np.float32)
    out = big[:, 2:6]  # a channel slice: each image contiguous, images strided
    y = conv2d(x, w, b, padding=1, activation="relu", out=out)
    assert y is out
    ref = reference.conv2d(x, w, b, 1, 1, activation="relu")
    _close(big[:, 2:6], ref, np.float32)
    assert np.all(big[:, :2] == 7.0) and np.all(big[:, 6:] == 7.0)
    # an output view that is not contiguous inside an image goes through a temporary
    big2 = np.zeros((2, 4, 10, 24), np.float32)
    y2 = conv2d(x, w, b, padding=1, out=big2[..., ::2])
    _close(y2, reference.conv2d(x, w, b, 1, 1), np.float32)


@pytest.mark.parametrize("groups", [1, 4])
def test_residual_is_added_before_activation(groups):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
    w = rng.standard_normal((4, 4 // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    r = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
    y = conv2d(x, w, b, padding=1, groups=groups, activation="relu", residual=r)
    ref = np.maximum(reference.conv2d(x, w, b, 1, 1, groups=groups) + r, 0)
    _close(y, ref, np.float32)


def test_large_column_matrix_is_chunked(monkeypatch):
    # force several column chunks, including a partial last one
    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "COL_CHUNK_BYTES", 3 * 27 * 13 * 4)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 20, 26)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    y = conv2d(x, w, stride=(2, 2), padding=1)
    _close(y, reference.conv2d(x, w, None, 2, 1), np.float32)
    # unit stride with out_w == width (the shifted-copy im2col), chunks starting mid-image
    for pad, dil in (((1, 1), 1), ((2, 3), (2, 1)), ((0, 1), 1)):
        w2 = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
        y = conv2d(x, w2, padding=pad, dilation=dil)
        _close(y, reference.conv2d(x, w2, None, 1, pad, dil), np.float32)


def test_byte_swapped_and_list_inputs():
    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3))
    y = conv2d(x.astype(">f8"), w.astype(">f8"), padding=1)
    assert y.dtype == np.float64
    _close(y, reference.conv2d(x, w, None, 1, 1), np.float64)
    _close(conv2d(x.tolist(), w.tolist()), reference.conv2d(x, w), np.float64)


def test_zero_batch_and_lazy_attribute():
    assert asymo.conv2d is conv2d
    y = conv2d(np.zeros((0, 3, 5, 5), np.float32), np.zeros((2, 3, 3, 3), np.float32))
    assert y.shape == (0, 2, 3, 3)


@pytest.mark.parametrize("x_shape,w_shape,kwargs,exc,words", [
    ((1, 3, 8, 8), (4, 2, 3, 3), {}, ValueError, ["3 channels", "(4, 2, 3, 3)"]),
    ((1, 4, 8, 8), (3, 2, 3, 3), {"groups": 2}, ValueError, ["not divisible by groups=2"]),
    ((1, 3, 4, 4), (2, 3, 7, 7), {}, ValueError, ["larger than the padded input", "(1, 3, 4, 4)"]),
    ((1, 3, 4, 4), (2, 3, 3, 3), {"dilation": 3}, ValueError, ["larger than the padded input"]),
    ((3, 8), (2, 3, 3, 3), {}, ValueError, ["(3, 8)"]),
    ((1, 1, 3, 8, 8), (2, 3, 3, 3), {}, ValueError, ["(1, 1, 3, 8, 8)"]),
    ((1, 3, 8, 8), (2, 3, 3), {}, ValueError, ["(2, 3, 3)"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"padding": "same", "stride": 2}, ValueError, ["same"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"padding": "full"}, ValueError, ["'full'"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"padding": -1}, ValueError, ["padding"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"stride": 0}, ValueError, ["stride"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"stride": (1, 2, 3)}, ValueError, ["stride"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"groups": 0}, ValueError, ["groups"]),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"activation": "gelu"}, ValueError, ["gelu"]),
])
def test_bad_input_raises_with_shapes(x_shape, w_shape, kwargs, exc, words):
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.float32)
    with pytest.raises(exc) as info:
        conv2d(x, w, **kwargs)
    for word in words:
        assert word in str(info.value)


def test_bad_dtypes_raise_type_error():
    x = np.zeros((1, 3, 8, 8), np.float32)
    w = np.zeros((2, 3, 3, 3), np.float32)
    with pytest.raises(TypeError, match="int64"):
        conv2d(x.astype(np.int64), w)
    with pytest.raises(TypeError, match="float16"):
        conv2d(x, w.astype(np.float16))
    with pytest.raises(TypeError, match="same dtype"):
        conv2d(x, w.astype(np.float64))
    with pytest.raises(TypeError, match="bias"):
        conv2d(x, w, np.zeros(2, np.float64))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        conv2d(x, w, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        conv2d(x, w, out=np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        conv2d(x, w, out=np.zeros((1, 2, 6, 6), np.float64))


@pytest.fixture(scope="module")
def two_cluster_pool():
    import os

    from asymo.hw.topology import parse_spec

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    spec = f"big:{cpus[0]}@1.0,little:{cpus[1]}@0.5"
    with asymo.Pool(topology=parse_spec(spec)) as pool:
        yield pool


@pytest.mark.parametrize("case", ["im2col", "pointwise", "depthwise", "grouped"])
def test_two_cluster_pool_matches_reference(two_cluster_pool, case):
    rng = np.random.default_rng(11)
    cfg = {"im2col": ((2, 6, 23, 19), (8, 6, 3, 3), 2, 1, 1),
           "pointwise": ((2, 6, 23, 19), (8, 6, 1, 1), 1, 0, 1),
           "depthwise": ((2, 6, 23, 19), (12, 1, 3, 3), 1, 1, 6),
           "grouped": ((1, 6, 23, 19), (4, 3, 5, 5), 1, 2, 2)}[case]
    xs, ws, stride, pad, groups = cfg
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    y = conv2d(x, w, b, stride, pad, 1, groups, activation="relu6", pool=two_cluster_pool)
    _close(y, reference.conv2d(x, w, b, stride, pad, 1, groups, "relu6"), np.float32)


def _supported_isas():

    names = []
    for name in ("portable", "avx2_fma", "avx512", "neon"):
        try:
            with asymo.ops.conv.use_kernel_isa(name):
                pass
        except ValueError:
            continue
        names.append(name)
    return names


FIXED_CASES = [  # (x shape, w shape, stride, padding, dilation, groups)
    ((2, 5, 13, 17), (7, 5, 3, 3), 1, 1, 1, 1),
    ((1, 4, 20, 20), (4, 2, 3, 2), (2, 1), (0, 2), (1, 2), 2),
    ((2, 24, 19, 21), (24, 1, 3, 3), 1, 1, 1, 24),
    ((1, 20, 37, 35), (40, 1, 3, 3), 2, 1, 1, 20),
    ((1, 17, 9, 40), (17, 1, 5, 3), (1, 2), (2, 0), (2, 1), 17),
    ((1, 3, 8, 8), (3, 1, 1, 1), 3, 0, 1, 3),
]


@pytest.mark.parametrize("isa", _supported_isas())
@pytest.mark.parametrize("method", [0, 1, 2])
def test_every_isa_variant_and_depthwise_method(isa, method, monkeypatch):
    import asymo.ops.conv as conv_mod
    from asymo.ops.pooling import avg_pool2d, max_pool2d

    monkeypatch.setattr(conv_mod, "DEPTHWISE_METHOD", method)
    rng = np.random.default_rng(12)
    with conv_mod.use_kernel_isa(isa):
        assert conv_mod.kernel_isa() == isa
        for dt in (np.float32, np.float64):
            for xs, ws, s, p, d, g in FIXED_CASES:
                x = rng.standard_normal(xs).astype(dt)
                w = rng.standard_normal(ws).astype(dt)
                b = rng.standard_normal(ws[0]).astype(dt)
                y = conv2d(x, w, b, s, p, d, g, activation="relu")
                _close(y, reference.conv2d(x, w, b, s, p, d, g, "relu"), dt)
            x = rng.standard_normal((2, 3, 15, 14)).astype(dt)
            np.testing.assert_array_equal(max_pool2d(x, 3, 2, 1, ceil_mode=True),
                                          reference.max_pool2d(x, 3, 2, 1, True))
            np.testing.assert_allclose(avg_pool2d(x, 3, 2, 1, True, False),
                                       reference.avg_pool2d(x, 3, 2, 1, True, False),
                                       rtol=1e-5, atol=1e-6)
    assert conv_mod.kernel_isa() == _supported_isas()[-1]
    with pytest.raises(ValueError, match="unknown ISA"):
        conv_mod.use_kernel_isa("sse9")


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("activation", [None, "relu", "relu6"])
def test_nan_and_inf_propagate_like_numpy(groups, activation):
    from asymo.ops.pooling import max_pool2d

    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    x[0, 0, 4, 4] = np.nan
    x[0, 1, 2, 2] = np.inf
    w = np.abs(rng.standard_normal((3, 3 // groups, 3, 3))).astype(np.float32)
    y = conv2d(x, w, None, 1, 1, 1, groups, activation=activation)
    ref = reference.conv2d(x, w, None, 1, 1, 1, groups, activation)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    assert np.isnan(y).any()
    mp = max_pool2d(x, 3, 2, 1)
    np.testing.assert_array_equal(np.isnan(mp), np.isnan(reference.max_pool2d(x, 3, 2, 1)))


def test_im2col_columns_follow_the_gemm_split(two_cluster_pool):
    """Cluster c's im2col tasks write exactly the columns cluster c's GEMM reads."""
    from asymo.ops.conv import _im2col_split
    from asymo.ops.conv_gemm import column_split, plan_conv_gemm

    pool = two_cluster_pool
    m, k, n = 64, 576, 3136  # ResNet-50 res2 3x3: N-split (N > M)
    plan = plan_conv_gemm(m, k, n, np.float32, pool)
    assert plan.split_dim == "N"
    ranges = column_split(plan, n, pool)
    assert tuple(ranges) == tuple(plan.cluster_ranges)
    assert ranges[1][1] - ranges[1][0] > 0  # the slow cluster gets some columns
    bounds, ncol, nrow, counts, ntasks, inline = _im2col_split(pool, plan, k, 0, n,
                                                               np.dtype(np.float32))
    bounds = [bounds[i] for i in range(ncol + 1)]
    counts = [counts[i] for i in range(2)]
    assert sum(counts) == ntasks == ncol * nrow and not inline
    # the column blocks of cluster 0 end where the plan's cluster-0 range ends
    blocks0 = counts[0] // nrow
    assert bounds[blocks0] == ranges[0][1] and bounds[-1] == n
    # a plan split along M: every cluster reads all columns; im2col split by capacity
    plan_m = plan_conv_gemm(1024, 512, 196, np.float32, pool)
    assert plan_m.split_dim == "M"
    assert sum(b - a for a, b in column_split(plan_m, 196, pool)) == 196


def test_layer_without_weighted_steps_describes_its_pooling():
    from asymo.models.spec import Layer, Pool

    p = Pool(kind="max", in_shape=(8, 9, 9), out_shape=(8, 4, 4), kernel=(3, 3),
             stride=(2, 2))
    layer = Layer(index=0, name="p", kind="pool", input_shape=(8, 9, 9),
                  output_shape=(8, 4, 4), steps=(p,))
    assert layer.kernel == (3, 3) and layer.stride == (2, 2) and layer.groups == 1
    assert layer.flops == 0 and layer.gemm_dims == (0, 0, 0) and layer.major_count == 0
    assert layer.matmul_shapes() == [] and layer.describe()["kind"] == "pool"


# ---- implicit im2col: the GEMM packs its B panels straight from the image ----------------

import contextlib  # noqa: E402
import weakref  # noqa: E402


@contextlib.contextmanager
def _forced_implicit(blocks=None, isa=None, split_dim=None):
    """Run conv2d's GEMMs as packed "mm" plans (small shapes would take the skinny path) with
    the given blocks, through the implicit im2col packer; restores everything on exit."""
    import asymo.ops.conv as conv_mod
    import asymo.ops.conv_gemm as cg
    from asymo.plan.gemm import plan_gemm

    saved = (cg.plan_conv_gemm, conv_mod.IM2COL_METHOD, conv_mod._plan_cache, conv_mod.INDIRECT,
             conv_mod.ROWS, conv_mod.NCHWC)

    def forced(m, k, n, dtype, pool, **_):
        return plan_gemm(m, k, n, np.dtype(dtype).name, pool, kind="mm", blocks=blocks,
                         isa=isa, split_dim=split_dim)

    cg.plan_conv_gemm = forced
    conv_mod.IM2COL_METHOD = "implicit"     # the packer for every layer, none by choice
    conv_mod.INDIRECT = "off"               # (stems too)
    conv_mod.ROWS = "off"                   # (and the rest)
    conv_mod.NCHWC = "off"
    conv_mod._plan_cache = weakref.WeakKeyDictionary()
    try:
        yield conv_mod
    finally:
        (cg.plan_conv_gemm, conv_mod.IM2COL_METHOD, conv_mod._plan_cache,
         conv_mod.INDIRECT, conv_mod.ROWS, conv_mod.NCHWC) = saved


def _implicit_plans(conv_mod):
    return [p for per_pool in conv_mod._plan_cache.values() for p in per_pool.values()
            if getattr(p, "implicit", None) is not None]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs(), st.sampled_from([None, (4, 8, 5), (7, 24, 13)]))
def test_implicit_im2col_matches_reference(cfg, blocks):
    # blocks of a few rows / columns and kc not a multiple of kh * kw: slivers cross output
    # rows, K panels start mid-kernel, edge slivers are partial
    x, w, b = _make(cfg)
    with _forced_implicit(blocks) as conv_mod:
        y = conv2d(x, w, b, cfg["stride"], cfg["padding"], cfg["dilation"], cfg["groups"],
                   activation=cfg["activation"])
        used = _implicit_plans(conv_mod)
    ref = reference.conv2d(x, w, b, cfg["stride"], cfg["padding"], cfg["dilation"],
                           cfg["groups"], cfg["activation"])
    _close(y, ref, cfg["dtype"])
    pointwise = ((cfg["kh"], cfg["kw"]) == (1, 1) and cfg["stride"] == (1, 1)
                 and cfg["padding"] == (0, 0))
    if cfg["cin_g"] > 1 and not pointwise:  # not depthwise, not the plain 1x1 GEMM
        assert used


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("isa", [None, "avx512", "portable"])
def test_implicit_im2col_zoo_like_layers_match_torch(dtype, isa):
    from asymo.plan.gemm import supported_isas

    if isa is not None and isa not in supported_isas():
        pytest.skip(f"{isa} kernels not supported here")
    rng = np.random.default_rng(21)
    cases = [((1, 3, 57, 61), (16, 3, 7, 7), 2, 3, 1, 1),    # ResNet conv1-like, odd sizes
             ((2, 8, 20, 23), (12, 4, 3, 3), 1, 1, 1, 2),    # grouped, batch 2
             ((1, 6, 15, 15), (9, 6, 3, 3), (2, 1), (0, 2), (2, 1), 1),
             ((1, 3, 67, 67), (10, 3, 11, 11), 4, 0, 1, 1)]  # AlexNet conv1-like
    with _forced_implicit(isa=isa) as conv_mod:
        for xs, ws, s, p, d, g in cases:
            x = rng.standard_normal(xs).astype(dtype)
            w = rng.standard_normal(ws).astype(dtype)
            b = rng.standard_normal(ws[0]).astype(dtype)
            y = conv2d(x, w, b, s, p, d, g, activation="relu")
            _close(y, _torch_conv(x, w, b, s, p, d, g, "relu"), dtype)
        assert len(_implicit_plans(conv_mod)) == len(cases)


@pytest.mark.parametrize("split_dim", ["N", "M"])
def test_implicit_im2col_on_two_clusters_and_in_chunks(two_cluster_pool, split_dim,
                                                       monkeypatch):
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 6, 29, 31)).astype(np.float32)
    w = rng.standard_normal((24, 6, 3, 3)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    r = rng.standard_normal((2, 24, 29, 31)).astype(np.float32)
    ref = np.maximum(reference.conv2d(x, w, b, 1, 1) + r, 0)
    with _forced_implicit(blocks=(6, 32, 20), split_dim=split_dim) as conv_mod:
        y = conv2d(x, w, b, padding=1, activation="relu", residual=r, pool=two_cluster_pool)
        _close(y, ref, np.float32)
        # packed B capped at a few output rows per GEMM job: chunks start mid-image
        monkeypatch.setattr(conv_mod, "IMPLICIT_CHUNK_BYTES", 54 * 31 * 4 * 5)
        conv_mod._plan_cache = weakref.WeakKeyDictionary()
        y = conv2d(x, w, b, padding=1, activation="relu", residual=r, pool=two_cluster_pool)
        (plan,) = _implicit_plans(conv_mod)
        assert len(plan.implicit) == 6  # 29 rows, 5 per chunk
        _close(y, ref, np.float32)


def test_gemm_rejects_implicit_b_for_kinds_that_do_not_pack():
    from asymo.runtime.ffi import ffi, lib
    from asymo.plan.gemm import plan_gemm

    job = ffi.new("asymo_im2col_job *")
    args = ffi.new("asymo_gemm_args *")
    a = np.ones((4, 9), np.float32)
    c = np.empty((4, 8), np.float32)
    args.dtype, args.m, args.k, args.n, args.nbatch = 0, 4, 9, 8, 1
    args.a, args.rsa, args.csa = ffi.cast("void *", a.ctypes.data), 9, 1
    args.c, args.rsc, args.csc = ffi.cast("void *", c.ctypes.data), 8, 1
    args.pack_b = ffi.addressof(lib, "asymo_im2col_pack_b")
    args.pack_b_ctx = job
    plan = plan_gemm(4, 9, 8, "float32", None, kind="mv")
    assert lib.asymo_gemm(ffi.NULL, args, plan.cdata()) == lib.ASYMO_EINVAL


@pytest.mark.parametrize("method", ["explicit", "implicit"])
def test_both_im2col_methods_on_a_packed_gemm_layer(method, monkeypatch):
    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "IM2COL_METHOD", method)
    monkeypatch.setattr(conv_mod, "WINOGRAD", "off")   # the GEMM path (Winograd: test_winograd)
    monkeypatch.setattr(conv_mod, "ROWS", "off")       # (and the rows path: test_conv_rows)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    monkeypatch.setattr(conv_mod, "_plan_cache", weakref.WeakKeyDictionary())
    rng = np.random.default_rng(23)
    for dt in (np.float32, np.float64):
        x = rng.standard_normal((1, 32, 30, 30)).astype(dt)
        w = rng.standard_normal((48, 32, 3, 3)).astype(dt)
        b = rng.standard_normal(48).astype(dt)
        y = conv2d(x, w, b, 1, 1, activation="relu")
        _close(y, reference.conv2d(x, w, b, 1, 1, 1, 1, "relu"), dt)
    plans = [p for per in conv_mod._plan_cache.values() for p in per.values()]
    assert plans and all((p.implicit is not None) == (method == "implicit") for p in plans)


def test_image_products_split_columns_between_clusters(two_cluster_pool, monkeypatch):
    """A product that packs B from the image is split along N (each cluster packs only its
    own columns) once N is a fair fraction of M; along M, every cluster would pack all of B."""
    import asymo.ops.conv as conv_mod
    from asymo.ops.conv_gemm import IMAGE_N_SPLIT_MIN, plan_conv_gemm

    pool = two_cluster_pool
    m, k, n = 256, 2304, 196  # ResNet-50 layer3.0 conv2: 3x3 stride 2, 28 -> 14
    assert n >= IMAGE_N_SPLIT_MIN * m
    assert plan_conv_gemm(m, k, n, np.float32, pool).split_dim == "M"
    plan = plan_conv_gemm(m, k, n, np.float32, pool, packs_b=True)
    assert plan.split_dim == "N" and plan.kind == "mm"
    ranges = [b - a for a, b in plan.cluster_ranges]
    assert sum(ranges) == n and ranges[1] > 0 and ranges[0] > ranges[1]
    # few columns for many rows (layer4.0 conv2, 7x7 outputs): stays split along M
    assert plan_conv_gemm(512, 4608, 49, np.float32, pool, packs_b=True).split_dim == "M"
    # the layer through conv2d: its implicit product splits along N, the result is right
    monkeypatch.setattr(conv_mod, "_plan_cache", weakref.WeakKeyDictionary())
    monkeypatch.setattr(conv_mod, "INDIRECT", "off")
    monkeypatch.setattr(conv_mod, "ROWS", "off")  # (the rows path would take the layer)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    rng = np.random.default_rng(31)
    x = rng.standard_normal((1, 256, 28, 28)).astype(np.float32)
    w = (rng.standard_normal((256, 256, 3, 3)) / 48).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    y = conv2d(x, w, b, 2, 1, 1, 1, activation="relu", pool=pool)
    _close(y, reference.conv2d(x, w, b, 2, 1, 1, 1, "relu"), np.float32)
    used = _implicit_plans(conv_mod)
    assert used and all(ch[2].split_dim == "N" for p in used for ch in p.implicit)
    # a 1x1 layer's product packs the image itself: ResNet-50's layer3 conv1, 1024 -> 256 at
    # 14x14, splits along N too
    monkeypatch.setattr(conv_mod, "POINTWISE", "off")
    x = rng.standard_normal((1, 1024, 14, 14)).astype(np.float32)
    w = (rng.standard_normal((256, 1024, 1, 1)) / 32).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    r = rng.standard_normal((1, 256, 14, 14)).astype(np.float32)
    y = conv2d(x, w, b, activation="relu", residual=r, pool=pool)
    _close(y, np.maximum(reference.conv2d(x, w, b) + r, 0), np.float32)
    pw = [p for per in conv_mod._plan_cache.values() for p in per.values()
          if getattr(p, "pointwise", False)]
    assert pw and all(p.gemm_plan.split_dim == "N" for p in pw)
    ranges = [b - a for a, b in pw[0].gemm_plan.cluster_ranges]
    assert sum(ranges) == 196 and ranges[0] > ranges[1] > 0


def test_small_jobs_run_on_the_fastest_cluster_alone(two_cluster_pool, monkeypatch):
    import asymo.ops.conv as conv_mod
    import asymo.ops.conv_gemm as cg

    pool = two_cluster_pool
    monkeypatch.setattr(conv_mod, "_plan_cache", weakref.WeakKeyDictionary())
    rng = np.random.default_rng(24)
    from asymo.plan import split_cost

    # a small GEMM (the shared rule of asymo.plan.split_cost says the slow cluster's share does
    # not pay): the slow cluster's range is empty
    plan = cg.plan_conv_gemm(64, 144, 196, np.float32, pool)
    assert split_cost.fastest_only(2 * 64 * 144 * 196, pool.topology, "mm")
    if plan.kind == "mm":
        assert all(b == a for a, b in plan.cluster_ranges[1:])
    big = cg.plan_conv_gemm(256, 2304, 3136, np.float32, pool)
    assert big.cluster_ranges[1][1] > big.cluster_ranges[1][0]
    # a small depthwise layer: every task on cluster 0; results still right
    x = rng.standard_normal((1, 32, 14, 14)).astype(np.float32)
    w = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    y = conv2d(x, w, b, 1, 1, 1, 32, activation="relu6", pool=pool)
    _close(y, reference.conv2d(x, w, b, 1, 1, 1, 32, "relu6"), np.float32)
    (dw,) = [p for per in conv_mod._plan_cache.values() for p in per.values()]
    assert dw.counts is not None and [dw.counts[0], dw.counts[1]] == [dw.ntasks, 0]
    # above the threshold the pool's capacity split applies
    assert split_cost.fastest_only(2 * 32 * 14 * 14 * 9, pool.topology, "depthwise")
    monkeypatch.setattr(conv_mod._split_cost, "fastest_only", lambda *a, **k: False)
    conv_mod._plan_cache.clear()
    y = conv2d(x, w, b, 1, 1, 1, 32, activation="relu6", pool=pool)
    _close(y, reference.conv2d(x, w, b, 1, 1, 1, 32, "relu6"), np.float32)
    # (the counts are decided at plan time: the pool's capacity split, both clusters busy)
    assert any([p.counts[0], p.counts[1]] == list(pool.split_counts(p.ntasks))
               and p.counts[1] > 0
               for per in conv_mod._plan_cache.values() for p in per.values()
               if hasattr(p, "counts"))


def test_auto_im2col_method_per_layer(monkeypatch):
    """"auto": strided 1x1 layers (downsampling shortcuts) and stride-1 5x5 layers write a
    column matrix; stems and strided 3x3 layers pack B from the image; all match the
    reference."""
    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "_plan_cache", weakref.WeakKeyDictionary())
    monkeypatch.setattr(conv_mod, "INDIRECT", "off")  # (the stem would take the indirect path)
    monkeypatch.setattr(conv_mod, "ROWS", "off")  # (and the rows path the other layers)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    assert conv_mod.IM2COL_METHOD == "auto"
    rng = np.random.default_rng(31)
    for c, k, ks, stride, packed in ((3, 16, 7, 2, True), (24, 16, 3, 2, True),
                                     (200, 16, 1, 2, False), (12, 16, 5, 1, False),
                                     (12, 16, 5, 2, True)):
        x = rng.standard_normal((1, c, 40, 40)).astype(np.float32)
        w = rng.standard_normal((k, c, ks, ks)).astype(np.float32)
        conv_mod._plan_cache.clear()
        y = conv2d(x, w, None, stride, ks // 2, activation="relu")
        _close(y, reference.conv2d(x, w, None, stride, ks // 2, 1, 1, "relu"), np.float32)
        plans = [p for per in conv_mod._plan_cache.values() for p in per.values()
                 if p.__class__.__name__ == "_GemmConvPlan" and p.k == c * ks * ks]
        assert plans and all((p.implicit is not None) == packed for p in plans)


@pytest.mark.parametrize("method", ["explicit", "implicit"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_im2col_row_gathers_every_width_stride_and_padding(method, dtype):
    """The vector row gathers of both im2col forms (unit and stride 2; a stride-2 vector reads
    one element past its last): widths around one and two slivers, every padding, kernels
    whose last tap reaches the row's end, against the float64 reference."""
    import asymo.ops.conv as conv_mod

    rng = np.random.default_rng(41)
    with _forced_implicit() as mod:
        if method == "explicit":
            mod.IM2COL_METHOD = "explicit"
        for k in (3, 7):
            for stride in (1, 2, 3):
                for width in (13, 16, 17, 31, 33, 40):
                    for pad in range(k // 2 + 1):
                        x = rng.standard_normal((1, 2, k + 1, width)).astype(dtype)
                        w = rng.standard_normal((5, 2, k, k)).astype(dtype)
                        y = conv2d(x, w, None, stride, pad)
                        _close(y, reference.conv2d(x, w, None, stride, pad, 1, 1, None),
                               dtype)
        used = _implicit_plans(mod)
    assert bool(used) == (method == "implicit")
    assert conv_mod.IM2COL_METHOD == "auto"


# ---- the direct 3x3 depthwise kernels (3x3, stride 1 / 2, padding <= 1, multiplier 1) ----

def _dw_torch_ref(x, w, b, stride, padding, activation, residual=None, dilation=1):
    """float64 torch reference: act(conv + bias + residual)."""
    y = F.conv2d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)),
                 None if b is None else torch.from_numpy(b.astype(np.float64)), stride, padding,
                 dilation, x.shape[1])
    if residual is not None:
        y = y + torch.from_numpy(residual.astype(np.float64))
    if activation == "relu":
        y = y.relu()
    elif activation == "relu6":
        y = y.clamp(0, 6)
    return y.numpy()


def _dw_isas():
    return [i for i in _supported_isas() if i in ("portable", "avx2_fma", "avx512", "neon")]


@needs_torch
@pytest.mark.parametrize("isa", _dw_isas())
def test_depthwise_3x3_every_width_stride_and_padding(isa):
    """Widths 1..40 (vector tails, padding columns, rows shorter than a vector) for each
    stride and padding, heights from 1 up, against torch in float64."""
    import asymo.ops.conv as conv_mod

    rng = np.random.default_rng(31)
    heights = (1, 2, 3, 7, 9, 4)
    acts = (None, "relu", "relu6")
    i = 0
    with conv_mod.use_kernel_isa(isa):
        for stride in (1, 2, (1, 2), (2, 1)):
            for pad in (0, 1):
                for width in range(1, 41):
                    i += 1
                    h = heights[i % len(heights)]
                    if min(h, width) + 2 * pad < 3:
                        continue
                    c = 3 if i % 3 else 18  # 18: two channel blocks per image
                    x = rng.standard_normal((1 + i % 2, c, h, width)).astype(np.float32)
                    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
                    b = rng.standard_normal(c).astype(np.float32) if i % 2 else None
                    act = acts[i % 3]
                    res = None
                    if i % 4 == 0:
                        oshape = conv_mod.conv_output_shape((h, width), 3, stride, pad)
                        res = rng.standard_normal(x.shape[:2] + oshape).astype(np.float32)
                    y = conv2d(x, w, b, stride, pad, 1, c, activation=act, residual=res)
                    ref = _dw_torch_ref(x, w, b, stride, pad, act, res)
                    _close(y, ref, np.float32)
        # rows wider than the AVX2 kernel stages (masked loads straight from the plane)
        for width in (255, 256, 257, 300, 519):
            for stride in (1, 2):
                x = rng.standard_normal((1, 2, 4, width)).astype(np.float32)
                w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
                b = rng.standard_normal(2).astype(np.float32)
                oshape = conv_mod.conv_output_shape((4, width), 3, stride, 1)
                res = rng.standard_normal((1, 2) + oshape).astype(np.float32)
                y = conv2d(x, w, b, stride, 1, 1, 2, activation="relu", residual=res)
                _close(y, _dw_torch_ref(x, w, b, stride, 1, "relu", res), np.float32)


@needs_torch
@pytest.mark.parametrize("isa", _dw_isas())
def test_depthwise_3x3_small_planes_every_size(isa):
    """The flat-plane kernel (AVX-512, stride 1, padding 1, up to 1024 outputs a plane): every
    plane size around its vector width and its size limit, row ranges split between tasks
    (one channel block on 32-row planes), bias / residual / activation, NaN and inf passing
    through like torch; float64 in float64."""
    import asymo
    import asymo.ops.conv as conv_mod

    rng = np.random.default_rng(41)
    sizes = [(h, w) for h in (1, 2, 3, 4, 7, 14) for w in (1, 2, 3, 5, 7, 8, 14, 15, 16, 17)]
    sizes += [(28, 28), (32, 32), (31, 33), (32, 33), (1, 1024), (1024, 1), (2, 513), (56, 56)]
    acts = (None, "relu", "relu6")
    pools = [asymo.get_pool(), asymo.Pool("fast:0", spin_us=0)]
    with conv_mod.use_kernel_isa(isa):
        for i, (h, w) in enumerate(sizes):
            c = (3, 16, 19, 40)[i % 4]
            for dt in ((np.float32, np.float64) if i % 5 == 0 else (np.float32,)):
                x = rng.standard_normal((1 + i % 2, c, h, w)).astype(dt)
                if i % 3 == 0:  # NaN and inf at the plane's corners
                    x[0, 0, 0, 0], x[0, -1, -1, -1] = np.nan, np.inf
                wt = rng.standard_normal((c, 1, 3, 3)).astype(dt)
                b = rng.standard_normal(c).astype(dt) if i % 2 else None
                res = rng.standard_normal(x.shape).astype(dt) if i % 4 == 1 else None
                act = acts[i % 3]
                ref = _dw_torch_ref(x, wt, b, 1, 1, act, res)
                for pool in pools:
                    y = conv2d(x, wt, b, 1, 1, 1, c, activation=act, residual=res, pool=pool)
                    _close(y, ref, dt)


@needs_torch
@pytest.mark.parametrize("isa", _dw_isas())
def test_depthwise_3x3_stride2_every_size(isa):
    """The stride-2 kernel (AVX-512): rows of up to 8 outputs two to a vector (widths up to
    where a row's taps leave its first 16 columns: 15 / 16 with padding 0 / 1), longer rows in
    16-output chunks (widths around 32 and 64 columns, the chunk's 33rd column), odd and even
    heights and output row counts, row ranges split between tasks, padding 0 and 1, bias /
    residual / activation, NaN and inf passing through like torch."""
    import asymo
    import asymo.ops.conv as conv_mod

    rng = np.random.default_rng(43)
    widths = list(range(1, 19)) + [27, 28, 29, 31, 32, 33, 34, 35, 56, 63, 64, 65, 66, 112]
    heights = (1, 2, 3, 4, 5, 7, 8, 14, 15, 28)
    acts = (None, "relu", "relu6")
    pools = [asymo.get_pool(), asymo.Pool("fast:0", spin_us=0)]
    i = 0
    with conv_mod.use_kernel_isa(isa):
        for pad in (0, 1):
            for w in widths:
                for h in heights[i % 3::3]:
                    i += 1
                    if min(h, w) + 2 * pad < 3:
                        continue
                    c = (3, 16, 19, 40)[i % 4]
                    x = rng.standard_normal((1 + i % 2, c, h, w)).astype(np.float32)
                    if i % 3 == 0:  # NaN and inf at the plane's corners
                        x[0, 0, 0, 0], x[0, -1, -1, -1] = np.nan, np.inf
                    wt = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
                    b = rng.standard_normal(c).astype(np.float32) if i % 2 else None
                    oshape = conv_mod.conv_output_shape((h, w), 3, 2, pad)
                    res = (rng.standard_normal(x.shape[:2] + oshape).astype(np.float32)
                           if i % 4 == 1 else None)
                    act = acts[i % 3]
                    ref = _dw_torch_ref(x, wt, b, 2, pad, act, res)
                    for pool in pools:
                        y = conv2d(x, wt, b, 2, pad, 1, c, activation=act, residual=res,
                                   pool=pool)
                        _close(y, ref, np.float32)


@st.composite
def _dw3x3_configs(draw):
    stride = (draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])))
    pad = (draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    h = draw(st.integers(3 - 2 * pad[0], 20))
    w = draw(st.integers(3 - 2 * pad[1], 40))
    return dict(n=draw(st.integers(1, 3)), c=draw(st.integers(1, 20)), h=h, w=w,
                stride=stride, pad=pad, dtype=draw(st.sampled_from([np.float32, np.float64])),
                bias=draw(st.booleans()), residual=draw(st.booleans()),
                activation=draw(st.sampled_from([None, "relu", "relu6"])),
                isa=draw(st.sampled_from(_dw_isas())), seed=draw(st.integers(0, 2**31)))


@needs_torch
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_dw3x3_configs())
def test_depthwise_3x3_random_configs_match_torch(cfg):
    import asymo.ops.conv as conv_mod

    rng = np.random.default_rng(cfg["seed"])
    dt, n, c = cfg["dtype"], cfg["n"], cfg["c"]
    x = rng.standard_normal((n, c, cfg["h"], cfg["w"])).astype(dt)
    w = rng.standard_normal((c, 1, 3, 3)).astype(dt)
    b = rng.standard_normal(c).astype(dt) if cfg["bias"] else None
    oshape = conv_mod.conv_output_shape((cfg["h"], cfg["w"]), 3, cfg["stride"], cfg["pad"])
    res = rng.standard_normal((n, c) + oshape).astype(dt) if cfg["residual"] else None
    with conv_mod.use_kernel_isa(cfg["isa"]):
        y = conv2d(x, w, b, cfg["stride"], cfg["pad"], 1, c, activation=cfg["activation"],
                   residual=res)
    ref = _dw_torch_ref(x, w, b, cfg["stride"], cfg["pad"], cfg["activation"], res)
    _close(y, ref, dt)


@needs_torch
@pytest.mark.parametrize("method", [0, 1, 2])
def test_depthwise_residual_fused_for_every_kernel(method, monkeypatch):
    """The residual goes into the depthwise tasks for the 3x3 kernel and the others alike
    (dilation, 5x5, a channel multiplier), into strided out= views and unbatched input."""
    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "DEPTHWISE_METHOD", method)
    rng = np.random.default_rng(32)
    cases = [((2, 19, 14, 14), 3, 1, 1, 1), ((2, 19, 15, 13), 3, 2, 1, 1),
             ((1, 8, 12, 11), 3, 1, 2, 2), ((1, 8, 12, 11), 5, 1, 2, 1),
             ((2, 7, 7, 7), 3, 1, 1, 1)]
    for xs, k, stride, pad, dil in cases:
        n, c = xs[:2]
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        y = conv2d(x, w, b, stride, pad, dil, c)
        res = rng.standard_normal(y.shape).astype(np.float32)
        ref = _dw_torch_ref(x, w, b, stride, pad, "relu6", res, dil)
        _close(conv2d(x, w, b, stride, pad, dil, c, activation="relu6", residual=res), ref,
               np.float32)
        # each image contiguous, a gap between images: written in place
        big = np.full((n, c + 3) + y.shape[2:], np.nan, np.float32)
        out = big[:, 2:2 + c]
        r = conv2d(x, w, b, stride, pad, dil, c, activation="relu6", residual=res, out=out)
        assert r is out
        _close(out, ref, np.float32)
        assert np.isnan(big[:, :2]).all() and np.isnan(big[:, 2 + c:]).all()
        # a strided view: through a temporary
        big = np.zeros((n, c) + (y.shape[2], 2 * y.shape[3]), np.float32)
        conv2d(x, w, b, stride, pad, dil, c, activation="relu6", residual=res,
               out=big[..., ::2])
        _close(big[..., ::2], ref, np.float32)
        assert not big[..., 1::2].any()
        # unbatched
        _close(conv2d(x[0], w, b, stride, pad, dil, c, activation="relu6", residual=res[0]),
               ref[0], np.float32)


# ---- the indirect path (few input channels: a CNN's stem) ------------------------------------
def _indirect_available():
    from asymo.ops import conv as conv_mod

    job = conv_mod._indirect_job((1, 3, 32, 32), (8, 3, 7, 7), np.dtype(np.float32), (2, 2),
                                 ((3, 3), (3, 3)), (1, 1), 1, None, False)
    return job is not None


needs_indirect = pytest.mark.skipif(not _indirect_available(),
                                    reason="no indirect convolution kernel for this CPU / ISA")


def _indirect_isas():
    return [i for i in _supported_isas() if i in ("avx2_fma", "avx512")]


@needs_indirect
@pytest.mark.parametrize("isa", _indirect_isas())
@pytest.mark.parametrize("spec", ["c0:0", "c0:0-1", "c0:0@1,c1:1@0.5"])
def test_indirect_convolution_against_float64(spec, isa, monkeypatch):
    # stems and their neighbours: output widths below, at and past the 16-wide run, odd sizes,
    # non-square kernels and paddings, stride 1 and 2, batches, every epilogue, the output a
    # channel slice of a larger array; the plan must be the indirect one (the rows path, which
    # takes these layers first, off). Under AVX-512 the 16-row kernel (bias and activation
    # fused; channel counts around 16 and 32, one channel).
    from asymo.hw.topology import parse_spec
    from asymo.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, "ROWS", "off")
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    rng = np.random.default_rng(21)
    layers = [(3, 64, (224, 224), (7, 7), 2, (3, 3)), (3, 13, (35, 29), (7, 5), 2, (3, 2)),
              (3, 7, (9, 40), (5, 5), 1, (2, 0)), (4, 6, (17, 17), (5, 7), 1, (0, 3)),
              (3, 19, (8, 8), (7, 7), 2, (3, 3)), (2, 5, (70, 11), (9, 9), 2, (4, 4)),
              (3, 16, (33, 33), (7, 7), 1, (3, 3))]
    if isa == "avx512":
        layers += [(3, 32, (56, 50), (7, 7), 2, (3, 3)), (3, 17, (31, 47), (5, 5), 1, (2, 2)),
                   (3, 33, (16, 15), (7, 7), 2, (3, 0)), (3, 1, (9, 9), (5, 5), 1, (2, 2)),
                   (4, 48, (40, 37), (5, 5), 2, (2, 2))]
    with asymo.Pool(topology=parse_spec(spec)) as pool, conv_mod.use_kernel_isa(isa):
        for cin, cout, (h, w), (kh, kw), s, (ph, pw) in layers:
            for n, bias, act in ((1, True, "relu"), (2, False, None), (2, True, "relu6")):
                x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
                wt = rng.standard_normal((cout, cin, kh, kw)).astype(np.float32)
                b = rng.standard_normal(cout).astype(np.float32) if bias else None
                plan, _ = conv_mod._conv_plan(
                    pool, x.shape, wt.shape, x.dtype, (s, s), ((ph, ph), (pw, pw)), (1, 1), 1,
                    act, bias, False)
                assert isinstance(plan, conv_mod._IndirectConvPlan), (cin, kh, kw)
                ref = reference.conv2d(x, wt, b, stride=s, padding=(ph, pw), activation=act)
                big = np.full((n, cout + 3) + ref.shape[2:], np.nan, np.float32)
                y = conv2d(x, wt, b, stride=s, padding=(ph, pw), activation=act,
                           out=big[:, 2:2 + cout], pool=pool)
                _close(y, ref, np.float32)
                assert np.isnan(big[:, :2]).all() and np.isnan(big[:, 2 + cout:]).all()
                # bound (a model's node): its own scratch, the weights packed once
                out = np.full(ref.shape, np.nan, np.float32)
                bound = conv_mod.bind_conv2d(x, wt, b, stride=s, padding=(ph, pw),
                                             activation=act, out=out, pool=pool)
                with asymo.runtime.pool.hold(pool):
                    bound()
                _close(out, ref, np.float32)


@needs_indirect
def test_stems_the_rows_path_takes_skip_the_indirect_path(monkeypatch):
    # ResNet's and GoogLeNet's 7x7 stride-2 stem ran faster in the rows form
    from asymo.ops import conv as conv_mod

    stem = ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3)
    assert conv_mod.conv_path(*stem) == "rows"
    monkeypatch.setattr(conv_mod, "ROWS", "off")
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    assert conv_mod.conv_path(*stem) == "indirect"


@needs_indirect
def test_indirect_path_off_gives_the_gemm_path(monkeypatch):
    from asymo.ops import conv as conv_mod

    rng = np.random.default_rng(22)
    x = rng.standard_normal((1, 3, 40, 40)).astype(np.float32)
    w = rng.standard_normal((16, 3, 7, 7)).astype(np.float32)
    y_ind = conv2d(x, w, stride=2, padding=3)
    monkeypatch.setattr(conv_mod, "INDIRECT", "off")
    monkeypatch.setattr(conv_mod, "ROWS", "off")  # (which takes the layer first)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    plan, _ = conv_mod._conv_plan(asymo.get_pool(), x.shape, w.shape, x.dtype, (2, 2),
                                  ((3, 3), (3, 3)), (1, 1), 1, None, False, False)
    assert isinstance(plan, conv_mod._GemmConvPlan)
    _close(conv2d(x, w, stride=2, padding=3), y_ind, np.float32)
    # too few taps for the path (a 3x3 stem): the GEMM, whatever INDIRECT says, with either
    # kernel (plans are cached by shape, not by ISA: a new shape per ISA), the direct path off
    monkeypatch.setattr(conv_mod, "INDIRECT", "auto")
    monkeypatch.setattr(conv_mod, "DIRECT", "off")
    for i, isa in enumerate(_indirect_isas()):
        with conv_mod.use_kernel_isa(isa):
            xs = (1, 3, 41 + i, 40)
            plan, _ = conv_mod._conv_plan(asymo.get_pool(), xs, (16, 3, 3, 3), x.dtype,
                                          (2, 2), ((1, 1), (1, 1)), (1, 1), 1, None, False,
                                          False)
            assert isinstance(plan, conv_mod._GemmConvPlan), isa


# ---- the in-place pointwise path (1x1 layers: the runs and rows forms) ----------------------
def _pointwise_available(isa="avx512"):
    from asymo.ops import conv as conv_mod

    if isa not in _supported_isas():
        return False
    with conv_mod.use_kernel_isa(isa):
        job = conv_mod._pointwise_job((1, 32, 8, 8), (16, 32, 1, 1), np.dtype(np.float32),
                                      (1, 1), ((0, 0), (0, 0)), (1, 1), 1, None, False)
    return job is not None


needs_pointwise = pytest.mark.skipif(not _pointwise_available(),
                                     reason="no AVX-512 in-place pointwise kernel for this CPU")


def _check_pointwise_layers(pool, layers, epilogues, rng, form, panel=16):
    """Each 1x1 layer (cin, cout, h, w) with each epilogue (batch, bias, activation, shortcut)
    through the pointwise path in ``form``, against float64, plain and prepacked weights
    (tests/_conv_checks.py: the input at the end of a mapping, the output a channel slice,
    the bound form)."""
    from asymo.ops import conv as conv_mod

    for cin, cout, h, w in layers:
        for n, bias, act, res in epilogues:
            x = input_at_mapping_end(rng, (n, cin, h, w))
            wt = rng.standard_normal((cout, cin, 1, 1)).astype(np.float32)
            b = rng.standard_normal(cout).astype(np.float32) if bias else None
            r = rng.standard_normal((n, cout, h, w)).astype(np.float32) if res else None
            plan, _ = conv_mod._conv_plan(pool, x.shape, wt.shape, x.dtype, (1, 1),
                                          ((0, 0), (0, 0)), (1, 1), 1, act, bias, res)
            assert isinstance(plan, conv_mod._PointwisePlan), (cin, cout, h, w)
            assert (plan.job.form, plan.job.panel_rows) == (form, panel), (cin, cout, h, w)
            check_layer(pool, x, (wt, asymo.prepack_conv(wt)), b, 1, 0, act, r,
                        lambda y, ref: _close(y, ref, np.float32))


@needs_pointwise
@pytest.mark.parametrize("spec", ["c0:0", "c0:0-1", "c0:0@1,c1:1@0.5"])
def test_pointwise_convolution_against_float64(spec, monkeypatch):
    # the runs form: pixel counts below, at and past a 16-pixel run and with a partial last
    # run (its masked loads must not read past the image; small planes are let take the
    # form), 2 to 64 input channels, 16 to 384 output channels, batches, every epilogue
    from asymo.hw.topology import parse_spec
    from asymo.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, "POINTWISE_MAX_RUN_WASTE", 16.0)
    monkeypatch.setattr(conv_mod, "POINTWISE_MAX_OUT_CHANNELS", 384)
    monkeypatch.setattr(conv_mod, "POINTWISE_ROWS_MAX_PIXELS", 0)
    layers = [(32, 16, 112, 112), (16, 96, 7, 9), (64, 48, 5, 5), (3, 16, 1, 1), (2, 32, 4, 4),
              (24, 144, 13, 13), (64, 384, 14, 14), (8, 32, 1, 17), (40, 64, 3, 11)]
    epilogues = ((1, True, "relu", False), (2, False, None, True), (1, True, "relu6", True))
    with asymo.Pool(topology=parse_spec(spec)) as pool, conv_mod.use_kernel_isa("avx512"):
        _check_pointwise_layers(pool, layers, epilogues, np.random.default_rng(41),
                                conv_mod.lib.ASYMO_POINTWISE_RUNS)


@pytest.mark.parametrize("isa, panel", [("avx512", 32), ("avx512", 48), ("avx512", 64),
                                        ("avx2_fma", 8), ("avx2_fma", 16), ("avx2_fma", 24)])
def test_pointwise_rows_form_against_float64(isa, panel, monkeypatch):
    # the rows form (pixels as broadcast rows, output channels as lanes) of each ISA's
    # kernels: tiles of every height from 1 pixel to the width's maximum (AVX-512: 12, 8, 6;
    # AVX2: 12, 6, 4, whose partial tiles are stored and their shortcut read in pieces) and
    # planes cut into uneven tiles, output channels below, at and past a panel (the last
    # panel's extra lanes are neither read from the bias nor stored), every epilogue, batches,
    # on one to three workers of symmetric and asymmetric pools
    from asymo.ops import conv as conv_mod

    if not _pointwise_available(isa):
        pytest.skip(f"no {isa} in-place pointwise kernel for this CPU")
    monkeypatch.setattr(conv_mod, "POINTWISE_ROWS_PANELS", (panel,))
    monkeypatch.setattr(conv_mod, "POINTWISE_ROWS_PANELS_AVX2", (panel,))
    # (on AVX2 every layer here takes the rows form)
    monkeypatch.setattr(conv_mod, "ROWS_AVX2_MAX_OUT_CHANNELS", 1 << 20)
    monkeypatch.setattr(conv_mod, "ROWS_AVX2_MAX_WEIGHT_BYTES", 1 << 40)
    monkeypatch.setattr(conv_mod, "ROWS_AVX2_MAX_EXPANSION", 1 << 20)
    layers = [(64, 48, 1, 1), (70, 33, 1, 5), (64, panel, 3, 3), (96, panel + 1, 2, 7),
              (65, 2 * panel - 5, 7, 7), (128, 100, 13, 13), (80, 17, 16, 16), (64, 3, 1, 12),
              (200, panel, 23, 29)]  # (a large plane: POINTWISE_ROWS_ANY_PLANE_CHANNELS)
    if isa == "avx2_fma":
        layers.append((5, 7, 1, 11))  # (few input channels: AVX2 takes them when told to)
    epilogues = ((1, True, "relu", False), (2, False, None, True), (1, True, "relu6", True),
                 (1, False, "relu6", False))
    for spec in ("c0:0", "c0:0-1", "c0:0@1,c1:1@0.5"):
        with asymo.Pool(spec) as pool, conv_mod.use_kernel_isa(isa):
            _check_pointwise_layers(pool, layers, epilogues, np.random.default_rng(43 + panel),
                                    conv_mod.lib.ASYMO_POINTWISE_ROWS, panel)


@needs_pointwise
def test_pointwise_rows_form_propagates_nan():
    # a NaN input channel reaches every output of its pixel through ReLU and ReLU6 (vmaxps
    # and the transposed store keep it), whatever the panel
    from asymo.ops import conv as conv_mod

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64, 5, 5)).astype(np.float32)
    x[0, 10, 2, 3] = np.nan
    w = rng.standard_normal((40, 64, 1, 1)).astype(np.float32)
    with conv_mod.use_kernel_isa("avx512"):
        for act in (None, "relu", "relu6"):
            y = conv2d(x, w, activation=act)
            assert np.isnan(y[0, :, 2, 3]).all()
            assert not np.isnan(np.delete(y.reshape(40, 25), 13, axis=1)).any()


@needs_pointwise
def test_pointwise_path_only_where_it_applies(monkeypatch):
    # the rows form for planes of at most POINTWISE_ROWS_MAX_PIXELS pixels with at least
    # POINTWISE_ROWS_MIN_CHANNELS input channels (any output channels), and for planes of any
    # size with at least POINTWISE_ROWS_ANY_PLANE_CHANNELS input channels where the last panel
    # pads at most an eighth of the output channels; the runs form for
    # larger planes within its limits; the GEMM for: more weights than
    # POINTWISE_MAX_WEIGHT_BYTES, more output channels than POINTWISE_MAX_OUT_CHANNELS, a
    # plane whose last run wastes too much, output channels not a multiple of 16 (all three
    # past the rows form's planes), small planes with few input channels, stride or padding,
    # groups, float64, "off", AVX2 kernels (a residual is fused)
    from asymo.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, "ROWS", "off")  # (strided or padded 1x1: test_conv_rows)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    pool = asymo.get_pool()

    def plan(xs, ws, stride=(1, 1), pads=((0, 0), (0, 0)), groups=1, residual=False,
             dtype=np.float32):
        return conv_mod._conv_plan(pool, xs, ws, np.dtype(dtype), stride, pads, (1, 1), groups,
                                   None, False, residual)[0]

    def form(p):
        assert isinstance(p, conv_mod._PointwisePlan)
        return {conv_mod.lib.ASYMO_POINTWISE_ROWS: "rows",
                conv_mod.lib.ASYMO_POINTWISE_RUNS: "runs"}[p.job.form]

    with conv_mod.use_kernel_isa("avx512"):
        assert form(plan((1, 64, 8, 8), (32, 64, 1, 1))) == "rows"
        assert form(plan((1, 512, 14, 14), (64, 512, 1, 1))) == "rows"
        assert form(plan((1, 513, 14, 14), (1000, 513, 1, 1))) == "rows"
        assert form(plan((1, 64, 7, 7), (30, 64, 1, 1), residual=True)) == "rows"
        assert form(plan((1, 64, 16, 17), (32, 64, 1, 1))) == "runs"
        assert form(plan((1, 32, 16, 16), (32, 32, 1, 1))) == "runs"
        assert form(plan((1, 191, 20, 20), (64, 191, 1, 1))) == "runs"
        assert form(plan((1, 192, 20, 20), (64, 192, 1, 1))) == "rows"
        assert form(plan((1, 513, 20, 20), (64, 513, 1, 1))) == "rows"
        assert form(plan((1, 256, 56, 56), (1000, 256, 1, 1))) == "rows"
        assert form(plan((1, 192, 28, 28), (16, 192, 1, 1))) == "runs"  # half a panel padded
        # ResNet-50's 64 -> 256 at 56 x 56, with its shortcut
        assert form(plan((1, 64, 56, 56), (256, 64, 1, 1), residual=True)) == "runs"
        for p in (plan((1, 191, 20, 20), (176, 191, 1, 1)), plan((1, 32, 7, 7), (32, 32, 1, 1)),
                  plan((1, 16, 20, 20), (272, 16, 1, 1)),
                  plan((1, 32, 20, 20), (24, 32, 1, 1)),
                  plan((1, 32, 10, 9), (32, 32, 1, 1), stride=(2, 2)),
                  plan((1, 32, 11, 9), (32, 32, 1, 1), pads=((1, 1), (1, 1))),
                  plan((1, 64, 12, 9), (32, 32, 1, 1), groups=2),
                  plan((1, 64, 13, 9), (32, 64, 1, 1), dtype=np.float64)):
            assert isinstance(p, conv_mod._GemmConvPlan)
        monkeypatch.setattr(conv_mod, "POINTWISE", "off")
        assert isinstance(plan((1, 64, 8, 8), (32, 64, 1, 1)), conv_mod._GemmConvPlan)
    if "avx2_fma" in _supported_isas():
        monkeypatch.setattr(conv_mod, "POINTWISE", "auto")
        with conv_mod.use_kernel_isa("avx2_fma"):
            # AVX2 has the rows form only (ROWS_AVX2_*), no runs form
            assert form(plan((1, 64, 8, 10), (32, 64, 1, 1))) == "rows"
            for p in (plan((1, 16, 8, 10), (96, 16, 1, 1)),  # more than 4 outputs per input
                      plan((1, 32, 20, 20), (256, 32, 1, 1))):  # more than 192 outputs
                assert isinstance(p, conv_mod._GemmConvPlan)


@needs_indirect
def test_indirect_3x3_stems_with_either_kernel(monkeypatch):
    # MobileNet V2's and SqueezeNet's stems (3 -> 32 padding 1; 3 -> 64 padding 0, a 111-wide
    # output: a masked last run) through the indirect path when it is let take 27 taps, with
    # the 16-row and the 6-row kernels, against float64
    from asymo.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, "INDIRECT_MIN_TAPS", 27)
    monkeypatch.setattr(conv_mod, "DIRECT", "off")
    monkeypatch.setattr(conv_mod, "ROWS", "off")  # (which takes them first)
    monkeypatch.setattr(conv_mod, "NCHWC", "off")  # (and the NCHWc path: test_conv_nchwc)
    rng = np.random.default_rng(25)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    for wide in (True, False):
        monkeypatch.setattr(conv_mod, "INDIRECT_WIDE", wide)
        for cout, pad, act in ((32, 1, "relu6"), (64, 0, "relu"), (20, 1, None)):
            w = rng.standard_normal((cout, 3, 3, 3)).astype(np.float32)
            b = rng.standard_normal(cout).astype(np.float32)
            plan, _ = conv_mod._conv_plan(asymo.get_pool(), x.shape, w.shape, x.dtype, (2, 2),
                                          ((pad, pad), (pad, pad)), (1, 1), 1, act, True, False)
            assert isinstance(plan, conv_mod._IndirectConvPlan)
            assert bool(plan.job.wide) == (wide and conv_mod.kernel_isa() == "avx512")
            ref = reference.conv2d(x, w, b, stride=2, padding=pad, activation=act)
            _close(conv2d(x, w, b, stride=2, padding=pad, activation=act), ref, np.float32)


@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_bias_and_activation_in_the_gemm_store_are_the_separate_pass_bit_for_bit(
        act, monkeypatch):
    # the packed kernel applies bias and activation in registers before its store (AVX2), the
    # edges and the in-place-B path after merging; every path gives the bits of conv + bias,
    # then the clamp, in float32, NaN included: one K panel and several (the last one adds to
    # C first), row and column edges (13 channels, 7 x 7 planes), few rows (in-place B). (The
    # GEMM's: the in-place pointwise kernel starts its sums at the bias, other bits.)
    import asymo.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "POINTWISE", "off")
    rng = np.random.default_rng(23)
    for cin, cout, hw in ((16, 96, 20), (600, 64, 9), (24, 13, 7), (32, 16, 12), (300, 40, 7)):
        x = rng.standard_normal((2, cin, hw, hw)).astype(np.float32)
        x[1, :, 3, 4] = np.nan
        w = rng.standard_normal((cout, cin, 1, 1)).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32)
        want = conv2d(x, w) + b[:, None, None]
        if act is not None:
            want = np.maximum(want, np.float32(0))
        if act == "relu6":
            want = np.minimum(want, np.float32(6))
        got = conv2d(x, w, b, activation=act)
        np.testing.assert_array_equal(got, want, err_msg=f"{cin}->{cout} @{hw} {act}")
        assert np.isnan(got[1, :, 3, 4]).all()
        # with a residual (a ResNet shortcut): conv + bias + residual, then the clamp
        r = rng.standard_normal(want.shape).astype(np.float32)
        want = conv2d(x, w) + b[:, None, None] + r
        if act is not None:
            want = np.maximum(want, np.float32(0))
        if act == "relu6":
            want = np.minimum(want, np.float32(6))
        got = conv2d(x, w, b, activation=act, residual=r)
        np.testing.assert_array_equal(got, want, err_msg=f"residual {cin}->{cout} @{hw} {act}")


@needs_indirect
def test_indirect_plan_made_with_avx2_stays_correct_under_another_isa():
    # a cached indirect plan keeps running (on the AVX2 kernel where the CPU has it, else the
    # portable loop) when a test forces the portable kernels; a new layer then takes the GEMM
    from asymo.ops import conv as conv_mod

    rng = np.random.default_rng(24)
    x = rng.standard_normal((1, 3, 30, 30)).astype(np.float32)
    w = rng.standard_normal((10, 3, 7, 7)).astype(np.float32)
    ref = reference.conv2d(x, w, None, 2, 3)
    _close(conv2d(x, w, stride=2, padding=3), ref, np.float32)
    with conv_mod.use_kernel_isa("portable"):
        _close(conv2d(x, w, stride=2, padding=3), ref, np.float32)
        plan, _ = conv_mod._conv_plan(asymo.get_pool(), (1, 3, 31, 31), w.shape, x.dtype,
                                      (2, 2), ((3, 3), (3, 3)), (1, 1), 1, None, False, False)
        assert isinstance(plan, conv_mod._GemmConvPlan)


def _direct_available():
    from asymo.ops import conv as conv_mod

    if "avx512" not in _supported_isas():
        return False
    with conv_mod.use_kernel_isa("avx512"):
        return conv_mod._direct_job((1, 3, 8, 8), (4, 3, 3, 3), np.dtype(np.float32), (2, 2),
                                    ((1, 1), (1, 1)), (1, 1), 1, None, False) is not None


needs_direct = pytest.mark.skipif(not _direct_available(),
                                  reason="no direct stride-2 kernel for this CPU")


@needs_direct
@pytest.mark.parametrize("spec", ["c0:0", "c0:0-1", "c0:0@1,c1:1@0.5"])
def test_direct_stride2_convolution_against_float64(spec):
    # 1 to 3 input channels; output widths below, at and past a 16-pixel vector and past a
    # segment of eight (the second segment's taps and its runs of lines); output channels
    # below, at and past a block of eight; padding 0, 1, 2, unlike per axis; each
    # epilogue; the input at the very end of an anonymous mapping (the masked loads of the
    # last column must not read past it), the output a channel slice of a larger array, and
    # the bound form (a model's node)
    from asymo.hw.topology import parse_spec
    from asymo.ops import conv as conv_mod

    rng = np.random.default_rng(53)
    layers = [  # cin, cout, h, w, (pad_h, pad_w); one input channel is the depthwise path's
        (3, 32, 224, 224, (1, 1)), (3, 64, 37, 35, (0, 0)), (2, 5, 9, 33, (1, 1)),
        (2, 9, 40, 35, (2, 2)), (3, 8, 5, 5, (0, 1)), (3, 17, 6, 290, (1, 1)),
        (3, 1, 3, 3, (0, 0)), (2, 16, 4, 63, (1, 0))]
    epilogues = ((1, True, "relu"), (2, False, None), (1, True, "relu6"))
    with asymo.Pool(topology=parse_spec(spec)) as pool, conv_mod.use_kernel_isa("avx512"):
        for cin, cout, h, w, pads in layers:
            for n, bias, act in epilogues:
                x = input_at_mapping_end(rng, (n, cin, h, w))
                wt = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
                b = rng.standard_normal(cout).astype(np.float32) if bias else None
                plan, _ = conv_mod._conv_plan(pool, x.shape, wt.shape, x.dtype, (2, 2),
                                              ((pads[0],) * 2, (pads[1],) * 2), (1, 1), 1, act,
                                              bias, False)
                assert isinstance(plan, conv_mod._DirectPlan), (cin, cout, h, w, pads)
                check_layer(pool, x, (wt,), b, 2, pads, act, None,
                            lambda y, ref: _close(y, ref, np.float32))


@needs_direct
def test_direct_stride2_propagates_nan_and_inf():
    # a NaN input reaches the outputs whose window holds it, and only those (ReLU and ReLU6
    # keep it); an inf gives inf or NaN (inf - inf) there, as float64 does
    from asymo.ops import conv as conv_mod

    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 3, 20, 40)).astype(np.float32)
    x[0, 1, 7, 21] = np.nan
    w = rng.standard_normal((10, 3, 3, 3)).astype(np.float32)
    with conv_mod.use_kernel_isa("avx512"):
        for act in (None, "relu", "relu6"):
            y = conv2d(x, w, stride=2, padding=1, activation=act)
            # input row 7, column 21 is tap (ky, kx) of outputs (oy, ox) with
            # 2 oy - 1 + ky = 7, 2 ox - 1 + kx = 21: oy in {3, 4}, ox in {10, 11}
            hit = np.zeros(y.shape[2:], bool)
            hit[3:5, 10:12] = True
            assert np.isnan(y[0][:, hit]).all() and not np.isnan(y[0][:, ~hit]).any()
        x[0, 1, 7, 21] = np.inf
        y = conv2d(x, w, stride=2, padding=1)
        ref = reference.conv2d(x, w, None, 2, 1)
        assert np.array_equal(np.isinf(y), np.isinf(ref))
        assert np.array_equal(np.isnan(y), np.isnan(ref))


@needs_direct
def test_direct_path_only_where_it_applies(monkeypatch):
    # 3x3 stride 2, 1 to 3 input channels, float32, one group, dilation 1, no residual,
    # AVX-512 kernels; anything else goes elsewhere, and "off" turns it off
    from asymo.ops import conv as conv_mod

    pool = asymo.get_pool()

    def plan(xs, ws, stride=(2, 2), dilation=(1, 1), groups=1, residual=False,
             dtype=np.float32):
        return conv_mod._conv_plan(pool, xs, ws, np.dtype(dtype), stride, ((1, 1), (1, 1)),
                                   dilation, groups, "relu", True, residual)[0]

    with conv_mod.use_kernel_isa("avx512"):
        assert isinstance(plan((1, 3, 224, 224), (32, 3, 3, 3)), conv_mod._DirectPlan)
        assert isinstance(plan((1, 2, 9, 9), (4, 2, 3, 3)), conv_mod._DirectPlan)
        for p in (plan((1, 4, 32, 32), (8, 4, 3, 3)), plan((1, 3, 32, 32), (8, 3, 3, 3), (1, 1)),
                  plan((1, 3, 32, 32), (8, 3, 5, 5)),
                  plan((1, 3, 32, 32), (8, 3, 3, 3), dilation=(2, 2)),
                  plan((1, 3, 32, 32), (6, 1, 3, 3), groups=3),
                  plan((1, 3, 32, 32), (8, 3, 3, 3), residual=True),
                  plan((1, 3, 32, 32), (8, 3, 3, 3), dtype=np.float64)):
            assert not isinstance(p, conv_mod._DirectPlan)
        monkeypatch.setattr(conv_mod, "DIRECT", "off")
        assert not isinstance(plan((1, 3, 224, 224), (32, 3, 3, 3)), conv_mod._DirectPlan)
    if "avx2_fma" in _supported_isas():
        monkeypatch.setattr(conv_mod, "DIRECT", "auto")
        with conv_mod.use_kernel_isa("avx2_fma"):  # (plans are cached by shape: a new one)
            assert not isinstance(plan((1, 3, 226, 224), (32, 3, 3, 3)), conv_mod._DirectPlan)


def test_conv_path_names_the_path_and_checks_its_arguments():
    from asymo.ops.conv import conv_path

    assert conv_path((1, 8, 10, 10), (8, 1, 3, 3), padding=1, groups=8) == "depthwise"
    assert conv_path((1, 16, 9, 9), (32, 16, 2, 3), padding=1, dilation=2) == "gemm"
    with pytest.raises(ValueError, match="activation"):
        conv_path((1, 8, 10, 10), (8, 8, 3, 3), activation="gelu")
    with pytest.raises(ValueError, match="shapes"):
        conv_path((8, 10, 10), (8, 8, 3, 3))
    with pytest.raises(ValueError, match="stride"):
        conv_path((1, 8, 10, 10), (8, 8, 3, 3), stride=0)
