/* Internal: the micro-kernels of the blocked-channel layout (conv/blocked.c; asymo/conv.h,
 * NCHW8c). Not part of the cffi API. */
#ifndef ASYMO_CONV_BLOCKED_KERNELS_H
#define ASYMO_CONV_BLOCKED_KERNELS_H

#include <stdint.h>

#include "asymo/conv.h"

/* A 1x1 kernel call computes a group of at most three output blocks by 12 / blocks pixels
 * (12 accumulators). */
enum { ASYMO_PW_BLOCKED_GROUP = 3 };

/* The groups of a layer's `blocks` output blocks: threes, except that a remainder of one
 * block makes the last two groups two each (a group of one block loads a weight vector per
 * broadcast). */
static inline int64_t asymo_pw_blocked_groups(int64_t blocks)
{
    return blocks / 3 + (blocks % 3 != 0);
}

/* Group g's first block (*first) and its block count (returned). */
static inline int asymo_pw_blocked_group(int64_t blocks, int64_t g, int64_t *first)
{
    const int64_t q = blocks / 3, r = blocks % 3;
    if (r == 1 && q >= 1 && g >= q - 1) {
        *first = 3 * (q - 1) + 2 * (g - (q - 1));
        return 2;
    }
    *first = 3 * g;
    return g < q ? 3 : (int)r;
}

#if defined(__x86_64__)
/* Blocks 8 channels of `pixels` pixels: NCHW planes (ldx apart) at x <-> NCHW8c at y. */
void asymo_reorder_block_avx2(const float *x, float *y, int64_t pixels, int64_t ldx,
                              int to_blocked);
/* Pixels [p0, p1) of output blocks [b0, b0 + nb) (a group, nb <= 3) of a 1x1 job, input
 * channels [k0, k1) (multiples of 8): the first part starts from the bias, later ones from
 * the sums in `part` (nb blocks of (p1 - p0) x 8 floats; NULL when [k0, k1) is all of them),
 * the last applies the shortcut and the activation and stores to y. */
void asymo_pointwise_blocked_avx2(const asymo_pointwise_blocked_job *job, int64_t b0, int nb,
                                  int64_t p0, int64_t p1, int64_t k0, int64_t k1, float *part);
/* Pixels [ox0, ox1) of output row oy of a dense job's output blocks [b0, b0 + nb) (a group),
 * input blocks [ib0, ib1) (a part): xpad the padded NCHW8c copy (rows wp pixels wide, blocks
 * ldb floats apart), off the offsets of a part's (input block, tap) pairs from its first
 * block's window corner (the same for every part: asymo_dense_blocked_task makes them once a
 * task), wpack the packed weights; the first part starts from the bias, later ones from the
 * sums in `part` (at pixel ox0; nb blocks ldp floats apart, 8 floats a pixel; NULL when
 * [ib0, ib1) is all of them), the last stores y (NCHW) with the shortcut and the activation. */
void asymo_dense_blocked_avx2(const asymo_dense_blocked_job *job, const float *xpad,
                              int64_t wp, int64_t ldb, const int64_t *off, const float *wpack,
                              int64_t b0, int nb, int64_t oy, int64_t ox0, int64_t ox1,
                              int64_t ib0, int64_t ib1, float *part, int64_t ldp);
/* Output rows [oy0, oy1) of channel block b of a depthwise job. */
void asymo_depthwise_blocked_avx2(const asymo_depthwise_blocked_job *job, int64_t b,
                                  int64_t oy0, int64_t oy1);
#endif

#endif
