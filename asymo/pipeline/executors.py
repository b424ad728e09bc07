"""Stage executors: run a contiguous range of a ``CutGraph``'s segments on a set of cpus.

One small interface (``StageExecutor``): built for ``(graph, first, last, cpus)``, called as
``executor.run(x, out=None)`` from the stage's thread, closed with ``close()``. The first
``run`` from a thread pins that thread to the stage's cpus (for ONNX Runtime, to the first of
them): call it from a thread of its own (the pipeline's stage thread,
``asymo.pipeline.runtime.run_in_thread``), not from a thread that must keep running anywhere.
Every thread an executor creates runs on its stage's cpus only, so stages on different
clusters never steal each other's cores:

- ``"ort"``: an ONNX Runtime session of the extracted sub-model. ``intra_op_num_threads`` is
  the number of stage cpus; ONNX Runtime counts the calling thread as one of them and creates
  ``n - 1`` workers, pinned one per cpu with ``session.intra_op_thread_affinities`` (the
  caller is pinned to the first cpu here); ``session.intra_op.allow_spinning = 0`` so idle
  workers sleep instead of spinning on cores another stage may need (a stage on every core
  of the topology, a single-stage plan, spins as ONNX Runtime does by default). Inputs and outputs are
  bound to caller-owned buffers (``IOBinding``): no allocation per frame.
- ``"torch"``: the stage's nodes of asymo's graph (ONNX operators, as ``asymo.from_onnx``
  loads them) run one by one with ``torch.nn.functional``: eager torch on the network's own
  weights. (An ONNX graph cannot give back a torch module, and no ONNX-to-torch converter is
  assumed installed; a model from ``asymo.from_torch`` is exported to the same graph.) It
  covers the operator set of the torchvision classification CNNs (``SUPPORTED_OPS``); it
  cannot run a graph with any other operator (a clear error names it). torch's intra-op
  threads: ``torch.set_num_threads(len(cpus))`` is called from the stage thread; torch's
  OpenMP team is per calling thread and its workers inherit the stage thread's affinity. The
  thread count itself is process-wide in torch, so two torch stages with different core counts
  would overwrite each other's setting; the planner does not prevent that (on a two-core
  machine torch stages of a pipeline have one core each), so on larger machines offer torch
  only where stages have equal core counts.
- ``"asymo"``: the stage's sub-graph as an ``asymo.models.GraphModel`` (asymo's kernels,
  load-time fusions, one activation arena) on an ``asymo.Pool`` restricted to the stage cpus.

Executors are optional dependencies: ``available_executors()`` lists those importable here.
"""
from __future__ import annotations

import importlib
import os
import threading
import weakref
import warnings

import numpy as np

__all__ = ["StageExecutor", "OrtExecutor", "TorchExecutor", "AsymoExecutor", "EXECUTORS",
           "available_executors", "make_executor", "SUPPORTED_OPS", "parse_executors"]

EXECUTORS = ("asymo", "ort", "torch")


def _importable(name):
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def available_executors():
    """The executors usable in this process (``asymo`` always; ``ort``/``torch`` if installed)."""
    out = ["asymo"]
    if _importable("onnxruntime"):
        out.append("ort")
    if _importable("torch"):
        out.append("torch")
    return out


def parse_executors(text):
    """``"asymo,ort"`` -> ``("asymo", "ort")``; unknown or unavailable names raise ValueError."""
    names = tuple(t.strip() for t in (text.split(",") if isinstance(text, str) else text)
                  if t.strip())
    if not names:
        raise ValueError("no executor named")
    bad = [n for n in names if n not in EXECUTORS]
    if bad:
        raise ValueError(f"unknown executor(s) {bad}; choose from {list(EXECUTORS)}")
    have = available_executors()
    missing = [n for n in names if n not in have]
    if missing:
        pkgs = " and ".join({"ort": "onnxruntime", "torch": "torch"}[m] for m in missing)
        raise ValueError(f"executor(s) {missing} not available here (install {pkgs})")
    return tuple(dict.fromkeys(names))


