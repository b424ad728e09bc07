"""How much CPU time other processes took while we were measuring.

On a shared machine a benchmark sample can be slowed by anyone's compile or test run, and a
multi-core sample suffers most (its slowest worker decides). ``OtherLoad`` snapshots the run
time (nanoseconds, from ``/proc/<pid>/task/<tid>/schedstat``) of every thread that is not ours
— our process and its descendants, such as the emulator's helpers, are excluded — so a
sample's *external load*, the share of the machine's cores other processes used during it, can
be recorded beside it and disturbed samples set aside.

Short-lived processes that start and exit inside one sample leave /proc with their run time,
and on a shared machine they are most of the disturbance (a colleague's ``git``, ``grep`` or
a short test). Where the kernel exposes the machine's total task run time in nanoseconds
(cgroup v1 ``cpuacct.usage`` of the root cgroup, which every task is charged to), the share
is also taken as that total less our own process's CPU time (``time.process_time_ns``, which
keeps the time of threads that have exited), our live descendants' run time and that of our
children that have exited and been reaped (``getrusage(RUSAGE_CHILDREN)``: a child that
leaves /proc takes its run time out of the live descendants' sum, and without it would read
as someone else's), so short-lived processes count too (``precise`` is True); the larger of
the two figures is used. Not seen as ours: threads that exited in a descendant, and
grandchildren reaped by a live child (their time stays in that child's own children's
total); both read as other load. Without the machine's total the per-process figure is a
lower bound. Where ``schedstat`` is unavailable (non-Linux, or
a kernel without it) ``available`` is False and every share reads 0.
"""
from __future__ import annotations

import os
import time

try:
    import resource
except ImportError:     # pragma: no cover - not on POSIX
    resource = None

__all__ = ["OtherLoad", "CPUACCT_USAGE_PATHS"]

#: where cgroup v1 mounts the root cpuacct controller's total run time of all tasks (ns)
CPUACCT_USAGE_PATHS = ("/sys/fs/cgroup/cpuacct/cpuacct.usage",
                       "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage",
                       "/sys/fs/cgroup/cpuacct,cpu/cpuacct.usage")


def _read_ns(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _reaped_children_ns():
    """Run time of our children that have exited and been waited for (with the children they
    waited for), in nanoseconds."""
    if resource is None:    # pragma: no cover - not on POSIX
        return 0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round((ru.ru_utime + ru.ru_stime) * 1e9)


def _ppid(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    return int(data[data.rindex(b")") + 2:].split()[1])


def _runtime_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


class OtherLoad:
    """Run time of other processes between two snapshots.

    >>> mon = OtherLoad()
    >>> snap = mon.snapshot()
    >>> ...                                    # doctest: +SKIP
    >>> share = mon.share_since(snap)          # 0.0 .. 1.0 of the machine's cores
    """

    def __init__(self, ncpus=None, *, cpuacct_paths=CPUACCT_USAGE_PATHS):
        self.me = os.getpid()
        self.ncpus = ncpus or os.cpu_count() or 1
        self.available = os.path.exists(f"/proc/{self.me}/task/{self.me}/schedstat")
        self.cpuacct = next((p for p in cpuacct_paths if _read_ns(p) is not None), None)
        self.precise = self.available and self.cpuacct is not None

    def _ours(self, pids):
        parent = {}
        for pid in pids:
            try:
                parent[pid] = _ppid(pid)
            except (OSError, ValueError, IndexError):
                continue
        ours = {self.me}
        changed = True
        while changed:
            changed = False
            for pid, pp in parent.items():
                if pp in ours and pid not in ours:
                    ours.add(pid)
                    changed = True
        return ours

    def snapshot(self):
        """(monotonic seconds, {pid: run time ns} of every process that is not ours, the
        machine's total task run time ns or None, our own run time ns)."""
        t = time.monotonic()
        if not self.available:
            return t, {}, None, 0
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        ours = self._ours(pids)
        runtimes, own = {}, 0
        for pid in pids:
            if pid == self.me:
                continue
            try:
                ns = _runtime_ns(pid)
            except OSError:
                continue
            if pid in ours:
                own += ns
            else:
                runtimes[pid] = ns
        total = None
        if self.cpuacct is not None:
            # read last and next to our own clock so the two totals cover the same instant
            own += time.process_time_ns() + _reaped_children_ns()
            total = _read_ns(self.cpuacct)
        return t, runtimes, total, own

    def share_since(self, snap):
        """Share of the machine's cores used by other processes since ``snap`` (0..1)."""
        t0, before, total0, own0 = snap
        t1, after, total1, own1 = self.snapshot()
        if not self.available or t1 <= t0:
            return 0.0
        used = sum(max(0, ns - before.get(pid, ns)) for pid, ns in after.items())
        # processes born after the first snapshot: all of their run time is inside the window
        used += sum(ns for pid, ns in after.items() if pid not in before)
        if total0 is not None and total1 is not None:
            # everyone's run time less ours: counts processes that came and went meanwhile
            used = max(used, (total1 - total0) - (own1 - own0))
        return min(1.0, max(0, used) * 1e-9 / ((t1 - t0) * self.ncpus))
