"""Energy-calibration micro-benchmarks (AsyMo section 5): one compute-bound and one
memory-bound kernel, run on every core of one cluster at once, each thread pinned to its core.

* compute: every element of a small, L1-resident float32 array goes through a chain of
  ``COMPUTE_CHAIN`` fused multiply-adds per pass (``acc = acc * x + c``); nothing leaves the
  core, so time scales with 1/f. Work is counted in flops (2 per multiply-add).
* memory: a matrix-vector product ``y = A @ x`` over a float32 matrix several times larger
  than the last-level cache -- the FC-layer access pattern, AsyMo Eq. 2 reuse just under 2.
  Work is counted in bytes of ``A`` streamed.

Kernels are Numba ``nogil`` functions, so the threads run truly in parallel. Each thread
pins itself with ``os.sched_setaffinity(0, {cpu})`` (0 = the calling thread on Linux) and is
discarded afterwards, so no affinity outlives the run.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["BenchResult", "run_compute", "run_memory", "memory_matrix_shape", "warm_up",
           "COMPUTE_CHAIN", "COMPUTE_ARRAY", "DEFAULT_MEMORY_BYTES"]

COMPUTE_CHAIN = 32
COMPUTE_ARRAY = 1024  # float32 elements: 4 KiB, stays in L1
DEFAULT_MEMORY_BYTES = 64 << 20
_MAX_MEMORY_BYTES = 512 << 20


@njit(nogil=True, fastmath=True, cache=False)
def _compute_kernel(x, out, passes):
    n = x.shape[0]
    for _ in range(passes):
        for i in range(n):
            v = x[i]
            acc = out[i]
            # 32 dependent FMAs per element; independent across i, so the loop vectorises.
            for _k in range(32):
                acc = acc * v + np.float32(0.25)
            out[i] = acc


@njit(nogil=True, fastmath=True, cache=False)
def _mv_kernel(a, x, y, lo, hi, passes):
    k = a.shape[1]
    for _ in range(passes):
        for i in range(lo, hi):
            s = np.float32(0.0)
            for j in range(k):
                s += a[i, j] * x[j]
            y[i] += s


@dataclass(frozen=True)
class BenchResult:
    """One run: ``work`` units (flops or bytes) done in ``elapsed_s`` on ``cpus``."""

    kind: str
    cpus: tuple
    work: float
    unit: str
    elapsed_s: float
    reading: object = None  # MeterReading when a meter was given

    @property
    def time_per_unit_s(self):
        return self.elapsed_s / self.work

    @property
    def rate(self):
        return self.work / self.elapsed_s


def _usable(cpus):
    cpus = tuple(int(c) for c in cpus)
    if not cpus:
        raise ValueError("no cpus given")
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return cpus
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise ValueError(f"cpus {bad} are outside this process's affinity "
                         f"{sorted(allowed)} (taskset / cgroup cpuset); asymo never pins there")
    return cpus


def _run_pinned(cpus, body, duration_s, meter):
    """Run ``body(index, deadline) -> work`` on one thread per cpu, all started together."""
    cpus = _usable(cpus)
    n = len(cpus)
    barrier = threading.Barrier(n + 1)
    work = [0.0] * n
    errors = []
    deadline = [0.0]

    def worker(i, cpu):
        try:
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            errors.append(exc)
        try:
            barrier.wait()
            work[i] = body(i, deadline[0])
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i, c), daemon=True,
                                name=f"asymo-energy-bench-{c}") for i, c in enumerate(cpus)]
    for t in threads:
        t.start()
    token = meter.start() if meter is not None else None
    t0 = time.perf_counter()
    deadline[0] = t0 + duration_s
    try:
        barrier.wait()
    finally:
        for t in threads:
            t.join()
    elapsed = time.perf_counter() - t0
    reading = meter.stop(token) if meter is not None else None
    if errors:
        raise errors[0]
    return float(sum(work)), elapsed, reading


def run_compute(cpus, duration_s=0.25, *, meter=None, chunk_passes=None):
    """Run the compute-bound kernel on ``cpus`` for about ``duration_s``.

    Returns a ``BenchResult`` in flops.
    """
    n = COMPUTE_ARRAY
    passes = int(chunk_passes or 200)
    flops_per_chunk = 2.0 * COMPUTE_CHAIN * n * passes
    bufs = [(np.full(n, 0.5, np.float32) + np.arange(n, dtype=np.float32) * 1e-5,
             np.zeros(n, np.float32)) for _ in cpus]

    def body(i, deadline):
        x, out = bufs[i]
        done = 0.0
        while True:
            _compute_kernel(x, out, passes)
            done += flops_per_chunk
            if time.perf_counter() >= deadline:
                return done

    work, elapsed, reading = _run_pinned(cpus, body, duration_s, meter)
    if not np.isfinite(bufs[0][1]).all():  # keeps the result live and checks the kernel
        raise FloatingPointError("compute benchmark produced non-finite values")
    return BenchResult("compute", tuple(cpus), work, "flop", elapsed, reading)


def memory_matrix_shape(nbytes=None, llc_bytes=None):
    """``(M, K)`` of the float32 matrix for the memory benchmark: at least 4x the last-level
    cache (``DEFAULT_MEMORY_BYTES`` when unknown), at most 512 MiB."""
    if nbytes is None:
        nbytes = max(DEFAULT_MEMORY_BYTES, 4 * int(llc_bytes or 0))
    nbytes = int(min(max(int(nbytes), 1 << 16), _MAX_MEMORY_BYTES))
    k = 4096
    m = max(1, nbytes // (4 * k))
    return m, k


def run_memory(cpus, duration_s=0.25, *, meter=None, nbytes=None, llc_bytes=None):
    """Run the memory-bound matrix-vector kernel on ``cpus`` for about ``duration_s``.

    Returns a ``BenchResult`` in bytes of the matrix streamed. ``reuse`` of the benchmark
    (AsyMo Eq. 2 of its ``(M, K, 1)`` shape) is ``memory_reuse(...)``.
    """
    m, k = memory_matrix_shape(nbytes, llc_bytes)
    a = np.empty((m, k), np.float32)
    # Touch every page from the threads' own cores would be nicer for NUMA; rows are split
    # evenly below and the fill here is one pass, before timing starts.
    a[:] = 1.0 / k
    x = np.ones(k, np.float32)
    y = np.zeros(m, np.float32)
    ncpu = len(cpus)
    bounds = [(m * i // ncpu, m * (i + 1) // ncpu) for i in range(ncpu)]

    def body(i, deadline):
        lo, hi = bounds[i]
        done = 0.0
        per_pass = 4.0 * (hi - lo) * k
        while True:
            _mv_kernel(a, x, y, lo, hi, 1)
            done += per_pass
            if time.perf_counter() >= deadline:
                return done

    work, elapsed, reading = _run_pinned(cpus, body, duration_s, meter)
    return BenchResult("memory", tuple(cpus), work, "byte", elapsed, reading)


def memory_reuse(nbytes=None, llc_bytes=None):
    """AsyMo Eq. 2 reuse of the memory benchmark's ``(M, K) @ (K, 1)``."""
    m, k = memory_matrix_shape(nbytes, llc_bytes)
    return 2.0 * m * k / (m * k + k + 2.0 * m)


def warm_up():
    """Compile both kernels (Numba) before anything is timed."""
    x = np.ones(8, np.float32)
    out = np.zeros(8, np.float32)
    _compute_kernel(x, out, 1)
    a = np.ones((2, 8), np.float32)
    _mv_kernel(a, x, np.zeros(2, np.float32), 0, 2, 1)
