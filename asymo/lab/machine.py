"""The machine a lab run is on: thread affinity, pinned threads, the pools runners open
(innermost last in ``OPEN_POOLS``, where a measurement reads its stats), BLAS / torch thread
limits for the baselines, the load average, and which cores the emulator slowed.

The lowest module of the lab beside ``loadmon``: the simulator's calibration
(:mod:`asymo.lab.sim.calibrate`), the sampler (:mod:`asymo.lab.sampling`) and the scaling
sweeps (:mod:`asymo.lab.scaling`) all build on it."""
from __future__ import annotations

import contextlib
import os
import warnings

from asymo.hw import topology as topo

__all__ = ["parse_emulate", "process_affinity", "pinned_thread", "open_pool", "OPEN_POOLS",
           "baseline_threads", "asymo_attr", "torch_module", "thread_ids", "loadavg",
           "emulated_cpus", "fast_cpu", "trace_cpus"]


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


def thread_ids():
    """Ids of this process's threads (``/proc/self/task``)."""
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
        for tid in thread_ids():
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


def torch_module():
    """``torch`` when installed, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def asymo_attr(name):
    """``asymo.<name>`` if the part that provides it is built, else None."""
    import asymo
    try:
        return getattr(asymo, name)
    except (AttributeError, ImportError):
        return None


#: pools opened by :func:`open_pool`, innermost last (a measurement reads its stats)
OPEN_POOLS = []


@contextlib.contextmanager
def pinned_thread(cpu):
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
def open_pool(topology, policy):
    """An ``asymo.Pool`` on ``topology`` with ``policy`` for the block, listed in
    ``OPEN_POOLS`` while it is open, closed on exit."""
    Pool = asymo_attr("Pool")
    if Pool is None:
        raise RuntimeError("asymo's pool (asymo.Pool) is not available in this build")
    pool = Pool(topology=topology, policy=policy)
    OPEN_POOLS.append(pool)
    try:
        yield pool
    finally:
        OPEN_POOLS.remove(pool)
        for name in ("close", "shutdown"):
            fn = getattr(pool, name, None)
            if callable(fn):
                fn()
                break


@contextlib.contextmanager
def baseline_threads(policy, cpus):
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
            torch = torch_module()
            old = torch.get_num_threads()
            torch.set_num_threads(k)
            try:
                yield
            finally:
                torch.set_num_threads(old)


def loadavg():
    """The 1-minute load average (other users' work shows up here), or None."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return None


def emulated_cpus(topology):
    """The cores of ``topology`` the emulator slows (speed below 1), in order."""
    return [cpu for cpu, s in sorted(topology.emulated.items())
            if cpu in topology.cpus and s < 1.0]


def fast_cpu(topology):
    """The first core of ``topology`` the emulator does not slow (else its first core)."""
    fast = [c for c in topology.cpus if topology.emulated.get(c, 1.0) >= 1.0]
    return fast[0] if fast else topology.cpus[0]


def trace_cpus(topology):
    """Where each cluster's task costs are traced: on an emulated machine every cluster on
    the first un-slowed core (the cores are alike; the slowdown is modelled as the
    emulator's stops), else on each cluster's own first core."""
    if topology.emulated:
        return [fast_cpu(topology)] * topology.nclusters
    return [c.cpus[0] for c in topology.clusters]
