/* Direct 3x3 depthwise kernels on NCHW planes (the common MobileNet case), shared by the
 * depthwise frame (conv/depthwise.c) and the per-ISA kernels (kernels/<isa>/dwconv3x3_*.c).
 *
 * Each kernel computes output rows [oy0, oy1) of output channels [oc0, oc1) of image n of a
 * job (see asymo_dwconv_job), bias, residual and activation included, from the NCHW planes
 * with no transposes: vectors run along the output row. */
#ifndef ASYMO_DWCONV3X3_H
#define ASYMO_DWCONV3X3_H

#include <stdint.h>

#include "asymo/conv.h"

/* Whether the direct 3x3 kernels apply: 3x3, stride 1 or 2 each way, dilation 1, one output
 * channel per input channel, top / left padding of at most 1 (the bottom / right extent may
 * be anything out_h / out_w imply: reads outside the plane are masked to zero). */
static inline int asymo_dw3x3_applies(const asymo_dwconv_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    return g->kernel_h == 3 && g->kernel_w == 3 && g->dilation_h == 1 && g->dilation_w == 1
           && (g->stride_h == 1 || g->stride_h == 2) && (g->stride_w == 1 || g->stride_w == 2)
           && g->pad_h >= 0 && g->pad_h <= 1 && g->pad_w >= 0 && g->pad_w <= 1
           && job->out_channels == g->channels
           /* the AVX2 kernel's lane masks hold column indices in 32 bits */
           && g->width < ((int64_t)1 << 30) && g->out_w < ((int64_t)1 << 30);
}

/* Planes up to this many outputs run as flat arrays on AVX-512 (asymo_dw3x3_f32_avx512_flat):
 * MobileNet's 7x7, 14x14 and 28x28 planes; the kernel keeps one set of lane masks per vector
 * of the plane on the stack. */
enum { ASYMO_DW3X3_FLAT_MAX = 1024 };

/* Whether the flat-plane kernel applies (on top of asymo_dw3x3_applies): stride 1, padding 1
 * each way and an output plane the size of the input plane (3x3 "same"), small planes. */
static inline int asymo_dw3x3_flat_applies(const asymo_dwconv_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    return g->stride_h == 1 && g->stride_w == 1 && g->pad_h == 1 && g->pad_w == 1
           && g->out_h == g->height && g->out_w == g->width
           && g->height * g->width <= ASYMO_DW3X3_FLAT_MAX;
}

/* Whether the stride-2 AVX-512 kernel applies (on top of asymo_dw3x3_applies): stride 2 each
 * way, any plane size. */
static inline int asymo_dw3x3_s2_applies(const asymo_dwconv_job *job)
{
    return job->geom.stride_h == 2 && job->geom.stride_w == 2;
}

typedef void (*asymo_dw3x3_fn)(const asymo_dwconv_job *job, int64_t n, int64_t oc0,
                               int64_t oc1, int64_t oy0, int64_t oy1);

void asymo_dw3x3_f32_portable(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1,
                              int64_t oy0, int64_t oy1);
void asymo_dw3x3_f64_portable(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1,
                              int64_t oy0, int64_t oy1);
#if defined(__x86_64__)
void asymo_dw3x3_f32_avx2(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1,
                          int64_t oy0, int64_t oy1);
void asymo_dw3x3_f64_avx2(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1,
                          int64_t oy0, int64_t oy1);
void asymo_dw3x3_f32_avx512_flat(const asymo_dwconv_job *job, int64_t n, int64_t oc0,
                                 int64_t oc1, int64_t oy0, int64_t oy1);
void asymo_dw3x3_f32_avx512_s2(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1,
                               int64_t oy0, int64_t oy1);
#endif

#endif
