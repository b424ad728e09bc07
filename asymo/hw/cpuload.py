"""Current per-cluster CPU load: the "current processor usage" AsyMo uses to adjust the
processor-level split at plan time (paper 003, section 4.2).

Two measures, both over a window between two samples:

``"proc_stat"`` (the paper's "processor usage")
    the share of each cpu's time spent busy (user, nice, system, irq, softirq, steal, from
    ``/proc/stat``) by *other* processes: asymo's own threads are subtracted using
    ``/proc/self/task/*/stat`` (utime + stime on the cpu each thread last ran on; pool
    workers are pinned, so that is exact for them).
``"wait"`` (what the load costs asymo)
    the share of time asymo's runnable pinned threads (pool workers) on each cpu spent
    waiting for it instead of running (``/proc/self/task/*/schedstat``: run and run-queue
    wait, nanoseconds). Other
    processes' utilisation overstates the contention whenever they only fill time asymo left
    idle, and a real-time job (the asymmetry emulator's occupier) pushes other processes onto
    the other cores; the wait share is the slowdown asymo's workers actually see. It is only
    known while they run (a cpu without enough of asymo's run time in the window reports
    None and keeps its previous value).

``LoadMonitor(source="auto")`` uses "wait" where the kernel provides schedstat, else
"proc_stat". A cluster's load is the mean over its cpus.

The split is then ``capability[c] * (1 - load[c]) / (1 - baseline[c])``, normalised, where
``baseline`` is the load present while the capability was measured (calibration records it,
with the same measure): a core shared with a steady background job was already measured
slower, and is not penalised twice.

Everything parses text, so the arithmetic is testable with fake ``/proc`` trees
(``proc_root=``).
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["CpuTimes", "parse_proc_stat", "parse_task_stat", "parse_schedstat", "pinned_cpu",
           "external_loads", "wait_loads", "cluster_loads", "adjust_split", "LoadMonitor",
           "LOAD_ENV_VAR", "SOURCES"]

SOURCES = ("auto", "wait", "proc_stat")
#: a cpu's wait share is measured only when asymo's threads ran or waited there this long
#: (nanoseconds) in the window
MIN_WAIT_WINDOW_NS = 2_000_000

#: set to "0" to disable the load adjustment of calibrated splits
LOAD_ENV_VAR = "ASYMO_LOAD_ADJUST"


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative clock ticks of one cpu: busy and total (busy + idle + iowait)."""

    busy: int
    total: int


def parse_proc_stat(text):
    """Per-cpu times from the text of ``/proc/stat``.

    Returns
    -------
    dict of int -> CpuTimes
        Only ``cpuN`` lines (the aggregate ``cpu`` line is skipped). Columns are user, nice,
        system, idle, iowait, irq, softirq, steal (guest time is already inside user);
        missing trailing columns (old kernels) count as 0.

    Raises
    ------
    ValueError
        When no ``cpuN`` line can be read.
    """
    out = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        parts = line.split()
        name = parts[0]
        if not name[3:].isdigit():
            continue
        try:
            vals = [int(v) for v in parts[1:9]]
        except ValueError:
            raise ValueError(f"/proc/stat: malformed line {line!r}") from None
        if len(vals) < 4:
            raise ValueError(f"/proc/stat: line {line!r} has {len(vals)} columns, expected >= 4")
        vals += [0] * (8 - len(vals))
        user, nice, system, idle, iowait, irq, softirq, steal = vals
        busy = user + nice + system + irq + softirq + steal
        out[int(name[3:])] = CpuTimes(busy=busy, total=busy + idle + iowait)
    if not out:
        raise ValueError("/proc/stat: no per-cpu lines")
    return out


def parse_task_stat(text):
    """``(cpu, utime + stime)`` of a thread from ``/proc/<pid>/task/<tid>/stat`` text.

    The command name may contain spaces and parentheses: fields are counted after the last
    ')'. ``cpu`` is field 39 (the cpu the thread last ran on).
    """
    head, sep, tail = text.rpartition(")")
    if not sep:
        raise ValueError(f"task stat: no command name in {text[:60]!r}")
    fields = tail.split()
    # tail starts at field 3 (state): field n is fields[n - 3]
    try:
        utime, stime, cpu = int(fields[11]), int(fields[12]), int(fields[36])
    except (IndexError, ValueError):
        raise ValueError(f"task stat: malformed {text[:80]!r}") from None
    return cpu, utime + stime


def parse_schedstat(text):
    """``(run_ns, wait_ns)`` from ``/proc/<pid>/task/<tid>/schedstat`` text (time on the cpu,
    time runnable but waiting on a run queue; the third field, timeslices, is ignored)."""
    parts = text.split()
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"schedstat: malformed {text[:60]!r}") from None


