"""A network graph cut into a chain of segments at single-tensor cut points.

A pipeline stage is a contiguous range of a topological order of the graph's nodes (issue 18,
paper 004's partitions of a layer chain). Between stages exactly one activation may travel, so
the stage boundaries are restricted to *cut points*: positions ``k`` of the node order where a
single non-constant tensor produced before ``k`` is still needed at or after ``k`` (inside a
ResNet block or an Inception module two tensors are live, so no cut there). The nodes between
two consecutive cut points form a *segment*; a stage runs segments ``[first, last]``.

Constants do not travel: initializers, ``Constant`` nodes and everything computed from
constants alone are recomputed (or folded) by each stage that needs them.

``CutGraph`` builds on asymo's graph (``asymo.models.graph.Graph`` from the ONNX loader of
``asymo.from_onnx``): its topological order, node names and single-tensor cut points define the
segments, and the asymo and torch executors run its nodes. The ONNX ``ModelProto`` is kept for
ONNX Runtime, which gets each stage as a sub-model extracted between the same boundary tensors.
A model with operators asymo's loader does not take can still be pipelined over ONNX Runtime:
then the cut points are found on the ONNX nodes themselves (same rule) and only the ``ort``
executor is available (``asymo_graph`` is None and ``asymo_error`` says why).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = ["CutGraph", "Segment", "load_onnx", "MAX_ONNX_BYTES"]

# ONNX protobufs cannot exceed 2 GiB; anything larger is not a model file
MAX_ONNX_BYTES = 2 ** 31 - 1


def load_onnx(model):
    """A checked ``onnx.ModelProto`` from a path or a ``ModelProto``.

    Raises
    ------
    FileNotFoundError, ValueError
        Not a regular file, too large, not an ONNX model, or a model the checker rejects.
    """
    import onnx

    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such ONNX file: {path}")
        if not os.path.isfile(path):
            raise ValueError(f"{path} is not a regular file")
        size = os.path.getsize(path)
        if size == 0 or size > MAX_ONNX_BYTES:
            raise ValueError(f"{path}: {size} bytes is not a loadable ONNX model "
                             f"(1 .. {MAX_ONNX_BYTES} bytes)")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - protobuf raises assorted types
            raise ValueError(f"{path} is not an ONNX model: {exc}") from None
    else:
        raise TypeError(f"model must be a path or an onnx.ModelProto, not "
                        f"{type(model).__name__}")
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"invalid ONNX model: {exc}") from None
    return proto


@dataclass(frozen=True)
class Segment:
    """Nodes ``[start, stop)`` of the order; reads ``input`` and produces ``output``."""

    start: int
    stop: int
    input: str
    output: str
    output_shape: tuple
    ops: tuple          # op types of its nodes, in order (indices: asymo's graph if loaded)

    @property
    def out_bytes(self):
        return 4 * int(np.prod(self.output_shape))


class CutGraph:
    """An ONNX model as a chain of segments (see the module docstring).

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A network with one float input and one output (batch dimension 1 or symbolic, which
        is fixed to 1).
    name : str, optional

    Attributes
    ----------
    proto : onnx.ModelProto
        The model with its batch dimension fixed to 1 and shapes inferred.
    segments : list of Segment
    input_name, output_name : str
    input_shape : tuple
        ``(C, H, W)`` of one frame (no batch dimension).
    """

    def __init__(self, model, *, name=None):
        import onnx

        proto = load_onnx(model)
        g = proto.graph
        inits = {t.name for t in g.initializer}
        inputs = [i for i in g.input if i.name not in inits]
        if len(inputs) != 1 or len(g.output) != 1:
            raise ValueError(f"a pipeline needs a model with one input and one output, this "
                             f"one has {len(inputs)} input(s) and {len(g.output)} output(s)")
        self.input_name = inputs[0].name
        self.output_name = g.output[0].name
        if inputs[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise ValueError(f"input {self.input_name!r} is not float32")
        proto = _fix_batch(proto, self.input_name)
        try:
            proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"shape inference failed on the model: {exc}") from None
        self.proto = proto
        self.name = name or (proto.graph.name or "model")
        shapes = _static_shapes(proto)
        in_shape = shapes.get(self.input_name)
        if in_shape is None or in_shape[0] != 1 or len(in_shape) < 2:
            raise ValueError(f"input {self.input_name!r} needs a static shape (1, ...), "
                             f"got {in_shape}")
        self.input_shape = tuple(in_shape[1:])
        self.asymo_graph, self.asymo_error = _asymo_graph(proto, self.name)
        if self.asymo_graph is not None:
            self._segments_from_graph(self.asymo_graph)
        else:
            self._segments_from_onnx(proto, inits, shapes)

    def _segments_from_graph(self, g):
        """Segments = asymo's graph segments (its cut points), node indices into ``g.nodes``."""
        from asymo.models.shapes import infer_shapes

        shapes = infer_shapes(g, 1)
        self.node_names = tuple(n.name for n in g.nodes)
        self.op_types = tuple(n.op for n in g.nodes)
        segs = []
        for a, b, tin, tout in g.segments(shapes):
            tin = tin or self.input_name
            tout = tout or self.output_name
            segs.append(Segment(a, b + 1, tin, tout, tuple(shapes[tout]),
                                self.op_types[a:b + 1]))
        self.segments = segs

    def _segments_from_onnx(self, proto, inits, shapes):
        nodes = list(proto.graph.node)
        _check_topological(nodes, inits | {self.input_name})
        self.node_names = tuple(n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes))
        self.op_types = tuple(n.op_type for n in nodes)
        cuts, tensors = _cut_points(nodes, inits, self.input_name, self.output_name)
        segs = []
        for j in range(len(cuts) - 1):
            a, b = cuts[j], cuts[j + 1]
            out = tensors[j + 1]
            shp = shapes.get(out)
            if shp is None:
                raise ValueError(f"tensor {out!r} (after node {self.node_names[b - 1]!r}) has "
                                 "no static shape; the pipeline needs static shapes")
            segs.append(Segment(a, b, tensors[j], out, tuple(shp), self.op_types[a:b]))
        self.segments = segs

    def __len__(self):
        return len(self.segments)

    @property
    def out_bytes(self):
        """Bytes of each segment's output (paper 004's ``B`` of a cut after it)."""
        return np.array([s.out_bytes for s in self.segments], dtype=np.float64)

    def segment_names(self):
        """``first-node..last-node`` per segment (for tables and plans)."""
        return [self.node_names[s.start] if s.stop - s.start == 1
                else f"{self.node_names[s.start]}..{self.node_names[s.stop - 1]}"
                for s in self.segments]

    def boundary(self, first, last):
        """``(input tensor, output tensor, output shape)`` of segments ``[first, last]``."""
        self._check(first, last)
        s0, s1 = self.segments[first], self.segments[last]
        return s0.input, s1.output, (1,) + tuple(s1.output_shape[1:])

    def node_range(self, first, last):
        """Inclusive node indices (into ``asymo_graph.nodes``) of segments ``[first, last]``."""
        self._check(first, last)
        return self.segments[first].start, self.segments[last].stop - 1

    def subgraph(self, first, last):
        """Segments ``[first, last]`` as an asymo ``Graph`` of their own.

        Raises ValueError when asymo's loader did not take the model (``asymo_error``)."""
        if self.asymo_graph is None:
            raise ValueError(self.asymo_error)
        a, b = self.node_range(first, last)
        return self.asymo_graph.subgraph(a, b)

    def submodel(self, first, last):
        """A standalone ``ModelProto`` of segments ``[first, last]`` (one input, one output,
        the constants it needs)."""
        import onnx

        inp, out, _ = self.boundary(first, last)
        if first == 0 and last == len(self.segments) - 1:
            return self.proto
        ex = getattr(self, "_extractor", None)
        if ex is None:
            ex = self._extractor = onnx.utils.Extractor(self.proto)
        sub = ex.extract_model([inp], [out])
        if first > 0:
            # the input as the stage receives it: ONNX's shape inference can disagree with
            # the operators' results (a ceil-mode pool whose last window would start in the
            # padding: one more column than torch, ONNX Runtime and asymo give), and ONNX
            # Runtime checks a fed input against the declared shape
            shape = (1,) + tuple(self.segments[first - 1].output_shape[1:])
            for vi in sub.graph.input:
                if vi.name == inp:
                    dims = vi.type.tensor_type.shape.dim
                    del dims[:]
                    for d in shape:
                        dims.add().dim_value = int(d)
            del sub.graph.value_info[:]
        return sub

    def _check(self, first, last):
        n = len(self.segments)
        if not (0 <= first <= last < n):
            raise ValueError(f"segment range [{first}, {last}] is not within [0, {n - 1}]")


