"""``asymo.from_torch``: a ``torch.nn.Module`` as an asymo graph (needs torch).

The module is exported to ONNX in memory with torch's TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``: it needs no extra package, and with
``do_constant_folding`` it leaves static shapes, no ``Shape`` arithmetic), in eval mode and
without gradients, then loaded by :func:`asymo.models.onnx_loader.graph_from_onnx`: the model
object is the same one :func:`asymo.from_onnx` gives. The module's own ``training`` flag is
restored afterwards.
"""
from __future__ import annotations

import contextlib
import io
import threading
import warnings

__all__ = ["from_torch", "export_onnx_bytes", "eval_mode", "DEFAULT_OPSET"]

#: ONNX opset used for the export (HardSwish needs 14; torch's exporter supports up to 20).
DEFAULT_OPSET = 17

# torch's TorchScript exporter keeps global state (two exports at once fail), and a module's
# training flag is one attribute: exports and eval-mode runs of modules take turns
_EXPORT_LOCK = threading.RLock()


@contextlib.contextmanager
def eval_mode(module):
    """``module`` in eval mode without gradients inside the block, its ``training`` flag
    restored after; one such block at a time in the process (exports included)."""
    import torch

    with _EXPORT_LOCK:
        was_training = module.training
        try:
            module.eval()
            with torch.no_grad():
                yield module
        finally:
            module.train(was_training)


def export_onnx_bytes(module, example_inputs, *, opset=DEFAULT_OPSET):
    """The ONNX bytes of ``module`` run on ``example_inputs`` (eval mode, no gradients)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch: module must be a torch.nn.Module, got "
                        f"{type(module).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    if not example_inputs or not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise TypeError("from_torch: example_inputs must be a tensor or a tuple of tensors")
    for t in example_inputs:
        if t.dtype != torch.float32:
            raise TypeError(f"from_torch: example inputs must be float32, got {t.dtype}")
    buf = io.BytesIO()
    try:
        with eval_mode(module), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
            torch.onnx.export(module, tuple(t.detach() for t in example_inputs), buf,
                              dynamo=False, opset_version=int(opset),
                              do_constant_folding=True,
                              input_names=[f"input{i}" if i else "input"
                                           for i in range(len(example_inputs))],
                              training=torch.onnx.TrainingMode.EVAL)
    except Exception as e:  # noqa: BLE001 - the exporter raises many types
        raise ValueError(f"from_torch: torch's ONNX exporter failed on "
                         f"{type(module).__name__}: {e}") from e
    return buf.getvalue()


def from_torch(module, example_inputs, *, name=None, opset=DEFAULT_OPSET, pool=None,
               cluster_choice="auto"):
    """Convert a torch module to an asymo model (inference only).

    Parameters
    ----------
    module : torch.nn.Module
        The network; its weights are copied (later changes to the module are not seen).
    example_inputs : torch.Tensor or tuple of torch.Tensor
        Float32 NCHW inputs fixing the shapes. The batch size may differ at call time,
        unless the module computes from it (``x.reshape(1, -1)``, ``x / x.shape[0]``): the
        export fixes such values at the example's batch (`asymo.torch.compile` exports
        once per input shape instead).
    name : str, optional
        The model's name (default: the module's class name).
    opset : int
        ONNX opset of the export.
    pool : asymo.Pool, optional
        Default pool for calls.
    cluster_choice : {"auto", "all", "fastest"}
        On a pool of several clusters: measure all clusters, the fastest alone, and each
        node where it was faster during the first calls and keep the fastest ("auto"), or fix
        one for the whole model (`GraphModel.cluster_choice`).

    Returns
    -------
    asymo.models.GraphModel

    Raises
    ------
    asymo.models.onnx_loader.OnnxError
        The network uses an operator asymo does not run (named with its node and opset).
    ValueError
        torch's exporter failed.
    """
    from asymo.models.graph_model import GraphModel
    from asymo.models.onnx_loader import _parse, graph_from_onnx

    data = export_onnx_bytes(module, example_inputs, opset=opset)
    nm = name or type(module).__name__
    graph = graph_from_onnx(_parse(data, f"the export of {nm}"), name=nm,
                            where=f"the export of {nm}")
    return GraphModel(graph, pool=pool, cluster_choice=cluster_choice)
