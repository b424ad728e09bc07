"""PyTorch integration: run an existing ``nn.Module``'s inference on asymo (needs torch).

>>> import torch, asymo.torch
>>> fast = asymo.torch.compile(model)          # model: any torch.nn.Module of supported ops
>>> y = fast(torch.randn(8, 3, 224, 224))     # a tensor in, a tensor out

``compile`` exports the module through torch's ONNX exporter in memory on the first call
(and again for a new per-image input shape), plans it with :func:`asymo.from_torch`, and
runs later calls on asymo's pool. The weights are copied at export: after changing the
module's parameters call :meth:`CompiledModule.refresh`. asymo is inference-only: inputs that
require grad are detached, outputs have no autograd history.

``asymo.conv2d`` and ``asymo.matmul`` take and return tensors too (``conv2d`` and ``matmul``
here are the same functions with torch's argument names), so ``F.conv2d = asymo.conv2d``
works in a model's forward for inference.

Threads: asymo runs its work on its own pool, one pinned worker per core. torch's intra-op
threads (OpenMP) keep spinning for a while after each torch operator; if they run while asymo's
workers do, both sets of threads compete for the same cores and both slow down. So
:class:`CompiledModule` sets ``torch.set_num_threads(1)`` for the duration of each call (the
glue around asymo's work is single-threaded anyway) and restores the previous value on every
exit path; :func:`torch_threads` is the same as a context manager for your own code. For a
program that alternates torch and asymo work, set torch's threads once to the number of cores
asymo does not use (or 1) rather than per call.
"""
from __future__ import annotations

import contextlib
import threading

import torch as _torch

from asymo.ops.conv import conv2d as _asymo_conv2d
from asymo.ops.matmul import matmul as _asymo_matmul

__all__ = ["compile", "CompiledModule", "conv2d", "matmul", "torch_threads"]

_thread_lock = threading.Lock()


@contextlib.contextmanager
def torch_threads(n=1):
    """Limit torch's intra-op threads to ``n`` inside the block (restored on exit)."""
    n = int(n)
    if n < 1:
        raise ValueError(f"torch_threads: n must be >= 1, got {n}")
    with _thread_lock:
        before = _torch.get_num_threads()
        if before != n:
            _torch.set_num_threads(n)
    try:
        yield
    finally:
        with _thread_lock:
            if before != n:
                _torch.set_num_threads(before)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """``torch.nn.functional.conv2d`` on asymo (tensors in, a tensor out, no autograd)."""
    return _asymo_conv2d(input, weight, bias, stride, padding, dilation, groups)


def matmul(input, other, *, out=None):  # noqa: A002
    """``torch.matmul`` on asymo for float32 / float64 CPU tensors (no autograd)."""
    return _asymo_matmul(input, other, out=out)


class CompiledModule:
    """A torch module run by asymo; see :func:`compile`."""

    def __init__(self, module, *, pool=None, threads=1):
        if not isinstance(module, _torch.nn.Module):
            raise TypeError(f"asymo.torch.compile: expected a torch.nn.Module, got "
                            f"{type(module).__name__}")
        self.module = module
        self.pool = pool
        self.threads = int(threads)
        self._models = {}
        self._lock = threading.Lock()

    def __repr__(self):
        return f"CompiledModule({type(self.module).__name__}, shapes={list(self._models)})"

    def refresh(self):
        """Forget the exported graphs (re-export on the next call, with current weights)."""
        with self._lock:
            self._models.clear()

    def model_for(self, *inputs):
        """The :class:`asymo.models.GraphModel` used for inputs like these."""
        from asymo.models.torch_loader import from_torch

        key = tuple((tuple(t.shape[1:]), str(t.dtype)) for t in inputs)
        m = self._models.get(key)
        if m is None:
            with self._lock:
                m = self._models.get(key)
                if m is None:
                    example = tuple(t.detach()[:1] for t in inputs)
                    m = self._models[key] = from_torch(self.module, example, pool=self.pool)
        return m

    def __call__(self, *inputs):
        if not inputs or not all(isinstance(t, _torch.Tensor) for t in inputs):
            raise TypeError("asymo.torch.compile: call with torch tensors (batch first)")
        for t in inputs:
            if t.dim() < 1 or t.shape[0] < 1:
                raise ValueError(f"asymo.torch.compile: inputs need a non-empty batch "
                                 f"dimension, got shape {tuple(t.shape)}")
        model = self.model_for(*inputs)
        with torch_threads(self.threads):
            return model(*inputs)


def compile(module, *, pool=None, threads=1):  # noqa: A001 - the torch.compile spelling
    """Run ``module``'s inference on asymo: returns a callable on tensors.

    Parameters
    ----------
    module : torch.nn.Module
        Built from operators asymo runs (see :data:`asymo.models.shapes.SUPPORTED_OPS`); an
        unsupported one is reported, with its node, on the first call.
    pool : asymo.Pool, optional
        The pool to run on (default ``asymo.get_pool()``).
    threads : int
        torch's intra-op threads during a call (restored after).
    """
    return CompiledModule(module, pool=pool, threads=threads)
