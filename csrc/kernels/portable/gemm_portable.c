/* Portable C micro-kernels: plain loops over a small register tile (packed A micro-panel,
 * a[p * mr + i]; packed B sliver, b[p * nr + j]) that any C compiler vectorizes for the
 * baseline ISA. Used where no SIMD family is available and as the
 * reference the ISA kernels are tested against. */
#include "kernels/gemm_kernels.h"

#define PORT_MR 4
#define PORT_NR_F32 8
#define PORT_NR_F64 4

#define DEFINE_PORTABLE_UKR(T, SUFFIX, NR)                                                    \
    static void ukr_portable_##SUFFIX(int64_t k, const void *a_, const void *b_, void *c_,    \
                                      int64_t rsc, int accumulate)                            \
    {                                                                                         \
        const T *a = (const T *)a_;                                                          \
        const T *b = (const T *)b_;                                                          \
        T *c = (T *)c_;                                                                       \
        T ab[PORT_MR][NR] = {{0}};                                                            \
        for (int64_t p = 0; p < k; p++) {                                                     \
            for (int i = 0; i < PORT_MR; i++)                                                 \
                for (int j = 0; j < NR; j++)                                                  \
                    ab[i][j] += a[i] * b[j];                                                  \
            a += PORT_MR;                                                                     \
            b += NR;                                                                          \
        }                                                                                     \
        for (int i = 0; i < PORT_MR; i++)                                                     \
            for (int j = 0; j < NR; j++)                                                      \
                c[i * rsc + j] = accumulate ? c[i * rsc + j] + ab[i][j] : ab[i][j];           \
    }

DEFINE_PORTABLE_UKR(float, f32, PORT_NR_F32)
DEFINE_PORTABLE_UKR(double, f64, PORT_NR_F64)

#define SK_T float
#define SK_SUFFIX portable_f32
#define SK_LANES 16
#define SK_ATTR
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

#define SK_T double
#define SK_SUFFIX portable_f64
#define SK_LANES 8
#define SK_ATTR
#include "kernels/skinny_impl.h"
#undef SK_T
#undef SK_SUFFIX
#undef SK_LANES
#undef SK_ATTR

const asymo_gemm_kernel asymo_gemm_portable_f32 = {
    PORT_MR, PORT_NR_F32, ukr_portable_f32, skinny_dot_portable_f32, skinny_axpy_portable_f32, NULL,
    .mv_panel = mv_panel_portable_f32};
const asymo_gemm_kernel asymo_gemm_portable_f64 = {
    PORT_MR, PORT_NR_F64, ukr_portable_f64, skinny_dot_portable_f64, skinny_axpy_portable_f64, NULL};
