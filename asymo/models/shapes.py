"""Static shapes of a :class:`~asymo.models.graph.Graph` at a given batch size.

Every operator asymo runs has a shape rule here; :data:`SUPPORTED_OPS` is their set (the
loaders reject anything else before running). Shapes are inferred for any batch size ``N``:
the first dimension of every activation is the batch. A ``Reshape`` whose target keeps the
exported batch (``0``, ``-1`` or the export batch in front) keeps ``N`` in front; one that
mixes the batch into other dimensions runs only at the export batch size.
"""
from __future__ import annotations

import math

import numpy as np



class GraphError(ValueError):
    """A graph that cannot be built or run (unsupported operator, bad shapes, cycles...)."""

__all__ = ["GraphError", "infer_shapes", "SUPPORTED_OPS", "conv_pads", "pool_geometry",
           "spatial_out", "ints", "ACTIVATION_OPS"]

# element-wise single-input operators (run in place when their input dies)
ACTIVATION_OPS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu",
                  "asymo.SiLU")


def ints(v):
    return tuple(int(e) for e in v)


def _const(graph, name, what, node):
    try:
        return np.asarray(graph.initializers[name])
    except KeyError:
        raise GraphError(f"node {node.name!r} ({node.op}): {what} must be a constant "
                         f"(initializer or Constant node), got the computed tensor {name!r}"
                         ) from None


def _const_vector(graph, name, what, node):
    """A constant input that ONNX defines as a 1-D integer tensor (shape, axes, pads,
    starts, ...), checked: anything else is a clear error, not a NumPy one."""
    v = _const(graph, name, what, node)
    if v.ndim != 1 or not (np.issubdtype(v.dtype, np.integer) or v.size == 0):
        raise GraphError(f"node {node.name!r} ({node.op}): {what} must be a 1-D integer "
                         f"tensor, got {v.dtype} of shape {v.shape}")
    return v.astype(np.int64)


