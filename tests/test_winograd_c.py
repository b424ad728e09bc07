"""The Winograd task body on its own (tests/c/winograd_selftest.c): compiled natively, and for
AArch64 when a cross compiler and qemu-user are installed, so the portable body's NEON code
runs under emulation."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "csrc"))
from build_native import native_sources  # noqa: E402  (the C files of asymo._native)

CSRC = os.path.join(ROOT, "csrc")
SELFTEST = os.path.join(ROOT, "tests", "c", "winograd_selftest.c")


def build_and_run(cc, tmp_path, runner=(), extra=()):
    exe = str(tmp_path / "winograd_selftest")
    subprocess.run([cc, "-O2", "-std=gnu11", "-pthread", *extra, "-I",
                    os.path.join(CSRC, "include"), "-I", CSRC, SELFTEST, *native_sources(),
                    "-lm", "-o", exe],
                   check=True, capture_output=True, text=True, timeout=300)
    res = subprocess.run([*runner, exe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("OK"), res.stdout
    return res.stdout


def test_winograd_selftest_native(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    build_and_run(cc, tmp_path)


def test_winograd_neon_under_qemu(tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 (apt-get install "
                    "gcc-aarch64-linux-gnu qemu-user-static)")
    build_and_run(cc, tmp_path, runner=(qemu,), extra=("-static",))
