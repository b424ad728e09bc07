"""Build script: compiles csrc/ into ``asymo._native`` (the runtime) and ``asymo.lab._native``
(the emulator, the cross-core transfer probe) through cffi (out-of-line API mode); see csrc/build_native.py.

Everything else lives in pyproject.toml; setup.py only exists because setuptools reads
``cffi_modules`` from here. It also adds ``asymo._matmul_fast`` (asymo.matmul's C fast path, built against the
NumPy headers; optional: asymo works without it).
"""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "python"))
from build_matmul_fast import extensions  # noqa: E402

setup(cffi_modules=["csrc/build_native.py:ffibuilder", "csrc/build_native.py:lab_ffibuilder"],
      ext_modules=extensions())
