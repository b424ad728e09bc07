"""Single convolution layers of the zoo CNNs: asymo vs torch (oneDNN), ONNX Runtime (MLAS)
and NumPy im2col + OpenBLAS, each on all cores and on the fast core alone, side by side.

Each unique convolution of ResNet-50, MobileNet V1 / V2, SqueezeNet and GoogLeNet (batch 1,
float32, bias and the layer's activation fused where the library can) runs as:

- asymo: ``asymo.conv2d`` with the weights held by ``asymo.prepack_conv`` (as a model holds
  them; ONNX Runtime likewise pre-packs its initializers when the session is made);
- torch: ``torch.nn.functional.conv2d`` + activation, ``torch.set_num_threads``;
- onnxruntime: a one-node ONNX model (Conv + Relu / Clip), ``intra_op_num_threads``;
- numpy: im2col (``sliding_window_view``) + ``numpy.matmul``, BLAS threads limited.

"fast core alone" pins the caller to the first cpu and gives every library one thread (asymo:
a one-worker pool on that cpu). Thread limits are set outside the timed loops, and each
library's turn starts after a pause (``--pause``, 0.3 s) so the previous library's spinning
threads are gone. Ratios are other time / asymo time (> 1: asymo faster):

- ``1core``: best library on the fast core alone vs asymo on the fast core alone;
- ``all``: best library on all cores vs asymo on all cores;
- ``user``: the best a user can choose (each library on all cores or on the fast core alone,
  whichever is faster) vs asymo on all cores: the figure that matters with --emulate.

    flock /tmp/asymo-bench.lock python3 bench/conv_single.py
    flock /tmp/asymo-bench.lock python3 bench/conv_single.py --emulate 1:0.5
"""
from __future__ import annotations

import argparse
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _convbench import (NumpyOps, conv_layer_specs, emulated, geomean,  # noqa: E402
                        machine_lines, onnx_conv_session, side_by_side, speeds_line)

DEFAULT_MODELS = "resnet50,mobilenet_v1,mobilenet_v2,squeezenet,googlenet"


