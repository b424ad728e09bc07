"""The CNN layer zoo: six classic networks as chains of major layers, runnable on asymo.

>>> import asymo.models
>>> asymo.models.names()
['alexnet', 'googlenet', 'mobilenet_v1', 'resnet50', 'squeezenet', 'vgg16']
>>> m = asymo.models.get("resnet50")
>>> len(m.layers), m.major_count()           # chain nodes, Pipe-it Table I count
(18, 54)
>>> m.layers[1].kind, m.layers[1].gemm_dims  # a bottleneck block; its 3x3 conv dominates
('residual', (3136, 576, 64))

``model.run(images)`` gives class probabilities; ``model.run_layers(x, first, last)`` runs a
contiguous range of the chain (a pipeline stage). See :mod:`asymo.models.zoo` for what each
network is and how nodes are counted, and :mod:`asymo.models.spec` for the descriptors.
"""
from __future__ import annotations

from asymo.models.graph import Graph, GraphError, Node, TensorInfo
from asymo.models.graph_model import ExecutionPlan, GraphModel
from asymo.models.model import Model
from asymo.models.spec import Layer
from asymo.models.zoo import BUILDERS, DEFAULT_SIZES, TABLE_I_MAJOR_COUNTS, build_layers

__all__ = ["names", "get", "get_graph", "Model", "Layer", "TABLE_I_MAJOR_COUNTS", "DEFAULT_SIZES",
           "Graph", "GraphError", "Node", "TensorInfo", "GraphModel", "ExecutionPlan"]


def names():
    """Names of the zoo's models, sorted."""
    return sorted(BUILDERS)


def get(name, *, seed=0, image_size=None):
    """The zoo model ``name`` with weights seeded by ``seed``.

    ``image_size`` (a square side in pixels) builds the same network for another input size
    (default: the network's own, 224 or 227); a size too small for some layer raises
    ``ValueError``.
    """
    if not isinstance(name, str):
        raise TypeError(f"model name must be a str, got {type(name).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return Model(name, build_layers(name, image_size), seed=seed)


def get_graph(name, *, seed=0, image_size=None, pool=None):
    """Zoo model ``name`` as a :class:`GraphModel` (the same weights as :func:`get`), planned
    and run like a model from :func:`asymo.from_onnx`."""
    from asymo.models.zoo_graph import graph_model

    return graph_model(name, seed=seed, image_size=image_size, pool=pool)
