"""``asymo pipeline``: run a planned pipeline on this machine and measure it."""
from __future__ import annotations

import argparse

import numpy as np

from asymo.cli.options import emulation, json_text, positive_seconds, random_frames
from asymo.cli.pipeline_common import add_model_args, load_model, make_plan, positive_int


def register(sub):
    p = sub.add_parser(
        "pipeline", help="run a CNN as a pipeline of cluster-local stages and measure it",
        description="Plan a layer-level pipeline for a zoo CNN on this machine (as `asymo "
                    "plan`), run --frames images through it, and report the measured "
                    "throughput (images/s, steady state), latency and per-stage utilisation. "
                    "--compare also runs, in the same process, the kernel-level baseline "
                    "(every layer on all cores, one pool) and paper 001's parallel design "
                    "(whole frames per cluster).")
    add_model_args(p)
    p.add_argument("--frames", type=positive_int, default=20, metavar="N",
                   help="images to process (default 20)")
    p.add_argument("--warmup", type=non_negative_int, default=2, metavar="N",
                   help="images run first and not counted (default 2)")
    p.add_argument("--compare", action="store_true",
                   help="also measure kernel-level and the parallel design")
    p.add_argument("--timeout", type=positive_seconds, default=600.0, metavar="S",
                   help="give up if no image completes within S seconds (default 600)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--executors", default=None, metavar="LIST",
                   help="MODEL.onnx only: stage executors the planner may use, from asymo, "
                        "ort, torch (default: every one installed)")
    p.add_argument("--stages-only", action="store_true",
                   help="MODEL.onnx only: plan pipelines of stages and single-stage runs "
                        "only; by default the parallel design (whole frames per cluster or "
                        "per core, each on its fastest executor) competes for throughput")
    p.add_argument("--emulate", default=None, metavar="CPU:SPEED[,CPU:SPEED]",
                   help="slow cores with asymo's emulator while planning and running, e.g. "
                        "1:0.5 (needs root / CAP_SYS_NICE)")
    p.set_defaults(func=run)


def run(args):
    # the emulator is only loaded when asked for; a spec it refuses is one line, before planning
    with emulation(args.emulate, "asymo pipeline"):
        return _run(args)


