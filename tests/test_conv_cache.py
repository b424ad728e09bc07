"""conv2d's call cache: a repeated call signature runs its cached native calls (no checks and
planning again) and gives the same results and errors as the full path."""
import threading

import numpy as np
import pytest

import asymo
import asymo.ops.conv as conv_mod
from asymo.models import reference
from asymo.ops.conv import PackedConvWeight, conv2d

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - torch is optional
    torch = None

# (x shape, w shape, stride, padding, dilation, groups): depthwise (s1, s2), Winograd, 1x1,
# implicit im2col, the explicit im2col stem, grouped, dilated "same", unbatched
CASES = [
    ((1, 16, 12, 12), (16, 1, 3, 3), 1, 1, 1, 16),
    ((2, 16, 13, 11), (16, 1, 3, 3), 2, 1, 1, 16),
    ((1, 16, 12, 12), (24, 16, 3, 3), 1, 1, 1, 1),
    ((2, 24, 9, 9), (40, 24, 1, 1), 1, 0, 1, 1),
    ((1, 12, 15, 15), (20, 12, 5, 5), 1, 2, 1, 1),
    ((1, 3, 33, 33), (16, 3, 7, 7), 2, 3, 1, 1),
    ((2, 16, 10, 10), (32, 4, 3, 3), (1, 2), (1, 0), 1, 4),
    ((1, 8, 11, 11), (8, 8, 3, 3), 1, "same", 2, 1),
    ((16, 12, 12), (24, 16, 3, 3), 1, "valid", 1, 1),
]


def _ref(x, w, b, stride, padding, dilation, groups, activation=None, residual=None):
    if padding == "same":
        padding = tuple(d * (k - 1) // 2 for k, d in zip(w.shape[2:], (dilation,) * 2))
    elif padding == "valid":
        padding = 0
    xb = x[None] if x.ndim == 3 else x
    y = reference.conv2d(xb.astype(np.float64), w.astype(np.float64),
                         None if b is None else b.astype(np.float64), stride, padding,
                         dilation, groups, None)
    y = y[0] if x.ndim == 3 else y
    if residual is not None:
        y = y + residual
    if activation == "relu":
        y = np.maximum(y, 0)
    elif activation == "relu6":
        y = np.clip(y, 0, 6)
    return y


def _close(y, ref):
    tol = 2e-4 if y.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * max(1.0, np.abs(ref).max()))


@pytest.fixture
def no_full_path(monkeypatch):
    """Calling it makes conv2d's full path (the argument checks) fail the test: the calls
    after it must come from the cache."""
    def refuse(*a, **k):
        raise AssertionError("conv2d took the full path for a cached signature")

    def arm():
        monkeypatch.setattr(conv_mod, "_prepare", refuse)
    return arm


@pytest.fixture(autouse=True)
def _fresh_cache():
    conv_mod.clear_call_cache()
    yield
    conv_mod.clear_call_cache()


@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_repeated_signature_new_data_and_weights_changed_in_place(xs, ws, stride, pad, dil,
                                                                  groups, dtype, no_full_path):
    rng = np.random.default_rng(len(xs) + ws[0])
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    y0 = conv2d(x, w, b, stride, pad, dil, groups, activation="relu6")
    out = np.full(y0.shape, np.nan, dtype)
    res = rng.standard_normal(y0.shape).astype(dtype)

    def calls(x, w, b):
        # three signatures: plain; out= and a residual; a PackedConvWeight
        y = conv2d(x, w, b, stride, pad, dil, groups, activation="relu6")
        _close(y, _ref(x, w, b, stride, pad, dil, groups, "relu6"))
        assert conv2d(x, w, None, stride, pad, dil, groups, residual=res, out=out) is out
        _close(out, _ref(x, w, None, stride, pad, dil, groups, residual=res))
        y = conv2d(x, PackedConvWeight(w), b, stride, pad, dil, groups, activation="relu")
        _close(y, _ref(x, w, b, stride, pad, dil, groups, "relu"))
        return y

    calls(x, w, b)
    assert len(conv_mod._call_local.entries) == 3
    no_full_path()
    for trial in range(3):
        if trial == 1:   # new arrays of the same signature
            x, w, b = x.copy(), w.copy(), b.copy()
        x[...] = rng.standard_normal(xs)
        w *= rng.uniform(0.5, 2.0, (ws[0], 1, 1, 1)).astype(dtype)  # changed in place
        b[...] = rng.standard_normal(ws[0])
        res[...] = rng.standard_normal(res.shape)
        y = calls(x, w, b)
        assert y is not y0 and y.shape == y0.shape
    assert len(conv_mod._call_local.entries) == 3


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_cached_calls_match_torch_on_two_pools_alternating(no_full_path):
    rng = np.random.default_rng(3)
    layers = [((1, 32, 14, 14), (32, 1, 3, 3), 2, 1, 32), ((1, 64, 7, 7), (16, 64, 1, 1), 1, 0, 1),
              ((1, 16, 14, 14), (16, 16, 3, 3), 1, 1, 1)]
    data = [(rng.standard_normal(xs).astype(np.float32),
             rng.standard_normal(ws).astype(np.float32),
             rng.standard_normal(ws[0]).astype(np.float32), s, p, g)
            for xs, ws, s, p, g in layers]
    with asymo.Pool("fast:0") as mine:
        pools = [None, mine]
        for x, w, b, s, p, g in data:
            for pool in pools:
                conv2d(x, w, b, s, p, groups=g, pool=pool)
        keys = conv_mod._call_local.entries
        assert len(keys) == len(layers) * len(pools)
        no_full_path()
        for rnd in range(3):   # alternate signatures and pools
            for x, w, b, s, p, g in data:
                x[...] = rng.standard_normal(x.shape)
                ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                               s, p, 1, g).numpy()
                for pool in pools:
                    np.testing.assert_allclose(conv2d(x, w, b, s, p, groups=g, pool=pool), ref,
                                               rtol=1e-4, atol=1e-4)
    # the pool is closed: a cached signature raises as the first call would
    with pytest.raises(ValueError, match="closed Pool"):
        conv2d(*data[0][:3], data[0][3], data[0][4], groups=data[0][5], pool=mine)


