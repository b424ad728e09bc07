"""Pool several simulator validations (``asymo bench scaling --validate-sim --json FILE``).

One sweep on a shared 2-core VM moves by up to ~15% from the next (the same 1-core point,
which every policy runs alike on one core, differs by that much between policies within one
sweep), so one sweep can neither show nor rule out a 10% model error. This reads several
sweeps, groups them by emulator period and prints, per workload and policy, the error of the
largest core count in each sweep, their mean, the error of the pooled figures (geometric
mean of the simulated over that of the measured throughputs), with how many cells are within
the tolerance, and the mean error of the predicted speedup over each policy's own 1-core
point (which leaves out how far the traced task costs' level drifted from the sweep's). It also prints each sweep's noise floor: the spread of the 1-core points
across policies, which should be equal.

    python3 bench/sim_validation_summary.py v1.json v2.json ...   # or .json.gz
    python3 bench/sim_validation_summary.py docs/sim-validation/*.json.gz
    python3 bench/sim_validation_summary.py --markdown v*.json   # README tables
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymo.lab.scaling.validate import POOL_POLICIES as POLICIES, TOLERANCE  # noqa: E402


def read_json(path):
    """The JSON document in ``path`` (gzip-compressed when the name ends in .gz)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def load(path):
    try:
        d = read_json(path)
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
        raise SystemExit(f"{path}: not a JSON file written by --validate-sim --json ({exc})")
    val = d.get("validation") if isinstance(d, dict) else None
    if not isinstance(val, dict) or "workloads" not in val:
        raise SystemExit(f"{path}: no validation in it (run with --validate-sim --json)")
    period = (val.get("model") or {}).get("emulator_period_s")
    meta = d.get("meta", {})
    pts = d.get("points", [])
    return {"path": path, "period": period, "val": val,
            "load": (meta.get("loadavg_before"), meta.get("loadavg_after")),
            "runs": (sum(p.get("samples_clean") or 0 for p in pts),
                     sum(p.get("samples_total") or 0 for p in pts))}


def cells(sweep):
    """{(workload, policy): (measured, simulated)} at each workload's largest core count,
    and {workload: 1-core spread across policies (max/min - 1)}."""
    out, floor = {}, {}
    for name, w in sweep["val"]["workloads"].items():
        pts = w["points"]
        if not pts:
            continue
        kmax = max(p["cores"] for p in pts)
        for p in pts:
            if p["cores"] == kmax and p["policy"] in POLICIES:
                out[(name, p["policy"])] = (p["measured"], p["simulated"],
                                            p.get("error_speedup"))
        ones = [p["measured"] for p in pts if p["cores"] == 1 and p["policy"] in POLICIES]
        if len(ones) > 1:
            floor[name] = max(ones) / min(ones) - 1.0
    return out, floor


def gmean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def summarize(sweeps, tol):
    """Rows per (workload, policy); a row's ``errors`` has one entry per sweep, in order,
    None where that sweep lacks the cell (other workloads or policies)."""
    per = defaultdict(dict)
    floors = []
    for i, s in enumerate(sweeps):
        c, floor = cells(s)
        floors.append(floor)
        for key, v in c.items():
            per[key][i] = v
    rows = []
    for (name, pol), by_sweep in per.items():
        vals = list(by_sweep.values())
        errs = [sim / meas - 1.0 for meas, sim, _ in vals]
        pooled = gmean([sim for _, sim, _ in vals]) / gmean([meas for meas, _, _ in vals]) - 1
        speedup = [s for _, _, s in vals if s is not None]
        rows.append({"workload": name, "policy": pol,
                     "errors": [by_sweep[i][1] / by_sweep[i][0] - 1.0 if i in by_sweep else None
                                for i in range(len(sweeps))],
                     "mean": statistics.fmean(errs), "pooled": pooled,
                     "speedup": statistics.fmean(speedup) if speedup else float("nan"),
                     "within": sum(abs(e) <= tol for e in errs)})
    return rows, floors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+",
                    help="JSON files written by --validate-sim --json (.json.gz read too)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args(argv)
    sweeps = [load(p) for p in args.files]
    by_period = defaultdict(list)
    for s in sweeps:
        by_period[s["period"]].append(s)
    for period, group in sorted(by_period.items(), key=lambda kv: kv[0] or 0):
        rows, floors = summarize(group, args.tolerance)
        label = f"{period * 1e3:g} ms" if period else "no emulator"
        print(f"\nemulator period {label}: {len(group)} sweeps "
              f"({', '.join(g['path'] for g in group)})")
        for g, fl in zip(group, floors):
            lo, hi = (f"{x:.2f}" if isinstance(x, (int, float)) else "?" for x in g["load"])
            print(f"  {g['path']}: 1-min load {lo} -> {hi}, undisturbed runs "
                  f"{g['runs'][0]}/{g['runs'][1]}; 1-core spread across policies "
                  + ", ".join(f"{n} {v:.0%}" for n, v in fl.items()))
        cells_ok = sum(abs(r["pooled"]) <= args.tolerance for r in rows)
        per_sweep = [(sum(abs(r["errors"][i]) <= args.tolerance for r in rows
                          if r["errors"][i] is not None),
                      sum(r["errors"][i] is not None for r in rows)) for i in range(len(group))]
        if args.markdown:
            print("\n| workload | " + " | ".join(POLICIES) + " |")
            print("| --- |" + " --- |" * len(POLICIES))
            for name in dict.fromkeys(r["workload"] for r in rows):
                mine = {r["policy"]: r for r in rows if r["workload"] == name}
                print(f"| {name} | " + " | ".join(
                    f"{mine[p]['pooled']:+.1%} ("
                    + ", ".join("-" if e is None else f"{e:+.0%}" for e in mine[p]["errors"])
                    + ")"
                    if p in mine else "" for p in POLICIES) + " |")
        else:
            print(f"  {'workload':10s} {'policy':7s} {'pooled':>8s} {'mean':>8s} "
                  f"{'speedup':>8s}  per sweep")
            for r in rows:
                print(f"  {r['workload']:10s} {r['policy']:7s} {r['pooled']:+8.1%} "
                      f"{r['mean']:+8.1%} {r['speedup']:+8.1%}  "
                      + " ".join(f"{'-':>6s}" if e is None else f"{e:+6.1%}"
                                 for e in r["errors"]))
        print(f"  within {args.tolerance:.0%}: pooled {cells_ok}/{len(rows)}; per sweep "
              + ", ".join(f"{n}/{m}" for n, m in per_sweep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
