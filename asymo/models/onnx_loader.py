"""``asymo.from_onnx``: an ONNX model (file, bytes or ``onnx.ModelProto``) as an asymo graph.

The file is read whole (a regular file, at most :data:`MAX_ONNX_BYTES`), parsed with the
``onnx`` package, and turned into a :class:`~asymo.models.graph.Graph`: ``Constant`` nodes and
nodes computing only on constants become initializers, every other node must be an operator
asymo runs (:data:`asymo.models.shapes.SUPPORTED_OPS`), and shapes are checked at the exported
batch size, all before anything runs. A corrupt or truncated file, weights stored outside the
file, a non-float32 input or an unsupported operator raise :class:`OnnxError` (a
``ValueError``) naming the file, and for operators the node and the opset.
"""
from __future__ import annotations

import os

import numpy as np

from asymo.models.graph import Graph, GraphError, Node, TensorInfo
from asymo.models.shapes import SUPPORTED_OPS, infer_shapes

__all__ = ["from_onnx", "graph_from_onnx", "OnnxError", "MAX_ONNX_BYTES"]

#: The largest ONNX file read (protobuf itself stops at 2 GiB).
MAX_ONNX_BYTES = 1 << 30
#: Operators evaluated at load time when all their inputs are constants (shape arithmetic a
#: exporter may leave behind); they are not run at inference.
FOLDABLE_OPS = frozenset({"Identity", "Reshape", "Transpose", "Concat", "Unsqueeze", "Squeeze",
                          "Cast", "Mul", "Add", "Sub", "Div", "Gather", "Shape", "Slice",
                          "Flatten", "Sqrt", "Reciprocal", "Neg", "Relu", "Clip", "Sigmoid",
                          "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "ConstantOfShape"})


class OnnxError(GraphError):
    """An ONNX model asymo cannot load (corrupt file, unsupported operator, ...)."""


def _read_file(path, max_bytes):
    """The file's bytes (`asymo.hw.files.read_regular_file`), its refusals as OnnxError."""
    from asymo.hw.files import NotRegularFileError, read_regular_file

    path = os.fspath(path)
    try:
        data = read_regular_file(path, max_bytes)
    except FileNotFoundError:
        raise FileNotFoundError(f"from_onnx: no such file: {path!r}") from None
    except NotRegularFileError as exc:
        raise OnnxError(f"from_onnx: {exc}") from None
    except ValueError as exc:
        raise OnnxError(f"from_onnx: {exc} (pass max_bytes= to raise the limit)") from None
    if not data:
        raise OnnxError(f"from_onnx: {path!r} is empty")
    return data


def _parse(data, where):
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.ModelProto()
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise OnnxError(f"from_onnx: {where} is not a valid ONNX model (corrupt or truncated "
                        f"file?): {e}") from None
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise OnnxError(f"from_onnx: {where} holds no ONNX graph (corrupt or truncated file, "
                        "or not an ONNX model)")
    return model


def _opset(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def _attr_value(attr, node_name, op):
    import onnx
    from onnx import numpy_helper

    v = onnx.helper.get_attribute_value(attr)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, (list, tuple)):
        if v and isinstance(v[0], bytes):
            return tuple(e.decode("utf-8", "replace") for e in v)
        if v and not isinstance(v[0], (int, float)):
            raise OnnxError(f"node {node_name!r} ({op}): attribute {attr.name!r} holds "
                            "subgraphs or tensors, which asymo does not run")
        return tuple(v)
    if isinstance(v, (onnx.GraphProto,)):
        raise OnnxError(f"node {node_name!r} ({op}): attribute {attr.name!r} is a subgraph "
                        "(control flow), which asymo does not run")
    return v


def _tensor_array(t, where):
    from onnx import numpy_helper

    if t.data_location == 1:  # TensorProto.EXTERNAL
        raise OnnxError(f"from_onnx: {where}: tensor {t.name!r} is stored in an external data "
                        "file; save the model with its weights inside (onnx.save(model, path, "
                        "save_as_external_data=False))")
    try:
        a = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - onnx raises several types for bad tensors
        raise OnnxError(f"from_onnx: {where}: tensor {t.name!r} cannot be read "
                        f"(corrupt?): {e}") from None
    return _as_constant(a)


def _as_constant(a):
    """A graph constant as asymo stores it: float32 or int64, contiguous, read-only."""
    if a.dtype.kind == "f":
        a = a.astype(np.float32)
    elif a.dtype.kind in "iub":
        a = a.astype(np.int64)
    a = np.asarray(a, order="C")  # (ascontiguousarray would make a 0-d scalar 1-d)
    a.setflags(write=False)
    return a


def _constant_value(node, attrs):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            v = attrs[key]
            return _as_constant(np.asarray(v, dtype=np.float32 if "float" in key else
                                           (np.int64 if "int" in key else None)))
    raise OnnxError(f"node {node!r} (Constant): no supported value attribute "
                    f"({sorted(attrs)})")


def _fold(node, vals, opset):
    """Evaluate a node whose inputs are all constants (see FOLDABLE_OPS)."""
    op, a = node.op, node.attrs
    x = vals[0] if vals else None
    if op == "Identity":
        return [x]
    if op == "Reshape":
        shape = [int(v) for v in vals[1]]
        if not a.get("allowzero", 0):
            shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
        return [x.reshape(shape)]
    if op == "Transpose":
        return [np.transpose(x, a.get("perm"))]
    if op == "Concat":
        return [np.concatenate(vals, axis=int(a["axis"]))]
    if op == "Unsqueeze":
        axes = a["axes"] if "axes" in a else vals[1]
        r = x.ndim + len(axes)
        for ax in sorted(int(v) % r for v in axes):
            x = np.expand_dims(x, ax)
        return [x]
    if op == "Squeeze":
        axes = a.get("axes", vals[1] if len(vals) > 1 else None)
        return [np.squeeze(x, axis=None if axes is None else tuple(int(v) for v in axes))]
    if op == "Cast":
        from onnx import helper

        return [x.astype(helper.tensor_dtype_to_np_dtype(int(a["to"])))]
    if op in ("Mul", "Add", "Sub", "Div"):
        f = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Div": np.divide}[op]
        if op == "Div" and vals[0].dtype.kind in "iu" and vals[1].dtype.kind in "iu":
            # integer division truncates toward zero (ONNX, C), where numpy's floors
            if np.any(vals[1] == 0):
                raise ValueError("integer division by zero")
            q = np.abs(vals[0]) // np.abs(vals[1])
            y = np.where((vals[0] < 0) != (vals[1] < 0), -q, q)
        else:
            y = f(vals[0], vals[1])
        return [y.astype(np.result_type(vals[0], vals[1]))]
    if op == "Gather":
        return [np.take(x, vals[1], axis=int(a.get("axis", 0)))]
    if op == "Shape":
        return [np.asarray(x.shape, np.int64)[a.get("start", 0):a.get("end", None)]]
    if op == "Slice":
        # (an input left empty, "", takes its default)
        axes = vals[3] if len(vals) > 3 and vals[3] is not None else range(len(vals[1]))
        steps = vals[4] if len(vals) > 4 and vals[4] is not None else [1] * len(vals[1])
        idx = [slice(None)] * x.ndim
        for ax, b, e, s in zip(axes, vals[1], vals[2], steps):
            idx[int(ax)] = slice(int(b), int(e), int(s))
        return [x[tuple(idx)]]
    if op == "Flatten":
        ax = int(a.get("axis", 1))
        if not -x.ndim <= ax <= x.ndim:
            raise ValueError(f"axis {ax} is out of range for a {x.ndim}-D input")
        ax = ax + x.ndim if ax < 0 else ax
        return [x.reshape(int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:])))]
    if op == "Sqrt":
        return [np.sqrt(x)]
    if op == "Reciprocal":
        return [np.reciprocal(x)]
    if op == "Neg":
        return [np.negative(x)]
    if op == "ConstantOfShape":
        value = np.asarray(a.get("value", np.zeros(1, np.float32))).reshape(-1)
        if value.size != 1:
            raise ValueError(f"value must hold one element, got {value.size}")
        shape = [int(v) for v in np.asarray(x).reshape(-1)]
        if any(v < 0 for v in shape) or int(np.prod(shape)) > 1 << 28:
            raise ValueError(f"cannot make a constant of shape {shape}")
        return [np.full(shape, value[0], value.dtype)]
    if op == "Relu":
        return [np.maximum(x, 0)]
    if op == "Clip":
        lo = a.get("min", vals[1] if len(vals) > 1 and vals[1] is not None else None)
        hi = a.get("max", vals[2] if len(vals) > 2 and vals[2] is not None else None)
        return [np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)
                .astype(x.dtype)]
    if op == "Sigmoid":
        return [1 / (1 + np.exp(-x))]
    if op == "Tanh":
        return [np.tanh(x)]
    if op == "HardSigmoid":
        return [np.clip(x * np.float32(a.get("alpha", 0.2)) + np.float32(a.get("beta", 0.5)),
                        0, 1)]
    if op == "HardSwish":
        return [x * np.clip(x / 6 + 0.5, 0, 1)]
    if op == "LeakyRelu":
        return [np.where(x >= 0, x, x * np.float32(a.get("alpha", 0.01)))]
    raise AssertionError(op)  # pragma: no cover - FOLDABLE_OPS lists the cases above


