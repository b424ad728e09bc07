"""A :class:`~asymo.models.graph.Graph` (or a part of one) back to an ``onnx.ModelProto``.

For running a range of a planned model on another executor (an ONNX Runtime session pinned
to a cluster, as a pipeline stage): ``to_onnx(model.graph.subgraph(a, b))``. The fused forms
of the planner are written as standard operators again (``asymo.Conv`` -> ``Conv`` [+ ``Add``]
[+ ``Relu`` / ``Clip``], ``asymo.Gemm`` -> ``Gemm`` [+ activation], ``asymo.SiLU`` ->
``Sigmoid`` + ``Mul``); every tensor keeps its name.
"""
from __future__ import annotations

import numpy as np

__all__ = ["to_onnx"]


def _act_nodes(helper, x, y, act, name, inits):
    if act is None:
        return [helper.make_node("Identity", [x], [y], name=f"{name}/identity")]
    if act == "relu":
        return [helper.make_node("Relu", [x], [y], name=f"{name}/relu")]
    lo, hi = f"{name}/clip_min", f"{name}/clip_max"
    inits[lo], inits[hi] = np.array(0, np.float32), np.array(6, np.float32)
    return [helper.make_node("Clip", [x, lo, hi], [y], name=f"{name}/relu6")]


def _attr_ok(v):
    return v is not None and not (isinstance(v, tuple) and not v)


def to_onnx(graph, *, opset=None, batch=None):
    """``graph`` as an ONNX model (inputs declared with a symbolic batch ``"N"``)."""
    from onnx import TensorProto, helper, numpy_helper

    opset = int(opset or max(graph.opset, 13))
    inits = dict(graph.initializers)
    nodes = []
    for n in graph.nodes:
        if n.op == "asymo.Conv":
            a = n.attrs
            pads = list(a["pads"])
            conv_out = n.outputs[0] if (a["activation"] is None and len(n.inputs) < 4) \
                else f"{n.name}/conv"
            ins = [t for t in n.inputs[:3]]
            if not ins[2]:
                ins = ins[:2]
            nodes.append(helper.make_node("Conv", ins, [conv_out], name=n.name,
                                          kernel_shape=list(a["kernel_shape"]),
                                          strides=list(a["strides"]), pads=pads,
                                          dilations=list(a["dilations"]), group=a["group"]))
            x = conv_out
            if len(n.inputs) > 3 and n.inputs[3]:
                add_out = n.outputs[0] if a["activation"] is None else f"{n.name}/add"
                nodes.append(helper.make_node("Add", [x, n.inputs[3]], [add_out],
                                              name=f"{n.name}/add"))
                x = add_out
            if a["activation"] is not None:
                nodes += _act_nodes(helper, x, n.outputs[0], a["activation"], n.name, inits)
        elif n.op == "asymo.Gemm":
            act = n.attrs.get("activation")
            out = n.outputs[0] if act is None else f"{n.name}/gemm"
            ins = [t for t in n.inputs if t]
            nodes.append(helper.make_node("Gemm", ins, [out], name=n.name, transB=1))
            if act is not None:
                nodes += _act_nodes(helper, out, n.outputs[0], act, n.name, inits)
        elif n.op == "asymo.SiLU":
            s = f"{n.name}/sigmoid"
            nodes.append(helper.make_node("Sigmoid", [n.inputs[0]], [s], name=s))
            nodes.append(helper.make_node("Mul", [n.inputs[0], s], list(n.outputs),
                                          name=n.name))
        else:
            attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in n.attrs.items()
                     if _attr_ok(v)}
            if n.op == "Clip" and ("min" in attrs or "max" in attrs) and opset >= 11:
                lo, hi = f"{n.name}/clip_min", f"{n.name}/clip_max"
                inits[lo] = np.array(attrs.pop("min", -np.inf), np.float32)
                inits[hi] = np.array(attrs.pop("max", np.inf), np.float32)
                nodes.append(helper.make_node("Clip", [n.inputs[0], lo, hi], list(n.outputs),
                                              name=n.name))
                continue
            if n.op == "MaxPool":
                attrs.pop("count_include_pad", None)
            nodes.append(helper.make_node(n.op, list(n.inputs), list(n.outputs), name=n.name,
                                          **attrs))
    ins = [helper.make_tensor_value_info(t.name, TensorProto.FLOAT,
                                         [batch or "N"] + list(t.shape[1:]))
           for t in graph.inputs]
    outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in graph.outputs]
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    g = helper.make_graph(nodes, graph.name, ins, outs, tensors)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
