"""Run a C task function of asymo's kernels over the pool, cluster by cluster.

Kernels (im2col, depthwise convolution, pooling, ...) expose ``void fn(int64 task, void *job)``;
this module hands them to ``asymo_pool_run`` with per-cluster task counts, and keeps the
per-thread scratch buffers they write into.
"""
from __future__ import annotations

import threading

import numpy as np

from asymo.runtime.ffi import ffi, lib

__all__ = ["resolve_pool", "run_tasks", "tasks_call", "run_calls", "BoundJobs", "merged_call",
           "JobSequence", "task_counts", "workspace",
           "DTYPE_CODES", "ACTIVATION_CODES", "TASKS_PER_WORKER", "TASK_IDLE"]

# gemm.h's ASYMO_DTYPE_* codes (the C kernels use the same values)
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
ACTIVATION_CODES = {None: 0, "relu": 1, "relu6": 2}


def resolve_pool(pool):
    """``pool`` or the process-wide default pool (``asymo.get_pool()``)."""
    if pool is not None:
        return pool
    from asymo.runtime.pool import get_pool

    return get_pool()


def task_fn(name):
    """The C task function ``name`` of asymo's core, as a function pointer."""
    return ffi.addressof(lib, name)


# Jobs touching fewer bytes than this run in the calling thread: waking the pool (a few us)
# costs more than the pass itself.
INLINE_BYTES = 48 << 10
# Aim for this many tasks per worker in element-wise kernels (load balance vs overhead).
TASKS_PER_WORKER = 4
# ... and cut the work into more blocks (up to twice as many) until its tasks leave the
# workers idle for at most this fraction of the time they work, counting tasks as equal (nine
# tasks on two workers: 1/9; asymo.runtime.partition.even_block_size). Measured:
# docs/tuning.md.
TASK_IDLE = 0.1


_MULTI_TASK = ffi.addressof(lib, "asymo_multi_task")


def task_counts(pool, ntasks, *, fastest_only=False):
    """Per-cluster task counts, decided once at plan time rather than on every run: the
    pool's capacity split, or every task on the fastest cluster (None on a one-cluster pool:
    there is nothing to split)."""
    if pool.nclusters <= 1:
        return None
    split = [1.0] + [0.0] * (pool.nclusters - 1) if fastest_only else None
    return ffi.new("int64_t[]", pool.split_counts(ntasks, split))


def tasks_call(pool, fn, job, ntasks, counts, inline, backup=False):
    """One pool job as a ``(function, args)`` call returning a status code, for a bound
    call's hot path (``inline``: run by the calling thread; ``backup``: its tasks may be
    backed up, ASYMO_RUN_BACKUP)."""
    if counts is None:
        counts = ffi.NULL if pool.nclusters == 1 else ffi.new(
            "int64_t[]", pool.split_counts(int(ntasks)))
    flags = lib.ASYMO_RUN_INLINE if inline else lib.ASYMO_RUN_BACKUP if backup else 0
    return (lib.asymo_pool_run, (pool._handle, fn, job, int(ntasks), counts, flags))


def run_calls(calls, what):
    """Run ``(function, args)`` calls returning status codes in order; ``RuntimeError`` naming
    ``what`` and the code at the first that fails."""
    for fn, args in calls:
        rc = fn(*args)
        if rc:
            raise RuntimeError(f"{what}: a native job failed with code {rc}")


class BoundJobs:
    """Pool jobs bound to fixed arrays and one pool (`tasks_call` calls, and any other
    ``(function, args)`` calls returning a status code): a call runs them in order with no
    Python work between them and raises ``RuntimeError`` naming ``what`` if one fails. ``keep``
    holds what the jobs point into, alive as long as the calls. A call must hold the pool
    (`asymo.runtime.pool.hold`), as a model's inference does."""

    __slots__ = ("_calls", "_keep", "_what")

    def __init__(self, calls, keep, what):
        self._calls, self._keep, self._what = calls, keep, what

    def __call__(self):
        run_calls(self._calls, self._what)

    @property
    def calls(self):
        """The pool jobs a call runs, in order, as ``(asymo_pool_run, args)`` pairs, for a
        caller that runs them itself (a model's `JobSequence`, sibling convolutions merged
        into one job); None when a call runs anything else."""
        if any(fn is not lib.asymo_pool_run for fn, _args in self._calls):
            return None
        return list(self._calls)


