/* x86-64 micro-kernels: AVX2+FMA and AVX-512, float32 and float64.
 *
 * Each kernel keeps an mr x nr tile of C in registers (two vectors per row: 24 accumulators of
 * the 32 zmm registers for AVX-512, 12 of the 16 ymm for AVX2), loads one row of the packed B
 * sliver and broadcasts one value from each of the mr rows of the packed A block per k step.
 * Compiled with per-function target attributes so the library runs on any x86-64 CPU; the
 * driver calls only the kernels asymo_isa_supported() reports. */
#if defined(__x86_64__)

#include <immintrin.h>

#include "gemm_kernels.h"

#define ATTR_AVX2 __attribute__((target("avx2,fma")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))

#define REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define REP12(X) REP6(X) X(6) X(7) X(8) X(9) X(10) X(11)

/* Shared body: VT vector type, P intrinsic prefix, S suffix (ps/pd), W lanes, REP rows. */
#define UKR_BODY(VT, P, S, T, W, REP)                                                     \
    const T *a = (const T *)a_;                                                              \
    const T *b = (const T *)b_;                                                              \
    T *c = (T *)c_;                                                                           \
    REP(DECL)                                                                                 \
    REP(PREFETCH_C)                                                                           \
    _Pragma("GCC unroll 4")                                                                   \
    for (int64_t p = 0; p < k; p++) {                                                         \
        const VT b0 = P##_load_##S(b);                                                        \
        const VT b1 = P##_load_##S(b + W);                                                    \
        REP(FMA_ROW)                                                                          \
        a += 1;                                                                               \
        b += 2 * W;                                                                           \
    }                                                                                         \
    if (accumulate) {                                                                         \
        REP(STORE_ACC)                                                                        \
    } else {                                                                                  \
        REP(STORE)                                                                            \
    }

/* ---- AVX-512 float32: 12 x 32 ---- */
#define DECL(i) __m512 c##i##a = _mm512_setzero_ps(), c##i##b = _mm512_setzero_ps();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 31), _MM_HINT_T0);
#define FMA_ROW(i) { const __m512 ai = _mm512_set1_ps(a[(i) * lda]);                           \
    c##i##a = _mm512_fmadd_ps(ai, b0, c##i##a); c##i##b = _mm512_fmadd_ps(ai, b1, c##i##b); }
#define STORE(i) _mm512_storeu_ps(c + (i) * rsc, c##i##a);                                    \
    _mm512_storeu_ps(c + (i) * rsc + 16, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm512_storeu_ps(c + (i) * rsc, _mm512_add_ps(_mm512_loadu_ps(c + (i) * rsc), c##i##a));  \
    _mm512_storeu_ps(c + (i) * rsc + 16,                                                      \
                     _mm512_add_ps(_mm512_loadu_ps(c + (i) * rsc + 16), c##i##b));
ATTR_AVX512 static void ukr_avx512_f32(int64_t k, const void *a_, int64_t lda, const void *b_,
                                       void *c_, int64_t rsc, int accumulate)
{
    UKR_BODY(__m512, _mm512, ps, float, 16, REP12)
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
#define FMA_ROW(i) { const __m512d ai = _mm512_set1_pd(a[(i) * lda]);                          \
    c##i##a = _mm512_fmadd_pd(ai, b0, c##i##a); c##i##b = _mm512_fmadd_pd(ai, b1, c##i##b); }
#define STORE(i) _mm512_storeu_pd(c + (i) * rsc, c##i##a);                                    \
    _mm512_storeu_pd(c + (i) * rsc + 8, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm512_storeu_pd(c + (i) * rsc, _mm512_add_pd(_mm512_loadu_pd(c + (i) * rsc), c##i##a));  \
    _mm512_storeu_pd(c + (i) * rsc + 8,                                                       \
                     _mm512_add_pd(_mm512_loadu_pd(c + (i) * rsc + 8), c##i##b));
ATTR_AVX512 static void ukr_avx512_f64(int64_t k, const void *a_, int64_t lda, const void *b_,
                                       void *c_, int64_t rsc, int accumulate)
{
    UKR_BODY(__m512d, _mm512, pd, double, 8, REP12)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

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

/* Skinny kernels: the shared C loops, vectorized by the compiler for each target. */
#define SK_T float
#define SK_SUFFIX avx2_f32
#define SK_LANES 32
#define SK_ATTR ATTR_AVX2
#include "gemm_skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T double
#define SK_SUFFIX avx2_f64
#define SK_LANES 16
#define SK_ATTR ATTR_AVX2
#include "gemm_skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T float
#define SK_SUFFIX avx512_f32
#define SK_LANES 64
#define SK_ATTR ATTR_AVX512
#include "gemm_skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T double
#define SK_SUFFIX avx512_f64
#define SK_LANES 32
#define SK_ATTR ATTR_AVX512
#include "gemm_skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

const asymo_gemm_kernel asymo_gemm_avx2_f32 = {6, 16, ukr_avx2_f32, skinny_dot_avx2_f32,
                                               skinny_axpy_avx2_f32};
const asymo_gemm_kernel asymo_gemm_avx2_f64 = {6, 8, ukr_avx2_f64, skinny_dot_avx2_f64,
                                               skinny_axpy_avx2_f64};
const asymo_gemm_kernel asymo_gemm_avx512_f32 = {12, 32, ukr_avx512_f32, skinny_dot_avx512_f32,
                                                 skinny_axpy_avx512_f32};
const asymo_gemm_kernel asymo_gemm_avx512_f64 = {12, 16, ukr_avx512_f64, skinny_dot_avx512_f64,
                                                 skinny_axpy_avx512_f64};

#endif /* __x86_64__ */
