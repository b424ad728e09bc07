"""GFLOP/s of asymo.matmul and numpy.matmul measured side by side, on the DL shape set.

Run it alone on the machine (other benchmarks would disturb it)::

    flock /tmp/asymo-bench.lock python3 bench/matmul_gflops.py            # both modes
    flock /tmp/asymo-bench.lock python3 bench/matmul_gflops.py --mode symmetric --quick

Shapes (float32, numpy.matmul orientation ``(M, K) @ (K, N)``):

* MM: AsyMo's calibration set takes 15 MM sizes from the conv layers of VGG-16 and
  MobileNet V1 (paper 003, section 5) without listing them. They are derived here as the
  im2col GEMMs of those layers at 224 x 224, batch 1: M = output pixels, K = Cin * kh * kw,
  N = Cout. All 9 distinct VGG-16 conv shapes, and 6 MobileNet V1 ones: the first 3x3 conv and
  five pointwise convs spanning its resolutions.
* MV: the paper's 20 MV sizes, (M, K) @ (K,) with M in {256, ..., 2048} and K in
  {128, ..., 2048}, powers of two ("within range (256, 2048) and (124, 2048)").
* 1024^3.

Modes:

* ``onecore``: every library on the first core with one thread (caller pinned): asymo on a
  one-worker pool there, NumPy/OpenBLAS and torch limited to one thread.
* ``symmetric``: asymo on its default pool (every core) against NumPy/OpenBLAS limited to the
  same number of threads (threadpoolctl).
* ``emulated``: core ``--core`` runs at ``--speed`` (`asymo.lab.emulate.slow_cores`: a SCHED_FIFO
  occupier takes the rest of it). asymo runs on the emulated topology (capacities 1 and speed)
  against NumPy on all cores and against asymo on the fast core alone (its pool and the
  calling thread pinned there). The emulator slows a core's speed, not its caches.

In every mode the baselines also include NumPy and torch (when installed) on the fast core alone
(pinned, one thread: ``numpy_1``, ``torch_1``) and torch on all cores; ``best`` is the ratio
against the fastest baseline of each round (the best choice a user has). Thread limits are set
once around each timing loop, never inside it.

Each round times every contender on the shape in turn (after a pause that lets the previous
contender's idle threads stop spinning). GFLOP/s are medians over ``--rounds`` rounds; a ratio
is the median over rounds of time(baseline) / time(asymo) within the round, so load from other
jobs, which drifts slowly, hits both sides of each ratio alike. Above 1 means asymo is faster.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import asymo  # noqa: E402
from asymo.plan import gemm as gemm_plan  # noqa: E402
from asymo.runtime.pool import Pool  # noqa: E402
from asymo.hw.topology import Cluster, Topology  # noqa: E402

MM_SHAPES = [
    # name, M, K, N
    ("vgg16.conv1_1", 50176, 27, 64),
    ("vgg16.conv1_2", 50176, 576, 64),
    ("vgg16.conv2_1", 12544, 576, 128),
    ("vgg16.conv2_2", 12544, 1152, 128),
    ("vgg16.conv3_1", 3136, 1152, 256),
    ("vgg16.conv3_2", 3136, 2304, 256),
    ("vgg16.conv4_1", 784, 2304, 512),
    ("vgg16.conv4_2", 784, 4608, 512),
    ("vgg16.conv5_x", 196, 4608, 512),
    ("mobilenet.conv1", 12544, 27, 32),
    ("mobilenet.pw1", 12544, 32, 64),
    ("mobilenet.pw2", 3136, 64, 128),
    ("mobilenet.pw4", 784, 128, 256),
    ("mobilenet.pw6", 196, 256, 512),
    ("mobilenet.pw13", 49, 1024, 1024),
]
MV_SHAPES = [(f"mv.{m}x{k}", m, k, 1) for m in (256, 512, 1024, 2048)
             for k in (128, 256, 512, 1024, 2048)]
CUBE = [("cube.1024", 1024, 1024, 1024)]
#: seconds between contenders (see measure)
SETTLE = 0.15
QUICK = {"vgg16.conv2_2", "vgg16.conv3_2", "vgg16.conv4_2", "vgg16.conv5_x", "mobilenet.pw2",
         "mobilenet.pw6", "mv.256x128", "mv.512x1024", "mv.1024x512", "mv.2048x2048",
         "cube.1024"}


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def _per_call(fn, target):
    """Seconds per call of fn, timing enough calls to fill about ``target`` seconds."""
    if isinstance(fn, _Limited):
        with fn.limit():
            return _per_call(fn.fn, target)
    if isinstance(fn, _Pinned):
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, fn.cpus)
        try:
            return _per_call(fn.fn, target)
        finally:
            os.sched_setaffinity(0, saved)
    # warm up (threads that went to sleep during the pause wake on the first calls), then size
    # the timed loop from the warm-up's fastest call
    fastest, spent = float("inf"), 0.0
    for i in range(1000):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        fastest, spent = min(fastest, dt), spent + dt
        if i >= 2 and spent > 0.1 * target:
            break
    n = max(3, min(100000, int(target / max(fastest, 1e-7))))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def measure(shape, contenders, rounds, target, dtype):
    """Seconds per call of every contender on one shape, one list entry per interleaved
    round."""
    _, M, K, N = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N) if N > 1 else (K,)).astype(dtype)
    out = np.empty((M, N) if N > 1 else (M,), dtype)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    calls = {}
    for name, make in contenders.items():
        fn = make(a, b, out)
        fn()
        err = np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30)
        if err > 1e-3:
            raise SystemExit(f"{name} is wrong on {shape}: relative error {err:.2e}")
        calls[name] = fn
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            # Let the previous contender's idle threads stop spinning first: OpenBLAS workers
            # busy-wait about 2^28 cycles (~0.1 s) after a call, asymo's 0.2 ms; either would
            # otherwise take cycles from the next contender.
            time.sleep(SETTLE)
            times[name].append(_per_call(fn, target))
    return times


def gflops(shape, seconds):
    _, M, K, N = shape
    return 2.0 * M * K * N / seconds / 1e9


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# ---------------------------------------------------------------------------------------------
# the emulator
# ---------------------------------------------------------------------------------------------
def add_timing_args(ap, rounds):
    """The timing and emulator options (--rounds, --target, --core, --speed, --period) of the
    matmul benchmarks (this one and matmul_ceiling.py); ``rounds`` is the default of
    --rounds."""
    ap.add_argument("--rounds", type=int, default=rounds,
                    help=f"interleaved rounds (median; default {rounds})")
    ap.add_argument("--target", type=float, default=0.03,
                    help="seconds of calls per timing (default 0.03)")
    ap.add_argument("--core", type=int, default=1, help="core the emulator slows")
    ap.add_argument("--speed", type=float, default=0.5, help="speed of the slowed core")
    ap.add_argument("--period", type=float, default=None, metavar="SECONDS",
                    help="emulator period (default: asymo.lab.emulate.DEFAULT_PERIOD); the slowed "
                         "core stops for (1 - speed) of every period")


@contextlib.contextmanager
def emulation(core, speed, period=None):
    """(topology, description) with ``core`` slowed to ``speed`` by asymo's emulator."""
    from asymo.lab.emulate import DEFAULT_PERIOD, slow_cores
    period = DEFAULT_PERIOD if period is None else period
    with slow_cores({core: speed}, period=period) as emu:
        yield emu.topology, (f"asymo.lab.emulate.slow_cores({{{core}: {speed}}}, "
                             f"period={period * 1e3:g} ms)")