def _asymo_graph(proto, name):
    """asymo's graph of the model, or ``(None, why)`` if its loader does not take it."""
    from asymo.models.graph import GraphError
    from asymo.models.onnx_loader import graph_from_onnx

    try:
        return graph_from_onnx(proto, name=name), None
    except GraphError as exc:
        return None, f"asymo's graph loader does not take this model: {exc}"


def _fix_batch(proto, input_name):
    """Copy of ``proto`` whose input's first dimension is 1 (symbolic batch -> 1)."""
    import onnx

    p = onnx.ModelProto()
    p.CopyFrom(proto)
    for vi in p.graph.input:
        if vi.name == input_name:
            dims = vi.type.tensor_type.shape.dim
            if dims and not dims[0].HasField("dim_value"):
                dims[0].Clear()
                dims[0].dim_value = 1
    # stale intermediate shapes (e.g. with the symbolic batch) would fight the inference
    del p.graph.value_info[:]
    for vi in p.graph.output:
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].Clear()
            dims[0].dim_value = 1
    return p


def _static_shapes(proto):
    out = {}
    g = proto.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[vi.name] = tuple(int(d.dim_value) for d in dims)
    return out


def _check_topological(nodes, available):
    seen = set(available) | {""}
    for n in nodes:
        for t in n.input:
            if t not in seen:
                raise ValueError(f"node {n.name or n.op_type!r} reads {t!r} before it is "
                                 "produced (the graph is not in topological order)")
        seen.update(n.output)


