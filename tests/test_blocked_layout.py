"""The blocked-channel layout (NCHW8c, asymo.ops.blocked): its kernels against float64, and
which tensors of a model's plan keep it, against ONNX Runtime and the NCHW plan."""
import numpy as np
import pytest

import asymo
from asymo.hw.topology import parse_spec
from asymo.ops import blocked as B
from asymo.ops.conv import use_kernel_isa
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import hold

pytestmark = pytest.mark.skipif(not lib.asymo_blocked_supported(),
                                reason="no blocked-layout kernels for this CPU (AVX2)")

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

POOLS = ["c0:0", "c0:0-1", "c0:0@1,c1:1@0.5"]


def _to_blocked(a):
    """NCHW -> NCHW8c in NumPy (the reference): shape (N, C/8, H, W, 8)."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // 8, 8, h, w).transpose(0, 1, 3, 4, 2))


def _from_blocked(b):
    """The inverse of `_to_blocked`: (N, C/8, H, W, 8) -> (N, C, H, W)."""
    n, cb, h, w, _ = b.shape
    return np.ascontiguousarray(b.transpose(0, 1, 4, 2, 3).reshape(n, cb * 8, h, w))


def _act(y, act):
    if act == "relu":
        return np.maximum(y, 0)
    if act == "relu6":
        return np.clip(y, 0, 6)
    return y


def _run(calls):
    for fn, args in calls:
        assert fn(*args) == 0


def _pointwise_ref(x, w, b, r, act):
    y = np.einsum("oc,nchw->nohw", w.astype(np.float64), x.astype(np.float64))
    y = y + (0 if b is None else b.astype(np.float64)[None, :, None, None])
    return _act(y + (0 if r is None else r), act)


def _depthwise_ref(x, w, b, r, stride, pads, act):
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0],) * 2, (pads[1],) * 2))
    oh, ow = (h + 2 * pads[0] - 3) // stride + 1, (wd + 2 * pads[1] - 3) // stride + 1
    y = np.zeros((n, c, oh, ow))
    for ky in range(3):
        for kx in range(3):
            y += xp[:, :, ky:ky + stride * (oh - 1) + 1:stride,
                    kx:kx + stride * (ow - 1) + 1:stride] * w[None, :, 0, ky, kx, None, None]
    y = y + (0 if b is None else b.astype(np.float64)[None, :, None, None])
    return _act(y + (0 if r is None else r), act)


def _blocked_call(pool, x, w, b, r, y_shape, stride, pads, act, planar=False):
    """Run one layer through the blocked kernels: NCHW in, NCHW out (reordered in NumPy;
    ``planar``: the kernel reads the NCHW input itself)."""
    kind = "pointwise" if w.shape[2:] == (1, 1) else "depthwise"
    packed = B.PackedBlockedWeight(kind, w)
    xb = x if planar else _to_blocked(x).reshape(x.shape)
    rb = None if r is None else _to_blocked(r.astype(np.float32)).reshape(r.shape)
    # (the output at the start of a larger NaN buffer: nothing is written past it)
    size = int(np.prod(y_shape))
    guarded = np.full(size + 96, np.nan, np.float32)
    yb = guarded[:size].reshape(y_shape)
    with hold(pool) as held:
        calls, keep = B.bind_blocked_conv(xb, packed, b, rb, yb, stride=(stride, stride),
                                          pads=pads, activation=act, pool=held,
                                          x_planar=planar)
        _run(calls)
    assert np.isnan(guarded[size:]).all(), "written past the output"
    n, c, h, w_ = y_shape
    return _from_blocked(yb.reshape(n, c // 8, h, w_, 8))


@pytest.mark.parametrize("spec", POOLS)
def test_pointwise_kernel_against_float64(spec):
    # output blocks 1 to 7 (groups of three, two and one, a remainder of one made two twos),
    # pixels below, at and past a tile of 12 / blocks and a run (one block: a last tile of 7
    # to 11 pixels), input channels in two parts and in more, layers wider in weights than
    # in activations (cut by groups; seven groups also by pixels, group-major), every
    # epilogue, batch 2, and a NaN reaching its outputs
    rng = np.random.default_rng(7)
    layers = [(8, 8, 1, 1), (8, 16, 3, 5), (16, 8, 3, 3), (8, 8, 1, 23), (16, 24, 7, 7),
              (24, 32, 5, 3), (8, 40, 13, 1),
              (32, 56, 9, 9), (576, 96, 14, 14), (320, 1280, 7, 7), (16, 96, 40, 40),
              (256, 64, 9, 9), (960, 160, 7, 7)]
    with asymo.Pool(topology=parse_spec(spec)) as pool:
        for cin, cout, h, w in layers:
            for act, bias, res in ((None, False, False), ("relu6", True, True),
                                   ("relu", True, False)):
                x = rng.standard_normal((2, cin, h, w)).astype(np.float32)
                if cin == 24:
                    x[1, 5, 2, 1] = np.nan
                wt = rng.standard_normal((cout, cin, 1, 1)).astype(np.float32)
                b = rng.standard_normal(cout).astype(np.float32) if bias else None
                r = rng.standard_normal((2, cout, h, w)).astype(np.float32) if res else None
                got = _blocked_call(pool, x, wt, b, r, (2, cout, h, w), 1, (0, 0), act)
                want = _pointwise_ref(x, wt[:, :, 0, 0], b, r, act)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(cin),
                                           equal_nan=True, err_msg=str((cin, cout, h, w)))
                if cin == 24:  # the NaN is in pixel (2, 1) of image 1 only
                    assert np.isnan(got[1, :, 2, 1]).all() and np.isnan(got).sum() == cout


def test_pointwise_split_shares_weight_bound_layers_out_evenly():
    # weights outweigh activations: cut by groups, group-major; seven groups on two workers
    # also in two chunks of pixels (fourteen tasks), on one worker in one
    groups = int(lib.asymo_pointwise_blocked_groups(160))
    for spec, tasks, chunk in (("c0:0-1", 14, 25), ("c0:0", 1, 49)):
        with asymo.Pool(topology=parse_spec(spec)) as pool:
            job = ffi.new("asymo_pointwise_blocked_job *",
                          {"channels": 960, "out_channels": 160, "pixels": 49})
            assert B._pointwise_split(job, pool, groups, 49) == tasks
            assert (job.groups_outer, job.chunk_pixels) == (1, chunk)
            # activations outweigh weights: pixels first, chunk-major
            job = ffi.new("asymo_pointwise_blocked_job *",
                          {"channels": 16, "out_channels": 96, "pixels": 1600})
            B._pointwise_split(job, pool, int(lib.asymo_pointwise_blocked_groups(96)), 1600)
            assert job.groups_outer == 0
            assert job.chunk_pixels == (1600 if spec == "c0:0" else 200)


@pytest.mark.parametrize("spec", POOLS)
def test_depthwise_kernel_against_float64(spec):
    # stride 1 and 2, padding 0 and 1 (unlike per axis), planes of one pixel to wider than
    # the four-output run, odd and even sizes, every epilogue, a shortcut, batch 2; the
    # input blocked or NCHW (reordered by the kernel a row at a time), and an NCHW input too
    # wide for that refused
    rng = np.random.default_rng(8)
    layers = [(8, 1, 1, 1, (1, 1)), (16, 2, 2, 2, (1, 1)), (8, 5, 9, 1, (0, 1)),
              (24, 9, 13, 2, (1, 0)), (32, 14, 14, 2, (1, 1)), (40, 7, 7, 1, (1, 1)),
              (16, 56, 57, 1, (1, 1)), (8, 6, 5, 2, (0, 0)), (96, 28, 28, 2, (1, 1)),
              (8, 3, 256, 2, (1, 1))]
    with asymo.Pool(topology=parse_spec(spec)) as pool:
        for c, h, w, s, pads in layers:
            oh, ow = (h + 2 * pads[0] - 3) // s + 1, (w + 2 * pads[1] - 3) // s + 1
            if oh < 1 or ow < 1:
                continue
            for act, bias, res, planar in ((None, False, False, False),
                                           ("relu6", True, False, True),
                                           ("relu", True, True, False),
                                           (None, False, True, True)):
                x = rng.standard_normal((2, c, h, w)).astype(np.float32)
                wt = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
                b = rng.standard_normal(c).astype(np.float32) if bias else None
                r = rng.standard_normal((2, c, oh, ow)).astype(np.float32) if res else None
                got = _blocked_call(pool, x, wt, b, r, (2, c, oh, ow), s, pads, act, planar)
                want = _depthwise_ref(x, wt, b, r, s, pads, act)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                           err_msg=str((c, h, w, s, pads, planar)))


def test_arrays_that_do_not_fit_the_layer_are_refused():
    pw = B.PackedBlockedWeight("pointwise", np.zeros((16, 8, 1, 1), np.float32))
    x, y = np.zeros((1, 8, 4, 4), np.float32), np.zeros((1, 16, 4, 4), np.float32)
    with hold(None) as pool:
        for xx, yy, r, b in [(np.zeros((1, 16, 4, 4), np.float32), y, None, None),
                             (x, np.zeros((1, 8, 4, 4), np.float32), None, None),
                             (x, np.zeros((1, 16, 2, 2), np.float32), None, None),
                             (x, y, np.zeros((1, 16, 4, 5), np.float32), None),
                             (x, y, None, np.zeros(8, np.float32)),
                             (x.astype(np.float64), y, None, None),
                             (np.zeros((1, 8, 4, 8), np.float32)[..., ::2], y, None, None)]:
            with pytest.raises(ValueError, match="do not fit"):
                B.bind_blocked_conv(xx, pw, b, r, yy, stride=(1, 1), pads=(0, 0),
                                    activation=None, pool=pool)
        with pytest.raises(ValueError, match="one NCHW size"):
            B.bind_reorder(x, y, True, pool)
    for kind, shape in [("pointwise", (12, 8, 1, 1)), ("pointwise", (16, 8, 3, 3)),
                        ("depthwise", (16, 2, 3, 3)), ("transposed", (8, 8, 1, 1))]:
        with pytest.raises(ValueError, match="no blocked"):
            B.PackedBlockedWeight(kind, np.zeros(shape, np.float32))


def test_planar_input_only_where_the_kernel_can_read_it():
    x = np.zeros((1, 8, 4, 300), np.float32)
    packed = B.PackedBlockedWeight("depthwise", np.zeros((8, 1, 3, 3), np.float32))
    with hold(None) as pool, pytest.raises(ValueError, match="cannot read NCHW"):
        B.bind_blocked_conv(x, packed, None, None, np.zeros_like(x), stride=(1, 1),
                            pads=(1, 1), activation=None, pool=pool, x_planar=True)
    assert B.planar_input_ok("depthwise", (1, 8, 4, 256))
    assert not B.planar_input_ok("pointwise", (1, 8, 4, 4))


@pytest.mark.parametrize("spec", POOLS)
def test_reorders_round_trip_exactly(spec):
    rng = np.random.default_rng(9)
    with asymo.Pool(topology=parse_spec(spec)) as pool:
        for shape in [(1, 8, 1, 1), (2, 16, 3, 5), (1, 24, 13, 11), (3, 32, 112, 112)]:
            x = rng.standard_normal(shape).astype(np.float32)
            b, back = np.empty_like(x), np.empty_like(x)
            with hold(pool) as held:
                c1, k1 = B.bind_reorder(x, b, True, held)
                c2, k2 = B.bind_reorder(b, back, False, held)
                _run(c1)
                _run(c2)
            assert np.array_equal(b.reshape(-1), _to_blocked(x).reshape(-1))
            assert np.array_equal(back, x)


def test_blocked_kind_says_which_layers_run_blocked():
    k = B.blocked_kind
    assert k((1, 16, 8, 8), (32, 16, 1, 1), (1, 1), (0, 0), (1, 1), 1, "relu") == "pointwise"
    assert k((1, 16, 8, 8), (16, 1, 3, 3), (2, 2), (1, 1), (1, 1), 16, None) == "depthwise"
    for args in [((1, 12, 8, 8), (32, 12, 1, 1), (1, 1), (0, 0), (1, 1), 1, None),  # 12 in
                 ((1, 16, 8, 8), (20, 16, 1, 1), (1, 1), (0, 0), (1, 1), 1, None),  # 20 out
                 ((1, 16, 8, 8), (32, 16, 1, 1), (2, 2), (0, 0), (1, 1), 1, None),  # stride 2
                 ((1, 16, 8, 8), (32, 16, 1, 1), (1, 1), (1, 1), (1, 1), 1, None),  # padded
                 ((1, 16, 8, 8), (16, 1, 3, 3), (1, 1), (2, 2), (1, 1), 16, None),  # pad 2
                 ((1, 16, 8, 8), (16, 1, 3, 3), (1, 2), (1, 1), (1, 1), 16, None),  # strides
                 ((1, 16, 8, 8), (16, 1, 3, 3), (1, 1), (1, 1), (2, 2), 16, None),  # dilated
                 ((1, 16, 8, 8), (32, 1, 3, 3), (1, 1), (1, 1), (1, 1), 16, None),  # x2 mult
                 ((1, 16, 8, 8), (16, 1, 5, 5), (1, 1), (2, 2), (1, 1), 16, None),  # 5x5
                 ((1, 16, 8, 8), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1, None),  # dense 3x3
                 ((1, 16, 8, 8), (32, 16, 1, 1), (1, 1), (0, 0), (1, 1), 1, "gelu")]:
        assert k(*args) is None, args


# ---- in a model ------------------------------------------------------------------------------
def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def _inverted_residual_model(rng, c=16):
    """stem 3x3 (3 -> c, NCHW) -> [1x1 c -> 6c, dw 3x3, 1x1 6c -> c, + x] x 2 -> dw stride 2
    -> 1x1 -> GlobalAveragePool; a 1x1 whose only reader is the output, and a lone 1x1 between
    two max-pools."""
    nodes, inits = [], []

    def conv(x, y, w, stride=1, pad=0, group=1, clip=True):
        name = f"w_{y}"
        inits.append((name, w))
        inits.append((f"b_{y}", _w(rng, w.shape[0])))
        nodes.append(helper.make_node("Conv", [x, name, f"b_{y}"], [y + ("_c" if clip else "")],
                                      strides=[stride] * 2, pads=[pad] * 4, group=group))
        if clip:
            inits.append((f"lo_{y}", np.array(0, np.float32)))
            inits.append((f"hi_{y}", np.array(6, np.float32)))
            nodes.append(helper.make_node("Clip", [y + "_c", f"lo_{y}", f"hi_{y}"], [y]))
        return y

    t = conv("x", "stem", _w(rng, c, 3, 3, 3), stride=2, pad=1)
    for i in range(2):
        e = conv(t, f"e{i}", _w(rng, 6 * c, c, 1, 1))
        d = conv(e, f"d{i}", _w(rng, 6 * c, 1, 3, 3), pad=1, group=6 * c)
        p = conv(d, f"p{i}", _w(rng, c, 6 * c, 1, 1), clip=False)
        nodes.append(helper.make_node("Add", [t, p], [f"a{i}"]))
        t = f"a{i}"
    d = conv(t, "ds", _w(rng, c, 1, 3, 3), stride=2, pad=1, group=c)
    head = conv(d, "head", _w(rng, 4 * c, c, 1, 1))
    nodes.append(helper.make_node("MaxPool", [head], ["mp1"], kernel_shape=[2, 2]))
    lone = conv("mp1", "lone", _w(rng, 4 * c, 4 * c, 1, 1))
    nodes.append(helper.make_node("MaxPool", [lone], ["mp2"], kernel_shape=[1, 1]))
    out = conv("mp2", "last", _w(rng, 8 * c, 4 * c, 1, 1))
    g = helper.make_graph(nodes, "ir", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 3, 40, 36])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, x):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


@pytest.mark.parametrize("spec", POOLS)
def test_model_keeps_chains_blocked_and_matches_ort(spec, monkeypatch):
    from asymo.models import graph_model as gm

    rng = np.random.default_rng(11)
    model = _inverted_residual_model(rng)
    x = rng.standard_normal((3, 3, 40, 36)).astype(np.float32)
    want = _ort(model, x)
    with asymo.Pool(topology=parse_spec(spec)) as pool:
        m = asymo.from_onnx(model, pool=pool)
        for batch in (1, 3):
            np.testing.assert_allclose(m(x[:batch]), want[:batch], rtol=1e-4, atol=1e-4)
        plan = m.plan(1)
        runs = {n.name: plan.kernels[n.name] for n in m.graph.nodes
                if plan.kernels[n.name].startswith("conv2d:blocked")}
        convs = [n for n in m.graph.nodes if n.op == "asymo.Conv"]
        by_out = {n.outputs[0]: n for n in convs}
        # the chain from the first expansion to the head runs blocked (2 x 3 + the stride-2
        # depthwise + the head); the stem (3 input channels), the lone 1x1 between max-pools
        # and the last one (after a max-pool, its output the graph's) do not
        assert len(runs) == 8, runs
        for n in convs:
            blocked = n.name in runs
            assert blocked == (n.outputs[0] in plan.blocked or n.inputs[0] in plan.blocked)
        assert not any(t in plan.blocked for t in m.graph.outputs)
        stem = next(n for n in convs if n.inputs[0] == "x")
        assert stem.name not in runs and stem.outputs[0] not in plan.blocked
        assert all(by_out[t].name in runs for t in plan.blocked if t in by_out)
        assert {plan.kernels[n] for n in runs} == {"conv2d:blocked pointwise",
                                                  "conv2d:blocked depthwise"}
        assert plan.to_dict()["blocked"] == plan.blocked
        # the same model with every tensor NCHW: same outputs, no blocked node
        monkeypatch.setattr(gm, "BLOCKED_LAYOUT", "off")
        planar = asymo.from_onnx(model, pool=pool)
        assert not planar.plan(1).blocked
        assert not any(k.startswith("conv2d:blocked") for k in planar.plan(1).kernels.values())
        np.testing.assert_allclose(planar(x), m(x), rtol=1e-5, atol=1e-5)


def _bottleneck_model(rng, c=16, blocks=3):
    """ResNet's bottleneck blocks: [1x1 4c -> c, 3x3 c -> c, 1x1 c -> 4c, + x, relu] x blocks:
    the tensors between blocks could be blocked (their readers and writers are 1x1 layers), but
    every 1x1 layer's other side is a dense 3x3 one (NCHW)."""
    nodes, inits = [], []

    def conv(x, y, w, pad=0):
        inits.extend([(f"w_{y}", w), (f"b_{y}", _w(rng, w.shape[0]))])
        nodes.append(helper.make_node("Conv", [x, f"w_{y}", f"b_{y}"], [y], pads=[pad] * 4))
        return y

    t = conv("x", "stem", _w(rng, 4 * c, 8, 1, 1))
    for i in range(blocks):
        a = conv(t, f"a{i}", _w(rng, c, 4 * c, 1, 1))
        nodes.append(helper.make_node("Relu", [a], [f"ar{i}"]))
        b = conv(f"ar{i}", f"b{i}", _w(rng, c, c, 3, 3), pad=1)
        nodes.append(helper.make_node("Relu", [b], [f"br{i}"]))
        e = conv(f"br{i}", f"e{i}", _w(rng, 4 * c, c, 1, 1))
        nodes.append(helper.make_node("Add", [t, e], [f"s{i}"]))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"o{i}"]))
        t = f"o{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [t], ["out"]))
    g = helper.make_graph(nodes, "bottleneck", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 8, 20, 18])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_chains_needing_a_reorder_per_conv_stay_nchw(monkeypatch):
    # ResNet-50's bottleneck blocks ran slower blocked: each 1x1 layer reorders its 3x3 side
    from asymo.models import graph_model as gm

    rng = np.random.default_rng(13)
    model = _bottleneck_model(rng)
    x = rng.standard_normal((2, 8, 20, 18)).astype(np.float32)
    want = _ort(model, x)
    m = asymo.from_onnx(model)
    assert not m.plan(1).blocked
    assert not any(k.startswith("conv2d:blocked") for k in m.plan(1).kernels.values())
    np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-4)
    # allowed every reorder, the same model keeps the tensors between blocks blocked
    monkeypatch.setattr(gm, "BLOCKED_REORDERS_PER_CONV", 10.0)
    loose = asymo.from_onnx(model)
    between = {f"o{i}" for i in range(2)}
    assert between <= set(loose.plan(1).blocked), loose.plan(1).blocked
    np.testing.assert_allclose(loose(x), want, rtol=1e-4, atol=1e-4)


