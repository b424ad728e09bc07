from asymo.runtime.ffi import ffi, lib


def test_isa_detection_is_consistent():
    mask = lib.asymo_isa_supported()
    assert mask & (1 << lib.ASYMO_ISA_PORTABLE)
    best = lib.asymo_isa_best()
    assert mask & (1 << best)
    assert ffi.string(lib.asymo_isa_name(best)).decode() in {
        "portable", "avx2_fma", "avx512", "neon"}
