"""Per zoo layer: asymo vs torch (conv2d, oneDNN) vs NumPy im2col + matmul, side by side.

Each node of each model's chain (a convolution with its pooling, an Inception / Fire /
bottleneck module, an FC layer) runs on a random activation of its input shape, batch 1, with
the model's weights, through three backends of the same forward pass:

- asymo: ``model.run_layers(x, i, i)`` (asymo.conv2d, asymo GEMM, C pooling, on the pool);
- torch: ``torch.nn.functional`` with ``torch.set_num_threads(<pool workers>)``;
- numpy: im2col by ``sliding_window_view`` + ``numpy.matmul`` (OpenBLAS limited to the same
  thread count).

Ratios are speed-ups of asymo (other backend's time / asymo's time; > 1: asymo faster), medians
over rounds that alternate the backends. Run under the benchmark lock:

    flock /tmp/asymo-bench.lock python3 bench/conv_layers.py
    flock /tmp/asymo-bench.lock python3 bench/conv_layers.py --emulate 1:0.5
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
    parser.add_argument("--repeats", type=int, default=7, help="rounds per layer (median)")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds of back-to-back calls per backend per round (shorter "
                             "rounds favour asymo: each switch of backend leaves the other "
                             "library's threads waking up; at 0.02 s torch's per-layer sums "
                             "came out 1.6x its whole-model time)")
    parser.add_argument("--period", type=float, default=None, metavar="SECONDS",
                        help="emulator period (default: asymo.lab.emulate.DEFAULT_PERIOD)")
    parser.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]",
                        help="slow cores with the emulator, e.g. 1:0.5")
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy baseline")
    args = parser.parse_args(argv)

    import threadpoolctl

    import asymo
    import asymo.models
    from asymo.models.model import run_steps
    from asymo.models.torch_backend import TorchOps, torch_available

    names = asymo.models.names() if args.models == "all" else args.models.split(",")
    with emulated(args.emulate, args.period) as emu:
        pool = asymo.Pool()
        try:
            torch_threads = None
            if torch_available():
                import torch

                torch.set_num_threads(pool.nworkers)
                torch_threads = torch.get_num_threads()
            for line in machine_lines(pool, emu, torch_threads):
                print(line)
            print(f"batch 1, float32, medians of {args.repeats} alternating rounds; ratio = "
                  "other time / asymo time (> 1: asymo faster)")
            header = (f"{'model':<13} {'#':>2} {'layer':<18} {'kind':<9} {'MFLOP':>8} "
                      f"{'asymo ms':>9} {'torch ms':>9} {'numpy ms':>9} {'vs torch':>8} "
                      f"{'vs numpy':>8}")
            print(header)
            totals = {}
            with threadpoolctl.threadpool_limits(pool.nworkers, user_api="blas"):
                for name in names:
                    model = asymo.models.get(name)
                    tot = totals.setdefault(name, [0.0, 0.0, 0.0])
                    rng = np.random.default_rng(0)
                    for i, layer in enumerate(model.layers):
                        x = rng.standard_normal((1,) + layer.input_shape).astype(np.float32)
                        fns = {"asymo": lambda x=x, i=i: model.run_layers(x, i, i, pool=pool)}
                        if torch_threads:
                            ops = TorchOps()
                            xt = torch.from_numpy(x)

                            def run_torch(xt=xt, layer=layer, ops=ops):
                                with torch.inference_mode():
                                    run_steps(layer.steps, xt, ops, model.parameters)
                            fns["torch"] = run_torch
                        if not args.no_numpy:
                            nops = NumpyOps()
                            fns["numpy"] = lambda x=x, layer=layer, nops=nops: run_steps(
                                layer.steps, x, nops, model.parameters)
                        t = side_by_side(fns, args.repeats, args.min_time)
                        ta, tt, tn = t["asymo"], t.get("torch", 0.0), t.get("numpy", 0.0)
                        tot[0] += ta
                        tot[1] += tt
                        tot[2] += tn
                        print(f"{name:<13} {i:>2} {layer.name[:18]:<18} {layer.kind:<9} "
                              f"{layer.flops / 1e6:>8.1f} {ta * 1e3:>9.3f} "
                              f"{tt * 1e3:>9.3f} {tn * 1e3:>9.3f} {fmt_ratio(ta, tt):>8} "
                              f"{fmt_ratio(ta, tn):>8}", flush=True)
            print("\nsum over layers")
            for name, (ta, tt, tn) in totals.items():
                print(f"{name:<13} asymo {ta * 1e3:8.2f} ms  torch {tt * 1e3:8.2f} ms  "
                      f"numpy {tn * 1e3:8.2f} ms  vs torch {fmt_ratio(ta, tt)}  "
                      f"vs numpy {fmt_ratio(ta, tn)}")
            print(speeds_line(pool, "after"))
        finally:
            pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
