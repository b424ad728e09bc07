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
    fast(x)
    assert len(fast._models) == 1
    fast(torch.randn(3, 3, 32, 32))          # another batch size: exported again (a module
    assert len(fast._models) == 2            # may compute from the batch size)
    small = at.compile(_Fn(torch.relu))
    for n in range(1, at.MAX_SHAPES + 3):    # at most MAX_SHAPES kept, the oldest dropped
        small(torch.randn(n, 2, 3, 3))
    assert len(small._models) == at.MAX_SHAPES
    assert [k[0][0][0] for k in small._models] == list(range(3, at.MAX_SHAPES + 3))
    with pytest.raises(TypeError):
        fast(np.zeros((1, 3, 32, 32), np.float32))


def test_torch_threads_restored_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with at.torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


class _Fn(torch.nn.Module):
    """``fn`` of a convolution's output (``fn(conv, x)`` with ``on_input``)."""

    def __init__(self, fn, cin=2, cout=2, kernel=1, on_input=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, kernel)
        self.fn, self.on_input = fn, on_input

    def forward(self, x):
        return self.fn(self.conv, x) if self.on_input else self.fn(self.conv(x))


@pytest.mark.parametrize("fn", [lambda x: x.reshape(1, -1), lambda x: x / x.shape[0],
                                lambda x: x.reshape(1, x.shape[0], -1)],
                         ids=["reshape(1,-1)", "divide-by-batch", "batch-moved"])
def test_compile_follows_modules_that_compute_from_the_batch_size(fn):
    """The export fixes what a module computes from the batch size: compiled calls of
    another batch size take an export of their own (they were given batch 1's constants)."""
    m = _Fn(fn).eval()
    fast = at.compile(m)
    for n in (1, 3, 2):
        x = torch.randn(n, 2, 4, 4)
        with torch.no_grad():
            ref = m(x)
        y = fast(x)
        assert y.shape == ref.shape
        np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_compile_keeps_the_modules_output_structure():
    m = _Fn(lambda y: {"logits": y, "parts": [torch.relu(y), (y * 2, torch.sigmoid(y))]},
            3, 4, 3).eval()
    x = torch.randn(2, 3, 8, 8)
    got = at.compile(m)(x)
    with torch.no_grad():
        ref = m(x)
    assert isinstance(got, dict) and list(got) == ["logits", "parts"]
    import collections

    class Counts(torch.nn.Module):
        def forward(self, x):
            d = collections.defaultdict(list)
            d["a"] = torch.relu(x)
            return d

    got2 = at.compile(Counts())(x)
    assert type(got2) is collections.defaultdict and got2.default_factory is list
    np.testing.assert_allclose(got2["a"].numpy(), torch.relu(x).numpy())
    assert isinstance(got["parts"], list) and isinstance(got["parts"][1], tuple)
    for g, r in ((got["logits"], ref["logits"]), (got["parts"][0], ref["parts"][0]),
                 (got["parts"][1][0], ref["parts"][1][0]), (got["parts"][1][1], ref["parts"][1][1])):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


def test_compile_refuses_an_export_that_computes_something_else():
    """torch's exporter writes AdaptiveAvgPool2d(1) on an unbatched (C, H, W) input as a
    GlobalAveragePool over W alone (ONNX Runtime gives (C, H, 1) too): compile checks each
    export's first result against the module's."""
    with pytest.raises(RuntimeError, match="does not compute what the module does"):
        at.compile(torch.nn.AdaptiveAvgPool2d(1))(torch.randn(3, 8, 8))


def test_concurrent_first_calls_export_one_at_a_time():
    """torch's exporter keeps global state and a module's training flag is one attribute:
    two modules compiled and first called from several threads at once all answer right,
    and a module in train mode stays in train mode."""
    import threading

    nets = [tv.build("squeezenet1_1", num_classes=4, seed=s) for s in (1, 2)]
    nets[1].train()
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        refs = [n.eval()(x) for n in nets]
    nets[1].train()
    errors, results = [], {}

    def call(i, k):
        try:
            results[(i, k)] = fast[i](x)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    for _ in range(2):
        fast = [at.compile(n) for n in nets]
        threads = [threading.Thread(target=call, args=(i, k)) for i in (0, 1) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for (i, _), y in results.items():
            np.testing.assert_allclose(y.numpy(), refs[i].numpy(), rtol=1e-4, atol=1e-4)
        assert nets[1].training and not nets[0].training


def test_tensor_subclasses_are_tensors_to_the_drop_ins_and_models():
    class Tagged(torch.Tensor):
        pass

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten()).eval()
    x = torch.randn(2, 3, 8, 8).as_subclass(Tagged)
    w = torch.randn(4, 3, 3, 3)
    for y in (asymo.conv2d(x, w), asymo.matmul(x.reshape(2, -1), torch.randn(192, 5)),
              asymo.from_torch(net, torch.randn(1, 3, 8, 8))(x), at.compile(net)(x)):
        assert isinstance(y, torch.Tensor)


def test_out_tensors_are_written_through_numpys_checks():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with pytest.raises(TypeError, match="[Cc]annot cast|casting"):
        at.matmul(a, b, out=torch.zeros(3, 5, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="requires grad"):
        at.matmul(a, b, out=torch.zeros(3, 5, requires_grad=True))
    with pytest.raises(ValueError):
        at.matmul(a, b, out=torch.zeros(1, 5))
    out = torch.zeros(3, 5)
    assert at.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out.numpy(), (a @ b).numpy(), rtol=1e-5, atol=1e-6)
    x, w = torch.randn(1, 3, 6, 6), torch.randn(2, 3, 3, 3)
    with pytest.raises(ValueError):
        asymo.conv2d(x, w, out=torch.zeros(2, 2, 4, 4))  # (1, 2, 4, 4) is the result
    out = torch.zeros(1, 2, 4, 4)
    assert asymo.conv2d(x, w, out=out) is out
    np.testing.assert_allclose(out.numpy(), F.conv2d(x, w).numpy(), rtol=1e-5, atol=1e-5)
    out = torch.zeros(1, 3, 3, 3)
    assert asymo.max_pool2d(x, 2, out=out) is out
    np.testing.assert_allclose(out.numpy(), F.max_pool2d(x, 2).numpy())


def test_a_cast_to_float32_is_the_identity():
    m = _Fn(lambda conv, x: conv(x.float()).to(torch.float32), 3, 4, 3, on_input=True).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = m(x)
    np.testing.assert_allclose(asymo.from_torch(m, x[:1])(x).numpy(), ref.numpy(),
                               rtol=1e-5, atol=1e-5)
