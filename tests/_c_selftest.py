"""Build one of tests/c/*_selftest.c with the C files of asymo._native and run it: natively,
or for AArch64 under qemu-user (the NEON kernels) when the cross tool chain is installed."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
sys.path.insert(0, CSRC)
from build_native import native_sources  # noqa: E402  (the C files of asymo._native)


def build_and_run(name, cc, tmp_path, runner=(), extra=()):
    """Compile tests/c/``name``.c with the runtime's sources, run it, check it ends in OK."""
    exe = str(tmp_path / name)
    sources = [os.path.join(ROOT, "tests", "c", name + ".c")] + native_sources()
    subprocess.run([cc, "-O2", "-std=gnu11", "-pthread", *extra, "-I",
                    os.path.join(CSRC, "include"), "-I", CSRC, *sources, "-lm", "-o", exe],
                   check=True, capture_output=True, text=True, timeout=300)
    res = subprocess.run([*runner, exe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("OK"), res.stdout
    return res.stdout


def run_native(name, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return build_and_run(name, cc, tmp_path)


def run_under_qemu(name, tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 (`make test` installs them "
                    "as root: apt-get install gcc-aarch64-linux-gnu qemu-user)")
    return build_and_run(name, cc, tmp_path, runner=(qemu,), extra=("-static",))
