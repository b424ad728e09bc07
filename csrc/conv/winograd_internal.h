/* Internals shared by the Winograd frame (conv/winograd.c) and its per-ISA instantiations
 * (kernels/<isa>/winograd_*.c, which include conv/winograd_impl.h). */
#ifndef ASYMO_WINOGRAD_INTERNAL_H
#define ASYMO_WINOGRAD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "asymo/conv.h"
#include "asymo/winograd.h"

/* The largest tile block a task may take (its tile origins live on the stack). */
#define WINO_MAX_TB (4 * ASYMO_WINO_NR)

/* Output channels transformed back per pass: the GEMM results of KC channels x TB tiles x
 * alpha^2 positions stay in L2 (<= 36 * 768 floats, 110 KB). A multiple of MR. */
static inline int64_t wino_kc(int64_t tb)
{
    int64_t panels = (8 * ASYMO_WINO_NR) / tb;
    return ASYMO_WINO_MR * (panels < 1 ? 1 : panels);
}

/* One output's activation, NaN kept (as torch.relu): the direct loop and the scatter's plane
 * edges (the vector one is wino_act). */
static inline float wino_act1(float v, int act)
{
    if (act != ASYMO_ACT_NONE) {
        v = v < 0.0f ? 0.0f : v;
        if (act == ASYMO_ACT_RELU6)
            v = v > 6.0f ? 6.0f : v;
    }
    return v;
}

/* Floats the input gather may read past the end of the input window (wino_gather8). */
#define WINO_WIN_SLACK 40

/* Scratch floats one task needs: V (alpha^2 x C x TB), M (alpha^2 x KC x TB), the gathered
 * input patches (alpha^2 x TB), the output tiles (m^2 x TB, then 8 floats of slack: the
 * output scatter reads 8 tiles from any tile of the block) and the padded input window of
 * the block's tiles (they span at most (TB - 1) / tiles_w + 2 tile rows, and all columns) with
 * its slack. */
static inline size_t wino_scratch_floats(const asymo_winograd_job *job)
{
    const int64_t m = job->tile, a = m + 2, a2 = a * a, tb = job->tiles_per_task;
    const int64_t tw = job->tiles_w > 0 ? job->tiles_w : 1;
    const int64_t window = (((tb - 1) / tw + 1) * m + a) * ((tw - 1) * m + a);
    return (size_t)(a2 * job->geom.channels * tb + a2 * wino_kc(tb) * tb + a2 * tb
                    + m * m * tb + 8 + window + WINO_WIN_SLACK);
}

/* One task's work (image n, tile block tb, channel block kb), with the scratch above
 * (64-byte aligned). One per ISA variant. */
typedef void (*wino_block_fn)(const asymo_winograd_job *job, int64_t n, int64_t tb,
                              int64_t kb, float *scratch);
void asymo_wino_block_portable(const asymo_winograd_job *job, int64_t n, int64_t tb,
                               int64_t kb, float *scratch);
#if defined(__x86_64__)
void asymo_wino_block_avx2(const asymo_winograd_job *job, int64_t n, int64_t tb, int64_t kb,
                           float *scratch);
#endif

#endif
