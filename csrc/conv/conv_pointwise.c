/* Pointwise convolution in place (asymo/conv.h), in its two forms: runs (the 16 x 16
 * indirect micro-kernel, kernels/conv_indirect.h, reading runs of 16 pixels of the image where
 * they are) and rows (the pixel-row micro-kernels, kernels/conv_pointwise.h). Scratch (when
 * the job brings no apack): the weights' micro-panels, out_channels (rounded up to
 * panel_rows) x K floats. */
#include "asymo/conv.h"
#include "asymo/isa.h"
#include "kernels/conv_indirect.h"
#include "kernels/conv_pointwise.h"

#include <stddef.h>

enum { MR = ASYMO_INDIRECT_MR16, NR = ASYMO_INDIRECT_NR };

/* A block of runs: B rows of at most this many bytes, at most this many runs */
enum { BLOCK_BYTES = 16 << 10, MAX_BLOCK_RUNS = 16 };

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

const asymo_pixel_rows_family *asymo_pixel_rows_for(int cb, int taps_stride)
{
#if defined(__x86_64__)
    if (taps_stride < 0 || taps_stride > 2)
        return NULL;
    const unsigned isas = asymo_isa_supported();
    const asymo_pixel_rows_family *t[2] = {NULL, NULL};
    if (isas & (1u << ASYMO_ISA_AVX512))
        t[0] = taps_stride ? asymo_taps_rows_avx512_f32[taps_stride - 1]
                           : asymo_pixel_rows_avx512_f32;
    if (isas & (1u << ASYMO_ISA_AVX2_FMA))
        t[1] = taps_stride ? asymo_taps_rows_avx2_f32[taps_stride - 1]
                           : asymo_pixel_rows_avx2_f32;
    for (int f = 0; f < 2; f++)
        for (int i = 0; t[f] && i < 3; i++)
            if (t[f][i].cb == cb)
                return &t[f][i];
#else
    (void)cb;
    (void)taps_stride;
#endif
    return NULL;
}

#if defined(__x86_64__)
/* The rows form's kernels for the job's panel width, or NULL */
static const asymo_pixel_rows_family *rows_family(const asymo_conv_pointwise_job *job)
{
    return asymo_pixel_rows_for((int)job->panel_rows, 0);
}
#endif

int asymo_conv_pointwise_supported(const asymo_conv_pointwise_job *job)
{
#if defined(__x86_64__)
    if (job->channels < 1 || job->out_channels < 1 || job->pixels < 1)
        return 0;
    /* (the rows form on the kernels of the convolutions' ISA: AVX-512 or AVX2) */
    if (job->form == ASYMO_POINTWISE_ROWS)
        return rows_family(job) != NULL;
    return (asymo_isa_supported() & (1u << ASYMO_ISA_AVX512))
           && job->form == ASYMO_POINTWISE_RUNS && job->panel_rows == MR
           && job->out_channels % MR == 0;
#else
    (void)job;
    return 0;
#endif
}

int64_t asymo_conv_pointwise_scratch(const asymo_conv_pointwise_job *job)
{
    return cdiv(job->out_channels, job->panel_rows) * job->panel_rows * job->channels;
}

int64_t asymo_conv_pointwise_tiles(const asymo_conv_pointwise_job *job)
{
#if defined(__x86_64__)
    const asymo_pixel_rows_family *f = rows_family(job);
    return f ? cdiv(job->pixels, f->max_rows) : 0;
#else
    (void)job;
    return 0;
#endif
}

#if defined(__x86_64__)
/* Rows form: the image as one output row of all the pixels, each read in place (ldx apart
 * per input channel), cut into tiles of the family's rows. */
