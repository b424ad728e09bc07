/* AVX-512 micro-kernels, float32 (12 x 32) and float64 (12 x 16), BLIS form.
 *
 * Each kernel keeps an mr x nr tile of C in registers (two vectors per row: 24 accumulators of
 * the 32 zmm registers), loads one row of the packed B sliver and broadcasts the 12 contiguous
 * values of the packed A micro-panel per k step. The kernels use F + VL + DQ; compiled
 * with per-function target attributes, called only where asymo_isa_supported() reports
 * AVX-512 (and not chosen by default on Zen 4: see csrc/config/gemm_config.c). */
#if defined(__x86_64__)

#include "kernels/gemm_kernels.h"
#include "kernels/x86_templates.h"

/* ---- AVX-512 float32: 12 x 32 ---- */
#define DECL(i) __m512 c##i##a = _mm512_setzero_ps(), c##i##b = _mm512_setzero_ps();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 31), _MM_HINT_T0);
#define FMA_ROW(i) { const __m512 ai = _mm512_set1_ps(a[i]);                           \
    c##i##a = _mm512_fmadd_ps(ai, b0, c##i##a); c##i##b = _mm512_fmadd_ps(ai, b1, c##i##b); }
#define STORE(i) _mm512_storeu_ps(c + (i) * rsc, c##i##a);                                    \
    _mm512_storeu_ps(c + (i) * rsc + 16, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm512_storeu_ps(c + (i) * rsc, _mm512_add_ps(_mm512_loadu_ps(c + (i) * rsc), c##i##a));  \
    _mm512_storeu_ps(c + (i) * rsc + 16,                                                      \
                     _mm512_add_ps(_mm512_loadu_ps(c + (i) * rsc + 16), c##i##b));
ATTR_AVX512 static void ukr_avx512_f32(int64_t k, const void *a_, const void *b_, void *c_,
                                       int64_t rsc, int accumulate)
{
    UKR_BODY(__m512, _mm512, ps, float, 16, REP12, 12, 768)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

/* ---- AVX-512 float64: 12 x 16 ---- */
#define DECL(i) __m512d c##i##a = _mm512_setzero_pd(), c##i##b = _mm512_setzero_pd();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 15), _MM_HINT_T0);
#define FMA_ROW(i) { const __m512d ai = _mm512_set1_pd(a[i]);                          \
    c##i##a = _mm512_fmadd_pd(ai, b0, c##i##a); c##i##b = _mm512_fmadd_pd(ai, b1, c##i##b); }
#define STORE(i) _mm512_storeu_pd(c + (i) * rsc, c##i##a);                                    \
    _mm512_storeu_pd(c + (i) * rsc + 8, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm512_storeu_pd(c + (i) * rsc, _mm512_add_pd(_mm512_loadu_pd(c + (i) * rsc), c##i##a));  \
    _mm512_storeu_pd(c + (i) * rsc + 8,                                                       \
                     _mm512_add_pd(_mm512_loadu_pd(c + (i) * rsc + 8), c##i##b));
ATTR_AVX512 static void ukr_avx512_f64(int64_t k, const void *a_, const void *b_, void *c_,
                                       int64_t rsc, int accumulate)
{
    UKR_BODY(__m512d, _mm512, pd, double, 8, REP12, 12, 768)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC


#define FIN_AVX512_PS(x0, x1, x2, x3, dst)                                                    \
    _mm_storeu_ps(dst, hsum4_ps(                                                              \
        _mm256_add_ps(_mm512_castps512_ps256(x0), _mm512_extractf32x8_ps(x0, 1)),             \
        _mm256_add_ps(_mm512_castps512_ps256(x1), _mm512_extractf32x8_ps(x1, 1)),             \
        _mm256_add_ps(_mm512_castps512_ps256(x2), _mm512_extractf32x8_ps(x2, 1)),             \
        _mm256_add_ps(_mm512_castps512_ps256(x3), _mm512_extractf32x8_ps(x3, 1))))
#define FIN_AVX512_PD(x0, x1, x2, x3, dst)                                                    \
    _mm256_storeu_pd(dst, hsum4_pd(                                                           \
        _mm256_add_pd(_mm512_castpd512_pd256(x0), _mm512_extractf64x4_pd(x0, 1)),             \
        _mm256_add_pd(_mm512_castpd512_pd256(x1), _mm512_extractf64x4_pd(x1, 1)),             \
        _mm256_add_pd(_mm512_castpd512_pd256(x2), _mm512_extractf64x4_pd(x2, 1)),             \
        _mm256_add_pd(_mm512_castpd512_pd256(x3), _mm512_extractf64x4_pd(x3, 1))))


ATTR_AVX512 static void dot_avx512_f32(DOT_ARGS)
{
    DOT_BODY(float, __m512, 16, _mm512_setzero_ps(), _mm512_loadu_ps, _mm512_fmadd_ps,
             _mm512_add_ps, FIN_AVX512_PS)
}
ATTR_AVX512 static void dot_avx512_f64(DOT_ARGS)
{
    DOT_BODY(double, __m512d, 8, _mm512_setzero_pd(), _mm512_loadu_pd, _mm512_fmadd_pd,
             _mm512_add_pd, FIN_AVX512_PD)
}

/* Axpy-form skinny kernels: the shared C loops, vectorized by the compiler for this target. */
#define SK_NO_DOT
#define SK_T float
#define SK_SUFFIX avx512_f32
#define SK_LANES 64
#define SK_ATTR ATTR_AVX512
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T double
#define SK_SUFFIX avx512_f64
#define SK_LANES 32
#define SK_ATTR ATTR_AVX512
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR
#undef SK_NO_DOT

const asymo_gemm_kernel asymo_gemm_avx512_f32 = {12, 32, ukr_avx512_f32, dot_avx512_f32,
                                                 skinny_axpy_avx512_f32, NULL,
                                                 .mv_panel = mv_panel_avx512_f32};
const asymo_gemm_kernel asymo_gemm_avx512_f64 = {12, 16, ukr_avx512_f64, dot_avx512_f64,
                                                 skinny_axpy_avx512_f64, NULL};

#endif /* __x86_64__ */
