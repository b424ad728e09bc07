"""Where asymo keeps the small state files that several processes share (locks, records).

Run as root, that is ``/run/asymo`` (a root-owned directory no other user can write, so a
file planted there by another user cannot exist); otherwise a private per-user directory,
``$XDG_RUNTIME_DIR/asymo`` or ``/tmp/asymo-<uid>`` (mode 0700). Env ``ASYMO_RUN_DIR`` names
another directory (tests); it must be a real directory (not a symlink) owned by this user or
root and writable by nobody else.

Standard library only: the cpufreq guardian process uses it too.
"""
from __future__ import annotations

import os
import stat

__all__ = ["run_dir", "open_private", "ENV_VAR", "UnsafeRunDirError"]

ENV_VAR = "ASYMO_RUN_DIR"


class UnsafeRunDirError(OSError):
    """The state directory exists but another user could change what is in it."""


def _check_dir(path, uid):
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRunDirError(f"{path} is not a directory (a symlink or a file)")
    if st.st_uid not in (uid, 0):
        raise UnsafeRunDirError(f"{path} belongs to uid {st.st_uid}, not to this user ({uid})")
    if st.st_mode & 0o022:
        raise UnsafeRunDirError(f"{path} is writable by other users (mode "
                                f"{stat.S_IMODE(st.st_mode):o})")
    return path


def _make(path, mode, uid):
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    return _check_dir(path, uid)


def run_dir(sub=None, *, environ=None):
    """The state directory (created if needed), or its subdirectory ``sub``.

    Raises
    ------
    UnsafeRunDirError
        The directory exists but is a symlink, belongs to another user or is writable by
        others: nothing is created or opened in it.
    OSError
        It cannot be created.
    """
    env = os.environ if environ is None else environ
    uid = os.geteuid()
    override = env.get(ENV_VAR)
    if override:
        base = _check_dir(os.path.abspath(override), uid)
    elif uid == 0:
        base = _make("/run/asymo", 0o755, 0)
    else:
        xdg = env.get("XDG_RUNTIME_DIR")
        base = None
        if xdg and os.path.isabs(xdg):
            try:
                _check_dir(xdg, uid)
                base = _make(os.path.join(xdg, "asymo"), 0o700, uid)
            except OSError:
                base = None
        if base is None:
            base = _make(os.path.join("/tmp", f"asymo-{uid}"), 0o700, uid)
    if sub is None:
        return base
    return _make(os.path.join(base, sub), 0o755 if uid == 0 else 0o700, uid)


def open_private(path, flags=os.O_RDWR):
    """Open (creating it if absent) a state file: never through a symlink, only a regular
    file with one link. Returns the fd (close-on-exec)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise UnsafeRunDirError(f"{path} is not a plain file")
    except BaseException:
        os.close(fd)
        raise
    return fd
