"""A zoo model: its chain of layers, seeded weights, and a forward pass on asymo's operations."""
from __future__ import annotations

import numbers
import threading
import zlib

import numpy as np

from asymo.models.spec import (
    LRN, Concat, Conv, Flatten, LayerChain, Linear, Pool, Residual, Softmax,
)

__all__ = ["Model", "AsymoOps", "run_steps"]


def run_steps(steps, x, ops, parameters, out=None):
    """Run a node's ``steps`` on ``x`` with the backend ``ops``; ``parameters(step)`` gives a
    weighted step's ``(weight, bias)``. When ``out`` is given the result is written there
    (a concat slice: the last convolution writes into it directly)."""
    last = len(steps) - 1
    for i, step in enumerate(steps):
        target = out if i == last else None
        if isinstance(step, Conv):
            w, b = parameters(step)
            x = ops.conv(x, step, w, b, out=target)
        elif isinstance(step, Linear):
            w, b = parameters(step)
            x = ops.linear(x, step, w, b)
        elif isinstance(step, Pool):
            x = ops.pool(x, step)
        elif isinstance(step, LRN):
            x = ops.lrn(x, step)
        elif isinstance(step, Flatten):
            x = ops.flatten(x, step)
        elif isinstance(step, Softmax):
            x = ops.softmax(x, step)
        elif isinstance(step, Concat):
            x = _concat(step, x, ops, parameters, target)
        elif isinstance(step, Residual):
            x = _residual(step, x, ops, parameters, target)
        else:  # pragma: no cover - a zoo definition error
            raise TypeError(f"unknown step {step!r}")
    if out is not None and x is not out:
        out[...] = x
        return out
    return x


def _concat(step, x, ops, parameters, out):
    shape = (x.shape[0],) + tuple(step.out_shape)
    y = ops.empty(shape, x) if out is None else out
    c0 = 0
    for branch in step.branches:
        # each branch writes its channel slice (a convolution ending the branch writes there
        # directly: no copy for the concatenation)
        c1 = c0 + branch[-1].out_shape[0]
        run_steps(branch, x, ops, parameters, out=y[:, c0:c1])
        c0 = c1
    return y


def _residual(step, x, ops, parameters, out):
    shortcut = run_steps(step.shortcut, x, ops, parameters) if step.shortcut else x
    main = step.main
    y = run_steps(main[:-1], x, ops, parameters) if len(main) > 1 else x
    last = main[-1]
    if isinstance(last, Conv) and last.activation is None:
        # fused: activation(conv + bias + shortcut) in the convolution's epilogue
        w, b = parameters(last)
        return ops.conv(y, last, w, b, out=out, residual=shortcut, activation=step.activation)
    y = run_steps((last,), y, ops, parameters)  # pragma: no cover - not in the zoo
    return ops.add_activate(y, shortcut, step.activation)


