"""Machine state for the scaling benchmark's runs: thread affinity, pinned threads, the pools
the runners open (innermost last in ``_OPEN_POOLS``, where the measurement reads its stats)
and BLAS / torch thread limits for the baselines."""
from __future__ import annotations

import contextlib
import os
import warnings

from asymo.hw import topology as topo


def parse_emulate(text):
    """Parse ``"1:0.5"`` or ``"1:0.5,3:0.25"`` into ``{cpu: speed}``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("emulation spec is empty; expected CPU:SPEED, e.g. '1:0.5'")
    out = {}
    for item in text.split(","):
        cpu_text, sep, speed_text = item.strip().partition(":")
        try:
            cpu, speed = int(cpu_text), float(speed_text)
        except ValueError:
            raise ValueError(f"bad emulation item {item.strip()!r}; expected CPU:SPEED, "
                             "e.g. '1:0.5'") from None
        if not sep or cpu < 0 or not (0.0 < speed <= 1.0):
            raise ValueError(f"bad emulation item {item.strip()!r}: cpu must be >= 0 and "
                             "speed in (0, 1]")
        if cpu in out:
            raise ValueError(f"cpu {cpu} appears twice in emulation spec {text!r}")
        out[cpu] = speed
    return out


def _thread_ids():
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # pragma: no cover - non-Linux
        return [0]


@contextlib.contextmanager
def process_affinity(cpus):
    """Restrict every thread of this process to ``cpus`` for the block; restore each on exit.

    ``os.sched_setaffinity(0, ...)`` moves only the calling thread; BLAS and OpenMP pools
    started earlier keep their masks, so each thread in ``/proc/self/task`` is moved. Threads
    created inside the block inherit the restricted mask from their creator.
    """
    cpus = set(int(c) for c in cpus)
    saved = {}
    try:
        for tid in _thread_ids():
            try:
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, PermissionError):
                continue  # thread exited, or not ours to move
        yield
    finally:
        for tid, mask in saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _asymo_attr(name):
    """``asymo.<name>`` if the part that provides it is built, else None."""
    import asymo
    try:
        return getattr(asymo, name)
    except (AttributeError, ImportError):
        return None


_OPEN_POOLS = []   # pools opened by runners, innermost last (the measurement reads its stats)


@contextlib.contextmanager
def _pinned_thread(cpu):
    """Pin the calling thread to ``cpu`` for the block (None: leave it alone)."""
    if cpu is None:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


@contextlib.contextmanager
def _open_pool(topology, policy):
    Pool = _asymo_attr("Pool")
    if Pool is None:
        raise RuntimeError("asymo's pool (asymo.Pool) is not available in this build")
    pool = Pool(topology=topology, policy=policy)
    _OPEN_POOLS.append(pool)
    try:
        yield pool
    finally:
        _OPEN_POOLS.remove(pool)
        for name in ("close", "shutdown"):
            fn = getattr(pool, name, None)
            if callable(fn):
                fn()
                break


@contextlib.contextmanager
def _baseline_threads(policy, cpus):
    """NumPy's BLAS / torch limited to len(cpus) threads, every thread on ``cpus``."""
    from threadpoolctl import threadpool_limits
    k = len(cpus)
    with process_affinity(cpus), warnings.catch_warnings():
        # threadpoolctl asks asymo's controller for its pools, which re-reads the topology:
        # with the process narrowed to fewer cpus than an emulated topology names, that
        # would warn about cpus outside the affinity mask, which is intended here
        warnings.simplefilter("ignore", topo.TopologyWarning)
        if policy == "numpy":
            with threadpool_limits(limits=k, user_api="blas"):
                yield
        else:
            torch = _torch()
            old = torch.get_num_threads()
            torch.set_num_threads(k)
            try:
                yield
            finally:
                torch.set_num_threads(old)
