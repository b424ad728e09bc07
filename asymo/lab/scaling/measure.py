"""Measuring the scaling sweep on this machine (:func:`measure_scaling`): undisturbed samples,
pool policies interleaved in rounds, and the runs the simulator's calibration needs."""
from __future__ import annotations

import contextlib
import os
import statistics
import time

from asymo.hw import topology as topo
from asymo.lab.scaling.machine import _OPEN_POOLS, _open_pool, _pinned_thread
from asymo.lab.scaling.result import Point, ScalingResult, _machine_meta
from asymo.lab.scaling.workloads import BASELINES, POOL_POLICIES, _fn_arg, _spin_cfunc
from asymo.lab.sim.engine import first_cores


def _loadavg():
    """The 1-minute load average (other users' work shows up here), or None."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return None


def _calls_for(run, min_time):
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


BASELINE_SETTLE_S = 0.3


DEFAULT_MAX_EXTERNAL = 0.05
MAX_ROUNDS_FACTOR = 4
CALIBRATION_ROUNDS = 8   # at least, when the simulator is calibrated beside a sweep


def _measure_items(items, repeats, min_time, progress, desc="measuring",
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

    from asymo.lab.loadmon import OtherLoad
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
        with _pinned_thread(main_cpu):
            run()
            if key not in numbers:
                numbers[key] = _calls_for(run, min_time)
            number = numbers[key]
            pool = _OPEN_POOLS[-1] if _OPEN_POOLS else None
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

    bar = tqdm(total=len(items) * repeats, desc=desc, unit="run", disable=not progress,
               leave=False)

    def tick(key):
        if bar.n >= bar.total:
            bar.total += 1
        bar.set_postfix_str(" ".join(str(k) for k in key)[:40])
        bar.update(1)

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


def _summarize(samples, max_external=DEFAULT_MAX_EXTERNAL):
    """(median seconds, the samples used, their external shares, how many were undisturbed):
    the undisturbed samples when there are any, else all of them."""
    good = [x for x in samples if x[1] <= max_external]
    used = good or list(samples)
    times = [x[0] for x in used]
    return statistics.median(times), times, [x[1] for x in used], len(good)


def _serial_seconds(samples, max_external=DEFAULT_MAX_EXTERNAL):
    """Median time per call spent outside the pool's tasks (the submitting thread's own work:
    Python glue, planning, job submission), over the samples ``_summarize`` would use."""
    good = [x for x in samples if x[1] <= max_external and x[2] is not None]
    used = good or [x for x in samples if x[2] is not None]
    if not used:
        return 0.0
    return max(0.0, statistics.median(t - busy for t, _, busy in used))


def _policies_for(workload, policies):
    have = workload.policies()
    if policies is None:
        return have
    return [p for p in policies if p in have]


def _single_core(topology, ci):
    c = topology.clusters[ci]
    return topo.Topology(clusters=(topo.Cluster(name=c.name, cpus=(c.cpus[0],),
                                                capacity=c.capacity),),
                         source=topology.source, emulated=topology.emulated)


def _calibration_items(topology, workloads):
    """What the simulator needs to model ``workloads`` here (see :func:`calibrate_sim`)."""
    items = []
    for wl in workloads:
        for ci in range(topology.nclusters):
            one = _single_core(topology, ci)
            items.append((("cal", wl.name, ci),
                          lambda wl=wl, one=one: wl.runner("asymo", one), True))
    _, noop = _spin_cfunc()
    nw = topology.ncpus
    for pol in POOL_POLICIES:
        for size, ntasks in (("small", nw), ("big", 64 * nw)):
            @contextlib.contextmanager
            def factory(pol=pol, ntasks=ntasks):
                with _open_pool(topology, pol) as pool:
                    yield lambda: pool.parallel_for(_fn_arg(noop), ntasks)
            items.append((("cal", "noop", pol, size), factory, True))
    return items


def _sim_seconds_at_1gflops(wl, topology):
    """Simulated single-core seconds of one run of ``wl`` at 1 GFLOP/s (its modelled work)."""
    one = _single_core(topology, 0)
    return sum(float(j.costs.sum()) for j in wl.sim_jobs(one, [1.0]))


def _calibration_from(samples, topology, workloads, max_external=DEFAULT_MAX_EXTERNAL):
    """Per workload: the run time on one core of each cluster, hence each cluster's rate on
    the workload's modelled work; per policy: scheduling overheads from no-op jobs."""
    per = {}
    for wl in workloads:
        t = [_summarize(samples[("cal", wl.name, ci)], max_external)[0]
             for ci in range(topology.nclusters)]
        # the fastest core's run time splits into time inside the pool's tasks and the
        # submitting thread's serial work; rates come from the time inside tasks
        serial = _serial_seconds(samples[("cal", wl.name, 0)], max_external)
        inside = [max(x - serial, 1e-12) for x in t]
        work = _sim_seconds_at_1gflops(wl, topology)
        per[wl.name] = {"time_s": t, "serial_s": serial,
                        "gflops_per_core": [work / x for x in inside],
                        "speeds": [inside[0] / x for x in inside]}
    overheads = {}
    for pol in POOL_POLICIES:
        small = _summarize(samples[("cal", "noop", pol, "small")], max_external)[0]
        big = _summarize(samples[("cal", "noop", pol, "big")], max_external)[0]
        # a job of nw no-op tasks costs job + one take per worker; of 64*nw, job + at most 64
        # takes per worker (chunking merges takes: an upper bound on the per-take cost)
        per_take = max(0.0, (big - small) / 63.0)
        overheads[pol] = {"job": max(0.0, small - per_take), "task": per_take,
                          "steal": per_take, "small_s": small, "big_s": big}
    return {"workloads": per, "overheads": overheads}


