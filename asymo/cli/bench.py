"""``asymo bench``: benchmarks. ``asymo bench scaling``: throughput as cores are added.

Measured on this machine (optionally under the asymmetry emulator), or simulated for a preset
CPU, or both compared (``--validate-sim``). Wrap measured runs in
``flock /tmp/asymo-bench.lock`` on shared machines so measurements never overlap.
"""
from __future__ import annotations

import argparse
import sys

from asymo.cli.options import (check_output, check_plot, emulation, json_text,
                                positive_seconds, start_emulation, stop_emulation)

BENCHES = ["scaling", "model"]


def normalize_argv(argv):
    """``asymo bench MODEL.onnx ...`` is ``asymo bench model MODEL.onnx ...``."""
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] not in BENCHES \
            and not argv[1].startswith("-"):
        return [argv[0], "model"] + argv[1:]
    return argv


def register(sub):
    p = sub.add_parser("bench", help="benchmarks (scaling over cores, ...)",
                       description="Benchmarks. Each prints a table with the machine, thread "
                                   "count and emulation settings beside the figures.")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH")
    bsub.required = True
    _register_scaling(bsub)
    _register_model(bsub)


def _register_model(bsub):
    p = bsub.add_parser(
        "model", help="an ONNX model on asymo vs ONNX Runtime and torch (also: asymo bench "
                      "MODEL.onnx)",
        description="Time MODEL.onnx on asymo against ONNX Runtime and torch, each on all "
                    "cores and on the fastest core alone (pinned, one thread), side by side "
                    "in one run: medians of interleaved rounds, thread limits and pinning set "
                    "outside the timed loops, a pause between libraries. Prints the machine, "
                    "the emulation and the ratios (other / asymo: > 1 means asymo is faster).",
        epilog="examples:\n"
               "  flock /tmp/asymo-bench.lock asymo bench resnet18.onnx\n"
               "  flock /tmp/asymo-bench.lock asymo bench resnet18.onnx --emulate 1:0.5 "
               "--compare ort,torch --json r18.json --plot r18.png",
        formatter_class=_HelpFormatter)
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]",
                   help="slow cores with the emulator, e.g. 1:0.5 (needs SCHED_FIFO)")
    p.add_argument("--compare", type=_csv, default=["ort", "torch"], metavar="LIST",
                   help="libraries to compare with: ort, torch (default both; those not "
                        "installed are skipped)")
    p.add_argument("--batch", type=int, default=1, metavar="N", help="batch size (default 1)")
    p.add_argument("--repeats", type=int, default=5, metavar="N",
                   help="interleaved rounds; the median is reported (default 5)")
    p.add_argument("--min-time", type=positive_seconds, default=0.3, metavar="SEC",
                   help="seconds of back-to-back calls per library per round (default 0.3)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", default=None, metavar="FILE", help="write a bar chart (PNG/SVG)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_model)


def _run_model(args):
    from asymo.cli.bench_model import LIBRARIES, compare, format_table, plot
    from asymo.cli.run import first_call, load_onnx, random_input

    bad = [c for c in args.compare if c not in LIBRARIES]
    if bad:
        raise SystemExit(f"asymo bench: error: --compare takes {', '.join(LIBRARIES)}, "
                         f"got {bad}")
    if args.batch < 1 or args.repeats < 1:
        raise SystemExit("asymo bench: error: --batch and --repeats must be >= 1")
    try:
        # checked now, not when the results are written: the run takes a while
        if args.json is not None:
            check_output(args.json, "--json")
        if args.plot is not None:
            check_plot(args.plot)
    except ValueError as exc:
        raise SystemExit(f"asymo bench: error: {exc}") from None
    model, t_load = load_onnx(args.model)
    with open(args.model, "rb") as f:
        data = f.read()
    x = random_input(model, args.batch, "asymo bench")
    # the call `asymo run` makes: a model asymo cannot run on one random input (several
    # inputs, ...) is refused in its words now, not by a traceback from the timed rounds
    first_call(model, x, "asymo bench")
    with emulation(args.emulate, "asymo bench"):
        res = compare(model, x, compare=args.compare, onnx_bytes=data,
                      emulation=(f"{args.emulate} (emulator, speed only: the slowed core keeps "
                                 "its caches)" if args.emulate else None),
                      repeats=args.repeats, min_time=args.min_time,
                      progress=not args.no_progress)
    res["load_s"] = t_load
    print(format_table(res))
    print(f"load (file to planned model): {t_load * 1e3:.0f} ms")
    try:
        if args.json:
            with open(args.json, "w") as f:
                f.write(json_text(res))
        if args.plot:
            plot(res, args.plot)
    except OSError as exc:  # the path was checked before the run; this is what changed since
        raise SystemExit(f"asymo bench: error: cannot write {exc.filename or 'output'}: "
                         f"{exc.strerror or exc}") from None
    return 0


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _overheads(text):
    from asymo.lab.sim.engine import Overheads
    try:
        vals = [float(v) / 1e6 for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--sim-overheads {text!r}: expected JOB,TASK,STEAL in microseconds, "
                         "e.g. 10,0.2,0.5") from None
    if len(vals) != 3:
        raise ValueError(f"--sim-overheads {text!r}: expected three numbers JOB,TASK,STEAL")
    return Overheads(job=vals[0], task=vals[1], steal=vals[2])


def _period_range():
    try:
        from asymo.lab.emulate import DEFAULT_PERIOD, MAX_PERIOD, MIN_PERIOD
    except ImportError:
        return "default: asymo.lab.emulate.DEFAULT_PERIOD"
    return f"default {DEFAULT_PERIOD:g}, from {MIN_PERIOD:g} to {MAX_PERIOD:g}"


class _HelpFormatter(argparse.HelpFormatter):
    """Fills the description to the terminal's width like the default formatter, but keeps
    indented lines (the examples in the epilog) as written."""

    def _fill_text(self, text, width, indent):
        out = []
        for line in text.splitlines():
            if line.startswith(" "):
                out.append(indent + line)
            else:
                out.append(super()._fill_text(line, width, indent))
        return "\n".join(out)


def _register_scaling(bsub):
    from asymo.lab.scaling import BASELINES, POOL_POLICIES, WORKLOADS
    from asymo.lab.sim.presets import preset_names
    p = bsub.add_parser(
        "scaling", help="throughput as cores are added, per pool policy, NumPy and torch",
        description="Throughput of matmul, conv2d, whole zoo models (and 'spin', equal "
                    "compute-bound pool tasks) on 1..N cores, adding the fastest cluster's "
                    "cores first, for each pool policy (asymo, even, shared, steal), NumPy "
                    "(BLAS threads limited with threadpoolctl) and torch when installed. "
                    "On an asymmetric CPU an even split gets slower when the slow cores join; "
                    "asymo's split should keep scaling. Measured here, or simulated for a "
                    "preset CPU with --simulate.",
        epilog="examples:\n"
               "  flock /tmp/asymo-bench.lock asymo bench scaling --emulate 1:0.5 "
               "--plot scaling.png\n"
               "  asymo bench scaling --simulate kirin970 --workload matmul --json k970.json\n"
               "  asymo bench scaling --simulate kirin970 --sim-profile k970-profile.json "
               "--workload matmul,conv2d\n"
               "  flock /tmp/asymo-bench.lock asymo bench scaling --emulate 1:0.5 "
               "--workload spin,matmul --calibrate-sim cal.json\n"
               "  flock /tmp/asymo-bench.lock asymo bench scaling --emulate 1:0.5 "
               "--workload spin,matmul --validate-sim --sim-calibration cal.json --json v.json",
        formatter_class=_HelpFormatter)
    p.add_argument("--workload", "-w", type=_csv, default=None, metavar="LIST",
                   help=f"comma-separated workloads from {', '.join(WORKLOADS)} "
                        "(default: spin, plus matmul when asymo.matmul is built)")
    p.add_argument("--policies", type=_csv, default=None, metavar="LIST",
                   help=f"subset of {', '.join(POOL_POLICIES + BASELINES)} "
                        "(default: all available; --simulate models the pool policies and "
                        "numpy, as a static equal split, not torch)")
    p.add_argument("--full", action="store_true",
                   help="larger workloads (several shapes/layers/models) instead of the quick "
                        "default")
    p.add_argument("--repeats", type=int, default=5, metavar="N",
                   help="samples per point; the median is reported (default 5)")
    p.add_argument("--min-time", type=float, default=0.02, metavar="SEC",
                   help="each sample repeats the workload for at least this long (default "
                        "0.02)")
    p.add_argument("--max-external-load", type=float, default=0.05, metavar="SHARE",
                   help="a run during which other processes used more than SHARE of the "
                        "cores is disturbed: it is repeated (up to 4x --repeats) and left out "
                        "of the median (default 0.05; 1 keeps every run)")
    p.add_argument("--max-cores", type=int, default=None, metavar="K",
                   help="stop at K cores")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="explicit topology for measured runs, e.g. 'big:0@1.0,little:1@0.5'")
    p.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]",
                   help="run under the asymmetry emulator, e.g. 1:0.5 slows cpu 1 to half "
                        "speed (needs SCHED_FIFO: root or CAP_SYS_NICE)")
    p.add_argument("--simulate", default=None, metavar="PRESET",
                   help=f"simulate instead of measuring: a preset ({', '.join(preset_names())}) "
                        "or a topology spec such as 'big:0-3@1.0,little:4-7@0.45'")
    p.add_argument("--sim-overheads", type=str, default=None, metavar="JOB,TASK,STEAL",
                   help="simulator scheduling costs in microseconds (default: those measured "
                        "for the pool on the development machine)")
    p.add_argument("--interfere", default=None, metavar="CPU:SPEED[:START:STOP],...",
                   help="with --simulate: slow core CPU to SPEED (0..1) for the whole run, or "
                        "from START to STOP milliseconds into it (interference from other "
                        "apps, thermal throttling)")
    p.add_argument("--sim-corun", type=float, default=None, metavar="FACTOR",
                   help="with --simulate: co-running interference, a core's speed (0..1] "
                        "while one other core runs tasks (default: none assumed; "
                        "--calibrate-sim measures it on a machine at hand)")
    p.add_argument("--sim-profile", metavar="FILE", default=None,
                   help="with --simulate: price GEMM tasks (matmul, conv2d, models) with the "
                        "cost models of this calibration profile (written by `asymo "
                        "calibrate`, e.g. on the device being simulated; its clusters must "
                        "match the simulated topology's) instead of a flat GFLOP/s per "
                        "cluster; other work (spin) keeps the capabilities. The output says "
                        "which costs came from where")
    p.add_argument("--validate-sim", action="store_true",
                   help="also run the simulator for this machine, fed only by its inputs "
                        "(asymo.lab.sim.calibrate) measured in runs of their own interleaved with "
                        "the sweep's rounds (or read from --sim-calibration FILE), and print "
                        "measured against simulated per-policy throughput (adds the spin "
                        "workload, scheduling alone, when not selected)")
    p.add_argument("--calibrate-sim", metavar="FILE", default=None,
                   help="measure the simulator's inputs for this machine (traced task costs "
                        "per workload and core count, the emulated cores' availability, "
                        "co-running interference, overheads), print them and write them as "
                        "JSON to FILE; with --validate-sim the sweep follows and is compared "
                        "with them, else nothing else is measured")
    p.add_argument("--sim-calibration", metavar="FILE", default=None,
                   help="with --validate-sim: the simulator's inputs from a file written by "
                        "--calibrate-sim (an earlier, separate run) instead of measuring them "
                        "beside the sweep (a file for another topology or format is reported "
                        "and replaced by a fresh measurement)")
    p.add_argument("--emulator-period", type=float, default=None, metavar="SEC",
                   help="with --emulate: the emulator's period in seconds "
                        f"({_period_range()}); the simulator's duty cycle uses the "
                        "same (without --emulate, a running emulator's period is read from "
                        "env ASYMO_EMULATED_PERIOD)")
    p.add_argument("--json", metavar="FILE", default=None, help="write the points as JSON")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="write a PNG plot (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_scaling)


