"""``asymo plan``: a layer-level pipeline plan for a zoo model (Pipe-it and successors)."""
from __future__ import annotations

import sys

from asymo.cli.options import json_text
from asymo.cli.pipeline_common import add_model_args, load_model, make_plan


def register(sub):
    p = sub.add_parser(
        "plan", help="plan a pipeline of cluster-local stages for a CNN",
        description="Plan a layer-level pipeline for a zoo CNN: which cores form each stage, "
                    "which contiguous layers each stage runs, and the predicted throughput "
                    "and latency beside the kernel-level prediction (every layer on all "
                    "cores). Predictions come from the calibrated Pipe-it time model "
                    "(bench/calibration_pipeline_timemodel.py), or, without a calibration or for "
                    "another machine (--topology), from the default model scaled by cluster "
                    "capacity; the output says which.")
    add_model_args(p)
    p.add_argument("--measured", action="store_true",
                   help="measure every layer on every core configuration of this machine "
                        "instead of predicting (takes a while; not with --topology)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _ms(s):
    return f"{1e3 * s:9.2f}"


def run(args):
    model = load_model(args)
    plan, _ = make_plan(model, args)
    if args.json:
        print(json_text(plan.to_dict()))
        return 0
    out = sys.stdout
    print(f"model {plan.model} ({len(model.layers)} layers) on {plan.topology.to_spec()}",
          file=out)
    print(f"objective: {plan.objective}   method: {plan.method}   pipeline: "
          f"{plan.describe()}", file=out)
    print(f"times: {plan.source}", file=out)
    print(f"{'stage':>5}  {'cpus':<10}{'config':<10}{'layers':<12}{'pred. ms':>9}", file=out)
    for i, s in enumerate(plan.stages):
        from asymo.hw.topology import format_cpulist
        print(f"{i:>5}  {format_cpulist(s.cpus):<10}{s.label:<10}"
              f"{f'[{s.layers[0]}, {s.layers[1]}]':<12}{_ms(s.predicted_time)}", file=out)
    print(f"predicted throughput {plan.predicted_throughput:8.2f} img/s   latency "
          f"{_ms(plan.predicted_latency).strip()} ms", file=out)
    print(f"kernel-level (all cores, one pool): {plan.kernel_level_predicted_throughput:8.2f} "
          f"img/s   latency {_ms(plan.kernel_level_predicted_latency).strip()} ms", file=out)
    for name, a in plan.alternatives.items():
        print(f"  {name:<13}{a['pipeline']:<24}{a['predicted_throughput']:8.2f} img/s", file=out)
    print(f"energy per image: {plan.predicted_energy:.4g} J ({plan.energy_source})", file=out)
    return 0
