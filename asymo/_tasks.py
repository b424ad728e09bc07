"""Run a C task function of asymo's kernels over the pool, cluster by cluster.

Kernels (im2col, depthwise convolution, pooling, ...) expose ``void fn(int64 task, void *job)``;
this module hands them to ``asymo_pool_run`` with per-cluster task counts, and keeps the
per-thread scratch buffers they write into.
"""
from __future__ import annotations

import threading

import numpy as np

from asymo._ffi import ffi, lib

__all__ = ["resolve_pool", "run_tasks", "workspace", "DTYPE_CODES", "ACTIVATION_CODES"]

# gemm.h's ASYMO_DTYPE_* codes (the C kernels use the same values)
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
ACTIVATION_CODES = {None: 0, "relu": 1, "relu6": 2}


def resolve_pool(pool):
    """``pool`` or the process-wide default pool."""
    if pool is not None:
        return pool
    import asymo

    try:
        return asymo.get_pool()
    except AttributeError:  # INTERIM: until branch pool lands on main
        return _SerialPool()


class _SerialPool:
    """INTERIM stand-in for asymo.Pool until branch pool lands: runs tasks in this thread."""

    nworkers = 1

    def split_counts(self, ntasks, split=None):
        return [ntasks]

    def cluster_workers(self, cluster):
        return 1


def task_fn(name):
    return getattr(lib, name)  # INTERIM: ffi.addressof(lib, name) once the pool runs tasks


def run_tasks(pool, fn, job, ntasks, counts=None):
    """Run ``fn(task, job)`` for ``task`` in ``range(ntasks)`` on ``pool``.

    ``counts`` gives the tasks of each cluster, fastest first (task ids are assigned to clusters
    in order); ``None`` lets the pool split them by capacity.
    """
    ntasks = int(ntasks)
    if ntasks <= 0:
        return
    if counts is None:
        counts = pool.split_counts(ntasks)
    counts = [int(c) for c in counts]
    if isinstance(pool, _SerialPool):  # INTERIM
        for t in range(ntasks):
            fn(t, job)
        return
    if sum(counts) != ntasks:  # pragma: no cover - a caller bug
        raise RuntimeError(f"cluster task counts {counts} do not add up to {ntasks}")
    c_counts = ffi.new("int64_t[]", counts)
    rc = lib.asymo_pool_run(pool._handle, fn, job, ntasks, c_counts)
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
