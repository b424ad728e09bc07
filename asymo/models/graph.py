"""A model as a graph of operators: plain data, ONNX-like, in topological order.

:class:`Graph` is what :func:`asymo.from_onnx` and :func:`asymo.from_torch` build and what
:class:`asymo.models.GraphModel` runs:

- ``nodes``: :class:`Node` records (``name``, ``op``, ``inputs``, ``outputs``, ``attrs``), kept
  in a topological order (every node after the producers of its inputs). Operators and
  attributes follow ONNX (``Conv`` with ``pads = [top, left, bottom, right]``, ``Gemm`` with
  ``transB`` ...); the load-time planner adds a few fused forms (``op`` names starting with
  ``asymo.``, see :mod:`asymo.models.graph_plan`).
- ``inputs``: :class:`TensorInfo` (name, shape with the batch as the first dimension, dtype);
  ``outputs``: tensor names.
- ``initializers``: constant tensors (weights) by name, read-only NumPy arrays.

Tensors are named by strings; the empty name ``""`` is an absent optional input. A *cut point*
is a position in the topological order after which exactly one activation tensor is still
needed: cutting there splits the model into two parts joined by that single tensor (a pipeline
stage boundary). :meth:`Graph.cut_points` lists them; :meth:`Graph.segments` groups the nodes
between consecutive cuts, and :meth:`Graph.subgraph` extracts a contiguous range of nodes as a
graph of its own (for running a stage on another executor).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from asymo.models.shapes import GraphError, infer_shapes

__all__ = ["Node", "TensorInfo", "Graph", "GraphError", "Cut"]


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, shape (batch first) and NumPy dtype name."""

    name: str
    shape: tuple
    dtype: str = "float32"


@dataclass
class Node:
    """One operator application: ``outputs = op(inputs; attrs)``."""

    name: str
    op: str
    inputs: tuple
    outputs: tuple
    attrs: dict = field(default_factory=dict)

    def __repr__(self):
        return f"Node({self.name!r}, {self.op}, {list(self.inputs)} -> {list(self.outputs)})"


@dataclass(frozen=True)
class Cut:
    """A cut point: after node ``index`` of the topological order only ``tensor`` (of shape
    ``shape`` at the graph's own batch size) flows on."""

    index: int
    tensor: str
    shape: tuple


