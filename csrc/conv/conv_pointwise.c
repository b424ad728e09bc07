/* Pointwise convolution in place (asymo/conv.h): the 16 x 16 indirect micro-kernel
 * (kernels/conv_indirect.h) reading runs of 16 pixels of the image where they are.
 *
 * Scratch layout (floats): the bias, mpad floats (mpad: out_channels rounded up to 16; zero
 * past out_channels, or all zero), then, unless the job brings them (apack), the packed
 * weights: mpad x K as mpad / 16 micro-panels of K x 16 (a[p * 16 + i], zero rows past
 * out_channels). */
#include "asymo/conv.h"
#include "asymo/isa.h"
#include "kernels/conv_indirect.h"

#include <stddef.h>

enum { MR = ASYMO_INDIRECT_MR16, NR = ASYMO_INDIRECT_NR };

/* A block of runs: B rows of at most this many bytes, at most this many runs */
enum { BLOCK_BYTES = 16 << 10, MAX_BLOCK_RUNS = 16 };

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t mpad_of(const asymo_conv_pointwise_job *job)
{
    return cdiv(job->out_channels, MR) * MR;
}

int asymo_conv_pointwise_supported(const asymo_conv_pointwise_job *job)
{
#if defined(__x86_64__)
    return (asymo_isa_supported() & (1u << ASYMO_ISA_AVX512)) && job->channels >= 1
           && job->out_channels >= 1 && job->pixels >= 1;
#else
    (void)job;
    return 0;
#endif
}

int64_t asymo_conv_pointwise_scratch(const asymo_conv_pointwise_job *job)
{
    const int64_t mpad = mpad_of(job);
    return mpad * job->channels + mpad;
}

int64_t asymo_conv_pointwise_tasks(const asymo_conv_pointwise_job *job)
{
    return cdiv(cdiv(job->pixels, NR), job->runs_per_task);
}

void asymo_conv_pointwise_offsets(const asymo_conv_pointwise_job *job, int64_t *off)
{
    for (int64_t p = 0; p < job->channels; p++)
        off[p] = p * job->pixels;
}

void asymo_conv_pointwise_prepare_task(int64_t t, void *job_)
{
    const asymo_conv_pointwise_job *job = (const asymo_conv_pointwise_job *)job_;
    const int64_t m = job->out_channels, k = job->channels, mpad = mpad_of(job);
    const float *b = (const float *)job->bias;
    float *bias = (float *)job->scratch;
    (void)t;
    for (int64_t i = 0; i < mpad; i++)
        bias[i] = b && i < m ? b[i] : 0.0f;
    if (job->apack)
        return;
    /* row by row: contiguous reads, writes within the panel (in L1) */
    const float *w = (const float *)job->weight;
    float *apack = bias + mpad;
    for (int64_t row = 0; row < mpad; row++) {
        float *a = apack + row / MR * MR * k + row % MR;
        if (row < m)
            for (int64_t p = 0; p < k; p++)
                a[p * MR] = w[row * k + p];
        else
            for (int64_t p = 0; p < k; p++)
                a[p * MR] = 0.0f;
    }
}

/* Runs [t * runs_per_task, ...) of pixels, in blocks of runs whose B rows (K x 64 bytes a run)
 * fit in about half of L1: each block against every micro-panel, run by run, so a tile's
 * rows of output are written as a block's contiguous stretch rather than 64 bytes apart by
 * every micro-panel in turn (a layer with 96 output channels wrote 96 streams otherwise). */
void asymo_conv_pointwise_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_conv_pointwise_job *job = (const asymo_conv_pointwise_job *)job_;
    /* (asymo_conv_pointwise_supported accepts a job only where the CPU has AVX-512) */
    const asymo_ukr_indirect16_fn ukr = asymo_ukr_indirect_avx512_f32;
    const int64_t m = job->out_channels, k = job->channels, n = job->pixels;
    const int64_t mpad = mpad_of(job);
    const float *bias = (const float *)job->scratch;
    const float *apack = job->apack ? (const float *)job->apack : bias + mpad;
    const float *x = (const float *)job->x;
    const float *res = (const float *)job->residual;
    float *y = (float *)job->y;
    const int64_t j0 = t * job->runs_per_task * NR, j1 = min64(n, j0 + job->runs_per_task * NR);
    int64_t block = BLOCK_BYTES / (k * NR * (int64_t)sizeof(float));
    block = (block < 1 ? 1 : block > MAX_BLOCK_RUNS ? MAX_BLOCK_RUNS : block) * NR;
    for (int64_t b0 = j0; b0 < j1; b0 += block) {
        const int64_t b1 = min64(j1, b0 + block);
        for (int64_t i0 = 0; i0 < m; i0 += MR) {
            const int rows = (int)min64(MR, m - i0);
            for (int64_t j = b0; j < b1; j += NR)
                ukr(k, apack + i0 * k, x + j, job->offsets, y + i0 * n + j, n, bias + i0,
                    res ? res + i0 * n + j : NULL, n, job->activation, rows,
                    (int)min64(NR, b1 - j));
        }
    }
#else
    (void)t;
    (void)job_;
#endif
}
