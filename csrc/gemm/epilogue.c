/* The GEMM epilogue (asymo_gemm_args.row_bias / residual / activation): a block of C, right
 * after its last K panel, becomes act(C + bias[i] + residual[i, j]). One row at a time, the
 * loop compiled per ISA so it runs on the vector unit the kernels use; the clamps are written
 * so that NaN propagates, as in numpy.maximum and torch.relu. */
#include "gemm/gemm_internal.h"

#include "asymo/isa.h"

#define EPILOGUE_ROW(T)                                                                      \
    if (r) {                                                                                 \
        if (act == 1) {                                                                      \
            for (int64_t j = 0; j < n; j++) {                                                \
                const T v = c[j] + bias + r[j];                                              \
                c[j] = v < (T)0 ? (T)0 : v;                                                  \
            }                                                                                \
        } else if (act == 2) {                                                               \
            for (int64_t j = 0; j < n; j++) {                                                \
                T v = c[j] + bias + r[j];                                                    \
                v = v < (T)0 ? (T)0 : v;                                                     \
                c[j] = v > (T)6 ? (T)6 : v;                                                  \
            }                                                                                \
        } else {                                                                             \
            for (int64_t j = 0; j < n; j++)                                                  \
                c[j] = c[j] + bias + r[j];                                                   \
        }                                                                                    \
    } else if (act == 1) {                                                                   \
        for (int64_t j = 0; j < n; j++) {                                                    \
            const T v = c[j] + bias;                                                         \
            c[j] = v < (T)0 ? (T)0 : v;                                                      \
        }                                                                                    \
    } else if (act == 2) {                                                                   \
        for (int64_t j = 0; j < n; j++) {                                                    \
            T v = c[j] + bias;                                                               \
            v = v < (T)0 ? (T)0 : v;                                                         \
            c[j] = v > (T)6 ? (T)6 : v;                                                      \
        }                                                                                    \
    } else {                                                                                 \
        for (int64_t j = 0; j < n; j++)                                                      \
            c[j] += bias;                                                                    \
    }

#define DEFINE_EPILOGUE(ATTR, ISA)                                                           \
    ATTR static void epilogue_f32_##ISA(void *c_, int64_t rsc, int64_t rows, int64_t n,      \
                                        const void *bias_, const void *res_, int64_t rsr,    \
                                        int act)                                             \
    {                                                                                        \
        for (int64_t i = 0; i < rows; i++) {                                                 \
            float *restrict c = (float *)c_ + i * rsc;                                       \
            const float *restrict r = res_ ? (const float *)res_ + i * rsr : NULL;           \
            const float bias = bias_ ? ((const float *)bias_)[i] : 0.0f;                     \
            EPILOGUE_ROW(float)                                                              \
        }                                                                                    \
    }                                                                                        \
    ATTR static void epilogue_f64_##ISA(void *c_, int64_t rsc, int64_t rows, int64_t n,      \
                                        const void *bias_, const void *res_, int64_t rsr,    \
                                        int act)                                             \
    {                                                                                        \
        for (int64_t i = 0; i < rows; i++) {                                                 \
            double *restrict c = (double *)c_ + i * rsc;                                     \
            const double *restrict r = res_ ? (const double *)res_ + i * rsr : NULL;         \
            const double bias = bias_ ? ((const double *)bias_)[i] : 0.0;                    \
            EPILOGUE_ROW(double)                                                             \
        }                                                                                    \
    }

DEFINE_EPILOGUE(, portable)
#if defined(__x86_64__)
DEFINE_EPILOGUE(__attribute__((target("avx2,fma"))), avx2)
#endif

gemm_epilogue_fn gemm_epilogue_for(int isa, int dtype)
{
#if defined(__x86_64__)
    /* AVX-512 plans use the AVX2 loop: the pass is bound by memory, not vector width */
    if (isa == ASYMO_ISA_AVX2_FMA || isa == ASYMO_ISA_AVX512)
        return dtype == ASYMO_DTYPE_F64 ? epilogue_f64_avx2 : epilogue_f32_avx2;
#else
    (void)isa;
#endif
    return dtype == ASYMO_DTYPE_F64 ? epilogue_f64_portable : epilogue_f32_portable;
}
