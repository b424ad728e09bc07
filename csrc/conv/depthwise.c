/* Direct depthwise convolution (see conv.h, asymo_dwconv_job).
 *
 * NCHW keeps each channel in its own plane, so vectorising along a row wastes lanes on small
 * planes (7x7, 14x14) and needs gathers for stride 2. Each task instead copies the input rows
 * it needs for ASYMO_DW_LANES channels into a zero-padded, channel-interleaved scratch
 * (rows x padded width x lanes); every tap is then one fused multiply-add over the lanes, for
 * any plane size, stride or dilation, and the results are written back to the NCHW planes.
 * The kernels are compiled per element type and ISA from depthwise_impl.h.
 *
 * The common MobileNet layers (3x3, stride 1 or 2, padding <= 1, multiplier 1) skip all of
 * that: a row of a plane already is a vector's worth of contiguous outputs once the plane is
 * 8 wide or more, and the direct kernels (conv/dwconv3x3.h) read the input once, straight
 * from the planes, with bias, residual and activation applied before the single store. */
#include "asymo/conv.h"
#include "asymo/isa.h"
#include "conv/dwconv3x3.h"
#include "conv/scratch.h"
#include "gemm/epilogue.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CONV_DTYPE_F32 = 0, CONV_DTYPE_F64 = 1 };

/* The vector helpers are static inline and never cross a library boundary: no ABI concern. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Alignment of the scratch: one vector of ASYMO_DW_LANES doubles. */
#define DW_ALIGN (ASYMO_DW_LANES * 8)

/* Scratch budget per task: the interleaved input block stays within L2. */
#define DW_SCRATCH_BYTES (192 * 1024)

static inline int64_t dmin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t dmax(int64_t a, int64_t b) { return a > b ? a : b; }

typedef struct {
    int64_t wp;       /* padded input width held in scratch */
    int64_t rows_in;  /* input rows for R output rows */
    int64_t elems;    /* scratch elements */
} dw_dims;

static inline dw_dims dw_layout(const asymo_conv_geometry *g, int64_t R)
{
    dw_dims d;
    const int64_t need_w = g->stride_w * (g->out_w - 1) + (g->kernel_w - 1) * g->dilation_w + 1;
    d.wp = dmax(need_w, g->pad_w + g->width);
    d.rows_in = (R - 1) * g->stride_h + (g->kernel_h - 1) * g->dilation_h + 1;
    /* + 1: room to round the scratch start up to DW_ALIGN */
    d.elems = (d.rows_in * d.wp + g->kernel_h * g->kernel_w + 1 + g->out_w + 1) * ASYMO_DW_LANES;
    return d;
}

#define IMPL_HEADER "depthwise_impl.h"
#define INSTANTIATE_AVX512
#include "conv/instantiate.h"

typedef struct {
    void (*block_f32)(const asymo_dwconv_job *, int64_t, int64_t, int64_t, int64_t, int64_t,
                      float *);
    void (*block_f64)(const asymo_dwconv_job *, int64_t, int64_t, int64_t, int64_t, int64_t,
                      double *);
    void (*rows_f32)(const asymo_dwconv_job *, int64_t, int64_t, int64_t, int64_t);
    void (*rows_f64)(const asymo_dwconv_job *, int64_t, int64_t, int64_t, int64_t);
} dw_kernels;

static const dw_kernels *select_dw_kernels(void)
{
    static const dw_kernels portable = {dw_block_f32_portable, dw_block_f64_portable,
                                        dw_plane_rows_f32_portable, dw_plane_rows_f64_portable};
#if defined(__x86_64__)
    static const dw_kernels avx2 = {dw_block_f32_avx2_fma, dw_block_f64_avx2_fma,
                                    dw_plane_rows_f32_avx2_fma, dw_plane_rows_f64_avx2_fma};
    static const dw_kernels avx512 = {dw_block_f32_avx512, dw_block_f64_avx512,
                                      dw_plane_rows_f32_avx512, dw_plane_rows_f64_avx512};
#endif
#if defined(__x86_64__)
    switch (asymo_conv_isa()) {
    case ASYMO_ISA_AVX512: return &avx512;
    case ASYMO_ISA_AVX2_FMA: return &avx2;
    default: break;
    }
#endif
    return &portable;
}

/* The direct 3x3 kernel for this layer, or NULL for the channel-interleaved one. */
static asymo_dw3x3_fn select_dw3x3(const asymo_dwconv_job *job)
{
    const int f64 = job->dtype == CONV_DTYPE_F64;
#if defined(__x86_64__)
    /* AVX-512 machines run the AVX2 kernel (the row loop is bound by memory, not vector
       width) except on small "same" planes, where the flat kernel's masked loads remove the
       per-row setup that dominated them, and at stride 2, where masked loads and two-source
       permutes split the input rows in registers instead of staging them
       (docs/conv-and-zoo.md) */
    switch (asymo_conv_isa()) {
    case ASYMO_ISA_AVX512:
        if (!f64 && asymo_dw3x3_flat_applies(job))
            return asymo_dw3x3_f32_avx512_flat;
        if (!f64 && asymo_dw3x3_s2_applies(job))
            return asymo_dw3x3_f32_avx512_s2;
        /* fall through */
    case ASYMO_ISA_AVX2_FMA: return f64 ? asymo_dw3x3_f64_avx2 : asymo_dw3x3_f32_avx2;
    default: break;
    }
#endif
    /* the plain-C kernel fills a vector only with rows of 8 or more outputs: on 7x7 planes
       the interleaved kernel was faster (bench/depthwise_3x3.py --isa portable) */
    if (job->geom.out_w < 8)
        return NULL;
    return f64 ? asymo_dw3x3_f64_portable : asymo_dw3x3_f32_portable;
}

