"""Options several subcommands share, checked the same way everywhere: output paths (checked
before a long run, not after it), plot formats, positive durations, ``--emulate SPEC`` and
JSON that strict parsers accept.

Errors are ``ValueError`` (or ``argparse.ArgumentTypeError`` for the argparse types) with a
one-line message naming the option; each subcommand adds its own ``asymo <cmd>: error:``
prefix and exit status.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys

import numpy as np

__all__ = ["check_output", "check_plot", "positive_seconds", "start_emulation",
           "stop_emulation", "emulation", "finite_json", "json_text", "random_frames"]


def check_output(path, option):
    """Fail before the run, not after it, when ``path`` cannot be written.

    Parameters
    ----------
    path : str
        The file an option will write.
    option : str
        The option's name for the message, e.g. ``"--json"``.

    Raises
    ------
    ValueError
        ``path`` exists and is not a regular file, or its directory is missing or nothing
        can be created in it (tried with a temporary file, as the writers do: ``os.access``
        says yes to root in /proc).
    """
    import tempfile

    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a directory, not a regular file; give a file "
                         "name")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise ValueError(f"{option} {path}: exists and is not a regular file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{option} {path}: directory {parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".asymo-check-", dir=parent)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write in {parent} "
                         f"({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def check_plot(path, option="--plot"):
    """:func:`check_output`, and that matplotlib is installed and can write ``path``'s format
    (matplotlib picks it from the extension, and would refuse an unknown one only at the end
    of the run).

    Raises
    ------
    ValueError
        As :func:`check_output`; no matplotlib; an extension matplotlib cannot write.
    """
    check_output(path, option)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError(f"{option} needs matplotlib (pip install matplotlib)") from None
    formats = FigureCanvasAgg(Figure()).get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        raise ValueError(f"{option} {path}: unknown image format {ext or '(no extension)'!r}; "
                         f"end the name with one of {', '.join('.' + f for f in sorted(formats))}")


def positive_seconds(text):
    """argparse type: a finite number of seconds > 0 (``inf`` and ``nan`` parse as floats but
    break the arithmetic that turns a duration into a count of calls)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return v


def start_emulation(spec, period=None):
    """Parse ``--emulate SPEC`` and start the emulator on it, before anything is measured.

    Parameters
    ----------
    spec : str or mapping of int to float or None
        ``"1:0.5,3:0.25"`` (parsed by :func:`asymo.lab.machine.parse_emulate`) or its parsed
        ``{cpu: speed}``; None or empty: no emulation.
    period : float, optional
        The emulator's period in seconds (default: its own).

    Returns
    -------
    asymo.lab.emulate.Emulation or None
        The running emulation; stop it with :func:`stop_emulation` (or use
        :func:`emulation`).

    Raises
    ------
    ValueError
        Every refusal, as one line starting ``--emulate SPEC:``: a malformed spec, a cpu
        outside the affinity mask or already slowed, a period out of range, no SCHED_FIFO, a
        helper that did not start, no emulator in this build.
    """
    if not spec:
        return None
    from asymo.lab.machine import parse_emulate

    label = spec if isinstance(spec, str) else ",".join(f"{c}:{s:g}" for c, s in spec.items())
    try:
        speeds = parse_emulate(spec) if isinstance(spec, str) else dict(spec)
        try:
            from asymo.lab.emulate import slow_cores
        except ImportError:
            raise RuntimeError("needs asymo.lab.emulate, which is not in this build") from None
        emu = slow_cores(speeds, **({} if period is None else {"period": period}))
        emu.start()
    except (ValueError, TypeError, RuntimeError) as exc:  # EmulationError is a RuntimeError
        raise ValueError(f"--emulate {label}: {exc}") from None
    return emu


def stop_emulation(emu):
    """Stop an emulation from :func:`start_emulation` (None: nothing to stop)."""
    if emu is not None:
        emu.stop()


@contextlib.contextmanager
def emulation(spec, prog, period=None):
    """Run the block under ``--emulate SPEC``; a refusal prints ``PROG: error: ...`` and exits
    with status 2.

    Parameters
    ----------
    spec, period
        As :func:`start_emulation`.
    prog : str
        The subcommand for the message, e.g. ``"asymo pipeline"``.

    Yields
    ------
    asymo.lab.emulate.Emulation or None
        Stopped on every way out of the block.
    """
    try:
        emu = start_emulation(spec, period)
    except ValueError as exc:
        # exit status 2, a refused argument, as `asymo emulate` and `asymo bench scaling`
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        yield emu
    finally:
        stop_emulation(emu)


def finite_json(obj):
    """``(obj, count)``: ``obj`` with every NaN and infinity replaced by None (JSON has no
    such numbers: ``json.dumps`` would write bare ``NaN`` tokens that strict parsers such as
    ``jq`` or ``JSON.parse`` reject), and how many were replaced.

    Dicts, lists and tuples are copied; other values are returned as they are.
    """
    count = 0

    def walk(v):
        nonlocal count
        if isinstance(v, float) and not math.isfinite(v):
            count += 1
            return None
        if isinstance(v, dict):
            return {k: walk(u) for k, u in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(u) for u in v]
        return v
    return walk(obj), count


def json_text(obj, indent=2, default=None):
    """``obj`` as JSON that strict parsers accept: :func:`finite_json`'s copy, with a
    ``json_note`` saying how many non-finite numbers were written as null (a dict's only);
    what every command's ``--json`` writes. ``default``: as ``json.dumps``'s."""
    doc, nonfinite = finite_json(obj)
    if nonfinite and isinstance(doc, dict):
        doc["json_note"] = (f"{nonfinite} non-finite number(s) (not a number, infinite) "
                            "written as null")
    return json.dumps(doc, indent=indent, allow_nan=False, default=default)


#: The most memory (bytes) a command's random inputs may take: they are made before the run.
MAX_FRAME_BYTES = 8 << 30


def random_frames(rng, counts, shape):
    """Standard-normal float32 frames of ``shape``, one array per ``(option, count)`` in
    ``counts``; a total over :data:`MAX_FRAME_BYTES` is a ValueError naming the options
    (checked before anything is allocated)."""
    per = 4 * math.prod(int(d) for d in shape)
    total = per * sum(max(0, int(n)) for _, n in counts)
    what = " and ".join(f"{opt} {n}" for opt, n in counts)
    if total > MAX_FRAME_BYTES:
        raise ValueError(f"{what} inputs of shape {tuple(shape)} would take "
                         f"{total / 2**30:.1f} GiB, more than the "
                         f"{MAX_FRAME_BYTES / 2**30:.0f} GiB allowed")
    try:
        return [rng.standard_normal((max(0, int(n)),) + tuple(shape), dtype=np.float32)
                for _, n in counts]
    except MemoryError:
        raise ValueError(f"{what} inputs of shape "
                         f"{tuple(shape)} ({total / 2**30:.3g} GiB) do not fit in "
                         "memory") from None