def pinned_cpu(status_text):
    """The cpu a thread is pinned to, from its ``/proc/.../status`` text, or None when its
    ``Cpus_allowed_list`` is not a single cpu."""
    for line in status_text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else None
    return None


def _own_threads(proc_root):
    """``{tid: (cpu, run_ns, wait_ns)}`` of this process's threads pinned to one cpu (pool
    workers): an unpinned thread (the caller waiting for its job) queues behind our own
    workers, which is not load."""
    task_dir = os.path.join(proc_root, "self", "task")
    out = {}
    for tid in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, tid, "status")) as f:
                cpu = pinned_cpu(f.read())
            if cpu is None:
                continue
            with open(os.path.join(task_dir, tid, "schedstat")) as f:
                run, wait = parse_schedstat(f.read())
        except FileNotFoundError:  # the thread exited meanwhile
            continue
        out[tid] = (cpu, run, wait)
    return out


def wait_loads(before, after, min_ns=MIN_WAIT_WINDOW_NS):
    """Per-cpu share of time this process's runnable threads waited for the cpu.

    ``before`` / ``after``: `_own_threads` samples. A thread's run and wait in the window
    count for the cpu it is on at the end (pinned workers do not move). Cpus where the
    threads ran and waited less than ``min_ns`` in all are None (not measured).
    """
    run, wait = {}, {}
    for tid, (cpu, r1, w1) in after.items():
        r0, w0 = before.get(tid, (cpu, 0, 0))[1:]
        run[cpu] = run.get(cpu, 0) + max(0, r1 - r0)
        wait[cpu] = wait.get(cpu, 0) + max(0, w1 - w0)
    return {cpu: (wait[cpu] / (run[cpu] + wait[cpu])
                  if run[cpu] + wait[cpu] >= min_ns else None) for cpu in run}


def _own_ticks(proc_root):
    """Busy ticks of this process's threads per cpu (where each last ran)."""
    task_dir = os.path.join(proc_root, "self", "task")
    out = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "stat")) as f:
                cpu, ticks = parse_task_stat(f.read())
        except (OSError, ValueError):  # the thread exited meanwhile
            continue
        out[cpu] = out.get(cpu, 0) + ticks
    return out


def external_loads(before, after, own_before=None, own_after=None):
    """Per-cpu load by other processes between two samples, each in [0, 1].

    ``before`` / ``after``: `parse_proc_stat` results; ``own_*``: this process's busy ticks
    per cpu (subtracted). A cpu whose counters did not advance is reported as None.
    """
    out = {}
    own_before, own_after = own_before or {}, own_after or {}
    for cpu, a in after.items():
        b = before.get(cpu)
        if b is None:
            continue
        dt = a.total - b.total
        if dt <= 0:
            out[cpu] = None
            continue
        busy = a.busy - b.busy
        mine = max(0, own_after.get(cpu, 0) - own_before.get(cpu, 0))
        out[cpu] = min(1.0, max(0.0, (busy - mine) / dt))
    return out


