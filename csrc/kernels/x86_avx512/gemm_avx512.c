/* AVX-512 micro-kernels (float32 12 x 32, float64 12 x 16) and skinny-product kernels.
 *
 * The C tile takes 24 of the 32 zmm registers (two vectors per row); per k step the kernel
 * loads one row of the packed B sliver and broadcasts the 12 contiguous values of the packed A
 * micro-panel (BLIS form). Only called when the CPU reports AVX-512F/VL/DQ; the default ISA
 * prefers AVX2+FMA on CPUs that double-pump 512-bit FMAs (see gemm.c). */
#if defined(__x86_64__)

#include <immintrin.h>

#include "gemm_kernels.h"

#define ATTR_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))
#define ATTR_AVX2 __attribute__((target("avx2,fma")))

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#define AHEAD 768

#define UKR_BODY(VT, P, S, T, W)                                                              \
    const T *a = (const T *)a_;                                                               \
    const T *b = (const T *)b_;                                                               \
    T *c = (T *)c_;                                                                           \
    REP12(DECL)                                                                               \
    REP12(PREFETCH_C)                                                                         \
    _Pragma("GCC unroll 4")                                                                   \
    for (int64_t p = 0; p < k; p++) {                                                         \
        _mm_prefetch((const char *)a + AHEAD, _MM_HINT_T0);                                   \
        const VT b0 = P##_load_##S(b);                                                        \
        const VT b1 = P##_load_##S(b + W);                                                    \
        REP12(FMA_ROW)                                                                        \
        a += 12;                                                                              \
        b += 2 * W;                                                                           \
    }                                                                                         \
    if (accumulate) {                                                                         \
        REP12(STORE_ACC)                                                                      \
    } else {                                                                                  \
        REP12(STORE)                                                                          \
    }

/* ---- float32: 12 x 32 ---- */
#define DECL(i) __m512 c##i##a = _mm512_setzero_ps(), c##i##b = _mm512_setzero_ps();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 31), _MM_HINT_T0);
#define FMA_ROW(i) { const __m512 ai = _mm512_set1_ps(a[i]);                                   \
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
    UKR_BODY(__m512, _mm512, ps, float, 16)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

/* ---- float64: 12 x 16 ---- */
#define DECL(i) __m512d c##i##a = _mm512_setzero_pd(), c##i##b = _mm512_setzero_pd();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 15), _MM_HINT_T0);
#define FMA_ROW(i) { const __m512d ai = _mm512_set1_pd(a[i]);                                  \
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
    UKR_BODY(__m512d, _mm512, pd, double, 8)
}
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

/* Dot-form skinny kernels (out[l, s] = mat row l . vector s, both contiguous along p):
 * four rows share each vector load, two accumulators per row hide the FMA latency, and the four
 * row sums are reduced together with horizontal adds, so short rows (K of a few hundred) are
 * not dominated by the reduction. */
#define DOT_ARGS int64_t l0, int64_t l1, int64_t ns, int64_t k, const void *mat_,               \
                 int64_t mat_rsl, int64_t mat_csp, const void *vec_, int64_t vec_rsp,          \
                 int64_t vec_css, void *out_, int64_t out_rsl, int64_t out_css

/* 4 ymm of float -> xmm of their 4 sums */
ATTR_AVX2 static inline __m128 hsum4_ps(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* 4 ymm of double -> ymm of their 4 sums */
ATTR_AVX2 static inline __m256d hsum4_pd(__m256d a0, __m256d a1, __m256d a2, __m256d a3)
{
    const __m256d h01 = _mm256_hadd_pd(a0, a1), h23 = _mm256_hadd_pd(a2, a3);
    return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20),
                         _mm256_permute2f128_pd(h01, h23, 0x31));
}

#define DOT_BODY(T, V, W, ZERO, LOAD, FMA, ADD, FINISH4)                                       \
    const T *mat = (const T *)mat_;                                                            \
    const T *vec = (const T *)vec_;                                                            \
    T *out = (T *)out_;                                                                        \
    const int64_t kv = k - k % (2 * W);                                                        \
    (void)mat_csp;                                                                             \
    (void)vec_rsp;                                                                             \
    int64_t l = l0;                                                                            \
    for (; l < l1; l += 4) {                                                                   \
        const int64_t rows = l1 - l < 4 ? l1 - l : 4;                                          \
        /* fewer than 4 rows left: repeat the last one (its sums are not stored) */            \
        const T *r0 = mat + l * mat_rsl;                                                       \
        const T *r1 = rows > 1 ? r0 + mat_rsl : r0;                                            \
        const T *r2 = rows > 2 ? r0 + 2 * mat_rsl : r1;                                        \
        const T *r3 = rows > 3 ? r0 + 3 * mat_rsl : r2;                                        \
        for (int64_t s = 0; s < ns; s++) {                                                     \
            const T *v = vec + s * vec_css;                                                    \
            V a0 = ZERO, a1 = ZERO, a2 = ZERO, a3 = ZERO;                                      \
            V b0 = ZERO, b1 = ZERO, b2 = ZERO, b3 = ZERO;                                      \
            for (int64_t p = 0; p < kv; p += 2 * W) {                                          \
                const V x0 = LOAD(v + p), x1 = LOAD(v + p + W);                                \
                a0 = FMA(LOAD(r0 + p), x0, a0);                                                \
                a1 = FMA(LOAD(r1 + p), x0, a1);                                                \
                a2 = FMA(LOAD(r2 + p), x0, a2);                                                \
                a3 = FMA(LOAD(r3 + p), x0, a3);                                                \
                b0 = FMA(LOAD(r0 + p + W), x1, b0);                                            \
                b1 = FMA(LOAD(r1 + p + W), x1, b1);                                            \
                b2 = FMA(LOAD(r2 + p + W), x1, b2);                                            \
                b3 = FMA(LOAD(r3 + p + W), x1, b3);                                            \
            }                                                                                  \
            T sums[4];                                                                         \
            FINISH4(ADD(a0, b0), ADD(a1, b1), ADD(a2, b2), ADD(a3, b3), sums);                 \
            for (int64_t p = kv; p < k; p++) {                                                 \
                const T x = v[p];                                                              \
                sums[0] += r0[p] * x;                                                          \
                sums[1] += r1[p] * x;                                                          \
                sums[2] += r2[p] * x;                                                          \
                sums[3] += r3[p] * x;                                                          \
            }                                                                                  \
            T *o = out + l * out_rsl + s * out_css;                                            \
            for (int64_t i = 0; i < rows; i++)                                                 \
                o[i * out_rsl] = sums[i];                                                      \
        }                                                                                      \
    }

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

/* Axpy-form skinny kernels: the shared C loops, vectorized by the compiler for AVX-512. */
#define SK_NO_DOT
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
#undef SK_NO_DOT

const asymo_gemm_kernel asymo_gemm_avx512_f32 = {12, 32, ukr_avx512_f32, dot_avx512_f32,
                                                 skinny_axpy_avx512_f32, NULL};
const asymo_gemm_kernel asymo_gemm_avx512_f64 = {12, 16, ukr_avx512_f64, dot_avx512_f64,
                                                 skinny_axpy_avx512_f64, NULL};

#endif /* __x86_64__ */
