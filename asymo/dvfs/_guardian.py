"""Crash guardian for cpufreq changes (run as a separate process; standard library only).

While a ``CpuFreq`` has changes outstanding, it keeps this small process alive and sends it,
as one JSON line per update on stdin, the values to put back: ``{"state": {policy path:
{file: value}}, "records": {policy path: shared record file}, "holder": [pid, start, token]}``.
An empty state means everything was restored: the guardian exits. If the parent dies while the
state is not empty -- SIGKILL, a segfault in native code, ``os._exit`` -- the guardian writes
the values back itself (``scaling_min_freq`` / ``scaling_max_freq`` ordered so min <= max holds
after each write, then the governor, then ``scaling_setspeed``), unless another live process
still uses the policy (the shared record below): that one puts the true originals back.

The parent starts it in a session of its own, so a signal to the parent's process group
(``kill -9 -PGID``, ``timeout -s KILL``, a service manager or container stop) does not reach
it; it ignores SIGINT, SIGTERM and SIGHUP. It notices the parent's death by its pipe reaching
end-of-file or by a pidfd of the parent (a forked child that inherited the pipe's write end
cannot delay it).
"""
import fcntl
import json
import os
import selectors
import signal
import stat
import sys

_MIN, _MAX = "scaling_min_freq", "scaling_max_freq"
_GOV, _SPEED = "scaling_governor", "scaling_setspeed"
_RECORD_MAX = 1 << 16  # a record is a few hundred bytes: anything longer is not ours