class AsymoOps:
    """The forward-pass backend on asymo's kernels (conv2d, matmul, C pooling)."""

    def __init__(self, pool=None):
        # None stays None: every operation then runs on the default pool of the moment, so a
        # model built before the default pool was replaced (the emulator, a new
        # ASYMO_TOPOLOGY) keeps working
        self._pool = pool

    @property
    def thread_pool(self):
        """The pool the operations run on (the default pool when none was given)."""
        from asymo.runtime.tasks import resolve_pool

        return resolve_pool(self._pool)

    def conv(self, x, step, weight, bias, out=None, residual=None, activation="step"):
        from asymo.ops.conv import conv2d

        act = step.activation if activation == "step" else activation
        return conv2d(x, weight, bias, step.stride, step.padding, step.dilation, step.groups,
                      activation=act, residual=residual, out=out, pool=self._pool)

    def linear(self, x, step, weight, bias):
        from asymo.ops.conv_gemm import matmul_into

        # y.T = weight @ x.T: dot products with contiguous weight rows (streamed once)
        y = np.empty((x.shape[0], step.out_features), x.dtype)
        matmul_into(weight, x.T, y.T, self._pool)
        if bias is not None:
            y += bias
        if step.activation == "relu":
            np.maximum(y, 0, out=y)
        elif step.activation == "relu6":
            np.clip(y, 0, 6, out=y)
        return y

    def pool(self, x, step):
        from asymo.ops.pooling import avg_pool2d, max_pool2d

        if step.is_global:
            return avg_pool2d(x, x.shape[2:], 1, pool=self._pool)
        if step.kind == "max":
            return max_pool2d(x, step.kernel, step.stride, step.padding, ceil_mode=step.ceil_mode,
                              pool=self._pool)
        return avg_pool2d(x, step.kernel, step.stride, step.padding, step.ceil_mode,
                          step.count_include_pad, pool=self._pool)

    def lrn(self, x, step):
        # sum of squares over a window of channels as a difference of prefix sums
        sq = np.square(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)
        c = x.shape[1]
        before, after = step.size // 2, (step.size - 1) // 2
        csum = np.zeros((x.shape[0], c + 1) + x.shape[2:], sq.dtype)
        np.cumsum(sq, axis=1, out=csum[:, 1:])
        hi = np.minimum(np.arange(c) + after + 1, c)
        lo = np.maximum(np.arange(c) - before, 0)
        window = csum[:, hi] - csum[:, lo]
        window *= step.alpha / step.size
        window += step.k
        np.power(window, step.beta, out=window)
        return np.divide(x, window, dtype=x.dtype)

    def flatten(self, x, step):
        return x.reshape(x.shape[0], -1)

    def softmax(self, x, step):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        return e

    def empty(self, shape, like):
        return np.empty(shape, like.dtype)

    def add_activate(self, y, shortcut, activation):  # pragma: no cover - not in the zoo
        y = y + shortcut
        if activation == "relu":
            np.maximum(y, 0, out=y)
        elif activation == "relu6":
            np.clip(y, 0, 6, out=y)
        return y