def _cut_points(nodes, inits, input_name, output_name):
    """Positions ``k`` (0 and ``len(nodes)`` included) where exactly one non-constant tensor
    crosses, and that tensor per position (the graph input at 0, the output at the end)."""
    const = set(inits) | {""}
    for n in nodes:  # constant folding's reach: nodes fed by constants only
        if all(t in const for t in n.input):
            const.update(n.output)
    N = len(nodes)
    last_use = {}
    for k, n in enumerate(nodes):
        for t in n.input:
            if t not in const:
                last_use[t] = k
    last_use[output_name] = N  # the graph output is needed "after" the last node
    # live[k]: tensors produced before k and used at or after k
    cuts, tensors = [0], [input_name]
    live = {input_name}
    for k in range(1, N + 1):
        for t in nodes[k - 1].output:
            if t not in const and last_use.get(t, -1) >= k:
                live.add(t)
        live = {t for t in live if last_use.get(t, -1) >= k}
        if k == N:
            break
        if len(live) == 1 and not _const_only(nodes[k - 1], const):
            cuts.append(k)
            tensors.append(next(iter(live)))
    if output_name in const:
        raise ValueError("the model output does not depend on its input")
    cuts.append(N)
    tensors.append(output_name)
    return cuts, tensors


def _const_only(node, const):
    """A node computing constants only never ends a segment (it belongs with its consumer)."""
    return all(t in const for t in node.output)
