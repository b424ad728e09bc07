"""Oracle ceiling of split-based scheduling for asymo.matmul under the emulator.

For every shape of `bench/matmul_gflops.py`'s MM and MV sets, under
``asymo.emulate.slow_cores({core: speed})``, interleaved rounds time:

``fast``
    asymo on the fast core alone (its pool and the calling thread pinned there): the
    baseline of matmul_gflops' "x asymo_fast" column, built by the same code.
``fast_direct``
    the same fast-core-alone product through the oracle's call path (below), to show that
    path costs no more than ``asymo.matmul``'s.
``default``
    ``asymo.matmul`` on the emulated 2-core topology (what matmul_gflops reports).
``f=X``
    a forced static split: fraction X of the split dimension on the slow core, the rest on
    the fast one, through an explicit `asymo.gemm_plan.plan_gemm(..., split=(1-X, X))` plan run
    by the C driver (``asymo_gemm_2d``) directly on the emulated pool with policy "asymo"
    (the fast core steals from the slow one when it runs out; never the reverse).
``shared``
    ``asymo.matmul`` on a pool with policy "shared" (one atomic task counter, both cores take
    the next task: dynamic balance with no static split at all).
``even``
    policy "even": a 50/50 static split with no stealing (OpenMP static).

The oracle is the best (lowest median time) of ``fast`` and every split and policy above,
chosen per shape after the fact: a scheduler that knew the best split of every shape in
advance could do no better with these kernels on this emulator, so its geometric mean over
the fast core alone bounds any split-based planner here.

A separate pass without the emulator times asymo on both cores (one symmetric cluster) against
asymo on the fast core alone: the co-running cap (two busy cores share caches and memory
bandwidth, so a 2-core product is less than 2x faster even with two equal cores).

Ratios are medians over rounds of time(fast) / time(contender) within a round (see
matmul_gflops). Run it alone::

    flock /tmp/asymo-bench.lock timeout 600 python3 bench/matmul_ceiling.py --only mv
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matmul_gflops as mg  # noqa: E402

import asymo  # noqa: E402
from asymo import gemm_plan  # noqa: E402
from asymo._ffi import ffi, lib  # noqa: E402
from asymo.gemm import _CODES  # noqa: E402
from asymo.pool import Pool  # noqa: E402
from asymo.topology import Cluster, Topology  # noqa: E402

FRACTIONS = (0.1, 0.2, 0.3, 0.33, 0.4, 0.5)


def direct_plan_call(pool, split, pin=None):
    """Contender factory: the product under an explicit plan_gemm plan with ``split``
    (None: plan_gemm's default for the pool), called straight into the C driver so the call
    costs about what asymo.matmul's C fast path costs."""
    def make(a, b, out):
        M, K = a.shape
        b2 = b.reshape(K, -1)
        c2 = out.reshape(M, -1)
        N = b2.shape[1]
        plan = gemm_plan.plan_gemm(M, K, N, a.dtype, pool, split=split)
        handle = pool._handle if not plan.in_caller() else ffi.NULL
        es = a.itemsize
        args = (handle, plan.cdata(), _CODES[a.dtype], M, K, N,
                ffi.from_buffer(a), a.strides[0] // es, a.strides[1] // es,
                ffi.from_buffer(b2), b2.strides[0] // es, b2.strides[1] // es,
                ffi.from_buffer(c2, require_writable=True), c2.strides[0] // es,
                c2.strides[1] // es)
        keep = (plan, a, b2, c2)

        def call(_run=lib.asymo_gemm_2d, _args=args, _keep=keep):
            rc = _run(*_args)
            if rc != lib.ASYMO_OK:
                raise RuntimeError(f"asymo_gemm_2d failed ({rc}) on {(M, K, N)} split {split}")
        return mg._Pinned(call, pin) if pin is not None else call
    return make


def fast_pool_of(topo):
    fast = topo.clusters[0]
    return Pool(topology=Topology(clusters=(Cluster(fast.name, fast.cpus, 1.0, fast.l1d,
                                                    fast.l2, fast.l3),)))


def emulated_pass(shapes, args, dtype):
    import threadpoolctl
    rows = []
    with mg.emulation(args.core, args.speed, args.period) as (topo, how):
        fast = topo.clusters[0]
        pins = set(fast.cpus)
        pool = Pool(topology=topo)
        pool_shared = Pool(topology=topo, policy="shared")
        pool_even = Pool(topology=topo, policy="even")
        pool_fast = fast_pool_of(topo)
        try:
            fast_make = mg.asymo_on(pool_fast)
            contenders = {
                "fast": lambda a, b, out: mg._Pinned(fast_make(a, b, out), pins),
                "fast_direct": direct_plan_call(pool_fast, None, pin=pins),
                "default": mg.asymo_on(pool),
            }
            for f in FRACTIONS:
                contenders[f"f={f:g}"] = direct_plan_call(pool, (1.0 - f, f))
            contenders["shared"] = mg.asymo_on(pool_shared)
            contenders["even"] = mg.asymo_on(pool_even)
            with threadpoolctl.threadpool_limits(1, user_api="blas"):
                for shape in shapes:
                    t = mg.measure(shape, contenders, args.rounds, args.target, dtype)
                    rows.append((shape, t))
                    if args.verbose:
                        print(f"  {shape[0]:>18} " + " ".join(
                            f"{k} {_ratio(t, k):.2f}" for k in t if k != "fast"), flush=True)
        finally:
            for p in (pool, pool_shared, pool_even, pool_fast):
                p.close()
    return how, topo.to_spec(), rows


def symmetric_pass(shapes, args, dtype):
    cpus = tuple(sorted(os.sched_getaffinity(0)))[:2]
    topo = Topology(clusters=(Cluster("sym", cpus, 1.0),))
    pool = Pool(topology=topo)
    pool_fast = fast_pool_of(Topology(clusters=(Cluster("c0", cpus[:1], 1.0),)))
    try:
        fast_make = mg.asymo_on(pool_fast)
        contenders = {"fast": lambda a, b, out: mg._Pinned(fast_make(a, b, out),
                                                          set(cpus[:1])),
                      "sym2": mg.asymo_on(pool)}
        out = {}
        for shape in shapes:
            t = mg.measure(shape, contenders, args.rounds, args.target, dtype)
            out[shape[0]] = _ratio(t, "sym2")
            if args.verbose:
                print(f"  {shape[0]:>18} sym2 {out[shape[0]]:.2f}", flush=True)
    finally:
        pool.close()
        pool_fast.close()
    return out


def _ratio(t, name):
    """Median over rounds of time(fast) / time(name)."""
    return float(np.median(np.asarray(t["fast"]) / np.asarray(t[name])))


def report(how, spec, rows, sym):
    candidates = [k for k in rows[0][1] if k not in ("fast", "fast_direct", "default")]
    print()
    print(f"emulated: {how}; 2-core pool {spec}; every ratio = median over rounds of "
          "time(fast core alone) / time(contender)")
    print(f"{'shape':>18} {'M x K x N':>17} {'fast GF/s':>9} {'direct':>7} {'default':>7} "
          f"{'oracle':>7} {'best':>7} {'f=.33':>6} {'shared':>6} {'even':>6} {'sym2':>6}")
    groups = {}
    for shape, t in rows:
        name, M, K, N = shape
        med = {k: float(np.median(v)) for k, v in t.items()}
        # the oracle: the contender with the lowest median time, fast alone included
        best = min(["fast"] + candidates, key=lambda k: med[k])
        r = {k: _ratio(t, k) for k in t if k != "fast"}
        oracle = 1.0 if best == "fast" else r[best]
        s = sym.get(name, float("nan")) if sym else float("nan")
        print(f"{name:>18} {f'{M}x{K}x{N}':>17} {mg.gflops(shape, med['fast']):9.1f} "
              f"{r['fast_direct']:7.2f} {r['default']:7.2f} {oracle:7.2f} {best:>7} "
              f"{r['f=0.33']:6.2f} {r['shared']:6.2f} {r['even']:6.2f} {s:6.2f}")
        g = "MV" if name.startswith("mv.") else "MM"
        groups.setdefault(g, []).append(dict(r, oracle=oracle, best=best, sym2=s))
    summary = {}
    for g, rs in groups.items():
        gm = {k: mg.geomean([x[k] for x in rs]) for k in
              ("fast_direct", "default", "oracle", "shared", "even", "sym2")}
        gm.update({k: mg.geomean([x[k] for x in rs]) for k in rs[0]
                   if k.startswith("f=")})
        wins = {}
        for x in rs:
            wins[x["best"]] = wins.get(x["best"], 0) + 1
        summary[g] = dict(geomean=gm, best_counts=wins, n=len(rs))
        print(f"geomean {g} ({len(rs)} shapes): default {gm['default']:.2f}, oracle "
              f"{gm['oracle']:.2f}, sym2 cap {gm['sym2']:.2f}, fast_direct "
              f"{gm['fast_direct']:.2f}; single fixed policy: " + ", ".join(
                  f"{k} {gm[k]:.2f}" for k in gm if k.startswith("f=") or k in ("shared",
                                                                                "even")))
        print(f"   oracle winners: {wins}")
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["mm", "mv"], action="append",
                    help="only these shape groups (repeatable; default both)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--target", type=float, default=0.03,
                    help="seconds of calls per timing (default 0.03)")
    ap.add_argument("--core", type=int, default=1, help="core the emulator slows")
    ap.add_argument("--speed", type=float, default=0.5, help="speed of the slowed core")
    ap.add_argument("--period", type=float, default=None, metavar="SECONDS",
                    help="emulator period (default asymo.emulate.DEFAULT_PERIOD)")
    ap.add_argument("--no-symmetric", action="store_true",
                    help="skip the pass without the emulator (the sym2 column)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        ap.error("needs at least 2 usable cpus")
    groups = {"mm": mg.MM_SHAPES, "mv": mg.MV_SHAPES}
    shapes = [s for g in (args.only or ["mm", "mv"]) for s in groups[g]]
    dtype = np.dtype("float32")
    load0 = os.getloadavg()[0]
    from asymo import matmul_fast
    print(f"machine: {mg.machine_line()}; kernels {gemm_plan.best_isa()}, float32; "
          f"{args.rounds} interleaved rounds; load average at start {load0:.2f}; "
          f"matmul fast path: {matmul_fast.status()['state']}")
    sym = None
    if not args.no_symmetric:
        sym = symmetric_pass(shapes, args, dtype)
        print(f"symmetric pass done, load average {os.getloadavg()[0]:.2f}")
    how, spec, rows = emulated_pass(shapes, args, dtype)
    summary = report(how, spec, rows, sym)
    load1 = os.getloadavg()[0]
    print(f"load average at start {load0:.2f}, at end {load1:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"emulation": how, "pool": spec, "rounds": args.rounds,
                       "load_average": [load0, load1], "summary": summary, "sym2": sym,
                       "rows": [{"shape": list(s), "seconds": t} for s, t in rows]}, f,
                      indent=1)
    return summary


if __name__ == "__main__":
    main()
