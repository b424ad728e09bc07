"""Whole zoo models: asymo vs torch vs NumPy im2col + matmul, side by side.

``model.run(images)`` (asymo: conv2d, GEMM, pooling on the pool) against the same chain,
steps and weights run with ``torch.nn.functional`` (``torch.set_num_threads(<pool workers>)``)
and with NumPy (im2col by ``sliding_window_view`` + ``numpy.matmul``, OpenBLAS limited to the
same thread count); also asymo on the fastest core alone, to show what the other cores add.
Batch 1, float32. Ratios = other time / asymo time (> 1: asymo faster), medians over rounds
that alternate the backends. Targets (issue 6): symmetric >= 0.8x torch, emulated (core 1 at
half speed) >= 1.3x torch.

    flock /tmp/asymo-bench.lock python3 bench/models.py
    flock /tmp/asymo-bench.lock python3 bench/models.py --emulate 1:0.5
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _convbench import (NumpyOps, emulated, fmt_ratio, machine_lines,  # noqa: E402
                        side_by_side, speeds_line)


def main(argv=None):
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