def cluster_loads(topology, loads):
    """Mean load of each cluster's cpus (None when none of its cpus was measured)."""
    out = []
    for cl in topology.clusters:
        vals = [loads[c] for c in cl.cpus if loads.get(c) is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return tuple(out)


def adjust_split(capability, loads=None, baseline=None, *, floor=0.1, deadband=0.1,
                 max_factor=4.0):
    """Split ratio from measured capabilities adjusted by current loads.

    Parameters
    ----------
    capability : sequence of float
        Measured throughput of each cluster (any unit), fastest cluster first.
    loads : sequence of float or None, optional
        Current load of each cluster in [0, 1] (None entries: unknown, no adjustment).
    baseline : sequence of float or None, optional
        Load present while ``capability`` was measured: a cluster measured while half busy
        is twice as capable once it is free, and is not penalised again while that load
        persists.
    floor : float
        Free share assumed for a fully loaded cluster (it still gets a sliver of work, which
        stealing can rebalance).
    deadband : float
        Load changes smaller than this are ignored (load readings are coarse: clock ticks).
    max_factor : float
        A cluster's capability is scaled by at most this factor, or its inverse.

    Returns
    -------
    tuple of float
        Non-negative weights summing to 1.
    """
    cap = [float(c) for c in capability]
    if not cap or any(not (c >= 0) for c in cap) or sum(cap) <= 0:
        raise ValueError(f"capability {cap} must be non-negative with a positive entry")
    n = len(cap)
    loads = [None] * n if loads is None else list(loads)
    baseline = [None] * n if baseline is None else list(baseline)
    if len(loads) != n or len(baseline) != n:
        raise ValueError(f"{n} capabilities but {len(loads)} loads and {len(baseline)} "
                         f"baselines")
    w = []
    for c, now, base in zip(cap, loads, baseline):
        if now is None:
            w.append(c)
            continue
        now = min(1.0, max(0.0, float(now)))
        base = min(1.0, max(0.0, float(base or 0.0)))
        if abs(now - base) < deadband:
            w.append(c)
            continue
        factor = max(floor, 1.0 - now) / max(floor, 1.0 - base)
        w.append(c * min(max_factor, max(1.0 / max_factor, factor)))
    total = sum(w)
    return tuple(x / total for x in w)


class LoadMonitor:
    """Samples ``/proc`` and reports per-cpu load over the last window.

    Parameters
    ----------
    proc_root : str
        Root of the proc file system (a fake tree in tests).
    source : {"auto", "wait", "proc_stat"}
        The measure (module docstring); "auto": "wait" when ``/proc/self/task/*/schedstat``
        is readable, else "proc_stat".
    min_interval : float
        Windows shorter than this (seconds) are not measured: `loads` returns the previous
        window's result instead, so frequent planning costs one clock read.
    subtract_self : bool
        Subtract this process's own threads (see the module docstring).
    smoothing : float
        Time constant (seconds) of an exponential average over windows; 0 reports the last
        window alone. Load on a shared machine comes in bursts shorter than a plan's life.
    clock : callable
        Monotonic clock (for tests).
    """

    def __init__(self, proc_root="/proc", *, source="auto", min_interval=0.1,
                 subtract_self=True, smoothing=0.0, clock=time.monotonic):
        if source not in SOURCES:
            raise ValueError(f"source={source!r}; expected one of {list(SOURCES)}")
        self.proc_root = os.fspath(proc_root)
        if source == "auto":
            source = "wait" if _schedstat_readable(self.proc_root) else "proc_stat"
        self.source = source
        self.min_interval = float(min_interval)
        self.smoothing = float(smoothing)
        self.subtract_self = subtract_self
        self._clock = clock
        self._lock = threading.Lock()
        self._last = None      # (time, stat, own)
        self._loads = None
        #: number of windows measured so far (changes when `loads` has news)
        self.epoch = 0

    def _sample(self):
        if self.source == "wait":
            return self._clock(), _own_threads(self.proc_root), None
        with open(os.path.join(self.proc_root, "stat")) as f:
            stat = parse_proc_stat(f.read())
        own = _own_ticks(self.proc_root) if self.subtract_self else {}
        return self._clock(), stat, own

    def _window(self, first, second):
        if self.source == "wait":
            return wait_loads(first[1], second[1])
        return external_loads(first[1], second[1], first[2], second[2])

    def loads(self):
        """Per-cpu external load over the latest window of at least ``min_interval``
        (dict cpu -> float or None), or None before the first window completes or when
        ``/proc/stat`` cannot be read."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self.min_interval:
                return self._loads
            try:
                sample = self._sample()
            except (OSError, ValueError):
                return self._loads
            if self._last is not None:
                window = self._window(self._last, sample)
                self._loads = self._smooth(window, sample[0] - self._last[0])
                self.epoch += 1
            self._last = sample
            return self._loads

    def next_window_at(self):
        """The time (on this monitor's clock) from which `loads` measures a new window (until
        then it returns the same result); None before the first sample."""
        last = self._last
        return None if last is None else last[0] + self.min_interval

    def _smooth(self, window, dt):
        """Exponential average; a cpu not measured in this window keeps its last value."""
        old = self._loads or {}
        alpha = 1.0 - math.exp(-dt / self.smoothing) if self.smoothing > 0 else 1.0
        out = dict(old)
        for cpu, v in window.items():
            prev = old.get(cpu)
            if v is None:
                out.setdefault(cpu, None)
            elif prev is None:
                out[cpu] = v
            else:
                out[cpu] = prev + alpha * (v - prev)
        return out

    def measure(self, seconds):
        """Load over the next ``seconds`` (blocks; for calibration and tools)."""
        with self._lock:
            first = self._sample()
        time.sleep(seconds)
        with self._lock:
            second = self._sample()
            self._loads = self._window(first, second)
            self._last = second
            return self._loads


def _schedstat_readable(proc_root):
    try:
        with open(os.path.join(proc_root, "self", "schedstat")) as f:
            parse_schedstat(f.read())
        return True
    except (OSError, ValueError):
        return False
