"""The graph IR, each supported operator built with onnx.helper (checked against ONNX Runtime
or NumPy), load-time rewrites, the arena plan, threads, and the errors for bad models and
bad inputs. Needs only onnx (onnxruntime where marked)."""
import os
import threading

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import asymo  # noqa: E402
from asymo.models.graph import GraphError  # noqa: E402
from asymo.models.onnx_loader import OnnxError  # noqa: E402
from asymo.runtime.pool import hold  # noqa: E402

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _check(model, x, atol=1e-4):
    m = asymo.from_onnx(model)
    want = _ort(model, {"x": x})[0]
    got = m(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
    return m


@pytest.mark.parametrize("auto_pad,stride,dil,group", [
    ("NOTSET", 1, 1, 1), ("SAME_UPPER", 2, 1, 1), ("SAME_LOWER", 2, 1, 1), ("VALID", 1, 2, 1),
    ("NOTSET", 2, 1, 4), ("NOTSET", 1, 1, 8)])
def test_conv_padding_modes_groups_dilation(auto_pad, stride, dil, group):
    cin, cout = 8, 8
    attrs = dict(strides=[stride] * 2, dilations=[dil] * 2, group=group)
    if auto_pad == "NOTSET":
        attrs["pads"] = [1, 0, 2, 1]  # asymmetric: becomes a Pad node
    else:
        attrs["auto_pad"] = auto_pad
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    relu = helper.make_node("Relu", ["c"], ["y"])
    model = _model([node, relu], [_vi("x", ["N", cin, 11, 12])], [_vi("y", None)],
                   [("w", _w(cout, cin // group, 3, 3)), ("b", _w(cout))])
    m = _check(model, _w(2, cin, 11, 12))
    assert [n.op for n in m.graph.nodes][-1] == "asymo.Conv"
    assert m.graph.nodes[-1].attrs["activation"] == "relu"


def test_elementwise_and_shape_ops_against_ort():
    x = _w(2, 8, 6, 6)
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["a"]),                 # relu6
        helper.make_node("HardSigmoid", ["a"], ["b"], alpha=0.3, beta=0.4),
        helper.make_node("HardSwish", ["x"], ["c"]),
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["silu"]),                      # SiLU
        helper.make_node("Add", ["b", "c"], ["d"]),
        helper.make_node("Mul", ["d", "silu"], ["e"]),
        helper.make_node("Split", ["e", "split"], ["e1", "e2"], axis=1),
        helper.make_node("Concat", ["e2", "e1"], ["f"], axis=1),
        helper.make_node("Reshape", ["f", "shape5"], ["g5"]),               # channel shuffle
        helper.make_node("Transpose", ["g5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "shape4"], ["h"]),
        helper.make_node("Slice", ["h", "st", "en", "ax", "sp"], ["i"]),
        helper.make_node("Pad", ["i", "pads"], ["j"], mode="reflect"),
        helper.make_node("MaxPool", ["j"], ["k"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1),
        helper.make_node("AveragePool", ["j"], ["l"], kernel_shape=[2, 2], strides=[1, 1],
                         pads=[0, 0, 1, 1], count_include_pad=1),
        helper.make_node("GlobalAveragePool", ["l"], ["m"]),
        helper.make_node("Flatten", ["m"], ["n"], axis=1),
        helper.make_node("Dropout", ["n"], ["o"]),
        helper.make_node("Gemm", ["o", "fw", "fb"], ["p"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Relu", ["p"], ["q"]),
        helper.make_node("MatMul", ["q", "mw"], ["r"]),
        helper.make_node("Identity", ["r"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["y"], axis=1),
        helper.make_node("Flatten", ["k"], ["y2"]),
    ]
    inits = [("lo", np.float32(0)), ("hi", np.float32(6)), ("split", np.array([3, 5])),
             ("shape5", np.array([0, 2, 4, 6, 6])), ("shape4", np.array([0, 8, 6, 6])),
             ("st", np.array([1, 1])), ("en", np.array([7, 100])), ("ax", np.array([1, 3])),
             ("sp", np.array([2, 1])), ("pads", np.array([0, 0, 1, 0, 0, 0, 1, 2])),
             ("fw", _w(5, 3)), ("fb", _w(5)), ("mw", _w(5, 4))]
    model = _model(nodes, [_vi("x", ["N", 8, 6, 6])], [_vi("y", None), _vi("y2", None)], inits)
    m = asymo.from_onnx(model)
    want = _ort(model, {"x": x})
    got = m(x)
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-5)
    ops = m.graph.op_counts()
    assert "asymo.SiLU" in ops and "asymo.Gemm" in ops and "Dropout" not in ops


def test_standalone_batchnorm_and_residual_fusion():
    c = 4
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Add", ["x", "bn"], ["r"]),
             helper.make_node("Clip", ["r"], ["y0"], min=0.0, max=6.0),
             helper.make_node("BatchNormalization", ["y0", "s", "b", "m", "v"], ["y"],
                              epsilon=1e-3)]
    inits = [("w", _w(c, c, 3, 3)), ("s", _w(c) + 1), ("b", _w(c)), ("m", _w(c)),
             ("v", np.abs(_w(c)) + 0.5)]
    model = _model(nodes, [_vi("x", ["N", c, 5, 5])], [_vi("y", None)], inits, opset=10)
    m = _check(model, _w(3, c, 5, 5))
    conv = m.graph.nodes[0]
    assert conv.op == "asymo.Conv" and len(conv.inputs) == 4
    assert conv.attrs["activation"] == "relu6"
    assert [n.op for n in m.graph.nodes] == ["asymo.Conv", "BatchNormalization"]


def _chain_model():
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"]),
             helper.make_node("Conv", ["b", "w3"], ["d"]),
             helper.make_node("Concat", ["c", "d"], ["e"], axis=1),
             helper.make_node("GlobalAveragePool", ["e"], ["f"]),
             helper.make_node("Flatten", ["f"], ["g"]),
             helper.make_node("Gemm", ["g", "fw"], ["y"], transB=1)]
    inits = [("w1", _w(4, 3, 3, 3)), ("w2", _w(4, 4, 1, 1)), ("w3", _w(4, 4, 1, 1)),
             ("fw", _w(6, 8))]
    return _model(nodes, [_vi("x", ["N", 3, 8, 8])], [_vi("y", None)], inits)


def test_cut_points_segments_and_run_layers():
    m = asymo.from_onnx(_chain_model())
    g = m.graph
    cuts = g.cut_points()
    # branches (the two 1x1 convs and the concat) are never cut through
    names = [c.tensor for c in cuts]
    assert "c" not in names and "d" not in names
    assert names[0] == "b"
    assert [c.shape for c in cuts][0] == (1, 4, 8, 8)
    segs = g.segments()
    assert segs[0][0] == 0 and segs[-1][1] == len(g.nodes) - 1
    assert all(b + 1 == a2 for (_, b, _, _), (a2, _, _, _) in zip(segs, segs[1:]))
    x = _w(2, 3, 8, 8)
    full = m(x)
    h = m.run_layers(x, 0, 0)
    assert h.shape == (2,) + m.layers[1].input_shape
    np.testing.assert_allclose(m.run_layers(h, 1, len(m.layers) - 1), full, rtol=1e-6)
    # a subgraph of a range is a graph of its own
    sub = g.subgraph(segs[1][0], segs[-1][1])
    assert [t.name for t in sub.inputs] == [segs[1][2]] and sub.outputs == g.outputs
    assert sum(layer.flops for layer in m.layers) > 0 and m.matmul_shapes()


def test_arena_is_planned_once_and_shared():
    m = asymo.from_onnx(_chain_model())
    p = m.plan(4)
    assert p.arena_bytes < p.naive_bytes
    assert p.aliases.get("g") == "f"  # Flatten is a view
    # the two 1x1 convolutions write their channel slices of the concat's output
    concat = next(n for n in m.graph.nodes if n.op == "Concat")
    assert p.kernels[concat.name].startswith("view")
    assert p.slices["c"] == ("e", 0, 4) and p.slices["d"] == ("e", 4, 8)
    # tensors alive at the same time never overlap
    x = _w(4, 3, 8, 8)
    y1 = m(x)
    with hold(None) as pool:
        inst = m._acquire(4, pool)
        arena_id = id(inst.arena)
        m._release(inst)
        y2 = m(x)
        inst = m._acquire(4, pool)
        assert id(inst.arena) == arena_id  # reused, not reallocated
        m._release(inst)
    np.testing.assert_array_equal(y1, y2)
    assert m.plan(4) is p


def test_concurrent_calls_from_threads():
    m = asymo.from_onnx(_chain_model())
    xs = [_w(1 + i % 3, 3, 8, 8) for i in range(8)]
    want = [m(x) for x in xs]
    got = [None] * len(xs)
    errs = []

    def work(i):
        try:
            for _ in range(5):
                got[i] = m(xs[i])
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs
    for g_, w_ in zip(got, want):
        np.testing.assert_array_equal(g_, w_)


# ---- errors --------------------------------------------------------------------------------
def test_unsupported_operator_named_with_node_and_opset():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("LSTMish", ["a"], ["y"], name="my_node", domain="")]
    model = _model(nodes, [_vi("x", ["N", 3, 4, 4])], [_vi("y", None)], opset=15)
    with pytest.raises(OnnxError, match=r"LSTMish.*my_node.*opset 15"):
        asymo.from_onnx(model)
    nodes = [helper.make_node("Erf", ["x"], ["y"], name="erf1")]
    with pytest.raises(ValueError, match="'Erf'.*erf1"):
        asymo.from_onnx(_model(nodes, [_vi("x", ["N", 3])], [_vi("y", None)]))


def test_corrupt_truncated_and_non_regular_files(tmp_path):
    data = _chain_model().SerializeToString()
    p = tmp_path / "m.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxError, match="corrupt or truncated"):
        asymo.from_onnx(p)
    p.write_bytes(b"\xff\xfe garbage \x00" * 10)
    with pytest.raises(OnnxError):
        asymo.from_onnx(p)
    p.write_bytes(b"")
    with pytest.raises(OnnxError, match="empty"):
        asymo.from_onnx(p)
    with pytest.raises(OnnxError, match="regular file"):
        asymo.from_onnx(tmp_path)
    with pytest.raises(FileNotFoundError):
        asymo.from_onnx(tmp_path / "missing.onnx")
    p.write_bytes(data)
    with pytest.raises(OnnxError, match="limit"):
        asymo.from_onnx(p, max_bytes=100)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.onnx"
        os.mkfifo(fifo)
        with pytest.raises(OnnxError, match="regular file"):
            asymo.from_onnx(fifo)
    with pytest.raises(TypeError):
        asymo.from_onnx(12)


def test_wrong_input_shapes_and_dtypes():
    m = asymo.from_onnx(_chain_model())
    with pytest.raises(ValueError, match=r"shape \(N, 3, 8, 8\)"):
        m(np.zeros((1, 3, 9, 8), np.float32))
    with pytest.raises(ValueError, match="shape"):
        m(np.zeros((1, 1, 3, 8, 8), np.float32))
    with pytest.raises(TypeError, match="float32"):
        m(np.zeros((1, 3, 8, 8), np.float64))
    with pytest.raises(TypeError, match="float32"):
        m(np.zeros((1, 3, 8, 8), np.int32))
    with pytest.raises(ValueError, match="empty batch"):
        m(np.zeros((0, 3, 8, 8), np.float32))
    with pytest.raises(TypeError, match="expected 1 input"):
        m(np.zeros((1, 3, 8, 8), np.float32), np.zeros(3))


def test_bad_models_rejected_before_running():
    # non-float input
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 3])],
                          [_vi("y", None)])
    with pytest.raises(OnnxError, match="float32"):
        asymo.from_onnx(helper.make_model(g))
    # shapes that do not fit
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    with pytest.raises(GraphError, match="channels"):
        asymo.from_onnx(_model(nodes, [_vi("x", ["N", 3, 8, 8])], [_vi("y", None)],
                               [("w", _w(4, 5, 3, 3))]))
    # dynamic spatial dimension
    with pytest.raises(OnnxError, match="dynamic"):
        asymo.from_onnx(_model([helper.make_node("Relu", ["x"], ["y"])],
                               [_vi("x", ["N", 3, "h", 4])], [_vi("y", None)]))
    # a cycle
    nodes = [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Add", ["x", "b"], ["y"])]
    with pytest.raises(GraphError, match="cycle"):
        asymo.from_onnx(_model(nodes, [_vi("x", ["N", 3])], [_vi("y", None)]))


@pytest.mark.parametrize("name,size", [("googlenet", 64), ("resnet50", 64), ("alexnet", 67),
                                       ("mobilenet_v1", 64), ("squeezenet", 67)])
def test_zoo_networks_as_graphs_match_the_zoo(name, size):
    import asymo.models as zoo

    ref_model = zoo.get(name, image_size=size, seed=3)
    gm = zoo.get_graph(name, image_size=size, seed=3)
    x = RNG.standard_normal((2, 3, size, size)).astype(np.float32)
    want = ref_model.run(x)
    np.testing.assert_allclose(gm(x), want, rtol=1e-4, atol=1e-5)
    assert gm.matmul_shapes() == ref_model.matmul_shapes()
    assert gm.flops == ref_model.flops


def test_planned_graph_ranges_back_to_onnx_for_other_executors():
    """A contiguous range of a planned graph (a pipeline stage) exported to ONNX runs on
    ONNX Runtime with the same result as asymo's run_layers."""
    from asymo.models.onnx_export import to_onnx

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "b"], ["d"]),
             helper.make_node("Relu", ["d"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["s"]),
             helper.make_node("Mul", ["e", "s"], ["f"]),
             helper.make_node("MaxPool", ["f"], ["g"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["g"], ["h"]),
             helper.make_node("Flatten", ["h"], ["i"]),
             helper.make_node("Gemm", ["i", "fw", "fb"], ["j"], transB=1),
             helper.make_node("Relu", ["j"], ["y"])]
    inits = [("w1", _w(4, 3, 3, 3)), ("w2", _w(4, 4, 3, 3)), ("lo", np.float32(0)),
             ("hi", np.float32(6)), ("fw", _w(5, 4)), ("fb", _w(5))]
    m = asymo.from_onnx(_model(nodes, [_vi("x", ["N", 3, 8, 8])], [_vi("y", None)], inits))
    x = _w(2, 3, 8, 8)
    full = _ort(to_onnx(m.graph), {"x": x})[0]
    np.testing.assert_allclose(full, m(x), rtol=1e-4, atol=1e-5)
    segs = m.graph.segments()
    k = 1
    a, b = segs[k][0], segs[-1][1]
    sub = m.graph.subgraph(a, b)
    h = m.run_layers(x, 0, k - 1)
    got = _ort(to_onnx(sub), {sub.inputs[0].name: h})[0]
    np.testing.assert_allclose(got, m(x), rtol=1e-4, atol=1e-5)


def test_bad_attributes_and_huge_activations_are_clear_errors():
    conv = helper.make_node("Conv", ["x", "w"], ["y"], strides=[0, 1])
    with pytest.raises(GraphError, match="strides"):
        asymo.from_onnx(_model([conv], [_vi("x", ["N", 3, 8, 8])], [_vi("y", None)],
                               [("w", _w(4, 3, 3, 3))]))
    conv = helper.make_node("Conv", ["x", "w"], ["y"], group=0)
    with pytest.raises(GraphError, match="group"):
        asymo.from_onnx(_model([conv], [_vi("x", ["N", 3, 8, 8])], [_vi("y", None)],
                               [("w", _w(4, 3, 3, 3))]))
    pad = helper.make_node("Pad", ["x", "p"], ["y"])
    m = asymo.from_onnx(_model([pad], [_vi("x", ["N", 3, 8, 8])], [_vi("y", None)],
                               [("p", np.array([0, 0, 0, 0, 0, 0, 40000, 40000]))]))
    with pytest.raises(GraphError, match="GiB"):
        m(_w(1, 3, 8, 8))


def test_gemm_on_computed_operands():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Gemm", ["x", "a", "c"], ["y"], transA=1, alpha=0.5, beta=2.0)]
    model = _model(nodes, [_vi("x", [4, 3])], [_vi("y", None)], [("c", _w(3))])
    m = asymo.from_onnx(model)
    x = _w(4, 3)
    np.testing.assert_allclose(m(x), _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,size", [("mobilenet_v1", 64), ("resnet50", 64),
                                       ("googlenet", 96)])
