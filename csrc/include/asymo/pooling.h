/* 2-D max and average pooling over NCHW planes (the light layers of a CNN). A job is a set of
 * planes (images x channels) sharing one window geometry; a task is planes_per_task planes. */
#ifndef ASYMO_POOLING_H
#define ASYMO_POOLING_H

#include <stdint.h>

#include "asymo/conv.h"

/* CDEF BEGIN */
enum {
    ASYMO_POOL_MAX = 0,
    ASYMO_POOL_AVG = 1
};

/* geom.channels is unused (planes counts them); dilation must be 1. For max pooling, padding
 * acts as -infinity; for average pooling the divisor counts the padding when count_include_pad
 * is set (torch semantics: never the part of a ceil-mode window past the padded input). */
typedef struct {
    asymo_conv_geometry geom;
    int32_t dtype;
    int32_t kind;
    int32_t count_include_pad;
    const void *x;          /* nplanes x height x width, contiguous */
    void *y;                /* nplanes x out_h x out_w, contiguous */
    int64_t nplanes;
    int64_t planes_per_task; /* ntasks = ceil(nplanes / planes_per_task) */
} asymo_pool2d_job;

void asymo_pool2d_task(int64_t task, void *job);
/* CDEF END */

#endif
