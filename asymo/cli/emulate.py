"""``asymo emulate``: run a command on an emulated asymmetric CPU."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import warnings

DESCRIPTION = """\
Run COMMAND while some cores are slowed: a helper pinned to each chosen core runs at SCHED_FIFO
priority and spins for (1 - speed) of every period, so every thread there, of any library, gets
`speed` of the core. COMMAND sees the emulated machine through ASYMO_TOPOLOGY (the slowed cores
form slower clusters, capacity = speed), ASYMO_EMULATED (cpu:speed pairs) and
ASYMO_EMULATED_PERIOD (the period, seconds). The helpers stop
when COMMAND exits, on Ctrl-C, and if asymo itself is killed. Exit status: COMMAND's.

This emulates core speed only: slowed cores keep their caches and memory bandwidth.
SCHED_FIFO needs root or CAP_SYS_NICE; the kernel keeps 5% of each core for normal tasks, so
speeds below 0.05 are impossible."""

EPILOG = """\
examples:
  asymo emulate --core 1 --speed 0.5 -- asymo info
  asymo emulate --core 2 --speed 0.5 --core 3 --speed 0.75 -- python bench.py
  asymo emulate --core 2 --core 3 --speed 0.4 -- python bench.py    (one speed for all)"""


def register(sub):
    p = sub.add_parser("emulate", help="run a command on an emulated asymmetric CPU",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--core", type=int, action="append", required=True, metavar="CPU",
                   help="cpu to slow (repeat for several; pairs with --speed in order)")
    p.add_argument("--speed", type=float, action="append", required=True, metavar="S",
                   help="speed of the matching --core, in (0, 1]: the share of the core left "
                        "to COMMAND (one --speed applies to every --core)")
    p.add_argument("--period", type=float, default=None, metavar="SECONDS",
                   help="length of one spin/sleep cycle (default: 0.0005); shorter is more "
                        "even, longer loses less speed to the switches")
    p.add_argument("--time-limit", type=float, default=3600.0, metavar="SECONDS",
                   help="helpers stop by themselves after this long, whatever happens "
                        "(default: 3600); a warning says if COMMAND outlived them")
    p.add_argument("--approximate", action="store_true",
                   help="where SCHED_FIFO is refused, use normal-priority helpers at the "
                        "lowest nice value allowed: imprecise, never for published figures")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="do not print the emulation settings to stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the command to run and its arguments")
    p.set_defaults(func=run, parser=p)


def _speeds(args):
    cores, speeds = args.core, args.speed
    if len(speeds) == 1:
        speeds = speeds * len(cores)
    if len(speeds) != len(cores):
        args.parser.error(f"{len(cores)} --core but {len(args.speed)} --speed: give one "
                          "--speed per --core, or a single --speed for all")
    out = {}
    for cpu, speed in zip(cores, speeds):
        if cpu in out:
            args.parser.error(f"--core {cpu} given twice")
        out[cpu] = speed
    return out


def _terminal_sends_sigint_to_child():
    """True if a Ctrl-C reaches COMMAND directly: we are the terminal's foreground group and
    COMMAND shares our process group, so forwarding would deliver SIGINT twice."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _die_with_parent(parent):
    """preexec_fn: SIGTERM this child when `asymo emulate` dies (a SIGKILL of it stops the
    emulator helpers, so the command must not go on with an emulated ASYMO_TOPOLOGY)."""
    def setup():
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - not Linux
            return
        if os.getppid() != parent:  # it died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return setup


def _run_command(command):
    try:
        proc = subprocess.Popen(command, preexec_fn=_die_with_parent(os.getpid()))
    except FileNotFoundError:
        print(f"asymo emulate: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"asymo emulate: permission denied: {command[0]}", file=sys.stderr)
        return 126

    def forward(signum, frame):
        if signum == signal.SIGINT and _terminal_sends_sigint_to_child():
            return
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        rc = proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return rc if rc >= 0 else 128 - rc


def run(args):
    from asymo.lab import emulate

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        args.parser.error("no COMMAND given (usage: asymo emulate --core 1 --speed 0.5 -- "
                          "COMMAND ...)")
    if "/" not in command[0] and shutil.which(command[0]) is None:
        print(f"asymo emulate: command not found: {command[0]}", file=sys.stderr)
        return 127
    speeds = _speeds(args)
    mode = "approximate" if args.approximate else "fifo"
    try:
        period = emulate.DEFAULT_PERIOD if args.period is None else args.period
        emu = emulate.slow_cores(speeds, period=period, time_limit=args.time_limit,
                                 mode=mode)
    except (TypeError, ValueError) as exc:
        args.parser.error(str(exc))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            with emu:
                if not args.quiet:
                    _describe(emu)
                rc = _run_command(command)
        except emulate.EmulationError as exc:
            print(f"asymo emulate: error: {exc}", file=sys.stderr)
            return 1
        except ValueError as exc:
            print(f"asymo emulate: error: {exc}", file=sys.stderr)
            return 2
    for w in caught:
        print(f"asymo emulate: warning: {w.message}", file=sys.stderr)
    return rc


def _describe(emu):
    slowed = ", ".join(f"cpu {c} at {s:g}" for c, s in emu.slowed.items()) or "no core slowed"
    how = {"fifo": "SCHED_FIFO helpers",
           "approximate": "APPROXIMATE (SCHED_OTHER) helpers: speeds are not precise"}[emu.mode]
    print(f"asymo emulate: {slowed} ({how}, period {emu.period * 1e3:g} ms, time limit "
          f"{emu.time_limit:g} s); emulates speed, not cache size", file=sys.stderr)
    if emu.mode == "approximate":
        for cpu, status in emu.helper_status.items():
            print(f"asymo emulate: helper on cpu {cpu}: {status}", file=sys.stderr)
    for k, v in emu.env.items():
        print(f"asymo emulate: {k}={v}", file=sys.stderr)
