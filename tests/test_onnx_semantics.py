"""ONNX semantics at the edges, each case a difference from ONNX Runtime that a differential
run of random models found (2026-11-29): Gemm's column bias, ceil-mode pooling with end
padding or windows past the input, average pooling excluding asymmetric padding, load-time
folding of constants (Flatten's axis, integer division, 0-d scalars, activations,
ConstantOfShape), ReduceMean's noop_with_empty_axes, and what is refused with a clear error
(Squeeze without axes: asymo keeps the batch dimension; training modes; the planner's
refusals as OnnxError). Checked against ONNX Runtime."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import asymo  # noqa: E402
from asymo.models.onnx_loader import OnnxError  # noqa: E402

RNG = np.random.default_rng(7)


def _model(nodes, in_shape, inits=(), opset=13):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _against_ort(model, x):
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = asymo.from_onnx(model)(x)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    return got


def test_gemm_bias_as_a_column_broadcasts_over_the_features():
    # C of shape (M, 1) with M == N: per row, not per output feature
    w, c = RNG.standard_normal((5, 4)).astype(np.float32), RNG.standard_normal((4, 1))
    model = _model([helper.make_node("Gemm", ["x", "w", "c"], ["y"])], [4, 5],
                   [("w", w), ("c", c.astype(np.float32))])
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(_against_ort(model, x), x @ w + c, rtol=1e-5, atol=1e-5)
    for shape in ((4,), (1, 4), (1,)):  # per feature or a scalar: the packed Gemm's bias
        model = _model([helper.make_node("Gemm", ["x", "w", "c"], ["y"])], [4, 5],
                       [("w", w), ("c", RNG.standard_normal(shape).astype(np.float32))])
        _against_ort(model, x)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("size,kernel,stride,pads", [
    (2, 2, 2, (0, 1)), (6, 2, 2, (0, 1)), (5, 3, 2, (1, 2)), (7, 3, 3, (2, 1)),
    (5, 2, 3, (1, 1)), (6, 3, 2, (2, 2))])
def test_ceil_mode_pools_drop_windows_starting_in_the_end_padding(op, size, kernel, stride,
                                                                  pads):
    # asymmetric or wide padding runs as a Pad node then the pool; a ceil-mode window that
    # would start in the end padding is dropped (ONNX, torch), no -inf or 0 output for it
    attrs = dict(kernel_shape=[kernel] * 2, strides=[stride] * 2, ceil_mode=1,
                 pads=[pads[0], pads[0], pads[1], pads[1]])
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [1, 3, size, size])
    got = _against_ort(model, RNG.standard_normal((1, 3, size, size)).astype(np.float32))
    assert np.isfinite(got).all()


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("size,kernel,stride,pad", [(5, 6, 6, 0), (5, 6, 3, 0), (5, 7, 2, 3),
                                                    (3, 4, 4, 1)])
def test_ceil_mode_windows_may_reach_past_the_padded_input(op, size, kernel, stride, pad):
    # a window larger than the (padded) input still makes an output in ceil mode (torch's
    # MaxPool2d(6, ceil_mode=True) on a 5 x 5 plane); it was refused as too large
    attrs = dict(kernel_shape=[kernel] * 2, strides=[stride] * 2, ceil_mode=1, pads=[pad] * 4)
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [1, 2, size, size])
    _against_ort(model, RNG.standard_normal((1, 2, size, size)).astype(np.float32))


def test_constants_folded_as_onnx_defines_them():
    x = RNG.standard_normal((1, 6, 1)).astype(np.float32)
    c = RNG.standard_normal((2, 3)).astype(np.float32)
    # Flatten with axis = rank: (6, 1), not (1, 6)
    _against_ort(_model([helper.make_node("Flatten", ["c"], ["f"], axis=2),
                         helper.make_node("Add", ["x", "f"], ["y"])], [1, 6, 1], [("c", c)]), x)
    # integer division truncates toward zero: -3 / 2 == -1 (a Slice start here)
    x4 = RNG.standard_normal((1, 1, 1, 6)).astype(np.float32)
    model = _model([helper.make_node("Div", ["a", "b"], ["s"]),
                    helper.make_node("Slice", ["x", "s", "e", "ax"], ["y"])], [1, 1, 1, 6],
                   [("a", np.array([-3], np.int64)), ("b", np.array([2], np.int64)),
                    ("e", np.array([6], np.int64)), ("ax", np.array([3], np.int64))])
    assert _against_ort(model, x4).shape == (1, 1, 1, 1)
    # a 0-d scalar stays 0-d: Unsqueeze gives (1,), then Concat with a (1,) shape part
    x3 = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    model = _model([helper.make_node("Unsqueeze", ["n", "zero"], ["nu"]),
                    helper.make_node("Concat", ["zero", "nu"], ["shape"], axis=0),
                    helper.make_node("Reshape", ["x", "shape"], ["y"])], [1, 3, 4],
                   [("n", np.array(12, np.int64)), ("zero", np.array([0], np.int64))])
    assert _against_ort(model, x3).shape == (1, 12)
    # a Slice of constants with its axes left empty but steps given
    model = _model([helper.make_node("Slice", ["c", "st", "en", "", "sp"], ["s"]),
                    helper.make_node("Flatten", ["s"], ["f"], axis=0),
                    helper.make_node("Add", ["x", "f"], ["y"])], [1, 3],
                   [("c", np.arange(6, dtype=np.float32).reshape(1, 6)),
                    ("st", np.array([0, 0], np.int64)), ("en", np.array([1, 6], np.int64)),
                    ("sp", np.array([1, 2], np.int64))])
    _against_ort(model, RNG.standard_normal((1, 3)).astype(np.float32))
    # an activation of a constant is folded (it had no runner on constants)
    x2 = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    c2 = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    for node in (helper.make_node("Relu", ["c"], ["a"]), helper.make_node("Sigmoid", ["c"], ["a"]),
                 helper.make_node("LeakyRelu", ["c"], ["a"], alpha=0.2),
                 helper.make_node("HardSigmoid", ["c"], ["a"], alpha=0.3, beta=0.4),
                 helper.make_node("HardSwish", ["c"], ["a"]),
                 helper.make_node("Tanh", ["c"], ["a"]),
                 helper.make_node("Clip", ["c", "lo", ""], ["a"])):
        inits = [("c", c2)] + ([("lo", np.array(0.1, np.float32))] if node.op_type == "Clip"
                               else [])
        _against_ort(_model([node, helper.make_node("Add", ["x", "a"], ["y"])], [1, 2, 3, 3],
                            inits, opset=14), x2)
    # ConstantOfShape (torch's F.pad exports its pads through one)
    model = _model([helper.make_node("ConstantOfShape", ["s"], ["k"],
                                     value=numpy_helper.from_array(np.array([2.5], np.float32))),
                    helper.make_node("Add", ["x", "k"], ["y"])], [1, 2, 3, 3],
                   [("s", np.array([3, 3], np.int64))])
    _against_ort(model, x2)


def test_a_supported_operator_on_constants_only_is_named_at_load():
    w = RNG.standard_normal((2, 1, 3, 3)).astype(np.float32)
    model = _model([helper.make_node("Conv", ["c", "w"], ["k"]),
                    helper.make_node("Add", ["x", "k"], ["y"])], [1, 2, 1, 1],
                   [("c", RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)), ("w", w)])
    with pytest.raises(OnnxError, match="Conv.*on constants only"):
        asymo.from_onnx(model)


def test_reduce_mean_noop_with_empty_axes_is_the_identity():
    x = RNG.standard_normal((1, 5, 2, 2)).astype(np.float32)
    model = _model([helper.make_node("ReduceMean", ["x"], ["y"], noop_with_empty_axes=1)],
                   [1, 5, 2, 2], opset=18)
    np.testing.assert_array_equal(_against_ort(model, x), x)
    # without it, no axes reduce every axis: the batch too, which asymo does not run
    model = _model([helper.make_node("ReduceMean", ["x"], ["y"])], [1, 5, 2, 2], opset=18)
    with pytest.raises(OnnxError, match="batch dimension"):
        asymo.from_onnx(model)


def test_squeeze_without_axes_is_refused_rather_than_keeping_the_batch():
    # ONNX squeezes the batch dimension too (at batch 1); asymo keeps it, so it says so
    model = _model([helper.make_node("Squeeze", ["x"], ["y"])], [1, 5, 1, 1])
    with pytest.raises(OnnxError, match="batch dimension.*give the axes"):
        asymo.from_onnx(model)
    model = _model([helper.make_node("Squeeze", ["x", "axes"], ["y"])], [1, 5, 1, 1],
                   [("axes", np.array([2, 3], np.int64))])
    assert _against_ort(model, RNG.standard_normal((1, 5, 1, 1)).astype(np.float32)).shape == (
        1, 5)


def test_training_modes_and_inconsistent_kernels_are_refused_at_load():
    # a Dropout or BatchNormalization in training mode is not the inference identity asymo
    # would run; a Conv whose kernel_shape differs from its weight fails at load, not later
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    model = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y"])], [1, 4, 5, 5],
                   [("r", np.array(0.5, np.float32)), ("t", np.array(True))])
    with pytest.raises(OnnxError, match="training_mode"):
        asymo.from_onnx(model)
    model = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y"])], [1, 4, 5, 5],
                   [("r", np.array(0.5, np.float32)), ("t", np.array(False))])
    _against_ort(model, x)
    bn = [("s", np.ones(4, np.float32)), ("b", np.zeros(4, np.float32)),
          ("m", np.zeros(4, np.float32)), ("v", np.ones(4, np.float32))]
    model = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                     training_mode=1)], [1, 4, 5, 5], bn, opset=15)
    with pytest.raises(OnnxError, match="training_mode"):
        asymo.from_onnx(model)
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])],
                   [1, 4, 5, 5], [("w", RNG.standard_normal((2, 4, 1, 1)).astype(np.float32))])
    with pytest.raises(OnnxError, match="kernel_shape"):
        asymo.from_onnx(model)


def test_the_planners_refusals_are_onnx_errors_too():
    # (GraphError from the load-time planner, as the loader's own, is documented as OnnxError)
    model = _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                     dilations=[2, 2])], [1, 2, 8, 8])
    with pytest.raises(OnnxError, match="from_onnx: the ModelProto: .*dilated pooling"):
        asymo.from_onnx(model)


@pytest.mark.parametrize("size,kernel,stride,pads,ceil", [
    (7, (3, 3), 2, (0, 0, 1, 1), 0), (6, (3, 2), 1, (1, 0, 1, 1), 1),
    (5, (3, 3), 2, (1, 1, 2, 2), 1), (8, (3, 3), 3, (2, 1, 0, 0), 0)])
def test_average_pool_excluding_asymmetric_padding(size, kernel, stride, pads, ceil):
    # TF's SAME padding (tf2onnx): asymmetric pads without count_include_pad; runs as the
    # padded average rescaled per window (it was refused)
    attrs = dict(kernel_shape=list(kernel), strides=[stride] * 2, pads=list(pads),
                 ceil_mode=ceil, count_include_pad=0)
    model = _model([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], [2, 3, size, size])
    _against_ort(model, RNG.standard_normal((2, 3, size, size)).astype(np.float32))
    same = _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                    strides=[2, 2], auto_pad="SAME_UPPER")], [1, 3, 8, 8])
    _against_ort(same, RNG.standard_normal((1, 3, 8, 8)).astype(np.float32))


@pytest.mark.parametrize("nodes, inits, message", [
    ([helper.make_node("Relu", [], ["y"])], (), "has 0 input.*Relu takes 1"),
    ([helper.make_node("Add", ["x"], ["y"])], (), "has 1 input.*Add takes 2"),
    ([helper.make_node("Conv", ["", "w"], ["y"])],
     (("w", np.ones((4, 3, 3, 3), np.float32)),), "input 0 .* is required but empty"),
    ([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", ""], ["y"])], (),
     "input 1 .* is required but empty"),
    ([helper.make_node("Reshape", ["x", "s"], ["y"])],
     (("s", np.array([[1, 3, 8, 8]], np.int64)),), "shape must be a 1-D integer tensor"),
    ([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)], (), "Cast.*int32"),
], ids=["no-input", "one-input-add", "empty-conv-input", "empty-mul-input", "2-d-shape",
        "cast-to-int"])
def test_malformed_nodes_are_load_errors_naming_them(nodes, inits, message):
    with pytest.raises(OnnxError, match=message):
        asymo.from_onnx(_model(nodes, [1, 3, 8, 8], inits, opset=17))


def test_a_cast_to_float_of_an_activation_runs_as_the_identity():
    x = RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)
    _against_ort(_model([helper.make_node("Relu", ["x"], ["r"]),
                         helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)],
                        [1, 3, 5, 5], opset=17), x)


def test_division_by_zero_warns_nothing_and_nan_agrees_with_nan():
    import warnings

    from asymo.cli.bench_model import _rel_diff

    x = np.array([-1.0, 0.0, 2.0, 0.0], np.float32).reshape(1, 4, 1, 1)
    m = asymo.from_onnx(_model([helper.make_node("Relu", ["x"], ["r"]),
                                helper.make_node("Div", ["r", "r"], ["y"])], [1, 4, 1, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = m(x)
    assert np.isnan(y.ravel()[[0, 1, 3]]).all() and y.ravel()[2] == 1.0
    # asymo bench's agreement: NaN where the other library has NaN agrees
    assert _rel_diff([y.copy()], [y]) == 0.0
    other = y.copy()
    other.ravel()[0] = 1.0
    assert _rel_diff([other], [y]) == float("inf")


def test_sigmoid_of_large_negative_inputs_warns_nothing():
    import warnings

    x = np.array([-1000.0, -100.0, 0.0, 100.0], np.float32).reshape(1, 4, 1, 1)
    m = asymo.from_onnx(_model([helper.make_node("Sigmoid", ["x"], ["y"])], [1, 4, 1, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = m(x)
    np.testing.assert_allclose(y.ravel(), [0.0, 0.0, 0.5, 1.0], atol=1e-7)


@pytest.mark.parametrize("case", ["softmax-opset-11", "lrn-even-size"])
def test_the_torch_runner_follows_onnx_semantics(case):
    """The torch column of `asymo bench MODEL.onnx` runs the graph node by node in torch:
    Softmax before opset 13 over the flattened dimensions from axis on, and LRN's window of
    an even size one channel later than torch's local_response_norm."""
    pytest.importorskip("torch")
    from asymo.models.torch_graph import TorchGraphRunner

    x = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
    if case == "softmax-opset-11":
        model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [1, 4, 3, 3],
                       opset=11)
    else:
        model = _model([helper.make_node("LRN", ["x"], ["y"], size=2, alpha=0.5)],
                       [1, 4, 3, 3])
    if case == "softmax-opset-11":
        ref = _against_ort(model, x)
    else:  # ONNX Runtime refuses even sizes; the spec's window, in float64
        sq = x.astype(np.float64) ** 2
        s = np.stack([sq[:, max(0, c - 0):c + 2].sum(1) for c in range(4)], 1)
        ref = x / (1.0 + 0.5 / 2 * s) ** 0.75
        np.testing.assert_allclose(asymo.from_onnx(model)(x), ref, rtol=1e-5, atol=1e-6)
    got = TorchGraphRunner(asymo.from_onnx(model))(x)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)


