"""How much CPU time other processes took while we were measuring.

On a shared machine a benchmark sample can be slowed by anyone's compile or test run, and a
multi-core sample suffers most (its slowest worker decides). ``OtherLoad`` snapshots the run
time (nanoseconds, from ``/proc/<pid>/task/<tid>/schedstat``) of every thread that is not ours
— our process and its descendants, such as the emulator's helpers, are excluded — so a
sample's *external load*, the share of the machine's cores other processes used during it, can
be recorded beside it and disturbed samples set aside.

Short-lived processes that start and exit inside one sample are missed (their run time leaves
/proc with them), so the figure is a lower bound. Where ``schedstat`` is unavailable
(non-Linux, or a kernel without it) ``available`` is False and every share reads 0.
"""
from __future__ import annotations

import os
import time

__all__ = ["OtherLoad"]


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

    def __init__(self, ncpus=None):
        self.me = os.getpid()
        self.ncpus = ncpus or os.cpu_count() or 1
        self.available = os.path.exists(f"/proc/{self.me}/task/{self.me}/schedstat")

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
        """(monotonic seconds, {pid: run time ns} of every process that is not ours)."""
        t = time.monotonic()
        if not self.available:
            return t, {}
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        ours = self._ours(pids)
        runtimes = {}
        for pid in pids:
            if pid in ours:
                continue
            try:
                runtimes[pid] = _runtime_ns(pid)
            except OSError:
                continue
        return t, runtimes

    def share_since(self, snap):
        """Share of the machine's cores used by other processes since ``snap`` (0..1)."""
        t0, before = snap
        t1, after = self.snapshot()
        if not self.available or t1 <= t0:
            return 0.0
        used = sum(max(0, ns - before.get(pid, ns)) for pid, ns in after.items())
        # processes born after the first snapshot: all of their run time is inside the window
        used += sum(ns for pid, ns in after.items() if pid not in before)
        return min(1.0, used * 1e-9 / ((t1 - t0) * self.ncpus))
