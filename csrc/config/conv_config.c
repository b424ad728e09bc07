/* Which ISA variant the convolution, depthwise and pooling frames run (asymo/conv.h): the
 * best the CPU supports among the variants compiled, unless a test or benchmark forces one. */
#include "asymo/conv.h"
#include "asymo/isa.h"

static int isa_override = -1;

static int isa_compiled(int isa)
{
#if defined(__x86_64__)
    return isa == ASYMO_ISA_PORTABLE || isa == ASYMO_ISA_AVX2_FMA || isa == ASYMO_ISA_AVX512;
#else
    return isa == ASYMO_ISA_PORTABLE;
#endif
}

int asymo_conv_isa(void)
{
    const int forced = __atomic_load_n(&isa_override, __ATOMIC_RELAXED);
    if (forced >= 0)
        return forced;
    static int best = -1;
    int b = __atomic_load_n(&best, __ATOMIC_RELAXED);
    if (b < 0) {
        const uint32_t mask = asymo_isa_supported();
        b = ASYMO_ISA_PORTABLE;
        if ((mask & (1u << ASYMO_ISA_AVX512)) && isa_compiled(ASYMO_ISA_AVX512))
            b = ASYMO_ISA_AVX512;
        else if ((mask & (1u << ASYMO_ISA_AVX2_FMA)) && isa_compiled(ASYMO_ISA_AVX2_FMA))
            b = ASYMO_ISA_AVX2_FMA;
        __atomic_store_n(&best, b, __ATOMIC_RELAXED);
    }
    return b;
}

int asymo_conv_set_isa(int isa)
{
    if (isa >= 0 && (!isa_compiled(isa) || !(asymo_isa_supported() & (1u << isa))))
        return -1;
    __atomic_store_n(&isa_override, isa < 0 ? -1 : isa, __ATOMIC_RELAXED);
    return 0;
}
