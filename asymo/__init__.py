"""asymo: make deep-learning inference use all the cores of a heterogeneous CPU.

Import cost is kept small: submodules are loaded on first use.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "topology": ("asymo.topology", None),
    "pool": ("asymo.pool", None),
    "Pool": ("asymo.pool", "Pool"),
    "get_pool": ("asymo.pool", "get_pool"),
    "dvfs": ("asymo.dvfs", None),
    "frequency_plan": ("asymo.dvfs.selection", "frequency_plan"),
    "emulate": ("asymo.emulate", None),
    "matmul": ("asymo.gemm", "matmul"),
    "pipeline": ("asymo.pipeline", None),
    "conv2d": ("asymo.conv", "conv2d"),
    "prepack_conv": ("asymo.conv", "prepack_conv"),
    "PackedConvWeight": ("asymo.conv", "PackedConvWeight"),
    "models": ("asymo.models", None),
    "plan_matmul": ("asymo.matmul_plan", "plan_matmul"),
    "sim": ("asymo.sim", None),
    "scaling": ("asymo.scaling", None),
}


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'asymo' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