def test_errors_on_a_cached_signature():
    x = np.ones((1, 8, 6, 6), np.float32)
    w = np.ones((4, 8, 3, 3), np.float32)
    out = np.zeros((1, 4, 4, 4), np.float32)
    conv2d(x, w, out=out, stride=1)
    conv2d(x, w, out=out, stride=1)
    assert len(conv_mod._call_local.entries) == 1
    with pytest.raises(ValueError, match="out has shape"):
        conv2d(x, w, out=np.zeros((1, 4, 5, 5), np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        conv2d(x, w, out=np.zeros((1, 4, 4, 4), np.float64))
    ro = np.zeros((1, 4, 4, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        conv2d(x, w, out=ro)
    for bad in (True, 1.0, (1, True), np.True_):
        with pytest.raises(TypeError, match="stride must be an int"):
            conv2d(x, w, out=out, stride=bad)
    with pytest.raises(ValueError, match="groups"):
        conv2d(x, w, out=out, groups=True)
    with pytest.raises(TypeError, match="bias"):
        conv2d(x, w, np.ones(4, np.float64), out=out)
    with pytest.raises(ValueError, match="activation"):
        conv2d(x, w, out=out, activation="gelu")
    with pytest.raises(ValueError, match="residual"):
        conv2d(x, w, out=out, residual=np.ones((1, 4, 4, 5), np.float32))
    # and still right afterwards
    np.testing.assert_allclose(conv2d(x, w, out=out), np.full((1, 4, 4, 4), 72.0))


def test_overlapping_out_and_residual_on_a_cached_signature():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    w = rng.standard_normal((8, 8, 1, 1)).astype(np.float32)
    out = np.zeros_like(x)
    res = rng.standard_normal(x.shape).astype(np.float32)
    for _ in range(2):   # cache the signature (out and residual apart)
        conv2d(x, w, residual=res, out=out)
    # the same signature with out = the input, then out = the residual: computed through a
    # temporary / a copy, as the full path does
    ref = _ref(x, w, None, 1, 0, 1, 1, residual=res)
    r = conv2d(x, w, residual=res, out=x)
    assert r is x
    _close(x, ref)
    ref = _ref(x, w, None, 1, 0, 1, 1, residual=res)
    conv2d(x, w, residual=res, out=res)
    _close(res, ref)


def test_cache_is_bounded_and_follows_the_settings(monkeypatch):
    monkeypatch.setattr(conv_mod, "CALL_CACHE_SIZE", 3)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    for size in range(8, 16):
        x = rng.standard_normal((1, 8, size, size)).astype(np.float32)
        for _ in range(2):
            _close(conv2d(x, w, padding=1), _ref(x, w, None, 1, 1, 1, 1))
        assert len(conv_mod._call_local.entries) <= 3
    # a setting the plan depends on changes: the cached signature is planned again
    conv2d(x, w, padding=1)
    monkeypatch.setattr(conv_mod, "WINOGRAD", "off")
    _close(conv2d(x, w, padding=1), _ref(x, w, None, 1, 1, 1, 1))
    (entry,) = [e for k, e in conv_mod._call_local.entries.items() if k[0] == x.shape]
    assert isinstance(entry.plan, (conv_mod._GemmConvPlan, conv_mod._RowsConvPlan))


def test_threads_share_a_signature():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 32, 1, 1)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(30):
                x = r.standard_normal((1, 32, 9, 9)).astype(np.float32)
                _close(conv2d(x, w, b, activation="relu"),
                       _ref(x, w, b, 1, 0, 1, 1, "relu"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
