"""The runtimes as users run them, for comparison with a pipeline (issue 18's baselines).

``runtime_baselines`` runs the whole model, one frame at a time (batch 1), with

- ONNX Runtime on every core (``intra_op_num_threads`` = number of cores, its default
  spinning) and on the fastest core alone (one thread, the caller pinned there);
- torch (the network's ONNX nodes on ``torch.nn.functional``, see
  ``asymo.pipeline.executors``) with ``torch.set_num_threads`` = every core, and on the
  fastest core alone with one thread.

Each runs in its own thread pinned to its cores; thread settings are made before the timed
loop. Throughput is frames / time of the timed loop, latency the median per frame.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from asymo.pipeline.runtime import run_in_thread
from asymo.pipeline.executors import TorchExecutor, available_executors

__all__ = ["runtime_baselines", "BASELINE_RUNTIMES"]

BASELINE_RUNTIMES = ("ort", "torch")


def _loop(fn, frames, cancel):
    fn(frames[0])  # warm-up
    ts = []
    t_all = time.perf_counter()
    for f in frames:
        if cancel.is_set():  # Ctrl-C in the caller (run_in_thread)
            raise KeyboardInterrupt("measurement cancelled")
        t0 = time.perf_counter()
        fn(f)
        ts.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_all
    return {"throughput": len(frames) / wall, "latency_s": float(np.median(ts))}


def _ort(graph, cpus, frames, cancel):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = len(cpus)
    so.log_severity_level = 3
    s = ort.InferenceSession(graph.proto.SerializeToString(), so,
                             providers=["CPUExecutionProvider"])
    name = graph.input_name
    return _loop(lambda f: s.run(None, {name: f}), frames, cancel)  # the session ends here


def _torch(graph, cpus, frames, cancel):
    import torch

    ex = TorchExecutor(graph, 0, len(graph) - 1, cpus)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(len(cpus))
        return _loop(lambda f: ex.run(f), frames, cancel)
    finally:
        torch.set_num_threads(old)
        ex.close()


def runtime_baselines(graph, topology, frames, *, runtimes=BASELINE_RUNTIMES, pause=0.3,
                      skipped=None):
    """``{"ort@all": {"throughput", "latency_s"}, "ort@fast": ..., "torch@all": ...}``.

    ``frames``: float32 array ``(F, C, H, W)``; runtimes not installed are left out, and so
    are runtimes that cannot run the model (the torch executor's operators do not cover it,
    ONNX Runtime refuses it): their one-line reasons go into the dict ``skipped`` when given.
    """
    have = available_executors()
    allc = tuple(sorted(topology.cpus))
    fast = (topology.clusters[0].cpus[0],)
    items = [np.ascontiguousarray(frames[i:i + 1]) for i in range(len(frames))]
    out = {}
    cancel = threading.Event()
    for rt in runtimes:
        if rt not in have:
            continue
        fn = _ort if rt == "ort" else _torch
        for label, cpus in (("all", allc), ("fast", fast)):
            time.sleep(pause)
            try:
                out[f"{rt}@{label}"] = run_in_thread(lambda: fn(graph, cpus, items, cancel),
                                                     cpus, cancel=cancel)
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is left out
                if skipped is not None:
                    skipped[rt] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                break
    return out
