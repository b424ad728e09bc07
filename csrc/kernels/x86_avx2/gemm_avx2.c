/* AVX2+FMA micro-kernels (float32 6 x 16, float64 6 x 8), BLIS form, the skinny-product
 * kernels, and the row-major A packer of this family.
 *
 * The C tile takes 12 of the 16 ymm registers (two vectors per row); per k step the kernel
 * loads one row of the packed B sliver (two vectors) and broadcasts the mr values of the packed
 * A micro-panel, which are contiguous. Compiled with per-function target attributes so the
 * library runs on any x86-64 CPU; the driver calls only the kernels asymo_isa_supported()
 * reports. */
#if defined(__x86_64__)

#include "kernels/gemm_kernels.h"
#include "kernels/x86_templates.h"

/* One k step: VT vector type, LOADV its aligned load, W lanes; `q` is the step within the
 * unrolled group. */
#define STEP(q)                                                                               \
    {                                                                                         \
        const VT b0 = LOADV(b + (q) * 2 * W);                                                 \
        const VT b1 = LOADV(b + (q) * 2 * W + W);                                             \
        REP6(FMA_ROW_Q(q))                                                                    \
    }

/* Shared body. The k loop is unrolled by 4; A, read from L2 as one stream, is prefetched
 * AHEAD bytes ahead (the B sliver stays in L1 across the micro-panels of the block). C rows
 * are prefetched before the loop so the final loads and stores do not stall. */
#define UKR_LOOP_1STEP(T, MR, BSTEP)                                                          \
    const T *a = (const T *)a_;                                                               \
    const T *b = (const T *)b_;                                                               \
    T *c = (T *)c_;                                                                           \
    REP6(DECL)                                                                                \
    REP6(PREFETCH_C)                                                                          \
    /* one k step per iteration: 12 accumulators, 2 B vectors and a broadcast fit the 16    \
     * registers only if the compiler does not hoist broadcasts across steps (it spilled     \
     * when the loop was unrolled by hand) */                                                 \
    for (int64_t p = 0; p < k; p++) {                                                         \
        _mm_prefetch((const char *)a + AHEAD, _MM_HINT_T0);                                   \
        PREFETCH_B(b);                                                                        \
        STEP(0)                                                                               \
        a += (MR);                                                                            \
        b += (BSTEP);                                                                         \
    }
#define UKR_BODY_1STEP(T, MR, BSTEP)                                                          \
    UKR_LOOP_1STEP(T, MR, BSTEP)                                                              \
    if (accumulate) {                                                                         \
        REP6(STORE_ACC)                                                                       \
    } else {                                                                                  \
        REP6(STORE)                                                                           \
    }

#define AHEAD 384
/* strided-B kernels: the line of the same row of B this many slivers on is fetched into L2 */
#define BAHEAD 1
/* per k step of the packed kernels: nothing (the packed sliver is one forward stream) */
#define PREFETCH_B(b) ((void)0)

/* ---- float32: 6 x 16 ---- */
#define VT __m256
#define LOADV _mm256_load_ps
#define W 8
#define DECL(i) __m256 c##i##a = _mm256_setzero_ps(), c##i##b = _mm256_setzero_ps();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 15), _MM_HINT_T0);
#define FMA_ROW_Q(q) FMA_ROW_Q_##q
#define FMA_ROW_AT(q, i) { const __m256 ai = _mm256_broadcast_ss(a + (q) * 6 + (i));          \
    c##i##a = _mm256_fmadd_ps(ai, b0, c##i##a); c##i##b = _mm256_fmadd_ps(ai, b1, c##i##b); }
