/* Portable indirect-B micro-kernel, float32 6 x 16 (kernels/conv_indirect.h): the loop the AVX2
 * kernel vectorises, for a task whose plan was made while the AVX2 kernels were selected and
 * that runs on a CPU or under a setting without them. */
#include "kernels/conv_indirect.h"

static void ukr_indirect_portable_f32(int64_t k, const float *a, const float *b,
                                      const int64_t *off, float *c, int64_t rsc)
{
    float acc[ASYMO_INDIRECT_MR][ASYMO_INDIRECT_NR] = {{0}};
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + off[p];
        for (int i = 0; i < ASYMO_INDIRECT_MR; i++)
            for (int j = 0; j < ASYMO_INDIRECT_NR; j++)
                acc[i][j] += a[p * ASYMO_INDIRECT_MR + i] * bp[j];
    }
    for (int i = 0; i < ASYMO_INDIRECT_MR; i++)
        for (int j = 0; j < ASYMO_INDIRECT_NR; j++)
            c[i * rsc + j] = acc[i][j];
}

const asymo_ukr_indirect_fn asymo_ukr_indirect_portable_f32 = ukr_indirect_portable_f32;
