/* The direct 3x3 depthwise kernel written as plain C loops (see conv/dwconv3x3.h), for any
 * element type and ISA: kernels/portable/dwconv3x3_portable.c compiles it for the baseline
 * ISA (float and double), kernels/x86_avx2/dwconv3x3_avx2.c for double under AVX2+FMA (its
 * float kernel is written with intrinsics). The compiler vectorises the interior loops: their
 * strides are constants and they carry no bounds checks.
 *
 * Expects DW3_T (element type), DW3_FN(name) (a unique name per instantiation) and DW3_ATTR
 * (function attributes, possibly empty); no include guard on purpose. */

/* yr[ox] += w0 * xr[ix] + w1 * xr[ix + 1] + w2 * xr[ix + 2], ix = ox * s - pw, for every ox
 * of the row; taps outside [0, W) read zero. */
DW3_ATTR static inline void DW3_FN(dw3_row_acc)(DW3_T *restrict yr, const DW3_T *restrict xr,
                                                DW3_T w0, DW3_T w1, DW3_T w2, int64_t W,
                                                int64_t ow, int64_t s, int64_t pw)
{
    /* interior [lo, hi): every tap inside the row */
    int64_t lo = pw > 0 ? 1 : 0;
    int64_t hi = W - 3 + pw < 0 ? 0 : (W - 3 + pw) / s + 1;
    lo = lo < ow ? lo : ow;
    hi = hi < lo ? lo : (hi > ow ? ow : hi);
    for (int64_t ox = 0; ox < ow; ox++) {
        if (ox == lo && hi > lo) {
            ox = hi - 1;  /* the interior: below */
            continue;
        }
        const int64_t ix = ox * s - pw;
        DW3_T acc = 0;
        if (ix >= 0 && ix < W)
            acc += w0 * xr[ix];
        if (ix + 1 >= 0 && ix + 1 < W)
            acc += w1 * xr[ix + 1];
        if (ix + 2 >= 0 && ix + 2 < W)
            acc += w2 * xr[ix + 2];
        yr[ox] += acc;
    }
    if (s == 1) {
        for (int64_t ox = lo; ox < hi; ox++)
            yr[ox] += w0 * xr[ox - pw] + w1 * xr[ox - pw + 1] + w2 * xr[ox - pw + 2];
    } else {
        for (int64_t ox = lo; ox < hi; ox++)
            yr[ox] += w0 * xr[2 * ox - pw] + w1 * xr[2 * ox - pw + 1] + w2 * xr[2 * ox - pw + 2];
    }
}

DW3_ATTR static void DW3_FN(dw3_plane)(const asymo_dwconv_job *job, int64_t n, int64_t oc,
                                       int64_t oy0, int64_t oy1)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, C = g->channels, oh = g->out_h, ow = g->out_w;
    const int64_t sh = g->stride_h, sw = g->stride_w, ph = g->pad_h, pw = g->pad_w;
    const DW3_T *x = (const DW3_T *)job->x + (n * C + oc) * H * W;
    const DW3_T *w = (const DW3_T *)job->weight + oc * 9;
    const DW3_T b = job->bias ? ((const DW3_T *)job->bias)[oc] : (DW3_T)0;
    DW3_T *y = (DW3_T *)job->y + n * job->y_image_stride + oc * oh * ow;
    const DW3_T *res = job->residual ? (const DW3_T *)job->residual
                                           + n * job->residual_image_stride + oc * oh * ow
                                     : NULL;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        DW3_T *restrict yr = y + oy * ow;
        if (res) {
            const DW3_T *restrict rr = res + oy * ow;
            for (int64_t ox = 0; ox < ow; ox++)
                yr[ox] = b + rr[ox];
        } else {
            for (int64_t ox = 0; ox < ow; ox++)
                yr[ox] = b;
        }
        for (int64_t ky = 0; ky < 3; ky++) {
            const int64_t iy = oy * sh - ph + ky;
            if (iy >= 0 && iy < H)
                DW3_FN(dw3_row_acc)(yr, x + iy * W, w[3 * ky], w[3 * ky + 1], w[3 * ky + 2], W,
                                    ow, sw, pw);
        }
        /* NaN stays NaN (as torch.relu): the comparisons are false for it */
        if (job->activation == ASYMO_ACT_RELU) {
            for (int64_t ox = 0; ox < ow; ox++)
                yr[ox] = yr[ox] < (DW3_T)0 ? (DW3_T)0 : yr[ox];
        } else if (job->activation == ASYMO_ACT_RELU6) {
            for (int64_t ox = 0; ox < ow; ox++)
                yr[ox] = yr[ox] < (DW3_T)0 ? (DW3_T)0 : (yr[ox] > (DW3_T)6 ? (DW3_T)6 : yr[ox]);
        }
    }
}

DW3_ATTR void DW3_FN(asymo_dw3x3)(const asymo_dwconv_job *job, int64_t n, int64_t oc0,
                                  int64_t oc1, int64_t oy0, int64_t oy1)
{
    for (int64_t oc = oc0; oc < oc1; oc++)
        DW3_FN(dw3_plane)(job, n, oc, oy0, oy1);
}
