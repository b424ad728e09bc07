"""The emulator's helper process: ``python -m asymo.lab.occupier --cpu N --busy F ...``.

Started by :mod:`asymo.lab.emulate`, never by users. It runs ``asymo_occupy_core`` (C) in its main
thread: pin to the cpu, switch to SCHED_FIFO, arm PR_SET_PDEATHSIG, report one status line on
``--ready-fd``, then spin/sleep until the time limit or until its parent is gone.

Exit status: 0 time limit reached, 3 parent gone, 2 set-up failed (the status line says why).
"""
from __future__ import annotations

import argparse
import errno
import fcntl
import os
import signal
import sys

EXIT_TIME_LIMIT = 0
EXIT_SETUP_FAILED = 2
EXIT_PARENT_GONE = 3


def main(argv=None):
    # Only the parent stops a helper (or the kernel, when the parent dies): a Ctrl-C meant for
    # the workload must not end the emulation under it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    p = argparse.ArgumentParser(prog="python -m asymo.lab.occupier")
    p.add_argument("--cpu", type=int, required=True)
    p.add_argument("--busy", type=float, required=True)
    p.add_argument("--period-ns", type=int, required=True)
    p.add_argument("--time-limit", type=float, required=True)
    p.add_argument("--mode", choices=("fifo", "approximate"), required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--ready-fd", type=int, default=-1)
    args = p.parse_args(argv)

    # Bad parameters are reported as such even when the core is busy (the C loop checks the
    # same bounds again).
    if not (0 <= args.cpu and 0.0 <= args.busy < 1.0 and 10_000 <= args.period_ns <= 10**9
            and 0.0 < args.time_limit < 1e9):
        _report(args.ready_fd, f"error params {errno.EINVAL}\n")
        return EXIT_SETUP_FAILED

    # Two helpers on one core would add up (and two emulations would each measure garbage):
    # the helper holds an exclusive lock on a per-cpu file for as long as it lives, so the
    # kernel releases it whatever way the helper dies.
    lock = _lock_cpu(args.cpu)
    if lock is False:
        _report(args.ready_fd, f"error cpu_busy {errno.EBUSY}\n")
        return EXIT_SETUP_FAILED

    from asymo.lab._occupy import ffi, lib  # compiled from csrc/lab/emulate.c

    params = ffi.new("asymo_occupy_params *", {
        "cpu": args.cpu,
        "busy_fraction": args.busy,
        "period_ns": args.period_ns,
        "time_limit_s": args.time_limit,
        "mode": lib.ASYMO_OCCUPY_FIFO if args.mode == "fifo" else lib.ASYMO_OCCUPY_APPROXIMATE,
        "parent_pid": args.parent_pid,
        "ready_fd": args.ready_fd,
    })
    stats = ffi.new("asymo_occupy_stats *")
    rc = lib.asymo_occupy_core(params, stats)
    if rc != 0:
        return EXIT_SETUP_FAILED
    if stats.stop_reason == lib.ASYMO_OCCUPY_PARENT_GONE:
        return EXIT_PARENT_GONE
    return EXIT_TIME_LIMIT


def lock_path(cpu):
    return os.path.join("/tmp", f"asymo-emulate-cpu{cpu}.lock")


def _lock_cpu(cpu):
    """An fd holding the cpu's lock, False if another helper holds it, None if no lock file
    can be opened here (then emulations are not checked for overlap across processes)."""
    path = lock_path(cpu)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            os.fchmod(fd, 0o666)  # let other users' emulations take the same lock
        except OSError:
            pass
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    except OSError:
        os.close(fd)
        return None
    return fd


def _report(fd, line):
    if fd >= 0:
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
