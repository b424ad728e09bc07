/* Winograd convolution for 3x3, stride-1, dilation-1, groups-1 layers (float32).
 *
 * F(m x m, 3 x 3) with m = 4 (alpha = 6, 36 tile positions) or m = 2 (alpha = 4, 16 positions):
 * the output is cut into m x m tiles; tile t reads an alpha x alpha input patch d, and
 *     Y = A^T [ U (.) (B^T d B) ] A      summed over input channels, U = G g G^T per filter.
 * The sum over input channels is a GEMM per tile position xi: M[xi] (K x tiles) = U[xi]
 * (K x C) @ V[xi] (C x tiles).
 *
 * U (the transformed weights) is computed once per weight, in Python (float64, rounded once),
 * packed as [alpha^2][Kp / MR][C][MR] (Kp = K rounded up to MR, zero rows beyond K): each
 * micro-panel is the A operand of the micro-kernel as it is read.
 *
 * A task is one image, a block of at most tiles_per_task tiles (a multiple of ASYMO_WINO_NR), and a
 * block of output channels [kb * k_per_block, ...): it transforms its tiles' input (all C
 * channels) into a scratch of its own, runs the alpha^2 GEMMs for its channels, transforms
 * the output back and applies bias, residual and activation on the way out. The transforms
 * therefore run on the cluster that consumes them, and a convolution is one pool job.
 * ntasks = batch * tile_blocks * k_blocks (tasks of one tile block are consecutive).
 */
#ifndef ASYMO_WINOGRAD_H
#define ASYMO_WINOGRAD_H

#include <stdint.h>

#include "asymo/conv.h"

/* CDEF BEGIN */
enum { ASYMO_WINO_MR = 6, ASYMO_WINO_NR = 16 };

typedef struct {
    asymo_conv_geometry geom;   /* channels = C; 3x3, stride 1, dilation 1 */
    int32_t dtype;              /* ASYMO_DTYPE_F32 only */
    int32_t activation;         /* ASYMO_ACT_* applied after bias + residual */
    int32_t tile;               /* m: 2 or 4 */
    int64_t batch, out_channels;
    const void *x;              /* image n at x + n * x_image_stride (C x H x W contiguous) */
    int64_t x_image_stride;
    const void *u;              /* transformed, packed weights (see above) */
    const void *weight;         /* the original K x C x 3 x 3 weights (for the direct loop) */
    int64_t k_padded;           /* Kp */
    const void *bias;           /* out_channels values or NULL */
    const void *residual;       /* like y (own image stride) or NULL */
    int64_t residual_image_stride;
    void *y;                    /* image n, channel k at y + n * y_image_stride + k * out_h * out_w */
    int64_t y_image_stride;
    int64_t tiles_h, tiles_w;
    int64_t tiles_per_task;     /* multiple of ASYMO_WINO_NR, at most 4 * ASYMO_WINO_NR */
    int64_t tile_blocks;        /* ceil(tiles_h * tiles_w / tiles_per_task); block b takes
                                   tiles [T * b / tile_blocks, T * (b + 1) / tile_blocks) */
    int64_t k_per_block;        /* multiple of ASYMO_WINO_MR */
    int64_t k_blocks;           /* ceil(out_channels / k_per_block) */
    int32_t method;             /* 0: Winograd; 1: the direct loop (slow; the task's fallback
                                   when its scratch cannot be allocated, selectable to test it) */
} asymo_winograd_job;

void asymo_winograd_task(int64_t task, void *job);

/* A 64-bit fingerprint of nbytes bytes (not cryptographic): how a cache of transformed weights
 * notices that an array it saw before now holds other values. */
uint64_t asymo_fingerprint(const void *data, int64_t nbytes);
/* CDEF END */

#endif
