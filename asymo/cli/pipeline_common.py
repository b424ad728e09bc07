"""Arguments and helpers shared by ``asymo plan`` and ``asymo pipeline``."""
from __future__ import annotations

import argparse

OBJECTIVES = ("throughput", "latency", "energy")


def add_model_args(p):
    p.add_argument("model", metavar="MODEL",
                   help="zoo model (alexnet, googlenet, mobilenet_v1, resnet50, squeezenet, "
                        "vgg16) or an ONNX file (MODEL.onnx; `asymo pipeline` then plans "
                        "stages over asymo, ONNX Runtime and torch)")
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                   help="what the plan optimises (default: throughput)")
    p.add_argument("--method", choices=("optimal", "pipe-it", "two-stage"), default="optimal",
                   help="throughput search: exact optimum over Pipe-it's design space "
                        "(default), Pipe-it's Algorithm 3, or paper 004's two-stage split")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="machine to plan for, e.g. 'big:0-3@1.0,little:4-7@0.45' (same format "
                        "as ASYMO_TOPOLOGY; default: this machine)")
    p.add_argument("--image-size", type=int, default=None, metavar="PX",
                   help="square input size (default: the network's own, 224 or 227)")
    p.add_argument("--transfer-k", type=float, default=0.0, metavar="S_PER_BYTE",
                   help="paper 004's transfer cost k (seconds per byte crossing a stage "
                        "boundary; default 0)")


def load_model(args):
    import os

    import asymo.models as zoo
    if args.model.endswith(".onnx") or (args.model not in zoo.names()
                                         and os.path.exists(args.model)):
        if args.image_size is not None:
            raise SystemExit("asymo: --image-size applies to zoo models; an ONNX model has "
                             "its own input shape")
        from asymo.cli.run import load_onnx
        model = load_onnx(args.model)[0]
        g = model.graph
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            # a pipeline passes one tensor from stage to stage
            raise SystemExit(f"asymo: a pipeline needs a model with one input and one output; "
                             f"{args.model} has {len(g.inputs)} input(s) and "
                             f"{len(g.outputs)} output(s)")
        return model
    if args.model not in zoo.names():
        raise SystemExit(f"asymo: unknown model {args.model!r}; choose from "
                         f"{', '.join(zoo.names())}")
    if args.image_size is not None and args.image_size < 1:
        raise SystemExit("asymo: --image-size must be positive")
    try:
        return zoo.get(args.model, image_size=args.image_size)
    except ValueError as exc:
        raise SystemExit(f"asymo: {exc}") from None


def make_plan(model, args, *, this_machine=False):
    """Topology + plan from the parsed arguments; returns ``(plan, topology)``.

    ``--topology`` describes another machine for planning (taken as written); with
    ``this_machine`` it must describe cores this process may run on.
    """
    from asymo.hw import topology as topo
    from asymo.pipeline.plan import plan_pipeline
    try:
        if args.topology and not this_machine:
            top = topo.parse_spec(args.topology)
        else:
            top = topo.detect(override=args.topology)
    except topo.TopologyError as exc:
        raise SystemExit(f"asymo: {exc}") from None
    table = None
    if getattr(args, "measured", False):
        if args.topology:
            raise SystemExit("asymo: --measured measures this machine; drop --topology")
        from asymo.pipeline.calibrate import measure_layer_times
        table = measure_layer_times(model, top)
    try:
        plan = plan_pipeline(model, top, objective=args.objective, method=args.method,
                             table=table, transfer_k=args.transfer_k or None)
    except ValueError as exc:
        raise SystemExit(f"asymo: {exc}") from None
    return plan, top


def positive_int(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v