#define FMA_ROW_Q_0(i) FMA_ROW_AT(0, i)
#define FMA_ROW_Q_1(i) FMA_ROW_AT(1, i)
#define FMA_ROW_Q_2(i) FMA_ROW_AT(2, i)
#define FMA_ROW_Q_3(i) FMA_ROW_AT(3, i)
#define STORE(i) _mm256_storeu_ps(c + (i) * rsc, c##i##a);                                    \
    _mm256_storeu_ps(c + (i) * rsc + 8, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm256_storeu_ps(c + (i) * rsc, _mm256_add_ps(_mm256_loadu_ps(c + (i) * rsc), c##i##a));  \
    _mm256_storeu_ps(c + (i) * rsc + 8,                                                       \
                     _mm256_add_ps(_mm256_loadu_ps(c + (i) * rsc + 8), c##i##b));
ATTR_AVX2 static void ukr_avx2_f32(int64_t k, const void *a_, const void *b_, void *c_,
                                   int64_t rsc, int accumulate)
{
    UKR_BODY_1STEP(float, 6, 2 * W)
}
/* The same tile with the GEMM epilogue applied in registers before the one store (ukr_epi,
 * gemm_kernels.h): row i + bias[i] + the residual's row, then ReLU / ReLU6 with NaN kept (max / min take their
 * second operand when one is NaN), in the order the separate pass adds them, so the results
 * are the same bits. A layer with few input channels (K of 16 to 64) spent 10-40% of its time
 * reading its output back for that pass. */
#define ADD_C(i) c##i##a = _mm256_add_ps(_mm256_loadu_ps(c + (i) * rsc), c##i##a);            \
    c##i##b = _mm256_add_ps(_mm256_loadu_ps(c + (i) * rsc + 8), c##i##b);
#define ADD_BIAS(i) { const __m256 bi = _mm256_broadcast_ss(bias + (i));                      \
    c##i##a = _mm256_add_ps(c##i##a, bi); c##i##b = _mm256_add_ps(c##i##b, bi); }
#define ADD_RES(i) c##i##a = _mm256_add_ps(c##i##a, _mm256_loadu_ps(res + (i) * rsr));       \
    c##i##b = _mm256_add_ps(c##i##b, _mm256_loadu_ps(res + (i) * rsr + 8));
#define CLAMP_LO(i) c##i##a = _mm256_max_ps(zero, c##i##a); c##i##b = _mm256_max_ps(zero, c##i##b);
#define CLAMP_HI(i) c##i##a = _mm256_min_ps(six, c##i##a); c##i##b = _mm256_min_ps(six, c##i##b);
ATTR_AVX2 static void ukr_epi_avx2_f32(int64_t k, const void *a_, const void *b_, void *c_,
                                       int64_t rsc, int accumulate, const void *bias_,
                                       const void *res_, int64_t rsr, int act)
{
    const float *res = (const float *)res_;
    if (res) /* its rows arrive while the tile is computed (as C's, in the loop's prologue) */
        for (int i = 0; i < 6; i++) {
            _mm_prefetch((const char *)(res + i * rsr), _MM_HINT_T0);
            _mm_prefetch((const char *)(res + i * rsr + 15), _MM_HINT_T0);
        }
    UKR_LOOP_1STEP(float, 6, 2 * W)
    const float *bias = (const float *)bias_;
    const __m256 zero = _mm256_setzero_ps(), six = _mm256_set1_ps(6.0f);
    if (accumulate) {
        REP6(ADD_C)
    }
    if (bias) {
        REP6(ADD_BIAS)
    }
    if (res) {
        REP6(ADD_RES)
    }
    if (act >= 1) {
        REP6(CLAMP_LO)
    }
    if (act == 2) {
        REP6(CLAMP_HI)
    }
    REP6(STORE)
}
#undef ADD_C
#undef ADD_BIAS
#undef ADD_RES
#undef CLAMP_LO
#undef CLAMP_HI
/* B read in place (row stride ldb, unit column stride): a product with few rows of A reuses
 * each B sliver only a few times, too few to pay for packing it; the sliver's rows stay in
 * L1 across the micro-panels of the block. Each k step reads another row of B, a stream per
 * row that no hardware prefetcher follows: the same row's line of the next sliver is fetched
 * into L2 meanwhile (read a whole sliver of micro-panels later; further ahead, or into L1,
 * measured slower once K reached a few hundred rows). The float64 pair below is the same. */
#undef LOADV
#define LOADV _mm256_loadu_ps
#undef PREFETCH_B
#define PREFETCH_B(b) _mm_prefetch((const char *)((b) + BAHEAD * 2 * W), _MM_HINT_T1)
ATTR_AVX2 static void ukr_strided_b_avx2_f32(int64_t k, const void *a_, const void *b_,
                                             int64_t ldb, void *c_, int64_t rsc, int accumulate)
{
    UKR_BODY_1STEP(float, 6, ldb)
}
#undef PREFETCH_B
#define PREFETCH_B(b) ((void)0)
#undef VT
#undef LOADV
#undef W
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW_AT
#undef STORE
#undef STORE_ACC

/* the first 8 columns of a 16-wide sliver (the edge kernel, see gemm_kernels.h) */
ATTR_AVX2 static void ukr_half_avx2_f32(int64_t k, const void *a_, const void *b_, void *c_,
                                        int64_t rsc, int accumulate)
{
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
    float *c = (float *)c_;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps();
    __m256 c3 = _mm256_setzero_ps(), c4 = _mm256_setzero_ps(), c5 = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        _mm_prefetch((const char *)a + AHEAD, _MM_HINT_T0);
        const __m256 b0 = _mm256_load_ps(b);
        c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 0), b0, c0);
        c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 1), b0, c1);
        c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 2), b0, c2);
        c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 3), b0, c3);
        c4 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 4), b0, c4);
        c5 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 5), b0, c5);
        a += 6;
        b += 16;
    }
    __m256 r[6] = {c0, c1, c2, c3, c4, c5};
    for (int i = 0; i < 6; i++) {
        if (accumulate)
            r[i] = _mm256_add_ps(_mm256_loadu_ps(c + i * rsc), r[i]);
        _mm256_storeu_ps(c + i * rsc, r[i]);
    }
}