class Model(LayerChain):
    """A CNN of the zoo: ``layers`` (the chain of major layers) plus seeded weights.

    Weights are float32, drawn on first use from a generator seeded by ``(seed, layer name)``
    (He-normal filters, small uniform biases), made read-only, and shared by every call and
    thread. Use :func:`asymo.models.get` to build one.
    """

    def __init__(self, name, layers, seed=0):
        self.name = name
        self.layers = tuple(layers)
        self.input_shape = tuple(self.layers[0].input_shape)
        self.output_shape = tuple(self.layers[-1].output_shape)
        self.seed = int(seed)
        self._params = {}
        self._packed = {}
        self._lock = threading.Lock()

    def __repr__(self):
        return (f"Model({self.name!r}, input_shape={self.input_shape}, "
                f"layers={len(self.layers)}, major_count={self.major_count()})")

    # ---- descriptors -------------------------------------------------------------------
    def summary(self):
        """A text table of the chain: one line per node."""
        rows = [f"{self.name}: input {self.input_shape}, {len(self.layers)} nodes, "
                f"{self.major_count()} major layers, {self.flops / 1e9:.2f} GFLOP/image",
                f"{'#':>3} {'name':<22} {'kind':<10} {'output':<16} {'k':<6} {'s':<4} "
                f"{'g':<5} {'MFLOP':>9}  (N, K, M)"]
        for layer in self.layers:
            k = "x".join(map(str, layer.kernel))
            rows.append(f"{layer.index:>3} {layer.name:<22} {layer.kind:<10} "
                        f"{str(layer.output_shape):<16} {k:<6} {layer.stride[0]:<4} "
                        f"{layer.groups:<5} {layer.flops / 1e6:>9.1f}  {layer.gemm_dims}")
        return "\n".join(rows)

    # ---- weights -----------------------------------------------------------------------
    def parameters(self, step):
        """``(weight, bias)`` of a Conv or Linear step (read-only float32 arrays).

        Conv weights are (Cout, Cin/groups, kh, kw); Linear weights are (out_features,
        in_features), as in torch: ``y = x @ weight.T + bias``.
        """
        p = self._params.get(step.name)
        if p is None:
            with self._lock:
                p = self._params.get(step.name)
                if p is None:
                    p = self._params[step.name] = self._make(step)
        return p

    def packed_parameters(self, step):
        """``parameters(step)`` with a Conv's weight as an `asymo.PackedConvWeight`: its
        transforms (Winograd) are made once per model and reused on every run, with no
        check of the weights' contents per call (the model's weights never change)."""
        from asymo.ops.conv import PackedConvWeight

        w, b = self.parameters(step)
        if w.ndim != 4:
            return w, b
        packed = self._packed.get(step.name)
        if packed is None:
            with self._lock:
                packed = self._packed.get(step.name)
                if packed is None:
                    packed = self._packed[step.name] = PackedConvWeight(w, copy=False)
        return packed, b

    def _make(self, step):
        key = zlib.crc32(f"{self.name}/{step.name}".encode())
        rng = np.random.default_rng([self.seed, key])
        shape = step.weight_shape
        gain = 2.0 if step.activation in ("relu", "relu6") else 1.0
        if step.activation is None and "branch2c" in step.name:
            gain = 0.25  # residual branch: keep the sum's variance from doubling per block
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(np.sqrt(gain / step.fan_in))
        b = rng.uniform(-0.1, 0.1, size=shape[0])
        b = b.astype(np.float32)
        w.setflags(write=False)
        b.setflags(write=False)
        return w, b

    def materialize(self):
        """Generate every weight now (otherwise each is drawn on first use)."""
        for layer in self.layers:
            for step in layer.weighted:
                self.parameters(step)
        return self

    # ---- forward pass ------------------------------------------------------------------
    def _check_range(self, first, last):
        n = len(self.layers)
        for name, v in (("first", first), ("last", last)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int layer index, got {v!r}")
            if not 0 <= v < n:
                raise IndexError(f"{name}={v} is out of range for {self.name}, which has {n} "
                                 "layers (indices 0..{})".format(n - 1))
        if first > last:
            raise ValueError(f"first={first} is after last={last}")

    def _prepare(self, x, shape, what):
        if not isinstance(x, np.ndarray):
            x = np.asarray(x)
        if x.dtype.kind not in "fiub":
            raise TypeError(f"{self.name}: {what} must be numeric, got dtype {x.dtype}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        shape = tuple(shape)
        if x.shape[1:] == shape and x.ndim == len(shape) + 1:
            if x.shape[0] < 1:
                raise ValueError(f"{self.name}: {what} has an empty batch: {x.shape}")
            return x, False
        if x.shape == shape:
            return x[None], True
        raise ValueError(f"{self.name}: {what} must have shape (N,) + {shape} or {shape}, "
                         f"got {x.shape}")

    def run_layers(self, x, first, last, *, pool=None):
        """Run layers ``first..last`` (inclusive indices into ``layers``) on activations ``x``
        of shape ``(N,) + layers[first].input_shape`` and return the activation after
        ``last``: a pipeline stage runs a contiguous range of layers."""
        self._check_range(first, last)
        x, unbatched = self._prepare(x, self.layers[first].input_shape, "input")
        ops = AsymoOps(pool)
        for layer in self.layers[first:last + 1]:
            x = run_steps(layer.steps, x, ops, self.packed_parameters)
        return x[0] if unbatched else x

    def run(self, images, *, pool=None):
        """Class probabilities (N, 1000) for float32 images (N,) + ``input_shape`` (a single
        (C, H, W) image gives (1000,)). Other numeric dtypes are converted to float32."""
        return self.run_layers(images, 0, len(self.layers) - 1, pool=pool)
