"""Per-worker queue: lock-free Chase-Lev deque vs a short mutex-protected deque, in the pool.

Run under the benchmark lock (the machine is shared):

    flock /tmp/asymo-bench.lock python3 bench/pool_queues.py

Both queue kinds hold task *ranges* and serve the same pool code (same policies, chunking
and stealing rules); only the queue operations differ:

* ``mutex``: a ring of ranges behind an adaptive pthread mutex; the owner takes a chunk from
  the front range, a thief takes the back half of the last range;
* ``chaselev``: submitters drop ranges in a small mutex-protected inbox; the owner moves them
  into its Chase-Lev deque as pieces halving towards the bottom and takes from the bottom
  without locks; a thief CASes the top piece (the largest, about half).

Scenarios, each timed for both kinds alternately within every repeat (medians):
empty jobs, one job of 1e6 empty tasks, a job whose tasks are all queued on one worker (the
others must steal everything), many small compute jobs, and 3 threads submitting at once.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import asymo  # noqa: E402
from asymo.runtime.ffi import ffi, lib  # noqa: E402

NOOP = ffi.addressof(lib, "asymo_task_noop")
SPIN = ffi.addressof(lib, "asymo_task_spin")


def scenarios(pool):
    n = pool.nworkers
    nc = pool.nclusters
    h = pool._handle
    even = ffi.new("int64_t[]", pool.split_counts(n))
    spin_small = ffi.new("int64_t[1]", [2000])    # ~1 us per task on a 4 GHz core
    big = 1_000_000
    big_counts = ffi.new("int64_t[]", pool.split_counts(big))
    one_sided = 100_000
    last = [0] * nc
    last[-1] = one_sided  # every task queued on the slowest (or only) cluster's workers
    if nc == 1:
        last = [one_sided]
    last_counts = ffi.new("int64_t[]", last)
    small_counts = ffi.new("int64_t[]", pool.split_counts(64))

    def empty_jobs():
        for _ in range(500):
            lib.asymo_pool_run(h, NOOP, ffi.NULL, n, even, 0)
        return 500

    def million():
        lib.asymo_pool_run(h, NOOP, ffi.NULL, big, big_counts, 0)
        return big

    def steal_everything():
        lib.asymo_pool_run(h, NOOP, ffi.NULL, one_sided, last_counts, 0)
        return one_sided

    def small_compute_jobs():
        for _ in range(100):
            lib.asymo_pool_run(h, SPIN, spin_small, 64, small_counts, 0)
        return 100

    def concurrent_submitters():
        def sub():
            for _ in range(100):
                lib.asymo_pool_run(h, SPIN, spin_small, 64, small_counts, 0)
        ts = [threading.Thread(target=sub) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return 300

    return [
        ("empty job", "us/job", 1e6, empty_jobs),
        ("1e6 empty tasks", "ns/task", 1e9, million),
        ("1e5 tasks all queued on one cluster", "ns/task", 1e9, steal_everything),
        ("64 x 1us tasks per job", "us/job", 1e6, small_compute_jobs),
        ("3 submitters, 64 x 1us tasks", "us/job", 1e6, concurrent_submitters),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="big:0@1.0,little:1@0.5",
                    help="topology override spec (default: %(default)s)")
    ap.add_argument("--policy", default="asymo", choices=sorted(asymo.runtime.pool.POLICIES))
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)

    pools = {q: asymo.Pool(args.topology, policy=args.policy, queue=q)
             for q in ("mutex", "chaselev")}
    print(f"machine: {platform.machine()}, usable cpus {sorted(os.sched_getaffinity(0))}, "
          f"load average {os.getloadavg()[0]:.2f}")
    p0 = pools["mutex"]
    print(f"pool: {p0.nworkers} workers on cpus {list(p0.cpus)}, policy {args.policy}, "
          f"topology {p0.topology.to_spec()}, spin {p0.spin_us} us")
    print(f"emulation: {os.environ.get('ASYMO_EMULATED') or 'none'}; medians over "
          f"{args.repeat} repeats, kinds alternating within each repeat")
    print()
    table = {q: scenarios(p) for q, p in pools.items()}
    names = [s[0] for s in table["mutex"]]
    samples = {q: {name: [] for name in names} for q in pools}
    for q, sc in table.items():  # warm up
        for _, _, _, fn in sc:
            fn()
    for r in range(args.repeat):
        order = ("mutex", "chaselev") if r % 2 == 0 else ("chaselev", "mutex")
        for i, name in enumerate(names):
            for q in order:
                _, unit, scale, fn = table[q][i]
                t0 = time.perf_counter()
                count = fn()
                samples[q][name].append((time.perf_counter() - t0) / count * scale)
    print(f"  {'scenario':38s} {'unit':8s} {'mutex':>9s} {'chaselev':>9s} {'cl/mutex':>9s}")
    for i, name in enumerate(names):
        unit = table["mutex"][i][1]
        m = statistics.median(samples["mutex"][name])
        c = statistics.median(samples["chaselev"][name])
        print(f"  {name:38s} {unit:8s} {m:9.3f} {c:9.3f} {c / m:9.2f}")
    print()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for p in pools.values():
        p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
