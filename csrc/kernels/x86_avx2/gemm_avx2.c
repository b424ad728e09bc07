/* AVX2+FMA micro-kernels, float32 (6 x 16) and float64 (6 x 8).
 *
 * Each kernel keeps an mr x nr tile of C in registers (two vectors per row: 12 accumulators of
 * the 16 ymm registers), loads one row of the packed B sliver and broadcasts one value from
 * each of the mr rows of the packed A block per k step. Compiled with per-function target
 * attributes so the library runs on any x86-64 CPU; the driver calls only the kernels
 * asymo_isa_supported() reports. */
#if defined(__x86_64__)

#include "kernels/gemm_kernels.h"
#include "kernels/x86_templates.h"

/* ---- AVX2 float32: 6 x 16 ---- */
#define DECL(i) __m256 c##i##a = _mm256_setzero_ps(), c##i##b = _mm256_setzero_ps();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 15), _MM_HINT_T0);
#define FMA_ROW(i) { const __m256 ai = _mm256_broadcast_ss(a + (i) * lda);                     \
    c##i##a = _mm256_fmadd_ps(ai, b0, c##i##a); c##i##b = _mm256_fmadd_ps(ai, b1, c##i##b); }
#define STORE(i) _mm256_storeu_ps(c + (i) * rsc, c##i##a);                                    \
    _mm256_storeu_ps(c + (i) * rsc + 8, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm256_storeu_ps(c + (i) * rsc, _mm256_add_ps(_mm256_loadu_ps(c + (i) * rsc), c##i##a));  \
    _mm256_storeu_ps(c + (i) * rsc + 8,                                                       \
                     _mm256_add_ps(_mm256_loadu_ps(c + (i) * rsc + 8), c##i##b));
ATTR_AVX2 static void ukr_avx2_f32(int64_t k, const void *a_, int64_t lda, const void *b_,
                                   void *c_, int64_t rsc, int accumulate)
{
    UKR_BODY(__m256, _mm256, ps, float, 8, REP6)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

/* ---- AVX2 float64: 6 x 8 ---- */
#define DECL(i) __m256d c##i##a = _mm256_setzero_pd(), c##i##b = _mm256_setzero_pd();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 7), _MM_HINT_T0);
#define FMA_ROW(i) { const __m256d ai = _mm256_broadcast_sd(a + (i) * lda);                    \
    c##i##a = _mm256_fmadd_pd(ai, b0, c##i##a); c##i##b = _mm256_fmadd_pd(ai, b1, c##i##b); }
#define STORE(i) _mm256_storeu_pd(c + (i) * rsc, c##i##a);                                    \
    _mm256_storeu_pd(c + (i) * rsc + 4, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm256_storeu_pd(c + (i) * rsc, _mm256_add_pd(_mm256_loadu_pd(c + (i) * rsc), c##i##a));  \
    _mm256_storeu_pd(c + (i) * rsc + 4,                                                       \
                     _mm256_add_pd(_mm256_loadu_pd(c + (i) * rsc + 4), c##i##b));
ATTR_AVX2 static void ukr_avx2_f64(int64_t k, const void *a_, int64_t lda, const void *b_,
                                   void *c_, int64_t rsc, int accumulate)
{
    UKR_BODY(__m256d, _mm256, pd, double, 4, REP6)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC


#define FIN_AVX2_PS(x0, x1, x2, x3, dst) _mm_storeu_ps(dst, hsum4_ps(x0, x1, x2, x3))
#define FIN_AVX2_PD(x0, x1, x2, x3, dst) _mm256_storeu_pd(dst, hsum4_pd(x0, x1, x2, x3))

ATTR_AVX2 static void dot_avx2_f32(DOT_ARGS)
{
    DOT_BODY(float, __m256, 8, _mm256_setzero_ps(), _mm256_loadu_ps, _mm256_fmadd_ps,
             _mm256_add_ps, FIN_AVX2_PS)
}
ATTR_AVX2 static void dot_avx2_f64(DOT_ARGS)
{
    DOT_BODY(double, __m256d, 4, _mm256_setzero_pd(), _mm256_loadu_pd, _mm256_fmadd_pd,
             _mm256_add_pd, FIN_AVX2_PD)
}

/* Axpy-form skinny kernels: the shared C loops, vectorized by the compiler for this target. */
#define SK_NO_DOT
#define SK_T float
#define SK_SUFFIX avx2_f32
#define SK_LANES 32
#define SK_ATTR ATTR_AVX2
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T double
#define SK_SUFFIX avx2_f64
#define SK_LANES 16
#define SK_ATTR ATTR_AVX2
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR
#undef SK_NO_DOT

const asymo_gemm_kernel asymo_gemm_avx2_f32 = {6, 16, ukr_avx2_f32, dot_avx2_f32,
                                               skinny_axpy_avx2_f32};
const asymo_gemm_kernel asymo_gemm_avx2_f64 = {6, 8, ukr_avx2_f64, dot_avx2_f64,
                                               skinny_axpy_avx2_f64};

#endif /* __x86_64__ */
