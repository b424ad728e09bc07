"""Measured task structure of real workloads, for the simulator.

``trace_jobs(run, pool, as_cluster)`` runs ``run()`` once with the pool's task tracing on
(``asymo_pool_trace_start`` in ``csrc/pool.c``): every job the workload submits -- GEMM
packing-and-compute tasks, im2col, epilogues, pooling, whatever the code issues -- runs
serially in the calling thread acting as a worker of cluster ``as_cluster``, and each task's
duration is recorded. The result is the workload's real job sequence (task counts, per-cluster
split, which function) with the time one worker of that cluster takes for every task, on the
core the caller is pinned to, plus the submitting thread's own work between jobs.

Tasks of another cluster run "as stolen" (the GEMM packs their B panels privately, as a
thief does), and shared B panels are packed by the first task that reaches them in id order,
as the owning cluster's single worker would: the costs are exact for one worker per cluster
and an approximation (packing attributed to the first task of a panel) for more.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from asymo.lab.loadmon import OtherLoad
from asymo.lab.machine import pinned_thread
from asymo.lab.sim.engine import Job, split_counts
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import hold

__all__ = ["TracedJob", "trace_jobs", "collect_traces", "merge_traces", "traced_sim_jobs",
           "jobs_from_traces", "trace_to_dict", "trace_from_dict", "task_seconds"]


@dataclass
class TracedJob:
    """One pool job as recorded: ``fn`` (task function address), ``counts`` (per-cluster task
    counts as submitted, or None), ``task_s`` (seconds per task), ``gap_s`` (the submitting
    thread's own time since the previous job ended, or since the run started)."""

    fn: int
    ntasks: int
    counts: tuple | None
    task_s: np.ndarray
    gap_s: float


def trace_jobs(run, pool, as_cluster, *, max_jobs=1 << 12, max_tasks=1 << 16, buffers=None):
    """Run ``run()`` once with ``pool``'s jobs traced as cluster ``as_cluster``.

    Returns ``(jobs, tail_s)``: the list of :class:`TracedJob` and the submitting thread's
    time after the last job. Pin the calling thread first: the durations are of the core it
    runs on.
    """
    with hold(pool):  # the handle stays valid while held (asymo.runtime.pool.acquire)
        return _trace_jobs(run, pool, as_cluster, max_jobs, max_tasks, buffers)


def _trace_jobs(run, pool, as_cluster, max_jobs, max_tasks, buffers):
    handle = pool._handle
    nclusters = pool.topology.nclusters
    if not 0 <= as_cluster < nclusters:
        raise ValueError(f"as_cluster must lie in [0, {nclusters}), got {as_cluster}")
    if buffers is None:
        buffers = (ffi.new("asymo_trace_job[]", max_jobs), ffi.new("int64_t[]", max_tasks))
    recs, times = buffers
    max_jobs, max_tasks = len(recs), len(times)
    rc = lib.asymo_pool_trace_start(handle, int(as_cluster), recs, max_jobs, times, max_tasks)
    if rc == lib.ASYMO_EBUSY:
        raise RuntimeError("another task trace is running in this process")
    if rc != lib.ASYMO_OK:
        raise ValueError(f"cannot trace cluster {as_cluster} of this pool (code {rc}): "
                         "it has no active worker")
    ntask = ffi.new("int64_t *")
    t0 = time.perf_counter_ns()
    try:
        run()
    finally:
        t1 = time.perf_counter_ns()
        njobs = lib.asymo_pool_trace_stop(handle, ntask)
    if njobs == lib.ASYMO_EOVERFLOW:
        raise RuntimeError("the task trace overflowed its buffers: raise max_jobs/max_tasks")
    if njobs < 0:
        raise RuntimeError(f"the task trace of this pool failed (code {njobs})")
    # trace times are CLOCK_MONOTONIC ns since trace start; perf_counter shares the clock on
    # Linux but not the origin: gaps come from differences between records, the first gap
    # and the tail from the run's length
    total_ns = t1 - t0
    out, prev_done = [], None
    for i in range(njobs):
        r = recs[i]
        n = int(r.ntasks)
        task_s = np.array([times[r.first + k] for k in range(n)], dtype=np.float64) * 1e-9
        counts = None if r.counts[0] < 0 else tuple(int(r.counts[c]) for c in range(nclusters))
        gap = (r.submit_ns - (prev_done if prev_done is not None else 0)) * 1e-9
        out.append(TracedJob(fn=int(r.fn), ntasks=n, counts=counts, task_s=task_s,
                             gap_s=max(0.0, gap)))
        prev_done = r.done_ns
    tail = max(0.0, (total_ns - (prev_done or 0)) * 1e-9)
    return out, tail


def _structure(jobs):
    """A traced run's task structure: per job, the function, task count and split."""
    return [(j.fn, j.ntasks, j.counts) for j in jobs]


def _median_trace(traces):
    """Per job, per task: the median over repeated traces of the same run (same structure)."""
    first, _ = traces[0]
    for jobs, _ in traces[1:]:
        if _structure(jobs) != _structure(first):
            raise RuntimeError("the workload issued different jobs on repeated runs: its task "
                               "structure is not deterministic")
    merged = []
    for i, j in enumerate(first):
        task_s = np.median(np.stack([jobs[i].task_s for jobs, _ in traces]), axis=0)
        gap = statistics.median(jobs[i].gap_s for jobs, _ in traces)
        merged.append(TracedJob(fn=j.fn, ntasks=j.ntasks, counts=j.counts, task_s=task_s,
                                gap_s=gap))
    tail = statistics.median(t for _, t in traces)
    return merged, tail


def merge_traces(traces):
    """One trace from repeated traces of the same run: per job and task, the median."""
    return _median_trace(list(traces))


def task_seconds(trace):
    """Total seconds inside tasks of one ``trace_jobs`` result."""
    jobs, _ = trace
    return float(sum(j.task_s.sum() for j in jobs))


def collect_traces(run, pool, cpus, *, repeats=5, warmup=1, max_external=0.05):
    """Repeated traces of ``run()`` on ``pool``: for each cluster ``c``, traced as ``c`` with
    the calling thread pinned to ``cpus[c]`` (an int: the same core for every cluster).

    A trace during which other processes used more than ``max_external`` of the machine is
    retaken (up to ``4 * repeats`` traces; all of them are kept when fewer were undisturbed).
    Returns a list (per cluster traced) of lists of ``trace_jobs`` results.
    """
    mon = OtherLoad()
    ncl = pool.topology.nclusters
    cpus = [cpus] * ncl if isinstance(cpus, int) else list(cpus)
    bufs = (ffi.new("asymo_trace_job[]", 1 << 12), ffi.new("int64_t[]", 1 << 16))
    out = []
    for c in range(ncl):
        with pinned_thread(cpus[c]):
            for _ in range(warmup):
                trace_jobs(run, pool, c, buffers=bufs)
            clean, every = [], []
            while len(clean) < repeats and len(every) < 4 * repeats:
                snap = mon.snapshot()
                tr = trace_jobs(run, pool, c, buffers=bufs)
                every.append(tr)
                if mon.share_since(snap) <= max_external:
                    clean.append(tr)
            out.append(clean if len(clean) >= repeats else every)
    return out


def traced_sim_jobs(make_run, pool, cpus, *, repeats=5, warmup=1, max_external=0.05):
    """Simulator jobs for one run of a workload on ``pool``'s topology, from traces.

    ``make_run()`` gives the zero-argument callable running the workload on ``pool``. Every
    cluster's costs are traced with the calling thread pinned to ``cpus[c]`` (``repeats``
    runs each, per-task medians; an int: the same core for every cluster; see
    :func:`collect_traces`). Returns a list of :class:`asymo.lab.sim.Job` (see
    :func:`jobs_from_traces`).
    """
    per_cluster = collect_traces(make_run(), pool, cpus, repeats=repeats, warmup=warmup,
                                 max_external=max_external)
    return jobs_from_traces(per_cluster, pool.topology)


def trace_to_dict(trace):
    """A ``trace_jobs`` result as plain JSON data."""
    jobs, tail = trace
    return {"jobs": [{"fn": j.fn, "ntasks": j.ntasks,
                      "counts": list(j.counts) if j.counts is not None else None,
                      "task_s": [float(x) for x in j.task_s], "gap_s": float(j.gap_s)}
                     for j in jobs],
            "tail_s": float(tail)}


def trace_from_dict(d):
    """Inverse of :func:`trace_to_dict`, checking the data (a ``ValueError`` names what is
    wrong)."""
    try:
        jobs = []
        for j in d["jobs"]:
            task_s = np.asarray(j["task_s"], dtype=np.float64)
            ntasks = int(j["ntasks"])
            if task_s.shape != (ntasks,) or not np.all(np.isfinite(task_s)) or \
                    np.any(task_s < 0):
                raise ValueError(f"job with ntasks={ntasks} has {task_s.shape[0]} task times "
                                 "or negative/non-finite ones")
            counts = j["counts"]
            if counts is not None:
                counts = tuple(int(c) for c in counts)
                if sum(counts) != ntasks or min(counts) < 0:
                    raise ValueError(f"job counts {counts} do not sum to ntasks={ntasks}")
            gap = float(j["gap_s"])
            if not (np.isfinite(gap) and gap >= 0):
                raise ValueError(f"gap_s {gap!r} must be finite and >= 0")
            jobs.append(TracedJob(fn=int(j["fn"]), ntasks=ntasks, counts=counts,
                                  task_s=task_s, gap_s=gap))
        tail = float(d["tail_s"])
        if not (np.isfinite(tail) and tail >= 0):
            raise ValueError(f"tail_s {tail!r} must be finite and >= 0")
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed trace: {exc!r}") from None
    return jobs, tail


def jobs_from_traces(per_cluster, topology):
    """Simulator jobs from per-cluster traces of one workload run on ``topology``:
    ``per_cluster[c]`` is a list of ``trace_jobs`` results traced as cluster ``c`` (per-task
    medians are taken over them)."""
    ncl = topology.nclusters
    if len(per_cluster) != ncl:
        raise ValueError(f"traces for {len(per_cluster)} clusters, the topology has {ncl}")
    per_cluster = [_median_trace(list(tr)) for tr in per_cluster]
    base, _ = per_cluster[0]
    for jobs, _ in per_cluster[1:]:
        if _structure(jobs) != _structure(base):
            raise RuntimeError("the workload issued different jobs when traced as different "
                               "clusters")
    # the submitting thread's own work does not depend on the identity the tasks ran under:
    # take it from the fastest cluster's traces
    out = []
    for i, j in enumerate(base):
        costs = np.stack([jobs[i].task_s for jobs, _ in per_cluster], axis=1)
        # NULL counts: pool.c splits evenly by worker count
        split = list(j.counts) if j.counts is not None else split_counts(
            j.ntasks, [c.ncpus for c in topology.clusters])
        out.append(Job(costs=costs, split=split, name=f"fn{j.fn:x}", delay=j.gap_s))
    # the submitting thread's work after the last job: a job of no tasks
    out.append(Job(costs=np.zeros((0, ncl)), name="tail", delay=per_cluster[0][1]))
    return out
