"""cffi builder for ``asymo._native``.

The C API is declared in ``csrc/*.h``; each header marks the part cffi must see between
``/* CDEF BEGIN */`` and ``/* CDEF END */`` (plain declarations, no preprocessor), so the
headers stay the single source of truth for both C and Python.

No ``-march``: the library must run on any CPU of the target architecture. ISA-specific
kernels are compiled with per-function ``target`` attributes and chosen at run time.
"""
import glob
import os
import re
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CDEF_BLOCK = re.compile(r"/\* CDEF BEGIN \*/(.*?)/\* CDEF END \*/", re.S)


def _cdef_text():
    parts = []
    headers = (glob.glob(os.path.join(HERE, "*.h"))
               + glob.glob(os.path.join(HERE, "include", "asymo", "*.h")))
    for header in sorted(headers):
        with open(header) as f:
            parts.extend(CDEF_BLOCK.findall(f.read()))
    return "\n".join(parts)


def _sources():
    found = glob.glob(os.path.join(HERE, "*.c"))
    for sub in ("conv", os.path.join("kernels", "*")):
        found += glob.glob(os.path.join(HERE, sub, "*.c"))
    return sorted(os.path.relpath(p) for p in found)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "asymo._native",
    '#include "asymo.h"\n',
    sources=_sources(),
    include_dirs=[os.path.relpath(HERE), os.path.relpath(os.path.join(HERE, "include"))],
    extra_compile_args=["-O3", "-std=gnu11", "-pthread", "-fno-strict-aliasing",
                        "-Wall", "-Wno-unused-function"],
    extra_link_args=["-pthread"],
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
    # asymo.matmul's fast path: a CPython extension beside the cffi module (optional)
    sys.path.insert(0, os.path.join(HERE, "python"))
    from build_matmul_fast import build_inplace
    build_inplace()
