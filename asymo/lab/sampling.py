"""Timing runs on a shared machine: undisturbed samples, items interleaved in rounds.

:func:`measure_items` is the sampler both the scaling sweep (:mod:`asymo.lab.scaling.measure`)
and the simulator's calibration (:mod:`asymo.lab.sim.calibrate`) time their runs with;
:func:`overhead_items` and :func:`overheads_from` measure each pool policy's scheduling
overheads from jobs of no-op tasks.
"""
from __future__ import annotations

import contextlib
import statistics
import time

from asymo.lab.loadmon import OtherLoad
from asymo.lab.machine import OPEN_POOLS, open_pool, pinned_thread
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import POLICIES

__all__ = ["measure_items", "summarize", "calls_for", "overhead_items", "overheads_from",
           "DEFAULT_MAX_EXTERNAL", "MAX_ROUNDS_FACTOR", "BASELINE_SETTLE_S"]

#: seconds of pause before and after a baseline's block (its BLAS / OpenMP threads keep
#: spinning for up to ~0.1 s after a call and would slow whatever runs next)
BASELINE_SETTLE_S = 0.3
#: a sample during which other processes used more than this share of the cores is disturbed
DEFAULT_MAX_EXTERNAL = 0.05
#: an item is sampled at most this many times ``repeats``
MAX_ROUNDS_FACTOR = 4


def calls_for(run, min_time):
    """How many calls of ``run`` make a sample of at least ``min_time`` seconds."""
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            run()
        dt = time.perf_counter() - t0
        if dt >= min_time or number >= 1 << 16:
            return number
        number = max(number * 2, int(number * min_time / max(dt, 1e-9) * 1.2))


def measure_items(items, repeats, min_time, progress, desc="measuring",
                  max_external=DEFAULT_MAX_EXTERNAL, main_cpu=None, between_rounds=None):
    """Time every item until it has ``repeats`` undisturbed samples.

    ``items`` is a list of ``(key, factory, interleave)``; ``factory()`` is a context manager
    giving a zero-argument callable. Items with ``interleave`` (asymo's pools, whose idle
    workers sleep after 200 us) are measured in rounds: each round visits every one of them
    once, the order rotated by one each round, so a drift in machine load (other users,
    thermal) hits them all alike. The others (NumPy's BLAS and torch's OpenMP threads, which
    keep spinning for up to ~0.1 s after a call and would slow whatever runs next) are
    measured afterwards, each in one block between settling pauses.

    Each sample: one warm-up call, then enough calls to last ``min_time`` (the count is fixed
    on the first visit), with the share of the machine other processes used meanwhile
    (:class:`asymo.lab.loadmon.OtherLoad`) and, for pool runs, the time the pool's workers
    spent inside tasks. A sample with more than ``max_external`` is kept but does not count
    as undisturbed; an item is sampled again (up to ``4 * repeats`` times) until it has
    ``repeats`` undisturbed samples. The calling (submitting) thread runs on ``main_cpu``
    while it samples, as an application's main thread would on the fastest core: left to
    float, it would run the Python side of every call on whichever core, slowed or not.
    ``between_rounds()``, when given, is called after every round of the interleaved items
    (a calibration measured in runs of its own, but exposed to the same drift).
    Returns ``{key: [(seconds per call, external share, task seconds per call or None),
    ...]}``.
    """
    from tqdm import tqdm

    mon = OtherLoad()
    samples = {key: [] for key, _, _ in items}
    numbers = {}
    inter = [(k, f) for k, f, i in items if i]
    blocks = [(k, f) for k, f, i in items if not i]
    max_samples = MAX_ROUNDS_FACTOR * repeats

    def clean(key):
        return sum(1 for _, share, _ in samples[key] if share <= max_external)

    def done(key):
        return clean(key) >= repeats or len(samples[key]) >= max_samples

    def sample(key, run):
        with pinned_thread(main_cpu):
            run()
            if key not in numbers:
                numbers[key] = calls_for(run, min_time)
            number = numbers[key]
            pool = OPEN_POOLS[-1] if OPEN_POOLS else None
            if pool is not None:
                pool.reset_stats()
            snap = mon.snapshot()
            t0 = time.perf_counter()
            for _ in range(number):
                run()
            dt = (time.perf_counter() - t0) / number
            share = mon.share_since(snap)
            busy = None
            if pool is not None:
                busy = sum(w["busy_s"] for w in pool.stats()["workers"]) / number
        samples[key].append((dt, share, busy))

    # Progress counts the undisturbed samples still needed (an item that reached its cap of
    # samples counts as complete), so the total is known from the start and never changes:
    # a disturbed sample stalls the bar instead of moving its end away.
    bar = tqdm(total=len(items) * repeats, desc=desc, unit="run", disable=not progress,
               leave=False)
    shown = {}

    def tick(key):
        now = repeats if done(key) else min(clean(key), repeats)
        bar.set_postfix_str(" ".join(str(k) for k in key)[:40])
        bar.update(now - shown.get(key, 0))
        shown[key] = now

    try:
        rnd = 0
        while True:
            todo = [(k, f) for k, f in inter if not done(k)]
            if not todo:
                break
            shift = rnd % len(todo)
            for key, factory in todo[shift:] + todo[:shift]:
                with factory() as run:
                    sample(key, run)
                tick(key)
            rnd += 1
            if between_rounds is not None:
                between_rounds()
        for key, factory in blocks:
            time.sleep(BASELINE_SETTLE_S)
            with factory() as run:
                while not done(key):
                    sample(key, run)
                    tick(key)
        if blocks:
            time.sleep(BASELINE_SETTLE_S)
    finally:
        bar.close()
    return samples


def summarize(samples, max_external=DEFAULT_MAX_EXTERNAL):
    """(median seconds, the samples used, their external shares, how many were undisturbed):
    the undisturbed samples when there are any, else all of them."""
    good = [x for x in samples if x[1] <= max_external]
    used = good or list(samples)
    times = [x[0] for x in used]
    return statistics.median(times), times, [x[1] for x in used], len(good)


def overhead_items(topology):
    """Items for :func:`measure_items` timing, per pool policy, a job of one no-op task per
    worker ("small") and one of 64 per worker ("big"), keyed ``("cal", "noop", policy,
    size)``: the jobs :func:`overheads_from` turns into scheduling overheads."""
    noop = ffi.addressof(lib, "asymo_task_noop")
    nw = topology.ncpus
    items = []
    for pol in POLICIES:
        for size, ntasks in (("small", nw), ("big", 64 * nw)):
            @contextlib.contextmanager
            def factory(pol=pol, ntasks=ntasks):
                with open_pool(topology, pol) as pool:
                    yield lambda: pool.parallel_for(noop, ntasks)
            items.append((("cal", "noop", pol, size), factory, True))
    return items


def overheads_from(samples, max_external=DEFAULT_MAX_EXTERNAL):
    """Per policy, the scheduling overheads (seconds per job, per take, per steal) the samples
    of :func:`overhead_items` imply, with the two jobs' median times."""
    overheads = {}
    for pol in POLICIES:
        small = summarize(samples[("cal", "noop", pol, "small")], max_external)[0]
        big = summarize(samples[("cal", "noop", pol, "big")], max_external)[0]
        # a job of nw no-op tasks costs job + one take per worker; of 64*nw, job + at most 64
        # takes per worker (chunking merges takes: an upper bound on the per-take cost)
        per_take = max(0.0, (big - small) / 63.0)
        overheads[pol] = {"job": max(0.0, small - per_take), "task": per_take,
                          "steal": per_take, "small_s": small, "big_s": big}
    return overheads
