/* Indirect convolution (asymo/conv.h): stride-phase planes of the padded image and an
 * indirect-B micro-kernel (kernels/conv_indirect.h) instead of B panels packed from the
 * image. For a stem (3 input channels, K = 27 or 147, 32 or 64 output channels) the packed
 * B sliver serves only 6 to 11 micro-panels, and gathering it cost as much as a fifth of the
 * layer; here each image pixel is copied once, into its phase plane.
 *
 * Scratch layout (floats): the packed weights, mpad x K as mpad / mr micro-panels of K x mr
 * (a[p * mr + i], zero rows past out_channels; mr = 6, or 16 for a wide job, which also
 * keeps the bias there, mpad floats, zero past out_channels), then channels x s x s phase
 * planes of
 * hq x wq, each row padded so that a 16-wide run starting at any output column below out_w
 * stays inside it. */
#include "asymo/conv.h"
#include "asymo/gemm.h"
#include "asymo/isa.h"
#include "conv/padded_plane.h"
#include "gemm/epilogue.h"
#include "kernels/conv_indirect.h"

#include <string.h>

enum { MR = ASYMO_INDIRECT_MR, NR = ASYMO_INDIRECT_NR };

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct {
    int64_t s, k, mr, mpad, hq, wq, plane, apack; /* apack: floats before the planes */
} layout;

static layout layout_of(const asymo_conv_indirect_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    layout L;
    L.s = g->stride_h;
    L.k = g->channels * g->kernel_h * g->kernel_w;
    L.mr = job->wide ? ASYMO_INDIRECT_MR16 : MR;
    L.mpad = cdiv(job->out_channels, L.mr) * L.mr;
    L.hq = g->out_h + (g->kernel_h - 1) / L.s;
    L.wq = cdiv(g->out_w, NR) * NR + (g->kernel_w - 1) / L.s;
    L.plane = L.hq * L.wq;
    /* the planes start 64-byte aligned */
    L.apack = cdiv(L.mpad * L.k + (job->wide ? L.mpad : 0), 16) * 16;
    return L;
}

/* The kernel a task runs: AVX2 wherever the CPU has it, whatever asymo_conv_set_isa selects
 * now (a plan made while AVX2 was selected stays correct after a test forces another ISA),
 * else the portable loop: a task never skips its work. */
static asymo_ukr_indirect_fn kernel(void)
{
#if defined(__x86_64__)
    if (asymo_isa_supported() & (1u << ASYMO_ISA_AVX2_FMA))
        return asymo_ukr_indirect_avx2_f32;
#endif
    return asymo_ukr_indirect_portable_f32;
}

/* New plans take the path only while the selected kernels are AVX2 or AVX-512 (the portable
 * loop is for the case above, not a speed-up) */
static int selected(void)
{
    const int isa = asymo_conv_isa();
    return (isa == ASYMO_ISA_AVX2_FMA || isa == ASYMO_ISA_AVX512)
           && (asymo_isa_supported() & (1u << ASYMO_ISA_AVX2_FMA));
}

int asymo_conv_indirect_supported(const asymo_conv_indirect_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t k = g->channels * g->kernel_h * g->kernel_w;
    /* a wide job (16-row panels) needs the AVX-512 kernel: there is no other */
    if (job->wide && !(asymo_isa_supported() & (1u << ASYMO_ISA_AVX512)))
        return 0;
    return selected() && g->stride_h == g->stride_w && (g->stride_h == 1 || g->stride_h == 2)
           && g->dilation_h == 1 && g->dilation_w == 1 && k >= 1 && k <= ASYMO_INDIRECT_MAX_K
           && job->out_channels >= 1 && g->out_h >= 1 && g->out_w >= 1;
}

int64_t asymo_conv_indirect_scratch(const asymo_conv_indirect_job *job)
{
    const layout L = layout_of(job);
    return L.apack + job->geom.channels * L.s * L.s * L.plane;
}

int64_t asymo_conv_indirect_prepare_tasks(const asymo_conv_indirect_job *job)
{
    const int64_t s = job->geom.stride_h;
    return job->geom.channels * s * s + 1;
}

/* Task t < channels * s * s: phase plane t (channel t / s^2, phase rows py = t / s % s,
 * columns px = t % s); the last task: the weights' micro-panels. */
void asymo_conv_indirect_prepare_task(int64_t t, void *job_)
{
    const asymo_conv_indirect_job *job = (const asymo_conv_indirect_job *)job_;
    const asymo_conv_geometry *g = &job->geom;
    const layout L = layout_of(job);
    float *scratch = (float *)job->scratch;
    const int64_t nplanes = g->channels * L.s * L.s;
    if (t == nplanes) {
        const int64_t m = job->out_channels;
        asymo_conv_pack_panels((const float *)job->weight, m, L.k, L.mr, scratch);
        if (job->wide) {
            float *bias = scratch + L.mpad * L.k;
            for (int64_t i = 0; i < L.mpad; i++)
                bias[i] = job->bias && i < m ? ((const float *)job->bias)[i] : 0.0f;
        }
        return;
    }
    const int64_t c = t / (L.s * L.s), py = t / L.s % L.s, px = t % L.s;
    asymo_copy_plane_padded(scratch + L.apack + t * L.plane, L.hq, L.wq,
                            (const float *)job->x + c * g->height * g->width, g->height,
                            g->width, L.s, py - g->pad_h, px - g->pad_w);
}

