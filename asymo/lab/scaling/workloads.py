"""What the scaling benchmark runs at every core count: :class:`Workload` and its kinds
(``spin``, ``matmul``, ``conv2d``, ``models``), each with runners per pool policy and baseline
and the same work as simulator jobs."""
from __future__ import annotations

import contextlib
import math

import numpy as np

from asymo.lab.machine import asymo_attr, baseline_threads, open_pool, torch_module
from asymo.lab.sim.engine import Job
from asymo.runtime.pool import POLICIES

#: the pool's scheduling policies (the C library's ``ASYMO_POLICY_*``, via asymo.runtime.pool)
POOL_POLICIES = tuple(POLICIES)
#: other libraries' thread pools a workload can run on, for comparison
BASELINES = ("numpy", "torch")


class Workload:
    """One thing to run at every core count.

    Subclasses define ``name``, ``unit`` ("GFLOP/s" or "images/s"), ``work`` (FLOPs or images
    per run), ``policies()`` (which runners exist here), ``runner(policy, topology)`` (a
    context manager giving a zero-argument callable that runs the workload once) and
    ``sim_jobs(topology, gflops_per_core, task_costs=None)`` (the same work as simulator
    jobs; ``task_costs``, an `asymo.lab.sim.costs.ModelCosts`, prices GEMM tasks by the cost
    model instead of the per-cluster rate where it covers them).
    """

    name = ""
    unit = "GFLOP/s"

    def policies(self):
        return [p for p in POOL_POLICIES if self._pool_ok()] + \
            [b for b in BASELINES if self._baseline_ok(b)]

    def _pool_ok(self):
        return asymo_attr("Pool") is not None

    def _baseline_ok(self, name):
        return False

    def throughput(self, seconds):
        scale = 1e-9 if self.unit == "GFLOP/s" else 1.0
        return self.work * scale / seconds

    def describe(self):
        return self.name

    def independent_copy(self):
        """A workload doing the same work that can run beside this one (no buffer shared)."""
        return self


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

        _SPIN_FN = spin
    return _SPIN_FN


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
        spin = _spin_cfunc()
        buf = np.zeros(2 + self.ntasks)
        buf[0] = self.iters
        ctx = buf.ctypes.data
        with open_pool(topology, policy) as pool:
            yield lambda: pool.parallel_for(spin, self.ntasks, ctx=ctx)

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

    With the GEMM planner available (``asymo.plan.gemm``), its plan for ``topology`` gives the
    per-cluster task counts and ranges: each cluster's share of the FLOPs is spread evenly
    over its tasks (edge blocks are not modelled), and the job carries the plan's counts as
    its split. Without it, row tiles sized to the fastest cluster's L2 (``_gemm_tiles``).
    ``task_costs`` (`asymo.lab.sim.costs.ModelCosts`): the plan's tasks priced by the cost model
    where it covers the plan.
    """
    try:
        from asymo.plan.gemm import plan_gemm
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
        from asymo.ops.conv import COL_CHUNK_BYTES
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

    def independent_copy(self):
        # the products write into the operands' output buffers
        return MatmulWorkload(shapes=self.shapes)

    def _pool_ok(self):
        return asymo_attr("Pool") is not None and asymo_attr("matmul") is not None

    def _baseline_ok(self, name):
        return name == "numpy" or torch_module() is not None

    @contextlib.contextmanager
    def runner(self, policy, topology):
        if policy in POOL_POLICIES:
            matmul = asymo_attr("matmul")
            with open_pool(topology, policy) as pool:
                def run():
                    for a, b, out in self.operands:
                        matmul(a, b, out=out, pool=pool)
                yield run
        elif policy == "numpy":
            with baseline_threads(policy, topology.cpus):
                def run():
                    for a, b, out in self.operands:
                        np.matmul(a, b, out=out)
                yield run
        elif policy == "torch":
            torch = torch_module()
            ops = [(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(o))
                   for a, b, o in self.operands]
            with baseline_threads(policy, topology.cpus):
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


def im2col_conv(x, w, stride, padding):
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
        return asymo_attr("Pool") is not None and asymo_attr("conv2d") is not None

    def _baseline_ok(self, name):
        return name == "numpy" or torch_module() is not None

    @contextlib.contextmanager
    def runner(self, policy, topology):
        if policy in POOL_POLICIES:
            conv2d = asymo_attr("conv2d")
            with open_pool(topology, policy) as pool:
                def run():
                    for x, w, s, p in self.operands:
                        conv2d(x, w, stride=s, padding=p, pool=pool)
                yield run
        elif policy == "numpy":
            with baseline_threads(policy, topology.cpus):
                def run():
                    for x, w, s, p in self.operands:
                        im2col_conv(x, w, s, p)
                yield run
        elif policy == "torch":
            torch = torch_module()
            import torch.nn.functional as F
            ops = [(torch.from_numpy(x), torch.from_numpy(w), s, p)
                   for x, w, s, p in self.operands]
            with baseline_threads(policy, topology.cpus):
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
        return asymo_attr("Pool") is not None and self._zoo() is not None

    def _baseline_ok(self, name):
        if name != "torch" or torch_module() is None or self._zoo() is None:
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
            with open_pool(topology, policy) as pool:
                def run():
                    for m, x in models:
                        m.run(x, pool=pool)
                yield run
        elif policy == "torch":
            from asymo.models.torch_backend import torch_forward
            with baseline_threads(policy, topology.cpus):
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
