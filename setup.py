"""Build script: compiles csrc/ into ``asymo._native`` through cffi (out-of-line API mode).

Everything else lives in pyproject.toml; setup.py only exists because setuptools reads
``cffi_modules`` from here.
"""
from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder"])
