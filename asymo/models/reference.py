"""Direct reference implementations, for tests: slow, obvious, float64.

Every operation is written from its definition, as a loop over kernel (or window) offsets with
whole-array NumPy arithmetic inside, independent of the kernels it checks (no im2col, no
GEMM, no C). :func:`forward` runs a zoo model with these operations.
"""
from __future__ import annotations

import numpy as np

from asymo.models.spec import Conv, Linear, LRN, Pool, Flatten, Softmax

__all__ = ["conv2d", "linear", "max_pool2d", "avg_pool2d", "pool2d", "lrn", "softmax",
           "activate", "Ops", "forward", "relative_error"]


def relative_error(got, expected):
    """``max |got - expected| / max |expected|`` over the entries finite in ``expected``, in
    float64; infinite when the shapes differ or a NaN or infinity of ``expected`` is not
    matched in ``got`` (the same value at the same place), 0.0 when nothing is finite.

    How asymo's results are compared with another library's (`asymo bench`, the checks of
    `asymo.torch.compile`): a NaN where the other library has one is agreement."""
    g = np.asarray(got, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if g.shape != e.shape:
        return float("inf")
    fin = np.isfinite(e)
    if not np.array_equal(fin, np.isfinite(g)) or \
            not np.array_equal(e[~fin], g[~fin], equal_nan=True):
        return float("inf")
    if not fin.any():
        return 0.0
    scale = float(np.abs(e[fin]).max())
    diff = float(np.abs(g[fin] - e[fin]).max())
    return diff / scale if scale > 0 else diff


def _pair(v):
    return (int(v), int(v)) if np.isscalar(v) else (int(v[0]), int(v[1]))


def activate(y, activation):
    if activation is None:
        return y
    if activation == "relu":
        return np.maximum(y, 0.0)
    if activation == "relu6":
        return np.clip(y, 0.0, 6.0)
    raise ValueError(f"unknown activation {activation!r}")


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """``torch.nn.functional.conv2d`` on NCHW float64, one pass per kernel offset.

    ``padding`` is an int, a pair, or a pair of pairs ``((top, bottom), (left, right))``.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    if np.isscalar(padding) or np.isscalar(padding[0]):
        ph, pw = _pair(padding)
        pads = ((ph, ph), (pw, pw))
    else:
        pads = (tuple(padding[0]), tuple(padding[1]))
    assert c == cin_g * groups and cout % groups == 0
    xp = np.pad(x, ((0, 0), (0, 0)) + pads)
    hp, wp = xp.shape[2:]
    oh = (hp - dh * (kh - 1) - 1) // sh + 1
    ow = (wp - dw * (kw - 1) - 1) // sw + 1
    cout_g = cout // groups
    xg = xp.reshape(n, groups, cin_g, hp, wp)
    wg = w.reshape(groups, cout_g, cin_g, kh, kw)
    out = np.zeros((n, groups, cout_g, oh * ow))
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dh, kx * dw
            # the input pixels this kernel offset meets, for every output pixel
            patch = xg[:, :, :, y0:y0 + sh * (oh - 1) + 1:sh, x0:x0 + sw * (ow - 1) + 1:sw]
            patch = patch.reshape(n, groups, cin_g, oh * ow)
            # out[n, g, o, p] += sum_c w[g, o, c, ky, kx] * patch[n, g, c, p]
            out += np.matmul(wg[None, :, :, :, ky, kx], patch)
    out = out.reshape(n, cout, oh, ow)
    if bias is not None:
        out += np.asarray(bias, dtype=np.float64)[None, :, None, None]
    return activate(out, activation)


def linear(x, weight, bias=None, activation=None):
    """``x @ weight.T + bias`` with ``weight`` stored (out_features, in_features)."""
    y = np.asarray(x, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)
    return activate(y, activation)


def _pool_out(size, k, s, p, ceil_mode):
    span = size + 2 * p - k
    if ceil_mode:
        o = -(-span // s) + 1
        if (o - 1) * s >= size + p:
            o -= 1
        return o
    return span // s + 1


def pool2d(x, kind, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Max or average pooling with torch semantics, one pass per window offset."""
    x = np.asarray(x, dtype=np.float64)
    n, c, h, w = x.shape
    kh, kw = _pair(kernel)
    sh, sw = _pair(kernel if stride is None else stride)
    ph, pw = _pair(padding)
    oh, ow = _pool_out(h, kh, sh, ph, ceil_mode), _pool_out(w, kw, sw, pw, ceil_mode)
    # room for the last (ceil-mode) window past the padded input
    eh = max(0, (oh - 1) * sh + kh - (h + 2 * ph))
    ew = max(0, (ow - 1) * sw + kw - (w + 2 * pw))
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + 2 * ph + eh, w + 2 * pw + ew), fill)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    counted = np.zeros(xp.shape[2:])
    if count_include_pad:
        counted[:h + 2 * ph, :w + 2 * pw] = 1.0
    else:
        counted[ph:ph + h, pw:pw + w] = 1.0
    acc = np.full((n, c, oh, ow), fill)
    cnt = np.zeros((oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            win = xp[:, :, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw]
            if kind == "max":
                acc = np.maximum(acc, win)
            else:
                acc = acc + win
                cnt += counted[ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw]
    if kind == "max":
        return acc
    return acc / cnt


def max_pool2d(x, kernel, stride=None, padding=0, ceil_mode=False):
    return pool2d(x, "max", kernel, stride, padding, ceil_mode)


def avg_pool2d(x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return pool2d(x, "avg", kernel, stride, padding, ceil_mode, count_include_pad)


def lrn(x, size=5, alpha=1e-4, beta=0.75, k=1.0):
    """Local response normalisation across channels (``torch.nn.functional.local_response_norm``)."""
    x = np.asarray(x, dtype=np.float64)
    sq = x * x
    c = x.shape[1]
    acc = np.zeros_like(x)
    for off in range(-(size // 2), (size - 1) // 2 + 1):
        lo, hi = max(0, -off), min(c, c - off)
        acc[:, lo:hi] += sq[:, lo + off:hi + off]
    return x / (k + alpha / size * acc) ** beta


def softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class Ops:
    """The reference backend for :func:`asymo.models.model.run_steps` (float64 results)."""

    def conv(self, x, step: Conv, weight, bias, out=None, residual=None, activation="step"):
        act = step.activation if activation == "step" else activation
        y = conv2d(x, weight, bias, step.stride, step.padding, step.dilation, step.groups)
        if residual is not None:
            y = y + residual
        return activate(y, act)

    def linear(self, x, step: Linear, weight, bias):
        return linear(x, weight, bias, step.activation)

    def pool(self, x, step: Pool):
        if step.is_global:
            return x.mean(axis=(2, 3), keepdims=True, dtype=np.float64)
        return pool2d(x, step.kind, step.kernel, step.stride, step.padding, step.ceil_mode,
                      step.count_include_pad)

    def lrn(self, x, step: LRN):
        return lrn(x, step.size, step.alpha, step.beta, step.k)

    def flatten(self, x, step: Flatten):
        return np.asarray(x).reshape(x.shape[0], -1)

    def softmax(self, x, step: Softmax):
        return softmax(x, axis=1)

    def empty(self, shape, like):
        return np.empty(shape, dtype=np.float64)

    def add_activate(self, y, shortcut, activation):
        return activate(np.asarray(y, np.float64) + shortcut, activation)


def forward(model, images, first=0, last=None):
    """Run layers ``first..last`` (inclusive) of ``model`` with the reference operations, in
    float64, using the model's own weights."""
    from asymo.models.model import run_steps

    last = len(model.layers) - 1 if last is None else last
    x = np.asarray(images, dtype=np.float64)
    ops = Ops()
    for layer in model.layers[first:last + 1]:
        x = run_steps(layer.steps, x, ops, model.parameters)
    return x