static asymo_pixel_rows_layer rows_layer(const asymo_conv_pointwise_job *job,
                                         const asymo_pixel_rows_family *f)
{
    const asymo_pixel_rows_layer L = {
        job->channels, job->out_channels, 1, job->pixels, cdiv(job->pixels, f->max_rows),
        job->panels_per_task, job->tiles_per_task, (const float *)job->x, 0, 1, job->pixels,
        NULL, (const float *)(job->apack ? job->apack : job->scratch),
        (const float *)job->bias, (const float *)job->residual, (float *)job->y,
        job->activation};
    return L;
}
#endif

int64_t asymo_conv_pointwise_tasks(const asymo_conv_pointwise_job *job)
{
    /* (a per-task count left at zero counts as one) */
    if (job->form == ASYMO_POINTWISE_ROWS) {
#if defined(__x86_64__)
        const asymo_pixel_rows_family *f = rows_family(job);
        if (f) {
            const asymo_pixel_rows_layer L = rows_layer(job, f);
            return asymo_pixel_rows_tasks(f, &L);
        }
#endif
        return 0;
    }
    return cdiv(cdiv(job->pixels, NR), max64(1, job->runs_per_task));
}

void asymo_conv_pointwise_offsets(const asymo_conv_pointwise_job *job, int64_t *off)
{
    for (int64_t p = 0; p < job->channels; p++)
        off[p] = p * job->pixels;
}

void asymo_conv_pointwise_prepare_task(int64_t t, void *job_)
{
    const asymo_conv_pointwise_job *job = (const asymo_conv_pointwise_job *)job_;
    (void)t;
    asymo_conv_pack_panels((const float *)job->weight, job->out_channels, job->channels,
                           job->panel_rows, (float *)job->scratch);
}


/* Runs form: runs [t * runs_per_task, ...) of pixels, in blocks of runs whose B rows (K x 64
 * bytes a run) fit in about half of L1: each block against every micro-panel, run by run, so
 * a tile's rows of output are written as a block's contiguous stretch rather than 64 bytes
 * apart by every micro-panel in turn (a layer with 96 output channels wrote 96 streams
 * otherwise). */
void asymo_conv_pointwise_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_conv_pointwise_job *job = (const asymo_conv_pointwise_job *)job_;
    if (job->form == ASYMO_POINTWISE_ROWS) {
        /* (a tile's inputs are k values from one or two cache lines each) */
        const asymo_pixel_rows_family *f = rows_family(job);
        const asymo_pixel_rows_layer L = rows_layer(job, f);
        asymo_pixel_rows_task(f, t, &L);
        return;
    }
    /* (asymo_conv_pointwise_supported accepts a job only where the CPU has AVX-512) */
    const asymo_ukr_indirect16_fn ukr = asymo_ukr_indirect_avx512_f32;
    const int64_t m = job->out_channels, k = job->channels, n = job->pixels;
    const float *bias = (const float *)job->bias;
    const float *apack = (const float *)(job->apack ? job->apack : job->scratch);
    const float *x = (const float *)job->x;
    const float *res = (const float *)job->residual;
    float *y = (float *)job->y;
    const int64_t rpt = max64(1, job->runs_per_task);
    const int64_t j0 = t * rpt * NR, j1 = min64(n, j0 + rpt * NR);
    int64_t block = BLOCK_BYTES / (k * NR * (int64_t)sizeof(float));
    block = (block < 1 ? 1 : block > MAX_BLOCK_RUNS ? MAX_BLOCK_RUNS : block) * NR;
    for (int64_t b0 = j0; b0 < j1; b0 += block) {
        const int64_t b1 = min64(j1, b0 + block);
        for (int64_t i0 = 0; i0 < m; i0 += MR)
            for (int64_t j = b0; j < b1; j += NR)
                ukr(k, apack + i0 * k, x + j, job->offsets, y + i0 * n + j, n,
                    bias ? bias + i0 : NULL, res ? res + i0 * n + j : NULL, n,
                    job->activation, MR, (int)min64(NR, b1 - j));
    }
#else
    (void)t;
    (void)job_;
#endif
}