# -- the shared record of a policy's true original values -----------------------------------
# Several processes may change one cpufreq policy at once (an energy-mode run started, then a
# latency-mode one). Each would otherwise take what it found as "the original" -- the first
# one's settings -- and put those back at its end. Instead one record per policy, in asymo's
# run directory (asymo.hw.rundir) under an exclusive flock, holds the values from before the
# first of them wrote anything and the list of processes (holders) using the policy; a
# holder that leaves while others remain writes nothing, the last one puts the originals
# back. A holder is [pid, process start time, token]: a dead pid, or a pid reused by another
# process, no longer holds.
def proc_start(pid):
    """The start time of process ``pid`` (clock ticks since boot), or None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read(4096)
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def holder_alive(holder):
    try:
        pid, start = int(holder[0]), holder[1]
    except (TypeError, ValueError, IndexError):
        return False
    if not 0 < pid < 1 << 22:  # Linux's pid_max is at most 2**22: no such process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        now = proc_start(pid)
        if now is not None and now != start:
            return False  # the pid was reused
    return True


class _Record:
    """``with _Record(path) as r``: the record file locked (flock), ``r.data`` its content
    (a dict, or None when absent or not a record), ``r.save(dict or None)``."""

    def __init__(self, path):
        self.path = path
        self.fd = -1
        self.data = None

    def __enter__(self):
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                    raise OSError(f"{self.path} is not a plain file")
                fcntl.flock(fd, fcntl.LOCK_EX)
                # the last holder unlinks the record under the lock: if that happened while we
                # waited, ours is a stale inode; open the path again
                try:
                    now = os.stat(self.path, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    os.close(fd)
                    continue
                raw = os.pread(fd, _RECORD_MAX + 1, 0)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            self.data = _parse_record(raw)
            return self
        raise OSError(f"{self.path} keeps being replaced")

    def save(self, rec):
        """Write ``rec``; None removes the record (under the lock)."""
        if not rec:
            os.unlink(self.path)
            return
        data = json.dumps(rec).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def __exit__(self, *exc):
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def _parse_record(raw):
    if not raw or len(raw) > _RECORD_MAX:
        return None
    try:
        rec = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if (not isinstance(rec, dict) or not isinstance(rec.get("original"), dict)
            or not isinstance(rec.get("holders"), list)
            or not all(isinstance(k, str) and isinstance(v, str)
                       for k, v in rec["original"].items())):
        return None
    return rec


def _holders(rec):
    """[(holder, found)] of a parsed record, in the order they joined."""
    holders = rec.get("holders") or []
    found = rec.get("found") or []
    out = []
    for i, h in enumerate(holders):
        f = found[i] if i < len(found) and isinstance(found[i], dict) else {}
        out.append((list(h) if isinstance(h, list) else h, f))
    return out


def _prune(entries, keep=None):
    """Drop dead holders; a dead holder's found values pass to the one that joined after it
    (which found the dead one's setting in force)."""
    out = []
    for i, (h, found) in enumerate(entries):
        if h == keep or holder_alive(h):
            out.append((h, found))
        elif i + 1 < len(entries):
            nxt_h, nxt_found = entries[i + 1]
            entries[i + 1] = (nxt_h, {**nxt_found, **found})
    return out


def join_record(record, policy, snapshot, me):
    """Register ``me`` as a holder of ``policy`` and return its true original values: the
    record's, completed by ``snapshot`` (the current values) for files not in it. ``me`` also
    remembers ``snapshot`` as what it found (put back if it leaves while others stay)."""
    me = list(me)
    with _Record(record) as r:
        rec = r.data if r.data is not None and r.data.get("policy") == policy else None
        original = dict(rec["original"]) if rec else {}
        entries = _prune(_holders(rec), keep=me) if rec else []
        for k, v in snapshot.items():
            original.setdefault(k, str(v))
        if original.get(_GOV, "userspace") != "userspace":
            original.pop(_SPEED, None)  # the original governor has no setspeed to put back
        for i, (h, found) in enumerate(entries):
            if h == me:
                for k, v in snapshot.items():
                    found.setdefault(k, str(v))
                break
        else:
            entries.append((me, {k: str(v) for k, v in snapshot.items()}))
        r.save({"policy": policy, "original": original, "holders": [h for h, _ in entries],
                "found": [f for _, f in entries]})
        return original


def leave_record(record, me):
    """Remove ``me`` (and dead holders) from the record; returns ``(kind, values)``:

    ``("last", originals)``
        no other holder remains: put the true originals back;
    ``("top", found)``
        others remain, ``me`` joined after all of them: put back what ``me`` found (the
        setting of the one before it);
    ``("inner", None)``
        others joined after ``me`` and use the policy now: write nothing (the one after
        ``me`` now puts back what ``me`` found);
    ``("absent", None)``
        no record (or ``me`` is not in it): put back your own copy.
    """
    me = list(me)
    with _Record(record) as r:
        rec = r.data
        if not rec:
            r.save(None)
            return "absent", None
        entries = _holders(rec)
        idx = next((i for i, (h, _) in enumerate(entries) if h == me), None)
        if idx is None:
            return "absent", None
        mine = entries[idx][1]
        if idx + 1 < len(entries):
            nxt_h, nxt_found = entries[idx + 1]
            entries[idx + 1] = (nxt_h, {**nxt_found, **mine})
            kind = "inner"
        else:
            kind = "top"
        del entries[idx]
        entries = _prune(entries)
        if not entries:
            r.save(None)
            return "last", dict(rec["original"])
        if kind == "top" and idx < len(entries):
            kind = "inner"  # pruning moved someone above us? (cannot happen: kept for safety)
        rec["holders"] = [h for h, _ in entries]
        rec["found"] = [f for _, f in entries]
        r.save(rec)
        return kind, (dict(mine) if kind == "top" else None)


# -- the guardian process ---------------------------------------------------------------------
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


def _restore_for_dead_parent(state, records, holder):
    """Put back what the dead parent held: through the shared record when there is one (all
    or part, see `leave_record`), else its own copy of the originals."""
    todo = {}
    for path, files in state.items():
        record = records.get(path)
        if record and holder:
            try:
                kind, values = leave_record(record, holder)
            except OSError:
                kind, values = "absent", None
            if kind == "inner":
                continue  # a process that changed the policy after ours restores it
            if values is not None:
                files = values
        todo[path] = files
    return todo, restore(todo)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # Own session (the parent starts us with setsid): a kill of the parent's process group
    # does not reach us. SIGINT / SIGTERM / SIGHUP are ignored as well: only the parent's end
    # (its pipe closing, or the process itself gone) makes us act.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # The pipe alone is not enough: a child the parent forked (multiprocessing's default)
    # inherits its write end and keeps it open after the parent's death. So also watch the
    # parent itself (a pidfd; else polling getppid, which changes when we are reparented).
    # The parent passes its pid: it may be dead (and we reparented) before we get here.
    parent = int(argv[0]) if argv else os.getppid()
    pidfd = None
    gone = os.getppid() != parent
    if not gone:
        try:
            pidfd = os.pidfd_open(parent)
        except ProcessLookupError:
            gone = True
        except (AttributeError, OSError):
            pidfd = None
        if os.getppid() != parent:  # died between the check and pidfd_open (pid reuse)
            gone = True
    os.set_blocking(0, False)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, "pipe")
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, "parent")
    state, records, holder, buf = {}, {}, None, b""
    while True:
        events = [] if gone else sel.select(timeout=None if pidfd is not None else 0.5)
        if not events and os.getppid() != parent:
            gone = True
        for key, _ in events:
            if key.data == "parent":
                gone = True
                continue
            try:
                chunk = os.read(0, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                gone = True
                continue
            buf += chunk
        # complete lines (read what is left first when the parent is gone: its last message)
        while True:
            if gone:
                try:
                    chunk = os.read(0, 1 << 16)
                    if chunk:
                        buf += chunk
                        continue
                except BlockingIOError:
                    pass
            break
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            state = msg.get("state") or {}
            records = msg.get("records") or {}
            holder = msg.get("holder")
            if not state:
                return 0
        if gone:
            break
    if state:
        todo, errors = _restore_for_dead_parent(state, records, holder)
        if todo:
            print("asymo: the process that changed CPU frequencies exited without restoring "
                  "them; restored " + ", ".join(sorted(todo))
                  + (f" (errors: {errors})" if errors else ""), file=sys.stderr)
        return 1 if errors else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