def _pin(cpus):
    try:
        os.sched_setaffinity(0, set(cpus))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        pass


class StageExecutor:
    """Base: segments ``[first, last]`` of ``graph`` on ``cpus``.

    Subclasses implement ``_run(x, out)``. ``run`` checks the input and writes the result into
    ``out`` (shape ``self.output_shape``, float32) when given, else into a new array.
    """

    name = "?"

    def __init__(self, graph, first, last, cpus):
        self.graph = graph
        self.first, self.last = int(first), int(last)
        self.input_name, self.output_name, self.output_shape = graph.boundary(first, last)
        seg = graph.segments[first]
        self.input_shape = (1,) + tuple(graph.input_shape) if first == 0 else None
        if first > 0:
            self.input_shape = (1,) + tuple(graph.segments[first - 1].output_shape[1:])
        del seg
        self.cpus = tuple(sorted(int(c) for c in cpus))
        if not self.cpus:
            raise ValueError("an executor needs at least one cpu")
        self._closed = False
        # threads already pinned for this executor (thread objects, not idents: an ident is
        # reused by a later thread, which would then run unpinned)
        self._bound = weakref.WeakSet()

    def _bind(self):
        """Pin the calling thread once (the cpu ONNX Runtime's caller thread owns)."""

    def run(self, x, out=None):
        if self._closed:
            raise RuntimeError(f"{self.name} executor is closed")
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or \
                tuple(x.shape) != self.input_shape:
            raise ValueError(f"{self.name} stage [{self.first}, {self.last}] takes a float32 "
                             f"array of shape {self.input_shape}, got "
                             f"{getattr(x, 'dtype', type(x).__name__)} "
                             f"{getattr(x, 'shape', '')}")
        x = np.ascontiguousarray(x)
        if out is None:
            out = np.empty(self.output_shape, np.float32)
        elif out.shape != self.output_shape or out.dtype != np.float32 or \
                not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape "
                             f"{self.output_shape}")
        me = threading.current_thread()
        if me not in self._bound:
            self._bind()
            self._bound.add(me)
        self._run(x, out)
        return out

    def _run(self, x, out):  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self):
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<{type(self).__name__} segments [{self.first}, {self.last}] on cpus "
                f"{list(self.cpus)}>")


# --- ONNX Runtime -----------------------------------------------------------------------------

def ort_session_options(cpus, *, spin=False):
    """SessionOptions running on ``cpus`` only: ``len(cpus)`` intra-op threads (the caller is
    one), the ``len(cpus) - 1`` workers pinned one per cpu (ONNX Runtime numbers processors
    from 1), sequential execution (no inter-op pool). Idle workers sleep unless ``spin``
    (ONNX Runtime's default, for a stage that has every core to itself: waking a sleeping
    worker costs more than the spin, and no other stage needs the cores)."""
    import onnxruntime as ort

    cpus = tuple(sorted(int(c) for c in cpus))
    so = ort.SessionOptions()
    so.intra_op_num_threads = len(cpus)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if len(cpus) > 1:
        so.add_session_config_entry("session.intra_op_thread_affinities",
                                    ";".join(str(c + 1) for c in cpus[1:]))
    so.log_severity_level = 3
    return so