# ---------------------------------------------------------------------------------------------
# contenders
# ---------------------------------------------------------------------------------------------
def asymo_on(pool):
    def make(a, b, out):
        return lambda: asymo.matmul(a, b, out=out, pool=pool)
    return make


class _Pinned:
    """Keep the calling thread on ``cpus`` while timing (for the fast-core-alone contender)."""

    def __init__(self, fn, cpus):
        self.fn, self.cpus = fn, cpus

    def __call__(self):
        return self.fn()


def pinned(make, cpus):
    """Contender factory: ``make``'s call, timed with the calling thread kept on ``cpus``."""
    cpus = set(cpus)
    return lambda a, b, out: _Pinned(make(a, b, out), cpus)


def fast_pool(topo):
    """A pool on the fastest cluster of ``topo`` alone (capacity 1): the fast-core-alone
    baseline."""
    fast = topo.clusters[0]
    return Pool(topology=Topology(clusters=(Cluster(fast.name, fast.cpus, 1.0, fast.l1d,
                                                    fast.l2, fast.l3),)))


def numpy_call(a, b, out):
    return lambda: np.matmul(a, b, out=out)


class _Limited:
    """Run ``fn``'s whole timing loop under ``limit()`` (a thread-limit context)."""

    def __init__(self, fn, limit):
        self.fn, self.limit = fn, limit

    def __call__(self):
        with self.limit():
            return self.fn()


