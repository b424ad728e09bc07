"""Load-time rewriting of a graph into the form asymo runs (decided once, kept as data).

:func:`optimize` returns a new :class:`~asymo.models.graph.Graph` (the input is not changed)
and a list of what it did:

- ``Dropout`` and ``Identity`` are removed (inference);
- a ``BatchNormalization`` after a convolution (or a fully-connected ``Gemm``) whose only
  reader it is, is folded into that layer's weights and bias;
- a ``Conv`` becomes ``asymo.Conv`` (attributes resolved: ``stride``, ``pads``, ``dilation``,
  ``group``), and absorbs what follows it when ``asymo.conv2d``'s epilogue can do it: a
  residual ``Add`` of another tensor of the output's shape (input 3, the shortcut), then a
  ``Relu`` or a ``Clip`` to [0, 6] / [0, inf) (``activation``). Asymmetric padding becomes a
  ``Pad`` before the convolution;
- ``Gemm`` and ``MatMul`` by a constant matrix become ``asymo.Gemm`` with the weight stored
  once as ``(out_features, in_features)`` (contiguous rows: a dot product per output),
  ``alpha`` and ``beta`` folded in, and a following ``Relu`` absorbed;
- ``x * Sigmoid(x)`` becomes ``asymo.SiLU``; a ``Clip`` keeps its bounds as attributes.

A fused node takes the place of the last node it absorbs, so the order stays topological.
"""
from __future__ import annotations

import numpy as np

from asymo.models.graph import Graph, GraphError, Node
from asymo.models.shapes import infer_shapes, pool_geometry, spatial_out

__all__ = ["optimize"]


