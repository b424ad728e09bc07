"""PyTorch integration: run an existing ``nn.Module``'s inference on asymo (needs torch).

>>> import torch, asymo.torch
>>> fast = asymo.torch.compile(model)          # model: any torch.nn.Module of supported ops
>>> y = fast(torch.randn(8, 3, 224, 224))     # a tensor in, a tensor out

``compile`` exports the module through torch's ONNX exporter in memory on the first call
(and again for each new input shape, the batch size included, as ``torch.compile`` with
``dynamic=False`` recompiles: a module may compute from the batch size; the last
:data:`MAX_SHAPES` shapes are kept), checks the export's first result against the module's,
plans it with :func:`asymo.from_torch`, and runs later calls on asymo's pool, giving back the
module's output structure. The weights are copied at export: after changing the module's
parameters call :meth:`CompiledModule.refresh`. asymo is inference-only: inputs that require
grad are detached, outputs have no autograd history.

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
import copy
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
        return self._entry(inputs)[0]

    def _entry(self, inputs):
        """``(model, output structure)`` for inputs of these shapes: exported, planned and
        checked against the module on the first inputs of each shape."""
        # the whole shape, batch included, as torch.compile(dynamic=False): what a module
        # computes from the batch size (x.reshape(1, -1), x / x.shape[0]) is a constant in
        # the exported graph, right only for the batch it was exported at
        key = tuple((tuple(t.shape), str(t.dtype)) for t in inputs)
        entry = self._models.get(key)
        if entry is None:
            with self._lock:
                entry = self._models.get(key)
                if entry is None:
                    entry = self._export(tuple(t.detach() for t in inputs))
                    if len(self._models) >= MAX_SHAPES:
                        # each shape keeps its own planned model and packed weights: the
                        # oldest goes (it is exported again if it comes back)
                        self._models.pop(next(iter(self._models)))
                    self._models[key] = entry
        return entry

    def _export(self, example):
        from asymo.models.reference import relative_error
        from asymo.models.torch_loader import eval_mode, from_torch

        model = from_torch(self.module, example, pool=self.pool)
        with eval_mode(self.module):
            expected = self.module(*example)
        leaves, structure = _flatten(expected)
        with torch_threads(self.threads):
            got = model(*example)
        got = got if isinstance(got, tuple) else (got,)
        shape = [tuple(t.shape) for t in example]
        # torch's ONNX exporter does not always write what the module computes (an
        # AdaptiveAvgPool2d on an unbatched (C, H, W) input exports as a GlobalAveragePool
        # over W alone): the first result of each shape is checked against the module's
        if len(got) != len(leaves) or any(tuple(g.shape) != tuple(e.shape)
                                           for g, e in zip(got, leaves)):
            raise RuntimeError(
                f"asymo.torch.compile: the ONNX export of {type(self.module).__name__} does "
                f"not compute what the module does for inputs of shape {shape}: outputs "
                f"{[tuple(g.shape) for g in got]}, the module's "
                f"{[tuple(e.shape) for e in leaves]} (torch's exporter)")
        for i, (g, e) in enumerate(zip(got, leaves)):
            err = relative_error(g.detach().numpy(), e.detach().double().numpy())
            if err > CHECK_RTOL:
                raise RuntimeError(
                    f"asymo.torch.compile: output {i} of {type(self.module).__name__}'s export "
                    f"differs from the module's for inputs of shape {shape}: max |asymo - "
                    f"torch| / max |torch| = {err:.2g} (over {CHECK_RTOL:g})")
        return model, structure

    def __call__(self, *inputs):
        if not inputs or not all(isinstance(t, _torch.Tensor) for t in inputs):
            raise TypeError("asymo.torch.compile: call with torch tensors (batch first)")
        for t in inputs:
            if t.dim() < 1 or t.shape[0] < 1:
                raise ValueError(f"asymo.torch.compile: inputs need a non-empty batch "
                                 f"dimension, got shape {tuple(t.shape)}")
        model, structure = self._entry(inputs)
        with torch_threads(self.threads):
            outs = model(*inputs)
        return _unflatten(structure, iter(outs if isinstance(outs, tuple) else (outs,)))


#: Input shapes a compiled module keeps exported (as torch.compile's cache size limit).
MAX_SHAPES = 8

#: Largest max |asymo - torch| / max |torch| accepted when `compile` checks an export.
CHECK_RTOL = 1e-3


def _flatten(value):
    """The tensors of a module's output in the exporter's order, and the structure around
    them (tuples, lists, dicts and named tuples; other values stay as the module gave them)."""
    leaves = []

    def walk(v):
        if isinstance(v, _torch.Tensor):
            leaves.append(v)
            return ("tensor",)
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return ("namedtuple", type(v), [walk(x) for x in v])
        if isinstance(v, (tuple, list)):
            return (type(v).__name__, [walk(x) for x in v])
        if isinstance(v, dict):
            # rebuilt from a copy of the module's dict (its type, a defaultdict's factory),
            # emptied: the structure keeps no tensor of the export's run alive
            empty = copy.copy(v)
            empty.clear()
            return ("dict", empty, [(k, walk(x)) for k, x in v.items()])
        return ("constant", v)

    return leaves, walk(value)


def _unflatten(structure, tensors):
    kind = structure[0]
    if kind == "tensor":
        return next(tensors)
    if kind == "namedtuple":
        return structure[1](*(_unflatten(s, tensors) for s in structure[2]))
    if kind == "tuple":
        return tuple(_unflatten(s, tensors) for s in structure[1])
    if kind == "list":
        return [_unflatten(s, tensors) for s in structure[1]]
    if kind == "dict":
        out = copy.copy(structure[1])
        for k, s in structure[2]:
            out[k] = _unflatten(s, tensors)
        return out
    return structure[1]


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
