"""Measurements that feed the pipeline planner.

- Micro-benchmarks for the Pipe-it time model (paper 000, Sect. V-B): single convolutional
  layers on the paper's grid ``Iw = Ih in {7, 14, 28, 56, 112}``, ``Fw = Fh in {1, 3, 5, 7,
  11}``, ``Id = Fd in {32, 64, 92, 128, 192, 256}``, ``Ofm in {32, 64, 92, 128, 192, 256}``
  (stride 1, "same" padding), plus depthwise convolutions, fully-connected layers (input sizes
  x {1000, 4096} neurons, Sect. V-D) and pooling/LRN. Each micro-benchmark is a one-node model
  run through ``Model.run_layers``, i.e. exactly the code path of the zoo's layers, on a pool
  restricted to one core configuration.
- ``measure_layer_times``: the time of every layer of a zoo model on every core configuration
  (Pipe-it's "measured layer time", Tables IV and VI), and kernel-level on all cores.
- ``prediction_errors``: Table III -- mean relative error of the time model per configuration.

The command-line driver is ``bench/calibration_pipeline_timemodel.py``.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time

import numpy as np

from asymo.pipeline.configs import core_configs
from asymo.pipeline.runtime import STAGE_SPIN_US, _single_threaded_blas, sub_topology
from asymo.pipeline.table import LayerTimes
from asymo.pipeline.timemodel import KERNEL_LEVEL, LayerTimeModel, layer_operations

__all__ = ["PAPER_GRID", "micro_benchmarks", "time_call", "measure_samples", "calibrate",
           "measure_layer_times", "prediction_errors", "config_cpus"]

PAPER_GRID = {"sizes": (7, 14, 28, 56, 112), "filters": (1, 3, 5, 7, 11),
              "depths": (32, 64, 92, 128, 192, 256), "maps": (32, 64, 92, 128, 192, 256)}
QUICK_GRID = {"sizes": (7, 28, 112), "filters": (1, 3, 7), "depths": (32, 128, 256),
              "maps": (32, 92, 256)}
# the grid of the shipped reference fit (asymo/pipeline/reference_timemodel.json): the paper's
# grid without its costliest corner (112 x 112 inputs, 7x7 and 11x11 filters)
REFERENCE_GRID = {"sizes": (7, 14, 28, 56), "filters": (1, 3, 5), "depths": (32, 128, 256),
                  "maps": (32, 92, 256)}
FC_INPUTS = (256, 1024, 2048, 4096, 9216, 16384, 25088)
FC_NEURONS = (1000, 4096)
DW_CHANNELS = (32, 64, 128, 256, 512, 1024)


def micro_benchmarks(grid="paper"):
    """The micro-benchmark list: dicts ``{"family", "steps", "input_shape"}``.

    ``grid``: ``"paper"`` (the 900 convolutions of Sect. V-B), ``"quick"`` (81 of them),
    ``"reference"`` (108, the shipped reference fit's), or a dict like ``PAPER_GRID``.
    """
    from asymo.models.spec import LRN, Conv, Linear, Pool, conv_output_size, pool_output_size

    g = {"paper": PAPER_GRID, "quick": QUICK_GRID, "reference": REFERENCE_GRID}.get(grid, grid) \
        if isinstance(grid, str) else grid
    if not isinstance(g, dict):
        raise ValueError(f"unknown grid {grid!r}; use 'paper', 'quick' or a dict")
    out = []
    for iw, f, d, m in itertools.product(g["sizes"], g["filters"], g["depths"], g["maps"]):
        p = f // 2
        o = conv_output_size(iw, f, 1, p)
        out.append({"family": "conv", "input_shape": (d, iw, iw), "steps": (
            Conv(name=f"bench_conv_{iw}_{f}_{d}_{m}", in_shape=(d, iw, iw), out_shape=(m, o, o),
                 kernel=(f, f), padding=(p, p)),)})
    sizes = g["sizes"]
    for iw, f, c in itertools.product(sizes, (3, 5), DW_CHANNELS[:4] if grid == "quick"
                                      else DW_CHANNELS):
        p = f // 2
        o = conv_output_size(iw, f, 1, p)
        out.append({"family": "dwconv", "input_shape": (c, iw, iw), "steps": (
            Conv(name=f"bench_dw_{iw}_{f}_{c}", in_shape=(c, iw, iw), out_shape=(c, o, o),
                 kernel=(f, f), padding=(p, p), groups=c),)})
    for n_in, n_out in itertools.product(FC_INPUTS, FC_NEURONS):
        out.append({"family": "fc", "input_shape": (n_in,), "steps": (
            Linear(name=f"bench_fc_{n_in}_{n_out}", in_shape=(n_in,), out_shape=(n_out,)),)})
    for iw, k, c in itertools.product(sizes, (2, 3), (32, 128, 512)):
        if iw < k:
            continue
        o = pool_output_size(iw, k, 2, 0)
        out.append({"family": "pool", "input_shape": (c, iw, iw), "steps": (
            Pool(kind="max", in_shape=(c, iw, iw), out_shape=(c, o, o), kernel=(k, k),
                 stride=(2, 2)),)})
    for iw, c in itertools.product(sizes, (64, 256)):
        out.append({"family": "pool", "input_shape": (c, iw, iw), "steps": (
            LRN(in_shape=(c, iw, iw), out_shape=(c, iw, iw)),)})
    return out


def _one_node_model(bench):
    from asymo.models.model import Model
    from asymo.models.spec import Layer

    steps = bench["steps"]
    layer = Layer(index=0, name=getattr(steps[0], "name", bench["family"]),
                  kind=bench["family"], input_shape=tuple(bench["input_shape"]),
                  output_shape=tuple(steps[-1].out_shape), steps=tuple(steps))
    return Model("micro-benchmark", [layer], seed=0)


def time_call(fn, *, min_time=0.03, min_repeats=3, max_repeats=15):
    """Median wall time of ``fn()`` after one warm-up call."""
    fn()
    ts = []
    t_total = time.perf_counter()
    while len(ts) < max_repeats:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        if len(ts) >= min_repeats and time.perf_counter() - t_total >= min_time:
            break
    return float(np.median(ts))


def config_cpus(config, topology):
    """The cores a configuration is measured on: the first ``count`` cores of its cluster;
    ``KERNEL_LEVEL``: every core."""
    if config == KERNEL_LEVEL:
        return tuple(topology.cpus)
    return tuple(topology.clusters[config.cluster].cpus[:config.count])


@contextlib.contextmanager
def _pinned(cpus):
    """Run the calling thread on ``cpus`` (as a stage thread runs), restoring its affinity."""
    try:
        old = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        yield
        return
    want = set(cpus) & old
    try:
        if want:
            os.sched_setaffinity(0, want)
        yield
    finally:
        os.sched_setaffinity(0, old)


@contextlib.contextmanager
def _co_runner(model, topology, busy_cpus):
    """Keep the cores outside ``busy_cpus`` busy with ``model`` (as the other stages of a
    pipeline are) while the caller measures: stages run concurrently in one process, so they
    share the GIL, caches and memory bandwidth; a measurement on an otherwise idle machine
    misses that."""
    others = tuple(c for c in topology.cpus if c not in set(busy_cpus))
    if model is None or not others:
        yield
        return
    import threading
    stop = threading.Event()
    x = np.zeros((1,) + tuple(model.layers[0].input_shape), dtype=np.float32)
    W = len(model.layers)
    started = threading.Event()

    def loop():
        with _single_threaded_blas(), _pinned(others), _make_pool(topology, others) as pool:
            started.set()
            while not stop.is_set():
                y = x
                for i in range(W):
                    if stop.is_set():
                        break
                    y = model.run_layers(y, i, i, pool=pool)

    t = threading.Thread(target=loop, name="asymo-calibrate-co-runner", daemon=True)
    t.start()
    started.wait(30)
    try:
        yield
    finally:
        stop.set()
        t.join(60)


def _make_pool(topology, cpus, spin_us=STAGE_SPIN_US):
    """A pool on ``cpus`` configured as the runtime configures a stage's pool."""
    from asymo.runtime.pool import Pool
    return Pool(topology=sub_topology(topology, cpus), spin_us=spin_us)


def measure_samples(benches, config, topology, *, progress=None, co_runner=None, **timing):
    """Run ``benches`` on ``config``'s cores; return time-model samples (dicts).

    ``co_runner``: a model kept running on the other cores meanwhile (see
    ``measure_layer_times``); None measures on an otherwise idle machine, as the paper did.
    """
    rng = np.random.default_rng(0)
    samples = []
    # a stage's BLAS calls stay on its cores (as in the runtime); kernel-level runs as is
    limit = _single_threaded_blas() if config != KERNEL_LEVEL else contextlib.nullcontext()
    cpus = config_cpus(config, topology)
    pin = _pinned(cpus) if config != KERNEL_LEVEL else contextlib.nullcontext()
    co = _co_runner(co_runner, topology, cpus)
    with co, limit, pin, _make_pool(topology, cpus, STAGE_SPIN_US) as pool:
        for b in benches:
            model = _one_node_model(b)
            model.materialize()
            x = rng.standard_normal((1,) + tuple(b["input_shape"]), dtype=np.float32)
            t = time_call(lambda: model.run_layers(x, 0, 0, pool=pool), **timing)
            for fam, N, K, M, rep in layer_operations(b["steps"]):
                samples.append({"config": config, "family": b["family"], "N": N, "K": K,
                                "M": M, "seconds": t / rep})
            if progress is not None:
                progress.update(1)
    return samples


def calibrate(topology, *, configs=None, grid="quick", kernel_level=True, progress=False,
              co_run="squeezenet", **timing):
    """Measure the micro-benchmarks on every core configuration and fit the time model.

    ``co_run``: a zoo model kept running on the cores outside the configuration being
    measured (the pipeline's other stages are busy too: shared GIL, caches and memory);
    None to measure on an idle machine.

    Returns ``(LayerTimeModel, samples)``; store ``model.to_dict()`` in the profile section
    ``"pipeline"``.
    """
    co_model = None
    if co_run:
        import asymo.models as zoo
        co_model = zoo.get(co_run, image_size=112)
        co_model.materialize()
    configs = list(core_configs(topology) if configs is None else configs)
    if kernel_level and topology.ncpus > 1:
        configs.append(KERNEL_LEVEL)
    benches = micro_benchmarks(grid)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(benches) * len(configs), desc="pipeline calibration",
                   unit="bench")
    samples = []
    try:
        for c in configs:
            samples.extend(measure_samples(benches, c, topology, progress=bar,
                                           co_runner=co_model, **timing))
    finally:
        if bar is not None:
            bar.close()
    model = LayerTimeModel.fit(samples, capacities=[c.capacity for c in topology.clusters],
                               source=f"predicted (calibrated on {topology.to_spec()}, "
                                      f"{grid} grid)")
    return model, samples


