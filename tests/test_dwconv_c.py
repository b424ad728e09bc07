"""The depthwise task on its own (tests/c/dwconv_selftest.c): compiled natively, and for
AArch64 when a cross compiler and qemu-user are installed, so the plain-C 3x3 kernel runs as
GCC vectorises it for NEON."""
from _c_selftest import run_native, run_under_qemu


def test_dwconv_selftest_native(tmp_path):
    run_native("dwconv_selftest", tmp_path)


def test_dwconv_under_qemu(tmp_path):
    run_under_qemu("dwconv_selftest", tmp_path)
