"""asymo's GEMM with calibrated plans (`asymo.plan_matmul`) against its default plans.

Run under the benchmark lock (the machine is shared), on the symmetric machine and emulated:

    flock /tmp/asymo-bench.lock python3 bench/calibrated_plans.py
    flock /tmp/asymo-bench.lock python3 bench/calibrated_plans.py --emulate 1:0.5
    # or: flock /tmp/asymo-bench.lock asymo emulate --core 1 --speed 0.5 -- \\
    #         python3 bench/calibrated_plans.py

The calibration profile of the topology seen (symmetric, or the emulated one) is used; when it
has no usable GEMM calibration, ``--calibrate`` (default ``quick``) makes one first.

Shapes are those of the calibration set's held-out list: convolutions of ResNet-50, AlexNet
and GoogLeNet and FC / matrix-vector products, none of them in the training data. For each
shape the same operands are multiplied with the default plan (`asymo.plan.gemm.plan_gemm`:
capacity split, cache-rule blocks) and the calibrated plan (measured split ratio, cost-model
blocks) and, on an asymmetric topology, the calibrated plan with the split adjusted by the
current load, alternately; a sample repeats the call for at least ``--min-sample`` seconds,
and the figure is the median over ``--repeats`` samples. Ratio = default time / calibrated
time (> 1: the calibrated plan is faster). Both results are checked against NumPy.

The emulator slows cores (speed), not caches or memory bandwidth.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymo.calibrate import gemm as calibration  # noqa: E402
from asymo.calibrate import gemm_set as calibration_set
from asymo.plan import gemm as gemm_plan
from asymo.plan import matmul as matmul_plan
from asymo import profile as prof  # noqa: E402
from asymo.hw import topology as topo  # noqa: E402
from asymo.runtime.ffi import lib  # noqa: E402
from asymo.calibrate.gemm import gemm_args_2d  # noqa: E402
from asymo.plan import calibration as plan_calibration  # noqa: E402
from asymo.runtime.pool import Pool  # noqa: E402


def compare(pool, size, plans, repeats, min_sample, rng):
    """Median seconds of each plan for one shape (alternating, same operands)."""
    M, K, N = size.M, size.K, size.N
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    outs = [np.empty((M, N), np.float32) for _ in plans]
    calls = []
    for plan, out in zip(plans, outs):
        g, p = gemm_args_2d(a, b, out), plan.cdata()

        def call(g=g, p=p):
            rc = lib.asymo_gemm(pool._handle, g, p)
            if rc != lib.ASYMO_OK:
                raise RuntimeError(f"asymo_gemm failed ({rc}) for {size}")
        calls.append(call)
    inner = []
    for call, out in zip(calls, outs):
        call()
        t0 = time.perf_counter()
        call()
        t = time.perf_counter() - t0
        inner.append(max(1, math.ceil(min_sample / max(t, 1e-7))))
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3 * math.sqrt(K))
    samples = [[] for _ in plans]
    for _ in range(repeats):
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            for _ in range(inner[i]):
                call()
            samples[i].append((time.perf_counter() - t0) / inner[i])
    return [statistics.median(s) for s in samples]


def _plan_text(plan):
    if plan.kind == "mv":
        return f"chunks {','.join(map(str, plan.chunks))}"
    return " ".join("x".join(map(str, b)) for b in plan.blocks)


def _ratio_text(plan):
    sizes = [b - a for a, b in plan.cluster_ranges]
    total = sum(sizes) or 1
    return ":".join(f"{s / total:.2f}" for s in sizes)


@contextlib.contextmanager
def _emulation(spec):
    if not spec:
        yield None
        return
    try:
        from asymo.lab.emulate import slow_cores
    except ImportError:
        sys.exit("--emulate needs asymo.lab.emulate (the emulator); or run this script under "
                 "`asymo emulate --core 1 --speed 0.5 -- ...`")
    speeds = {}
    for part in spec.split(","):
        cpu, _, speed = part.partition(":")
        speeds[int(cpu)] = float(speed)
    with slow_cores(speeds):
        yield speeds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibrate", choices=("quick", "full", "always-quick", "always-full",
                                            "none"), default="quick",
                    help="calibrate first when the profile has no usable GEMM calibration "
                         "(quick / full), always (always-*), or never (none: fails without)")
    ap.add_argument("--profile", default=None, help="profile path (default: the active one)")
    ap.add_argument("--emulate", default=None, metavar="CPU:SPEED[,...]",
                    help="run emulated, e.g. 1:0.5 (needs asymo.lab.emulate)")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--min-sample", type=float, default=0.003, metavar="SECONDS")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, metavar="TEXT",
                    help="only the shapes whose name contains TEXT")
    args = ap.parse_args(argv)

    with _emulation(args.emulate):
        t = topo.detect()
        path = prof.profile_path(t, args.profile)
        if args.profile:
            os.environ[prof.ENV_VAR] = path
        summary = plan_calibration.profile_summary(t, path)
        usable = summary["status"] == "ok" and (summary.get("gemm") or {}).get("usable")
        if args.calibrate.startswith("always") or (not usable and args.calibrate != "none"):
            mode = args.calibrate.split("-")[-1]
            print(f"calibrating ({mode}) into {path} ...", file=sys.stderr)
            section = calibration.calibrate_gemm(t, set_name=mode, path=path)
            print(calibration.format_report(section), file=sys.stderr)
            summary = plan_calibration.profile_summary(t, path)
        elif not usable:
            sys.exit(f"no usable GEMM calibration in {path} ({summary.get('reason')}); run "
                     "`asymo calibrate` or pass --calibrate quick")
        prof.reset_active_profile()
        matmul_plan.clear_cache()

        print("asymo: calibrated vs default GEMM plans")
        print(f"machine: {platform.machine()} {topo.cpu_model_name()}, "
              f"{os.cpu_count()} cpus; python {platform.python_version()}")
        print(f"topology: {t.to_spec()}"
              + (f"; EMULATED slow cores {dict(sorted(t.emulated.items()))} (speed only: "
                 "caches and memory bandwidth are the fast core's)" if t.emulated else
                 " (no emulation)"))
        g = summary["gemm"]
        print(f"profile: {path} ({g['set']} set, {g['created']}); "
              + "; ".join(f"{c['name']}: model {c['model']}, held-out R^2 {c['r2']:.3f}"
                          for c in g["clusters"]))
        print(f"median of {args.repeats} samples per plan, each >= "
              f"{args.min_sample * 1e3:.0f} ms, the plans alternating")
        rng = np.random.default_rng(args.seed)
        with_load = t.nclusters > 1 and os.environ.get("ASYMO_LOAD_ADJUST") != "0"
        names = ["default", "calibrated"] + (["calibrated+load"] if with_load else [])
        rows, ratios = [], {n: {"mm": [], "mv": []} for n in names[1:]}
        with Pool(t) as pool:
            print(f"pool: {pool.nworkers} workers, policy {pool.policy}")
            if with_load:
                matmul_plan.plan_matmul(64, 64, 64, pool=pool)   # start the load window
                time.sleep(matmul_plan.LOAD_INTERVAL_S)
            for size in calibration_set.HELD_OUT_SIZES:
                if args.only and args.only not in size.name:
                    continue
                M, K, N = size.M, size.K, size.N
                plans = [gemm_plan.plan_gemm(M, K, N, "float32", pool),
                         matmul_plan.plan_matmul(M, K, N, pool=pool, load=False)]
                if with_load:
                    plans.append(matmul_plan.plan_matmul(M, K, N, pool=pool, load=True))
                times = compare(pool, size, plans, args.repeats, args.min_sample, rng)
                row = [size.name, f"{M}x{K}x{N}"]
                for name, plan, sec in zip(names, plans, times):
                    row += [f"{_ratio_text(plan)} {_plan_text(plan)}", f"{sec * 1e3:.3f}"]
                for name, sec in zip(names[1:], times[1:]):
                    ratios[name][size.kind].append(times[0] / sec)
                    row.append(f"{times[0] / sec:.2f}")
                rows.append(tuple(row))
        head = ["shape", "M x K x N"]
        for name in names:
            head += [f"{name}: split blocks", "ms"]
        head += [f"default/{n}" for n in names[1:]]
        widths = [max(len(r[i]) for r in rows + [tuple(head)]) for i in range(len(head))]
        for r in [tuple(head)] + rows:
            print("  ".join(v.rjust(w) if i >= 2 and (i % 2 == 1 or i >= 2 + 2 * len(names))
                            else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))))

        def gmean(xs):
            return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan
        for name in names[1:]:
            every = ratios[name]["mm"] + ratios[name]["mv"]
            if not every:
                continue
            print(f"ratio default/{name}: geometric mean {gmean(every):.3f} (MM "
                  f"{gmean(ratios[name]['mm']):.3f}, MV {gmean(ratios[name]['mv']):.3f}); "
                  f"median {statistics.median(every):.3f}; min {min(every):.2f}, "
                  f"max {max(every):.2f}  (> 1: the calibrated plan is faster)")


if __name__ == "__main__":
    main()