def measure_layer_times(model, topology, *, configs=None, kernel_level=True, repeats=9,
                        warmup=2, co_run=True):
    """Measured time of every layer of ``model`` on every configuration (a LayerTimes with
    ``source="measured ..."``).

    Layers run in chain order, one frame after another, as a stage runs them (so each layer
    finds the caches as the previous layers left them, not warmed by its own repetition), on a
    thread pinned to the configuration's cores; with ``co_run`` the other cores run the model
    meanwhile, as the other stages of a pipeline do. Each layer's time is the median over
    ``repeats`` frames after ``warmup`` frames.

    Why 9 frames: under the emulator (a slow core that stops and goes in 1 ms periods) with a
    co-runner, the median of 5 frames still moved a 2-stage plan's stage times by up to 25%
    between two back-to-back measurements (mobilenet_v1, resnet50), and the planner, choosing
    the split with the smallest predicted bottleneck, turns that noise into an optimistic
    prediction.
    """
    configs = list(core_configs(topology) if configs is None else configs)
    rng = np.random.default_rng(0)
    if hasattr(model, "materialize"):
        model.materialize()
    W = len(model.layers)
    x0 = rng.standard_normal((1,) + tuple(model.layers[0].input_shape), dtype=np.float32)

    def column(cpus, limit_blas=True):
        limit = _single_threaded_blas() if limit_blas else contextlib.nullcontext()
        pin = _pinned(cpus) if limit_blas else contextlib.nullcontext()
        co = _co_runner(model if co_run else None, topology, cpus)
        with co, limit, pin, _make_pool(topology, cpus, STAGE_SPIN_US) as pool:
            ts = np.empty((warmup + repeats, W))
            for r in range(warmup + repeats):
                x = x0
                for i in range(W):
                    t0 = time.perf_counter()
                    x = model.run_layers(x, i, i, pool=pool)
                    ts[r, i] = time.perf_counter() - t0
            return np.median(ts[warmup:], axis=0)

    times = np.array([column(config_cpus(c, topology)) for c in configs]).T
    kl = np.array(column(tuple(topology.cpus), False)) if kernel_level else None
    out_bytes = [4 * int(np.prod(l.output_shape)) for l in model.layers]
    return LayerTimes(configs, times, [l.name for l in model.layers], out_bytes, kl,
                      source=f"measured on {topology.to_spec()}")


def prediction_errors(predicted, measured, topology=None):
    """Table III: mean ``|predicted - measured| / measured`` over the layers, per core
    configuration (and kernel-level), for two ``LayerTimes`` of the same model."""
    if predicted.nlayers != measured.nlayers:
        raise ValueError("the two tables describe different models")
    out = {}
    for c in measured.configs:
        out[c.label(topology)] = float(np.mean(np.abs(predicted.T(c) - measured.T(c))
                                               / measured.T(c)))
    if predicted.kernel_level is not None and measured.kernel_level is not None:
        out[KERNEL_LEVEL] = float(np.mean(np.abs(predicted.kernel_level - measured.kernel_level)
                                          / measured.kernel_level))
    return out
