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
import stat
import sys

from asymo.hw import rundir as _rundir

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

    from asymo.lab._native import ffi, lib  # compiled from csrc/lab/emulate.c

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


def lock_paths(cpu):
    """The per-cpu lock files a helper takes, all of them.

    As root (or with env ``ASYMO_RUN_DIR``, for tests): one in asymo's run directory (root's
    ``/run/asymo``, where no other user can plant anything), and also the shared
    ``/tmp/asymo-emulate-cpuN.lock`` that unprivileged emulations (and older asymo versions)
    take, so they exclude each other too. Otherwise the shared one only. Opened without
    following symlinks (see `_lock_cpu`)."""
    shared = os.path.join("/tmp", f"asymo-emulate-cpu{int(cpu)}.lock")
    if os.geteuid() == 0 or os.environ.get(_rundir.ENV_VAR):
        try:
            return [os.path.join(_rundir.run_dir(), f"emulate-cpu{int(cpu)}.lock"), shared]
        except OSError:
            pass
    return [shared]


def lock_path(cpu):
    """The main lock file of ``cpu`` (named in error messages)."""
    return lock_paths(cpu)[0]


def _lock_cpu(cpu):
    """The fds holding the cpu's locks (see `lock_paths`), False if another helper holds one
    of them, None if no lock file can be opened here (then emulations are not checked for
    overlap across processes)."""
    fds = []
    for path in lock_paths(cpu):
        fd = _lock_file(path)
        if fd is False:
            for f in fds:
                os.close(f)
            return False
        if fd is not None:
            fds.append(fd)
    return fds or None


def _lock_file(path):
    """An fd holding an exclusive flock on ``path``, False if another process holds it,
    None if it cannot be opened safely.

    The file is never opened through a symlink (a link planted in /tmp would otherwise make a
    root process open, and before this was fixed chmod, its target), only a regular file is
    used, and only a file this call created is made world-readable-writable (so other users'
    emulations can lock it too)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o666)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | flags)  # flock needs no write
        except OSError:  # a symlink (ELOOP), no permission, ...
            return None
    except OSError:
        return None
    else:
        if path.startswith("/tmp/"):
            try:
                os.fchmod(fd, 0o666)  # our own new file: let other users' emulations lock it
            except OSError:
                pass
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
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
