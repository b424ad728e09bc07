"""asymo.torch: compile(), the tensor drop-ins (asymo.conv2d / asymo.matmul return tensors,
also for inputs that require grad), and torch's thread setting restored."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

import asymo  # noqa: E402
import asymo.torch as at  # noqa: E402
from asymo.models import torchvision_defs as tv  # noqa: E402

F = torch.nn.functional


def test_conv2d_and_matmul_return_tensors_even_with_grad():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 9, generator=g, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(6, generator=g)
    y = asymo.conv2d(x, w, b, 2, 1, 1, 2)
    assert isinstance(y, torch.Tensor) and not y.requires_grad and y.dtype == torch.float32
    np.testing.assert_allclose(y.numpy(), F.conv2d(x, w, b, 2, 1, 1, 2).detach().numpy(),
                               rtol=1e-4, atol=1e-4)
    a = torch.randn(5, 7, generator=g, requires_grad=True)
    c = torch.randn(7, 3, generator=g, dtype=torch.float32)
    z = asymo.matmul(a, c)
    assert isinstance(z, torch.Tensor)
    np.testing.assert_allclose(z.numpy(), (a @ c).detach().numpy(), rtol=1e-5, atol=1e-5)
    out = torch.empty(5, 3)
    assert at.matmul(a, c, out=out) is out
    np.testing.assert_allclose(out.numpy(), z.numpy())
    with pytest.raises(TypeError, match="float32 or float64"):
        asymo.conv2d(x.to(torch.float16), w.to(torch.float16))


def test_functional_conv2d_swap_in_a_model():
    net = tv.build("squeezenet1_1", num_classes=5)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = net(x)
    orig = F.conv2d
    try:
        F.conv2d = at.conv2d
        torch.nn.modules.conv.F.conv2d = at.conv2d
        got = net(x)
    finally:
        F.conv2d = orig
        torch.nn.modules.conv.F.conv2d = orig
    np.testing.assert_allclose(got.detach().numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_compile_runs_module_and_restores_threads():
    net = tv.build("resnet18", num_classes=7, seed=2)
    fast = at.compile(net)
    before = torch.get_num_threads()
    x = torch.randn(2, 3, 32, 32)
    y = fast(x)
    assert torch.get_num_threads() == before
    with torch.no_grad():
        ref = net(x)
    assert isinstance(y, torch.Tensor) and y.shape == ref.shape
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    assert len(fast._models) == 1
    fast(torch.randn(3, 3, 32, 32))          # another batch size: same graph
    assert len(fast._models) == 1
    with pytest.raises(TypeError):
        fast(np.zeros((1, 3, 32, 32), np.float32))


def test_torch_threads_restored_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with at.torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
