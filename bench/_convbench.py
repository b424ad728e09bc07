"""Shared parts of bench/conv_layers.py and bench/models.py: the NumPy im2col + matmul
baseline, side-by-side timing, the machine description, and the emulator context."""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from asymo.models.model import AsymoOps  # noqa: E402


class NumpyOps(AsymoOps):
    """A forward-pass backend on NumPy alone: im2col (sliding_window_view + copy) and
    numpy.matmul for convolutions and FC layers, NumPy max / mean for pooling."""

    def __init__(self):
        pass

    def conv(self, x, step, weight, bias, out=None, residual=None, activation="step"):
        act = step.activation if activation == "step" else activation
        n, c, h, w = x.shape
        cout, cin_g, kh, kw = weight.shape
        g = step.groups
        (sh, sw), (ph, pw), (dh, dw) = step.stride, step.padding, step.dilation
        _, oh, ow = step.out_shape
        if (kh, kw) == (1, 1) and (sh, sw) == (1, 1) and (ph, pw) == (0, 0):
            col = x.reshape(n, g, cin_g, h * w)
        else:
            xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
            win = np.lib.stride_tricks.sliding_window_view(
                xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
            win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow]
            col = np.ascontiguousarray(win.transpose(0, 1, 4, 5, 2, 3)).reshape(
                n, g, cin_g * kh * kw, oh * ow)
        y = np.matmul(weight.reshape(g, cout // g, -1), col).reshape(n, cout, oh, ow)
        if bias is not None:
            y += bias[:, None, None]
        if residual is not None:
            y += residual
        y = self._act(y, act)
        if out is not None:
            out[...] = y
            return out
        return y

    @staticmethod
    def _act(y, act):
        if act == "relu":
            np.maximum(y, 0, out=y)
        elif act == "relu6":
            np.clip(y, 0, 6, out=y)
        return y

    def linear(self, x, step, weight, bias):
        y = x @ weight.T
        if bias is not None:
            y += bias
        return self._act(y, step.activation)

    def pool(self, x, step):
        if step.is_global:
            return x.mean(axis=(2, 3), keepdims=True, dtype=x.dtype)
        (kh, kw), (sh, sw), (ph, pw) = step.kernel, step.stride, step.padding
        _, oh, ow = step.out_shape
        h, w = x.shape[2:]
        # pad to the extent the (ceil-mode) windows reach
        eh = max(0, (oh - 1) * sh + kh - h - ph)
        ew = max(0, (ow - 1) * sw + kw - w - pw)
        fill = -np.inf if step.kind == "max" else 0.0
        xp = np.pad(x, ((0, 0), (0, 0), (ph, eh), (pw, ew)), constant_values=fill)
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
        win = win[:, :, ::sh, ::sw][:, :, :oh, :ow]
        if step.kind == "max":
            return win.max(axis=(4, 5))
        return win.mean(axis=(4, 5), dtype=x.dtype)  # zoo average pools are global


def median_time(fn, repeats, inner=1):
    """Median over ``repeats`` of the mean time of ``inner`` consecutive calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def side_by_side(fns, repeats, min_time=0.05, pause=0.3):
    """Time several implementations in alternating rounds (so drift and interference hit
    them alike); each round runs one implementation ``inner`` times back to back, after
    ``pause`` seconds (OpenBLAS / OpenMP / ONNX Runtime worker threads spin for a while after
    a call and would slow the next library). Returns {name: median seconds per call}."""
    inner = {}
    for name, fn in fns.items():
        time.sleep(pause)
        fn()  # warm-up (first-use allocations, weight generation, plan caches)
        t0 = time.perf_counter()
        fn()
        dt = max(time.perf_counter() - t0, 1e-6)
        inner[name] = max(1, int(min_time / dt))
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            time.sleep(pause)
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def core_speeds(cpus, seconds=0.05, rounds=3):
    """Single-thread speed of each cpu relative to the first (a Python loop timed on a helper
    thread pinned to each cpu in turn): shows what the emulator, or anything else running,
    leaves of each core while the benchmark runs."""
    import threading

    result = {}

    def loop(n):
        x = 0
        for i in range(n):
            x += i
        return x

    def probe():
        n = 20000
        os.sched_setaffinity(0, {cpus[0]})
        while True:
            t0 = time.perf_counter()
            loop(n)
            if time.perf_counter() - t0 > seconds:
                break
            n *= 2
        times = {c: [] for c in cpus}
        for _ in range(rounds):
            for c in cpus:
                os.sched_setaffinity(0, {c})
                t0 = time.perf_counter()
                loop(n)
                times[c].append(time.perf_counter() - t0)
        base = statistics.median(times[cpus[0]])
        for c in cpus:
            result[c] = base / statistics.median(times[c])

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return result


def speeds_line(pool, when):
    cpus = sorted(c for cl in pool.topology.clusters for c in cl.cpus)
    sp = core_speeds(cpus)
    return f"measured single-thread speed {when}: " + ", ".join(
        f"cpu{c} {v:.2f}" for c, v in sp.items())


def machine_lines(pool, emulation, torch_threads):
    import threadpoolctl

    from asymo.hw.topology import cpu_model_name

    cpu = cpu_model_name()
    blas = [(i.get("internal_api"), i.get("num_threads"))
            for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    from asymo.ops.conv import kernel_isa

    lines = [
        f"machine: {cpu}, {os.cpu_count()} cpus, affinity {sorted(os.sched_getaffinity(0))}",
        f"asymo pool: {pool.nworkers} workers, topology {pool.topology.to_spec()}, "
        f"policy {pool.policy}, conv kernels {kernel_isa()}",
        f"emulation: {emulation or 'none (symmetric machine)'}"
        + ("  [speed only: the slowed core keeps its caches and bandwidth]" if emulation else ""),
        f"threads: torch {torch_threads}, NumPy BLAS {blas}",
        speeds_line(pool, "before"),
    ]
    return lines


@contextlib.contextmanager
def emulated(spec, period=None):
    """``spec`` like "1:0.5" (cpu:speed,...): slow those cores for the block (asymo.lab.emulate;
    ``period`` in seconds, default the emulator's); None: no emulation. Yields a description
    (the spec and the period)."""
    if not spec:
        yield None
        return
    from asymo.lab import emulate
    from asymo.lab.scaling import parse_emulate
    try:
        speeds = parse_emulate(spec)
    except ValueError as exc:
        raise SystemExit(f"--emulate: {exc}")
    period = emulate.DEFAULT_PERIOD if period is None else period
    with emulate.slow_cores(speeds, period=period):
        yield f"{spec} (emulator period {period * 1e3:g} ms)"


def fmt_ratio(a, b):
    return f"{b / a:5.2f}x" if a > 0 and b > 0 else "   - "


# ---- single convolution layers against every library (bench/conv_single.py) -----------------

def conv_layer_specs(names):
    """Unique convolution layers of the named networks: {(in_shape, weight_shape, stride,
    padding, dilation, groups, activation): [(network, layer name), ...]}. "mobilenet_v2"
    (not in the zoo) is generated from the paper's table (224x224, width 1.0)."""
    import asymo.models
    from asymo.models.spec import Conv, weighted_steps

    layers = {}
    for name in names:
        if name == "mobilenet_v2":
            convs = _mobilenet_v2_convs()
        else:
            model = asymo.models.get(name)
            convs = [(s.name, s.in_shape, s.weight_shape, tuple(s.stride), tuple(s.padding),
                      tuple(s.dilation), s.groups, s.activation)
                     for layer in model.layers for s in weighted_steps(layer.steps)
                     if isinstance(s, Conv)]
        for lname, ins, ws, st, pad, dil, g, act in convs:
            layers.setdefault((tuple(ins), tuple(ws), st, pad, dil, g, act), []).append(
                (name, lname))
    return layers


def _mobilenet_v2_convs():
    out = [("conv1", (3, 224, 224), (32, 3, 3, 3), (2, 2), (1, 1), (1, 1), 1, "relu6")]
    c, hw = 32, 112
    blocks = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
              (6, 160, 3, 2), (6, 320, 1, 1)]
    i = 0
    for t, cout, n, s in blocks:
        for r in range(n):
            stride = s if r == 0 else 1
            e = c * t
            if t != 1:
                out.append((f"b{i}.expand", (c, hw, hw), (e, c, 1, 1), (1, 1), (0, 0), (1, 1), 1,
                            "relu6"))
            out.append((f"b{i}.dw", (e, hw, hw), (e, 1, 3, 3), (stride, stride), (1, 1), (1, 1),
                        e, "relu6"))
            hw = (hw + 2 - 3) // stride + 1
            out.append((f"b{i}.project", (e, hw, hw), (cout, e, 1, 1), (1, 1), (0, 0), (1, 1),
                        1, None))
            c = cout
            i += 1
    out.append(("conv_last", (c, hw, hw), (1280, c, 1, 1), (1, 1), (0, 0), (1, 1), 1, "relu6"))
    return out


def onnx_conv_session(x_shape, w, b, stride, padding, dilation, groups, activation, threads):
    """An ONNX Runtime session of one Conv node (+ Relu / Clip), weights as initializers (ONNX
    Runtime pre-packs them at session creation), ``threads`` intra-op threads."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    cout = w.shape[0]
    inits = [numpy_helper.from_array(w, "W")]
    inputs = ["X", "W"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "B"))
        inputs.append("B")
    nodes = [helper.make_node("Conv", inputs, ["C" if activation else "Y"],
                              kernel_shape=list(w.shape[2:]), strides=list(stride),
                              pads=[padding[0], padding[1], padding[0], padding[1]],
                              dilations=list(dilation), group=groups)]
    if activation == "relu":
        nodes.append(helper.make_node("Relu", ["C"], ["Y"]))
    elif activation == "relu6":
        inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["C", "lo", "hi"], ["Y"]))
    oh = (x_shape[2] + 2 * padding[0] - dilation[0] * (w.shape[2] - 1) - 1) // stride[0] + 1
    ow = (x_shape[3] + 2 * padding[1] - dilation[1] * (w.shape[3] - 1) - 1) // stride[1] + 1
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [x_shape[0], cout, oh, ow])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def geomean(values):
    values = [v for v in values if v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")
