"""Reading the JSON files asymo keeps (profiles, calibrations): only regular files
(`asymo.hw.files`), of bounded size and nesting, never blocking."""
from __future__ import annotations

import json

from asymo.hw.files import NotRegularFileError, read_regular_file as _read_regular

__all__ = ["read_regular_file", "read_json_file", "loads_bounded", "NotRegularFileError", "MAX_BYTES",
           "MAX_DEPTH"]

#: profiles and calibrations are a few hundred KB at most
MAX_BYTES = 16 << 20
#: the deepest nesting asymo writes is about 8 levels
MAX_DEPTH = 64


def read_regular_file(path, max_bytes=MAX_BYTES):
    """`asymo.hw.files.read_regular_file` with the profiles' size limit."""
    return _read_regular(path, max_bytes)


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