/* An edge of one or two columns (ukr_narrow, gemm_kernels.h): the micro-panel's 6 rows of a
 * k step are one vector (lanes 6 and 7 masked off: the panel's last step may end a buffer),
 * each column a broadcast of B, so a k step costs one multiply-add per column instead of the
 * half kernel's six; four independent sums per run hide the multiply-add latency. */
ATTR_AVX2 static void ukr_narrow_avx2_f32(int64_t k, const void *a_, const void *b_,
                                          int64_t cols, void *t_, int64_t ldt)
{
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
    float *t = (float *)t_;
    const __m256i rows = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t p = 0;
    if (cols == 1) {
        /* four k steps: four sums of column 0 */
        for (; p + 4 <= k; p += 4) {
            s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + p * 6, rows),
                                 _mm256_broadcast_ss(b + p * 16), s0);
            s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + (p + 1) * 6, rows),
                                 _mm256_broadcast_ss(b + (p + 1) * 16), s1);
            s2 = _mm256_fmadd_ps(_mm256_maskload_ps(a + (p + 2) * 6, rows),
                                 _mm256_broadcast_ss(b + (p + 2) * 16), s2);
            s3 = _mm256_fmadd_ps(_mm256_maskload_ps(a + (p + 3) * 6, rows),
                                 _mm256_broadcast_ss(b + (p + 3) * 16), s3);
        }
        for (; p < k; p++)
            s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + p * 6, rows),
                                 _mm256_broadcast_ss(b + p * 16), s0);
        s0 = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
        s1 = s0;
    } else {
        /* two k steps: two sums of each of columns 0 (s0, s2) and 1 (s1, s3) */
        for (; p + 2 <= k; p += 2) {
            const __m256 a0 = _mm256_maskload_ps(a + p * 6, rows);
            const __m256 a1 = _mm256_maskload_ps(a + (p + 1) * 6, rows);
            s0 = _mm256_fmadd_ps(a0, _mm256_broadcast_ss(b + p * 16), s0);
            s1 = _mm256_fmadd_ps(a0, _mm256_broadcast_ss(b + p * 16 + 1), s1);
            s2 = _mm256_fmadd_ps(a1, _mm256_broadcast_ss(b + (p + 1) * 16), s2);
            s3 = _mm256_fmadd_ps(a1, _mm256_broadcast_ss(b + (p + 1) * 16 + 1), s3);
        }
        if (p < k) {
            const __m256 a0 = _mm256_maskload_ps(a + p * 6, rows);
            s0 = _mm256_fmadd_ps(a0, _mm256_broadcast_ss(b + p * 16), s0);
            s1 = _mm256_fmadd_ps(a0, _mm256_broadcast_ss(b + p * 16 + 1), s1);
        }
        s0 = _mm256_add_ps(s0, s2);
        s1 = _mm256_add_ps(s1, s3);
    }
    float c0[8], c1[8];
    _mm256_storeu_ps(c0, s0);
    _mm256_storeu_ps(c1, s1);
    for (int i = 0; i < 6; i++) {
        t[i * ldt] = c0[i];
        if (cols > 1)
            t[i * ldt + 1] = c1[i];
    }
}

/* ---- float64: 6 x 8 ---- */
#define VT __m256d
#define LOADV _mm256_load_pd
#define W 4
#define DECL(i) __m256d c##i##a = _mm256_setzero_pd(), c##i##b = _mm256_setzero_pd();
#define PREFETCH_C(i) _mm_prefetch((const char *)(c + (i) * rsc), _MM_HINT_T0);             \
    _mm_prefetch((const char *)(c + (i) * rsc + 7), _MM_HINT_T0);
#define FMA_ROW_AT(q, i) { const __m256d ai = _mm256_broadcast_sd(a + (q) * 6 + (i));         \
    c##i##a = _mm256_fmadd_pd(ai, b0, c##i##a); c##i##b = _mm256_fmadd_pd(ai, b1, c##i##b); }
