/* GEMM configuration: which micro-kernel family serves each ISA, and the CPU quirks that
 * change the default choice (BLIS keeps this in config/, apart from the frame). The frame
 * asks only asymo_gemm_kernel_for(); adding a kernel family is a row of the table below. */
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <stddef.h>

#include "asymo/gemm.h"
#include "asymo/isa.h"
#include "config/config.h"
#include "kernels/gemm_kernels.h"

/* One row per ISA compiled into this build: the float32 and float64 kernels. */
static const struct {
    int isa;
    const asymo_gemm_kernel *f32;
    const asymo_gemm_kernel *f64;
} gemm_kernels[] = {
    {ASYMO_ISA_PORTABLE, &asymo_gemm_portable_f32, &asymo_gemm_portable_f64},
#if defined(__x86_64__)
    {ASYMO_ISA_AVX2_FMA, &asymo_gemm_avx2_f32, &asymo_gemm_avx2_f64},
    {ASYMO_ISA_AVX512, &asymo_gemm_avx512_f32, &asymo_gemm_avx512_f64},
#endif
#if defined(__aarch64__)
    {ASYMO_ISA_NEON, &asymo_gemm_neon_f32, &asymo_gemm_neon_f64},
#endif
};

const asymo_gemm_kernel *asymo_gemm_kernel_for(int isa, int dtype)
{
    if (isa < 0 || isa > 31 || !(asymo_isa_supported() & (1u << isa)))
        return NULL;
    const int n = (int)(sizeof gemm_kernels / sizeof gemm_kernels[0]);
    for (int i = 0; i < n; i++)
        if (gemm_kernels[i].isa == isa)
            return dtype == ASYMO_DTYPE_F32 ? gemm_kernels[i].f32 : gemm_kernels[i].f64;
    return NULL;
}

#if defined(__x86_64__)
/* The Zen 4 quirk. AMD family 19h with AVX-512 is Zen 4: its 512-bit FMAs are double-pumped
 * 256-bit ones, so the AVX-512 kernel has no more peak than AVX2 and, measured, loses to it
 * once every core runs it; AVX2 is the default there (asymo_gemm_default_isa). */
static int double_pumped_avx512(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx))
        return 0;
    const int amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
    if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    unsigned family = (eax >> 8) & 0xf;
    if (family == 0xf)
        family += (eax >> 20) & 0xff;
    return family == 0x19;
}
#endif

int asymo_gemm_default_isa(void)
{
    int best = asymo_isa_best();
#if defined(__x86_64__)
    if (best == ASYMO_ISA_AVX512 && double_pumped_avx512()
        && (asymo_isa_supported() & (1u << ASYMO_ISA_AVX2_FMA)))
        best = ASYMO_ISA_AVX2_FMA;
#endif
    return asymo_gemm_kernel_for(best, ASYMO_DTYPE_F32) ? best : ASYMO_ISA_PORTABLE;
}

int asymo_gemm_kernel_tile(int isa, int dtype, int *mr, int *nr)
{
    const asymo_gemm_kernel *k;
    if (dtype != ASYMO_DTYPE_F32 && dtype != ASYMO_DTYPE_F64)
        return ASYMO_EINVAL;
    k = asymo_gemm_kernel_for(isa, dtype);
    if (!k)
        return ASYMO_EINVAL;
    if (mr)
        *mr = k->mr;
    if (nr)
        *nr = k->nr;
    return ASYMO_OK;
}