class OrtExecutor(StageExecutor):
    """ONNX Runtime session of the sub-model (see the module docstring)."""

    name = "ort"

    def __init__(self, graph, first, last, cpus, *, exclusive=False):
        super().__init__(graph, first, last, cpus)
        import onnxruntime as ort

        sub = graph.submodel(self.first, self.last)
        self.session = ort.InferenceSession(sub.SerializeToString(),
                                            ort_session_options(self.cpus, spin=exclusive),
                                            providers=["CPUExecutionProvider"])
        self._io = self.session.io_binding()
        # ONNX Runtime checks an output buffer against its own shape inference, which can
        # disagree with its kernels (see CutGraph.submodel): then it allocates the output
        # and the stage copies it
        declared = self.session.get_outputs()[0].shape
        self._own_output = [d if isinstance(d, int) else None for d in declared] != \
            list(self.output_shape)

    def _bind(self):
        # the caller thread is ONNX Runtime's first intra-op thread: it owns cpus[0]
        _pin(self.cpus[:1])

    def _run(self, x, out):
        io = self._io
        io.bind_cpu_input(self.input_name, x)
        if self._own_output:
            io.bind_output(self.output_name, "cpu")
            self.session.run_with_iobinding(io)
            y = io.copy_outputs_to_cpu()[0]
            if y.shape != out.shape:
                raise RuntimeError(f"ort stage [{self.first}, {self.last}] gave an output of "
                                   f"shape {y.shape}, asymo's shape inference {out.shape}")
            np.copyto(out, y)
            return
        io.bind_output(self.output_name, "cpu", 0, np.float32, list(out.shape),
                       out.ctypes.data)
        self.session.run_with_iobinding(io)

    def close(self):
        if not self._closed:
            super().close()
            # the session's worker threads end when it is freed
            self._io = None
            self.session = None


# --- node interpreter shared by the torch and asymo executors ---------------------------------

# operators the torch executor runs (the torchvision classification CNNs' core set)
SUPPORTED_OPS = ("Conv", "Relu", "Clip", "Sigmoid", "Add", "Mul", "Concat", "Flatten",
                 "Reshape", "MaxPool", "AveragePool", "GlobalAveragePool", "Gemm", "MatMul",
                 "BatchNormalization", "Dropout", "Identity", "Softmax")


def _pads2d(node, attrs):
    """ONNX ``pads`` [top, left, bottom, right] -> (symmetric (ph, pw)) or the 4-tuple."""
    ap = attrs.get("auto_pad", b"NOTSET")
    ap = ap.decode() if isinstance(ap, bytes) else ap
    if ap not in ("NOTSET", "VALID"):
        raise ValueError(f"node {node.name!r} ({node.op}): auto_pad={ap} is not "
                         "supported by this executor")
    p = list(attrs.get("pads", [0, 0, 0, 0])) if ap == "NOTSET" else [0, 0, 0, 0]
    if len(p) != 4:
        raise ValueError(f"node {node.name!r} ({node.op}): only 2-D is supported")
    return tuple(int(v) for v in p)


class _Interpreter:
    """Runs a range of asymo graph nodes (ONNX operators and attributes, constants already
    folded into initializers by the loader) with a backend's operations."""

    def __init__(self, graph, first, last, backend):
        self.backend = backend
        sub = graph.subgraph(first, last)   # ValueError if asymo's loader refused the model
        nodes = list(sub.nodes)
        bad = sorted({n.op for n in nodes if n.op not in SUPPORTED_OPS})
        if bad:
            first_bad = next(n for n in nodes if n.op in bad)
            raise ValueError(f"the {backend.name} executor cannot run operator(s) {bad} "
                             f"(first: node {first_bad.name!r}, opset {sub.opset})")
        self.consts = dict(sub.initializers)
        self.steps = self._fuse([(n, dict(n.attrs)) for n in nodes])
        self.input_name, self.output_name, _ = graph.boundary(first, last)
        self.params = {k: backend.param(v) for k, v in self.consts.items()}

    def _fuse(self, steps):
        """Conv followed by its only consumer Relu / Clip(0, 6): one fused step."""
        uses = {}
        for n, _ in steps:
            for t in n.inputs:
                uses[t] = uses.get(t, 0) + 1
        out, i = [], 0
        while i < len(steps):
            n, a = steps[i]
            act = None
            if n.op == "Conv" and i + 1 < len(steps) and uses.get(n.outputs[0]) == 1:
                m, ma = steps[i + 1]
                if m.inputs and m.inputs[0] == n.outputs[0]:
                    act = _activation(m, ma, self)
                    if act is not None:
                        out.append((n, a, (act, m.outputs[0])))
                        i += 2
                        continue
            out.append((n, a, None))
            i += 1
        return out

    def run(self, x):
        env = dict(self.params)
        env[self.input_name] = self.backend.wrap(x)
        for n, a, fused in self.steps:
            ins = [env[t] if t else None for t in n.inputs]
            y = self.backend.op(n, a, ins, fused)
            if fused is not None:
                env[fused[1]] = y
            else:
                for name, v in zip(n.outputs, y if isinstance(y, tuple) else (y,)):
                    env[name] = v
        return env[self.output_name]


