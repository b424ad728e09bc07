"""Environment variables read on hot paths.

``os.environ.get`` encodes the name and decodes the value on every call (about 0.5 us each).
Per-call code (the default pool's key, plan-cache keys) reads instead from the encoded mapping
``os.environ`` keeps in sync (``os.environ._data``, POSIX), which costs a dict lookup.
"""
from __future__ import annotations

import os

#: the encoded mapping behind os.environ, or None where there is none to read (non-POSIX)
DATA = getattr(os.environ, "_data", None)
if not (isinstance(DATA, dict) and os.name == "posix"):  # pragma: no cover
    DATA = None
