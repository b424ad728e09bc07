"""The simulator's validation errors with and without the issue-9 model changes, on one sweep.

One measured sweep under the emulator (calibration interleaved, as ``asymo bench scaling
--validate-sim``), validated four times from the same measurements: the old model (one call
per sample averaged over phases, no submitter wake-up), back-to-back samples only, the
wake-up only, and both (the current model). Prints the error at the largest core count per
workload and policy.

Measured on the development machine (2-core Zen 4 VM, 2026-11-21 22:45-22:46 UTC, no other
benchmark running; a sweep at 0.5 ms a minute earlier gave matmul/conv2d old-model errors up to
13 points apart from this one -- run-to-run drift):

    cpu 1 emulated at 0.5, period 0.5 ms; 5 samples per point (medians), >= 0.1 s each; submitter wake-up measured 60.6 us (
    ({'submitter_short': 8.704200038160229e-05, 'worker_short': 2.6488001058386598e-05}); 1-min load average 1.71 before, 2.04 after
    workload  policy            old     b2b only    wake only   both (new)
    matmul    asymo          -13.8%       -16.0%       -16.0%       -18.7%
    matmul    even             1.5%        -1.9%        -0.6%        -2.5%
    matmul    shared         -12.2%       -11.8%       -13.3%       -17.0%
    matmul    steal          -14.2%       -17.4%       -16.3%       -17.7%
    conv2d    asymo            2.0%         2.4%         0.2%         2.0%
    conv2d    even             2.6%        -0.8%         0.5%        -3.1%
    conv2d    shared          -1.3%        -0.6%        -3.6%        -0.8%
    conv2d    steal           -6.3%        -4.5%        -7.9%        -4.7%
    error = simulated / measured throughput - 1 at the largest core count
    workload  policy            old     b2b only    wake only   both (new)   (speedup error over the policy's own 1-core point)
    matmul    asymo            5.0%         2.4%         2.4%        -1.0%
    matmul    even            21.4%        17.3%        18.9%        16.6%
    matmul    shared         -10.3%        -9.9%       -11.4%       -15.2%
    matmul    steal          -15.6%       -18.8%       -17.7%       -19.0%
    conv2d    asymo            0.5%         0.9%        -1.3%         0.6%
    conv2d    even             6.0%         2.4%         3.7%         0.1%
    conv2d    shared           3.1%         3.8%         0.7%         3.6%
    conv2d    steal            2.8%         4.8%         1.0%         4.5%

    cpu 1 emulated at 0.5, period 1 ms; 5 samples per point (medians), >= 0.1 s each; submitter wake-up measured 69.5 us (
    ({'submitter_short': 0.00011407969808240643, 'worker_short': 4.457299872755385e-05}); 1-min load average 2.04 before, 2.44 after
    workload  policy            old     b2b only    wake only   both (new)
    matmul    asymo          -11.5%       -11.7%       -12.8%       -14.0%
    matmul    even            -1.6%        -6.8%        -4.0%        -9.9%
    matmul    shared         -21.6%       -19.8%       -22.7%       -24.8%
    matmul    steal          -16.2%       -18.5%       -18.5%       -22.2%
    conv2d    asymo          -14.8%       -22.9%       -15.9%       -23.0%
    conv2d    even           -18.5%       -19.8%       -20.3%       -19.9%
    conv2d    shared          -9.0%       -17.3%        -9.6%       -17.6%
    conv2d    steal           -9.3%       -13.2%       -10.9%       -13.3%
    error = simulated / measured throughput - 1 at the largest core count
    workload  policy            old     b2b only    wake only   both (new)   (speedup error over the policy's own 1-core point)
    matmul    asymo           12.8%        12.5%        11.2%         9.7%
    matmul    even            20.5%        14.2%        17.5%        10.4%
    matmul    shared          -5.7%        -3.5%        -7.0%        -9.5%
    matmul    steal           -1.7%        -4.5%        -4.4%        -8.8%
    conv2d    asymo           -8.9%       -17.5%       -10.1%       -17.6%
    conv2d    even            -6.5%        -8.0%        -8.6%        -8.2%
    conv2d    shared           3.4%        -5.9%         2.8%        -6.3%
    conv2d    steal           -4.4%        -8.6%        -6.1%        -8.6%

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

    from asymo.lab import scaling
    from asymo.hw import topology as topo
    from asymo.lab.emulate import DEFAULT_PERIOD, slow_cores

    period = args.period or DEFAULT_PERIOD
    names = args.workload.split(",")
    wls = scaling.make_workloads(names)
    with slow_cores(scaling.parse_emulate(args.emulate), period=period):
        t = topo.detect()
        load0 = os.getloadavg()[0]
        res = scaling.measure_scaling(wls, topology=t, repeats=args.repeats,
                                      min_time=args.min_time, progress=False, calibrate=True,
                                      emulator_period=period)
        load1 = os.getloadavg()[0]
    cal = res.calibration
    no_wake = copy.deepcopy(cal)
    no_wake["submitter_wake_s"] = 0.0
    saved = scaling.validate.SIM_BACK_TO_BACK_MAX
    out = {}
    for label, c, b2b in (("old", no_wake, False), ("b2b only", no_wake, True),
                          ("wake only", cal, False), ("both (new)", cal, True)):
        scaling.validate.SIM_BACK_TO_BACK_MAX = saved if b2b else 1
        try:
            out[label] = scaling.validate_sim(res, calibration=c, topology=t,
                                              emulator_period=period)
        finally:
            scaling.validate.SIM_BACK_TO_BACK_MAX = saved
    print(f"emulated {args.emulate} (CPU:SPEED), period {period * 1e3:g} ms; {args.repeats} samples "
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
