"""The emulator's helper process: ``python -m asymo._occupier --cpu N --busy F ...``.

Started by :mod:`asymo.emulate`, never by users. It runs ``asymo_occupy_core`` (C) in its main
thread: pin to the cpu, switch to SCHED_FIFO, arm PR_SET_PDEATHSIG, report one status line on
``--ready-fd``, then spin/sleep until the time limit or until its parent is gone.

Exit status: 0 time limit reached, 3 parent gone, 2 set-up failed (the status line says why).
"""
from __future__ import annotations

import argparse
import signal
import sys

EXIT_TIME_LIMIT = 0
EXIT_SETUP_FAILED = 2
EXIT_PARENT_GONE = 3


def main(argv=None):
    # Only the parent stops a helper (or the kernel, when the parent dies): a Ctrl-C meant for
    # the workload must not end the emulation under it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    p = argparse.ArgumentParser(prog="python -m asymo._occupier")
    p.add_argument("--cpu", type=int, required=True)
    p.add_argument("--busy", type=float, required=True)
    p.add_argument("--period-ns", type=int, required=True)
    p.add_argument("--time-limit", type=float, required=True)
    p.add_argument("--mode", choices=("fifo", "approximate"), required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--ready-fd", type=int, default=-1)
    args = p.parse_args(argv)

    from asymo._ffi import ffi, lib

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


if __name__ == "__main__":
    sys.exit(main())
