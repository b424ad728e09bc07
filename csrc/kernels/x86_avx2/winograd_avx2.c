/* Winograd F(m x m, 3 x 3) task body for AVX2+FMA (conv/winograd_impl.h, one ymm per vector). */
#if defined(__x86_64__)
#define WINO_ATTR __attribute__((target("avx2,fma")))
#define WINO_SFX avx2
#include "conv/winograd_impl.h"
#else
typedef int asymo_winograd_avx2_unused;  /* nothing to build on other architectures */
#endif