class JobSequence:
    """`tasks_call` calls on one pool run by one call into C (``asymo_pool_run_jobs``), in
    order, as the calls one after another would: nothing runs in Python between the jobs, so
    no worker waits for the interpreter between two of them. Made once (a model's plan);
    calling it raises ``RuntimeError`` naming the failing job's code, the jobs after it not
    run. The jobs' contexts must stay alive as long as the sequence (their owners keep them).

    ``fences`` (one ``(wait, mark)`` per call, or None for none) puts an
    ``asymo_pool_fence`` before a job: ``wait`` is an index into ``marks`` (a cffi
    ``uint64_t[]`` the caller owns and may write between calls), `WAIT_ALL` (every late copy)
    or `WAIT_NONE`; ``mark`` (an index, or -1) records there the last job number before the
    job began, for later fences to wait on.
    """

    __slots__ = ("_handle", "_jobs", "_n", "_failed", "_marks", "_nmarks")

    #: ``wait`` values: no fence; a fence for every job so far
    WAIT_NONE, WAIT_ALL = lib.ASYMO_WAIT_NONE, lib.ASYMO_WAIT_ALL

    def __init__(self, pool, calls, fences=None, marks=None):
        calls = list(calls)
        if not calls:
            raise ValueError("JobSequence: no calls")
        if fences is not None:
            fences = list(fences)
            if len(fences) != len(calls):
                raise ValueError(f"JobSequence: {len(fences)} fences for {len(calls)} calls")
            if marks is None and any(w >= 0 or m >= 0 for w, m in fences):
                raise ValueError("JobSequence: fences on marks need a marks array")
        nmarks = 0 if marks is None else len(marks)
        jobs = ffi.new("asymo_run_job[]", len(calls))
        for i, (fn, args) in enumerate(calls):
            if not JobSequence.fits(pool, fn, args):
                raise ValueError(f"JobSequence: call {i} is not a job on this pool")
            _handle, task, ctx, ntasks, counts, flags = args
            wait, mark = (self.WAIT_NONE, -1) if fences is None else fences[i]
            if not (self.WAIT_ALL <= wait < nmarks and -1 <= mark < nmarks):
                raise ValueError(f"JobSequence: call {i}'s fence ({wait}, {mark}) is outside "
                                 f"the {nmarks} marks")
            job = jobs[i]
            job.fn, job.ctx, job.ntasks = task, ctx, int(ntasks)
            job.cluster_counts, job.flags = counts, int(flags)
            job.wait, job.mark = int(wait), int(mark)
        self._handle, self._jobs, self._n = pool._handle, jobs, len(calls)
        self._marks = ffi.NULL if marks is None else marks
        self._nmarks = nmarks
        self._failed = ffi.new("int64_t *")

    @staticmethod
    def fits(pool, fn, args):
        """Whether the call ``fn(*args)`` is a `tasks_call` job on ``pool``."""
        return fn is lib.asymo_pool_run and args[0] == pool._handle

    def __len__(self):
        return self._n

    def __call__(self):
        rc = lib.asymo_pool_run_jobs(self._handle, self._jobs, self._n, self._marks,
                                     self._nmarks, self._failed)
        if rc:
            raise RuntimeError(f"a native job failed with code {rc} (job {self._failed[0]} "
                               f"of {self._n} in a sequence)")


