"""Whole networks: asymo against ONNX Runtime and torch (issue 19), or the zoo (issue 6).

Default: the torchvision-style networks of issue 19's targets (ResNet-18, ResNet-50,
MobileNet V2, SqueezeNet 1.1, GoogLeNet; ``asymo.models.torchvision_defs``), exported to ONNX
in memory and loaded with ``asymo.from_onnx``; each runs on asymo, ONNX Runtime (intra-op
threads = cores, and one thread pinned to the fast core) and torch (the nn.Module; all cores,
and one thread pinned), side by side in one run with ``asymo.cli.bench_model.compare`` (the
method of ``asymo bench MODEL.onnx``). Batch 1, float32, 224x224. Ratios = other time / asymo
time (> 1: asymo faster). Targets: symmetric >= 1.0x ORT and torch; core 1 at 0.5: >= 1.3x
the best of {ORT, torch} x {all cores, fast core alone}; at 0.33: >= 1.15x. Also prints the
load time (ONNX bytes to first result).

    flock /tmp/asymo-bench.lock python3 bench/models.py
    flock /tmp/asymo-bench.lock python3 bench/models.py --emulate 1:0.5 --json r05.json
    flock /tmp/asymo-bench.lock python3 bench/models.py --zoo            # issue 6's table

``--zoo``: the six zoo models (asymo vs torch vs NumPy im2col + matmul, and asymo on the
fastest core alone), as before.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _convbench import (NumpyOps, emulated, fmt_ratio, machine_lines,  # noqa: E402
                        side_by_side, speeds_line)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--zoo" in argv:
        return zoo_main([a for a in argv if a != "--zoo"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", default=None,
                        help="comma-separated names (default: the five of the targets)")
    parser.add_argument("--size", type=int, default=224, help="input side (default 224)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--min-time", type=float, default=0.3,
                        help="seconds of back-to-back calls per library per round")
    parser.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]",
                        help="slow cores with the emulator, e.g. 1:0.5")
    parser.add_argument("--period", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--compare", default="ort,torch")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--plot", default=None, metavar="FILE")
    args = parser.parse_args(argv)

    import torch

    import asymo
    from asymo.cli.bench_model import compare, format_table, plot
    from asymo.models import torchvision_defs as tv
    from asymo.models.reference import relative_error
    from asymo.models.torch_loader import export_onnx_bytes

    names = args.networks.split(",") if args.networks else list(tv.BENCH_NETWORKS)
    results = []
    with emulated(args.emulate, args.period) as emu:
        for name in names:
            net = tv.build(name)
            x = np.random.default_rng(0).standard_normal(
                (1, 3, args.size, args.size)).astype(np.float32)
            data = export_onnx_bytes(net, torch.from_numpy(x))
            t0 = time.perf_counter()
            model = asymo.from_onnx(data, name=name)
            model(x)
            t_load = time.perf_counter() - t0
            with torch.inference_mode():
                ref = net(torch.from_numpy(x)).numpy()
            err = relative_error(model(x), ref)
            r = compare(model, x, compare=args.compare.split(","), onnx_bytes=data,
                        torch_module=net,
                        emulation=(f"{emu} [speed only: the slowed core keeps its caches]"
                                   if emu else None),
                        repeats=args.repeats, min_time=args.min_time, label=name)
            r["load_to_first_result_s"] = t_load
            r["max_rel_error_vs_torch"] = err
            results.append(r)
            print(f"{name}: load (ONNX bytes to first result) {t_load * 1e3:.0f} ms, "
                  f"max |asymo - torch| / max|torch| = {err:.1e}", flush=True)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot(results, args.plot)
    return 0


def zoo_main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="all",
                        help="comma-separated zoo names (default: all six)")
    parser.add_argument("--repeats", type=int, default=7, help="alternating rounds (median)")
    parser.add_argument("--min-time", type=float, default=0.3,
                        help="seconds of back-to-back runs per backend per round")
    parser.add_argument("--period", type=float, default=None, metavar="SECONDS",
                        help="emulator period (default: asymo.lab.emulate.DEFAULT_PERIOD)")
    parser.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]",
                        help="slow cores with the emulator, e.g. 1:0.5")
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy baseline")
    parser.add_argument("--no-single", action="store_true",
                        help="skip asymo on the fastest core alone")
    args = parser.parse_args(argv)

    import threadpoolctl

    import asymo
    import asymo.models
    from asymo.models.torch_backend import torch_available, torch_forward
    from asymo.models.model import run_steps
    from asymo.hw.topology import Cluster, Topology

    names = asymo.models.names() if args.models == "all" else args.models.split(",")
    with emulated(args.emulate, args.period) as emu:
        pool = asymo.Pool()
        fast = pool.topology.clusters[0]
        single = None
        if not args.no_single and pool.nworkers > 1:
            single = asymo.Pool(topology=Topology(clusters=(Cluster(
                fast.name, (fast.cpus[0],), capacity=1.0),)))
        try:
            torch_threads = None
            if torch_available():
                import torch

                torch.set_num_threads(pool.nworkers)
                torch_threads = torch.get_num_threads()
            for line in machine_lines(pool, emu, torch_threads):
                print(line)
            if single is not None:
                print(f"'1 core': asymo on cpu {fast.cpus[0]} alone")
            print(f"batch 1, float32, medians of {args.repeats} alternating rounds; ratio = "
                  "other time / asymo time (> 1: asymo faster)")
            print(f"{'model':<13} {'GFLOP':>6} {'asymo ms':>9} {'torch ms':>9} "
                  f"{'numpy ms':>9} {'1 core ms':>9} {'vs torch':>8} {'vs numpy':>8} "
                  f"{'vs 1core':>8}")
            with threadpoolctl.threadpool_limits(pool.nworkers, user_api="blas"):
                for name in names:
                    model = asymo.models.get(name).materialize()
                    x = np.random.default_rng(0).standard_normal(
                        (1,) + model.input_shape).astype(np.float32)
                    fns = {"asymo": lambda: model.run(x, pool=pool)}
                    if torch_threads:
                        fns["torch"] = lambda: torch_forward(model, x)
                    if not args.no_numpy:
                        nops = NumpyOps()

                        def run_numpy():
                            a = x
                            for layer in model.layers:
                                a = run_steps(layer.steps, a, nops, model.parameters)
                            return a
                        fns["numpy"] = run_numpy
                    if single is not None:
                        fns["single"] = lambda: model.run(x, pool=single)
                    t = side_by_side(fns, args.repeats, args.min_time)
                    ta = t["asymo"]
                    tt, tn, ts = (t.get(k, 0.0) for k in ("torch", "numpy", "single"))
                    ms = [f"{v * 1e3:.2f}" if v else "-" for v in (tt, tn, ts)]
                    print(f"{name:<13} {model.flops / 1e9:>6.2f} {ta * 1e3:>9.2f} "
                          f"{ms[0]:>9} {ms[1]:>9} {ms[2]:>9} "
                          f"{fmt_ratio(ta, tt):>8} {fmt_ratio(ta, tn):>8} "
                          f"{fmt_ratio(ta, ts):>8}", flush=True)
                    del model
            print(speeds_line(pool, "after"))
        finally:
            pool.close()
            if single is not None:
                single.close()
    return 0



if __name__ == "__main__":
    sys.exit(main())
