"""The simulator with cost-model task costs against a measured sweep of this machine.

Measures ``asymo bench scaling`` (matmul and conv2d by default, policies asymo and even) on
this machine's own topology, then simulates the same topology and workloads twice: with the
GEMM task costs from the cost models of a calibration profile (``asymo.lab.sim.costs``) and with
the profile's flat per-cluster MM capability (GFLOP/s per core), and prints measured against
simulated throughput per point with the run conditions.

The calibration profile should not be the active one (``asymo calibrate --profile /tmp/...``
without ``ASYMO_PROFILE``), so the measured runs use the default plans the simulator plans
with. Run under the benchmark lock::

    flock /tmp/asymo-bench.lock python3 -m asymo calibrate --quick --profile /tmp/p.json
    flock /tmp/asymo-bench.lock python3 bench/sim_costmodel.py --profile /tmp/p.json

The cost model was fitted to choose block sizes (to rank settings), not to predict absolute
time: the error printed here is what it is, no figure is tuned.

Measured on the development machine (2-core AMD EPYC VM, symmetric, no emulator;
2026-11-21 23:30 UTC, load average 1.60 before, 1.72 after; a full `asymo calibrate` three
minutes earlier; the README has the other runs)::

    workload policy   cores   measured  sim model    error   sim flat    error   [GFLOP/s]
    matmul   asymo        1       70.6       91.8   +30.0%       79.8   +13.0%
    matmul   asymo        2      133.8      183.6   +37.2%      159.3   +19.1%
    matmul   even         1       71.7       91.8   +28.0%       79.8   +11.3%
    matmul   even         2      134.5      183.6   +36.4%      159.3   +18.4%
    conv2d   asymo        1       62.3       62.0    -0.5%       79.8   +28.0%
    conv2d   asymo        2      117.1      124.2    +6.1%      159.3   +36.1%
    conv2d   even         1       59.1       62.0    +4.9%       79.8   +34.9%
    conv2d   even         2      107.9      124.2   +15.1%      159.3   +47.7%
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from asymo.lab import scaling  # noqa: E402
from asymo.hw import topology as topo  # noqa: E402
from asymo.lab.sim.costs import load_model_costs  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="calibration profile (asymo calibrate)")
    ap.add_argument("--workload", default="matmul,conv2d")
    ap.add_argument("--policies", default="asymo,even")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.02)
    ap.add_argument("--json", default=None, help="write measured and simulated points")
    args = ap.parse_args(argv)
    from asymo import profile as prof
    if os.path.abspath(prof.profile_path(None)) == os.path.abspath(args.profile):
        print("warning: this profile is the active one: measured runs use its calibrated "
              "plans, the simulator the default ones", file=sys.stderr)
    t = topo.detect()
    costs = load_model_costs(args.profile, t)
    with open(args.profile) as f:
        section = json.load(f)["sections"]["gemm"]
    caps = [c["capability_gflops"]["mm"] / c["threads"] for c in section["clusters"]]
    policies = [p for p in args.policies.split(",") if p]
    wls = scaling.make_workloads([w for w in args.workload.split(",") if w])

    started = datetime.datetime.now(datetime.timezone.utc)
    measured = scaling.measure_scaling(wls, policies=policies, topology=t,
                                       repeats=args.repeats, min_time=args.min_time,
                                       progress=False)
    model = scaling.simulate_scaling(t, wls, policies=policies, cost_models=costs)
    flat = scaling.simulate_scaling(t, wls, policies=policies, gflops_per_core=caps)

    m = measured.meta
    print(f"{m.get('cpu_model')}, topology {t.to_spec()} (not emulated), "
          f"{started:%Y-%m-%d %H:%M} UTC; median of {args.repeats} samples of >= "
          f"{args.min_time:g} s per point; 1-min load average {m.get('loadavg_before'):.2f} "
          f"before, {m.get('loadavg_after'):.2f} after")
    print(f"profile {args.profile} ({section.get('set')} set, {section.get('created')}): "
          + "; ".join(f"{c['name']}: {c['model_name']}, MM {c['capability_gflops']['mm']:.1f}"
                      f" GFLOP/s on {c['threads']} threads" for c in section["clusters"]))
    print("sim model: " + costs.describe())
    key = lambda p: (p.workload, p.policy, p.cores)
    sim_m = {key(p): p.throughput for p in model.points}
    sim_f = {key(p): p.throughput for p in flat.points}
    head = (f"{'workload':<9}{'policy':<8}{'cores':>6}{'measured':>11}{'sim model':>11}"
            f"{'error':>9}{'sim flat':>11}{'error':>9}   [GFLOP/s]")
    print(head)
    rows = []
    for p in measured.points:
        k = key(p)
        em = sim_m[k] / p.throughput - 1
        ef = sim_f[k] / p.throughput - 1
        rows.append({"workload": k[0], "policy": k[1], "cores": k[2],
                     "measured": p.throughput, "sim_model": sim_m[k], "sim_flat": sim_f[k],
                     "error_model": em, "error_flat": ef,
                     "samples_clean": p.samples_clean, "samples_total": p.samples_total})
        print(f"{k[0]:<9}{k[1]:<8}{k[2]:>6}{p.throughput:>11.1f}{sim_m[k]:>11.1f}{em:>+9.1%}"
              f"{sim_f[k]:>11.1f}{ef:>+9.1%}")
    print("error = simulated / measured throughput - 1; sim flat: the profile's MM capability "
          f"({', '.join(f'{c:.1f}' for c in caps)} GFLOP/s per core) for every GEMM task")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": {"started": started.isoformat(timespec="seconds"),
                                      "repeats": args.repeats, "min_time": args.min_time,
                                      "loadavg_before": m.get("loadavg_before"),
                                      "loadavg_after": m.get("loadavg_after"),
                                      "cpu_model": m.get("cpu_model"),
                                      "topology": t.to_spec(), "profile": args.profile},
                       "task_costs": model.meta["task_costs"], "points": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
