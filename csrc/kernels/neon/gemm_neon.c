/* AArch64 Advanced SIMD (NEON) micro-kernels, float32 8 x 12 and float64 8 x 6.
 *
 * 24 of the 32 q registers hold the C tile (three vectors per row); per k step the kernel loads
 * one row of the packed B sliver (three vectors) and broadcasts (ld1r) one value from each of
 * the 8 rows of the packed A block. NEON is mandatory on AArch64, so no target attribute is
 * required. */
#if defined(__aarch64__)

#include <arm_neon.h>

#include "kernels/gemm_kernels.h"

#define REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* ---- float32: 8 x 12 ---- */
#define DECL(i) float32x4_t c##i##0 = vdupq_n_f32(0.f), c##i##1 = c##i##0, c##i##2 = c##i##0;
#define FMA_ROW(i) { const float32x4_t ai = vld1q_dup_f32(a + (i) * lda);                      \
    c##i##0 = vfmaq_f32(c##i##0, b0, ai); c##i##1 = vfmaq_f32(c##i##1, b1, ai);                 \
    c##i##2 = vfmaq_f32(c##i##2, b2, ai); }
#define STORE(i) vst1q_f32(c + (i) * rsc, c##i##0); vst1q_f32(c + (i) * rsc + 4, c##i##1);       \
    vst1q_f32(c + (i) * rsc + 8, c##i##2);
#define STORE_ACC(i)                                                                            \
    vst1q_f32(c + (i) * rsc, vaddq_f32(vld1q_f32(c + (i) * rsc), c##i##0));                     \
    vst1q_f32(c + (i) * rsc + 4, vaddq_f32(vld1q_f32(c + (i) * rsc + 4), c##i##1));             \
    vst1q_f32(c + (i) * rsc + 8, vaddq_f32(vld1q_f32(c + (i) * rsc + 8), c##i##2));
static void ukr_neon_f32(int64_t k, const void *a_, int64_t lda, const void *b_, void *c_,
                         int64_t rsc, int accumulate)
{
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
    float *c = (float *)c_;
    REP8(DECL)
    for (int64_t p = 0; p < k; p++) {
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8);
        REP8(FMA_ROW)
        a += 1;
        b += 12;
    }
    if (accumulate) {
        REP8(STORE_ACC)
    } else {
        REP8(STORE)
    }
}
#undef DECL
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

/* ---- float64: 8 x 6 ---- */
#define DECL(i) float64x2_t c##i##0 = vdupq_n_f64(0.0), c##i##1 = c##i##0, c##i##2 = c##i##0;
#define FMA_ROW(i) { const float64x2_t ai = vld1q_dup_f64(a + (i) * lda);                      \
    c##i##0 = vfmaq_f64(c##i##0, b0, ai); c##i##1 = vfmaq_f64(c##i##1, b1, ai);                 \
    c##i##2 = vfmaq_f64(c##i##2, b2, ai); }
#define STORE(i) vst1q_f64(c + (i) * rsc, c##i##0); vst1q_f64(c + (i) * rsc + 2, c##i##1);       \
    vst1q_f64(c + (i) * rsc + 4, c##i##2);
#define STORE_ACC(i)                                                                            \
    vst1q_f64(c + (i) * rsc, vaddq_f64(vld1q_f64(c + (i) * rsc), c##i##0));                     \
    vst1q_f64(c + (i) * rsc + 2, vaddq_f64(vld1q_f64(c + (i) * rsc + 2), c##i##1));             \
    vst1q_f64(c + (i) * rsc + 4, vaddq_f64(vld1q_f64(c + (i) * rsc + 4), c##i##2));
static void ukr_neon_f64(int64_t k, const void *a_, int64_t lda, const void *b_, void *c_,
                         int64_t rsc, int accumulate)
{
    const double *a = (const double *)a_;
    const double *b = (const double *)b_;
    double *c = (double *)c_;
    REP8(DECL)
    for (int64_t p = 0; p < k; p++) {
        const float64x2_t b0 = vld1q_f64(b), b1 = vld1q_f64(b + 2), b2 = vld1q_f64(b + 4);
        REP8(FMA_ROW)
        a += 1;
        b += 6;
    }
    if (accumulate) {
        REP8(STORE_ACC)
    } else {
        REP8(STORE)
    }
}
#undef DECL
#undef FMA_ROW
#undef STORE
#undef STORE_ACC

#define SK_T float
#define SK_SUFFIX neon_f32
#define SK_LANES 16
#define SK_ATTR
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T double
#define SK_SUFFIX neon_f64
#define SK_LANES 8
#define SK_ATTR
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

const asymo_gemm_kernel asymo_gemm_neon_f32 = {8, 12, ukr_neon_f32, skinny_dot_neon_f32,
                                               skinny_axpy_neon_f32};
const asymo_gemm_kernel asymo_gemm_neon_f64 = {8, 6, ukr_neon_f64, skinny_dot_neon_f64,
                                               skinny_axpy_neon_f64};

#endif /* __aarch64__ */
