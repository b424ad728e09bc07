"""Crash guardian for cpufreq changes (run as a separate process; standard library only).

While a ``CpuFreq`` has changes outstanding, it keeps this small process alive and sends it,
as one JSON line per update on stdin, the values to put back: ``{"state": {policy path:
{file: value}}}``. An empty state means everything was restored: the guardian exits. If stdin
reaches end-of-file while the state is not empty, the parent died without restoring --
SIGKILL, a segfault in native code, ``os._exit`` -- and the guardian writes the values back
itself (``scaling_min_freq`` / ``scaling_max_freq`` ordered so min <= max holds after each
write, then the governor, then ``scaling_setspeed``).

It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the parent handles
those itself) and only acts on end-of-file.
"""
import json
import os
import signal
import sys

_MIN, _MAX = "scaling_min_freq", "scaling_max_freq"


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _write(path, value):
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def restore(state):
    errors = []
    for path, files in state.items():
        steps = []
        lo, hi = files.get(_MIN), files.get(_MAX)
        try:
            cur_min = int(_read(os.path.join(path, _MIN)))
        except (TypeError, ValueError):
            cur_min = None
        if hi is not None and (cur_min is None or lo is None or int(hi) >= cur_min):
            steps += [(_MAX, hi)] + ([(_MIN, lo)] if lo is not None else [])
        else:
            steps += ([(_MIN, lo)] if lo is not None else []) + \
                ([(_MAX, hi)] if hi is not None else [])
        for name in ("scaling_governor", "scaling_setspeed"):
            if name in files:
                steps.append((name, files[name]))
        for name, value in steps:
            p = os.path.join(path, name)
            if _read(p) == str(value):
                continue
            try:
                _write(p, value)
            except OSError as exc:
                errors.append(f"{p}: {exc}")
    return errors


def main():
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    state = {}
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        state = msg.get("state") or {}
        if not state:
            return 0
    if state:
        errors = restore(state)
        print("asymo: the process that changed CPU frequencies exited without restoring them; "
              "restored " + ", ".join(sorted(state)) + (f" (errors: {errors})" if errors
                                                        else ""), file=sys.stderr)
        return 1 if errors else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
