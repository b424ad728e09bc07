"""How fast is a core the emulator slowed, measured against a free core?

For each requested speed, single-thread work runs alternately on a free core and on the slowed
core (same work, same process); the measured speed is (time on free core) / (time on slowed
core), the median over repeats. Two workloads show the slowdown does not depend on who runs
there: a pure-Python loop (the interpreter) and a NumPy float32 matmul on one OpenBLAS thread.

Run under the shared benchmark lock:

    flock /tmp/asymo-bench.lock python3 bench/emulator_speed.py

This emulates core speed only: the slowed core keeps its caches and memory bandwidth.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import asymo.emulate as E  # noqa: E402


def python_loop(n):
    x = 0
    for i in range(n):
        x += i
    return x


class MatmulWork:
    def __init__(self, size=192):
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((size, size), dtype=np.float32)
        self.b = rng.standard_normal((size, size), dtype=np.float32)
        self.out = np.empty((size, size), dtype=np.float32)

    def __call__(self, n):
        for _ in range(n):
            np.matmul(self.a, self.b, out=self.out)


WORKLOADS = {
    "python loop": (python_loop, 100_000),
    "numpy matmul 192^3 f32, 1 thread": (None, 1),
}


def timed_on(cpu, fn, n, share=None):
    """Wall time of fn(n) on cpu; appends (thread cpu time / wall time) to `share`."""
    os.sched_setaffinity(0, {cpu})  # the calling thread only
    c = time.thread_time()
    t = time.perf_counter()
    fn(n)
    wall = time.perf_counter() - t
    if share is not None:
        share.append((time.thread_time() - c) / wall)
    return wall


def calibrate(fn, n, cpu, target):
    while timed_on(cpu, fn, n) < target / 8:
        n *= 2
    return max(1, int(n * target / timed_on(cpu, fn, n)))


def measure(fn, n, fast, slow, repeats):
    """Speed ratios (free-core time / slowed-core time), interleaved, and the share of the
    slowed core the work got (its cpu time / wall time there)."""
    ratios, share = [], []
    for _ in range(repeats):
        t_fast = timed_on(fast, fn, n)
        t_slow = timed_on(slow, fn, n, share)
        ratios.append(t_fast / t_slow)
    return ratios, share


def machine_info():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    runtime, period = E._rt_limits()
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            clocksource = f.read().strip()
    except OSError:
        clocksource = "unknown"
    return {"cpu": model, "cpus_online": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)), "kernel": platform.release(),
            "python": platform.python_version(), "numpy": np.__version__,
            "sched_rt_runtime_us": runtime, "sched_rt_period_us": period,
            "clocksource": clocksource, "realtime_available": E.realtime_available()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--speeds", default="0.33,0.5,0.75", help="requested speeds (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=15,
                   help="repeats per speed (median reported)")
    p.add_argument("--seconds", type=float, default=0.08,
                   help="duration of one run of the work on the free core")
    p.add_argument("--period", type=float, default=E.DEFAULT_PERIOD, help="emulator period (s)")
    p.add_argument("--mode", choices=E.MODES + ("both",), default="fifo")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)

    info = machine_info()
    cpus = info["affinity"]
    if len(cpus) < 2:
        sys.exit("needs at least 2 usable cpus (one free, one slowed)")
    fast, slow = cpus[0], cpus[-1]
    speeds = [float(s) for s in args.speeds.split(",")]
    modes = E.MODES if args.mode == "both" else (args.mode,)

    print("asymo emulator speed benchmark")
    for k, v in info.items():
        print(f"  {k:<20} {v}")
    print(f"  free core: cpu {fast}; slowed core: cpu {slow}; period {args.period * 1e3:g} ms; "
          f"{args.repeats} repeats, median; single thread")
    print("  emulates core speed only: the slowed core keeps its caches and memory bandwidth")

    saved = os.sched_getaffinity(0)
    results = {"machine": info, "free_cpu": fast, "slowed_cpu": slow, "period_s": args.period,
               "repeats": args.repeats, "rows": []}
    with threadpool_limits(limits=1):
        matmul = MatmulWork()
        work = {name: (fn or matmul, n) for name, (fn, n) in WORKLOADS.items()}
        sizes = {name: calibrate(fn, n, fast, args.seconds) for name, (fn, n) in work.items()}
        try:
            print()
            print("measured = (time on free core) / (time on slowed core), median of repeats;")
            print("cpu share = the work's cpu time / wall time on the slowed core, median")
            print(f"{'mode':<12}{'requested':>10}  {'workload':<34}{'measured':>9}"
                  f"{'min':>8}{'max':>8}{'error':>8}{'cpu share':>11}")

            def row(mode, speed, name, fn, repeats):
                r, share = measure(fn, sizes[name], fast, slow, repeats)
                med, sh = statistics.median(r), statistics.median(share)
                print(f"{mode:<12}{speed:>10.2f}  {name:<34}{med:>9.3f}{min(r):>8.3f}"
                      f"{max(r):>8.3f}{med - speed:>+8.3f}{sh:>11.3f}", flush=True)
                results["rows"].append({"mode": mode, "requested": speed, "workload": name,
                                        "median": med, "ratios": r, "cpu_share": share})

            for name, (fn, _) in work.items():
                row("none", 1.0, name, fn, args.repeats)
            for mode in modes:
                for speed in speeds:
                    with E.slow_cores({slow: speed}, period=args.period, mode=mode):
                        for name, (fn, _) in work.items():
                            row(mode, speed, name, fn, args.repeats)
        finally:
            os.sched_setaffinity(0, saved)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