#define STORE(i) _mm256_storeu_pd(c + (i) * rsc, c##i##a);                                    \
    _mm256_storeu_pd(c + (i) * rsc + 4, c##i##b);
#define STORE_ACC(i)                                                                          \
    _mm256_storeu_pd(c + (i) * rsc, _mm256_add_pd(_mm256_loadu_pd(c + (i) * rsc), c##i##a));  \
    _mm256_storeu_pd(c + (i) * rsc + 4,                                                       \
                     _mm256_add_pd(_mm256_loadu_pd(c + (i) * rsc + 4), c##i##b));
ATTR_AVX2 static void ukr_avx2_f64(int64_t k, const void *a_, const void *b_, void *c_,
                                   int64_t rsc, int accumulate)
{
    UKR_BODY_1STEP(double, 6, 2 * W)
}
#undef LOADV
#define LOADV _mm256_loadu_pd
#undef PREFETCH_B
#define PREFETCH_B(b) _mm_prefetch((const char *)((b) + BAHEAD * 2 * W), _MM_HINT_T1)
ATTR_AVX2 static void ukr_strided_b_avx2_f64(int64_t k, const void *a_, const void *b_,
                                             int64_t ldb, void *c_, int64_t rsc, int accumulate)
{
    UKR_BODY_1STEP(double, 6, ldb)
}
#undef PREFETCH_B
#define PREFETCH_B(b) ((void)0)
#undef VT
#undef LOADV
#undef W
#undef DECL
#undef PREFETCH_C
#undef FMA_ROW_AT
#undef STORE
#undef STORE_ACC

/* Row-major A into a 6-row float32 micro-panel, 8 k steps at a time: unpack/shuffle turn
 * the 6 x 8 block into columns (rows 0-3 as one xmm per column, rows 4-5 as a pair). */
ATTR_AVX2 static void pack_rows_avx2_f32(void *dst_, const void *src_, int64_t rsa, int64_t kb)
{
    float *dst = (float *)dst_;
    const float *s = (const float *)src_;
    int64_t p = 0;
    for (; p + 8 <= kb; p += 8) {
        const __m256 r0 = _mm256_loadu_ps(s + p), r1 = _mm256_loadu_ps(s + rsa + p);
        const __m256 r2 = _mm256_loadu_ps(s + 2 * rsa + p), r3 = _mm256_loadu_ps(s + 3 * rsa + p);
        const __m256 r4 = _mm256_loadu_ps(s + 4 * rsa + p), r5 = _mm256_loadu_ps(s + 5 * rsa + p);
        /* t0: r0/r1 interleaved, columns 0,1 | 4,5; t1: columns 2,3 | 6,7; likewise t2..t5 */
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
        /* u_q: rows 0-3 of column q (low lane) and q + 4 (high lane) */
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        float *d = dst + p * 6;
        const __m128 t4l = _mm256_castps256_ps128(t4), t4h = _mm256_extractf128_ps(t4, 1);
        const __m128 t5l = _mm256_castps256_ps128(t5), t5h = _mm256_extractf128_ps(t5, 1);
        _mm_storeu_ps(d + 0, _mm256_castps256_ps128(u0));
        _mm_storel_pi((__m64 *)(d + 4), t4l);
        _mm_storeu_ps(d + 6, _mm256_castps256_ps128(u1));
        _mm_storeh_pi((__m64 *)(d + 10), t4l);
        _mm_storeu_ps(d + 12, _mm256_castps256_ps128(u2));
        _mm_storel_pi((__m64 *)(d + 16), t5l);
        _mm_storeu_ps(d + 18, _mm256_castps256_ps128(u3));
        _mm_storeh_pi((__m64 *)(d + 22), t5l);
        _mm_storeu_ps(d + 24, _mm256_extractf128_ps(u0, 1));
        _mm_storel_pi((__m64 *)(d + 28), t4h);
        _mm_storeu_ps(d + 30, _mm256_extractf128_ps(u1, 1));
        _mm_storeh_pi((__m64 *)(d + 34), t4h);
        _mm_storeu_ps(d + 36, _mm256_extractf128_ps(u2, 1));
        _mm_storel_pi((__m64 *)(d + 40), t5h);
        _mm_storeu_ps(d + 42, _mm256_extractf128_ps(u3, 1));
        _mm_storeh_pi((__m64 *)(d + 46), t5h);
    }
    for (; p < kb; p++)
        for (int i = 0; i < 6; i++)
            dst[p * 6 + i] = s[i * rsa + p];
}

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
                                               skinny_axpy_avx2_f32, pack_rows_avx2_f32,
                                               ukr_half_avx2_f32, ukr_strided_b_avx2_f32,
                                               ukr_narrow_avx2_f32, 2, ukr_epi_avx2_f32,
                                               mv_panel_avx2_f32};
const asymo_gemm_kernel asymo_gemm_avx2_f64 = {6, 8, ukr_avx2_f64, dot_avx2_f64,
                                               skinny_axpy_avx2_f64, NULL, NULL,
                                               ukr_strided_b_avx2_f64};

#endif /* __x86_64__ */
