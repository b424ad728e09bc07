/* Internal: the pixel-row micro-kernels of the pointwise path's row form
 * (conv/conv_pointwise.c) and of the rows path (conv/conv_rows.c). Not part of the cffi API. */
#ifndef ASYMO_CONV_POINTWISE_KERNELS_H
#define ASYMO_CONV_POINTWISE_KERNELS_H

#include <stdint.h>

/* A tile of `rows` pixels by `chans` output channels of a convolution, read from the image
 * and written to NCHW planes in place:
 *     y[c * ldy + r] = act(sum_p in(p, r) * w[p * cb + c] + bias[c] + res[c * ldr + r])
 * for r < rows, c < chans <= cb, where input value p of pixel r, in(p, r), is x[p * ldx + r]
 * for the pointwise kernels (koff unused) and x[koff[p] + r * sx] for the taps kernels (ldx
 * unused; sx the family's pixel stride, the convolution's stride: the tile's pixels are
 * consecutive outputs of one row, tap p at offset koff[p] from each pixel's window). The
 * pixels are the tile's rows (each input value is broadcast, so nothing is padded to a vector
 * of pixels and a 7 x 7 plane wastes no lanes); the output channels are its vector lanes,
 * cb = 16 x (vectors per row) of them, from a micro-panel of the weights
 * (asymo_conv_pack_panels, mr cb: w[p * cb + c]). The tile is transposed on its way to y.
 * bias and res may be NULL; act is ASYMO_ACT_*. Only the first `chans` values of bias and the
 * first `rows` values of each residual row are read. */
typedef void (*asymo_ukr_pixel_rows_fn)(int64_t k, const float *x, int64_t ldx,
                                        const int64_t *koff, const float *w, float *y,
                                        int64_t ldy, const float *bias, const float *res,
                                        int64_t ldr, int act, int chans);

/* The kernels of one width: cb output channels, fn[rows] for rows = 1..max_rows. */
typedef struct {
    int cb;
    int max_rows;
    asymo_ukr_pixel_rows_fn fn[13];
} asymo_pixel_rows_family;

/* The panels [r[0], r[1]) of output channels and tiles [r[2], r[3]) of task t of a job cut
 * into groups of panels_per_task panels by groups of tiles_per_task tiles, panel groups
 * outermost (a per-task count of 0 reads as 1): the task split of both paths that run these
 * kernels. */
static inline void asymo_pixel_rows_task_range(int64_t t, int64_t panels, int64_t tiles,
                                               int64_t panels_per_task,
                                               int64_t tiles_per_task, int64_t r[4])
{
    const int64_t ppt = panels_per_task > 1 ? panels_per_task : 1;
    const int64_t tpt = tiles_per_task > 1 ? tiles_per_task : 1;
    const int64_t tgroups = (tiles + tpt - 1) / tpt;
    r[0] = t / tgroups * ppt;
    r[1] = r[0] + ppt < panels ? r[0] + ppt : panels;
    r[2] = t % tgroups * tpt;
    r[3] = r[2] + tpt < tiles ? r[2] + tpt : tiles;
}

#if defined(__x86_64__)
/* AVX-512: cb 32 (12 rows), 48 (8 rows), 64 (6 rows); 24 accumulators each */
extern const asymo_pixel_rows_family asymo_pixel_rows_avx512_f32[3];
/* [pixel stride - 1][width], the widths as above */
extern const asymo_pixel_rows_family asymo_taps_rows_avx512_f32[2][3];
#endif

#endif