def numpy_threads(n):
    """NumPy/OpenBLAS with ``n`` threads (threadpoolctl, set outside the timed loop)."""
    import threadpoolctl

    def make(a, b, out):
        return _Limited(lambda: np.matmul(a, b, out=out),
                        lambda: threadpoolctl.threadpool_limits(n, user_api="blas"))
    return make


def torch_threads(n):
    """torch.matmul (oneDNN/MKL) with ``n`` intra-op threads, or None without torch."""
    try:
        import torch
    except ImportError:
        return None

    @contextlib.contextmanager
    def limit():
        saved = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(saved)

    def make(a, b, out):
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        return _Limited(lambda: torch.matmul(ta, tb, out=tout), limit)
    return make


def library_contenders(nthreads, fast_cpus, all_cores=True):
    """The libraries a user has: NumPy and torch on all cores (``all_cores``) and each pinned
    to ``fast_cpus`` with one thread."""
    out = {}
    if all_cores:
        out["numpy"] = numpy_threads(nthreads)
    out["numpy_1"] = pinned(numpy_threads(1), fast_cpus)
    if torch_threads(1) is not None:
        if all_cores:
            out["torch"] = torch_threads(nthreads)
        out["torch_1"] = pinned(torch_threads(1), fast_cpus)
    return out


def _baselines(contenders):
    names = {"numpy": "asymo vs numpy", "numpy_1": "vs numpy 1 core",
             "torch": "vs torch", "torch_1": "vs torch 1 core",
             "asymo_fast": "vs asymo fast core"}
    out = {k: names[k] for k in contenders if k in names}
    out["best"] = "vs best library"
    return out


def machine_line():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} usable cpus, numpy {np.__version__}"


def blas_line():
    try:
        import threadpoolctl
        info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        return ", ".join(f"{i.get('internal_api')} {i.get('version')}" for i in info)
    except Exception:  # pragma: no cover
        return "unknown"


def run_mode(mode, shapes, args):
    dtype = np.dtype(args.dtype)
    if mode == "onecore":
        topo = asymo.get_pool().topology
        fast = topo.clusters[0]
        cpus = fast.cpus[:1]
        pool1 = Pool(topology=Topology(clusters=(Cluster(fast.name, cpus, 1.0, fast.l1d,
                                                         fast.l2, fast.l3),)))
        try:
            contenders = {"asymo": pinned(asymo_on(pool1), cpus)}
            contenders.update(library_contenders(1, cpus, all_cores=False))
            header = (f"one core: every library on cpu {cpus[0]} with one thread (caller "
                      "pinned; asymo on a one-worker pool there)")
            rows = _rows(shapes, contenders, args, dtype)
        finally:
            pool1.close()
        return header, rows, _baselines(contenders)
    if mode == "symmetric":
        pool = asymo.get_pool()
        nthreads = pool.nworkers
        contenders = {"asymo": asymo_on(pool)}
        contenders.update(library_contenders(nthreads, pool.topology.clusters[0].cpus[:1]))
        header = (f"symmetric: asymo pool {pool.topology.to_spec()} ({nthreads} workers), "
                  f"NumPy/OpenBLAS and torch {nthreads} threads or 1 thread pinned")
        rows = _rows(shapes, contenders, args, dtype)
        return header, rows, _baselines(contenders)
    with emulation(args.core, args.speed, args.period) as (topo, how):
        fast = topo.clusters[0]
        pool = Pool(topology=topo)
        pool_fast = fast_pool(topo)
        nthreads = topo.ncpus
        try:
            contenders = {"asymo": asymo_on(pool),
                          "asymo_fast": pinned(asymo_on(pool_fast), fast.cpus)}
            contenders.update(library_contenders(nthreads, fast.cpus))
            header = (f"emulated: {how}; asymo pool {topo.to_spec()}, NumPy/OpenBLAS and torch "
                      f"{nthreads} threads or 1 thread on cpus {fast.cpus}, asymo_fast = asymo "
                      f"on cpus {fast.cpus} alone (pool and calling thread). (The emulator "
                      "slows speed, not caches.)")
            rows = _rows(shapes, contenders, args, dtype)
        finally:
            pool.close()
            pool_fast.close()
    return header, rows, _baselines(contenders)


