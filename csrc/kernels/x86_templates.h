/* Bodies shared by the x86-64 kernel families (x86_avx2/, x86_avx512/): the register-tile
 * micro-kernel and the dot-form skinny kernel, written once over the vector width. Each
 * family's file instantiates them with its intrinsics. */
#ifndef ASYMO_KERNELS_X86_TEMPLATES_H
#define ASYMO_KERNELS_X86_TEMPLATES_H

#include <immintrin.h>

#define ATTR_AVX2 __attribute__((target("avx2,fma")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))

/* ASYMO_ACT_* (asymo/conv.h: 0 none, 1 ReLU, 2 ReLU6) on 16 floats, act a constant in each
 * inlined copy. vmaxps / vminps return the second operand when either is NaN, so NaN
 * propagates as in torch. */
ATTR_AVX512 static inline __attribute__((always_inline)) __m512 activate_ps512(__m512 v,
                                                                              const int act)
{
    const __m512 zero = _mm512_setzero_ps();
    if (act == 1)
        return _mm512_max_ps(zero, v);
    if (act == 2)
        return _mm512_min_ps(_mm512_set1_ps(6.0f), _mm512_max_ps(zero, v));
    return v;
}

/* activate_ps512 on 8 floats */
ATTR_AVX2 static inline __attribute__((always_inline)) __m256 activate_ps256(__m256 v,
                                                                             const int act)
{
    const __m256 zero = _mm256_setzero_ps();
    if (act == 1)
        return _mm256_max_ps(zero, v);
    if (act == 2)
        return _mm256_min_ps(_mm256_set1_ps(6.0f), _mm256_max_ps(zero, v));
    return v;
}

/* An 8 x 8 block of floats, transposed in place: r[j] then holds element j of rows 0..7
 * (eight pixels by eight channels, either way round). */
ATTR_AVX2 static inline __attribute__((always_inline)) void transpose_8x8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4h + j] (j < 4): channel 4L + j of rows 4h..4h+3 in lane L */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

#define REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define REP12(X) REP6(X) X(6) X(7) X(8) X(9) X(10) X(11)

/* Shared body of the BLIS-form kernels (packed A micro-panel, a[p * MR + i]): VT vector type,
 * P intrinsic prefix, S suffix (ps/pd), W lanes, REP rows, MR = rows. A, read from L2 as one
 * stream, is prefetched AHEAD bytes ahead; C rows are prefetched before the loop. */
#define UKR_BODY(VT, P, S, T, W, REP, MR, AHEAD)                                          \
    const T *a = (const T *)a_;                                                              \
    const T *b = (const T *)b_;                                                              \
    T *c = (T *)c_;                                                                           \
    REP(DECL)                                                                                 \
    REP(PREFETCH_C)                                                                           \
    _Pragma("GCC unroll 4")                                                                   \
    for (int64_t p = 0; p < k; p++) {                                                         \
        _mm_prefetch((const char *)a + (AHEAD), _MM_HINT_T0);                                 \
        const VT b0 = P##_load_##S(b);                                                        \
        const VT b1 = P##_load_##S(b + W);                                                    \
        REP(FMA_ROW)                                                                          \
        a += (MR);                                                                            \
        b += 2 * W;                                                                           \
    }                                                                                         \
    if (accumulate) {                                                                         \
        REP(STORE_ACC)                                                                        \
    } else {                                                                                  \
        REP(STORE)                                                                            \
    }


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

#endif