def _ro(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.setflags(write=False)
    return a


def _clip_bounds(g, n):
    if "min" in n.attrs or "max" in n.attrs or len(n.inputs) == 1:
        lo, hi = n.attrs.get("min", -np.inf), n.attrs.get("max", np.inf)
    else:
        def val(i, default):
            if len(n.inputs) > i and n.inputs[i]:
                if n.inputs[i] not in g.initializers:
                    raise GraphError(f"node {n.name!r} (Clip): bound {n.inputs[i]!r} must be "
                                     "a constant")
                return float(np.asarray(g.initializers[n.inputs[i]]).reshape(-1)[0])
            return default
        lo, hi = val(1, -np.inf), val(2, np.inf)
    return float(lo), float(hi)


def _activation_code(g, n):
    """'relu' / 'relu6' when node ``n`` is an activation conv2d can fuse, else None."""
    if n.op == "Relu":
        return "relu"
    if n.op == "Clip":
        lo, hi = _clip_bounds(g, n)
        if lo == 0.0 and hi == 6.0:
            return "relu6"
        if lo == 0.0 and hi == np.inf:
            return "relu"
    return None


class _Rewriter:
    def __init__(self, graph):
        self.g = Graph(graph.name, [Node(n.name, n.op, tuple(n.inputs), tuple(n.outputs),
                                         dict(n.attrs)) for n in graph.nodes],
                       list(graph.inputs), list(graph.outputs), dict(graph.initializers),
                       graph.opset)
        self.log = []
        self.names = {n.name for n in self.g.nodes}

    def fresh(self, base):
        name, k = base, 1
        while name in self.names or name in self.g.initializers:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def only_reader(self, tensor):
        """The single node reading ``tensor`` (None if several, none, or a graph output)."""
        if tensor in self.g.outputs:
            return None
        readers = [n for n in self.g.nodes if tensor in n.inputs]
        return readers[0] if len(readers) == 1 else None

    def rename_uses(self, old, new):
        for n in self.g.nodes:
            if old in n.inputs:
                n.inputs = tuple(new if t == old else t for t in n.inputs)

    # ---- passes ----------------------------------------------------------------------
    def drop_identities(self):
        keep = []
        for n in self.g.nodes:
            if n.op in ("Dropout", "Identity") and n.outputs[0] not in self.g.outputs:
                self.rename_uses(n.outputs[0], n.inputs[0])
                self.log.append(f"removed {n.op} {n.name}")
                continue
            if n.op == "Dropout":
                n.op, n.outputs, n.attrs = "Identity", n.outputs[:1], {}
            keep.append(n)
        self.g.nodes = keep

    def normalise(self):
        for n in self.g.nodes:
            if n.op == "Clip":
                lo, hi = _clip_bounds(self.g, n)
                n.inputs, n.attrs = n.inputs[:1], {"min": lo, "max": hi}
            elif n.op == "Conv":
                w = self.g.initializers.get(n.inputs[1])
                if w is None:
                    raise GraphError(f"node {n.name!r} (Conv): the weight must be a constant")
                if len(n.inputs) > 2 and n.inputs[2] and n.inputs[2] not in self.g.initializers:
                    raise GraphError(f"node {n.name!r} (Conv): the bias must be a constant")
            elif n.op == "BatchNormalization":
                if any(t not in self.g.initializers for t in n.inputs[1:5]) or len(n.inputs) < 5:
                    raise GraphError(f"node {n.name!r} (BatchNormalization): scale, bias, mean "
                                     "and variance must be constants")
                if len([o for o in n.outputs if o]) > 1:
                    raise GraphError(f"node {n.name!r} (BatchNormalization): training-mode "
                                     "outputs (running mean / variance) are not supported")

    def fold_batchnorm(self, shapes):
        removed = set()
        for n in self.g.nodes:
            if n.op != "BatchNormalization":
                continue
            prod = next((p for p in self.g.nodes if n.inputs[0] in p.outputs), None)
            if prod is None or prod.op != "Conv" or self.only_reader(n.inputs[0]) is not n:
                continue
            if any(t not in self.g.initializers for t in n.inputs[1:5]):
                continue
            scale, shift, mean, var = (np.asarray(self.g.initializers[t], np.float64)
                                       for t in n.inputs[1:5])
            eps = float(n.attrs.get("epsilon", 1e-5))
            k = scale / np.sqrt(var + eps)
            w = np.asarray(self.g.initializers[prod.inputs[1]], np.float64)
            b = (np.asarray(self.g.initializers[prod.inputs[2]], np.float64)
                 if len(prod.inputs) > 2 and prod.inputs[2] else np.zeros(w.shape[0]))
            wn, bn = self.fresh(f"{prod.name}.weight_bn"), self.fresh(f"{prod.name}.bias_bn")
            self.g.initializers[wn] = _ro(w * k[:, None, None, None])
            self.g.initializers[bn] = _ro((b - mean) * k + shift)
            prod.inputs = (prod.inputs[0], wn, bn)
            prod.outputs = (n.outputs[0],)
            removed.add(n.name)
            self.log.append(f"folded BatchNormalization {n.name} into Conv {prod.name}")
        self.g.nodes = [n for n in self.g.nodes if n.name not in removed]

    def _reorder(self, drop, moves, before=None):
        """Rebuild ``nodes``: a fused node (``moves``: its name -> the last node it absorbed)
        goes where that node was; ``before`` lists nodes (Pad) to insert before a node."""
        before = before or {}
        by_name = {n.name: n for n in self.g.nodes}
        fused_at = {}
        for name, target in moves.items():
            fused_at.setdefault(target, []).append(by_name[name])
        out = []
        for n in self.g.nodes:
            out.extend(before.get(n.name, ()))
            if n.name in drop:
                out.extend(fused_at.get(n.name, ()))
            elif n.name not in moves:
                out.append(n)
        self.g.nodes = out

    def _absorb_activation(self, n, drop, moves, kind):
        reader = self.only_reader(n.outputs[0])
        if reader is not None and _activation_code(self.g, reader):
            n.attrs["activation"] = _activation_code(self.g, reader)
            n.outputs = reader.outputs
            drop.add(reader.name)
            moves[n.name] = reader.name
            self.log.append(f"fused {reader.op} {reader.name} into {kind} {n.name}")

    def convs(self, shapes):
        drop, moves, before = set(), {}, {}
        for n in self.g.nodes:
            if n.op != "Conv":
                continue
            x_shape = shapes[n.inputs[0]]
            w = self.g.initializers[n.inputs[1]]
            attrs = dict(n.attrs)
            attrs.setdefault("kernel_shape", w.shape[2:])
            probe = Node(n.name, n.op, n.inputs, n.outputs, attrs)
            k, st, pads, dil, _ = pool_geometry(probe, x_shape[2:])
            bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else ""
            x_in = n.inputs[0]
            if pads[0] != pads[2] or pads[1] != pads[3]:
                pname, tname = self.fresh(f"{n.name}.pad"), self.fresh(f"{n.name}.padded")
                cname = self.fresh(f"{n.name}.pads")
                self.g.initializers[cname] = np.array(
                    [0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]], np.int64)
                before[n.name] = [Node(pname, "Pad", (x_in, cname), (tname,),
                                       {"mode": "constant"})]
                x_in, pads = tname, (0, 0, 0, 0)
                self.log.append(f"asymmetric padding of Conv {n.name} as a Pad node")
            n.op = "asymo.Conv"
            n.inputs = (x_in, n.inputs[1], bias)
            n.attrs = {"strides": st, "pads": pads, "dilations": dil,
                       "group": int(n.attrs.get("group", 1)), "kernel_shape": tuple(k),
                       "activation": None}
            y = n.outputs[0]
            # residual add: Add(conv, other) with the other of the output's shape
            reader = self.only_reader(y)
            if reader is not None and reader.op == "Add" and len(reader.inputs) == 2:
                other = reader.inputs[1] if reader.inputs[0] == y else reader.inputs[0]
                if (other != y and other not in self.g.initializers
                        and shapes.get(other) == shapes.get(y)):
                    n.inputs = n.inputs + (other,)
                    n.outputs = reader.outputs
                    drop.add(reader.name)
                    moves[n.name] = reader.name
                    self.log.append(f"fused residual Add {reader.name} into Conv {n.name}")
            self._absorb_activation(n, drop, moves, "Conv")
        self._reorder(drop, moves, before)

    def gemms(self, shapes):
        drop, moves = set(), {}
        for n in self.g.nodes:
            if n.op == "MatMul":
                b = self.g.initializers.get(n.inputs[1])
                if b is None or b.ndim != 2 or len(shapes[n.inputs[0]]) != 2:
                    continue
                w = np.asarray(b, np.float32).T
                bias = ""
            elif n.op == "Gemm":
                if n.inputs[1] not in self.g.initializers or n.attrs.get("transA", 0):
                    continue
                b = np.asarray(self.g.initializers[n.inputs[1]], np.float32)
                w = b if n.attrs.get("transB", 0) else b.T
                w = w * np.float32(n.attrs.get("alpha", 1.0))
                bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else ""
                if bias:
                    # (a bias per output feature: a scalar, (N,) or (1, N); a column (M, 1)
                    # broadcasts over the features and stays a Gemm of its own)
                    c = self.g.initializers.get(bias)
                    if c is None or not (c.size == 1 or c.shape in ((w.shape[0],),
                                                                   (1, w.shape[0]))):
                        continue
                    cb = np.broadcast_to(np.asarray(c, np.float32).reshape(-1)
                                         * np.float32(n.attrs.get("beta", 1.0)), (w.shape[0],))
                    bias = self.fresh(f"{n.name}.bias")
                    self.g.initializers[bias] = _ro(cb)
            else:
                continue
            wname = self.fresh(f"{n.name}.weight_rows")
            self.g.initializers[wname] = _ro(w)
            n.op, n.inputs = "asymo.Gemm", (n.inputs[0], wname, bias)
            n.attrs = {"transB": 1, "activation": None}
            self._absorb_activation(n, drop, moves, "Gemm")
        self._reorder(drop, moves)

    def silu(self):
        drop = set()
        prod = {t: n for n in self.g.nodes for t in n.outputs}
        for n in self.g.nodes:
            if n.op != "Mul" or len(n.inputs) != 2:
                continue
            for a, b in (n.inputs, n.inputs[::-1]):
                s = prod.get(b)
                if (s is not None and s.op == "Sigmoid" and s.inputs[0] == a
                        and self.only_reader(b) is n):
                    drop.add(s.name)
                    n.op, n.inputs, n.attrs = "asymo.SiLU", (a,), {}
                    self.log.append(f"x * Sigmoid(x) at {n.name} as SiLU")
                    break
        self.g.nodes = [n for n in self.g.nodes if n.name not in drop]

    def check_pools(self, shapes):
        extra, after = {}, {}
        for n in self.g.nodes:
            if n.op not in ("MaxPool", "AveragePool"):
                continue
            k, st, pads, dil, ceil = pool_geometry(n, shapes[n.inputs[0]][2:])
            if dil != (1, 1):
                raise GraphError(f"node {n.name!r} ({n.op}): dilated pooling is not supported")
            if n.attrs.get("storage_order", 0):
                raise GraphError(f"node {n.name!r} ({n.op}): storage_order=1 is not supported")
            if len([o for o in n.outputs if o]) > 1:
                raise GraphError(f"node {n.name!r} (MaxPool): the Indices output is not "
                                 "supported")
            symmetric = pads[0] == pads[2] and pads[1] == pads[3]
            fits = pads[0] <= k[0] // 2 and pads[1] <= k[1] // 2
            if symmetric and fits:
                n.attrs = {"kernel_shape": k, "strides": st, "pads": pads,
                           "ceil_mode": int(ceil),
                           "count_include_pad": int(n.attrs.get("count_include_pad", 0))}
                continue
            exclude_pad = n.op == "AveragePool" and not n.attrs.get("count_include_pad", 0)
            in_hw = shapes[n.inputs[0]][2:]
            value = -np.inf if n.op == "MaxPool" else 0.0
            if ceil:
                # a ceil-mode window that would start in the end padding is dropped (ONNX,
                # torch): pad the end only as far as the windows kept reach, so the padded
                # plane, read without padding, gives the same windows
                ends = []
                for axis in (0, 1):
                    size = in_hw[axis]
                    out = spatial_out(size, k[axis], st[axis], pads[axis], pads[2 + axis], 1,
                                      True)
                    reach = (out - 1) * st[axis] + k[axis] - size - pads[axis]
                    ends.append(min(pads[2 + axis], max(0, reach)))
                pads = (pads[0], pads[1], ends[0], ends[1])
            pname, tname = self.fresh(f"{n.name}.pad"), self.fresh(f"{n.name}.padded")
            cname, vname = self.fresh(f"{n.name}.pads"), self.fresh(f"{n.name}.pad_value")
            self.g.initializers[cname] = np.array(
                [0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]], np.int64)
            self.g.initializers[vname] = np.array(value, np.float32)
            scale = _exclude_pad_scale(in_hw, k, st, pads, ceil) if exclude_pad else None
            if exclude_pad and scale is None:
                raise GraphError(f"node {n.name!r} (AveragePool): padding {pads} puts a whole "
                                 "window in the padding without count_include_pad (no input "
                                 "to average)")
            extra[n.name] = Node(pname, "Pad", (n.inputs[0], cname, vname), (tname,),
                                 {"mode": "constant"})
            n.inputs = (tname,) + tuple(n.inputs[1:])
            n.attrs = {"kernel_shape": k, "strides": st, "pads": (0, 0, 0, 0),
                       "ceil_mode": int(ceil), "count_include_pad": 1}
            self.log.append(f"padding of {n.op} {n.name} as a Pad node")
            if scale is not None:
                # the padded plane's average counts the padding; each window's sum over its
                # input values alone is that times (its positions in the padded plane) / (its
                # input positions): one constant map, multiplied in after the pool
                sname = self.fresh(f"{n.name}.exclude_pad_scale")
                pooled = self.fresh(f"{n.name}.with_pad")
                self.g.initializers[sname] = _ro(scale)
                after[n.name] = Node(self.fresh(f"{n.name}.exclude_pad"), "Mul",
                                     (pooled, sname), (n.outputs[0],))
                n.outputs = (pooled,) + tuple(n.outputs[1:])
                self.log.append(f"AveragePool {n.name} without count_include_pad: its "
                                "padded average rescaled per window")
        if extra:
            out = []
            for n in self.g.nodes:
                if n.name in extra:
                    out.append(extra[n.name])
                out.append(n)
                if n.name in after:
                    out.append(after[n.name])
            self.g.nodes = out


