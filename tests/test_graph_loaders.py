"""Networks through both loaders (asymo.from_torch, asymo.from_onnx) against torch and ONNX
Runtime; weights round-trip. Small inputs (32x32 / 64x64) keep it bounded."""
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import asymo  # noqa: E402
from asymo.models import torchvision_defs as tv  # noqa: E402

RTOL = 1e-4


def _atol(ref, fan_in=4096):
    # float32 sums over a fan-in of K terms: error ~ sqrt(K) * eps * magnitude, per layer
    return float(np.abs(ref).max()) * np.sqrt(fan_in) * 1e-5 + 1e-6


def _export(module, x):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["logits"])
    return buf.getvalue()


def _ort(data, x):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


# (network, input side, also through from_torch); the big ones at 32x32. Every network goes
# through from_onnx; from_torch exports again (seconds each), so it takes the ones whose
# exports differ most (Shape arithmetic in ShuffleNet's chunk, hardswish, residual adds).
CASES = [("resnet18", 32, True), ("mobilenet_v2", 32, False), ("squeezenet1_1", 64, False),
         ("googlenet", 32, False), ("shufflenet_v2_x0_5", 32, True),
         ("mobilenet_v3_small", 32, True), ("efficientnet_b0", 32, False)]


@pytest.mark.parametrize("name,side,via_torch", CASES)
def test_networks_match_torch_and_ort(name, side, via_torch, tmp_path):
    net = tv.build(name, num_classes=16, seed=1)
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = net(x).numpy()
    data = _export(net, x)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(data)
    m_onnx = asymo.from_onnx(path)
    m_torch = asymo.from_torch(net, x) if via_torch else m_onnx
    tol = _atol(ref)
    for m in (m_onnx, m_torch):
        y = m(x.numpy())
        assert isinstance(y, np.ndarray) and y.shape == ref.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, ref, rtol=RTOL, atol=tol)
    np.testing.assert_allclose(m_onnx(x.numpy()), _ort(data, x.numpy()), rtol=RTOL, atol=tol)
    # torch in, torch out
    yt = m_torch(x)
    assert isinstance(yt, torch.Tensor)
    np.testing.assert_allclose(yt.numpy(), ref, rtol=RTOL, atol=tol)


def test_any_batch_size_and_unbatched():
    net = tv.build("resnet18", num_classes=8, seed=3)
    x = torch.randn(3, 3, 32, 32)
    m = asymo.from_torch(net, x[:1])
    with torch.no_grad():
        ref = net(x).numpy()
    y = m(x.numpy())
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))
    y1 = m(x[1].numpy())  # (C, H, W) -> unbatched result
    assert y1.shape == (8,)
    np.testing.assert_allclose(y1, ref[1], rtol=RTOL, atol=_atol(ref))


def test_weights_round_trip_trained_state_dict():
    """A state dict loaded into the module (as after training) gives torch's output through
    either loader; the BatchNorm statistics are folded at load."""
    src = tv.build("squeezenet1_1", num_classes=10, seed=5)
    state = {k: v.clone() for k, v in src.state_dict().items()}
    dst = tv.build("squeezenet1_1", num_classes=10, seed=99)
    dst.load_state_dict(state)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = src(x).numpy()
    for m in (asymo.from_torch(dst, x[:1]), asymo.from_onnx(_export(dst, x[:1]))):
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=RTOL, atol=_atol(ref))
    # and the other seed really is different (the check can fail)
    other = tv.build("squeezenet1_1", num_classes=10, seed=99)
    with torch.no_grad():
        assert not np.allclose(other(x).numpy(), ref, atol=_atol(ref))


def test_onnx_without_constant_folding_keeps_batchnorm_and_is_folded_by_asymo():
    net = tv.build("resnet18", num_classes=4, seed=7)
    x = torch.randn(1, 3, 32, 32)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), buf, dynamo=False, opset_version=13,
                          do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE)
    m = asymo.from_onnx(buf.getvalue())
    assert "BatchNormalization" in m.source_graph.op_counts()
    assert "BatchNormalization" not in m.graph.op_counts()
    assert any("folded BatchNormalization" in r for r in m.rewrites)
    with torch.no_grad():
        ref = net(x).numpy()
    np.testing.assert_allclose(m(x.numpy()), ref, rtol=RTOL, atol=_atol(ref))


def test_from_torch_leaves_module_mode_alone():
    net = tv.build("squeezenet1_1", num_classes=4)
    net.train()
    asymo.from_torch(net, torch.randn(1, 3, 64, 64))
    assert net.training
