"""The simulator's validation errors with and without the issue-9 model changes, on one sweep.

One measured sweep under the emulator (calibration interleaved, as ``asymo bench scaling
--validate-sim``), validated four times from the same measurements: the old model (one call
per sample averaged over phases, no submitter wake-up), back-to-back samples only, the
wake-up only, and both (the current model). Prints the error at the largest core count per
workload and policy.

    flock /tmp/asymo-bench.lock timeout 600 python3 bench/sim_b2b_wake_validation.py \\
        --workload matmul,conv2d --emulate 1:0.5
"""
import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="matmul,conv2d")
    ap.add_argument("--emulate", default="1:0.5", help="CPU:SPEED")
    ap.add_argument("--period", type=float, default=None, help="emulator period (s)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.1)
    args = ap.parse_args(argv)

    from asymo import scaling
    from asymo import topology as topo
    from asymo.emulate import DEFAULT_PERIOD, slow_cores

    period = args.period or DEFAULT_PERIOD
    cpu, speed = args.emulate.split(":")
    names = args.workload.split(",")
    wls = scaling.make_workloads(names)
    with slow_cores({int(cpu): float(speed)}, period=period):
        t = topo.detect()
        load0 = os.getloadavg()[0]
        res = scaling.measure_scaling(wls, topology=t, repeats=args.repeats,
                                      min_time=args.min_time, progress=False, calibrate=True,
                                      emulator_period=period)
        load1 = os.getloadavg()[0]
    cal = res.calibration
    no_wake = copy.deepcopy(cal)
    no_wake["submitter_wake_s"] = 0.0
    saved = scaling.SIM_BACK_TO_BACK_MAX
    out = {}
    for label, c, b2b in (("old", no_wake, False), ("b2b only", no_wake, True),
                          ("wake only", cal, False), ("both (new)", cal, True)):
        scaling.SIM_BACK_TO_BACK_MAX = saved if b2b else 1
        try:
            out[label] = scaling.validate_sim(res, calibration=c, topology=t,
                                              emulator_period=period)
        finally:
            scaling.SIM_BACK_TO_BACK_MAX = saved
    print(f"cpu {cpu} emulated at {speed}, period {period * 1e3:g} ms; {args.repeats} samples "
          f"per point (medians), >= {args.min_time:g} s each; submitter wake-up measured "
          f"{cal.get('submitter_wake_s', 0) * 1e6:.1f} us "
          f"({cal.get('submitter_wake', {}).get('over_longest_s')}); 1-min load average "
          f"{load0:.2f} before, {load1:.2f} after")
    print(f"{'workload':<10}{'policy':<8}" + "".join(f"{k:>13}" for k in out))
    for name in out["old"]["workloads"]:
        for pol in out["old"]["workloads"][name]["sim_error"]:
            print(f"{name:<10}{pol:<8}" + "".join(
                f"{v['workloads'][name]['sim_error'][pol] * 100:>12.1f}%" for v in out.values()))
    print("error = simulated / measured throughput - 1 at the largest core count")
    print(f"{'workload':<10}{'policy':<8}" + "".join(f"{k:>13}" for k in out)
          + "   (speedup error over the policy's own 1-core point)")
    for name in out["old"]["workloads"]:
        for pol in out["old"]["workloads"][name]["sim_error"]:
            cells = []
            for v in out.values():
                rows = v["workloads"][name]["points"]
                kmax = max(r["cores"] for r in rows)
                r = next(r for r in rows if r["policy"] == pol and r["cores"] == kmax)
                sp = r.get("error_speedup")
                cells.append(f"{sp * 100:>12.1f}%" if sp is not None else f"{'-':>13}")
            print(f"{name:<10}{pol:<8}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
