"""MobileNet V2's 17 depthwise layers (batch 1, float32, bias + ReLU6) on the fast core alone:
asymo's direct 3x3 kernel (DEPTHWISE_METHOD 0) vs its channel-interleaved kernel (2) vs ONNX
Runtime (one Conv + Clip node, one thread). Medians over interleaved rounds; the per-layer
times are summed over the network's layers (repeated shapes counted as often as they occur).

    flock /tmp/asymo-bench.lock python3 bench/depthwise_3x3.py [--repeats 7] [--residual]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _convbench import onnx_conv_session, side_by_side  # noqa: E402

# (channels, input size, stride, count in MobileNet V2 at 224 x 224)
MOBILENET_V2_DW = [(32, 112, 1, 1), (96, 112, 2, 1), (144, 56, 1, 1), (144, 56, 2, 1),
                   (192, 28, 1, 2), (192, 28, 2, 1), (384, 14, 1, 4), (576, 14, 1, 2),
                   (576, 14, 2, 1), (960, 7, 1, 3)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.05)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--residual", action="store_true",
                        help="add a residual (asymo only; ONNX Runtime then runs Conv + Clip)")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--isa", default=None, help="asymo kernel ISA (default: the best)")
    args = parser.parse_args(argv)

    cpu = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {cpu})
    import asymo
    import asymo.ops.conv as conv_mod
    from asymo.hw.topology import Cluster, Topology

    topo = Topology(clusters=(Cluster("fast", (cpu,), capacity=1.0),))
    with conv_mod.use_kernel_isa(args.isa or conv_mod.kernel_isa()), \
            asymo.Pool(topology=topo) as pool:
        _measure(args, conv_mod, pool, cpu)


def _measure(args, conv_mod, pool, cpu):
    rng = np.random.default_rng(0)
    print(f"cpu {cpu} alone, 1 thread each; isa {conv_mod.kernel_isa()}; "
          f"repeats {args.repeats} (median)")
    print(f"{'layer':<18} {'n':>2} {'new ms':>8} {'old ms':>8} {'ort ms':>8} "
          f"{'old/new':>8} {'ort/new':>8} {'GB/s new':>9}")
    tot = {"new": 0.0, "old": 0.0, "ort": 0.0}
    for c, hw, s, count in MOBILENET_V2_DW:
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        oh = (hw + 2 - 3) // s + 1
        y = np.empty((1, c, oh, oh), np.float32)
        res = rng.standard_normal(y.shape).astype(np.float32) if args.residual else None

        def run(method):
            def fn():
                conv_mod.DEPTHWISE_METHOD = method
                conv_mod.conv2d(x, w, b, s, 1, 1, c, activation="relu6", residual=res, out=y,
                                pool=pool)
            return fn

        fns = {"new": run(0), "old": run(2)}
        if not args.no_onnx:
            sess = onnx_conv_session(x.shape, w, b, (s, s), (1, 1), (1, 1), c, "relu6", 1)
            fns["ort"] = lambda: sess.run(None, {"X": x})
        # correctness of both asymo kernels against each other before timing
        run(0)()
        y0 = y.copy()
        run(2)()
        np.testing.assert_allclose(y0, y, rtol=1e-5, atol=1e-4)
        t = side_by_side(fns, args.repeats, args.min_time, args.pause)
        conv_mod.DEPTHWISE_METHOD = 0
        t.setdefault("ort", float("nan"))
        nbytes = (x.nbytes + y.nbytes + (res.nbytes if res is not None else 0))
        for k in tot:
            tot[k] += count * t[k]
        print(f"{c}x{hw}x{hw}/s{s:<6} {count:>2} {t['new'] * 1e3:8.3f} {t['old'] * 1e3:8.3f} "
              f"{t['ort'] * 1e3:8.3f} {t['old'] / t['new']:8.2f} {t['ort'] / t['new']:8.2f} "
              f"{nbytes / t['new'] / 1e9:9.1f}")
    print(f"{'total (17 layers)':<21} {tot['new'] * 1e3:8.3f} {tot['old'] * 1e3:8.3f} "
          f"{tot['ort'] * 1e3:8.3f} {tot['old'] / tot['new']:8.2f} {tot['ort'] / tot['new']:8.2f}")


if __name__ == "__main__":
    main()