void asymo_conv_pack_panels(const float *w, int64_t m, int64_t k, int64_t mr, float *panels)
{
    /* row by row: contiguous reads, writes within one panel */
    const int64_t mpad = cdiv(m, mr) * mr;
    for (int64_t row = 0; row < mpad; row++) {
        float *a = panels + row / mr * mr * k + row % mr;
        if (row < m)
            for (int64_t p = 0; p < k; p++)
                a[p * mr] = w[row * k + p];
        else
            for (int64_t p = 0; p < k; p++)
                a[p * mr] = 0.0f;
    }
}

void asymo_conv_indirect_offsets(const asymo_conv_indirect_job *job, int64_t *off)
{
    const asymo_conv_geometry *g = &job->geom;
    const layout L = layout_of(job);
    for (int64_t p = 0; p < L.k; p++) {
        const int64_t kx = p % g->kernel_w, ky = p / g->kernel_w % g->kernel_h;
        const int64_t c = p / (g->kernel_w * g->kernel_h);
        off[p] = ((c * L.s + ky % L.s) * L.s + kx % L.s) * L.plane + ky / L.s * L.wq + kx / L.s;
    }
}

#if defined(__x86_64__)
/* A wide job's task: per output row, each 16-wide run of pixels against every 16-row
 * micro-panel, bias and activation in the kernel, partial runs and panels stored masked. */
static void indirect_task_wide(const asymo_conv_indirect_job *job, const layout *L,
                               int64_t y0, int64_t y1)
{
    const asymo_conv_geometry *g = &job->geom;
    /* (asymo_conv_indirect_supported accepts a wide job only where the CPU has AVX-512) */
    const asymo_ukr_indirect16_fn ukr = asymo_ukr_indirect_avx512_f32;
    const int64_t m = job->out_channels, oh = g->out_h, ow = g->out_w, ohw = oh * ow;
    const int64_t mr = ASYMO_INDIRECT_MR16;
    const float *apack = (const float *)job->scratch;
    const float *bias = apack + L->mpad * L->k;
    const float *planes = apack + L->apack;
    float *y = (float *)job->y;
    for (int64_t oy = y0; oy < y1; oy++)
        for (int64_t ox0 = 0; ox0 < ow; ox0 += NR) {
            const int cols = (int)min64(NR, ow - ox0);
            const float *b = planes + oy * L->wq + ox0;
            for (int64_t i0 = 0; i0 < m; i0 += mr)
                ukr(L->k, apack + i0 * L->k, b, job->offsets, y + i0 * ohw + oy * ow + ox0, ohw,
                    bias + i0, NULL, 0, job->activation, (int)min64(mr, m - i0), cols);
        }
}
#endif

/* Output rows [t * rows_per_task, ...) of every output channel: per row, each 16-wide run of
 * pixels against every micro-panel of weights (the run's B rows stay in L1 across them), then
 * bias and activation over the row. */
void asymo_conv_indirect_task(int64_t t, void *job_)
{
    const asymo_conv_indirect_job *job = (const asymo_conv_indirect_job *)job_;
#if defined(__x86_64__)
    if (job->wide) {
        const layout L = layout_of(job);
        const int64_t y0 = t * job->rows_per_task;
        indirect_task_wide(job, &L, y0, min64(job->geom.out_h, y0 + job->rows_per_task));
        return;
    }
#endif
    const asymo_conv_geometry *g = &job->geom;
    const asymo_ukr_indirect_fn ukr = kernel();
    const layout L = layout_of(job);
    const int64_t m = job->out_channels, oh = g->out_h, ow = g->out_w, ohw = oh * ow;
    const int64_t y0 = t * job->rows_per_task, y1 = min64(oh, y0 + job->rows_per_task);
    const float *apack = (const float *)job->scratch;
    const float *planes = apack + L.apack;
    float *y = (float *)job->y;
    const int64_t *off = job->offsets;
    const gemm_epilogue_fn epilogue = job->bias || job->activation
                                      ? gemm_epilogue_for(asymo_conv_isa(), ASYMO_DTYPE_F32) : NULL;
    float tile[MR * NR] __attribute__((aligned(64)));
    for (int64_t oy = y0; oy < y1; oy++) {
        for (int64_t ox0 = 0; ox0 < ow; ox0 += NR) {
            const int64_t cols = min64(NR, ow - ox0);
            const float *b = planes + oy * L.wq + ox0;
            for (int64_t i0 = 0; i0 < m; i0 += MR) {
                const int64_t rows = min64(MR, m - i0);
                float *c = y + i0 * ohw + oy * ow + ox0;
                if (rows == MR && cols == NR) {
                    ukr(L.k, apack + i0 * L.k, b, off, c, ohw);
                    continue;
                }
                ukr(L.k, apack + i0 * L.k, b, off, tile, NR);
                for (int64_t i = 0; i < rows; i++)
                    memcpy(c + i * ohw, tile + i * NR, (size_t)cols * sizeof(float));
            }
        }
        if (epilogue)
            epilogue(y + oy * ow, ohw, m, ow, job->bias, NULL, 0, job->activation);
    }
}