def _scalar(v):
    """A Python float from a scalar or a one-element array / tensor (Clip's bounds)."""
    a = np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float64).reshape(-1)
    if a.size != 1:
        raise ValueError(f"expected a scalar bound, got {a.size} values")
    return float(a[0])


def _activation(node, attrs, interp):
    if node.op == "Relu":
        return "relu"
    if node.op == "Clip":
        lo = hi = None
        if len(node.inputs) > 1 and node.inputs[1]:
            lo = interp.consts.get(node.inputs[1])
        if len(node.inputs) > 2 and node.inputs[2]:
            hi = interp.consts.get(node.inputs[2])
        lo = attrs.get("min", lo)
        hi = attrs.get("max", hi)
        if lo is not None and hi is not None and _scalar(lo) == 0.0 and _scalar(hi) == 6.0:
            return "relu6"
    return None


class _TorchBackend:
    name = "torch"

    def __init__(self):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F

    def param(self, a):
        return self.torch.from_numpy(np.array(a, copy=True))

    def wrap(self, x):
        return self.torch.from_numpy(x)

    def _act(self, y, act):
        if act == "relu":
            return self.F.relu(y, inplace=True)
        if act == "relu6":
            return self.F.hardtanh(y, 0.0, 6.0, inplace=True)
        return y

    def op(self, n, a, ins, fused):
        F, torch = self.F, self.torch
        t = n.op
        x = ins[0]
        if t == "Conv":
            p = _pads2d(n, a)
            if p[0] != p[2] or p[1] != p[3]:
                x = F.pad(x, (p[1], p[3], p[0], p[2]))
                p = (0, 0, 0, 0)
            y = F.conv2d(x, ins[1], ins[2] if len(ins) > 2 else None,
                         stride=tuple(a.get("strides", (1, 1))), padding=(p[0], p[1]),
                         dilation=tuple(a.get("dilations", (1, 1))), groups=a.get("group", 1))
            return self._act(y, fused[0] if fused else None)
        if t == "Relu":
            return F.relu(x)
        if t == "Clip":
            lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
            hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
            return torch.clamp(x, None if lo is None else _scalar(lo),
                               None if hi is None else _scalar(hi))
        if t == "Sigmoid":
            return torch.sigmoid(x)
        if t == "Add":
            return ins[0] + ins[1]
        if t == "Mul":
            return ins[0] * ins[1]
        if t == "Concat":
            return torch.cat(ins, dim=a["axis"])
        if t == "Flatten":
            ax = a.get("axis", 1)
            return x.reshape(int(np.prod(x.shape[:ax])), -1)
        if t == "Reshape":
            return x.reshape(_reshape_target(x.shape, ins[1], a))
        if t in ("MaxPool", "AveragePool"):
            k = tuple(a["kernel_shape"])
            s = tuple(a.get("strides", (1, 1)))
            p = _pads2d(n, a)
            ceil = bool(a.get("ceil_mode", 0))
            if p[0] != p[2] or p[1] != p[3]:
                x = F.pad(x, (p[1], p[3], p[0], p[2]),
                          value=float("-inf") if t == "MaxPool" else 0.0)
                p = (0, 0, 0, 0)
            if t == "MaxPool":
                return F.max_pool2d(x, k, s, (p[0], p[1]), tuple(a.get("dilations", (1, 1))),
                                    ceil_mode=ceil)
            return F.avg_pool2d(x, k, s, (p[0], p[1]), ceil_mode=ceil,
                                count_include_pad=bool(a.get("count_include_pad", 0)))
        if t == "GlobalAveragePool":
            return x.mean(dim=(2, 3), keepdim=True)
        if t == "Gemm":
            A = x.t() if a.get("transA", 0) else x
            B = ins[1].t() if a.get("transB", 0) else ins[1]
            y = A @ B
            if a.get("alpha", 1.0) != 1.0:
                y = y * a["alpha"]
            if len(ins) > 2 and ins[2] is not None:
                y = y + a.get("beta", 1.0) * ins[2]
            return y
        if t == "MatMul":
            return ins[0] @ ins[1]
        if t == "BatchNormalization":
            return F.batch_norm(x, ins[3], ins[4], ins[1], ins[2], False, 0.0,
                                a.get("epsilon", 1e-5))
        if t in ("Dropout", "Identity"):
            return x
        if t == "Softmax":
            return torch.softmax(x, dim=a.get("axis", -1))
        raise ValueError(f"unsupported operator {t}")  # pragma: no cover - checked at build


