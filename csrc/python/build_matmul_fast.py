"""Build of ``asymo._matmul_fast``, asymo.matmul's C fast path (csrc/python/matmul_fast.c).

A CPython extension compiled against the NumPy headers of the build environment
(``numpy.get_include()``); ``extensions()`` gives it to setup.py (pip install) and
``build_inplace()`` builds it next to ``asymo/_native*.so`` (``make build``, via
csrc/build_native.py). It is optional: without numpy at build time, or when it does not
compile, asymo works without it (asymo.matmul takes its Python path; ``asymo info`` says why).

It is not part of the cffi module: it calls the C core of ``asymo._native`` through function
addresses handed over at import (asymo/ops/matmul_fast.py), so there is one pool state.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "matmul_fast.c")
NAME = "asymo._matmul_fast"


def extension(optional=True):
    """The setuptools Extension, or None when numpy is not importable here."""
    try:
        import numpy
    except ImportError:
        print(f"warning: numpy is not installed: {NAME} (asymo.matmul's fast path) is not "
              "built", file=sys.stderr)
        return None
    from setuptools import Extension
    return Extension(
        NAME,
        sources=[os.path.relpath(SOURCE)],
        include_dirs=[numpy.get_include()],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
        optional=optional,
    )


def extensions():
    """``ext_modules`` for setup.py: ``[extension]``, or ``[]`` without numpy."""
    ext = extension(optional=True)
    return [] if ext is None else [ext]


def build_inplace():
    """Compile the extension into ``asymo/`` (run from the project root). Returns True when
    built; prints why not otherwise (asymo then works without the fast path)."""
    ext = extension(optional=False)
    if ext is None:
        return False
    import warnings
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext
    with warnings.catch_warnings():
        # the Distribution reads pyproject.toml's metadata, of which only its format is
        # warned about (pip install reports that); nothing of it matters to one extension
        warnings.simplefilter("ignore")
        dist = Distribution({"name": "asymo", "ext_modules": [ext]})
    cmd = build_ext(dist)
    cmd.inplace = 1
    try:
        cmd.ensure_finalized()
        cmd.run()
    except Exception as exc:  # noqa: BLE001 - any compiler or setuptools failure
        print(f"warning: {NAME} (asymo.matmul's fast path) was not built: {exc}",
              file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(0 if build_inplace() else 1)
