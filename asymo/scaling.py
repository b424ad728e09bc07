"""Scaling benchmark: throughput as cores are added, fastest cluster first.

For each workload (``spin``, ``matmul``, ``conv2d``, ``models``) and each way of running it
(the pool policies ``asymo``, ``even``, ``shared``, ``steal``; NumPy with its BLAS threads
limited by threadpoolctl; torch when installed) the workload runs on the first ``k`` cores of
the topology for k = 1 .. ncpus (all cores of the fastest cluster first, then the next
cluster), and its throughput is the work per run over the median time per run. This is the
measurement behind AsyMo's Fig. 11 and Pipe-it's Fig. 3: on an asymmetric CPU, a policy that
splits work evenly gets *slower* when the slow cores join.

The same sweep can come from the simulator (:func:`simulate_scaling`, any preset CPU), and
:func:`validate_sim` checks the simulator against a measured sweep of this machine.

Every point is plain data (:class:`Point`); :class:`ScalingResult` renders the table, the JSON
and the plot.
"""
from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from asymo import topology as topo
from asymo.sim.calibrate import calibrate_sim, format_calibration, sim_inputs
from asymo.sim.engine import Job, Overheads, first_cores, simulate

__all__ = [
    "POOL_POLICIES", "BASELINES", "WORKLOADS", "Point", "ScalingResult", "Workload",
    "SpinWorkload", "MatmulWorkload", "Conv2dWorkload", "ModelWorkload", "make_workloads",
    "measure_scaling", "simulate_scaling", "validate_sim", "calibrate_sim",
    "parse_emulate", "parse_interference", "process_affinity", "DEFAULT_SIM_OVERHEADS",
]

POOL_POLICIES = ("asymo", "even", "shared", "steal")
BASELINES = ("numpy", "torch")
SCHEMA = "asymo.bench.scaling/1"

# Scheduling costs the simulator uses for preset CPUs unless told otherwise, from asymo's pool
# on the development machine: an empty job through parallel_for 3.8 us (bench/pool_overhead.py,
# README "Thread pool"), a take from the own queue one uncontended lock round trip (~50 ns);
# a steal (locking another core's queue, a few cache-line transfers) is an estimate. A phone
# core is slower, so these are optimistic there; --sim-overheads changes them.
DEFAULT_SIM_OVERHEADS = Overheads(job=4e-6, task=50e-9, steal=0.5e-6)


# --------------------------------------------------------------------------------------------
# machine state helpers

def parse_emulate(text):
    """Parse ``"1:0.5"`` or ``"1:0.5,3:0.25"`` into ``{cpu: speed}``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("emulation spec is empty; expected CPU:SPEED, e.g. '1:0.5'")
    out = {}
    for item in text.split(","):
        cpu_text, sep, speed_text = item.strip().partition(":")
        try:
            cpu, speed = int(cpu_text), float(speed_text)
        except ValueError:
            raise ValueError(f"bad emulation item {item.strip()!r}; expected CPU:SPEED, "
                             "e.g. '1:0.5'") from None
        if not sep or cpu < 0 or not (0.0 < speed <= 1.0):
            raise ValueError(f"bad emulation item {item.strip()!r}: cpu must be >= 0 and "
                             "speed in (0, 1]")
        if cpu in out:
            raise ValueError(f"cpu {cpu} appears twice in emulation spec {text!r}")
        out[cpu] = speed
    return out


def _thread_ids():
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # pragma: no cover - non-Linux
        return [0]


@contextlib.contextmanager
def process_affinity(cpus):
    """Restrict every thread of this process to ``cpus`` for the block; restore each on exit.

    ``os.sched_setaffinity(0, ...)`` moves only the calling thread; BLAS and OpenMP pools
    started earlier keep their masks, so each thread in ``/proc/self/task`` is moved. Threads
    created inside the block inherit the restricted mask from their creator.
    """
    cpus = set(int(c) for c in cpus)
    saved = {}
    try:
        for tid in _thread_ids():
            try:
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, PermissionError):
                continue  # thread exited, or not ours to move
        yield
    finally:
        for tid, mask in saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _asymo_attr(name):
    """``asymo.<name>`` if the part that provides it is built, else None."""
    import asymo
    try:
        return getattr(asymo, name)
    except (AttributeError, ImportError):
        return None


_OPEN_POOLS = []   # pools opened by runners, innermost last (the measurement reads its stats)


@contextlib.contextmanager
def _pinned_thread(cpu):
    """Pin the calling thread to ``cpu`` for the block (None: leave it alone)."""
    if cpu is None:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


@contextlib.contextmanager
def _open_pool(topology, policy):
    Pool = _asymo_attr("Pool")
    if Pool is None:
        raise RuntimeError("asymo's pool (asymo.Pool) is not available in this build")
    pool = Pool(topology=topology, policy=policy)
    _OPEN_POOLS.append(pool)
    try:
        yield pool
    finally:
        _OPEN_POOLS.remove(pool)
        for name in ("close", "shutdown"):
            fn = getattr(pool, name, None)
            if callable(fn):
                fn()
                break


@contextlib.contextmanager
def _baseline_threads(policy, cpus):
    """NumPy's BLAS / torch limited to len(cpus) threads, every thread on ``cpus``."""
    from threadpoolctl import threadpool_limits
    k = len(cpus)
    with process_affinity(cpus), warnings.catch_warnings():
        # threadpoolctl asks asymo's controller for its pools, which re-reads the topology:
        # with the process narrowed to fewer cpus than an emulated topology names, that
        # would warn about cpus outside the affinity mask, which is intended here
        warnings.simplefilter("ignore", topo.TopologyWarning)
        if policy == "numpy":
            with threadpool_limits(limits=k, user_api="blas"):
                yield
        else:
            torch = _torch()
            old = torch.get_num_threads()
            torch.set_num_threads(k)
            try:
                yield
            finally:
                torch.set_num_threads(old)


# --------------------------------------------------------------------------------------------
# workloads

class Workload:
    """One thing to run at every core count.

    Subclasses define ``name``, ``unit`` ("GFLOP/s" or "images/s"), ``work`` (FLOPs or images
    per run), ``policies()`` (which runners exist here), ``runner(policy, topology)`` (a
    context manager giving a zero-argument callable that runs the workload once) and
    ``sim_jobs(topology, gflops_per_core, task_costs=None)`` (the same work as simulator
    jobs; ``task_costs``, an `asymo.sim.costs.ModelCosts`, prices GEMM tasks by the cost
    model instead of the per-cluster rate where it covers them).
    """

    name = ""
    unit = "GFLOP/s"

    def policies(self):
        return [p for p in POOL_POLICIES if self._pool_ok()] + \
            [b for b in BASELINES if self._baseline_ok(b)]

    def _pool_ok(self):
        return _asymo_attr("Pool") is not None

    def _baseline_ok(self, name):
        return False

    def throughput(self, seconds):
        scale = 1e-9 if self.unit == "GFLOP/s" else 1.0
        return self.work * scale / seconds

    def describe(self):
        return self.name


_SPIN_FN = None


def _spin_cfunc():
    """A Numba cfunc ``void(int64 task, void *ctx)`` that spins on dependent FP math.

    ctx points at float64[2 + ntasks]: ctx[0] = iterations, ctx[2 + task] receives a result
    (so the loop cannot be optimised away). 8 independent multiply-add chains: 16 FLOP per
    iteration, latency bound, no memory traffic: pure core speed.
    """
    global _SPIN_FN
    if _SPIN_FN is None:
        import numba
        from numba import types

        @numba.cfunc(types.void(types.int64, types.voidptr), nopython=True)
        def spin(task, ctx):
            head = numba.carray(ctx, 1, dtype=np.float64)
            n = np.int64(head[0])
            out = numba.carray(ctx, task + 3, dtype=np.float64)
            a0, a1, a2, a3 = 1.0, 1.1, 1.2, 1.3
            a4, a5, a6, a7 = 1.4, 1.5, 1.6, 1.7
            m, c = 0.999999, 1e-7
            for _ in range(n):
                a0 = a0 * m + c
                a1 = a1 * m + c
                a2 = a2 * m + c
                a3 = a3 * m + c
                a4 = a4 * m + c
                a5 = a5 * m + c
                a6 = a6 * m + c
                a7 = a7 * m + c
            out[task + 2] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

        @numba.cfunc(types.void(types.int64, types.voidptr), nopython=True)
        def noop(task, ctx):
            pass

        _SPIN_FN = (spin, noop)
    return _SPIN_FN


