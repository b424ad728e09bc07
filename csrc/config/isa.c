/* Run-time CPU feature detection: which ISA kernel families this CPU can execute. */
#include "asymo/isa.h"

/* The CPU's answer, read once: kernels and frames ask on their hot paths (a task picking its
 * kernel family), so the feature tests are not repeated per call. 0: not read yet (the mask
 * always holds the portable bit). */
static uint32_t detected;

static uint32_t detect(void)
{
    uint32_t mask = 1u << ASYMO_ISA_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        mask |= 1u << ASYMO_ISA_AVX2_FMA;
    /* The AVX-512 kernels use F + VL + DQ; all AVX-512 CPUs since Skylake-X have them. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("avx512dq"))
        mask |= 1u << ASYMO_ISA_AVX512;
#elif defined(__aarch64__)
    /* Advanced SIMD is mandatory on AArch64. */
    mask |= 1u << ASYMO_ISA_NEON;
#endif
    return mask;
}

uint32_t asymo_isa_supported(void)
{
    uint32_t mask = __atomic_load_n(&detected, __ATOMIC_RELAXED);
    if (mask == 0) {
        mask = detect();
        __atomic_store_n(&detected, mask, __ATOMIC_RELAXED);
    }
    return mask;
}

int asymo_isa_best(void)
{
    uint32_t mask = asymo_isa_supported();
    int best = ASYMO_ISA_PORTABLE;
    for (int isa = 0; isa < 32; isa++)
        if (mask & (1u << isa))
            best = isa;
    return best;
}

const char *asymo_isa_name(int isa)
{
    switch (isa) {
    case ASYMO_ISA_PORTABLE: return "portable";
    case ASYMO_ISA_AVX2_FMA: return "avx2_fma";
    case ASYMO_ISA_AVX512: return "avx512";
    case ASYMO_ISA_NEON: return "neon";
    default: return "unknown";
    }
}