@dataclass
class Graph:
    """A DAG of operators (see the module docstring). Build one with :func:`asymo.from_onnx`,
    :func:`asymo.from_torch` or directly; call :meth:`check` after editing it by hand."""

    name: str
    nodes: list
    inputs: list
    outputs: list
    initializers: dict
    opset: int = 17

    # ---- structure -------------------------------------------------------------------
    def producers(self):
        """``{tensor name: index of the node that produces it}``."""
        out = {}
        for i, n in enumerate(self.nodes):
            for t in n.outputs:
                if t:
                    out[t] = i
        return out

    def consumers(self):
        """``{tensor name: [indices of the nodes reading it]}`` (graph outputs not included)."""
        out = {}
        for i, n in enumerate(self.nodes):
            for t in n.inputs:
                if t:
                    out.setdefault(t, []).append(i)
        return out

    def is_constant(self, tensor):
        return tensor in self.initializers

    def toposort(self):
        """Put ``nodes`` in a topological order (stable: the given order where it is one).

        Raises :class:`GraphError` for a cycle, a tensor produced twice, or an input that
        nothing produces."""
        known = {t.name for t in self.inputs} | set(self.initializers)
        produced = {}
        for n in self.nodes:
            for t in n.outputs:
                if not t:
                    continue
                if t in produced or t in known:
                    raise GraphError(f"tensor {t!r} is produced twice (by node {n.name!r} "
                                     f"and {produced.get(t, 'a graph input or initializer')!r})")
                produced[t] = n.name
        for n in self.nodes:
            for t in n.inputs:
                if t and t not in known and t not in produced:
                    raise GraphError(f"node {n.name!r} ({n.op}) reads tensor {t!r}, which no "
                                     "node, graph input or initializer provides")
        ready, order, pending = set(known), [], list(self.nodes)
        while pending:
            rest = []
            for n in pending:
                if all(not t or t in ready for t in n.inputs):
                    order.append(n)
                    ready.update(t for t in n.outputs if t)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                raise GraphError("the graph has a cycle through nodes "
                                 f"{[n.name for n in rest[:5]]}")
            pending = rest
        for t in self.outputs:
            if t not in ready:
                raise GraphError(f"graph output {t!r} is not produced by any node")
        self.nodes = order
        return self

    def check(self):
        """Validate names and order; returns ``self``."""
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            seen, dup = set(), []
            for nm in names:
                if nm in seen:
                    dup.append(nm)
                seen.add(nm)
            raise GraphError(f"node names must be unique; repeated: {dup[:5]}")
        if not self.inputs:
            raise GraphError("the graph has no (non-constant) input")
        if not self.outputs:
            raise GraphError("the graph has no output")
        return self.toposort()

    def live_after(self):
        """For each position ``i``: the activation tensors produced at or before node ``i``
        (or graph inputs) that a later node or the graph's outputs still read."""
        last_use = {}
        for i, n in enumerate(self.nodes):
            for t in n.inputs:
                if t and t not in self.initializers:
                    last_use[t] = i
        end = len(self.nodes)
        for t in self.outputs:
            last_use[t] = end
        born = {t.name: -1 for t in self.inputs}
        for i, n in enumerate(self.nodes):
            for t in n.outputs:
                if t:
                    born[t] = i
        out = []
        for i in range(len(self.nodes)):
            out.append(sorted(t for t, b in born.items()
                              if b <= i and last_use.get(t, -2) > i))
        return out

    def cut_points(self, shapes=None):
        """The positions where the model can be cut into two parts joined by one tensor.

        Returns a list of :class:`Cut` ``(index, tensor, shape)``: after node ``index``
        exactly one activation tensor is live, and it is not a graph output. The last node
        is not a cut (nothing follows it). ``shapes`` (``{tensor: shape}``, default: inferred
        at the graph's batch size) fills in the shapes."""
        if shapes is None:

            shapes = infer_shapes(self, self.batch)
        cuts = []
        outs = set(self.outputs)
        for i, live in enumerate(self.live_after()[:-1]):
            if len(live) == 1 and live[0] not in outs:
                cuts.append(Cut(i, live[0], tuple(shapes[live[0]])))
        return cuts

    def segments(self, shapes=None):
        """The node ranges between consecutive cut points: ``[(first, last, in_tensor,
        out_tensor)]`` with inclusive node indices covering the whole order; a pipeline stage
        is any contiguous run of segments."""
        cuts = self.cut_points(shapes)
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            return [(0, len(self.nodes) - 1, None, None)]
        segs, first, tin = [], 0, self.inputs[0].name
        for c in cuts:
            segs.append((first, c.index, tin, c.tensor))
            first, tin = c.index + 1, c.tensor
        segs.append((first, len(self.nodes) - 1, tin, self.outputs[0]))
        return segs

    def subgraph(self, first, last, *, name=None):
        """Nodes ``first..last`` (inclusive) as a graph of their own: its inputs are the
        activation tensors the range reads from before it, its outputs those read after it
        (or graph outputs); initializers are shared (not copied)."""
        if not 0 <= first <= last < len(self.nodes):
            raise IndexError(f"node range [{first}, {last}] is outside [0, {len(self.nodes) - 1}]")

        shapes = infer_shapes(self, self.batch)
        dtypes = {t.name: t.dtype for t in self.inputs}
        nodes = self.nodes[first:last + 1]
        inside = {t for n in nodes for t in n.outputs if t}
        ins, seen = [], set()
        for n in nodes:
            for t in n.inputs:
                if t and t not in inside and t not in self.initializers and t not in seen:
                    seen.add(t)
                    ins.append(TensorInfo(t, tuple(shapes[t]), dtypes.get(t, "float32")))
        later = {t for n in self.nodes[last + 1:] for t in n.inputs} | set(self.outputs)
        outs = [t for n in nodes for t in n.outputs if t and t in later]
        used = {t for n in nodes for t in n.inputs}
        inits = {k: v for k, v in self.initializers.items() if k in used}
        return Graph(name or f"{self.name}[{first}:{last}]", list(nodes), ins, outs, inits,
                     self.opset)

    # ---- descriptors -----------------------------------------------------------------
    @property
    def batch(self):
        """The batch size the graph was exported with (first dimension of its first input)."""
        return int(self.inputs[0].shape[0]) if self.inputs and self.inputs[0].shape else 1

    def op_counts(self):
        out = {}
        for n in self.nodes:
            out[n.op] = out.get(n.op, 0) + 1
        return dict(sorted(out.items()))

    def parameter_count(self):
        return int(sum(np.asarray(v).size for v in self.initializers.values()))

    def summary(self):
        """A text listing: one line per node (index, op, name, inputs -> outputs)."""
        rows = [f"{self.name}: {len(self.nodes)} nodes, inputs "
                f"{[(t.name, tuple(t.shape)) for t in self.inputs]}, outputs {self.outputs}, "
                f"{self.parameter_count()} parameters, opset {self.opset}"]
        for i, n in enumerate(self.nodes):
            ins = [t for t in n.inputs if t and t not in self.initializers]
            rows.append(f"{i:>4} {n.op:<22} {n.name:<36} {ins} -> {list(n.outputs)}")
        return "\n".join(rows)

    def __repr__(self):
        return (f"Graph({self.name!r}, nodes={len(self.nodes)}, "
                f"inputs={[(t.name, tuple(t.shape)) for t in self.inputs]}, "
                f"outputs={self.outputs})")
