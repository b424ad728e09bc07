/* Run-time CPU feature detection: which ISA kernels this CPU can execute. */
#ifndef ASYMO_ISA_H
#define ASYMO_ISA_H

#include <stdint.h>

/* CDEF BEGIN */
enum {
    ASYMO_ISA_PORTABLE = 0,
    ASYMO_ISA_AVX2_FMA = 1,
    ASYMO_ISA_AVX512 = 2,
    ASYMO_ISA_NEON = 3
};
/* Bit mask of (1 << ASYMO_ISA_*) for every kernel family this CPU can run. */
uint32_t asymo_isa_supported(void);
/* The best supported ISA (highest ASYMO_ISA_* the CPU supports). */
int asymo_isa_best(void);
const char *asymo_isa_name(int isa);
/* CDEF END */

#endif
