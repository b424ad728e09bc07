"""torch tensors at the drop-in operators (torch stays optional: never imported here).

A tensor call reads CPU tensors as NumPy views (detached: asymo is inference-only), runs the
NumPy operator, and answers with a tensor: the caller's ``out=`` tensor, written in place
through its NumPy view (so the NumPy operator's checks of its shape, dtype and aliasing apply
to it), or a tensor sharing the result's memory.
"""
from __future__ import annotations

import sys

__all__ = ["torch_of", "as_array", "out_array", "tensor_result"]


def torch_of(*values):
    """The torch module when any of ``values`` is a ``torch.Tensor`` (subclasses too), else
    None. A tensor exists only once torch is imported, so this imports nothing."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for v in values:
        if isinstance(v, torch.Tensor):
            return torch
    return None


def as_array(torch, t, what, name, *, floats_only=True):
    """A NumPy view of the CPU tensor ``t`` (anything else is returned as is); ``what`` and
    ``name`` (the operator, the argument) name it in errors."""
    if t is None or not isinstance(t, torch.Tensor):
        return t
    if t.device.type != "cpu":
        raise TypeError(f"{what}: {name} is on {t.device}; asymo runs on the CPU")
    if floats_only and t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{what}: {name} must be float32 or float64, got {t.dtype}")
    if t.dtype == torch.bfloat16:
        raise TypeError(f"{what}: {name} has dtype {t.dtype}, which NumPy cannot hold")
    return t.detach().resolve_conj().numpy()


def out_array(torch, out, what):
    """The NumPy view an ``out=`` tensor is written through (see the module docstring)."""
    if out is None or not isinstance(out, torch.Tensor):
        return out
    if out.requires_grad:
        raise RuntimeError(f"{what}: out= is a tensor that requires grad; asymo is "
                           "inference-only (torch refuses such an out= as well)")
    return as_array(torch, out, what, "out", floats_only=False)


def tensor_result(torch, res, out):
    """The tensor a call answers with: ``out`` when it was a tensor (``res`` was written
    through its view), else ``res`` as a tensor sharing its memory."""
    if isinstance(out, torch.Tensor):
        return out
    return torch.as_tensor(res)
