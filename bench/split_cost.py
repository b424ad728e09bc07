"""When does a slower cluster's share pay? Measure it and compare with `asymo.plan.split_cost`.

Under the emulator (core ``--core`` at ``--speed``, period ``--period``), each product runs on
the emulated two-cluster pool twice per round, interleaved: split between the clusters by
capacity (``plan_gemm(split=capacities)``) and on the fastest cluster alone
(``split=(1, 0)``). Printed: median times, the measured gain of the split (time alone - time
split, per round, median) and the gain `asymo.plan.split_cost.split_gain` predicts, and whether
the model's choice (fastest alone when the predicted gain <= 0) was the faster one.

    flock /tmp/asymo-bench.lock python3 bench/split_cost.py --period 1e-3

This emulates core speed only: the slowed core keeps its caches and memory bandwidth.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymo.plan import gemm as gemm_plan  # noqa: E402
from asymo.plan import split_cost
from asymo.lab.emulate import DEFAULT_PERIOD, slow_cores  # noqa: E402
from asymo.ops.matmul import gemm  # noqa: E402
from asymo.runtime.pool import Pool  # noqa: E402
from matmul_gflops import _per_call as per_call  # noqa: E402  (one timing loop for both)
from matmul_gflops import add_timing_args  # noqa: E402  (and the same options)

MM = [(n, n, n) for n in (96, 128, 160, 200, 256, 320, 400)] + [
    (196, 256, 512), (784, 128, 256), (49, 1024, 1024), (196, 4608, 512)]
MV = [(m, k, 1) for m in (256, 1024, 2048) for k in (256, 1024, 2048)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_args(ap, rounds=7)
    ap.add_argument("--only", choices=["mm", "mv"], action="append")
    args = ap.parse_args(argv)
    if args.period is None:
        args.period = DEFAULT_PERIOD
    shapes = [s for g in (args.only or ["mm", "mv"]) for s in {"mm": MM, "mv": MV}[g]]
    print(f"load average at start {os.getloadavg()[0]:.2f}; emulated: cpu {args.core} at "
          f"speed {args.speed}, period {args.period * 1e3:g} ms; {args.rounds} interleaved "
          f"rounds, medians; float32, kernels {gemm_plan.best_isa()}")
    print(f"model: SYNC_S {split_cost.SYNC_S * 1e6:g} us, TAIL_CATCH {split_cost.TAIL_CATCH:g}, "
          f"default rates per core {split_cost.DEFAULT_RATE}")
    print(f"{'M x K x N':>18}{'MFLOP':>8}{'split us':>10}{'alone us':>10}{'gain us':>9}"
          f"{'model us':>9}{'model ok':>9}")
    right = 0
    with slow_cores({args.core: args.speed}, period=args.period) as emu:
        topo = emu.topology
        pool = Pool(topology=topo)
        try:
            caps = [c.capacity * c.ncpus for c in topo.clusters]
            rng = np.random.default_rng(0)
            for M, K, N in shapes:
                a = rng.standard_normal((M, K)).astype(np.float32)
                b = rng.standard_normal((K, N)).astype(np.float32)
                out = np.empty((M, N), np.float32)
                plans = {"split": gemm_plan.plan_gemm(M, K, N, "float32", pool, split=caps),
                         "alone": gemm_plan.plan_gemm(M, K, N, "float32", pool,
                                                      split=[1.0] + [0.0] * (len(caps) - 1))}
                times = {k: [] for k in plans}
                for _ in range(args.rounds):
                    for k, plan in plans.items():
                        time.sleep(0.02)
                        times[k].append(per_call(lambda: gemm(a, b, out, plan=plan, pool=pool),
                                                 args.target))
                gain = float(np.median(np.asarray(times["alone"]) - np.asarray(times["split"])))
                kind = "mv" if min(M, N) <= gemm_plan.SKINNY_DEFAULT else "mm"
                flops = 2.0 * M * K * N
                model = split_cost.split_gain(flops, topo, kind, period=args.period)
                ok = (model > 0) == (gain > 0)
                right += ok
                print(f"{f'{M}x{K}x{N}':>18}{flops / 1e6:8.1f}"
                      f"{np.median(times['split']) * 1e6:10.1f}"
                      f"{np.median(times['alone']) * 1e6:10.1f}{gain * 1e6:9.1f}"
                      f"{model * 1e6:9.1f}{'yes' if ok else 'NO':>9}", flush=True)
        finally:
            pool.close()
    print(f"model chose the faster plan for {right} of {len(shapes)} shapes; load average now "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