def measure_scaling(workloads, *, policies=None, topology=None, max_cores=None, repeats=5,
                    min_time=0.02, progress=True, calibrate=False,
                    max_external=DEFAULT_MAX_EXTERNAL, emulator_period=None):
    """Measure throughput at 1 .. ncpus cores (fastest cluster first) on this machine.

    Parameters
    ----------
    workloads : sequence of Workload
    policies : sequence of str, optional
        Subset of ``POOL_POLICIES + BASELINES``; default: every one available for each workload
        (policies a workload cannot run, e.g. torch when absent, are skipped).
    topology : Topology, optional
        Default ``asymo.hw.topology.detect()`` (which sees the emulator's override).
    max_cores : int, optional
        Stop at this many cores.
    repeats : int
        Samples per point (pool policies interleaved over all points, baselines in blocks;
        see ``_measure_items``); the median is reported.
    min_time : float
        Each sample lasts at least this long (seconds).
    progress : bool
        Show a tqdm progress bar on stderr.
    calibrate : bool
        Also measure what the simulator needs to model the workloads here (see
        :mod:`asymo.lab.sim.calibrate`), in runs of its own: one calibration round after each
        round of the sweep (at least ``CALIBRATION_ROUNDS``), so that a drift in the
        machine's speed hits the calibration and the points alike; stored as
        ``result.calibration``, used by :func:`validate_sim`.
    max_external : float
        A sample during which other processes used more than this share of the machine's
        cores counts as disturbed: points are re-sampled (up to 4x ``repeats``) until they
        have ``repeats`` undisturbed samples, and the median is over those (over all samples
        when none was undisturbed; ``Point.samples_clean`` says which). 1.0 keeps everything.
    emulator_period : float, optional
        Seconds per period of the emulator the topology runs under (recorded in the meta
        data, used by the calibration and :func:`validate_sim`); default: the running
        emulator's (env ``ASYMO_EMULATED_PERIOD``), else ``asymo.lab.emulate.DEFAULT_PERIOD``.

    Returns
    -------
    ScalingResult
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if min_time < 0:
        raise ValueError(f"min_time must be >= 0, got {min_time}")
    if policies is not None:
        unknown = [p for p in policies if p not in POOL_POLICIES + BASELINES]
        if unknown:
            raise ValueError(f"unknown policy {unknown[0]!r}; choose from "
                             f"{', '.join(POOL_POLICIES + BASELINES)}")
    topology = topology if topology is not None else topo.detect()
    ncores = topology.ncpus if max_cores is None else min(int(max_cores), topology.ncpus)
    if ncores < 1:
        raise ValueError(f"max_cores must be >= 1, got {max_cores}")
    items, meta = [], {}
    for wl in workloads:
        for pol in _policies_for(wl, policies):
            for k in range(1, ncores + 1):
                sub = first_cores(topology, k)
                items.append(((wl.name, pol, k),
                              lambda wl=wl, pol=pol, sub=sub: wl.runner(pol, sub),
                              pol in POOL_POLICIES))
                meta[(wl.name, pol, k)] = (wl, sub)
    if not items:
        raise RuntimeError("nothing to measure: none of the requested policies can run the "
                           "requested workloads in this build")
    pool_workloads = [wl for wl in workloads
                      if any(p in POOL_POLICIES for p in _policies_for(wl, policies))]
    calibration = None
    calibrator = contextlib.nullcontext()
    if calibrate:
        # the simulator's inputs, measured in runs of their own, one calibration round
        # after each of the sweep's rounds (drift in the machine's speed hits both alike)
        from asymo.lab.sim.calibrate import SimCalibrator
        items += [it for it in _calibration_items(topology, []) if it[0][1] == "noop"]
        calibrator = SimCalibrator(topology, pool_workloads, emulator_period=emulator_period,
                                   max_external=max_external)
    load_before = _loadavg()
    with calibrator as cal:
        samples = _measure_items(items, repeats, min_time, progress, desc="scaling",
                                 max_external=max_external, main_cpu=topology.cpus[0],
                                 between_rounds=cal.round if calibrate else None)
        if calibrate:
            while cal.rounds < CALIBRATION_ROUNDS:
                cal.round()
            overheads = _calibration_from(samples, topology, [], max_external)["overheads"]
            calibration = cal.result(overheads, interleaved=True)
    load_after = _loadavg()
    points = []
    for key, (wl, sub) in meta.items():
        med, times, shares, nclean = _summarize(samples[key], max_external)
        points.append(Point(workload=wl.name, policy=key[1], cores=key[2],
                            throughput=wl.throughput(med), unit=wl.unit, time_s=med,
                            cpus=list(sub.cpus), times_s=times,
                            external_load=statistics.median(shares),
                            samples_clean=nclean, samples_total=len(samples[key])))
    res = ScalingResult(points=points, mode="measured", topology=first_cores(topology, ncores),
                        meta=_machine_meta(topology) | {"repeats": repeats,
                                                        "min_time_s": min_time,
                                                        "interleaved": True,
                                                        "max_external_load": max_external,
                                                        "loadavg_before": load_before,
                                                        "loadavg_after": load_after},
                        workloads={wl.name: wl.describe() for wl in workloads})
    res.workload_objs = list(workloads)
    if topology.emulated:
        if emulator_period is None:
            from asymo.lab.sim.calibrate import _default_period
            emulator_period = _default_period()
        res.meta["emulator_period_s"] = emulator_period
    res.calibration = calibration
    res._fill_speedups()
    return res