def _fn_arg(cfunc):
    return cfunc.address


class SpinWorkload(Workload):
    """``ntasks`` equal compute-bound tasks (a Numba cfunc) on the pool: scheduling only."""

    name = "spin"
    unit = "GFLOP/s"
    FLOPS_PER_ITER = 16

    def __init__(self, ntasks=192, iters=50_000):
        if ntasks < 1 or iters < 1:
            raise ValueError("spin workload needs ntasks >= 1 and iters >= 1")
        self.ntasks = int(ntasks)
        self.iters = int(iters)
        self.work = float(self.ntasks * self.iters * self.FLOPS_PER_ITER)

    def describe(self):
        return f"spin: {self.ntasks} tasks x {self.iters} iterations (16 FLOP each)"

    @contextlib.contextmanager
    def runner(self, policy, topology):
        if policy not in POOL_POLICIES:
            raise ValueError(f"spin runs on the pool only, not {policy!r}")
        spin, _ = _spin_cfunc()
        buf = np.zeros(2 + self.ntasks)
        buf[0] = self.iters
        ctx = buf.ctypes.data
        with _open_pool(topology, policy) as pool:
            yield lambda: pool.parallel_for(_fn_arg(spin), self.ntasks, ctx=ctx)

    def sim_jobs(self, topology, gflops_per_core, task_costs=None):
        # not a GEMM: the cost model does not describe it, capabilities price it
        per_task = self.iters * self.FLOPS_PER_ITER
        costs = np.array([[per_task / (g * 1e9) for g in gflops_per_core]] * self.ntasks)
        return [Job(costs=costs, name="spin")]


