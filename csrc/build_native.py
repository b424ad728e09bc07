"""cffi builders for ``asymo._native`` (the runtime) and ``asymo.lab._native`` (the emulator and
the cross-core transfer probe).

The C API is declared in headers; each header marks the part cffi must see between
``/* CDEF BEGIN */`` and ``/* CDEF END */`` (plain declarations, no preprocessor), so the
headers stay the single source of truth for both C and Python.

Tree (see csrc/include/asymo/asymo.h for the public API)::

    include/asymo/  public headers          pool/    the thread pool
    gemm/           GEMM frame              conv/    convolution, depthwise, pooling frames
    config/         kernel tables, quirks   kernels/ micro-kernels, one directory per ISA
    lab/            emulator, probes, tracing  python/  asymo._matmul_fast (a CPython extension)

``asymo._native`` is every C file outside lab/ and python/, plus lab/trace.c: tracing takes
over a live pool's jobs and acts as one of its workers, so it needs the pool's internals and
the pool object Python holds, which only the same module can give it. Its declarations stay in
lab/trace.h, which the public header does not include. ``asymo.lab._native`` holds the emulator
(lab/emulate.c), which a helper process runs, and the cross-core transfer probe the benchmarks
take beside their figures (lab/crosscore.c): they share no state with the runtime, and as a
module of the lab package it is never loaded by ``import asymo`` (tests/test_layout.py checks
that no ``asymo.lab`` module is).

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

# Runtime headers in dependency order (cffi needs a type declared before it is used).
NATIVE_HEADERS = ["include/asymo/isa.h", "include/asymo/pool.h", "include/asymo/gemm.h",
                  "include/asymo/conv.h", "include/asymo/winograd.h",
                  "include/asymo/pooling.h", "lab/trace.h"]
NATIVE_DIRS = ["pool", "gemm", "conv", "config", "kernels"]
NATIVE_EXTRA = ["lab/trace.c"]
LAB_HEADERS = ["lab/emulate.h", "lab/crosscore.h"]
LAB_SOURCES = ["lab/emulate.c", "lab/crosscore.c"]

COMPILE_ARGS = ["-O3", "-std=gnu11", "-pthread", "-fno-strict-aliasing", "-Wall",
                "-Wno-unused-function"]


def _rel(path):
    return os.path.relpath(os.path.join(HERE, path))


def _cdef_text(headers):
    parts = []
    for header in headers:
        with open(os.path.join(HERE, header)) as f:
            parts.extend(CDEF_BLOCK.findall(f.read()))
    return "\n".join(parts)


def native_sources():
    """The C files of ``asymo._native``, relative to the working directory."""
    found = []
    for d in NATIVE_DIRS:
        found += glob.glob(os.path.join(HERE, d, "**", "*.c"), recursive=True)
    found += [os.path.join(HERE, p) for p in NATIVE_EXTRA]
    return sorted(os.path.relpath(p) for p in found)


def dependencies():
    """Every C source and header of both modules (what a rebuild depends on)."""
    return sorted(glob.glob(os.path.join(HERE, "**", "*.[ch]"), recursive=True))


def _builder(name, headers, sources, prelude):
    ffi = FFI()
    ffi.cdef(_cdef_text(headers))
    ffi.set_source(
        name,
        prelude,
        sources=sources,
        include_dirs=[_rel("include"), _rel(".")],
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=["-pthread"],
        libraries=["m"],
    )
    return ffi


ffibuilder = _builder("asymo._native", NATIVE_HEADERS, native_sources(),
                      '#include "asymo/asymo.h"\n#include "lab/trace.h"\n')
lab_ffibuilder = _builder("asymo.lab._native", LAB_HEADERS, [_rel(p) for p in LAB_SOURCES],
                          '#include "lab/emulate.h"\n#include "lab/crosscore.h"\n')

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
    lab_ffibuilder.compile(verbose=False)
    # asymo.matmul's fast path: a CPython extension beside the cffi module (optional)
    sys.path.insert(0, os.path.join(HERE, "python"))
    from build_matmul_fast import build_inplace
    build_inplace()