def _rows(shapes, contenders, args, dtype):
    rows = []
    for shape in shapes:
        t = measure(shape, contenders, args.rounds, args.target, dtype)
        rows.append((shape, t))
        if args.verbose:
            print(f"  {shape[0]:>18} " + "  ".join(
                f"{k} {gflops(shape, float(np.median(v))):7.1f}" for k, v in t.items())
                  + "  " + "  ".join(f"x{k} {float(np.median(np.asarray(v) / np.asarray(t['asymo']))):.2f}"
                                     for k, v in t.items() if k != "asymo"), flush=True)
    return rows


def report(header, rows, baselines):
    names = list(rows[0][1])
    print()
    print(header)
    cols = "".join(f"{n + ' GF/s':>16}" for n in names)
    cols += "".join(f"{'x ' + b:>16}" for b in baselines)
    print(f"{'shape':>18} {'M x K x N':>18}{cols}")
    groups = {"MM (VGG-16 + MobileNet V1)": [], "MV (20 sizes)": [], "1024^3": []}
    for shape, t in rows:
        name, M, K, N = shape
        line = f"{name:>18} {f'{M}x{K}x{N}':>18}"
        line += "".join(f"{gflops(shape, float(np.median(t[n]))):16.1f}" for n in names)
        # the median of per-round ratios: both contenders of a round saw the same machine
        libs = [n for n in t if n in ("numpy", "numpy_1", "torch", "torch_1")]
        best = np.min([np.asarray(t[n]) for n in libs], axis=0)
        ratios = {b: float(np.median((best if b == "best" else np.asarray(t[b]))
                                     / np.asarray(t["asymo"])))
                  for b in baselines}
        line += "".join(f"{ratios[b]:16.2f}" for b in baselines)
        print(line)
        group = ("MV (20 sizes)" if name.startswith("mv.") else
                 "1024^3" if name.startswith("cube") else "MM (VGG-16 + MobileNet V1)")
        groups[group].append(ratios)
    summary = {}
    for g, rs in groups.items():
        if not rs:
            continue
        summary[g] = {b: geomean([r[b] for r in rs]) for b in baselines}
        print(f"{'geomean ' + g:>37}" + " " * (16 * len(names))
              + "".join(f"{summary[g][b]:16.2f}" for b in baselines))
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["onecore", "symmetric", "emulated", "both", "all"],
                    default="both", help="both: symmetric and emulated; all: onecore too")
    ap.add_argument("--quick", action="store_true", help="a representative subset of shapes")
    ap.add_argument("--only", choices=["mm", "mv", "cube"], action="append",
                    help="only these shape groups (repeatable)")
    add_timing_args(ap, rounds=9)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--no-fast", action="store_true",
                    help="asymo.matmul without its C fast path (the Python path; for comparison)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2 and args.mode != "symmetric":
        ap.error("the emulated mode needs at least 2 usable cpus")
    groups = {"mm": MM_SHAPES, "mv": MV_SHAPES, "cube": CUBE}
    shapes = [s for g in (args.only or ["mm", "mv", "cube"]) for s in groups[g]]
    if args.quick:
        shapes = [s for s in shapes if s[0] in QUICK]
    print(f"machine: {machine_line()}; BLAS: {blas_line()}; load average at start "
          f"{os.getloadavg()[0]:.2f} (other jobs share the machine)")
    from asymo.ops import matmul_fast
    print(f"asymo GEMM: kernels {gemm_plan.best_isa()}, dtype {args.dtype}, medians of "
          f"{args.rounds} interleaved rounds; ratio = time(baseline) / time(asymo); "
          f"matmul fast path: {matmul_fast.status()['state']}"
          + (", switched off for this run (--no-fast)" if args.no_fast else ""))
    results = {}
    modes = (["symmetric", "emulated"] if args.mode == "both" else
             ["onecore", "symmetric", "emulated"] if args.mode == "all" else [args.mode])
    for mode in modes:
        with matmul_fast.disabled(args.no_fast):
            header, rows, baselines = run_mode(mode, shapes, args)
        summary = report(header, rows, baselines)
        results[mode] = {"header": header, "summary": summary,
                         "load_average_end": os.getloadavg()[0],
                         "rows": [{"shape": list(s), "seconds": t} for s, t in rows]}
        print(f"load average now {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
