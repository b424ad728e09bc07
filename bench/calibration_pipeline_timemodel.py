"""Calibrate Pipe-it's layer time model (paper 000, Sect. V) on this machine.

Runs the micro-benchmarks of ``asymo.pipeline.calibrate`` (the paper's grid of input, filter,
depth and output-map sizes, plus depthwise, fully-connected and pooling layers) on every core
configuration (a pool restricted to those cores), fits Eq. 5 per configuration and Eq. 6-8 per
cluster, stores the model in the calibration profile (section "pipeline"), and reports the
prediction error per configuration on the zoo layers (the paper's Table III).

    python3 bench/calibration_pipeline_timemodel.py [--grid paper|quick] [--topology SPEC]
        [--no-save] [--models resnet50,...] [--reference OUT.json]

Timing-sensitive: run it under ``flock /tmp/asymo-bench.lock``.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymo.hw import topology as topo  # noqa: E402
from asymo.pipeline.calibrate import calibrate, measure_layer_times, prediction_errors  # noqa
from asymo.pipeline.configs import CoreConfig  # noqa: E402


def _cpu_name():
    """The CPU model (for the reference fit's label); the machine type if unknown."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown CPU"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="paper", choices=("paper", "quick", "reference"))
    ap.add_argument("--topology", default=None, help="override spec (default: detect)")
    ap.add_argument("--no-save", action="store_true", help="do not write the profile")
    ap.add_argument("--models", default=None,
                    help="comma-separated zoo models for the error report (default: all)")
    ap.add_argument("--reference", default=None, metavar="OUT",
                    help="write the single-core fit of cluster 0 (and its 2-core Eq. 6-8 fit) "
                         "as the shipped reference model")
    ap.add_argument("--idle", action="store_true",
                    help="measure micro-benchmarks with the other cores idle (the paper's "
                         "set-up) instead of busy running a model, as in a pipeline")
    ap.add_argument("--image-size", type=int, default=None,
                    help="zoo input size for the error report (default: each model's own)")
    args = ap.parse_args(argv)
    t = topo.detect(override=args.topology)
    print(f"topology: {t.to_spec()} ({t.source}; emulated: {t.emulated or 'no'})")
    if args.reference:
        c0 = t.clusters[0]
        configs = [CoreConfig(0, 1)] + ([CoreConfig(0, 2)] if c0.ncpus > 1 else [])
        model, _ = calibrate(t, configs=configs, grid=args.grid, kernel_level=False,
                             progress=True, co_run=None)
        model.source = (f"reference fit: one core of the asymo development machine "
                        f"({_cpu_name()}, asymo.matmul GEMM, {args.grid} grid)")
        with open(args.reference, "w") as f:
            json.dump(model.to_dict(), f, indent=1)
        print(f"wrote {args.reference}")
        return 0
    model, samples = calibrate(t, grid=args.grid, progress=True,
                               co_run=None if args.idle else "squeezenet")
    if not args.no_save:
        from asymo.profile import Profile, load_profile, save_profile
        prof = load_profile(topology=t) or Profile.new(t)
        prof.sections["pipeline"] = model.to_dict()
        print(f"saved to {save_profile(prof)}")
    import asymo.models as zoo
    names = args.models.split(",") if args.models else zoo.names()
    print("\nprediction error per configuration on the zoo layers (mean |pred-meas|/meas):")
    allerr = {}
    for name in names:
        m = zoo.get(name, image_size=args.image_size)
        meas = measure_layer_times(m, t)
        pred = model.table(m, meas.configs)
        err = prediction_errors(pred, meas, t)
        for k, v in err.items():
            allerr.setdefault(k, []).append(v)
        print(f"  {name:<14}" + "  ".join(f"{k}: {100 * v:5.1f}%" for k, v in err.items()))
    print("  " + "average".ljust(14) + "  ".join(
        f"{k}: {100 * sum(v) / len(v):5.1f}%" for k, v in allerr.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
