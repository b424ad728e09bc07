/* Internal: a channel plane copied zero-padded, for the paths that read an image through
 * fixed offsets (conv_indirect.c: its stride-phase planes; conv_rows.c: its padded copy). */
#ifndef ASYMO_CONV_PADDED_PLANE_H
#define ASYMO_CONV_PADDED_PLANE_H

#include <stdint.h>
#include <string.h>

/* dst[r * row + q] = src[(r * s + y0) * W + q * s + x0] where that pixel is inside the
 * H x W plane src, else 0, for r < rows and q < row (s >= 1; y0, x0 may be negative: the
 * padding). */
static inline void asymo_copy_plane_padded(float *dst, int64_t rows, int64_t row,
                                           const float *src, int64_t H, int64_t W, int64_t s,
                                           int64_t y0, int64_t x0)
{
    /* columns [q0, q1) read inside the plane */
    int64_t q0 = x0 >= 0 ? 0 : (-x0 + s - 1) / s;
    int64_t q1 = W - x0 <= 0 ? 0 : (W - x0 + s - 1) / s;
    q0 = q0 < row ? q0 : row;
    q1 = q1 < q0 ? q0 : q1 < row ? q1 : row;
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * row;
        const int64_t iy = r * s + y0;
        if (iy < 0 || iy >= H || q1 == q0) {
            memset(d, 0, (size_t)row * sizeof(float));
            continue;
        }
        const float *in = src + iy * W + x0;
        memset(d, 0, (size_t)q0 * sizeof(float));
        if (s == 1)
            memcpy(d + q0, in + q0, (size_t)(q1 - q0) * sizeof(float));
        else
            for (int64_t q = q0; q < q1; q++)
                d[q] = in[q * s];
        memset(d + q1, 0, (size_t)(row - q1) * sizeof(float));
    }
}

#endif
