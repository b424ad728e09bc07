"""Per-call overhead of ``asymo.conv2d`` on small layers: the public call vs a bound call
(`asymo.ops.conv.bind_conv2d`, no Python work per call) vs NumPy's / torch's single thread.

One worker pool on the first cpu of the affinity mask, the caller pinned there too, float32,
batch 1, one thread everywhere; microseconds per call, medians of interleaved rounds (each
round times every variant for ``--calls`` back-to-back calls, a pause between variants).

    flock /tmp/asymo-bench.lock python3 bench/conv_overhead.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

# (name, x shape, w shape, stride, padding, groups)
LAYERS = [
    ("1x1 832->32 7x7", (1, 832, 7, 7), (32, 832, 1, 1), 1, 0, 1),
    ("3x3 64->64 56x56", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ("dw3x3/s2 144 56x56", (1, 144, 56, 56), (144, 1, 3, 3), 2, 1, 144),
]


def _per_call(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=0,
                        help="calls per variant per round (0: about 20 ms worth)")
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)

    import threadpoolctl

    import asymo
    from asymo.ops.conv import bind_conv2d
    from asymo.runtime.pool import hold

    cpu = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {cpu})
    threadpoolctl.threadpool_limits(1)
    torch = None
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            torch = None
    pool = asymo.Pool(f"fast:{cpu}")
    print(f"cpu {cpu} alone: asymo one-worker pool, caller pinned, NumPy BLAS 1 thread"
          + (f", torch {torch.__version__} 1 thread" if torch else ""))
    rng = np.random.default_rng(0)
    for name, xs, ws, stride, pad, groups in LAYERS:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        out = asymo.conv2d(x, w, b, stride, pad, groups=groups, pool=pool)
        bc = bind_conv2d(x, w, b, stride, pad, groups=groups, pool=pool, out=out)

        def bound():
            with hold(pool):
                bc()

        pw = asymo.prepack_conv(w)
        variants = {
            "conv2d": lambda: asymo.conv2d(x, w, b, stride, pad, groups=groups, pool=pool),
            "conv2d prepacked": lambda: asymo.conv2d(x, pw, b, stride, pad, groups=groups,
                                                     pool=pool),
            "conv2d out=": lambda: asymo.conv2d(x, w, b, stride, pad, groups=groups,
                                                pool=pool, out=out),
            "bound": bound,
        }
        if ws[2:] == (1, 1) and groups == 1:
            w2 = w.reshape(ws[0], ws[1])
            x2 = x.reshape(xs[1], -1)
            y2 = np.empty((ws[0], x2.shape[1]), np.float32)
            variants["numpy gemm"] = lambda: np.matmul(w2, x2, out=y2)
        if torch is not None:
            tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
            variants["torch"] = lambda: torch.nn.functional.conv2d(tx, tw, tb, stride, pad, 1,
                                                                   groups)
        calls = {}
        for k, fn in variants.items():
            for _ in range(20):
                fn()
            once = _per_call(fn, 20)
            calls[k] = args.calls or max(20, int(20000 / max(once, 1.0)))
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                time.sleep(args.pause)
                times[k].append(_per_call(fn, calls[k]))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
              + f" us | conv2d - bound {med['conv2d'] - med['bound']:.1f} us, prepacked - bound "
              f"{med['conv2d prepacked'] - med['bound']:.1f} us")
    pool.close()


if __name__ == "__main__":
    main()
