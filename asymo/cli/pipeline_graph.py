"""``asymo pipeline MODEL.onnx``: plan by measurement, run and compare (issue 18)."""
from __future__ import annotations

import sys

import numpy as np

# a prediction further than this from the measured throughput is reported as off
PREDICTION_TOLERANCE = 0.15


def run_graph(args):
    from asymo.hw import topology as topo
    from asymo.pipeline.anyplan import plan_graph_pipeline
    from asymo.pipeline.compare import runtime_baselines
    from asymo.pipeline.executors import available_executors, parse_executors
    from asymo.pipeline.graphcut import CutGraph
    from asymo.pipeline.runtime import PipelineError
    from asymo.pipeline.stages import open_plan
    from asymo.cli.options import json_text, random_frames

    if args.image_size is not None:
        raise SystemExit("asymo: --image-size does not apply to an ONNX model (its input "
                         "shape is fixed by the file)")
    try:
        graph = CutGraph(args.model)
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"asymo: {args.model}: {exc}") from None
    try:
        kinds = parse_executors(args.executors or available_executors())
    except ValueError as exc:
        raise SystemExit(f"asymo: --executors: {exc}") from None
    try:
        top = topo.detect(override=args.topology)
    except topo.TopologyError as exc:
        raise SystemExit(f"asymo: {exc}") from None

    def progress(msg):
        if not args.json:
            print(f"  .. {msg}", file=sys.stderr, flush=True)

    try:
        frames, = random_frames(np.random.default_rng(0), [("--frames", args.frames)],
                                graph.input_shape)
    except ValueError as exc:
        raise SystemExit(f"asymo pipeline: error: {exc}") from None
    try:
        plan = plan_graph_pipeline(graph, top, executors=kinds, objective=args.objective,
                                   transfer_k=args.transfer_k or None, progress=progress,
                                   timeout=args.timeout, parallel=not args.stages_only)
    except ValueError as exc:
        raise SystemExit(f"asymo: cannot plan {graph.name}: {exc}") from None
    warm = frames[:max(1, min(args.warmup, args.frames))]
    progress(f"running {args.frames} frames through {plan.describe()}")
    try:
        with open_plan(graph, plan, topology=top, timeout=args.timeout) as p:
            if args.warmup:
                p.run(warm)
            _, st = p.run(frames)
    except (TimeoutError, PipelineError) as exc:
        raise SystemExit(f"asymo: pipeline gave up: {exc} (raise --timeout?)") from None
    err = plan.predicted_throughput / st.throughput - 1.0
    result = {"model": graph.name, "file": str(args.model), "topology": top.to_spec(),
              "emulated": {str(k): v for k, v in top.emulated.items()},
              "executors": list(kinds), "skipped_executors": plan.segment_times.skipped,
              "segments": len(graph), "frames": args.frames, "plan": plan.to_dict(),
              "throughput": st.throughput, "latency_s": st.latency,
              "latency_p90_s": st.latency_p90, "stage_utilisation": st.stage_utilisation,
              "stage_time_s": st.stage_time,
              "predicted_throughput": plan.predicted_throughput,
              "prediction_error": err,
              "prediction_ok": abs(err) <= PREDICTION_TOLERANCE}
    base = {}
    if args.compare:
        progress("measuring ONNX Runtime and torch on all cores and on the fast core alone")
        skipped = {}
        base = runtime_baselines(graph, top, frames, skipped=skipped)
        result["baselines"] = base
        result["skipped_baselines"] = skipped
        ort = [v["throughput"] for k, v in base.items() if k.startswith("ort@")]
        if ort:
            result["speedup_vs_best_ort"] = st.throughput / max(ort)
    if args.json:
        print(json_text(result))
        return 0
    print(f"model {graph.name} ({len(graph)} segments) on {top.to_spec()}"
          + (f" (emulated: {top.emulated})" if top.emulated else ""))
    print(f"plan: {plan.describe()}   ({plan.objective}; {plan.source})")
    for k, why in plan.segment_times.skipped.items():
        print(f"  executor {k} not used: {why}")
    what = "group" if plan.mode == "parallel" else "stage"
    if plan.mode == "parallel":
        print("  (parallel frames: each group runs the whole model, frames go to whichever "
              "is free; a frame's latency is its group's)")
    for i, (s, u, t) in enumerate(zip(plan.stages, st.stage_utilisation, st.stage_time)):
        print(f"  {what} {i}: {s.executor:<5} cpus {list(s.cpus)} segments "
              f"[{s.segments[0]}, {s.segments[1]}]  {1e3 * t:8.2f} ms/frame "
              f"(predicted {1e3 * s.predicted_time:8.2f})  utilisation {100 * u:5.1f}%")
    print(f"{'':<16}{'frames/s':>10}{'latency ms':>12}")
    print(f"{'pipeline':<16}{st.throughput:10.2f}{1e3 * st.latency:12.2f}"
          f"   (predicted {plan.predicted_throughput:.2f} frames/s)")
    names = {"ort@all": "ORT all cores", "ort@fast": "ORT fast core",
             "torch@all": "torch all cores", "torch@fast": "torch fast core"}
    for k, v in base.items():
        print(f"{names.get(k, k):<16}{v['throughput']:10.2f}{1e3 * v['latency_s']:12.2f}")
    for rt, why in result.get("skipped_baselines", {}).items():
        print(f"{rt + ' (not run)':<16}  {why}")
    if "speedup_vs_best_ort" in result:
        print(f"pipeline / best ONNX Runtime: {result['speedup_vs_best_ort']:.2f}x "
              "(higher is better)")
    if abs(err) > PREDICTION_TOLERANCE:
        print(f"warning: predicted throughput {plan.predicted_throughput:.2f} frames/s is "
              f"{100 * abs(err):.0f}% off the measured {st.throughput:.2f} (more than "
              f"{100 * PREDICTION_TOLERANCE:.0f}%); the machine may be busy, re-run to "
              "re-measure")
    else:
        print(f"predicted throughput within {100 * abs(err):.0f}% of measured")
    return 0
