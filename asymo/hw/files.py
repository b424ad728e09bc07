"""Reading files asymo does not write (sysfs attributes, power traces, profiles): only
regular files, of bounded size, never blocking.

A path may be a symlink (it is followed: sysfs is made of them), but what it leads to must be
a regular file: ``/dev/zero``, ``/dev/urandom``, a FIFO or a directory is refused before
anything is read (the file is opened with ``O_NONBLOCK``, so opening a FIFO does not wait for
a writer, and checked with ``fstat`` on the open descriptor, so it cannot be swapped in
between).
"""
from __future__ import annotations

import os
import stat

__all__ = ["read_regular_file", "NotRegularFileError"]


class NotRegularFileError(OSError):
    """The path leads to something other than a regular file (a device, a FIFO, ...)."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def read_regular_file(path, max_bytes):
    """The bytes of the regular file ``path`` (symlinks followed).

    Raises
    ------
    FileNotFoundError, PermissionError, OSError
        As ``open`` does.
    NotRegularFileError
        ``path`` is a device, FIFO, socket or directory (nothing is read).
    ValueError
        The file is larger than ``max_bytes``.
    """
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise NotRegularFileError(f"{path} is {kind}, not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{path} is {st.st_size} bytes, more than the {max_bytes} "
                             "allowed")
        chunks, total = [], 0
        while True:  # st_size may be stale (a growing file): read to the limit at most
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise ValueError(f"{path} is more than the {max_bytes} bytes allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)
