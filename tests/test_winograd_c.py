"""The Winograd task body on its own (tests/c/winograd_selftest.c): compiled natively, and for
AArch64 when a cross compiler and qemu-user are installed, so the portable body's NEON code
runs under emulation."""
from _c_selftest import run_native, run_under_qemu


def test_winograd_selftest_native(tmp_path):
    run_native("winograd_selftest", tmp_path)


def test_winograd_neon_under_qemu(tmp_path):
    run_under_qemu("winograd_selftest", tmp_path)