def _static_shapes(model):
    """``{tensor: shape}`` of the tensors whose shapes ONNX's shape inference knows fully."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is best effort here
        return {}
    out = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = tuple(int(d.dim_value) for d in dims)
    return out


def _check_arity(pn, opset, nname, where):
    """A node's inputs and outputs against its operator's schema at ``opset``: counts in
    range, no required input left empty (an empty name marks an omitted optional one)."""
    from onnx import defs

    try:
        schema = defs.get_schema(pn.op_type, opset, pn.domain or "")
    except Exception:  # noqa: BLE001 - an operator unknown here is reported as unsupported
        return
    what = f"from_onnx: {where}: node {nname!r} ({pn.op_type}, opset {opset})"
    for kind, names, lo, hi, formal in (
            ("input", pn.input, schema.min_input, schema.max_input, schema.inputs),
            ("output", pn.output, schema.min_output, schema.max_output, schema.outputs)):
        if not lo <= len(names) <= hi:
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < 2 ** 31 - 1 else f"{lo} or more"
            raise OnnxError(f"{what} has {len(names)} {kind}(s); {pn.op_type} takes {want}")
        for k, t in enumerate(names):
            if t or not formal:
                continue
            param = formal[min(k, len(formal) - 1)]
            if param.option != defs.OpSchema.FormalParameterOption.Optional:
                raise OnnxError(f"{what}: {kind} {k} ({param.name}) is required but empty")


def graph_from_onnx(model, *, name=None, where="the model"):
    """The :class:`Graph` of an ``onnx.ModelProto`` (see the module docstring)."""
    g = model.graph
    opset = _opset(model)
    inits = {}
    for t in g.initializer:
        inits[t.name] = _tensor_array(t, where)
    for t in getattr(g, "sparse_initializer", ()):
        raise OnnxError(f"from_onnx: {where}: sparse initializer {t.values.name!r} is not "
                        "supported")

    static = _static_shapes(model) if any(
        pn.op_type == "Shape" and pn.input[0] not in inits for pn in g.node) else {}
    nodes, used_names, unsupported = [], set(), []
    for i, pn in enumerate(g.node):
        nname = pn.name or f"{pn.op_type}_{i}"
        if nname in used_names:
            nname = f"{nname}_{i}"
        used_names.add(nname)
        if pn.domain not in ("", "ai.onnx"):
            unsupported.append((pn.op_type, nname, f"domain {pn.domain!r}"))
            continue
        _check_arity(pn, opset, nname, where)
        attrs = {a.name: _attr_value(a, nname, pn.op_type) for a in pn.attribute}
        node = Node(nname, pn.op_type, tuple(pn.input), tuple(pn.output), attrs)
        if pn.op_type == "Constant":
            inits[pn.output[0]] = _constant_value(nname, attrs)
            continue
        ins = [t for t in node.inputs if t]
        if pn.op_type in FOLDABLE_OPS and ins and all(t in inits for t in ins):
            try:
                outs = _fold(node, [inits[t] if t else None for t in node.inputs], opset)
            except Exception as e:  # noqa: BLE001 - numpy raises many types
                raise OnnxError(f"from_onnx: {where}: node {nname!r} ({pn.op_type}, opset "
                                f"{opset}) on constants failed: {e}") from None
            for tname, v in zip(node.outputs, outs):
                v = np.asarray(v, order="C")
                v.setflags(write=False)
                inits[tname] = v
            continue
        if pn.op_type == "Shape" and node.inputs[0] in static:
            # static shape arithmetic (torch's chunk / view): folded at the export shapes
            shape = np.asarray(static[node.inputs[0]], np.int64)
            v = shape[int(attrs.get("start", 0)):attrs.get("end", None)]
            v.setflags(write=False)
            inits[node.outputs[0]] = v
            continue
        if pn.op_type == "Cast" and node.inputs[0] not in inits:
            # activations are float32: a Cast to float32 (torch's x.float()) is the identity
            if attrs.get("to") == 1:  # TensorProto.FLOAT
                nodes.append(Node(nname, "Identity", node.inputs[:1], node.outputs, {}))
                continue
            from onnx import helper

            to = attrs.get("to")
            try:
                to = helper.tensor_dtype_to_np_dtype(to)
            except Exception:  # noqa: BLE001 - an undefined type number
                pass
            unsupported.append((pn.op_type, nname, f"opset {opset}, to {to}: asymo runs "
                                "float32 activations"))
            continue
        if pn.op_type not in SUPPORTED_OPS:
            unsupported.append((pn.op_type, nname, f"opset {opset}"))
            continue
        if ins and all(t in inits for t in ins):
            unsupported.append((pn.op_type, nname, f"opset {opset}, on constants only: asymo "
                                f"folds {', '.join(sorted(FOLDABLE_OPS))} at load; fold the "
                                "model's constants first (e.g. onnxsim)"))
            continue
        nodes.append(node)
    if unsupported:
        lines = "; ".join(f"operator {op!r} (node {nn!r}, {info})"
                          for op, nn, info in unsupported[:8])
        more = f" and {len(unsupported) - 8} more" if len(unsupported) > 8 else ""
        raise OnnxError(f"from_onnx: {where} uses operators asymo does not run: {lines}{more}. "
                        f"Supported: {', '.join(sorted(SUPPORTED_OPS))}")

    inputs = []
    for vi in g.input:
        if vi.name in inits:
            continue  # initializers listed as inputs (keep_initializers_as_inputs)
        tt = vi.type.tensor_type
        from onnx import helper

        if not vi.type.HasField("tensor_type"):
            raise OnnxError(f"from_onnx: {where}: input {vi.name!r} is not a tensor")
        if tt.elem_type != 1:  # TensorProto.FLOAT
            dt = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else "undefined"
            raise OnnxError(f"from_onnx: {where}: input {vi.name!r} has element type {dt}; "
                            "asymo runs float32 models")
        if not tt.HasField("shape"):
            raise OnnxError(f"from_onnx: {where}: input {vi.name!r} has no shape")
        dims = []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif k == 0:
                dims.append(1)  # a symbolic batch dimension: planned per call
            else:
                raise OnnxError(f"from_onnx: {where}: input {vi.name!r} dimension {k} is "
                                f"dynamic ({d.dim_param or '?'}); asymo needs static shapes "
                                "apart from the batch")
        inputs.append(TensorInfo(vi.name, tuple(dims), "float32"))
    outputs = [vo.name for vo in g.output]
    for o in outputs:
        if o in inits:
            raise OnnxError(f"from_onnx: {where}: output {o!r} is a constant")
    gname = name or g.name or "onnx_model"
    used = {t for n in nodes for t in n.inputs}
    inits = {k: v for k, v in inits.items() if k in used}
    graph = Graph(gname, nodes, inputs, outputs, inits, opset)
    try:
        graph.check()
        infer_shapes(graph, graph.batch)
    except OnnxError:
        raise
    except GraphError as e:
        raise OnnxError(f"from_onnx: {where}: {e}") from None
    return graph


def from_onnx(source, *, name=None, max_bytes=MAX_ONNX_BYTES, pool=None,
              cluster_choice="auto"):
    """Load an ONNX model and plan it for asymo.

    Parameters
    ----------
    source : str, os.PathLike, bytes or onnx.ModelProto
        A path to a ``.onnx`` file (a regular file of at most ``max_bytes``), the file's
        bytes, or a parsed model.
    name : str, optional
        The model's name (default: the graph's name, else the file name).
    max_bytes : int
        Largest file accepted.
    pool : asymo.Pool, optional
        The pool the model runs on by default (``asymo.get_pool()``).
    cluster_choice : {"auto", "all", "fastest"}
        On a pool of several clusters: measure all clusters, the fastest alone, and each
        node where it was faster during the first calls and keep the fastest ("auto"), or fix
        one for the whole model (`GraphModel.cluster_choice`).

    Returns
    -------
    asymo.models.GraphModel
        Call it on NCHW float32 arrays (or torch tensors).

    Raises
    ------
    OnnxError
        Corrupt or truncated file, external weights, non-float32 inputs, dynamic shapes
        other than the batch, or operators asymo does not run (each named with its node and
        the opset).
    FileNotFoundError
        No such file.
    """
    from asymo.models.graph_model import GraphModel

    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a core dependency
        raise ImportError("asymo.from_onnx needs the 'onnx' package (pip install onnx)") from None
    if isinstance(source, onnx.ModelProto):
        model, where = source, "the ModelProto"
    elif isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) > max_bytes:
            raise OnnxError(f"from_onnx: {len(source)} bytes is more than the limit of "
                            f"{max_bytes}")
        model, where = _parse(bytes(source), "the given bytes"), "the given bytes"
    elif isinstance(source, (str, os.PathLike)):
        where = repr(os.fspath(source))
        model = _parse(_read_file(source, int(max_bytes)), where)
        if name is None:
            name = os.path.splitext(os.path.basename(os.fspath(source)))[0]
    else:
        raise TypeError("from_onnx: source must be a path, bytes or an onnx.ModelProto, got "
                        f"{type(source).__name__}")
    graph = graph_from_onnx(model, name=name, where=where)
    try:
        return GraphModel(graph, pool=pool, cluster_choice=cluster_choice)
    except OnnxError:
        raise
    except GraphError as e:  # the planner's (dilated pooling, ...): an OnnxError as documented
        raise OnnxError(f"from_onnx: {where}: {e}") from None
