"""Scheduling policies on an emulated asymmetric CPU: throughput relative to the fast core alone.

Run under the benchmark lock (the machine is shared), as root or with CAP_SYS_NICE:

    flock /tmp/asymo-bench.lock python3 bench/pool_policies.py

Core ``--slow-core`` (default 1) is slowed to ``--speed`` (default 0.5) by the emulator: a
SCHED_FIFO helper pinned to it spins for ``1 - speed`` of every period (1 ms), so any thread
there gets ``speed`` of the core (this emulates speed, not cache size). The job is ``--tasks``
equal compute-bound tasks (``asymo_task_spin``: a fixed number of dependent floating-point
multiply-adds, no memory traffic; ``--kernel numba`` uses a Numba ``@cfunc`` instead).

For every policy the same tasks run on a pool over both cores, told (``asymo``) which core is
slow through the topology; the reference is the same job on a one-worker pool on the fast core.
Throughput ratio = time(fast core alone) / time(policy); the ideal with one core at speed s is
1 + s (1.5 for s = 0.5). ``asymo, uninformed`` is the asymo policy on a topology that claims
both cores are equal (split 1:1): stealing alone has to absorb the asymmetry.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import asymo  # noqa: E402
from asymo.runtime.ffi import ffi, lib  # noqa: E402

# A minimal emulator helper, used when asymo.lab.emulate (the project's emulator) is not
# available: SCHED_FIFO, pinned, spins `busy` of each period on absolute deadlines, dies with
# its parent and after a time limit.
_OCCUPIER = r"""
import ctypes, os, signal, sys, time
cpu, busy, period, limit, parent = (int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]),
                                    float(sys.argv[4]), int(sys.argv[5]))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)                    # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(3)
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
print("ready", flush=True)
t = time.monotonic()
end = t + limit
while t < end:
    spin_until = t + busy * period
    while time.monotonic() < spin_until:
        pass
    t += period
    rest = t - time.monotonic()
    if rest > 0:
        time.sleep(rest)
"""


@contextlib.contextmanager
def _local_slow_core(cpu, speed, period=1e-3, time_limit=600.0):
    proc = subprocess.Popen(
        [sys.executable, "-c", _OCCUPIER, str(cpu), str(1.0 - speed), str(period),
         str(time_limit), str(os.getpid())], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        line = proc.stdout.readline().strip()
        if line != "ready":
            err = proc.stderr.read()
            raise RuntimeError(f"emulator helper failed to start (SCHED_FIFO needs root or "
                               f"CAP_SYS_NICE): {err.strip()[-300:]}")
        yield
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def slow_core(cpu, speed):
    """The project's emulator when present, else the minimal helper above."""
    try:
        from asymo.lab.emulate import slow_cores
    except ImportError:
        return _local_slow_core(cpu, speed), "bench-local SCHED_FIFO helper (1 ms period)"
    return slow_cores({cpu: speed}), "asymo.lab.emulate.slow_cores (SCHED_FIFO helper)"


def make_task(kernel, iters):
    if kernel == "c":
        return ffi.addressof(lib, "asymo_task_spin"), np.array([iters], np.int64)
    import numba
    from numba import types

    @numba.cfunc(types.void(types.int64, types.voidptr))
    def spin(task, ctx):
        n = numba.carray(ctx, (1,), np.int64)[0]
        a = 1.0 + 1e-9 * (task & 7)
        b = c = d = e = 1.0
        for _ in range(0, n, 4):
            b = b * a + 1e-9
            c = c * a + 2e-9
            d = d * a + 3e-9
            e = e * a + 4e-9
        if b + c + d + e == 12345.0:  # never: keeps the loop from being removed
            numba.carray(ctx, (1,), np.int64)[0] = 0

    return spin, np.array([iters], np.int64)


