"""Reading the JSON files asymo keeps (profiles, calibrations): only regular files, of bounded
size and nesting, never blocking.

A path may be a symlink the user made (it is followed), but what it leads to must be a regular
file: ``/dev/zero``, ``/dev/urandom``, a FIFO or a directory is refused before anything is read
(the file is opened with ``O_NONBLOCK``, so opening a FIFO does not wait for a writer, and
checked with ``fstat`` on the open descriptor, so it cannot be swapped in between).
"""
from __future__ import annotations

import json
import os
import stat

__all__ = ["read_regular_file", "read_json_file", "loads_bounded", "NotRegularFileError", "MAX_BYTES",
           "MAX_DEPTH"]

#: profiles and calibrations are a few hundred KB at most
MAX_BYTES = 16 << 20
#: the deepest nesting asymo writes is about 8 levels
MAX_DEPTH = 64


class NotRegularFileError(OSError):
    """The path leads to something other than a regular file (a device, a FIFO, ...)."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def read_regular_file(path, max_bytes=MAX_BYTES):
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


def _depth(obj, limit):
    """Raise ValueError when ``obj`` nests deeper than ``limit`` (no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            items = o.values()
        elif isinstance(o, list):
            items = o
        else:
            continue
        if d > limit:
            raise ValueError(f"JSON nested deeper than {limit} levels")
        stack.extend((v, d + 1) for v in items)


def loads_bounded(raw, max_depth=MAX_DEPTH):
    """``json.loads`` of bytes with the nesting bounded: every failure is a ValueError."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc})") from None
    _depth(data, max_depth)
    return data


def read_json_file(path, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH):
    """Parse the regular file ``path`` as JSON (see `read_regular_file`).

    Raises
    ------
    OSError
        Cannot be opened, or not a regular file (`NotRegularFileError`).
    ValueError
        Too large, not UTF-8, not JSON, or nested deeper than ``max_depth``.
    """
    return loads_bounded(read_regular_file(path, max_bytes), max_depth)