def _run(args):
    if args.model.lower().endswith(".onnx"):
        from asymo.cli.pipeline_graph import run_graph
        return run_graph(args)
    if args.executors:
        raise SystemExit("asymo: --executors applies to MODEL.onnx (zoo models run on asymo)")
    from asymo.pipeline.runtime import KernelLevel, ParallelFrames, Pipeline

    if args.topology is not None:
        import os

        from asymo.hw import topology as topo
        try:
            t = topo.parse_spec(args.topology)
        except topo.TopologyError as exc:
            raise SystemExit(f"asymo: {exc}") from None
        allowed = os.sched_getaffinity(0)
        if not set(t.cpus) <= allowed:
            raise SystemExit(f"asymo: --topology names cpus {sorted(set(t.cpus) - allowed)} "
                             "this process cannot run on; `asymo pipeline` runs on this "
                             "machine (use `asymo plan` for another one)")
    model = load_model(args)
    try:
        frames, warm = random_frames(np.random.default_rng(0),
                                     [("--frames", args.frames), ("--warmup", args.warmup)],
                                     model.input_shape)
    except ValueError as exc:
        raise SystemExit(f"asymo pipeline: error: {exc}") from None
    plan, top = make_plan(model, args, this_machine=True)
    model.materialize()
    result = {"model": model.name, "topology": top.to_spec(),
              "emulated": {str(k): v for k, v in top.emulated.items()},
              "frames": args.frames, "plan": plan.to_dict()}
    try:
        with Pipeline(model, plan, topology=top, timeout=args.timeout) as p:
            st = _measure_with(p, warm, frames, args.timeout)
    except TimeoutError as exc:
        raise SystemExit(f"asymo: pipeline gave up: {exc} (raise --timeout?)") from None
    result.update({"throughput": st.throughput, "latency_s": st.latency,
                   "latency_p90_s": st.latency_p90, "wall_throughput": st.wall_throughput,
                   "stage_utilisation": st.stage_utilisation,
                   "stage_time_s": st.stage_time,
                   "predicted_throughput": plan.predicted_throughput})
    if args.compare:
        try:
            with KernelLevel(model, topology=top, timeout=args.timeout) as k:
                sk = _measure_with(k, warm, frames, args.timeout)
            with ParallelFrames(model, topology=top, timeout=args.timeout) as pf:
                sp = _measure_with(pf, warm, frames, args.timeout)
        except TimeoutError as exc:
            raise SystemExit(f"asymo: comparison run gave up: {exc} (raise --timeout?)") \
                from None
        result["kernel_level"] = {"throughput": sk.throughput, "latency_s": sk.latency,
                                  "predicted_throughput":
                                      plan.kernel_level_predicted_throughput}
        result["parallel"] = {"throughput": sp.throughput, "latency_s": sp.latency,
                              "stage_utilisation": sp.stage_utilisation}
        result["speedup_vs_kernel_level"] = st.throughput / sk.throughput
    warnings = prediction_warnings(result)
    result["warnings"] = warnings
    if args.json:
        print(json_text(result))
        return 0
    print(f"model {model.name} on {top.to_spec()}"
          + (f" (emulated: {top.emulated})" if top.emulated else ""))
    print(f"pipeline {plan.describe()} ({plan.method}); times: {plan.source}")
    for i, (s, u, t) in enumerate(zip(plan.stages, st.stage_utilisation, st.stage_time)):
        print(f"  stage {i}: cpus {list(s.cpus)} layers [{s.layers[0]}, {s.layers[1]}]  "
              f"{1e3 * t:8.2f} ms/img (predicted {1e3 * s.predicted_time:8.2f})  "
              f"utilisation {100 * u:5.1f}%")
    print(f"{'':<14}{'img/s':>9}{'latency ms':>12}")
    print(f"{'pipeline':<14}{st.throughput:9.2f}{1e3 * st.latency:12.2f}"
          f"   (predicted {plan.predicted_throughput:.2f} img/s)")
    if args.compare:
        print(f"{'kernel-level':<14}{sk.throughput:9.2f}{1e3 * sk.latency:12.2f}")
        print(f"{'parallel':<14}{sp.throughput:9.2f}{1e3 * sp.latency:12.2f}")
        print(f"pipeline / kernel-level: {st.throughput / sk.throughput:.2f}x")
    for w in warnings:
        print(f"warning: {w}")
    return 0


#: Measured throughput below this share of the prediction gets a warning.
PREDICTION_WARN_RATIO = 0.85


def prediction_warnings(result):
    """Warnings for runs whose measured throughput is under PREDICTION_WARN_RATIO of the
    plan's prediction (the time model or the layer times no longer describe the machine)."""
    out = []
    runs = [("pipeline", result.get("throughput"), result.get("predicted_throughput"))]
    kl = result.get("kernel_level")
    if kl:
        runs.append(("kernel-level", kl.get("throughput"), kl.get("predicted_throughput")))
    for name, got, want in runs:
        if got and want and got < PREDICTION_WARN_RATIO * want:
            out.append(f"{name} measured {got:.2f} img/s, {got / want:.2f}x of the predicted "
                       f"{want:.2f} img/s (below {PREDICTION_WARN_RATIO:.2f}x): the time model "
                       "does not describe this machine now (other load, emulation, or a stale "
                       "calibration). Re-measure the layer times with `asymo plan --measured` "
                       "or recalibrate with `asymo calibrate`.")
    return out


def non_negative_int(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _measure_with(runner, warm, frames, timeout):
    if len(warm):
        runner.run(warm, timeout=timeout)
    _, st = runner.run(frames, timeout=timeout)
    return st