def test_the_torch_runner_gives_every_output():
    pytest.importorskip("torch")
    from asymo.models.torch_graph import TorchGraphRunner

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]),
                           helper.make_node("Sigmoid", ["x"], ["b"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    m = asymo.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    x = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    got, ref = TorchGraphRunner(m)(x), m(x)
    assert isinstance(got, tuple) and len(got) == 2
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["conv-bias", "gemm-c", "reduce-axes"])
def test_inconsistent_parameters_are_load_errors(case):
    """Mutated models whose parameters do not fit their operator failed at the first call
    with NumPy's broadcasting message (or ran nothing useful)."""
    if case == "conv-bias":
        model = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"])], [1, 3, 5, 5],
                       (("w", np.ones((4, 3, 3, 3), np.float32)), ("b", np.ones(5, np.float32))))
        message = "bias of shape \\(5,\\) does not fit"
    elif case == "gemm-c":
        model = _model([helper.make_node("Flatten", ["x"], ["f"]),
                        helper.make_node("Gemm", ["f", "w", "c"], ["y"], transB=1)], [1, 3, 2, 2],
                       (("w", np.ones((10, 12), np.float32)), ("c", np.ones(9, np.float32))))
        message = "C of shape \\(9,\\) does not broadcast"
    else:
        model = _model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 2])],
                       [1, 3, 5, 5], opset=13)
        message = "appears twice"
    with pytest.raises(OnnxError, match=message):
        asymo.from_onnx(model)


