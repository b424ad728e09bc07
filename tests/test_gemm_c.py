"""The C GEMM on its own: tests/c/gemm_selftest.c compiled natively and, when an aarch64 cross
compiler and qemu-user are installed, for AArch64 so the NEON kernels run under emulation."""
from _c_selftest import run_native, run_under_qemu


def test_c_selftest_native(tmp_path):
    out = run_native("gemm_selftest", tmp_path)
    assert "isa portable" in out


def test_neon_kernels_under_qemu(tmp_path):
    out = run_under_qemu("gemm_selftest", tmp_path)
    assert "isa neon: f32 tile 8x12" in out