def _reshape_target(shape, target, attrs):
    target = [int(v) for v in np.asarray(target).reshape(-1)]
    if not attrs.get("allowzero", 0):
        target = [shape[i] if v == 0 else v for i, v in enumerate(target)]
    return tuple(target)


class TorchExecutor(StageExecutor):
    """The sub-graph's nodes on ``torch.nn.functional`` (see the module docstring)."""

    name = "torch"

    def __init__(self, graph, first, last, cpus):
        super().__init__(graph, first, last, cpus)
        self._interp = _Interpreter(graph, self.first, self.last, _TorchBackend())
        self._torch = self._interp.backend.torch

    def _bind(self):
        # the stage thread is pinned to the stage's cpus by the runtime; torch's OpenMP
        # workers are created by this thread and inherit its affinity
        _pin(self.cpus)
        self._torch.set_num_threads(len(self.cpus))

    def _run(self, x, out):
        with self._torch.inference_mode():
            y = self._interp.run(x)
            out[...] = y.reshape(out.shape).numpy()


class AsymoExecutor(StageExecutor):
    """The stage's sub-graph as an asymo ``GraphModel`` (BatchNorm folded, activations and
    residual adds fused, one activation arena) on an ``asymo.Pool`` of the stage cpus."""

    name = "asymo"

    def __init__(self, graph, first, last, cpus, *, topology=None, spin_us=0):
        super().__init__(graph, first, last, cpus)
        from asymo.models.graph_model import GraphModel
        from asymo.pipeline.runtime import sub_topology
        from asymo.runtime.pool import Pool

        self.model = GraphModel(graph.subgraph(self.first, self.last),
                                name=f"{graph.name}[{self.first}:{self.last}]")
        if topology is None:
            from asymo.hw.topology import detect
            topology = detect()
        self.pool = Pool(topology=sub_topology(topology, self.cpus), spin_us=spin_us)

    def _bind(self):
        _pin(self.cpus)

    def _run(self, x, out):
        out[...] = self.model(x, pool=self.pool).reshape(out.shape)

    def close(self):
        if not self._closed:
            super().close()
            self.pool.close()


_CLASSES = {"ort": OrtExecutor, "torch": TorchExecutor, "asymo": AsymoExecutor}


def make_executor(kind, graph, first, last, cpus, *, topology=None):
    """An executor of ``kind`` (``"asymo"``, ``"ort"`` or ``"torch"``) for segments
    ``[first, last]`` of ``graph`` on ``cpus``."""
    if kind not in _CLASSES:
        raise ValueError(f"unknown executor {kind!r}; choose from {list(EXECUTORS)}")
    if kind == "asymo":
        return AsymoExecutor(graph, first, last, cpus, topology=topology)
    if kind == "ort":
        # a stage on every core of the topology runs alone (stages never share cores)
        everything = topology is not None and set(int(c) for c in cpus) >= set(topology.cpus)
        return OrtExecutor(graph, first, last, cpus, exclusive=everything)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: read-only NumPy weights
        return _CLASSES[kind](graph, first, last, cpus)