@pytest.mark.parametrize("op, size, kernel, stride, pads, extra", [
    ("MaxPool", (5, 5), 6, 6, (0, 0, 0, 0), {}),
    ("MaxPool", (5, 12), 6, 6, (0, 0, 0, 0), {}),
    ("MaxPool", (3, 3), 3, 2, (0, 0, 1, 1), {}),
    ("AveragePool", (2, 2), 3, 3, (0, 0, 0, 0), {"count_include_pad": 0}),
    ("AveragePool", (4, 5), 5, 2, (0, 0, 0, 0), {"count_include_pad": 0}),
])
def test_floor_mode_windows_longer_than_the_input_by_less_than_a_stride(op, size, kernel,
                                                                         stride, pads, extra):
    """torch's exporter writes an AdaptiveMaxPool2d after a ceil-mode pool as a window larger
    than its input (its shape rule against the operator's); ONNX Runtime takes one window,
    clipped to the input (these were refused at load)."""
    x = RNG.standard_normal((1, 2) + size).astype(np.float32)
    _against_ort(_model([helper.make_node(op, ["x"], ["y"], kernel_shape=[kernel, kernel],
                                          strides=[stride, stride], pads=list(pads), **extra)],
                        [1, 2, *size]), x)
    with pytest.raises(OnnxError, match="larger than the input"):  # ambiguous: refused
        asymo.from_onnx(_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[5, 5],
                                                 strides=[2, 2], count_include_pad=1)],
                               [1, 2, 4, 4]))
