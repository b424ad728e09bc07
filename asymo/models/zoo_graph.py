"""The zoo's networks as graphs: :func:`to_graph` turns a zoo :class:`~asymo.models.Model`
(a chain of Pipe-it layers with seeded weights) into a :class:`~asymo.models.graph.Graph` of
ONNX-style operators with the same weights, so the zoo runs through the same planner and
runtime as user models (:func:`graph_model`). The reference networks themselves (the papers'
layer lists in :mod:`asymo.models.zoo`) are unchanged.
"""
from __future__ import annotations

import numpy as np

from asymo.models.graph import Graph, Node, TensorInfo
from asymo.models.spec import LRN, Concat, Conv, Flatten, Linear, Pool, Residual, Softmax

__all__ = ["to_graph", "graph_model"]


class _Builder:
    def __init__(self, model):
        self.model = model
        self.nodes = []
        self.inits = {}
        self.count = 0

    def fresh(self, base):
        self.count += 1
        return f"{base}:{self.count}"

    def node(self, op, inputs, attrs=None, name=None):
        name = name or self.fresh(op)
        out = f"{name}:out"
        self.nodes.append(Node(name, op, tuple(inputs), (out,), dict(attrs or {})))
        return out

    def act(self, x, activation, where):
        if activation == "relu":
            return self.node("Relu", [x], name=f"{where}/relu")
        if activation == "relu6":
            return self.node("Clip", [x], {"min": 0.0, "max": 6.0}, name=f"{where}/relu6")
        return x

    def steps(self, steps, x):
        for s in steps:
            x = self.step(s, x)
        return x

    def step(self, s, x):
        if isinstance(s, Conv):
            w, b = self.model.parameters(s)
            self.inits[f"{s.name}.weight"], self.inits[f"{s.name}.bias"] = w, b
            y = self.node("Conv", [x, f"{s.name}.weight", f"{s.name}.bias"], {
                "kernel_shape": tuple(s.kernel), "strides": tuple(s.stride),
                "pads": (s.padding[0], s.padding[1], s.padding[0], s.padding[1]),
                "dilations": tuple(s.dilation), "group": s.groups}, name=s.name)
            return self.act(y, s.activation, s.name)
        if isinstance(s, Linear):
            w, b = self.model.parameters(s)
            self.inits[f"{s.name}.weight"], self.inits[f"{s.name}.bias"] = w, b
            y = self.node("Gemm", [x, f"{s.name}.weight", f"{s.name}.bias"], {"transB": 1},
                          name=s.name)
            return self.act(y, s.activation, s.name)
        if isinstance(s, Pool):
            if s.is_global:
                return self.node("GlobalAveragePool", [x])
            op = "MaxPool" if s.kind == "max" else "AveragePool"
            return self.node(op, [x], {
                "kernel_shape": tuple(s.kernel), "strides": tuple(s.stride),
                "pads": (s.padding[0], s.padding[1], s.padding[0], s.padding[1]),
                "ceil_mode": int(s.ceil_mode),
                "count_include_pad": int(s.count_include_pad)})
        if isinstance(s, LRN):
            return self.node("LRN", [x], {"size": s.size, "alpha": s.alpha, "beta": s.beta,
                                          "bias": s.k})
        if isinstance(s, Flatten):
            return self.node("Flatten", [x], {"axis": 1})
        if isinstance(s, Softmax):
            return self.node("Softmax", [x], {"axis": 1})
        if isinstance(s, Concat):
            outs = [self.steps(b, x) for b in s.branches]
            return self.node("Concat", outs, {"axis": 1})
        if isinstance(s, Residual):
            short = self.steps(s.shortcut, x) if s.shortcut else x
            main = self.steps(s.main, x)
            y = self.node("Add", [main, short])
            return self.act(y, s.activation, self.fresh("residual"))
        raise TypeError(f"unknown zoo step {s!r}")  # pragma: no cover


def to_graph(model):
    """The :class:`Graph` of zoo model ``model`` (same weights; batch 1 declared)."""
    b = _Builder(model)
    x = "input"
    for layer in model.layers:
        x = b.steps(layer.steps, x)
    b.nodes[-1].outputs = ("output",)
    inits = {k: np.asarray(v) for k, v in b.inits.items()}
    g = Graph(model.name, b.nodes, [TensorInfo("input", (1,) + tuple(model.input_shape))],
              ["output"], inits, opset=17)
    return g.check()


def graph_model(name, *, seed=0, image_size=None, pool=None):
    """Zoo model ``name`` as a :class:`asymo.models.GraphModel` (planned like user models)."""
    from asymo.models import get
    from asymo.models.graph_model import GraphModel

    return GraphModel(to_graph(get(name, seed=seed, image_size=image_size)), pool=pool)