def conv_pads(node, in_hw, kernel, strides, dilations):
    """``(top, left, bottom, right)`` pads of a Conv / pooling node, ``auto_pad`` resolved."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", "", None):
        pads = ints(node.attrs.get("pads", (0,) * 4))
        if len(pads) != 4:
            raise GraphError(f"node {node.name!r} ({node.op}): pads must have 4 values for a "
                             f"2-D operator, got {pads}")
        return pads
    if auto == "VALID":
        return (0, 0, 0, 0)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise GraphError(f"node {node.name!r} ({node.op}): unknown auto_pad {auto!r}")
    begin, end = [], []
    for size, k, s, d in zip(in_hw, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return (begin[0], begin[1], end[0], end[1])


def pool_geometry(node, in_hw):
    """``(kernel, strides, pads, dilations, ceil_mode)`` of a Conv / MaxPool / AveragePool."""
    if "kernel_shape" not in node.attrs:
        raise GraphError(f"node {node.name!r} ({node.op}): no kernel_shape")
    kernel = ints(node.attrs["kernel_shape"])
    strides = ints(node.attrs.get("strides", (1, 1)))
    dil = ints(node.attrs.get("dilations", (1, 1)))
    for what, v, lo in (("kernel_shape", kernel, 1), ("strides", strides, 1),
                        ("dilations", dil, 1)):
        if len(v) != 2 or min(v) < lo:
            raise GraphError(f"node {node.name!r} ({node.op}): {what} must be two values "
                             f">= {lo} (2-D operators only), got {v}")
    pads = conv_pads(node, in_hw, kernel, strides, dil)
    if min(pads) < 0:
        raise GraphError(f"node {node.name!r} ({node.op}): negative pads {pads}")
    ceil = bool(node.attrs.get("ceil_mode", 0))
    if not ceil and (node.op == "MaxPool" or (node.op == "AveragePool" and not
                                             node.attrs.get("count_include_pad", 0))):
        # a floor-mode window longer than its padded input by less than a stride: ONNX
        # Runtime counts trunc((in + pads - k) / s) + 1 = 1 window, clipped to the input
        # (torch's exporter writes such pools for an AdaptiveMaxPool2d after a ceil-mode
        # pool). Ceil mode gives that window, and where every other axis divides evenly
        # the same windows as floor mode. (Not for an average counting the padding: ONNX
        # Runtime then divides by the whole window, torch by the part over the padded
        # input.)
        spans = [in_hw[i] + pads[i] + pads[i + 2] - dil[i] * (kernel[i] - 1) - 1
                 for i in (0, 1)]
        if any(sp < 0 for sp in spans) and all(-st < sp < 0 or (sp >= 0 and sp % st == 0)
                                               for sp, st in zip(spans, strides)):
            ceil = True
    return kernel, strides, pads, dil, ceil


def spatial_out(size, k, s, p0, p1, d, ceil):
    """Output length along one axis of a convolution or pooling window (ceil mode: a window
    must start inside the input or its begin padding, as ONNX and torch say)."""
    span = size + p0 + p1 - d * (k - 1) - 1
    if not ceil:
        return span // s + 1 if span >= 0 else 0
    # (a window may reach past the padded end, even the first one: torch's rule)
    out = -(-span // s) + 1
    if (out - 1) * s >= size + p0:  # the last window must start inside the input or padding
        out -= 1
    return max(out, 0)


def _need_rank(node, shape, rank, what="input"):
    if len(shape) != rank:
        raise GraphError(f"node {node.name!r} ({node.op}): expected a {rank}-D {what}, got "
                         f"shape {tuple(shape)}")


def _conv(g, n, s):
    x = s[n.inputs[0]]
    w = s[n.inputs[1]]
    _need_rank(n, x, 4)
    if len(w) != 4:
        raise GraphError(f"node {n.name!r} (Conv): only 2-D convolutions are supported, weight "
                         f"has shape {tuple(w)}")
    group = int(n.attrs.get("group", 1))
    if group < 1:
        raise GraphError(f"node {n.name!r} (Conv): group must be >= 1, got {group}")
    if w[1] * group != x[1] or w[0] % group:
        raise GraphError(f"node {n.name!r} (Conv): input with {x[1]} channels does not fit "
                         f"weight {tuple(w)} with group={group}")
    attrs = dict(n.attrs)
    if len(n.inputs) > 2 and n.inputs[2] and tuple(s[n.inputs[2]]) != (w[0],):
        raise GraphError(f"node {n.name!r} (Conv): bias of shape {tuple(s[n.inputs[2]])} does "
                         f"not fit weight {tuple(w)} (expected ({w[0]},))")
    if "kernel_shape" in attrs and ints(attrs["kernel_shape"]) != tuple(w[2:]):
        raise GraphError(f"node {n.name!r} (Conv): kernel_shape {ints(attrs['kernel_shape'])} "
                         f"differs from the weight's {tuple(w[2:])}")
    attrs.setdefault("kernel_shape", w[2:])
    k, st, p, d, _ = pool_geometry(type(n)(n.name, n.op, n.inputs, n.outputs, attrs), x[2:])
    oh = spatial_out(x[2], k[0], st[0], p[0], p[2], d[0], False)
    ow = spatial_out(x[3], k[1], st[1], p[1], p[3], d[1], False)
    if oh < 1 or ow < 1:
        raise GraphError(f"node {n.name!r} (Conv): kernel {k} is larger than the padded input "
                         f"{tuple(x)}")
    return [(x[0], w[0], oh, ow)]


def _pool(g, n, s):
    x = s[n.inputs[0]]
    _need_rank(n, x, 4)
    k, st, p, d, ceil = pool_geometry(n, x[2:])
    oh = spatial_out(x[2], k[0], st[0], p[0], p[2], d[0], ceil)
    ow = spatial_out(x[3], k[1], st[1], p[1], p[3], d[1], ceil)
    if oh < 1 or ow < 1:
        raise GraphError(f"node {n.name!r} ({n.op}): window {k} is larger than the input "
                         f"{tuple(x)}")
    return [(x[0], x[1], oh, ow)] + ([(x[0], x[1], oh, ow)] if len(n.outputs) > 1 else [])


def _global_pool(g, n, s):
    x = s[n.inputs[0]]
    if len(x) < 3:
        raise GraphError(f"node {n.name!r} ({n.op}): expected an (N, C, ...) input, got {x}")
    return [tuple(x[:2]) + (1,) * (len(x) - 2)]


def _same(g, n, s):
    return [s[n.inputs[0]]] + [s[n.inputs[0]]] * (len([o for o in n.outputs if o]) - 1)


def _broadcast(g, n, s):
    shapes = [s[t] for t in n.inputs if t]
    try:
        out = np.broadcast_shapes(*shapes)
    except ValueError:
        raise GraphError(f"node {n.name!r} ({n.op}): input shapes {shapes} do not "
                         "broadcast") from None
    return [tuple(out)]


def _gemm(g, n, s):
    a, b = s[n.inputs[0]], s[n.inputs[1]]
    if len(a) != 2 or len(b) != 2:
        raise GraphError(f"node {n.name!r} (Gemm): expected 2-D inputs, got {a} and {b}")
    m, k = (a[1], a[0]) if n.attrs.get("transA", 0) else a
    k2, nn = (b[1], b[0]) if n.attrs.get("transB", 0) else b
    if k != k2:
        raise GraphError(f"node {n.name!r} (Gemm): inner dimensions differ: {a} and {b} "
                         f"(transA={n.attrs.get('transA', 0)}, transB={n.attrs.get('transB', 0)})")
    if len(n.inputs) > 2 and n.inputs[2]:
        c = tuple(s[n.inputs[2]])
        try:  # C broadcasts to the result, one way
            ok = len(c) <= 2 and np.broadcast_shapes(c, (m, nn)) == (m, nn)
        except ValueError:
            ok = False
        if not ok:
            raise GraphError(f"node {n.name!r} (Gemm): C of shape {c} does not broadcast to the "
                             f"result's {(m, nn)}")
    return [(m, nn)]


def _matmul(g, n, s):
    a, b = tuple(s[n.inputs[0]]), tuple(s[n.inputs[1]])
    if not a or not b:
        raise GraphError(f"node {n.name!r} (MatMul): scalar operand")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        batch = None
    if batch is None or a2[-1] != b2[-2]:
        raise GraphError(f"node {n.name!r} (MatMul): shapes {a} and {b} do not multiply")
    out = tuple(batch) + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())
    return [out]


def _bn(g, n, s):
    x = s[n.inputs[0]]
    if n.attrs.get("training_mode", 0):
        raise GraphError(f"node {n.name!r} (BatchNormalization): training_mode=1 (batch "
                         "statistics); asymo runs inference with the running statistics")
    if len(x) < 2:
        raise GraphError(f"node {n.name!r} (BatchNormalization): input {x} has no channels")
    for t in n.inputs[1:5]:
        if tuple(s[t]) != (x[1],):
            raise GraphError(f"node {n.name!r} (BatchNormalization): parameter {t!r} has shape "
                             f"{s[t]}, expected ({x[1]},)")
    return [x]


def _dropout(g, n, s):
    # (opset 12+: training_mode is an input; inference is the identity only when it is off)
    if len(n.inputs) > 2 and n.inputs[2] and bool(
            np.asarray(_const(g, n.inputs[2], "training_mode", n)).reshape(-1)[0]):
        raise GraphError(f"node {n.name!r} (Dropout): training_mode is true; asymo runs "
                         "inference (dropout off)")
    return _same(g, n, s)


def _axis(n, rank, default=1, key="axis"):
    a = int(n.attrs.get(key, default))
    if not -rank <= a < rank:
        raise GraphError(f"node {n.name!r} ({n.op}): axis {a} is out of range for rank {rank}")
    return a % rank


def _concat(g, n, s):
    shapes = [s[t] for t in n.inputs if t]
    rank = len(shapes[0])
    ax = _axis(n, rank)
    for sh in shapes[1:]:
        if len(sh) != rank or any(a != b for i, (a, b) in enumerate(zip(sh, shapes[0]))
                                  if i != ax):
            raise GraphError(f"node {n.name!r} (Concat): shapes {shapes} differ outside "
                             f"axis {ax}")
    out = list(shapes[0])
    out[ax] = sum(sh[ax] for sh in shapes)
    return [tuple(out)]


def split_sizes(g, n, s):
    x = s[n.inputs[0]]
    ax = _axis(n, len(x), default=0)
    outs = [o for o in n.outputs]
    if len(n.inputs) > 1 and n.inputs[1]:
        sizes = ints(_const_vector(g, n.inputs[1], "split", n))
    elif "split" in n.attrs:
        sizes = ints(n.attrs["split"])
    else:
        parts = int(n.attrs.get("num_outputs", len(outs)))
        per = -(-x[ax] // parts)
        sizes = tuple(min(per, x[ax] - i * per) for i in range(parts))
    if len(sizes) != len(outs) or sum(sizes) != x[ax] or min(sizes) < 0:
        raise GraphError(f"node {n.name!r} (Split): sizes {sizes} do not split axis {ax} of "
                         f"{tuple(x)} into {len(outs)} outputs")
    return ax, sizes


def _split(g, n, s):
    x = s[n.inputs[0]]
    ax, sizes = split_sizes(g, n, s)
    return [tuple(x[:ax]) + (k,) + tuple(x[ax + 1:]) for k in sizes]


def slice_spec(g, n, s):
    """``[(axis, start, stop, step)]`` normalised for the input shape."""
    x = s[n.inputs[0]]
    if "starts" in n.attrs:  # opset < 10
        starts, ends = n.attrs["starts"], n.attrs["ends"]
        axes = n.attrs.get("axes", range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts = _const_vector(g, n.inputs[1], "starts", n)
        ends = _const_vector(g, n.inputs[2], "ends", n)
        axes = (_const_vector(g, n.inputs[3], "axes", n) if len(n.inputs) > 3 and n.inputs[3]
                else range(len(starts)))
        steps = (_const_vector(g, n.inputs[4], "steps", n) if len(n.inputs) > 4 and n.inputs[4]
                 else [1] * len(starts))
    out = []
    for a, b, e, st in zip(axes, starts, ends, steps):
        a = int(a) % len(x)
        st = int(st)
        if st == 0:
            raise GraphError(f"node {n.name!r} (Slice): step 0")
        b, e = int(max(min(int(b), 2 ** 62), -2 ** 62)), int(max(min(int(e), 2 ** 62), -2 ** 62))
        b, e, st = slice(b, e, st).indices(x[a])
        out.append((a, b, e, st))
    if any(a == 0 for a, *_ in out):
        a, b, e, st = next(o for o in out if o[0] == 0)
        if (b, e, st) != slice(None).indices(x[0]):
            raise GraphError(f"node {n.name!r} (Slice): slicing the batch dimension is not "
                             "supported")
    return out


def _slice(g, n, s):
    shape = list(s[n.inputs[0]])
    for a, b, e, st in slice_spec(g, n, s):
        shape[a] = len(range(b, e, st))
    return [tuple(shape)]


def _transpose(g, n, s):
    x = s[n.inputs[0]]
    perm = ints(n.attrs.get("perm", tuple(reversed(range(len(x))))))
    if sorted(perm) != list(range(len(x))):
        raise GraphError(f"node {n.name!r} (Transpose): perm {perm} does not fit rank {len(x)}")
    if perm[0] != 0:
        raise GraphError(f"node {n.name!r} (Transpose): moving the batch dimension (perm "
                         f"{perm}) is not supported")
    return [tuple(x[p] for p in perm)]


def reshape_target(g, n, s, batch):
    x = s[n.inputs[0]]
    target = list(ints(_const_vector(g, n.inputs[1], "shape", n)))
    if not int(n.attrs.get("allowzero", 0)):
        target = [x[i] if v == 0 and i < len(x) else v for i, v in enumerate(target)]
    if target.count(-1) > 1:
        raise GraphError(f"node {n.name!r} (Reshape): more than one -1 in {target}")
    total = math.prod(x)
    if x and target and (target[0] in (batch, g.batch)
                         or (target[0] == -1 and -1 not in target[1:])):
        # keeps the batch in front: reshape each image
        rest, per = target[1:], math.prod(x[1:])
        known = math.prod(v for v in rest if v != -1)
        if -1 in rest and known and per % known == 0:
            rest = [per // known if v == -1 else v for v in rest]
        if -1 not in rest and math.prod(rest) == per:
            return (x[0],) + tuple(rest)
    # a reshape that mixes the batch into other dimensions: only at the exported shape
    known = math.prod(v for v in target if v != -1)
    if -1 in target and known and total % known == 0:
        target = [total // known if v == -1 else v for v in target]
    if -1 in target or math.prod(target) != total:
        raise GraphError(f"node {n.name!r} (Reshape): cannot reshape {tuple(x)} ({total} "
                         f"elements) to {tuple(target)}"
                         + ("" if batch == g.batch else
                            f"; the target moves the batch dimension, so the model runs only "
                            f"at its export batch size {g.batch}, not {batch}"))
    return tuple(target)


def _reshape(g, n, s):
    return [reshape_target(g, n, s, s["__batch__"])]


def _flatten(g, n, s):
    x = s[n.inputs[0]]
    ax = int(n.attrs.get("axis", 1))
    ax = ax % len(x) if ax < 0 else ax
    if ax < 1:
        raise GraphError(f"node {n.name!r} (Flatten): axis {ax} would merge the batch dimension")
    return [(math.prod(x[:ax]), math.prod(x[ax:]))]


def _squeeze(g, n, s):
    x = s[n.inputs[0]]
    axes = (n.attrs.get("axes") if "axes" in n.attrs else
            (_const_vector(g, n.inputs[1], "axes", n) if len(n.inputs) > 1 and n.inputs[1]
             else None))
    if axes is None:
        # ONNX squeezes every axis of size 1, the batch's too (at batch 1), where asymo keeps
        # the batch dimension: an answer of another shape, so not run
        if x[0] == 1:
            raise GraphError(f"node {n.name!r} (Squeeze): without axes it would also remove "
                             f"the batch dimension of {tuple(x)}; asymo keeps the batch "
                             "dimension: give the axes to squeeze")
        axes = [i for i, d in enumerate(x) if d == 1]
    axes = sorted(int(a) % len(x) for a in axes)
    if 0 in axes or any(x[a] != 1 for a in axes):
        raise GraphError(f"node {n.name!r} (Squeeze): cannot squeeze axes {axes} of {tuple(x)}")
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


def _unsqueeze(g, n, s):
    x = s[n.inputs[0]]
    axes = (n.attrs.get("axes") if "axes" in n.attrs else _const_vector(g, n.inputs[1], "axes", n))
    rank = len(x) + len(axes)
    axes = sorted(int(a) % rank for a in axes)
    if 0 in axes:
        raise GraphError(f"node {n.name!r} (Unsqueeze): inserting a dimension before the batch "
                         "is not supported")
    out, it = [], iter(x)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return [tuple(out)]


def pad_amounts(g, n, s):
    """``[(before, after)]`` per axis, and the constant value."""
    x = s[n.inputs[0]]
    if "pads" in n.attrs:  # opset < 11
        pads = ints(n.attrs["pads"])
        value = float(n.attrs.get("value", 0.0))
    else:
        pads = ints(_const_vector(g, n.inputs[1], "pads", n))
        value = (float(_const(g, n.inputs[2], "constant_value", n).reshape(-1)[0])
                 if len(n.inputs) > 2 and n.inputs[2] else 0.0)
    if len(n.inputs) > 3 and n.inputs[3]:
        axes = [int(a) % len(x) for a in _const_vector(g, n.inputs[3], "axes", n)]
    else:
        axes = list(range(len(x)))
    if len(pads) != 2 * len(axes):
        raise GraphError(f"node {n.name!r} (Pad): {len(pads)} pads for {len(axes)} axes")
    amounts = [(0, 0)] * len(x)
    for i, a in enumerate(axes):
        amounts[a] = (pads[i], pads[i + len(axes)])
    if amounts[0] != (0, 0):
        raise GraphError(f"node {n.name!r} (Pad): padding the batch dimension is not supported")
    if any(b < 0 or e < 0 for b, e in amounts):
        raise GraphError(f"node {n.name!r} (Pad): negative pads {pads} (cropping) are not "
                         "supported")
    mode = n.attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise GraphError(f"node {n.name!r} (Pad): mode {mode!r} is not supported")
    return amounts, value


def _pad(g, n, s):
    x = s[n.inputs[0]]
    amounts, _ = pad_amounts(g, n, s)
    return [tuple(d + b + e for d, (b, e) in zip(x, amounts))]


def softmax_axis(g, n, rank):
    """``(axis, flattened)`` of Softmax node ``n`` over an input of ``rank`` dimensions:
    from opset 13 one axis (default -1); before it, the dimensions from ``axis`` on
    (default 1), flattened into one (``flattened`` True)."""
    old = g.opset < 13
    return _axis(n, rank, default=1 if old else -1), old


def _softmax(g, n, s):
    x = s[n.inputs[0]]
    softmax_axis(g, n, len(x))
    return [x]


def _fused_conv(g, n, s):
    out = _conv(g, n, s)
    if len(n.inputs) > 3 and n.inputs[3] and tuple(s[n.inputs[3]]) != out[0]:
        raise GraphError(f"node {n.name!r}: residual of shape {s[n.inputs[3]]} does not match "
                         f"the output {out[0]}")
    return out


def reduce_axes(g, n, s):
    x = s[n.inputs[0]]
    if "axes" in n.attrs:
        axes = n.attrs["axes"]
    elif len(n.inputs) > 1 and n.inputs[1]:
        axes = _const_vector(g, n.inputs[1], "axes", n)
    else:
        axes = ()
    if len(axes) == 0:  # no axes: every axis, or none with noop_with_empty_axes (opset 18)
        axes = () if n.attrs.get("noop_with_empty_axes", 0) else range(len(x))
    if any(not -len(x) <= int(a) < len(x) for a in axes):
        raise GraphError(f"node {n.name!r} ({n.op}): axes {list(axes)} out of range for an "
                         f"input of rank {len(x)}")
    axes = tuple(sorted(int(a) % len(x) for a in axes))
    if len(set(axes)) != len(axes):
        raise GraphError(f"node {n.name!r} ({n.op}): an axis appears twice in {list(axes)}")
    if 0 in axes:
        raise GraphError(f"node {n.name!r} ({n.op}): reducing over the batch dimension is not "
                         "supported")
    return axes, bool(n.attrs.get("keepdims", 1))


def _reduce(g, n, s):
    x = s[n.inputs[0]]
    axes, keep = reduce_axes(g, n, s)
    return [tuple(1 if i in axes else d for i, d in enumerate(x) if keep or i not in axes)]


RULES = {
    "ReduceMean": _reduce,
    "Conv": _conv, "asymo.Conv": _fused_conv,
    "Gemm": _gemm, "asymo.Gemm": _gemm, "MatMul": _matmul,
    "BatchNormalization": _bn,
    "Relu": _same, "Clip": _same, "Sigmoid": _same, "HardSigmoid": _same, "HardSwish": _same,
    "Tanh": _same, "LeakyRelu": _same, "asymo.SiLU": _same,
    "Add": _broadcast, "Mul": _broadcast, "Sub": _broadcast, "Div": _broadcast,
    "Concat": _concat, "Split": _split, "Slice": _slice, "Transpose": _transpose,
    "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "MaxPool": _pool, "AveragePool": _pool, "GlobalAveragePool": _global_pool,
    "GlobalMaxPool": _global_pool,
    "Pad": _pad, "Softmax": _softmax, "LRN": _same, "Dropout": _dropout, "Identity": _same,
}
SUPPORTED_OPS = frozenset(k for k in RULES if not k.startswith("asymo."))


def infer_shapes(graph, batch):
    """``{tensor: shape}`` for every tensor of ``graph`` with the batch dimension ``batch``.

    Raises :class:`GraphError` naming the node whose shapes do not fit."""
    batch = int(batch)
    s = {"__batch__": batch}
    for t in graph.inputs:
        shape = tuple(int(d) for d in t.shape)
        s[t.name] = (batch,) + shape[1:] if shape else shape
    for k, v in graph.initializers.items():
        s[k] = tuple(np.shape(v))
    for n in graph.nodes:
        rule = RULES.get(n.op)
        if rule is None:
            raise GraphError(f"node {n.name!r}: unsupported operator {n.op!r}")
        for t in n.inputs:
            if t and t not in s:
                raise GraphError(f"node {n.name!r} ({n.op}): input {t!r} has no shape (is the "
                                 "graph in topological order?)")
        outs = rule(graph, n, s)
        for name, shape in zip(n.outputs, outs):
            if name:
                if any(d < 0 for d in shape):
                    raise GraphError(f"node {n.name!r} ({n.op}): negative dimension in {shape}")
                s[name] = tuple(int(d) for d in shape)
    del s["__batch__"]
    return s
