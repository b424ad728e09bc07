"""How fast is a core the emulator slowed, measured against a free core?

For each requested speed, single-thread work runs alternately on a free core and on the slowed
core (same work, same process: ``asymo.lab.speedprobe``); the measured speed is (time on free core)
/ (time on slowed core), the median over repeats. Two workloads show the slowdown does not
depend on who runs there: a pure-Python loop (the interpreter) and a NumPy float32 matmul on one
OpenBLAS thread. The measuring process runs in a session of its own at nice -20 (where
permitted) so other processes on a shared machine barely disturb it; a SCHED_FIFO helper
preempts it exactly as it would a nice-0 thread. Rows of the approximate mode are measured at
nice 0, as the workloads that mode is for would run.

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
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import asymo.lab.emulate as E  # noqa: E402


WORKLOADS = {"python": "python loop", "matmul": "numpy matmul 192^3 f32, 1 thread"}


def _run_probe(fast, slow, workload, extra, shield):
    cmd = [sys.executable, "-m", "asymo.lab.speedprobe", "--fast", str(fast), "--slow", str(slow),
           "--workload", workload, *extra]
    if shield:
        cmd.append("--shield")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                       start_new_session=True, check=True)
    return json.loads(r.stdout)


def probe(fast, slow, workload, repeats, seconds, shield):
    """Run asymo.lab.speedprobe in a session of its own; returns (ratios, shares, nice)."""
    out = _run_probe(fast, slow, workload, ["--rounds", str(repeats), "--seconds", str(seconds)],
                     shield)
    return out["ratios"], out["share"], out["nice"], out["autogroup_nice"]


def burst(fast, slow, unit_us, units):
    """Stretch (time on the slowed core / time on the free core) of short work units."""
    out = _run_probe(fast, slow, "burst", ["--unit-us", str(unit_us), "--units", str(units)],
                     True)
    return out["stretch"]


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


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
            "clocksource": clocksource, "realtime_available": E.realtime_available(),
            "load_average_1min": round(os.getloadavg()[0], 2)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--speeds", default="0.33,0.5,0.75",
                   help="requested speeds (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=15,
                   help="repeats per speed (median reported)")
    p.add_argument("--seconds", type=float, default=0.08,
                   help="duration of one run of the work on the free core")
    p.add_argument("--period", type=float, default=None,
                   help=f"emulator period in seconds (default {E.DEFAULT_PERIOD:g})")
    p.add_argument("--periods", default=None, metavar="LIST",
                   help="several periods in one run, e.g. 1e-3,5e-4,2.5e-4,1e-4 (overrides "
                        "--period)")
    p.add_argument("--unit-us", default="100,500", metavar="LIST",
                   help="fidelity: sizes of the short work units, microseconds on the free "
                        "core (default %(default)s; empty: skip)")
    p.add_argument("--units", type=int, default=1500, help="short work units timed per row")
    p.add_argument("--mode", choices=E.MODES + ("both",), default="fifo")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)

    info = machine_info()
    cpus = info["affinity"]
    if len(cpus) < 2:
        sys.exit("needs at least 2 usable cpus (one free, one slowed)")
    fast, slow = cpus[0], cpus[-1]
    speeds = [float(s) for s in args.speeds.split(",")]
    if args.periods:
        periods = [float(x) for x in args.periods.split(",")]
    else:
        periods = [args.period if args.period is not None else E.DEFAULT_PERIOD]
    units_us = [float(x) for x in args.unit_us.split(",") if x.strip()]
    modes = E.MODES if args.mode == "both" else (args.mode,)

    print("asymo emulator speed benchmark")
    for k, v in info.items():
        print(f"  {k:<20} {v}")
    print(f"  free core: cpu {fast}; slowed core: cpu {slow}; "
          f"period {', '.join(f'{x * 1e3:g}' for x in periods)} ms; "
          f"{args.repeats} repeats, median; single thread")
    print("  emulates core speed only: the slowed core keeps its caches and memory bandwidth")

    results = {"machine": info, "free_cpu": fast, "slowed_cpu": slow, "periods_s": periods,
               "repeats": args.repeats, "rows": [], "bursts": []}
    print()
    print("measured = (time on free core) / (time on slowed core), median of repeats;")
    print("cpu share = the work's cpu time / wall time on the slowed core, median;")
    print("nice = of the measuring thread / its session's autogroup ('none' and 'fifo' rows are")
    print("shielded from other processes at -20; a FIFO helper preempts them all the same)")
    print(f"{'mode':<12}{'period ms':>10}{'requested':>10}  {'workload':<34}{'measured':>9}"
          f"{'min':>8}{'max':>8}{'error':>8}{'cpu share':>11}{'nice':>9}")

    def row(mode, speed, workload, period=None):
        r, share, nice, group = probe(fast, slow, workload, args.repeats, args.seconds,
                                      shield=mode != "approximate")
        med, sh = statistics.median(r), statistics.median(share)
        nice_text = f"{nice}/{group if group is not None else '-'}"
        ptext = "-" if period is None else f"{period * 1e3:g}"
        print(f"{mode:<12}{ptext:>10}{speed:>10.2f}  {WORKLOADS[workload]:<34}{med:>9.3f}"
              f"{min(r):>8.3f}"
              f"{max(r):>8.3f}{med - speed:>+8.3f}{sh:>11.3f}{nice_text:>9}", flush=True)
        results["rows"].append({"mode": mode, "period_s": period, "requested": speed,
                                "workload": workload,
                                "median": med, "ratios": r, "cpu_share": share,
                                "nice": nice, "autogroup_nice": group})

    for workload in WORKLOADS:
        row("none", 1.0, workload)
    bursts = []
    for period in periods:
        for mode in modes:
            for speed in speeds:
                with E.slow_cores({slow: speed}, period=period, mode=mode) as emu:
                    if mode == "approximate":
                        print(f"  (approximate helper: {emu.helper_status[slow]})")
                    for workload in WORKLOADS:
                        row(mode, speed, workload, period)
                    if mode == "fifo":
                        for unit in units_us:
                            bursts.append((period, speed, unit,
                                           burst(fast, slow, unit, args.units)))
    if bursts:
        print()
        print("fidelity at the time scale of one task: short units of single-thread work (48^3")
        print("matmuls; size = time on the free core) run back to back on the slowed core; stretch")
        print("= time there / median time on the free core (measured in alternating blocks). A")
        print("core really running at speed s would stretch every unit by 1/s; a duty-cycled")
        print("one stretches most by ~1 and some by much more.")
        print(f"{'period ms':>10}{'speed':>7}{'unit us':>9}{'1/s':>7}{'mean':>8}{'p10':>7}"
              f"{'p50':>7}{'p90':>7}{'p99':>7}{'max':>8}")
        for period, speed, unit, st in bursts:
            mean = sum(st) / len(st)
            print(f"{period * 1e3:>10g}{speed:>7.2f}{unit:>9g}{1 / speed:>7.2f}{mean:>8.2f}"
                  f"{_pct(st, 0.1):>7.2f}{_pct(st, 0.5):>7.2f}{_pct(st, 0.9):>7.2f}"
                  f"{_pct(st, 0.99):>7.2f}{max(st):>8.2f}", flush=True)
            results["bursts"].append({"period_s": period, "requested": speed, "unit_us": unit,
                                      "mean": mean, "p10": _pct(st, 0.1), "p50": _pct(st, 0.5),
                                      "p90": _pct(st, 0.9), "p99": _pct(st, 0.99),
                                      "max": max(st)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
