"""``asymo dvfs``: what CPU frequency control and energy metering this machine offers, and the
least-energy frequency plan for a model (AsyMo)."""
from __future__ import annotations

import sys

from asymo.cli.options import json_text
from asymo.hw import topology as topo


def register(sub):
    p = sub.add_parser(
        "dvfs", help="CPU frequency control, energy meters and least-energy frequency plans",
        description="Show what cpufreq control and energy metering this machine offers "
                    "(status), or the frequencies asymo would choose for a model in "
                    "latency-first and energy-first mode with predicted time and energy "
                    "(plan). Values not measured on this machine are labelled ESTIMATED.")
    sp = p.add_subparsers(dest="dvfs_command", metavar="ACTION")
    sp.required = True

    def common(q):
        q.add_argument("--sysfs-root", default="/sys", metavar="DIR",
                       help="read this sysfs tree instead of the live /sys")
        q.add_argument("--topology", default=None, metavar="SPEC",
                       help="explicit topology, e.g. 'big:4-7@1.0,little:0-3@0.5'")
        q.add_argument("--json", action="store_true", help="print JSON")

    st = sp.add_parser("status", help="governors, frequencies, how they can be set, meters",
                       description="Per cluster: cpufreq policy, driver, governor, available "
                                   "frequencies and whether (and how) asymo can set them; "
                                   "which energy meters are readable; the power model's "
                                   "voltage source.")
    common(st)
    st.set_defaults(func=run_status)

    pl = sp.add_parser("plan", help="least-energy frequencies for a model (not applied)",
                       description="Choose per-cluster frequencies from the model's data "
                                   "reuse (AsyMo Eq. 2) and the energy-frequency curves "
                                   "(measured by `asymo calibrate --energy`, else estimated) "
                                   "and print predicted time and energy for latency-first and "
                                   "energy-first. Nothing is changed on the machine.")
    common(pl)
    src = pl.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME", help="a model of the asymo zoo, e.g. resnet50")
    src.add_argument("--shapes", metavar="M,K,N[;M,K,N...]",
                     help="matmul shapes, e.g. '3136,576,64;1,4096,4096'")
    pl.add_argument("--mode", choices=["energy", "latency"], default="energy",
                    help="which mode's frequencies to list as the choice (default energy)")
    pl.add_argument("--scale-all", action="store_true",
                    help="let every cluster scale (default: the slowest stays at its maximum, "
                         "as in the AsyMo paper)")
    pl.add_argument("--profile", default=None, metavar="PATH",
                    help="calibration profile with measured curves (default: the active one)")
    pl.set_defaults(func=run_plan)


def _topology(args):
    try:
        return topo.detect(sysfs_root=args.sysfs_root, override=args.topology)
    except topo.TopologyError as exc:
        raise SystemExit(f"asymo dvfs: {exc}") from None


def run_status(args):
    from asymo.dvfs import CpuFreq, PowerModel, available_meters
    t = _topology(args)
    cf = CpuFreq(t, sysfs_root=args.sysfs_root)
    clusters = cf.describe()
    meters = [{"meter": n, "readable": ok, "detail": d}
              for n, ok, d in available_meters(args.sysfs_root)]
    pm = PowerModel.from_system(t, args.sysfs_root, cpufreq=cf)
    out = {"clusters": clusters, "meters": meters, "power_model": pm.to_dict()}
    if args.json:
        print(json_text(out))
        return 0
    for name, c in clusters.items():
        freqs = c["frequencies_khz"]
        span = (f"{len(freqs)} frequencies {freqs[0] // 1000}-{freqs[-1] // 1000} MHz"
                + ("" if c["frequencies_listed"] else " (range; driver lists none)")) \
            if freqs else "no frequencies"
        how = f"settable via {c['method']}" if c["method"] else f"NOT settable: {c['reason']}"
        print(f"{name} (cpus {topo.format_cpulist(c['cpus'])}): "
              f"driver {c['driver'] or '-'}, governor {c['governor'] or '-'}, {span}; {how}")
    for m in meters:
        print(f"meter {m['meter']}: " + ("readable, " if m["readable"] else "unavailable: ")
              + m["detail"])
    if not any(m["readable"] for m in meters):
        print("no power meter: energy is ESTIMATED with " + pm.source)
    for name, c in pm.clusters.items():
        print(f"power model {name}: voltages from {c.voltage_source}; C from "
              f"{c.capacitance_source}; P_static {c.p_static_w:.3g} W (ESTIMATE)")
    return 0


def _parse_shapes(text):
    shapes = []
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        try:
            m, k, n = (int(x) for x in part.split(","))
        except ValueError:
            raise SystemExit(f"asymo dvfs plan: bad shape {part!r}; expected M,K,N integers")
        shapes.append((m, k, n))
    return shapes


def run_plan(args):
    from asymo.dvfs import CpuFreq, frequency_plan
    t = _topology(args)
    if args.model is not None and not args.model.strip():
        print("asymo dvfs plan: --model is empty; give a zoo model name (asymo models) or "
              "--shapes", file=sys.stderr)
        return 2
    if args.model:
        try:
            from asymo import models
        except ImportError:
            print("asymo dvfs plan: the model zoo (asymo.models) is not available in this "
                  "build; pass --shapes instead", file=sys.stderr)
            return 2
        try:
            ops = models.get(args.model)
        except (KeyError, ValueError) as exc:
            print(f"asymo dvfs plan: {exc}", file=sys.stderr)
            return 2
    else:
        ops = _parse_shapes(args.shapes)
    profile = None
    if args.profile:
        from asymo.profile import load_profile
        profile = load_profile(args.profile, t, warn_missing=True)
    cf = CpuFreq(t, sysfs_root=args.sysfs_root)
    try:
        plan = frequency_plan(ops, mode=args.mode, cpufreq=cf, profile=profile,
                              fixed_at_max=() if args.scale_all else None)
    except ValueError as exc:  # e.g. a zero dimension, no shapes at all
        raise SystemExit(f"asymo dvfs plan: {exc}") from None
    plan.report.applied_reason = "asymo dvfs plan only predicts; use asymo.frequency_plan()"
    if args.json:
        print(json_text(plan.report.to_dict()))
    else:
        print(plan.report)
    return 0