def _gemm_tiles(M, K, N, topology, gflops_per_core, tile=None):
    """Simulator tasks of one M x K x N matmul: row tiles of the longer output dimension.

    Tile height per task follows the fastest cluster's L2 (a K-deep strip of A must fit in half
    of it) unless ``tile`` is given; at least 4 tasks per worker keep stealing meaningful.
    """
    rows, cols = (M, N) if M >= N else (N, M)
    if tile is None:
        l2 = topology.clusters[0].l2.size if topology.clusters[0].l2 else 512 * 1024
        tile = max(8, min(rows, (l2 // 2) // (4 * max(K, 1)) // 8 * 8))
        tile = max(1, min(tile, math.ceil(rows / (4 * topology.ncpus))))
    ntiles = math.ceil(rows / tile)
    heights = np.full(ntiles, tile, dtype=np.float64)
    heights[-1] = rows - tile * (ntiles - 1)
    flops = 2.0 * heights * K * cols
    return np.stack([flops / (g * 1e9) for g in gflops_per_core], axis=1)


def _gemm_job(M, K, N, topology, gflops_per_core, name="", task_costs=None):
    """Simulator job for one float32 M x K x N product as asymo.matmul would run it.

    With the GEMM planner available (``asymo.gemm_plan``), its plan for ``topology`` gives the
    per-cluster task counts and ranges: each cluster's share of the FLOPs is spread evenly
    over its tasks (edge blocks are not modelled), and the job carries the plan's counts as
    its split. Without it, row tiles sized to the fastest cluster's L2 (``_gemm_tiles``).
    ``task_costs`` (`asymo.sim.costs.ModelCosts`): the plan's tasks priced by the cost model
    where it covers the plan.
    """
    try:
        from asymo.gemm_plan import plan_gemm
    except ImportError:
        return Job(costs=_gemm_tiles(M, K, N, topology, gflops_per_core), name=name)
    plan = plan_gemm(M, K, N, "float32", topology=topology)
    if task_costs is not None:
        job = task_costs.gemm_job(plan, topology, name=name)
        if job is not None:
            return job
    if getattr(plan, "serial", False):
        # too small to be worth the pool: the calling thread runs it (model: one task on a
        # core of the fastest cluster)
        flops = 2.0 * M * K * N
        return Job(costs=[[flops / (g * 1e9) for g in gflops_per_core]],
                   split=[1] + [0] * (topology.nclusters - 1), name=name)
    counts = list(plan.task_counts())
    size = {"M": M, "N": N, "batch": 1}[plan.split_dim]
    flops = []
    for (a, b), n in zip(plan.cluster_ranges, counts):
        if n:
            share = 2.0 * M * K * N * (b - a) / size
            flops.extend([share / n] * n)
    flops = np.asarray(flops)
    costs = np.stack([flops / (g * 1e9) for g in gflops_per_core], axis=1)
    return Job(costs=costs, split=counts, name=name)


def _conv_gemm_jobs(M, K, N, topology, gflops_per_core, name="", task_costs=None):
    """Simulator jobs of one convolution's GEMM, ``weight (M x K) @ col (K x N pixels)``, as
    asymo.conv2d runs it: in chunks of columns whose column matrix fits its chunk size, one
    GEMM per chunk (im2col's own tasks are not modelled: the calibration folds their time
    into the per-cluster rate)."""
    try:
        from asymo.conv import COL_CHUNK_BYTES
    except ImportError:
        COL_CHUNK_BYTES = 8 << 20
    nchunks = max(1, math.ceil(K * N * 4 / COL_CHUNK_BYTES))
    edges = [N * i // nchunks for i in range(nchunks + 1)]
    return [_gemm_job(M, K, b - a, topology, gflops_per_core, name=name, task_costs=task_costs)
            for a, b in zip(edges, edges[1:]) if b > a]


class MatmulWorkload(Workload):
    """``asymo.matmul`` / ``numpy.matmul`` / ``torch.matmul`` on float32 DL shapes."""

    name = "matmul"
    unit = "GFLOP/s"
    DEFAULT_SHAPES = ((784, 1152, 128),)

    def __init__(self, shapes=None, seed=0):
        self.shapes = tuple(tuple(int(d) for d in s) for s in (shapes or self.DEFAULT_SHAPES))
        for s in self.shapes:
            if len(s) != 3 or min(s) < 1:
                raise ValueError(f"matmul shape must be (M, K, N) with positive sizes, got {s}")
        rng = np.random.default_rng(seed)
        self.operands = [(rng.standard_normal((M, K), dtype=np.float32),
                          rng.standard_normal((K, N), dtype=np.float32),
                          np.empty((M, N), dtype=np.float32)) for M, K, N in self.shapes]
        self.work = float(sum(2 * M * K * N for M, K, N in self.shapes))

    def describe(self):
        return "matmul: " + ", ".join(f"{M}x{K}x{N}" for M, K, N in self.shapes)

    def _pool_ok(self):
        return _asymo_attr("Pool") is not None and _asymo_attr("matmul") is not None

    def _baseline_ok(self, name):
        return name == "numpy" or _torch() is not None

    @contextlib.contextmanager
    def runner(self, policy, topology):
        if policy in POOL_POLICIES:
            matmul = _asymo_attr("matmul")
            with _open_pool(topology, policy) as pool:
                def run():
                    for a, b, out in self.operands:
                        matmul(a, b, out=out, pool=pool)
                yield run
        elif policy == "numpy":
            with _baseline_threads(policy, topology.cpus):
                def run():
                    for a, b, out in self.operands:
                        np.matmul(a, b, out=out)
                yield run
        elif policy == "torch":
            torch = _torch()
            ops = [(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(o))
                   for a, b, o in self.operands]
            with _baseline_threads(policy, topology.cpus):
                def run():
                    for a, b, out in ops:
                        torch.matmul(a, b, out=out)
                yield run
        else:
            raise ValueError(f"unknown policy {policy!r}")

    def sim_jobs(self, topology, gflops_per_core, task_costs=None):
        return [_gemm_job(M, K, N, topology, gflops_per_core, name=f"{M}x{K}x{N}",
                          task_costs=task_costs)
                for M, K, N in self.shapes]


def _im2col_conv(x, w, stride, padding):
    """NumPy baseline conv2d: im2col (a strided view, copied) and one BLAS matmul."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]                       # n, c, oh, ow, kh, kw
    oh, ow = win.shape[2], win.shape[3]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    out = cols @ w.reshape(oc, -1).T                          # (n*oh*ow, oc)
    return out.reshape(n, oh, ow, oc).transpose(0, 3, 1, 2)


class Conv2dWorkload(Workload):
    """``asymo.conv2d`` / NumPy im2col + matmul / ``torch.nn.functional.conv2d``."""

    name = "conv2d"
    unit = "GFLOP/s"
    # (in_channels, height, width, out_channels, kernel, stride, padding), batch 1
    DEFAULT_LAYERS = ((64, 56, 56, 64, 3, 1, 1),)

    def __init__(self, layers=None, batch=1, seed=0):
        self.layers = tuple(tuple(int(v) for v in l) for l in (layers or self.DEFAULT_LAYERS))
        rng = np.random.default_rng(seed)
        self.batch = int(batch)
        self.operands = []
        work = 0.0
        for c, h, w, oc, k, s, p in self.layers:
            x = rng.standard_normal((self.batch, c, h, w), dtype=np.float32)
            wt = rng.standard_normal((oc, c, k, k), dtype=np.float32) * 0.05
            self.operands.append((x, wt, s, p))
            oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            work += 2.0 * self.batch * oc * oh * ow * c * k * k
        self.work = work

    def describe(self):
        return "conv2d: " + ", ".join(f"{c}x{h}x{w}->{oc} k{k} s{s} p{p}"
                                      for c, h, w, oc, k, s, p in self.layers)

    def _pool_ok(self):
        return _asymo_attr("Pool") is not None and _asymo_attr("conv2d") is not None

    def _baseline_ok(self, name):
        return name == "numpy" or _torch() is not None

    @contextlib.contextmanager
    def runner(self, policy, topology):
        if policy in POOL_POLICIES:
            conv2d = _asymo_attr("conv2d")
            with _open_pool(topology, policy) as pool:
                def run():
                    for x, w, s, p in self.operands:
                        conv2d(x, w, stride=s, padding=p, pool=pool)
                yield run
        elif policy == "numpy":
            with _baseline_threads(policy, topology.cpus):
                def run():
                    for x, w, s, p in self.operands:
                        _im2col_conv(x, w, s, p)
                yield run
        elif policy == "torch":
            torch = _torch()
            import torch.nn.functional as F
            ops = [(torch.from_numpy(x), torch.from_numpy(w), s, p)
                   for x, w, s, p in self.operands]
            with _baseline_threads(policy, topology.cpus):
                def run():
                    with torch.no_grad():
                        for x, w, s, p in ops:
                            F.conv2d(x, w, stride=s, padding=p)
                yield run
        else:
            raise ValueError(f"unknown policy {policy!r}")

    def sim_jobs(self, topology, gflops_per_core, task_costs=None):
        jobs = []
        for _ in range(self.batch):
            for c, h, w, oc, k, s, p in self.layers:
                oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
                jobs.extend(_conv_gemm_jobs(oc, c * k * k, oh * ow, topology, gflops_per_core,
                                            name=f"conv{c}x{h}x{w}", task_costs=task_costs))
        return jobs


class ModelWorkload(Workload):
    """Whole zoo models (``asymo.models``): images per second at batch 1."""

    name = "models"
    unit = "images/s"
    DEFAULT_MODELS = ("squeezenet",)

    def __init__(self, names=None, batch=1, seed=0):
        self.names = tuple(names or self.DEFAULT_MODELS)
        self.batch = int(batch)
        self.seed = seed
        self._models = None
        self.work = float(self.batch * len(self.names))

    def describe(self):
        return "models: " + ", ".join(self.names) + f" (batch {self.batch})"

    def _zoo(self):
        try:
            from asymo import models
        except ImportError:
            return None
        return models

    def _pool_ok(self):
        return _asymo_attr("Pool") is not None and self._zoo() is not None

    def _baseline_ok(self, name):
        if name != "torch" or _torch() is None or self._zoo() is None:
            return False
        try:
            from asymo.models import torch_backend  # noqa: F401
        except ImportError:
            return False
        return True

    def _load(self):
        if self._models is None:
            zoo = self._zoo()
            if zoo is None:
                raise RuntimeError("the layer zoo (asymo.models) is not available in this build")
            unknown = [n for n in self.names if n not in zoo.names()]
            if unknown:
                raise ValueError(f"unknown zoo model(s) {unknown}; choose from {zoo.names()}")
            rng = np.random.default_rng(self.seed)
            self._models = []
            for n in self.names:
                m = zoo.get(n, seed=self.seed)
                x = rng.standard_normal((self.batch,) + tuple(m.input_shape), dtype=np.float32)
                self._models.append((m, x))
        return self._models

    @contextlib.contextmanager
    def runner(self, policy, topology):
        models = self._load()
        if policy in POOL_POLICIES:
            with _open_pool(topology, policy) as pool:
                def run():
                    for m, x in models:
                        m.run(x, pool=pool)
                yield run
        elif policy == "torch":
            from asymo.models.torch_backend import torch_forward
            with _baseline_threads(policy, topology.cpus):
                def run():
                    for m, x in models:
                        torch_forward(m, x)
                yield run
        else:
            raise ValueError(f"models run on the pool or torch, not {policy!r}")

    def sim_jobs(self, topology, gflops_per_core, task_costs=None):
        jobs = []
        for m, _ in self._load():
            for _ in range(self.batch):      # conv2d runs image by image
                for layer in m.layers:
                    for (M, K, N) in layer.matmul_shapes():
                        jobs.extend(_conv_gemm_jobs(M, K, N, topology, gflops_per_core,
                                                    name=f"{m.name}:{layer.name}",
                                                    task_costs=task_costs))
        return jobs


WORKLOADS = {"spin": SpinWorkload, "matmul": MatmulWorkload, "conv2d": Conv2dWorkload,
             "models": ModelWorkload}


def make_workloads(names, *, quick=True):
    """Workload objects for a list of names (``quick`` keeps each run short)."""
    out = []
    for name in names:
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
        out.append(WORKLOADS[name]() if quick else _full_workload(name))
    return out


def _full_workload(name):
    if name == "spin":
        return SpinWorkload(ntasks=384, iters=100_000)
    if name == "matmul":
        return MatmulWorkload(shapes=((1024, 1024, 1024), (3136, 576, 64), (784, 1152, 128),
                                      (196, 2304, 256)))
    if name == "conv2d":
        return Conv2dWorkload(layers=((64, 56, 56, 64, 3, 1, 1), (128, 28, 28, 128, 3, 1, 1),
                                      (256, 14, 14, 256, 3, 1, 1), (3, 224, 224, 32, 3, 2, 1)))
    if name == "models":
        zoo = ModelWorkload()._zoo()
        return ModelWorkload(names=zoo.names() if zoo is not None else None)
    raise ValueError(name)


# --------------------------------------------------------------------------------------------
# results

@dataclass
class Point:
    """One (workload, policy, core count) measurement or simulation."""

    workload: str
    policy: str
    cores: int
    throughput: float
    unit: str
    time_s: float
    cpus: list
    speedup: float = float("nan")     # over the same policy on one core
    times_s: list = field(default_factory=list)   # the samples the median is taken over
    sim_throughput: Optional[float] = None
    external_load: Optional[float] = None   # median share of the cores others used
    samples_clean: Optional[int] = None     # samples with external load <= the limit
    samples_total: Optional[int] = None

    def to_dict(self):
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class ScalingResult:
    """A whole sweep: points plus what produced them (machine, topology, emulation, mode)."""

    points: list
    mode: str                      # "measured" or "simulated"
    topology: topo.Topology
    meta: dict = field(default_factory=dict)
    workloads: dict = field(default_factory=dict)   # name -> description
    validation: Optional[dict] = None
    calibration: Optional[dict] = None
    workload_objs: list = field(default_factory=list, repr=False, compare=False)

    def _fill_speedups(self):
        base = {(p.workload, p.policy): p.throughput for p in self.points if p.cores == 1}
        for p in self.points:
            b = base.get((p.workload, p.policy))
            p.speedup = p.throughput / b if b else float("nan")

    def series(self):
        """{workload: {policy: [(cores, throughput), ...]}} in core order."""
        out = {}
        for p in self.points:
            out.setdefault(p.workload, {}).setdefault(p.policy, []).append(
                (p.cores, p.throughput))
        for w in out.values():
            for v in w.values():
                v.sort()
        return out

    def label(self):
        if self.mode == "simulated":
            return f"SIMULATED: {self.meta.get('preset') or 'topology'} " \
                   f"({self.topology.to_spec()})"
        emu = self.topology.emulated
        e = (", emulated " + ", ".join(f"cpu{c}@{s:g}" for c, s in sorted(emu.items()))) \
            if emu else ""
        return f"MEASURED on {self.meta.get('cpu_model', 'this machine')} " \
               f"({self.topology.ncpus} cores{e})"

    def table(self):
        """The sweep as a text table: one row per (workload, policy), one column per core
        count, throughput in the workload's unit, then the best speedup over one core."""
        lines = [self.label()]
        if self.mode == "measured":
            m = self.meta
            clean = sum(p.samples_clean or 0 for p in self.points)
            total = sum(p.samples_total or 0 for p in self.points)
            short = [f"{p.workload}/{p.policy}/{p.cores}" for p in self.points
                     if (p.samples_clean or 0) < m.get("repeats", 0)]
            lines.append(f"median of {m.get('repeats')} runs per point (pool policies "
                         f"interleaved) taken while other processes used <= "
                         f"{m.get('max_external_load', 1.0) * 100:.0f}% of the cores: "
                         f"{clean} of {total} runs; 1-min load average "
                         f"{m.get('loadavg_before', float('nan')):.2f} before, "
                         f"{m.get('loadavg_after', float('nan')):.2f} after")
            if short:
                lines.append("too few undisturbed runs (figures less reliable): "
                             + ", ".join(short[:8]) + (" ..." if len(short) > 8 else ""))
            if self.topology.emulated:
                lines.append("note: the emulator slows cores by time-slicing; it emulates "
                             "speed, not cache size.")
        else:
            lines.append("model: " + self.meta.get("model", ""))
        ncores = max((p.cores for p in self.points), default=0)
        cluster_of = [c.name for c in self.topology.clusters for _ in c.cpus]
        for wl, by_policy in self.series().items():
            unit = next(p.unit for p in self.points if p.workload == wl)
            lines.append("")
            lines.append(f"{wl}  [{unit}]  {self.workloads.get(wl, '')}")
            lines.append(f"{'cluster':<10}" + "".join(f"{cluster_of[k - 1][:9]:>10}"
                                                   for k in range(1, ncores + 1)))
            lines.append(f"{'cores':<10}" + "".join(f"{k:>10}" for k in range(1, ncores + 1))
                         + f"{'best/1':>9}")
            for pol, pts in by_policy.items():
                vals = dict(pts)
                row = f"{pol:<10}"
                for k in range(1, ncores + 1):
                    v = vals.get(k)
                    row += f"{_fmt(v):>10}"
                sp = max(v for _, v in pts) / vals[1] if vals.get(1) else float("nan")
                row += f"{sp:>8.2f}x"
                lines.append(row)
        lines.append("")
        lines.append("cores are added fastest cluster first; best/1: best throughput over "
                     "the policy's own 1-core figure.")
        if self.validation:
            lines.append("")
            lines.extend(format_validation(self.validation))
        return "\n".join(lines)

    def to_dict(self):
        d = {"schema": SCHEMA, "mode": self.mode, "label": self.label(),
             "meta": self.meta, "workloads": self.workloads,
             "topology": self.topology.to_dict(),
             "points": [p.to_dict() for p in self.points]}
        if self.validation is not None:
            d["validation"] = self.validation
            d["sim_error"] = dict(self.validation.get("sim_error", {}))
        return d

    def plot(self, path):
        """Write a PNG: one panel per workload, throughput against cores, a line per policy."""
        try:
            import matplotlib
            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from None
        series = self.series()
        n = max(1, len(series))
        ncols = min(n, 2)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.3 * nrows + 0.4),
                                 squeeze=False)
        flat = [ax for row in axes for ax in row]
        for ax in flat[n:]:
            ax.set_visible(False)
        styles = {"asymo": ("tab:red", "o", "-"), "even": ("tab:blue", "s", "--"),
                  "shared": ("tab:green", "^", "-."), "steal": ("tab:purple", "v", ":"),
                  "numpy": ("black", "x", "--"), "torch": ("tab:orange", "d", "--")}
        sim_pts = {(p.workload, p.policy, p.cores): p.sim_throughput for p in self.points
                   if p.sim_throughput is not None}
        acc, bounds = 0, []
        for c in self.topology.clusters[:-1]:
            acc += c.ncpus
            bounds.append(acc + 0.5)
        for ax, (wl, by_policy) in zip(flat, series.items()):
            unit = next(p.unit for p in self.points if p.workload == wl)
            for pol, pts in by_policy.items():
                color, marker, ls = styles.get(pol, (None, ".", "-"))
                xs, ys = zip(*pts)
                label = pol
                if pol == "numpy" and self.mode == "simulated":
                    label = "numpy (model: static even split)"
                ax.plot(xs, ys, marker=marker, linestyle=ls, color=color, label=label)
                sims = [(k, sim_pts.get((wl, pol, k))) for k in xs]
                sims = [(k, v) for k, v in sims if v is not None]
                if sims:
                    sx, sy = zip(*sims)
                    ax.plot(sx, sy, linestyle="none", marker=marker, color=color,
                            markerfacecolor="none", markersize=11, alpha=0.7)
            for b in bounds:
                ax.axvline(b, color="grey", linewidth=0.8, linestyle=":")
            ax.set_title(self.workloads.get(wl, wl)[:70], fontsize=9)
            start = 0.5
            for c in self.topology.clusters:
                ax.text(start + c.ncpus / 2, 0.02, c.name, transform=ax.get_xaxis_transform(),
                        ha="center", va="bottom", fontsize=8, color="grey")
                start += c.ncpus
            ax.set_xlabel("cores (fastest cluster first)")
            ax.set_ylabel(unit)
            ax.set_ylim(bottom=0)
            ax.set_xticks(range(1, self.topology.ncpus + 1))
            ax.set_xlim(0.5, self.topology.ncpus + 0.5)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        title = self.label()
        if self.mode == "measured" and self.topology.emulated:
            period = self.meta.get("emulator_period_s")
            title += ("\nthe emulator slows a core by time-slicing"
                      + (f" (period {period * 1e3:g} ms)" if period else "")
                      + ": speed only, not cache size")
        if sim_pts:
            title += ("\nhollow markers: the simulator, fed only by its calibration (traced "
                      "tasks, availability, co-running), measured in separate runs")
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _fmt(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _machine_meta(topology):
    from asymo.profile import _cpu_model_name
    meta = {"cpu_model": _cpu_model_name(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "usable_cpus": sorted(os.sched_getaffinity(0)),
            "topology_spec": topology.to_spec(),
            "emulated": {str(k): v for k, v in sorted(topology.emulated.items())}}
    torch = _torch()
    if torch is not None:
        meta["torch"] = torch.__version__
    try:
        from threadpoolctl import threadpool_info
        meta["blas"] = [{"internal_api": i.get("internal_api"), "version": i.get("version"),
                         "num_threads": i.get("num_threads")}
                        for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception:  # pragma: no cover - informational only
        pass
    return meta


# --------------------------------------------------------------------------------------------
# measuring

def _loadavg():
    """The 1-minute load average (other users' work shows up here), or None."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return None


def _calls_for(run, min_time):
    """How many calls of ``run`` make a sample of at least ``min_time`` seconds."""
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            run()
        dt = time.perf_counter() - t0
        if dt >= min_time or number >= 1 << 16:
            return number
        number = max(number * 2, int(number * min_time / max(dt, 1e-9) * 1.2))


BASELINE_SETTLE_S = 0.3


DEFAULT_MAX_EXTERNAL = 0.05
MAX_ROUNDS_FACTOR = 4
CALIBRATION_ROUNDS = 8   # at least, when the simulator is calibrated beside a sweep


def _measure_items(items, repeats, min_time, progress, desc="measuring",
                   max_external=DEFAULT_MAX_EXTERNAL, main_cpu=None, between_rounds=None):
    """Time every item until it has ``repeats`` undisturbed samples.

    ``items`` is a list of ``(key, factory, interleave)``; ``factory()`` is a context manager
    giving a zero-argument callable. Items with ``interleave`` (asymo's pools, whose idle
    workers sleep after 200 us) are measured in rounds: each round visits every one of them
    once, the order rotated by one each round, so a drift in machine load (other users,
    thermal) hits them all alike. The others (NumPy's BLAS and torch's OpenMP threads, which
    keep spinning for up to ~0.1 s after a call and would slow whatever runs next) are
    measured afterwards, each in one block between settling pauses.

    Each sample: one warm-up call, then enough calls to last ``min_time`` (the count is fixed
    on the first visit), with the share of the machine other processes used meanwhile
    (:class:`asymo._loadmon.OtherLoad`) and, for pool runs, the time the pool's workers
    spent inside tasks. A sample with more than ``max_external`` is kept but does not count
    as undisturbed; an item is sampled again (up to ``4 * repeats`` times) until it has
    ``repeats`` undisturbed samples. The calling (submitting) thread runs on ``main_cpu``
    while it samples, as an application's main thread would on the fastest core: left to
    float, it would run the Python side of every call on whichever core, slowed or not.
    ``between_rounds()``, when given, is called after every round of the interleaved items
    (a calibration measured in runs of its own, but exposed to the same drift).
    Returns ``{key: [(seconds per call, external share, task seconds per call or None),
    ...]}``.
    """
    from tqdm import tqdm

    from asymo._loadmon import OtherLoad
    mon = OtherLoad()
    samples = {key: [] for key, _, _ in items}
    numbers = {}
    inter = [(k, f) for k, f, i in items if i]
    blocks = [(k, f) for k, f, i in items if not i]
    max_samples = MAX_ROUNDS_FACTOR * repeats

    def clean(key):
        return sum(1 for _, share, _ in samples[key] if share <= max_external)

    def done(key):
        return clean(key) >= repeats or len(samples[key]) >= max_samples

    def sample(key, run):
        with _pinned_thread(main_cpu):
            run()
            if key not in numbers:
                numbers[key] = _calls_for(run, min_time)
            number = numbers[key]
            pool = _OPEN_POOLS[-1] if _OPEN_POOLS else None
            if pool is not None:
                pool.reset_stats()
            snap = mon.snapshot()
            t0 = time.perf_counter()
            for _ in range(number):
                run()
            dt = (time.perf_counter() - t0) / number
            share = mon.share_since(snap)
            busy = None
            if pool is not None:
                busy = sum(w["busy_s"] for w in pool.stats()["workers"]) / number
        samples[key].append((dt, share, busy))

    bar = tqdm(total=len(items) * repeats, desc=desc, unit="run", disable=not progress,
               leave=False)

    def tick(key):
        if bar.n >= bar.total:
            bar.total += 1
        bar.set_postfix_str(" ".join(str(k) for k in key)[:40])
        bar.update(1)

    try:
        rnd = 0
        while True:
            todo = [(k, f) for k, f in inter if not done(k)]
            if not todo:
                break
            shift = rnd % len(todo)
            for key, factory in todo[shift:] + todo[:shift]:
                with factory() as run:
                    sample(key, run)
                tick(key)
            rnd += 1
            if between_rounds is not None:
                between_rounds()
        for key, factory in blocks:
            time.sleep(BASELINE_SETTLE_S)
            with factory() as run:
                while not done(key):
                    sample(key, run)
                    tick(key)
        if blocks:
            time.sleep(BASELINE_SETTLE_S)
    finally:
        bar.close()
    return samples


def _summarize(samples, max_external=DEFAULT_MAX_EXTERNAL):
    """(median seconds, the samples used, their external shares, how many were undisturbed):
    the undisturbed samples when there are any, else all of them."""
    good = [x for x in samples if x[1] <= max_external]
    used = good or list(samples)
    times = [x[0] for x in used]
    return statistics.median(times), times, [x[1] for x in used], len(good)


def _serial_seconds(samples, max_external=DEFAULT_MAX_EXTERNAL):
    """Median time per call spent outside the pool's tasks (the submitting thread's own work:
    Python glue, planning, job submission), over the samples ``_summarize`` would use."""
    good = [x for x in samples if x[1] <= max_external and x[2] is not None]
    used = good or [x for x in samples if x[2] is not None]
    if not used:
        return 0.0
    return max(0.0, statistics.median(t - busy for t, _, busy in used))


def _policies_for(workload, policies):
    have = workload.policies()
    if policies is None:
        return have
    return [p for p in policies if p in have]


def _single_core(topology, ci):
    c = topology.clusters[ci]
    return topo.Topology(clusters=(topo.Cluster(name=c.name, cpus=(c.cpus[0],),
                                                capacity=c.capacity),),
                         source=topology.source, emulated=topology.emulated)


def _calibration_items(topology, workloads):
    """What the simulator needs to model ``workloads`` here (see :func:`calibrate_sim`)."""
    items = []
    for wl in workloads:
        for ci in range(topology.nclusters):
            one = _single_core(topology, ci)
            items.append((("cal", wl.name, ci),
                          lambda wl=wl, one=one: wl.runner("asymo", one), True))
    _, noop = _spin_cfunc()
    nw = topology.ncpus
    for pol in POOL_POLICIES:
        for size, ntasks in (("small", nw), ("big", 64 * nw)):
            @contextlib.contextmanager
            def factory(pol=pol, ntasks=ntasks):
                with _open_pool(topology, pol) as pool:
                    yield lambda: pool.parallel_for(_fn_arg(noop), ntasks)
            items.append((("cal", "noop", pol, size), factory, True))
    return items


def _sim_seconds_at_1gflops(wl, topology):
    """Simulated single-core seconds of one run of ``wl`` at 1 GFLOP/s (its modelled work)."""
    one = _single_core(topology, 0)
    return sum(float(j.costs.sum()) for j in wl.sim_jobs(one, [1.0]))


def _calibration_from(samples, topology, workloads, max_external=DEFAULT_MAX_EXTERNAL):
    """Per workload: the run time on one core of each cluster, hence each cluster's rate on
    the workload's modelled work; per policy: scheduling overheads from no-op jobs."""
    per = {}
    for wl in workloads:
        t = [_summarize(samples[("cal", wl.name, ci)], max_external)[0]
             for ci in range(topology.nclusters)]
        # the fastest core's run time splits into time inside the pool's tasks and the
        # submitting thread's serial work; rates come from the time inside tasks
        serial = _serial_seconds(samples[("cal", wl.name, 0)], max_external)
        inside = [max(x - serial, 1e-12) for x in t]
        work = _sim_seconds_at_1gflops(wl, topology)
        per[wl.name] = {"time_s": t, "serial_s": serial,
                        "gflops_per_core": [work / x for x in inside],
                        "speeds": [inside[0] / x for x in inside]}
    overheads = {}
    for pol in POOL_POLICIES:
        small = _summarize(samples[("cal", "noop", pol, "small")], max_external)[0]
        big = _summarize(samples[("cal", "noop", pol, "big")], max_external)[0]
        # a job of nw no-op tasks costs job + one take per worker; of 64*nw, job + at most 64
        # takes per worker (chunking merges takes: an upper bound on the per-take cost)
        per_take = max(0.0, (big - small) / 63.0)
        overheads[pol] = {"job": max(0.0, small - per_take), "task": per_take,
                          "steal": per_take, "small_s": small, "big_s": big}
    return {"workloads": per, "overheads": overheads}


def measure_scaling(workloads, *, policies=None, topology=None, max_cores=None, repeats=5,
                    min_time=0.02, progress=True, calibrate=False,
                    max_external=DEFAULT_MAX_EXTERNAL, emulator_period=None):
    """Measure throughput at 1 .. ncpus cores (fastest cluster first) on this machine.

    Parameters
    ----------
    workloads : sequence of Workload
    policies : sequence of str, optional
        Subset of ``POOL_POLICIES + BASELINES``; default: every one available for each workload
        (policies a workload cannot run, e.g. torch when absent, are skipped).
    topology : Topology, optional
        Default ``asymo.topology.detect()`` (which sees the emulator's override).
    max_cores : int, optional
        Stop at this many cores.
    repeats : int
        Samples per point (pool policies interleaved over all points, baselines in blocks;
        see ``_measure_items``); the median is reported.
    min_time : float
        Each sample lasts at least this long (seconds).
    progress : bool
        Show a tqdm progress bar on stderr.
    calibrate : bool
        Also measure what the simulator needs to model the workloads here (see
        :mod:`asymo.sim.calibrate`), in runs of its own: one calibration round after each
        round of the sweep (at least ``CALIBRATION_ROUNDS``), so that a drift in the
        machine's speed hits the calibration and the points alike; stored as
        ``result.calibration``, used by :func:`validate_sim`.
    max_external : float
        A sample during which other processes used more than this share of the machine's
        cores counts as disturbed: points are re-sampled (up to 4x ``repeats``) until they
        have ``repeats`` undisturbed samples, and the median is over those (over all samples
        when none was undisturbed; ``Point.samples_clean`` says which). 1.0 keeps everything.
    emulator_period : float, optional
        Seconds per period of the emulator the topology runs under (recorded in the meta
        data, used by the calibration and :func:`validate_sim`); default: the running
        emulator's (env ``ASYMO_EMULATED_PERIOD``), else ``asymo.emulate.DEFAULT_PERIOD``.

    Returns
    -------
    ScalingResult
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if min_time < 0:
        raise ValueError(f"min_time must be >= 0, got {min_time}")
    topology = topology if topology is not None else topo.detect()
    ncores = topology.ncpus if max_cores is None else min(int(max_cores), topology.ncpus)
    if ncores < 1:
        raise ValueError(f"max_cores must be >= 1, got {max_cores}")
    items, meta = [], {}
    for wl in workloads:
        for pol in _policies_for(wl, policies):
            for k in range(1, ncores + 1):
                sub = first_cores(topology, k)
                items.append(((wl.name, pol, k),
                              lambda wl=wl, pol=pol, sub=sub: wl.runner(pol, sub),
                              pol in POOL_POLICIES))
                meta[(wl.name, pol, k)] = (wl, sub)
    if not items:
        raise RuntimeError("nothing to measure: none of the requested policies can run the "
                           "requested workloads in this build")
    pool_workloads = [wl for wl in workloads
                      if any(p in POOL_POLICIES for p in _policies_for(wl, policies))]
    calibration = None
    calibrator = contextlib.nullcontext()
    if calibrate:
        # the simulator's inputs, measured in runs of their own, one calibration round
        # after each of the sweep's rounds (drift in the machine's speed hits both alike)
        from asymo.sim.calibrate import SimCalibrator
        items += [it for it in _calibration_items(topology, []) if it[0][1] == "noop"]
        calibrator = SimCalibrator(topology, pool_workloads, emulator_period=emulator_period,
                                   max_external=max_external)
    load_before = _loadavg()
    with calibrator as cal:
        samples = _measure_items(items, repeats, min_time, progress, desc="scaling",
                                 max_external=max_external, main_cpu=topology.cpus[0],
                                 between_rounds=cal.round if calibrate else None)
        if calibrate:
            while cal.rounds < CALIBRATION_ROUNDS:
                cal.round()
            overheads = _calibration_from(samples, topology, [], max_external)["overheads"]
            calibration = cal.result(overheads, interleaved=True)
    load_after = _loadavg()
    points = []
    for key, (wl, sub) in meta.items():
        med, times, shares, nclean = _summarize(samples[key], max_external)
        points.append(Point(workload=wl.name, policy=key[1], cores=key[2],
                            throughput=wl.throughput(med), unit=wl.unit, time_s=med,
                            cpus=list(sub.cpus), times_s=times,
                            external_load=statistics.median(shares),
                            samples_clean=nclean, samples_total=len(samples[key])))
    res = ScalingResult(points=points, mode="measured", topology=first_cores(topology, ncores),
                        meta=_machine_meta(topology) | {"repeats": repeats,
                                                        "min_time_s": min_time,
                                                        "interleaved": True,
                                                        "max_external_load": max_external,
                                                        "loadavg_before": load_before,
                                                        "loadavg_after": load_after},
                        workloads={wl.name: wl.describe() for wl in workloads})
    res.workload_objs = list(workloads)
    if topology.emulated:
        if emulator_period is None:
            from asymo.sim.calibrate import _default_period
            emulator_period = _default_period()
        res.meta["emulator_period_s"] = emulator_period
    res.calibration = calibration
    res._fill_speedups()
    return res


# --------------------------------------------------------------------------------------------
# simulating

def _numpy_model_jobs(jobs, k):
    """OpenBLAS's static split: each job becomes k equal contiguous chunks, one per thread."""
    out = []
    for j in jobs:
        if j.costs.ndim == 1:
            out.append(Job(costs=np.full(k, j.costs.sum() / k), name=j.name))
        else:
            out.append(Job(costs=np.tile(j.costs.sum(axis=0) / k, (k, 1)), name=j.name))
    return out


def parse_interference(text):
    """Parse ``"4:0.5"`` / ``"4:0.5:2:10,5:0"`` into Interference windows.

    Each item is ``CPU:SPEED[:START_MS:STOP_MS]``: the core runs at ``SPEED`` of its speed
    from START to STOP milliseconds after the start of each simulated run (the whole run when
    omitted).
    """
    from asymo.sim.engine import Interference
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) == 2:
                out.append(Interference(cpu=int(parts[0]), speed=float(parts[1])))
            elif len(parts) == 4:
                out.append(Interference(cpu=int(parts[0]), speed=float(parts[1]),
                                        start=float(parts[2]) / 1e3,
                                        stop=float(parts[3]) / 1e3))
            else:
                raise ValueError("expected CPU:SPEED or CPU:SPEED:START_MS:STOP_MS")
        except ValueError as exc:
            raise ValueError(f"bad interference item {item.strip()!r}: {exc}") from None
    return out


def simulate_scaling(target, workloads, *, policies=None, overheads=None, speeds=None,
                     gflops_per_core=None, max_cores=None, interference=(), corun=None,
                     progress=False, cost_models=None):
    """The scaling sweep from the simulator instead of the machine.

    Parameters
    ----------
    target : str, Preset or Topology
        A preset name (``asymo.sim.preset_names()``) or a topology.
    workloads : sequence of Workload
    policies : sequence of str, optional
        Pool policies, plus ``"numpy"`` modelled as OpenBLAS's static split (one equal range
        per thread). Default: the four pool policies and numpy.
    overheads : Overheads, optional
        Default ``DEFAULT_SIM_OVERHEADS``.
    speeds : sequence of float, optional
        True per-cluster speeds (default: the capacities).
    gflops_per_core : sequence of float, optional
        Per-cluster FP32 rate; default: the preset's, or 10 GFLOP/s x capacity.
    interference : sequence of Interference
        Cores slowed in every simulated run (windows on cores not yet added are ignored).
    corun : float, optional
        Co-running interference (:class:`asymo.sim.CoRunning`): a core's speed while one
        other core runs tasks, all cores sharing one resource. Default: none (an assumption
        for a preset: measure it on the device with ``--calibrate-sim``).
    cost_models : ModelCosts, Calibration, str or path, optional
        Price GEMM tasks with AsyMo's cost model instead of ``gflops_per_core``: the models
        (`asymo.sim.costs.ModelCosts`), a parsed profile section
        (`asymo.calibration.Calibration`) or a calibration profile file (``asymo
        calibrate``, e.g. run on the device) whose clusters must match the target's
        (ValueError naming the mismatch otherwise). Work the models do not cover keeps the
        capabilities; ``meta["task_costs"]`` says which jobs came from where
        (`asymo.sim.costs`).
    """
    from asymo.sim.presets import Preset, get_preset
    if isinstance(target, str):
        target = get_preset(target)
    if isinstance(target, Preset):
        preset_name, topology = target.name, target.topology
        rates = list(gflops_per_core or target.gflops_per_core)
    elif isinstance(target, topo.Topology):
        preset_name, topology = None, target
        rates = list(gflops_per_core or [10.0 * c.capacity for c in topology.clusters])
    else:
        raise TypeError(f"target must be a preset name, Preset or Topology, not "
                        f"{type(target).__name__}")
    if len(rates) != topology.nclusters:
        raise ValueError(f"gflops_per_core has {len(rates)} entries for "
                         f"{topology.nclusters} clusters")
    if speeds is not None:
        # True speeds differ from the capacities: scale each cluster's rate accordingly.
        speeds = list(speeds)
        if len(speeds) != topology.nclusters:
            raise ValueError(f"speeds has {len(speeds)} entries for {topology.nclusters} "
                             "clusters")
        rates = [rates[0] * s for s in speeds]
    overheads = overheads if overheads is not None else DEFAULT_SIM_OVERHEADS
    pols = list(policies) if policies is not None else list(POOL_POLICIES) + ["numpy"]
    bad = [p for p in pols if p not in POOL_POLICIES and p != "numpy"]
    if bad:
        raise ValueError(f"the simulator models the pool policies and 'numpy', not {bad}")
    ncores = topology.ncpus if max_cores is None else min(int(max_cores), topology.ncpus)
    if cost_models is not None:
        from asymo.sim.costs import model_costs_for
        cost_models = model_costs_for(cost_models, topology)
    from tqdm import tqdm
    points = []
    plan = [(wl, pol, k) for wl in workloads for pol in pols for k in range(1, ncores + 1)]
    for wl, pol, k in tqdm(plan, desc="simulating", unit="pt", disable=not progress,
                           leave=False):
        sub = first_cores(topology, k)
        sub_rates = rates[:sub.nclusters]
        jobs = (wl.sim_jobs(sub, sub_rates) if cost_models is None
                else wl.sim_jobs(sub, sub_rates, task_costs=cost_models))
        itf = [i for i in interference if i.cpu in sub.cpus]
        if corun is not None and k > 1:
            from asymo.sim.engine import CoRunning
            itf.append(CoRunning(factor=corun))
        if pol == "numpy":
            jobs = _numpy_model_jobs(jobs, k)
            res = simulate(sub, jobs, policy="even", overheads=overheads, interference=itf)
        else:
            res = simulate(sub, jobs, policy=pol, overheads=overheads, interference=itf)
        points.append(Point(workload=wl.name, policy=pol, cores=k,
                            throughput=wl.throughput(res.makespan), unit=wl.unit,
                            time_s=res.makespan, cpus=list(sub.cpus)))
    res = ScalingResult(points=points, mode="simulated", topology=first_cores(topology, ncores),
                        meta={"preset": preset_name, "gflops_per_core": rates,
                              "overheads_s": overheads.to_dict(),
                              "corun_factor": corun,
                              "interference": [{"cpu": i.cpu, "speed": i.speed,
                                                "start_s": i.start,
                                                "stop_s": i.stop if math.isfinite(i.stop)
                                                else None} for i in interference],
                              "model": "discrete-event simulation of the pool (asymo.sim); "
                                       "compute only: no caches or memory bandwidth; 'numpy' "
                                       "modelled as a static equal split; "
                                       + (cost_models.describe() if cost_models is not None
                                          else "task costs: capabilities (gflops_per_core)"),
                              "task_costs": (cost_models.to_dict() if cost_models is not None
                                             else "capabilities")},
                        workloads={wl.name: wl.describe() for wl in workloads})
    res._fill_speedups()
    return res


# --------------------------------------------------------------------------------------------
# validating the simulator against this machine

SIM_PHASES = 4   # emulator phases averaged over (the stops' offset from the run's start)
# A validated sample is simulated as calls back to back (the sweep times them so: a call's
# duty-cycle phase follows from the previous one's end), enough to cover this many emulator
# periods, at most SIM_BACK_TO_BACK_MAX calls (speed).
SIM_BACK_TO_BACK_PERIODS = 40
SIM_BACK_TO_BACK_MAX = 32


def _duty_cycles(topology, period):
    """The emulator's stops on ``topology``'s emulated cores: core ``cpu`` at speed ``s`` is
    stopped for ``1 - s`` of every period (see :class:`asymo.sim.DutyCycle`)."""
    from asymo.sim.engine import DutyCycle
    return [DutyCycle(cpu=cpu, busy=1.0 - s, period=period)
            for cpu, s in sorted(topology.emulated.items())
            if cpu in topology.cpus and s < 1.0]


def _phased(interference, i, n):
    """The interference list with every duty cycle's periods shifted by ``i / n`` of a
    period (other kinds unchanged)."""
    from asymo.sim.engine import DutyCycle
    return [DutyCycle(cpu=d.cpu, busy=d.busy, period=d.period, phase=d.period * i / n)
            if isinstance(d, DutyCycle) else d for d in interference]


def back_to_back_calls(one_call_s, period):
    """How many calls of ``one_call_s`` seconds a back-to-back sample is simulated as: enough
    to cover ``SIM_BACK_TO_BACK_PERIODS`` emulator periods, 1 to ``SIM_BACK_TO_BACK_MAX``."""
    if not (one_call_s > 0 and math.isfinite(one_call_s)):
        return 1
    return int(min(SIM_BACK_TO_BACK_MAX,
                   max(1, math.ceil(SIM_BACK_TO_BACK_PERIODS * period / one_call_s))))


def _sim_mean(topology, jobs, policy, overheads, interference, *, back_to_back=False):
    """Simulated makespan of one call (the job sequence ``jobs``), averaged over SIM_PHASES
    offsets of the emulator's periods. ``back_to_back``: the call is simulated ``R`` times
    in a row in one simulation (:func:`back_to_back_calls`; each call's jobs with their
    traced delays, so that the gap between calls is the submitter's own work and the
    duty-cycle phase carries over from one call to the next, as when the sweep times calls
    back to back), and the makespan is the total over ``R``; ``res.calls`` says ``R``."""
    from asymo.sim.engine import DutyCycle
    duties = [d for d in interference if isinstance(d, DutyCycle)]
    if not duties:
        res = simulate(topology, jobs, policy=policy, overheads=overheads,
                       interference=interference)
        res.calls = 1
        return res
    runs = [simulate(topology, jobs, policy=policy, overheads=overheads,
                     interference=_phased(interference, i, SIM_PHASES))
            for i in range(SIM_PHASES)]
    reps = 1
    if back_to_back:
        one = statistics.fmean(r.makespan for r in runs)
        reps = back_to_back_calls(one, max(d.period for d in duties))
        if reps > 1:
            runs = [simulate(topology, list(jobs) * reps, policy=policy, overheads=overheads,
                             interference=_phased(interference, i, SIM_PHASES))
                    for i in range(SIM_PHASES)]
    res = runs[0]
    res.makespan = statistics.fmean(r.makespan for r in runs) / reps
    res.calls = reps
    return res


def _trace_cpus(topology):
    """Where each cluster's task costs are traced: on an emulated machine every cluster on
    the first un-slowed core (the cores are alike; the slowdown is modelled as the
    emulator's stops), else on each cluster's own first core."""
    if topology.emulated:
        fast = [c for c in topology.cpus if topology.emulated.get(c, 1.0) >= 1.0]
        return [fast[0] if fast else topology.cpus[0]] * topology.nclusters
    return [c.cpus[0] for c in topology.clusters]


def _noop_overheads(cal, topology, duties):
    """Per-policy overheads: the no-op job times less what the model already explains (the
    emulator's stops delay a job whose tasks wait for a stopped core)."""
    nw = topology.ncpus
    ncl = topology.nclusters
    out = {}
    for pol, o in cal["overheads"].items():
        small, big = o.get("small_s"), o.get("big_s")
        if small is None or not duties:
            out[pol] = o
            continue
        zero = [Job(costs=np.zeros((n, ncl)), name="noop") for n in (nw, 64 * nw)]
        s_small = _sim_mean(topology, zero[:1], pol, Overheads(), duties).makespan
        s_big = _sim_mean(topology, zero[1:], pol, Overheads(), duties).makespan
        per_take = max(0.0, ((big - s_big) - (small - s_small)) / 63.0)
        out[pol] = {"job": max(0.0, small - s_small - per_take), "task": per_take,
                    "steal": per_take}
    return out


def validate_sim(measured, *, calibration=None, topology=None, workloads=None, repeats=5,
                 min_time=0.02, emulator_period=None):
    """Compare the simulator with a measured sweep of this machine, workload by workload.

    The simulator is given only a calibration (:mod:`asymo.sim.calibrate`, measured in runs
    separate from the sweep: ``calibration``, else ``measured.calibration``, else measured
    now): each workload's real job sequence traced task by task as each cluster with the
    submitting thread's work between jobs; on an emulated machine the emulator's duty cycle
    (an emulated core at speed ``s`` is stopped for ``1 - s`` of every ``emulator_period``
    plus the time per period the workload was measured to lose beyond that), each sample
    simulated as calls back to back (the duty-cycle phase carried from call to call, as the
    sweep times them; :func:`back_to_back_calls`) and averaged over ``SIM_PHASES`` starting
    offsets; the workload's co-running interference factor; per-policy overheads from no-op
    jobs; the submitter's measured wake-up, charged to a job whose last task ends past the
    submitter's spin (``Overheads.wake``). The measured multi-core throughputs are what it must
    reproduce.

    ``emulator_period`` is the period of the emulator the sweep ran under (default: the
    sweep's ``meta["emulator_period_s"]``, else the running emulator's
    ``ASYMO_EMULATED_PERIOD``, else ``asymo.emulate.DEFAULT_PERIOD``); a
    calibration measured at another period is carried over through its time lost per
    period.

    Fills ``sim_throughput`` on the measured pool-policy points and returns (and stores on
    ``measured``) a dict with per-point errors and, per workload, ``sim_error`` per policy:
    the relative error at the largest core count, and ``sim_error_duty_only``: the same
    simulation with the nominal duty cycle and no co-running interference (what the inputs
    beyond the traces change). The top-level ``sim_error`` is the spin workload's
    (scheduling alone), or the first workload's when spin was not measured;
    ``sim_error_by_workload`` has them all.
    """
    topology = topology if topology is not None else measured.topology
    workloads = list(workloads or measured.workload_objs or [])
    byname = {wl.name: wl for wl in workloads}
    pts = [p for p in measured.points if p.policy in POOL_POLICIES and p.workload in byname]
    if not pts:
        raise ValueError("validation needs workloads measured with pool policies")
    names = list(dict.fromkeys(p.workload for p in pts))
    if emulator_period is None:
        emulator_period = measured.meta.get("emulator_period_s")
    if emulator_period is None:
        from asymo.sim.calibrate import _default_period
        emulator_period = _default_period()
    cal = calibration or getattr(measured, "calibration", None)
    if cal is None or any(n not in cal["workloads"] for n in names):
        cal = calibrate_sim(topology, [byname[n] for n in names], repeats=repeats,
                            min_time=min_time, emulator_period=emulator_period)
    duties = _duty_cycles(topology, emulator_period)
    overheads = _noop_overheads(cal, topology, duties)
    from asymo.sim.calibrate import submitter_wake
    wake = submitter_wake(cal)
    out = {}
    for name in names:
        wl = byname[name]
        mine = sorted((p for p in pts if p.workload == name), key=lambda q: (q.policy, q.cores))
        kmax = max(p.cores for p in mine)
        rows, sim_error, sim_error0 = [], {}, {}
        inputs = {}
        for p in mine:
            if p.cores not in inputs:
                inputs[p.cores] = (
                    sim_inputs(cal, name, p.cores, topology, emulator_period=emulator_period),
                    sim_inputs(cal, name, p.cores, topology, emulator_period=emulator_period,
                               corun=False, availability=False))
            (jobs, itf), (_, itf0) = inputs[p.cores]
            sub = first_cores(topology, p.cores)
            o = overheads[p.policy]
            ov = Overheads(job=o["job"], task=o["task"], steal=o["steal"], wake=wake)
            res = _sim_mean(sub, jobs, p.policy, ov, itf, back_to_back=True)
            res0 = _sim_mean(sub, jobs, p.policy, ov, itf0, back_to_back=True)
            sim_tp = wl.throughput(res.makespan)
            p.sim_throughput = sim_tp
            best = wl.throughput(min(p.times_s)) if p.times_s else p.throughput
            rows.append({"policy": p.policy, "cores": p.cores, "measured": p.throughput,
                         "measured_best": best, "simulated": sim_tp,
                         "error": sim_tp / p.throughput - 1.0,
                         "error_vs_best": sim_tp / best - 1.0,
                         "simulated_duty_only": wl.throughput(res0.makespan),
                         "calls_back_to_back": res.calls,
                         "error_duty_only": wl.throughput(res0.makespan) / p.throughput - 1.0,
                         "steals_by_direction": res.steals_by_direction})
            if p.cores == kmax:
                sim_error[p.policy] = rows[-1]["error"]
                sim_error0[p.policy] = rows[-1]["error_duty_only"]
        # diagnostic: the error of the predicted speedup over the policy's own 1-core point
        # (the level of a run drifts with the machine's load between the calibration and
        # the sweep; the scaling is what the multi-core model adds)
        one = {r["policy"]: r for r in rows if r["cores"] == 1}
        for r in rows:
            b = one.get(r["policy"])
            r["error_speedup"] = ((r["simulated"] / b["simulated"]) /
                                  (r["measured"] / b["measured"]) - 1.0) if b else None
        jobs = inputs[kmax][0][0]
        entry = cal["workloads"][name]
        out[name] = {"unit": wl.unit, "jobs": len(jobs) - 1,
                     "tasks": int(sum(j.ntasks for j in jobs)),
                     "serial_s": float(sum(j.delay for j in jobs)),
                     "availability": {c: a["availability"]
                                      for c, a in entry.get("emulated", {}).items()},
                     "corun_factor": entry.get("corun", {}).get("factor"),
                     "points": rows, "sim_error": sim_error,
                     "sim_error_duty_only": sim_error0,
                     "max_abs_error": max(abs(r["error"]) for r in rows)}
    primary = "spin" if "spin" in out else names[0]
    val = {"workloads": out, "primary": primary, "sim_error": dict(out[primary]["sim_error"]),
           "sim_error_by_workload": {n: dict(w["sim_error"]) for n, w in out.items()},
           "max_abs_error": max(w["max_abs_error"] for w in out.values()), "tolerance": 0.10,
           "calibration": cal,
           "model": {"task_costs": "traced (asymo.sim.trace), per task and cluster, medians "
                                   "of runs separate from the sweep",
                     "emulator": [{"cpu": d.cpu, "stopped": d.busy, "period_s": d.period}
                                  for d in duties],
                     "emulator_period_s": emulator_period if duties else None,
                     "phases": SIM_PHASES if duties else 1,
                     "back_to_back": {"periods": SIM_BACK_TO_BACK_PERIODS,
                                      "max_calls": SIM_BACK_TO_BACK_MAX} if duties else None,
                     "submitter_wake_s": wake,
                     "overheads_s": overheads}}
    measured.validation = val
    return val


def format_validation(val):
    model = val.get("model", {})
    emu = ", ".join(f"cpu {e['cpu']} stopped {e['stopped']:.0%} of every "
                    f"{e['period_s'] * 1e3:g} ms" for e in model.get("emulator", []))
    lines = ["simulator vs measurement. The simulator is given only the calibration, measured "
             "in runs separate from the points predicted: each workload's pool jobs traced "
             "task by task as each cluster with the submitting thread's work between jobs; "
             "no-op jobs for the overheads; the workload's co-running factor"
             + (f"; the emulator's duty cycle ({emu}) plus the time per period the workload "
                "loses beyond it" if emu else "") + "."]
    cal = val.get("calibration")
    if cal and cal.get("schema"):
        lines.extend(format_calibration(cal))
    for name, w in val["workloads"].items():
        lines.append("")
        av = ", ".join(f"cpu {c} {a:.3f}" for c, a in w.get("availability", {}).items())
        cr = w.get("corun_factor")
        lines.append(f"{name} [{w['unit']}]  {w.get('jobs', 0)} pool jobs, "
                     f"{w.get('tasks', 0)} tasks per run; submitting thread's own work "
                     f"{w.get('serial_s', 0.0) * 1e3:.2f} ms per run"
                     + (f"; availability {av}" if av else "")
                     + (f"; co-running factor {cr:.3f}" if cr is not None else ""))
        lines.append(f"{'policy':<10}{'cores':>6}{'measured':>12}{'simulated':>12}"
                     f"{'error':>9}{'best run':>12}{'error':>9}{'duty only':>11}"
                     f"{'speedup':>10}")
        for r in w["points"]:
            sp = r.get("error_speedup")
            lines.append(f"{r['policy']:<10}{r['cores']:>6}{_fmt(r['measured']):>12}"
                         f"{_fmt(r['simulated']):>12}{r['error'] * 100:>8.1f}%"
                         f"{_fmt(r['measured_best']):>12}{r['error_vs_best'] * 100:>8.1f}%"
                         f"{r.get('error_duty_only', float('nan')) * 100:>10.1f}%"
                         + (f"{sp * 100:>9.1f}%" if sp is not None and r["cores"] > 1
                            else f"{'':>10}"))
        ok = "within" if w["max_abs_error"] <= val["tolerance"] else "OUTSIDE"
        lines.append(f"largest |error| {w['max_abs_error'] * 100:.1f}% ({ok} the "
                     f"{val['tolerance'] * 100:.0f}% target)")
    lines.append("error = (simulated - measured) / measured, measured = median of the "
                 "undisturbed runs; best run = the fastest run; duty only = the error of the "
                 "simulator without the measured availability and co-running factor (nominal "
                 "duty cycle, cores independent); speedup = the error of the simulated "
                 "speedup over the same policy's 1-core point (a diagnostic: it takes the "
                 "sweep's own 1-core figure as the level).")
    return lines
