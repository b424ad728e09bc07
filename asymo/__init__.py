"""asymo: make deep-learning inference use all the cores of a heterogeneous CPU.

The public API is ``__all__``; everything else lives in the layered subpackages, imported on
first use, so that ``import asymo`` only loads the C core and registers asymo's pools with
threadpoolctl (``asymo.runtime.threadpoolctl_support``; importing threadpoolctl is most of
its 35-45 ms, the price of ``threadpool_limits`` capping asymo before its first call):

``asymo.hw``        machine facts (topology, sysfs, cpu load, environment)
``asymo.profile``   the calibration profile (plain data, file IO)
``asymo.plan``      pure planning: (topology, profile, shape) -> plan data
``asymo.runtime``   the pinned, asymmetry-aware thread pool and its C interface
``asymo.ops``       the drop-in operators (matmul, conv2d, pooling)
``asymo.calibrate`` measurement that writes the profile
``asymo.models``, ``asymo.pipeline``, ``asymo.dvfs``, ``asymo.cli``
``asymo.lab``       emulator, simulator, scaling sweeps (never imported by the runtime)
"""
from __future__ import annotations

__version__ = "0.1.0"

# threadpoolctl caps asymo's pools from the start (its controller; loads the C core)
from asymo.runtime import threadpoolctl_support as _threadpoolctl_support  # noqa: E402,F401

__all__ = [
    "matmul", "prepack", "conv2d", "prepack_conv", "PackedConvWeight", "max_pool2d",
    "avg_pool2d",
    "Pool", "get_pool", "plan_matmul", "frequency_plan",
    "emulate", "from_onnx", "from_torch", "__version__",
]

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "matmul": ("asymo.ops.matmul", "matmul"),
    "prepack": ("asymo.ops.packed", "prepack"),
    "conv2d": ("asymo.ops.conv", "conv2d"),
    "prepack_conv": ("asymo.ops.conv", "prepack_conv"),
    "PackedConvWeight": ("asymo.ops.conv", "PackedConvWeight"),
    "max_pool2d": ("asymo.ops.pooling", "max_pool2d"),
    "avg_pool2d": ("asymo.ops.pooling", "avg_pool2d"),
    "Pool": ("asymo.runtime.pool", "Pool"),
    "get_pool": ("asymo.runtime.pool", "get_pool"),
    "plan_matmul": ("asymo.plan.matmul", "plan_matmul"),
    "frequency_plan": ("asymo.dvfs.selection", "frequency_plan"),
    "emulate": ("asymo.lab.emulate", None),
    "from_onnx": ("asymo.models.onnx_loader", "from_onnx"),
    "from_torch": ("asymo.models.torch_loader", "from_torch"),
}
_SUBPACKAGES = ("hw", "profile", "plan", "runtime", "ops", "calibrate", "models", "pipeline",
                "dvfs", "cli", "lab", "torch")


def __getattr__(name):
    import importlib

    if name in _SUBPACKAGES:
        value = importlib.import_module(f"asymo.{name}")
    else:
        try:
            module, attr = _LAZY[name]
        except KeyError:
            raise AttributeError(f"module 'asymo' has no attribute {name!r}") from None
        value = importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(__all__) | set(_SUBPACKAGES))
