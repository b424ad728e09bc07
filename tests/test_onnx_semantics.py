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
