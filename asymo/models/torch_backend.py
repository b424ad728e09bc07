"""Run a zoo model with PyTorch operations (for tests and benchmarks; needs torch).

The same chain, steps and weights as :meth:`asymo.models.Model.run`, executed with
``torch.nn.functional``: the side-by-side baseline for asymo's forward pass. torch is imported
only when this module is used; asymo itself never needs it.
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["TorchOps", "torch_forward", "torch_available"]


def torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _tensor(a):
    import torch

    with warnings.catch_warnings():
        # the model's weights are read-only arrays; torch only reads them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(a))


class TorchOps:
    """Backend for :func:`asymo.models.model.run_steps` on torch tensors."""

    def __init__(self):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F

    def _act(self, y, activation):
        if activation == "relu":
            return self.F.relu(y, inplace=True)
        if activation == "relu6":
            return self.F.relu6(y, inplace=True)
        return y

    def conv(self, x, step, weight, bias, out=None, residual=None, activation="step"):
        act = step.activation if activation == "step" else activation
        y = self.F.conv2d(x, _tensor(weight), None if bias is None else _tensor(bias),
                          step.stride, step.padding, step.dilation, step.groups)
        if residual is not None:
            y += residual
        y = self._act(y, act)
        if out is not None:
            out.copy_(y)
            return out
        return y

    def linear(self, x, step, weight, bias):
        y = self.F.linear(x, _tensor(weight), None if bias is None else _tensor(bias))
        return self._act(y, step.activation)

    def pool(self, x, step):
        if step.is_global:
            return self.F.adaptive_avg_pool2d(x, 1)
        if step.kind == "max":
            return self.F.max_pool2d(x, step.kernel, step.stride, step.padding,
                                     ceil_mode=step.ceil_mode)
        return self.F.avg_pool2d(x, step.kernel, step.stride, step.padding,
                                 ceil_mode=step.ceil_mode,
                                 count_include_pad=step.count_include_pad)

    def lrn(self, x, step):
        return self.F.local_response_norm(x, step.size, step.alpha, step.beta, step.k)

    def flatten(self, x, step):
        return x.reshape(x.shape[0], -1)

    def softmax(self, x, step):
        return self.F.softmax(x, dim=1)

    def empty(self, shape, like):
        return self.torch.empty(shape, dtype=like.dtype)

    def add_activate(self, y, shortcut, activation):  # pragma: no cover - not in the zoo
        return self._act(y + shortcut, activation)


def torch_forward(model, images, first=0, last=None):
    """Layers ``first..last`` of ``model`` on ``images`` with torch; returns a NumPy array."""
    import torch

    from asymo.models.model import run_steps

    last = len(model.layers) - 1 if last is None else last
    ops = TorchOps()
    with torch.inference_mode():
        x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
        for layer in model.layers[first:last + 1]:
            x = run_steps(layer.steps, x, ops, model.parameters)
        return x.numpy()
