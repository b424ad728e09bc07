"""Benchmark: planned pipeline vs kernel-level vs the parallel design, per zoo model.

Runs under the asymmetry emulator (default: core 1 at speed 0.5, ``asymo.lab.emulate``) unless
``--no-emulate``. For each model it plans a pipeline (stages, cores, layer ranges), then runs,
side by side in this process, the same frames through

- the planned pipeline (``asymo.pipeline.Pipeline``),
- kernel-level: every layer on all cores, one asymo pool (``KernelLevel``),
- paper 001's parallel design: whole frames per cluster (``ParallelFrames``),

and prints images/s (steady-state output rate) and median latency, medians over ``--repeats``
runs, plus the planner's predicted throughput against the measured one.

Layer times for the plan: ``--times measured`` (default; each layer measured on each core
configuration, Pipe-it's "measured layer time") or ``--times model`` (the calibrated time
model, or the default model scaled by capacity). The time-model prediction of the chosen plan
is printed in both cases.

With ``--graph`` it benchmarks issue 18 instead: pipelines over any runtime for ONNX models of
torchvision-style networks (``asymo.models.torchvision_defs``, exported with torch's ONNX
exporter; ``--onnx-dir`` caches the files): ResNet-50, MobileNet V2, SqueezeNet 1.1 and
GoogLeNet, for each emulation setting of ``--settings`` (``none`` = symmetric cores, or a
speed for ``--core``). Per network and setting it plans by measurement
(``asymo.pipeline.anyplan``), then runs, in interleaved rounds with a pause between runtimes,
the planned pipeline and ONNX Runtime / torch on every core and on the fast core alone, and
prints medians: frames/s, latency, the pipeline over the best ONNX Runtime against the
target (1.35x at 0.5, 1.2x at 0.33, 1.0x symmetric) and the predicted throughput's error
(target within 15%). The planner may choose paper 001's parallel design (whole frames per
cluster or per core, "frames: ..."); the column ``stg x`` is then the best plan of stages
alone (``parallel=False``, the same measurements), run in the same rounds.

Run it alone: ``flock /tmp/asymo-bench.lock python3 bench/pipeline.py [--graph]``.
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _median_runs(runner, frames, warm, repeats, timeout):
    runner.run(warm, timeout=timeout)
    sts = [runner.run(frames, timeout=timeout)[1] for _ in range(repeats)]
    return (statistics.median(s.throughput for s in sts),
            statistics.median(s.latency for s in sts), sts)


def bench_model(name, top, args):
    import asymo.models as zoo
    from asymo.pipeline.calibrate import measure_layer_times
    from asymo.pipeline.configs import core_configs
    from asymo.pipeline.plan import plan_pipeline
    from asymo.pipeline.runtime import KernelLevel, ParallelFrames, Pipeline
    from asymo.pipeline.timemodel import LayerTimeModel

    model = zoo.get(name, image_size=args.image_size)
    model.materialize()
    tm = LayerTimeModel.load(top)
    model_table = tm.table(model, core_configs(top))
    table = measure_layer_times(model, top) \
        if args.times == "measured" else model_table
    plan = plan_pipeline(model, top, table=table, allow_kernel_level=False)
    # the time model's view of the same plan
    pred_model = 1.0 / max(model_table.stage_time(s.config, s.layers[0], s.layers[1] + 1)
                           for s in plan.stages)
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((args.frames,) + model.input_shape, dtype=np.float32)
    warm = frames[:2]
    res = {"model": name, "layers": len(model.layers), "pipeline": plan.describe(),
           "stages": [{"cpus": list(s.cpus), "layers": list(s.layers)} for s in plan.stages],
           "predicted_throughput": plan.predicted_throughput,
           "predicted_throughput_timemodel": pred_model, "times": table.source}
    with Pipeline(model, plan, topology=top, timeout=args.timeout) as p:
        thr, lat, sts = _median_runs(p, frames, warm, args.repeats, args.timeout)
        res["pipeline_stage_utilisation"] = sts[-1].stage_utilisation
    with KernelLevel(model, topology=top, timeout=args.timeout) as k:
        kthr, klat, _ = _median_runs(k, frames, warm, args.repeats, args.timeout)
    with ParallelFrames(model, topology=top, timeout=args.timeout) as pf:
        pthr, plat, _ = _median_runs(pf, frames, warm, args.repeats, args.timeout)
    res.update(pipeline_throughput=thr, pipeline_latency=lat, kernel_level_throughput=kthr,
               kernel_level_latency=klat, parallel_throughput=pthr, parallel_latency=plat,
               speedup_vs_kernel_level=thr / kthr,
               prediction_error=plan.predicted_throughput / thr - 1,
               prediction_error_timemodel=pred_model / thr - 1)
    return res


GRAPH_NETWORKS = ("resnet50", "mobilenet_v2", "squeezenet1_1", "googlenet")
GRAPH_TARGETS = {"none": 1.0, 0.5: 1.35, 0.33: 1.2}


def _export(name, onnx_dir):
    """ONNX file of torchvision-style network ``name`` (exported once into ``onnx_dir``)."""
    path = os.path.join(onnx_dir, f"{name}.onnx")
    if not os.path.isfile(path):
        import warnings

        import torch

        from asymo.models.torchvision_defs import build
        os.makedirs(onnx_dir, exist_ok=True)
        m = build(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (torch.randn(1, 3, 224, 224),), path, dynamo=False,
                              opset_version=17, input_names=["x"], output_names=["y"])
    return path


def bench_graph(name, path, top, args):
    import time

    from asymo.pipeline.anyplan import plan_graph_pipeline
    from asymo.pipeline.compare import runtime_baselines
    from asymo.pipeline.executors import parse_executors
    from asymo.pipeline.graphcut import CutGraph
    from asymo.pipeline.stages import open_plan

    graph = CutGraph(path, name=name)
    t0 = time.perf_counter()
    plan = plan_graph_pipeline(graph, top, executors=parse_executors(args.executors),
                               timeout=args.timeout)
    t_plan = time.perf_counter() - t0
    staged = plan
    if plan.mode != "pipeline":
        staged = plan_graph_pipeline(graph, top, executors=parse_executors(args.executors),
                                     timeout=args.timeout, parallel=False,
                                     segment_times=plan.segment_times,
                                     transfer_k=plan.transfer_k)
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((args.frames,) + tuple(graph.input_shape), dtype=np.float32)
    pipe, stg, base = [], [], {}
    with contextlib.ExitStack() as stack:
        p = stack.enter_context(open_plan(graph, plan, topology=top, timeout=args.timeout))
        p.run(frames[:2])
        q = None
        if staged is not plan:
            q = stack.enter_context(open_plan(graph, staged, topology=top,
                                              timeout=args.timeout))
            q.run(frames[:2])
        for _ in range(args.repeats):   # interleaved rounds: the plan(s), then each runtime
            _, st = p.run(frames)
            pipe.append(st)
            if q is not None:
                time.sleep(0.3)
                stg.append(q.run(frames)[1])
            time.sleep(0.3)
            for k, v in runtime_baselines(graph, top, frames).items():
                base.setdefault(k, []).append(v)
    thr = statistics.median(s.throughput for s in pipe)
    thr_staged = statistics.median(s.throughput for s in (stg or pipe))
    lat = statistics.median(s.latency for s in pipe)
    b = {k: {"throughput": statistics.median(x["throughput"] for x in v),
             "latency_s": statistics.median(x["latency_s"] for x in v)}
         for k, v in base.items()}
    best_ort = max(v["throughput"] for k, v in b.items() if k.startswith("ort@"))
    return {"model": name, "segments": len(graph), "pipeline": plan.describe(),
            "plan": plan.to_dict(), "plan_seconds": t_plan,
            "stages_only_pipeline": staged.describe(),
            "stages_only_throughput": thr_staged,
            "stages_only_speedup_vs_best_ort": thr_staged / best_ort,
            "throughput": thr, "latency_s": lat,
            "stage_utilisation": pipe[-1].stage_utilisation, "baselines": b,
            "speedup_vs_best_ort": thr / best_ort,
            "predicted_throughput": plan.predicted_throughput,
            "prediction_error": plan.predicted_throughput / thr - 1,
            "model_prediction_error": plan.model_throughput / thr - 1}


def main_graph(args):
    from asymo.hw import topology as topo

    settings = []
    for x in args.settings.split(","):
        settings.append("none" if x == "none" else float(x))
    paths = {n: _export(n, args.onnx_dir) for n in args.networks.split(",")}
    rows = []
    print(f"machine: {platform.processor() or platform.machine()}, "
          f"{len(os.sched_getaffinity(0))} usable cpus; executors {args.executors}; "
          f"{args.frames} frames per run, median of {args.repeats} interleaved rounds")
    for setting in settings:
        if setting == "none":
            ctx = contextlib.nullcontext()
        else:
            from asymo.lab.emulate import slow_cores
            ctx = slow_cores({args.core: setting})
        with ctx:
            top = topo.detect()
            target = GRAPH_TARGETS.get(setting)
            label = "symmetric" if setting == "none" else f"core {args.core} at {setting}"
            print(f"\nsetting: {label}; topology {top.to_spec()}; target pipeline >= "
                  f"{target if target else '?'}x best ORT")
            print(f"{'model':<14}{'plan':<44}{'pipe/s':>8}{'ORTall':>8}{'ORTfast':>8}"
                  f"{'trch all':>9}{'trch1':>7}{'x ORT':>7}{'pred/s':>8}{'err':>7}"
                  f"{'lat ms':>8}{'stg x':>7}")
            for name, path in paths.items():
                r = bench_graph(name, path, top, args)
                r["setting"] = setting
                r["target"] = target
                rows.append(r)
                b = r["baselines"]
                g = lambda k: b.get(k, {}).get("throughput", float("nan"))  # noqa: E731
                print(f"{name:<14}{r['pipeline'][:43]:<44}{r['throughput']:8.2f}"
                      f"{g('ort@all'):8.2f}{g('ort@fast'):8.2f}{g('torch@all'):9.2f}"
                      f"{g('torch@fast'):7.2f}{r['speedup_vs_best_ort']:6.2f}x"
                      f"{r['predicted_throughput']:8.2f}{100 * r['prediction_error']:6.1f}%"
                      f"{1e3 * r['latency_s']:8.1f}"
                      f"{r['stages_only_speedup_vs_best_ort']:6.2f}x", flush=True)
                if args.json:  # after every row: a long run that is stopped keeps its rows
                    with open(args.json, "w") as f:
                        json.dump({"args": vars(args), "rows": rows}, f, indent=1,
                                  default=str)
    return 0


def main(argv=None):
    import asymo.models as zoo
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="store_true",
                    help="issue 18: ONNX networks, pipelines over any runtime vs ORT / torch")
    ap.add_argument("--networks", default=",".join(GRAPH_NETWORKS), help="with --graph")
    ap.add_argument("--settings", default="none,0.5,0.33",
                    help="with --graph: 'none' (symmetric) and/or speeds of --core")
    ap.add_argument("--executors", default="asymo,ort,torch", help="with --graph")
    ap.add_argument("--onnx-dir", default="/tmp/asymo-bench-onnx", help="with --graph")
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--times", choices=("measured", "model"), default="measured")
    ap.add_argument("--core", type=int, default=1, help="core to slow down (default 1)")
    ap.add_argument("--speed", type=float, default=0.5, help="its speed (default 0.5)")
    ap.add_argument("--no-emulate", action="store_true")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    args = ap.parse_args(argv)
    if args.graph:
        return main_graph(args)

    from asymo.hw import topology as topo
    if args.no_emulate:
        ctx = contextlib.nullcontext()
    else:
        from asymo.lab.emulate import slow_cores
        ctx = slow_cores({args.core: args.speed})
    rows = []
    with ctx:
        top = topo.detect()
        print(f"machine: {platform.processor() or platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} usable cpus; topology {top.to_spec()} "
              f"({top.source})")
        print("emulation: " + ("none" if args.no_emulate else
                               f"core {args.core} at speed {args.speed} (SCHED_FIFO occupier; "
                               "emulates speed, not cache size)"))
        print(f"frames per run {args.frames}, median of {args.repeats} runs; image size "
              f"{args.image_size or 'native'}; plan from {args.times} layer times\n")
        hdr = (f"{'model':<13}{'pipeline':<12}{'pipe/s':>8}{'kl/s':>8}{'par/s':>8}"
               f"{'pipe/kl':>8}{'lat ms p/kl/par':>21}{'pred/s':>8}{'err':>7}{'err(tm)':>8}")
        print(hdr)
        for name in args.models.split(","):
            r = bench_model(name, top, args)
            rows.append(r)
            lat = (f"{1e3 * r['pipeline_latency']:.0f}/{1e3 * r['kernel_level_latency']:.0f}/"
                   f"{1e3 * r['parallel_latency']:.0f}")
            print(f"{r['model']:<13}{r['pipeline']:<12}{r['pipeline_throughput']:8.2f}"
                  f"{r['kernel_level_throughput']:8.2f}{r['parallel_throughput']:8.2f}"
                  f"{r['speedup_vs_kernel_level']:7.2f}x{lat:>21}"
                  f"{r['predicted_throughput']:8.2f}{100 * r['prediction_error']:6.1f}%"
                  f"{100 * r['prediction_error_timemodel']:7.1f}%", flush=True)
    sp = [r["speedup_vs_kernel_level"] for r in rows]
    err = [abs(r["prediction_error"]) for r in rows]
    errtm = [abs(r["prediction_error_timemodel"]) for r in rows]
    print(f"\naverage pipeline / kernel-level: {statistics.mean(sp):.2f}x (target >= 1.25x); "
          f"geometric mean {float(np.exp(np.mean(np.log(sp)))):.2f}x")
    print(f"mean |throughput prediction error|: {100 * statistics.mean(err):.1f}% "
          f"({args.times} layer times; target <= 15%), time model: "
          f"{100 * statistics.mean(errtm):.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "topology": top.to_spec(), "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