/* y = act(y + residual) over rows [oy0, oy1) of channels [oc0, oc0 + nv) of image n, y
 * already holding conv + bias (the kernels below the 3x3 one take no residual: applying it
 * here, while the task's rows are still in cache, saves a second pass over the output). */
static void dw_residual_pass(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t nv,
                             int64_t oy0, int64_t oy1)
{
    /* the GEMM epilogue's row loops: one row per channel, its rows [oy0, oy1) contiguous */
    const int64_t plane = job->geom.out_h * job->geom.out_w, ow = job->geom.out_w;
    const int64_t es = job->dtype == CONV_DTYPE_F64 ? 8 : 4;
    gemm_epilogue_for(asymo_conv_isa(), job->dtype)(
        (char *)job->y + (n * job->y_image_stride + oc0 * plane + oy0 * ow) * es, plane, nv,
        (oy1 - oy0) * ow, NULL,
        (const char *)job->residual + (n * job->residual_image_stride + oc0 * plane
                                       + oy0 * ow) * es,
        plane, job->activation);
}

static void dw_interleaved_task(int64_t task, const asymo_dwconv_job *job);

/* A task's image, first output channel and output rows (see conv.h, asymo_dwconv_job). */
typedef struct {
    int64_t n, oc0, oy0, oy1;
} dw_task_range;

static dw_task_range dw_range(const asymo_dwconv_job *job, int64_t task)
{
    const int64_t oh = job->geom.out_h;
    const int64_t nrb = (oh + job->rows_per_task - 1) / job->rows_per_task;
    const int64_t ncb = (job->out_channels + ASYMO_DW_LANES - 1) / ASYMO_DW_LANES;
    const int64_t rb = task % nrb, cb = (task / nrb) % ncb;
    dw_task_range r = {task / (nrb * ncb), cb * ASYMO_DW_LANES, rb * job->rows_per_task, 0};
    r.oy1 = dmin(oh, r.oy0 + job->rows_per_task);
    return r;
}

void asymo_dwconv_task(int64_t task, void *ctx)
{
    const asymo_dwconv_job *job = (const asymo_dwconv_job *)ctx;
    const asymo_dw3x3_fn fn = job->method == 0 && asymo_dw3x3_applies(job)
                                  ? select_dw3x3(job) : NULL;
    if (fn) {
        const dw_task_range r = dw_range(job, task);
        fn(job, r.n, r.oc0, dmin(job->out_channels, r.oc0 + ASYMO_DW_LANES), r.oy0, r.oy1);
        return;
    }
    if (!job->residual) {
        dw_interleaved_task(task, job);
        return;
    }
    /* the other kernels: conv + bias first, then the residual and activation */
    asymo_dwconv_job inner = *job;
    inner.activation = ASYMO_ACT_NONE;
    inner.residual = NULL;
    dw_interleaved_task(task, &inner);
    const dw_task_range r = dw_range(job, task);
    dw_residual_pass(job, r.n, r.oc0, dmin(ASYMO_DW_LANES, job->out_channels - r.oc0), r.oy0,
                     r.oy1);
}

/* The channel-interleaved kernel (or the reference loop), bias and activation only. */
static void dw_interleaved_task(int64_t task, const asymo_dwconv_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    const dw_task_range r = dw_range(job, task);
    const int64_t n = r.n, oy_lo = r.oy0, oy_hi = r.oy1, oc0 = r.oc0;
    const int64_t nv = dmin(ASYMO_DW_LANES, job->out_channels - oc0);
    const dw_kernels *k = select_dw_kernels();
    const int f64 = job->dtype == CONV_DTYPE_F64;
    const size_t esize = f64 ? sizeof(double) : sizeof(float);

    /* output rows per pass so that the interleaved input block fits the scratch budget */
    const dw_dims one = dw_layout(g, 1);
    const int64_t per_row = g->stride_h * one.wp * ASYMO_DW_LANES * (int64_t)esize;
    int64_t step = dmax(1, ((int64_t)DW_SCRATCH_BYTES - one.elems * (int64_t)esize) / per_row + 1);
    step = dmin(step, oy_hi - oy_lo);
    /* per-thread scratch kept between tasks: a fresh 192 KB block per task came from mmap
       and faulted its pages in every time */
    void *scratch = NULL;
    if (job->method != 1 && step > 0)
        scratch = asymo_conv_scratch(ASYMO_SCRATCH_DEPTHWISE,
                                     (size_t)dw_layout(g, step).elems * esize);
    if (!scratch) {
        for (int64_t oc = oc0; oc < oc0 + nv; oc++) {
            if (f64)
                k->rows_f64(job, n, oc, oy_lo, oy_hi);
            else
                k->rows_f32(job, n, oc, oy_lo, oy_hi);
        }
        return;
    }
    for (int64_t oy = oy_lo; oy < oy_hi; oy += step) {
        const int64_t oy1 = dmin(oy_hi, oy + step);
        if (f64)
            k->block_f64(job, n, oc0, nv, oy, oy1, scratch);
        else
            k->block_f32(job, n, oc0, nv, oy, oy1, scratch);
    }
}
