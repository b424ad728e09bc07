"""Measure how fast one core runs single-thread work relative to another.

``python -m asymo.lab.speedprobe --fast 0 --slow 1 [--workload python|matmul] [--shield]`` runs the
same work alternately on both cores and prints JSON: ``ratios`` (time on ``--fast`` / time on
``--slow``, one per round) and ``share`` (the work's cpu time / wall time on ``--slow``).
Used by the emulator's test and benchmark to check the speed a slowed core gives.

``--workload burst`` measures fidelity for short work instead: units of single-thread matmuls of
``--unit-us`` microseconds (on ``--fast``) run back to back on ``--slow``; ``stretch`` lists
each unit's time there / its median time on ``--fast``. A core that really ran at speed s would
stretch every unit by 1/s; an emulator that stops the core for part of each period stretches
most units by about 1 and a few by 1 + (stopped time) / unit, so the spread of ``stretch``
(p90, p99, max against the median) shows how unevenly the emulated core delivers its speed at
the time scale of one unit -- the scale of one task of a parallel job.

``--shield`` (start this in a session of its own) lowers the nice value of this process's
autogroup and thread to -20 where permitted, so other processes on a shared machine barely
disturb the measurement. A SCHED_FIFO emulator helper preempts a nice -20 thread exactly as it
preempts a nice 0 one, so shielding does not change what is measured, only the noise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def python_loop(n):
    x = 0
    for i in range(n):
        x += i
    return x


def matmul_work(size=192):
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)

    def run(n):
        for _ in range(n):
            np.matmul(a, b, out=out)

    return run


def timed_on(cpu, fn, n, share=None):
    os.sched_setaffinity(0, {cpu})
    c = time.thread_time()
    t = time.perf_counter()
    fn(n)
    wall = time.perf_counter() - t
    if share is not None:
        share.append((time.thread_time() - c) / wall)
    return wall


def shield():
    """Lower this session's autogroup nice and this thread's nice to -20 where permitted.
    Returns the nice values obtained."""
    group = None
    if os.getsid(0) == os.getpid():  # only a session leader owns its autogroup
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write("-20")
            group = -20
        except OSError:
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -20)
    except OSError:
        pass
    return {"autogroup_nice": group, "nice": os.getpriority(os.PRIO_PROCESS, 0)}


def measure(fast, slow, workload="python", rounds=5, seconds=0.1):
    if workload == "python":
        fn, n = python_loop, 100_000
    elif workload == "matmul":
        import numpy  # noqa: F401  (threadpoolctl only sees BLAS libraries already loaded)
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)  # the matmul runs in this thread, on the pinned core
        fn, n = matmul_work(), 1
    else:
        raise ValueError(f"unknown workload {workload!r}; expected 'python' or 'matmul'")
    while timed_on(fast, fn, n) < seconds / 8:
        n *= 2
    n = max(1, int(n * seconds / timed_on(fast, fn, n)))
    ratios, share = [], []
    for _ in range(rounds):
        t_fast = timed_on(fast, fn, n)
        t_slow = timed_on(slow, fn, n, share)
        ratios.append(t_fast / t_slow)
    return {"ratios": ratios, "share": share, "iterations": n}


def burst(fast, slow, unit_s=100e-6, count=2000, blocks=5):
    """Stretch of ``count`` units of ``unit_s`` seconds (on ``fast``) run on ``slow``.

    A unit is a few single-thread 48^3 float32 matmuls (deterministic, no allocation). Units
    run in ``blocks`` alternating stretches on ``fast`` and ``slow`` so drift in the machine's
    speed hits both; each slow unit is divided by the median fast unit of its block.
    """
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
    step = matmul_work(48)
    os.sched_setaffinity(0, {fast})

    def times(n, reps):
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            step(n)
            ts.append(time.perf_counter() - t)
        return ts

    def median(xs):
        return sorted(xs)[len(xs) // 2]

    n = 1
    while median(times(n, 11)) < unit_s / 4:
        n *= 2
    n = max(1, round(n * unit_s / median(times(n, 21))))
    per = max(1, count // blocks)
    stretch, refs = [], []
    for _ in range(blocks):
        os.sched_setaffinity(0, {fast})
        ref = median(times(n, per))
        os.sched_setaffinity(0, {slow})
        stretch += [t / ref for t in times(n, per)]
        refs.append(ref)
    os.sched_setaffinity(0, {fast})
    return {"stretch": stretch, "unit_s": median(refs), "iterations": n}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m asymo.lab.speedprobe", description=__doc__)
    p.add_argument("--fast", type=int, required=True, help="reference (free) cpu")
    p.add_argument("--slow", type=int, required=True, help="cpu whose speed is measured")
    p.add_argument("--workload", choices=("python", "matmul", "burst"), default="python")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.1,
                   help="duration of one run of the work on the reference cpu")
    p.add_argument("--unit-us", type=float, default=100.0,
                   help="burst workload: microseconds of work per unit on the reference cpu")
    p.add_argument("--units", type=int, default=2000, help="burst workload: units timed")
    p.add_argument("--shield", action="store_true")
    args = p.parse_args(argv)
    out = shield() if args.shield else {"autogroup_nice": None,
                                        "nice": os.getpriority(os.PRIO_PROCESS, 0)}
    if args.workload == "burst":
        out.update(burst(args.fast, args.slow, args.unit_us * 1e-6, args.units))
    else:
        out.update(measure(args.fast, args.slow, args.workload, args.rounds, args.seconds))
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
