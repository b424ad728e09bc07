"""Per-call time of asymo.matmul and numpy.matmul on small products (the call overhead).

For products this small the work is a few hundred nanoseconds to a few microseconds, so the
time per call is mostly the cost of getting from Python to the kernel: argument checks, the
plan lookup, the pool hand-off. Run it alone on the machine::

    flock /tmp/asymo-bench.lock python3 bench/matmul_overhead.py
    flock /tmp/asymo-bench.lock python3 bench/matmul_overhead.py --no-fast   # Python path only

Each round times every contender on the shape in turn (``timeit`` loops of about
``--target`` seconds); figures are medians over ``--rounds`` interleaved rounds, and the
ratio is the median over rounds of time(numpy) / time(asymo) (above 1: asymo is faster).
"""
from __future__ import annotations

import argparse
import os
import sys
import timeit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import asymo  # noqa: E402
from asymo.ops import matmul_fast  # noqa: E402
from matmul_gflops import machine_line  # noqa: E402  (bench/ is the script's directory)

# name, shape of a, shape of b, whether out= is given
SHAPES = [
    ("2x2 @ 2x2", (2, 2), (2, 2), False),
    ("2x2 @ 2", (2, 2), (2,), False),
    ("16x16 @ 16x16", (16, 16), (16, 16), False),
    ("64x64 @ 64", (64, 64), (64,), False),
    ("64 @ 64x64", (64,), (64, 64), False),
    ("256x128 @ 128", (256, 128), (128,), False),
    ("256x128 @ 128, out=", (256, 128), (128,), True),
    ("512x512 @ 512", (512, 512), (512,), False),
]


def per_call(fn, target):
    """Seconds per call: timeit loops sized to about ``target`` seconds, best of 3."""
    n, _ = timeit.Timer(fn).autorange()
    n = max(1, int(n * target / 0.2))
    return min(timeit.Timer(fn).repeat(3, n)) / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    ap.add_argument("--target", type=float, default=0.05, help="seconds per timing loop")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--no-fast", action="store_true",
                    help="time asymo with its C fast path switched off (the Python path)")
    args = ap.parse_args(argv)
    import threadpoolctl
    dtype = np.dtype(args.dtype)
    pool = asymo.get_pool()
    print(f"machine: {machine_line()}; asymo pool {pool.topology.to_spec()} ({pool.nworkers} workers), "
          f"NumPy/OpenBLAS {pool.nworkers} threads; load average {os.getloadavg()[0]:.2f}")
    fast = matmul_fast.status()
    print(f"asymo matmul fast path: {fast['state']}"
          + ("; switched off for this run (--no-fast)" if args.no_fast else "")
          + f"; dtype {dtype}, medians of {args.rounds} rounds")
    rng = np.random.default_rng(0)
    rows = []
    with threadpoolctl.threadpool_limits(pool.nworkers, user_api="blas"), \
            matmul_fast.disabled(args.no_fast):
        for name, sa, sb, with_out in SHAPES:
            a = rng.standard_normal(sa).astype(dtype)
            b = rng.standard_normal(sb).astype(dtype)
            out = np.empty(np.matmul(a, b).shape, dtype) if with_out else None
            np.testing.assert_allclose(asymo.matmul(a, b), np.matmul(a, b), rtol=1e-4,
                                       atol=1e-4)
            if with_out:
                calls = {"asymo": lambda: asymo.matmul(a, b, out=out),
                         "numpy": lambda: np.matmul(a, b, out=out)}
            else:
                calls = {"asymo": lambda: asymo.matmul(a, b),
                         "numpy": lambda: np.matmul(a, b)}
            times = {k: [] for k in calls}
            for _ in range(args.rounds):
                for k, fn in calls.items():
                    times[k].append(per_call(fn, args.target))
            ratio = float(np.median(np.asarray(times["numpy"]) / np.asarray(times["asymo"])))
            rows.append((name, float(np.median(times["asymo"])) * 1e6,
                         float(np.median(times["numpy"])) * 1e6, ratio))
    print(f"{'shape':>22} {'asymo us':>10} {'numpy us':>10} {'x numpy':>8}")
    for name, ta, tn, r in rows:
        print(f"{name:>22} {ta:10.2f} {tn:10.2f} {r:8.2f}")
    print(f"load average now {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