def test_torchvision_mobilenet_v2_runs_blocked_and_matches_torch():
    torch = pytest.importorskip("torch")
    from asymo.models import torchvision_defs as tv

    net = tv.build("mobilenet_v2").eval()
    x = torch.randn(2, 3, 96, 96)
    # (AVX2's rule: on AVX-512 the small planes' 1x1 layers stay NCHW, the next test)
    with use_kernel_isa("avx2_fma"):
        m = asymo.from_torch(net, x[:1])
        kinds = m.plan(1).kernels.values()
        # every 1x1 and depthwise layer (all but the stem and the classifier)
        assert sum(k.startswith("conv2d:blocked") for k in kinds) == 51
        with torch.inference_mode():
            want = net(x).numpy()
        got = m(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.skipif(not lib.asymo_isa_supported() & (1 << lib.ASYMO_ISA_AVX512),
                    reason="the CPU has no AVX-512")
def test_avx512_keeps_small_plane_pointwise_layers_nchw():
    # where the kernels run AVX-512, a 1x1 layer the NCHW rows form takes for its small plane
    # (at most POINTWISE_ROWS_MAX_PIXELS pixels, POINTWISE_ROWS_MIN_CHANNELS channels) is
    # not blocked; the larger planes' chain still is
    torch = pytest.importorskip("torch")
    from asymo.models import torchvision_defs as tv
    from asymo.ops import conv as C

    net = tv.build("mobilenet_v2").eval()
    x = torch.randn(2, 3, 224, 224)  # (every 14 x 14 and 7 x 7 1x1 layer has >= 64 inputs)
    with use_kernel_isa("avx512"):
        m = asymo.from_torch(net, x[:1])
        plan = m.plan(1)
        small = large = 0
        for n in m.graph.nodes:
            w = m.graph.initializers.get(n.inputs[1]) if len(n.inputs) > 1 else None
            if n.op != "asymo.Conv" or w is None or w.shape[2:] != (1, 1) or w.shape[1] % 8:
                continue
            if C.rows_form_small_plane(plan.shapes[n.inputs[0]]):
                assert plan.kernels[n.name] == "conv2d:pointwise rows", n.name
                small += 1
            else:
                assert plan.kernels[n.name] == "conv2d:blocked pointwise", n.name
                large += 1
        assert small >= 10 and large >= 10, (small, large)
        with torch.inference_mode():
            want = net(x).numpy()
        got = m(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_run_layers_gives_nchw_activations_at_blocked_boundaries(monkeypatch):
    # a pipeline stage's input and output are NCHW even where the segment boundary is a
    # tensor the plan keeps blocked: each layer alone, and chained, against the NCHW plan
    from asymo.models import graph_model as gm

    rng = np.random.default_rng(12)
    model = _inverted_residual_model(rng)
    x = rng.standard_normal((2, 3, 40, 36)).astype(np.float32)
    m = asymo.from_onnx(model)
    m.plan(2)  # (planned now: a plan reads BLOCKED_LAYOUT when it is made)
    monkeypatch.setattr(gm, "BLOCKED_LAYOUT", "off")
    planar = asymo.from_onnx(model)
    segs = m.graph.segments()
    boundaries = [t for _, _, _, t in segs if t]
    assert any(t in m.plan(2).blocked for t in boundaries)  # the case this test is for
    a, b = x, x
    for i in range(len(m.layers)):
        a = m.run_layers(a, i, i)
        b = planar.run_layers(b, i, i)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"layer {i}")
    np.testing.assert_allclose(a, m(x), rtol=1e-5, atol=1e-5)
    mid = len(m.layers) // 2
    np.testing.assert_allclose(m.run_layers(planar.run_layers(x, 0, mid - 1), mid,
                                            len(m.layers) - 1), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", POOLS)
def test_blocked_layers_writing_and_reading_concat_slices_at_batches(spec):
    # the last layers of blocked chains write their NCHW outputs as channel slices of a
    # concat, whose images lie the whole concat apart (at batch 1 it hid: images 2 and 3
    # were written over the first's slice); a depthwise layer reading such a slice at a
    # batch over one reorders it rather than read it in place
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self, c=16):
            super().__init__()
            pw = lambda: nn.Conv2d(c, c, 1)  # noqa: E731
            dw = lambda: nn.Conv2d(c, c, 3, padding=1, groups=c)  # noqa: E731
            self.chain = nn.Sequential(pw(), nn.ReLU(), dw(), nn.ReLU(), pw(), nn.ReLU(),
                                       dw(), nn.ReLU(), pw())
            self.a, self.b, self.d = dw(), pw(), dw()

        def forward(self, x):
            t = torch.cat([self.a(self.chain(x)), self.b(self.chain(x))], 1)
            return t, self.d(t[:, :16] * 1.0 + t[:, 16:])

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(3, 16, 20, 20)
    model = asymo.from_torch(net, (x[:1],))
    plan = model.plan(3)
    assert plan.blocked and plan.slices
    with torch.no_grad():
        refs = net(x)
    with asymo.Pool(spec) as pool:
        for b in (1, 2, 3):
            outs = model(x[:b].numpy(), pool=pool)
            for got, ref in zip(outs, refs):
                np.testing.assert_allclose(got, ref[:b].numpy(), rtol=1e-4, atol=1e-5)
