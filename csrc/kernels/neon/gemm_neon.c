/* AArch64 Advanced SIMD (NEON) micro-kernels, float32 8 x 12 and float64 8 x 6, BLIS form.
 *
 * 24 of the 32 q registers hold the C tile (three vectors per row). Per k step the kernel loads
 * the 8 contiguous values of the packed A micro-panel as whole vectors (two for float32, four
 * for float64) and one row of the packed B sliver (three vectors), and multiplies by lanes of
 * A (fmla by element), so no broadcast loads are needed. NEON is mandatory on AArch64: no
 * target attribute. */
#if defined(__aarch64__)

#include <arm_neon.h>

#include "kernels/gemm_kernels.h"

#define REP4(X) X(0) X(1) X(2) X(3)
#define REP8(X) REP4(X) X(4) X(5) X(6) X(7)

/* ---- float32: 8 x 12 ---- */
#define DECL(i) float32x4_t c##i##0 = vdupq_n_f32(0.f), c##i##1 = c##i##0, c##i##2 = c##i##0;
#define FMA_LO(i) c##i##0 = vfmaq_laneq_f32(c##i##0, b0, a0, i);                               \
    c##i##1 = vfmaq_laneq_f32(c##i##1, b1, a0, i); c##i##2 = vfmaq_laneq_f32(c##i##2, b2, a0, i);
#define FMA_HI(i) c##i##0 = vfmaq_laneq_f32(c##i##0, b0, a1, (i) - 4);                       \
    c##i##1 = vfmaq_laneq_f32(c##i##1, b1, a1, (i) - 4);                                        \
    c##i##2 = vfmaq_laneq_f32(c##i##2, b2, a1, (i) - 4);
#define STORE(i) vst1q_f32(c + (i) * rsc, c##i##0); vst1q_f32(c + (i) * rsc + 4, c##i##1);       \
    vst1q_f32(c + (i) * rsc + 8, c##i##2);
#define STORE_ACC(i)                                                                            \
    vst1q_f32(c + (i) * rsc, vaddq_f32(vld1q_f32(c + (i) * rsc), c##i##0));                     \
    vst1q_f32(c + (i) * rsc + 4, vaddq_f32(vld1q_f32(c + (i) * rsc + 4), c##i##1));             \
    vst1q_f32(c + (i) * rsc + 8, vaddq_f32(vld1q_f32(c + (i) * rsc + 8), c##i##2));
static void ukr_neon_f32(int64_t k, const void *a_, const void *b_, void *c_, int64_t rsc,
                         int accumulate)
{
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
    float *c = (float *)c_;
    REP8(DECL)
    for (int64_t p = 0; p < k; p++) {
        const float32x4_t a0 = vld1q_f32(a), a1 = vld1q_f32(a + 4);
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8);
        __builtin_prefetch(a + 64);
        FMA_LO(0) FMA_LO(1) FMA_LO(2) FMA_LO(3)
        FMA_HI(4) FMA_HI(5) FMA_HI(6) FMA_HI(7)
        a += 8;
        b += 12;
    }
    if (accumulate) {
        REP8(STORE_ACC)
    } else {
        REP8(STORE)
    }
}
#undef DECL
#undef STORE
#undef STORE_ACC

/* ---- float64: 8 x 6 ---- */
#define DECL(i) float64x2_t c##i##0 = vdupq_n_f64(0.0), c##i##1 = c##i##0, c##i##2 = c##i##0;
/* row i uses lane (i % 2) of A vector i / 2 */
#define FMA_ROW(i, av, lane) c##i##0 = vfmaq_laneq_f64(c##i##0, b0, av, lane);                 \
    c##i##1 = vfmaq_laneq_f64(c##i##1, b1, av, lane); c##i##2 = vfmaq_laneq_f64(c##i##2, b2, av, lane);
#define STORE(i) vst1q_f64(c + (i) * rsc, c##i##0); vst1q_f64(c + (i) * rsc + 2, c##i##1);       \
    vst1q_f64(c + (i) * rsc + 4, c##i##2);
#define STORE_ACC(i)                                                                            \
    vst1q_f64(c + (i) * rsc, vaddq_f64(vld1q_f64(c + (i) * rsc), c##i##0));                     \
    vst1q_f64(c + (i) * rsc + 2, vaddq_f64(vld1q_f64(c + (i) * rsc + 2), c##i##1));             \
    vst1q_f64(c + (i) * rsc + 4, vaddq_f64(vld1q_f64(c + (i) * rsc + 4), c##i##2));
static void ukr_neon_f64(int64_t k, const void *a_, const void *b_, void *c_, int64_t rsc,
                         int accumulate)
{
    const double *a = (const double *)a_;
    const double *b = (const double *)b_;
    double *c = (double *)c_;
    REP8(DECL)
    for (int64_t p = 0; p < k; p++) {
        const float64x2_t a0 = vld1q_f64(a), a1 = vld1q_f64(a + 2), a2 = vld1q_f64(a + 4),
                          a3 = vld1q_f64(a + 6);
        const float64x2_t b0 = vld1q_f64(b), b1 = vld1q_f64(b + 2), b2 = vld1q_f64(b + 4);
        __builtin_prefetch(a + 32);
        FMA_ROW(0, a0, 0) FMA_ROW(1, a0, 1) FMA_ROW(2, a1, 0) FMA_ROW(3, a1, 1)
        FMA_ROW(4, a2, 0) FMA_ROW(5, a2, 1) FMA_ROW(6, a3, 0) FMA_ROW(7, a3, 1)
        a += 8;
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
                                               skinny_axpy_neon_f32, NULL,
                                               .mv_panel = mv_panel_neon_f32};
const asymo_gemm_kernel asymo_gemm_neon_f64 = {8, 6, ukr_neon_f64, skinny_dot_neon_f64,
                                               skinny_axpy_neon_f64, NULL};

#endif /* __aarch64__ */