def merged_call(pool, calls):
    """One pool job running the jobs of several `tasks_call` calls, which must be independent
    of one another, as parts of one (``asymo_multi_task``): ``(call, keep)`` (``keep`` must
    outlive the call), or None when they do not fit one (an inline job, a job without
    per-cluster counts on a pool of several clusters -- `tasks_call` gives them counts there --
    or more parts than ``ASYMO_MULTI_MAX_PARTS``).

    Per cluster, and within it per active worker, each job's share follows the previous
    job's, so a worker is dealt the tasks of each job it would have been dealt alone; given
    the longest job first, the shorter jobs' tasks come last in each worker's range, where
    thieves take from, and fill the longer job's tail. The job backs tasks up
    (``ASYMO_RUN_BACKUP``) only if every part did."""
    jobs, flags = [], ~0
    for fn, args in calls:
        handle, task, ctx, ntasks, counts, fl = args
        if (not JobSequence.fits(pool, fn, args) or fl & lib.ASYMO_RUN_INLINE
                or (counts == ffi.NULL and pool.nclusters > 1)):
            return None
        shares = ([int(ntasks)] if counts == ffi.NULL
                  else [int(counts[c]) for c in range(pool.nclusters)])
        jobs.append((task, ctx, int(ntasks), shares))
        flags &= int(fl)
    active = pool.active_workers_per_cluster()
    # a chunk per active worker of each cluster, else (too many parts) one per cluster
    for chunks in ([max(1, n) for n in active], [1] * len(active)):
        parts, shares = [], [0] * len(active)
        for c, nc in enumerate(chunks):
            for w in range(nc):
                for task, ctx, _n, cnt in jobs:
                    base = sum(cnt[:c])
                    lo, hi = base + cnt[c] * w // nc, base + cnt[c] * (w + 1) // nc
                    if hi > lo:
                        parts.append((task, ctx, lo, hi - lo))
                        shares[c] += hi - lo
        if len(parts) <= lib.ASYMO_MULTI_MAX_PARTS:
            break
    else:
        return None
    multi = ffi.new("asymo_multi_job *")
    first = 0
    for i, (task, ctx, lo, k) in enumerate(parts):
        multi.first[i] = first
        multi.parts[i].fn = task
        multi.parts[i].ctx = ctx
        multi.parts[i].lo = lo
        first += k
    multi.nparts = len(parts)
    counts = ffi.NULL if pool.nclusters == 1 else ffi.new("int64_t[]", shares)
    keep = [multi, counts, calls]
    return (lib.asymo_pool_run, (pool._handle, _MULTI_TASK, multi, first, counts, flags)), keep


def run_tasks(pool, fn, job, ntasks, counts=None, *, inline=False):
    """Run ``fn(task, job)`` for ``task`` in ``range(ntasks)`` on ``pool`` and wait.

    ``counts`` gives the tasks of each cluster, fastest first (task ids are assigned to clusters
    in order); ``None`` lets the pool split them by capacity. ``inline`` runs the tasks in the
    calling thread instead (for jobs too small to be worth waking the workers).
    """
    # The pool's own checks (parallel_for) cost ~20 us a call, ten times the C submission:
    # asymo's kernels pass a known C function and a job struct, so go straight to C.
    ntasks = int(ntasks)
    if ntasks <= 0:
        return
    # held for the call: a close() from another thread waits for it (a no-op count when the
    # caller's operation holds the pool already, as conv2d does)
    pool._acquire("cannot run tasks on a closed Pool")
    try:
        if counts is None:
            c_counts = ffi.NULL if pool.nclusters == 1 else ffi.new(
                "int64_t[]", pool.split_counts(ntasks))
        elif isinstance(counts, ffi.CData):
            c_counts = counts
        else:
            c_counts = ffi.new("int64_t[]", [int(c) for c in counts])
        rc = lib.asymo_pool_run(pool._handle, fn, job, ntasks, c_counts,
                                lib.ASYMO_RUN_INLINE if inline else 0)
    finally:
        pool._release()
    if rc != 0:
        raise RuntimeError(f"asymo_pool_run failed with code {rc}")


_local = threading.local()


def workspace(nelems, dtype, slot="col"):
    """A per-thread scratch array of ``nelems`` elements (reused across calls: no page faults
    per convolution). The contents are undefined; the array stays valid until the next call
    with the same ``slot`` on this thread."""
    dtype = np.dtype(dtype)
    nbytes = int(nelems) * dtype.itemsize
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < nbytes:
        # grow geometrically so a sequence of growing layers reallocates only a few times
        size = max(nbytes, 0 if buf is None else min(2 * buf.nbytes, 1 << 30))
        buf = bufs[slot] = np.empty(max(size, 64), dtype=np.uint8)
    return buf[:nbytes].view(dtype)
