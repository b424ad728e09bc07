"""Run a planned :class:`~asymo.models.graph.Graph` with torch eager operators (needs torch).

The baseline for ``asymo bench MODEL.onnx --compare torch`` when there is no ``nn.Module`` to
run: the same nodes, weights and fused epilogues as :class:`asymo.models.GraphModel`, each
executed by ``torch.nn.functional`` in torch's own thread pool.
"""
from __future__ import annotations

import warnings

import numpy as np

from asymo.models.shapes import (infer_shapes, pad_amounts, reduce_axes, slice_spec, softmax_axis,
                                 split_sizes)

__all__ = ["TorchGraphRunner"]


class TorchGraphRunner:
    """``runner(x)`` runs ``model.graph`` (a GraphModel's planned graph) on torch: one array
    per graph output, a tuple when there are several (as the model gives them)."""

    def __init__(self, model):
        import torch

        self.torch = torch
        self.graph = model.graph
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only weights: torch only reads
            self.consts = {k: torch.from_numpy(np.asarray(v))
                           for k, v in self.graph.initializers.items()}
        self._shapes = {}

    def shapes(self, batch):
        s = self._shapes.get(batch)
        if s is None:
            s = self._shapes[batch] = infer_shapes(self.graph, batch)
        return s

    def __call__(self, x):
        torch = self.torch
        F = torch.nn.functional
        g = self.graph
        with torch.inference_mode():
            if isinstance(x, np.ndarray):
                x = torch.from_numpy(x)
            shapes = self.shapes(x.shape[0])
            allshapes = dict(shapes)
            env = dict(self.consts)
            env[g.inputs[0].name] = x
            for n in g.nodes:
                ins = [env[t] if t else None for t in n.inputs]
                a = n.attrs
                op = n.op
                if op == "asymo.Conv":
                    y = F.conv2d(ins[0], ins[1], ins[2], tuple(a["strides"]),
                                 (a["pads"][0], a["pads"][1]), tuple(a["dilations"]), a["group"])
                    if len(ins) > 3 and ins[3] is not None:
                        y += ins[3]
                    y = _act(F, y, a["activation"])
                elif op == "asymo.Gemm":
                    y = _act(F, F.linear(ins[0], ins[1], ins[2]), a["activation"])
                elif op == "MatMul":
                    y = torch.matmul(ins[0], ins[1])
                elif op == "MaxPool":
                    y = F.max_pool2d(ins[0], tuple(a["kernel_shape"]), tuple(a["strides"]),
                                     (a["pads"][0], a["pads"][1]), ceil_mode=bool(a["ceil_mode"]))
                elif op == "AveragePool":
                    y = F.avg_pool2d(ins[0], tuple(a["kernel_shape"]), tuple(a["strides"]),
                                     (a["pads"][0], a["pads"][1]), ceil_mode=bool(a["ceil_mode"]),
                                     count_include_pad=bool(a.get("count_include_pad", 0)))
                elif op == "GlobalAveragePool":
                    y = ins[0].mean(dim=tuple(range(2, ins[0].dim())), keepdim=True)
                elif op == "GlobalMaxPool":
                    y = ins[0].amax(dim=tuple(range(2, ins[0].dim())), keepdim=True)
                elif op == "Relu":
                    y = F.relu(ins[0])
                elif op == "Clip":
                    y = torch.clamp(ins[0], a["min"], a["max"])
                elif op == "Sigmoid":
                    y = torch.sigmoid(ins[0])
                elif op == "asymo.SiLU":
                    y = F.silu(ins[0])
                elif op == "HardSigmoid":
                    y = torch.clamp(ins[0] * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1)
                elif op == "HardSwish":
                    y = F.hardswish(ins[0])
                elif op == "Tanh":
                    y = torch.tanh(ins[0])
                elif op == "LeakyRelu":
                    y = F.leaky_relu(ins[0], a.get("alpha", 0.01))
                elif op in ("Add", "Mul", "Sub", "Div"):
                    f = {"Add": torch.add, "Mul": torch.mul, "Sub": torch.sub,
                         "Div": torch.div}[op]
                    y = f(ins[0], ins[1])
                elif op == "BatchNormalization":
                    y = F.batch_norm(ins[0], ins[3], ins[4], ins[1], ins[2], False, 0.0,
                                     a.get("epsilon", 1e-5))
                elif op == "Concat":
                    y = torch.cat([t for t in ins if t is not None], dim=int(a.get("axis", 1)))
                elif op == "Split":
                    ax, sizes = split_sizes(g, n, allshapes)
                    outs = torch.split(ins[0], list(sizes), dim=ax)
                    for t, v in zip(n.outputs, outs):
                        if t:
                            env[t] = v
                    continue
                elif op == "Slice":
                    idx = [slice(None)] * ins[0].dim()
                    for ax, b, e, st in slice_spec(g, n, allshapes):
                        idx[ax] = slice(b, e if e >= 0 else None, st)
                    y = ins[0][tuple(idx)]
                elif op == "Transpose":
                    y = ins[0].permute(*a["perm"]).contiguous()
                elif op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
                    y = ins[0].reshape(shapes[n.outputs[0]])
                elif op == "Identity" or op == "Dropout":
                    y = ins[0]
                elif op == "Pad":
                    amounts, value = pad_amounts(g, n, allshapes)
                    flat = [v for be in reversed(amounts[2:]) for v in be]
                    mode = {"constant": "constant", "reflect": "reflect",
                            "edge": "replicate"}[a.get("mode", "constant")]
                    y = F.pad(ins[0], flat, mode=mode,
                              value=value if mode == "constant" else None)
                elif op == "Softmax":
                    x = ins[0]
                    axis, flattened = softmax_axis(g, n, x.dim())
                    if flattened:  # before opset 13: the dimensions from axis on, as one
                        y = torch.softmax(x.flatten(axis), dim=axis).reshape(x.shape)
                    else:
                        y = torch.softmax(x, dim=axis)
                elif op == "LRN":
                    # ONNX's window over channels is [c - (size - 1) // 2, c + size // 2];
                    # torch's local_response_norm puts an even size's extra channel in front
                    x, size = ins[0], int(a["size"])
                    front = (size - 1) // 2
                    sq = F.pad(x.pow(2).unsqueeze(1), (0, 0, 0, 0, front, size - 1 - front))
                    avg = F.avg_pool3d(sq, (size, 1, 1), stride=1).squeeze(1)
                    y = x / (avg * a.get("alpha", 1e-4) + a.get("bias", 1.0)) \
                        ** a.get("beta", 0.75)
                elif op == "ReduceMean":
                    axes, keep = reduce_axes(g, n, allshapes)
                    y = ins[0].mean(dim=axes, keepdim=keep)
                else:  # pragma: no cover - SUPPORTED_OPS are all handled above
                    raise NotImplementedError(op)
                env[n.outputs[0]] = y
            outs = tuple(env[t].numpy() for t in g.outputs)
            return outs[0] if len(outs) == 1 else outs


def _act(F, y, act):
    if act == "relu":
        return F.relu(y)
    if act == "relu6":
        return F.relu6(y)
    return y