def _check_policies(names, simulate):
    """Reject unknown policy names up front (a typo would otherwise be skipped silently, or
    fail only after the workloads were built)."""
    from asymo.lab.scaling import BASELINES, POOL_POLICIES
    known = list(POOL_POLICIES) + list(BASELINES)
    if not names:
        raise ValueError(f"--policies is empty; give some of {', '.join(known)}")
    for name in names:
        if name not in known:
            raise ValueError(f"unknown policy {name!r} in --policies; choose from "
                             f"{', '.join(known)}")
        if simulate and name == "torch":
            raise ValueError("torch is not simulated: --simulate models the pool policies "
                             f"({', '.join(POOL_POLICIES)}) and numpy (a static equal split)")


def _sim_target(text):
    """A preset name, or a topology spec ('big:0-3@1.0,little:4-7@0.45') to simulate."""
    from asymo.lab.sim.presets import get_preset
    from asymo.hw.topology import parse_spec
    if "@" in text or ":" in text:
        return parse_spec(text)
    return get_preset(text)


def _default_workloads():
    return ["spin", "matmul"]


def run_scaling(args):
    from asymo.lab import scaling
    from asymo.hw import topology as topo
    try:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        if not 0 < args.max_external_load <= 1:
            raise ValueError(f"--max-external-load must lie in (0, 1], got "
                             f"{args.max_external_load}")
        if args.max_cores is not None and args.max_cores < 1:
            raise ValueError(f"--max-cores must be >= 1, got {args.max_cores}")
        if args.simulate and (args.validate_sim or args.emulate):
            raise ValueError("--simulate does not measure: it cannot be combined with "
                             "--validate-sim or --emulate")
        # checked now, not when the results are written: the run may take minutes
        for option, path in (("--json", args.json), ("--calibrate-sim", args.calibrate_sim)):
            if path is not None:
                check_output(path, option)
        if args.plot is not None:
            check_plot(args.plot)
        if args.policies is not None:
            _check_policies(args.policies, simulate=bool(args.simulate))
        names = args.workload or _default_workloads()
        if args.validate_sim and "spin" not in names:
            names = ["spin"] + list(names)
        workloads = scaling.make_workloads(names, quick=not args.full)
        overheads = _overheads(args.sim_overheads) if args.sim_overheads else None
        emulate = scaling.parse_emulate(args.emulate) if args.emulate is not None else None
        preset = _sim_target(args.simulate) if args.simulate else None
        if args.interfere and not args.simulate:
            raise ValueError("--interfere is a simulator option: use it with --simulate "
                             "(use --emulate to slow cores of this machine)")
        interference = scaling.parse_interference(args.interfere) if args.interfere else ()
        if args.sim_corun is not None and not args.simulate:
            raise ValueError("--sim-corun is a simulator option: use it with --simulate")
        if args.sim_profile and not args.simulate:
            raise ValueError("--sim-profile is a simulator option: use it with --simulate")
        cost_models = None
        if args.sim_profile:
            from asymo.lab.sim.costs import load_model_costs
            cost_models = load_model_costs(args.sim_profile, getattr(preset, "topology",
                                                                     preset))
        if args.sim_corun is not None and not 0 < args.sim_corun <= 1:
            raise ValueError(f"--sim-corun must lie in (0, 1], got {args.sim_corun}")
        if args.emulator_period is not None and not args.emulate:
            raise ValueError("--emulator-period needs --emulate")
        if args.sim_calibration and not args.validate_sim:
            raise ValueError("--sim-calibration is read by --validate-sim")
        if args.sim_calibration and args.calibrate_sim:
            raise ValueError("--sim-calibration reads a calibration, --calibrate-sim measures "
                             "one: give one of them")
        if args.calibrate_sim and args.simulate:
            raise ValueError("--calibrate-sim measures this machine: it cannot be combined "
                             "with --simulate")
        period = args.emulator_period
        if period is None and emulate:
            from asymo.lab.emulate import DEFAULT_PERIOD as period
    except (ValueError, TypeError) as exc:
        print(f"asymo bench scaling: error: {exc}", file=sys.stderr)
        return 2

    if preset is not None:
        try:
            result = scaling.simulate_scaling(preset, workloads, policies=args.policies,
                                              overheads=overheads, max_cores=args.max_cores,
                                              interference=interference,
                                              corun=args.sim_corun,
                                              progress=not args.no_progress,
                                              cost_models=cost_models)
        except ValueError as exc:   # what the simulator cannot model, e.g. a stopped core
            print(f"asymo bench scaling: error: {exc}", file=sys.stderr)
            return 2
    else:
        from asymo.lab.sim import calibrate as simcal
        try:
            emu = start_emulation(args.emulate, period)
        except ValueError as exc:   # says which --emulate, and why the emulator refused it
            print(f"asymo bench scaling: error: {exc}", file=sys.stderr)
            return 2
        try:
            t = topo.detect(override=args.topology)
            cal = None
            if args.sim_calibration:
                cal = simcal.load_calibration(args.sim_calibration, topology=t)
                if cal is None:
                    print("asymo bench scaling: measuring the simulator's inputs instead",
                          file=sys.stderr)
            elif args.calibrate_sim:
                cal = simcal.calibrate_sim(t, workloads, repeats=args.repeats,
                                           emulator_period=period, min_time=args.min_time,
                                           max_external=args.max_external_load,
                                           progress=not args.no_progress)
                simcal.save_calibration(cal, args.calibrate_sim)
                print("\n".join(simcal.format_calibration(cal)))
                print(f"wrote {args.calibrate_sim}")
                if not args.validate_sim:
                    return 0
            result = scaling.measure_scaling(workloads, policies=args.policies, topology=t,
                                             max_cores=args.max_cores, repeats=args.repeats,
                                             min_time=args.min_time,
                                             progress=not args.no_progress,
                                             calibrate=args.validate_sim and cal is None,
                                             max_external=args.max_external_load,
                                             emulator_period=period if emulate else None)
            if args.validate_sim:
                scaling.validate_sim(result, calibration=cal, emulator_period=period)
        finally:
            stop_emulation(emu)
    print(result.table())
    try:
        if args.json:
            with open(args.json, "w") as f:
                f.write(json_text(result.to_dict(), indent=1))
            print(f"wrote {args.json}")
        if args.plot:
            result.plot(args.plot)
            print(f"wrote {args.plot}")
    except OSError as exc:
        print(f"asymo bench scaling: error: cannot write {exc.filename or 'output'}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