def _exclude_pad_scale(in_hw, kernel, strides, pads, ceil):
    """``(1, 1, OH, OW)`` float32: per output, (the window's positions inside the padded
    plane) / (its positions inside the input), for an average pool over the explicitly padded
    plane (``pads``, the end ones as the Pad node has them; ceil mode's last windows may reach
    past it, and count only what they cover); None where a window holds no input."""
    per_axis = []
    for axis in (0, 1):
        size, k, s = in_hw[axis], kernel[axis], strides[axis]
        p0, p1 = pads[axis], pads[2 + axis]
        padded = size + p0 + p1
        out = spatial_out(padded, k, s, 0, 0, 1, ceil)
        starts = np.arange(out) * s
        inside = np.minimum(starts + k, padded) - starts
        real = np.minimum(starts + k, p0 + size) - np.maximum(starts, p0)
        if (real <= 0).any():
            return None
        per_axis.append(inside / real)
    return (per_axis[0][:, None] * per_axis[1][None, :]).astype(np.float32)[None, None]


def optimize(graph):
    """The graph rewritten for asymo's kernels (see the module docstring).

    Returns ``(graph, log)``: a new :class:`Graph` and a list of strings, one per rewrite."""
    r = _Rewriter(graph)
    r.drop_identities()
    r.normalise()
    shapes = infer_shapes(r.g, r.g.batch)
    r.fold_batchnorm(shapes)
    r.silu()
    shapes = infer_shapes(r.g, r.g.batch)
    r.check_pools(shapes)
    shapes = infer_shapes(r.g, r.g.batch)
    r.convs(shapes)
    shapes = infer_shapes(r.g, r.g.batch)
    r.gemms(shapes)
    used = {t for n in r.g.nodes for t in n.inputs}
    r.g.initializers = {k: v for k, v in r.g.initializers.items() if k in used}
    r.g.check()
    infer_shapes(r.g, r.g.batch)
    return r.g, r.log