def _timed(pool, fn, ntasks, ctx):
    t0 = time.perf_counter()
    pool.parallel_for(fn, ntasks, ctx=ctx)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast-core", type=int, default=0)
    ap.add_argument("--slow-core", type=int, default=1)
    ap.add_argument("--speed", type=float, default=0.5, help="speed of the slowed core")
    ap.add_argument("--tasks", type=int, default=96)
    ap.add_argument("--task-us", type=float, default=400.0,
                    help="approximate task length on the fast core (microseconds)")
    ap.add_argument("--kernel", choices=("c", "numba"), default="c")
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--queue", default=None, choices=sorted(asymo.runtime.pool.QUEUES))
    args = ap.parse_args(argv)
    fast, slow = args.fast_core, args.slow_core
    usable = os.sched_getaffinity(0)
    if fast not in usable or slow not in usable or fast == slow:
        ap.error(f"--fast-core and --slow-core must be two different usable cpus {usable}")

    fn, ctx = make_task(args.kernel, 1000)
    # Calibrate the task length on the fast core, before the emulator starts: time jobs long
    # enough (>= 50 ms) that the pool's own overhead does not count, and keep the fastest.
    with asymo.Pool(f"fast:{fast}@1.0", queue=args.queue) as alone:
        iters = 1 << 12
        while True:
            ctx[0] = iters
            best = min(_timed(alone, fn, 16, ctx) for _ in range(3))
            if best > 0.05:
                break
            iters *= 2
        per_iter = best / 16 / iters
    iters = max(4, int(args.task_us * 1e-6 / per_iter) // 4 * 4)
    ctx[0] = iters

    informed = f"fast:{fast}@1.0,slow:{slow}@{args.speed:g}"
    uninformed = f"fast:{fast}@1.0,slow:{slow}@1.0"
    configs = [("fast core alone", f"fast:{fast}@1.0", "asymo"),
               ("slow core alone", f"slow:{slow}@1.0", "asymo")]
    configs += [(p, informed, p) for p in ("asymo", "even", "shared", "steal")]
    configs += [("asymo, uninformed", uninformed, "asymo")]

    emu, emu_name = slow_core(slow, args.speed)
    print(f"machine: {platform.machine()}, usable cpus {sorted(usable)}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"emulation: cpu {slow} at speed {args.speed:g} via {emu_name}; emulates speed, "
          "not cache size")
    print(f"job: {args.tasks} equal tasks, {args.kernel} kernel, {iters} multiply-adds each "
          f"(~{args.task_us:g} us on the fast core); medians over {args.repeat} repeats, "
          "configurations interleaved")
    with emu:
        time.sleep(0.2)
        pools = {name: asymo.Pool(spec, policy=pol, queue=args.queue)
                 for name, spec, pol in configs}
        times = {name: [] for name, _, _ in configs}
        stolen = {name: 0 for name, _, _ in configs}
        for pool in pools.values():
            pool.parallel_for(fn, args.tasks, ctx=ctx)  # warm up
            pool.reset_stats()
        for r in range(args.repeat):
            names = [c[0] for c in configs]
            if r % 2:
                names.reverse()
            for name in names:
                pool = pools[name]
                t0 = time.perf_counter()
                pool.parallel_for(fn, args.tasks, ctx=ctx)
                times[name].append(time.perf_counter() - t0)
        for name, pool in pools.items():
            st = pool.stats()
            stolen[name] = st
            pool.close()

    ref = statistics.median(times["fast core alone"])
    print(f"pool: one worker per core, pinned; queue {args.queue or 'default'}\n")
    print(f"  {'configuration':20s} {'median ms':>10s} {'vs fast alone':>14s}   tasks run "
          "fast/slow, stolen by fast from slow, by slow from fast")
    targets = {"asymo": ">= 1.4 (ideal %.2f)" % (1 + args.speed), "even": "~1.0 (collapse)"}
    for name, _, _ in configs:
        med = statistics.median(times[name])
        st = stolen[name]
        runs = "/".join(str(c["tasks_run"]) for c in st["clusters"])
        if len(st["clusters"]) == 2:
            f2s = st["clusters"][0]["stolen_from"].get("slow", 0)
            s2f = st["clusters"][1]["stolen_from"].get("fast", 0)
            steal = f"{f2s}, {s2f}"
        else:
            steal = "-"
        note = targets.get(name, "")
        print(f"  {name:20s} {med * 1e3:10.2f} {ref / med:13.2f}x   {runs:>11s}  {steal:>10s}"
              f"   {note}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
