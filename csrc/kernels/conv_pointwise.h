/* Internal: the pixel-row micro-kernels of the pointwise path's row form
 * (conv/conv_pointwise.c) and of the rows path (conv/conv_rows.c). Not part of the cffi API. */
#ifndef ASYMO_CONV_POINTWISE_KERNELS_H
#define ASYMO_CONV_POINTWISE_KERNELS_H

#include <stddef.h>
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

/* One layer as both paths that run these kernels see it (the pointwise rows form: one output
 * row of all the pixels; the rows path: the output plane): m output channels in micro-panels
 * of the family's cb, an out_h x out_w output plane whose rows are cut into tiles_per_row
 * tiles each (as even as possible: sizes differ by at most one pixel), output pixel (oy, ox)
 * reading the input at x + oy * x_row + ox * x_col (then ldx and koff as the family's form
 * says), y and res NCHW planes of out_h x out_w. */
typedef struct {
    int64_t k;               /* input values per pixel */
    int64_t m;               /* output channels */
    int64_t out_h, out_w, tiles_per_row;
    int64_t panels_per_task; /* micro-panels per task (0 counts as 1) */
    int64_t tiles_per_task;  /* tiles per task (0 counts as 1) */
    const float *x;
    int64_t x_row, x_col, ldx;
    const int64_t *koff;
    const float *apack;      /* the weights' micro-panels, cb x k each */
    const float *bias;       /* m values or NULL */
    const float *res;        /* m x out_h x out_w or NULL */
    float *y;                /* m x out_h x out_w */
    int act;
} asymo_pixel_rows_layer;

static inline int64_t asymo_pixel_rows_tasks(const asymo_pixel_rows_family *f,
                                             const asymo_pixel_rows_layer *L)
{
    const int64_t ppt = L->panels_per_task > 1 ? L->panels_per_task : 1;
    const int64_t tpt = L->tiles_per_task > 1 ? L->tiles_per_task : 1;
    const int64_t panels = (L->m + f->cb - 1) / f->cb, tiles = L->out_h * L->tiles_per_row;
    return (panels + ppt - 1) / ppt * ((tiles + tpt - 1) / tpt);
}

/* Task t: panel group t / (tile groups), tile group t % (tile groups), panel by panel (its
 * k x cb weights stay in L2 across the tiles, which go along the output rows). */
static inline void asymo_pixel_rows_task(const asymo_pixel_rows_family *f, int64_t t,
                                         const asymo_pixel_rows_layer *L)
{
    const int64_t ppt = L->panels_per_task > 1 ? L->panels_per_task : 1;
    const int64_t tpt = L->tiles_per_task > 1 ? L->tiles_per_task : 1;
    const int64_t cb = f->cb, panels = (L->m + cb - 1) / cb;
    const int64_t per_row = L->tiles_per_row, tiles = L->out_h * per_row;
    const int64_t tgroups = (tiles + tpt - 1) / tpt;
    const int64_t p0 = t / tgroups * ppt, p1 = p0 + ppt < panels ? p0 + ppt : panels;
    const int64_t i0 = t % tgroups * tpt, i1 = i0 + tpt < tiles ? i0 + tpt : tiles;
    const int64_t ow = L->out_w, ohw = L->out_h * ow;
    for (int64_t panel = p0; panel < p1; panel++) {
        const int64_t c0 = panel * cb;
        const int chans = (int)(L->m - c0 < cb ? L->m - c0 : cb);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t oy = i / per_row, j = i % per_row;
            const int64_t ox0 = j * ow / per_row, ox1 = (j + 1) * ow / per_row;
            const int64_t at = c0 * ohw + oy * ow + ox0;
            f->fn[ox1 - ox0](L->k, L->x + oy * L->x_row + ox0 * L->x_col, L->ldx, L->koff,
                             L->apack + c0 * L->k, L->y + at, ohw,
                             L->bias ? L->bias + c0 : NULL, L->res ? L->res + at : NULL, ohw,
                             L->act, chans);
        }
    }
}

#if defined(__x86_64__)
/* AVX-512: cb 32 (12 rows), 48 (8 rows), 64 (6 rows); 24 accumulators each */
extern const asymo_pixel_rows_family asymo_pixel_rows_avx512_f32[3];
/* [pixel stride - 1][width], the widths as above */
extern const asymo_pixel_rows_family asymo_taps_rows_avx512_f32[2][3];
/* AVX2: cb 8 (12 rows), 16 (6 rows), 24 (4 rows); 12 accumulators each */
extern const asymo_pixel_rows_family asymo_pixel_rows_avx2_f32[3];
extern const asymo_pixel_rows_family asymo_taps_rows_avx2_f32[2][3];
#endif

/* The pixel-row kernels of width cb, in the pointwise form (taps_stride 0) or the taps form
 * of pixel stride taps_stride (1 or 2), among the families this CPU runs; NULL when none has
 * that width. The widths of the AVX-512 and AVX2 families differ, so a job's panel width
 * names its kernels whatever asymo_conv_isa() says when it runs (the planner picks the width
 * among its ISA's: asymo.ops.conv). Defined in conv/conv_pointwise.c. */
const asymo_pixel_rows_family *asymo_pixel_rows_for(int cb, int taps_stride);

#endif