def _kind(ws, stride, groups):
    k = "x".join(map(str, ws[2:]))
    if groups > 1 and ws[1] == 1:
        return f"dw{k}/s{stride[0]}"
    return f"{k}/s{stride[0]}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per layer (median)")
    parser.add_argument("--min-time", type=float, default=0.04,
                        help="seconds of back-to-back calls per library per round")
    parser.add_argument("--pause", type=float, default=0.3,
                        help="seconds of pause before each library's turn")
    parser.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]")
    parser.add_argument("--period", type=float, default=None)
    parser.add_argument("--every", type=int, default=1,
                        help="time every n-th unique layer only (a quicker sample)")
    parser.add_argument("--libs", default="torch,onnxruntime,numpy")
    parser.add_argument("--kinds", default=None,
                        help="comma-separated layer kinds to time only (e.g. 3x3/s1,7x7/s2)")
    args = parser.parse_args(argv)

    import threadpoolctl

    import asymo

    libs = [s for s in args.libs.split(",") if s]
    specs = sorted(conv_layer_specs(args.models.split(",")).items(),
                   key=lambda kv: (kv[1][0][0], kv[1][0][1]))
    if args.kinds:
        kinds = set(args.kinds.split(","))
        specs = [kv for kv in specs if _kind(kv[0][1], kv[0][2], kv[0][5]) in kinds]
    specs = specs[::max(1, args.every)]
    cpus = sorted(os.sched_getaffinity(0))
    fast = cpus[0]
    with emulated(args.emulate, args.period) as emu:
        pool = asymo.Pool()
        # the caller is pinned to the worker's core: it must sleep, not spin, while it waits
        pool_one = asymo.Pool(f"fast:{fast}", spin_us=0)
        try:
            torch = None
            if "torch" in libs:
                import torch
            nthreads = pool.nworkers
            for line in machine_lines(pool, emu, nthreads if torch else None):
                print(line)
            print(f"batch 1, float32, {len(specs)} unique layers, medians of {args.repeats} "
                  f"alternating rounds, {args.pause} s pause before each library's turn; "
                  "ratio = best other time / asymo time")
            print(f"{'model':<13} {'layer':<16} {'kind':<9} {'MFLOP':>7} {'asymo1':>7} "
                  f"{'best1':>7} {'lib1':<6} {'asymoN':>7} {'bestN':>7} {'libN':<6} "
                  f"{'1core':>6} {'all':>6} {'user':>6}")
            rows = []
            rng = np.random.default_rng(0)
            for (ins, ws, stride, pad, dil, groups, act), where in specs:
                x = rng.standard_normal((1,) + ins).astype(np.float32)
                w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
                b = (rng.standard_normal(ws[0]) * 0.1).astype(np.float32)
                pw = asymo.prepack_conv(w)
                oh = (ins[1] + 2 * pad[0] - dil[0] * (ws[2] - 1) - 1) // stride[0] + 1
                ow = (ins[2] + 2 * pad[1] - dil[1] * (ws[3] - 1) - 1) // stride[1] + 1
                flops = 2.0 * ws[0] * np.prod(ws[1:]) * oh * ow
                step = types.SimpleNamespace(groups=groups, stride=stride, padding=pad,
                                             dilation=dil, out_shape=(ws[0], oh, ow),
                                             activation=act)
                times = {}
                for config in ("N", "1"):
                    threads = nthreads if config == "N" else 1
                    p = pool if config == "N" else pool_one
                    fns = {"asymo": lambda p=p: asymo.conv2d(x, pw, b, stride, pad, dil, groups,
                                                             activation=act, pool=p)}
                    if torch is not None:
                        xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))

                        def run_torch(xt=xt, wt=wt, bt=bt):
                            with torch.inference_mode():
                                y = torch.nn.functional.conv2d(xt, wt, bt, stride, pad, dil,
                                                               groups)
                                if act == "relu":
                                    y = torch.relu_(y)
                                elif act == "relu6":
                                    y = torch.clamp_(y, 0, 6)
                            return y
                        fns["torch"] = run_torch
                    if "onnxruntime" in libs:
                        sess = onnx_conv_session(x.shape, w, b, stride, pad, dil, groups, act,
                                                 threads)
                        fns["onnxruntime"] = lambda s=sess: s.run(None, {"X": x})
                    if "numpy" in libs:
                        nops = NumpyOps()
                        fns["numpy"] = lambda nops=nops: nops.conv(x, step, w, b)
                    if config == "1":
                        os.sched_setaffinity(0, {fast})
                    try:
                        if torch is not None:
                            torch.set_num_threads(threads)
                        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
                            t = side_by_side(fns, args.repeats, args.min_time,
                                             args.pause)
                    finally:
                        os.sched_setaffinity(0, set(cpus))
                    for k, v in t.items():
                        times[(k, config)] = v
                others = [lib for lib in ("torch", "onnxruntime", "numpy") if lib in libs]
                best1 = min(others, key=lambda lib: times[(lib, "1")])
                bestn = min(others, key=lambda lib: times[(lib, "N")])
                user = min(min(times[(lib, "1")], times[(lib, "N")]) for lib in others)
                a1, an = times[("asymo", "1")], times[("asymo", "N")]
                r = (times[(best1, "1")] / a1, times[(bestn, "N")] / an, user / an)
                model, lname = where[0]
                rows.append((where, _kind(ws, stride, groups), r))
                print(f"{model:<13} {lname[:16]:<16} {_kind(ws, stride, groups):<9} "
                      f"{flops / 1e6:>7.1f} {a1 * 1e3:>7.3f} {times[(best1, '1')] * 1e3:>7.3f} "
                      f"{best1[:6]:<6} {an * 1e3:>7.3f} {times[(bestn, 'N')] * 1e3:>7.3f} "
                      f"{bestn[:6]:<6} {r[0]:>5.2f}x {r[1]:>5.2f}x {r[2]:>5.2f}x", flush=True)
            print("\ngeomeans (each layer shape weighted by how often it occurs in the network)")
            names = args.models.split(",")
            for name in names + ["all"]:
                sel = [r for where, _, r in rows for m, _ in where if name in ("all", m)]
                if sel:
                    print(f"{name:<13} n={len(sel):>3}  1core {geomean([r[0] for r in sel]):.2f}x"
                          f"  all {geomean([r[1] for r in sel]):.2f}x"
                          f"  user {geomean([r[2] for r in sel]):.2f}x")
            kinds = sorted({k for _, k, _ in rows})
            for k in kinds:
                sel = [r for _, kk, r in rows if kk == k]
                print(f"kind {k:<9} n={len(sel):>3}  1core {geomean([r[0] for r in sel]):.2f}x"
                      f"  all {geomean([r[1] for r in sel]):.2f}x"
                      f"  user {geomean([r[2] for r in sel]):.2f}x")
            print(speeds_line(pool, "after"))
        finally:
            pool.close()
            pool_one.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