def test_plan_kernels_name_the_path_each_convolution_takes(name, size):
    # the plan's labels come from the path choice conv2d itself makes (asymo.ops.conv
    # .conv_path); check them against the plans the bound convolutions run
    import asymo.models
    from asymo.ops import conv as C
    from asymo.models.graph_model import _BlockedConvStep, _ConvStep

    m = asymo.models.get_graph(name, image_size=size)
    kinds = {C._DepthwisePlan: "depthwise", C._DirectPlan: "direct",
             C._WinogradConvPlan: "winograd", C._IndirectConvPlan: "indirect",
             C._PointwisePlan: "pointwise", C._RowsConvPlan: "rows", C._NchwcConvPlan: "nchwc",
             C._GemmConvPlan: "gemm"}
    with hold(None) as pool:
        inst = m._acquire(1, pool)
        try:
            bound = inst._steps_for(pool)
            labels = m.plan(1).kernels
            seen = set()
            for n, step, b in zip(m.graph.nodes, inst.steps, bound):
                if isinstance(step, _BlockedConvStep):  # (the blocked layout's kernels)
                    assert labels[n.name] == f"conv2d:blocked {step.packed.kind}"
                    seen.add(f"blocked {step.packed.kind}")
                    continue
                if not isinstance(step, _ConvStep):
                    continue
                native = next(k for k in b._keep if isinstance(k, C._NativeCalls))
                kind = kinds[type(native._plan)]
                label = labels[n.name]
                assert label.startswith(f"conv2d:{kind}"), (n.name, label, kind)
                if kind == "winograd":
                    assert label == f"conv2d:winograd F({native._plan.tile}x{native._plan.tile})"
                seen.add(kind)
        finally:
            m._release(inst)
    assert len(seen) >= 2
