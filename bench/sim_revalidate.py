"""Validate the simulator again on stored sweeps: the same measurements, today's model.

Every ``asymo bench scaling --validate-sim --json FILE`` keeps the measured points and the
calibration it was compared with, so a change to the model can be judged on identical
measurements instead of on new sweeps (which move by 10-20% from one to the next on a shared
VM). This rebuilds each sweep's result from its file, runs ``asymo.lab.scaling.validate_sim`` with
its own calibration and emulator period, and prints how many 2-core cells are within 10%.

``--level-tolerance TOL`` also runs the variant tried in session 4 and kept out of the model:
every core count's traced costs divided by the calibration's traced/untraced 1-core ratio when
that ratio is within TOL of 1 (see docs/scaling-validation.md).

    python3 bench/sim_revalidate.py docs/sim-validation/*.json.gz
    python3 bench/sim_revalidate.py --level-tolerance 0.15 docs/sim-validation/p1ms-*.json.gz
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymo.hw import topology as topo                       # noqa: E402
from asymo.lab.scaling import validate as V                  # noqa: E402
from asymo.lab.scaling.result import Point, ScalingResult    # noqa: E402
from asymo.lab.scaling.workloads import make_workloads       # noqa: E402
from asymo.lab.sim import calibrate as C                     # noqa: E402
from sim_validation_summary import read_json             # noqa: E402

TOLERANCE = V.TOLERANCE


def load(path):
    d = read_json(path)
    if not isinstance(d, dict) or "validation" not in d or "meta" not in d:
        raise SystemExit(f"{path}: not a --validate-sim --json file")
    return d


def rebuild(d):
    """The measured ScalingResult of a stored sweep, with fresh workload objects."""
    meta = d["meta"]
    t = topo.parse_spec(meta["topology_spec"])
    emulated = {int(k): float(v) for k, v in (meta.get("emulated") or {}).items()}
    if emulated:
        t = dataclasses.replace(t, emulated=emulated)
    fields = Point.__dataclass_fields__
    pts = [Point(**{k: v for k, v in p.items() if k in fields}) for p in d["points"]]
    res = ScalingResult(points=pts, mode="measured", topology=t, meta=meta,
                        workloads=d.get("workloads", {}))
    res.workload_objs = make_workloads(list(dict.fromkeys(p.workload for p in pts)))
    return res


def leveled(tol):
    """sim_inputs with the session-4 level correction (the rejected variant)."""
    plain = C.sim_inputs

    def sim_inputs(cal, workload, k, topology, **kw):
        jobs, itf = plain(cal, workload, k, topology, **kw)
        r = C.traced_ratio(cal, workload)
        if r is not None and abs(r - 1) <= tol:
            jobs = [dataclasses.replace(j, costs=j.costs / r) for j in jobs]
        return jobs, itf
    return sim_inputs


def revalidate(d, inputs=None):
    """{(workload, policy): 2-core error} of a stored sweep under today's model (or with
    ``inputs`` in place of ``asymo.lab.sim.calibrate.sim_inputs``)."""
    saved = V.sim_inputs
    if inputs is not None:
        V.sim_inputs = inputs
    try:
        val = V.validate_sim(rebuild(d), calibration=d["validation"]["calibration"],
                             emulator_period=d["validation"]["model"].get("emulator_period_s"))
    finally:
        V.sim_inputs = saved
    return {(w, p): e for w, errs in val["sim_error_by_workload"].items()
            for p, e in errs.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--level-tolerance", type=float, default=None,
                    help="also run the rejected level-correction variant with this tolerance")
    args = ap.parse_args(argv)
    variants = {"model": None}
    if args.level_tolerance is not None:
        variants[f"leveled({args.level_tolerance:g})"] = leveled(args.level_tolerance)
    totals = {n: [0, 0] for n in variants}
    for path in args.files:
        d = load(path)
        parts = []
        for name, inputs in variants.items():
            errs = revalidate(d, inputs)
            ok = sum(abs(e) <= TOLERANCE for e in errs.values())
            totals[name][0] += ok
            totals[name][1] += len(errs)
            worst = max(errs.items(), key=lambda kv: abs(kv[1]))
            parts.append(f"{name} {ok}/{len(errs)} within {TOLERANCE:.0%} (worst "
                         f"{worst[0][0]} {worst[0][1]} {worst[1]:+.1%})")
        print(f"{os.path.basename(path)}: " + "; ".join(parts))
    print("total: " + "; ".join(f"{n} {a}/{b}" for n, (a, b) in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
