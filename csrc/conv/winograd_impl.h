/* The Winograd F(m x m, 3 x 3) task body (see asymo/winograd.h), written once with GCC vector
 * extensions (8 floats) and instantiated per ISA: kernels/x86_avx2/winograd_avx2.c compiles it
 * for AVX2+FMA (one ymm per vector), kernels/portable/winograd_portable.c for the baseline
 * (two NEON q registers per vector on aarch64, two SSE registers on x86-64).
 *
 * The includer defines WINO_ATTR (function attributes, e.g. a target) and WINO_SFX (the
 * suffix of asymo_wino_block_<sfx>). */
#include "conv/winograd_internal.h"

#include <string.h>

/* the vector helpers are always inlined: no vector crosses a call boundary */
#pragma GCC diagnostic ignored "-Wpsabi"

#if !defined(WINO_ATTR) || !defined(WINO_SFX)
#error "define WINO_ATTR and WINO_SFX before including winograd_impl.h"
#endif

#define WINO_CAT2(a, b) a##_##b
#define WINO_CAT(a, b) WINO_CAT2(a, b)
#define WFN(name) WINO_CAT(name, WINO_SFX)

typedef float wv8 __attribute__((vector_size(32)));
typedef int32_t wv8i __attribute__((vector_size(32)));
#define WVW 8
#define WMR ASYMO_WINO_MR
#define WNR ASYMO_WINO_NR

#define WLD(p) (*(const wv8 *)(p))
#define WST(p, v) (*(wv8 *)(p) = (v))

/* out[r * ldo + j] = sum_c u[c * MR + r] * v[c * NR + j]: the MR x NR micro-kernel (6 x 16:
 * twelve 8-float accumulators, two B vectors and one broadcast live at once). v is a packed
 * NR-tile panel of V, u a packed MR-channel panel of U. */
WINO_ATTR static inline void WFN(wino_kernel)(int64_t C, const float *restrict u,
                                             const float *restrict v, float *restrict out,
                                             int64_t ldo)
{
    wv8 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    wv8 c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    for (int64_t c = 0; c < C; c++) {
        const wv8 b0 = WLD(v), b1 = WLD(v + WVW);
        c00 += b0 * u[0]; c01 += b1 * u[0];
        c10 += b0 * u[1]; c11 += b1 * u[1];
        c20 += b0 * u[2]; c21 += b1 * u[2];
        c30 += b0 * u[3]; c31 += b1 * u[3];
        c40 += b0 * u[4]; c41 += b1 * u[4];
        c50 += b0 * u[5]; c51 += b1 * u[5];
        u += WMR;
        v += WNR;
    }
    WST(out + 0 * ldo, c00); WST(out + 0 * ldo + WVW, c01);
    WST(out + 1 * ldo, c10); WST(out + 1 * ldo + WVW, c11);
    WST(out + 2 * ldo, c20); WST(out + 2 * ldo + WVW, c21);
    WST(out + 3 * ldo, c30); WST(out + 3 * ldo + WVW, c31);
    WST(out + 4 * ldo, c40); WST(out + 4 * ldo + WVW, c41);
    WST(out + 5 * ldo, c50); WST(out + 5 * ldo + WVW, c51);
}

/* B^T d B for every tile of the block, 8 tiles per vector. P: alpha x alpha x TB gathered
 * patches; V: element (xi, tile i) of this channel at vc[xi * xs + (i / NR) * qs + i % NR]. */
WINO_ATTR static void WFN(wino_input)(int m, int64_t tb, const float *restrict P,
                                     float *restrict vc, int64_t xs, int64_t qs)
{
    for (int64_t i0 = 0; i0 < tb; i0 += WVW) {
        float *restrict dst = vc + (i0 / WNR) * qs + i0 % WNR;
        if (m == 4) {
            wv8 t[6][6];
            for (int j = 0; j < 6; j++) {
                const wv8 d0 = WLD(P + (0 * 6 + j) * tb + i0), d1 = WLD(P + (1 * 6 + j) * tb + i0);
                const wv8 d2 = WLD(P + (2 * 6 + j) * tb + i0), d3 = WLD(P + (3 * 6 + j) * tb + i0);
                const wv8 d4 = WLD(P + (4 * 6 + j) * tb + i0), d5 = WLD(P + (5 * 6 + j) * tb + i0);
                t[0][j] = 4.0f * d0 - 5.0f * d2 + d4;
                t[1][j] = d3 + d4 - 4.0f * (d1 + d2);
                t[2][j] = d4 - d3 + 4.0f * (d1 - d2);
                t[3][j] = d4 - d2 + 2.0f * (d3 - d1);
                t[4][j] = d4 - d2 + 2.0f * (d1 - d3);
                t[5][j] = 4.0f * d1 - 5.0f * d3 + d5;
            }
            for (int r = 0; r < 6; r++) {
                const wv8 e0 = t[r][0], e1 = t[r][1], e2 = t[r][2];
                const wv8 e3 = t[r][3], e4 = t[r][4], e5 = t[r][5];
                float *o = dst + r * 6 * xs;
                WST(o + 0 * xs, 4.0f * e0 - 5.0f * e2 + e4);
                WST(o + 1 * xs, e3 + e4 - 4.0f * (e1 + e2));
                WST(o + 2 * xs, e4 - e3 + 4.0f * (e1 - e2));
                WST(o + 3 * xs, e4 - e2 + 2.0f * (e3 - e1));
                WST(o + 4 * xs, e4 - e2 + 2.0f * (e1 - e3));
                WST(o + 5 * xs, 4.0f * e1 - 5.0f * e3 + e5);
            }
        } else {
            wv8 t[4][4];
            for (int j = 0; j < 4; j++) {
                const wv8 d0 = WLD(P + (0 * 4 + j) * tb + i0), d1 = WLD(P + (1 * 4 + j) * tb + i0);
                const wv8 d2 = WLD(P + (2 * 4 + j) * tb + i0), d3 = WLD(P + (3 * 4 + j) * tb + i0);
                t[0][j] = d0 - d2;
                t[1][j] = d1 + d2;
                t[2][j] = d2 - d1;
                t[3][j] = d1 - d3;
            }
            for (int r = 0; r < 4; r++) {
                const wv8 e0 = t[r][0], e1 = t[r][1], e2 = t[r][2], e3 = t[r][3];
                float *o = dst + r * 4 * xs;
                WST(o + 0 * xs, e0 - e2);
                WST(o + 1 * xs, e1 + e2);
                WST(o + 2 * xs, e2 - e1);
                WST(o + 3 * xs, e1 - e3);
            }
        }
    }
}

/* max(v, 0) / min(max(v, 0), 6) keeping NaN (as numpy.maximum and torch.relu do) */
WINO_ATTR static inline __attribute__((always_inline)) wv8 WFN(wino_act)(wv8 v, int act)
{
    if (act == ASYMO_ACT_NONE)
        return v;
    const wv8 zero = {0};
    wv8i neg = v < zero;
    v = (wv8)((wv8i)v & ~neg);
    if (act == ASYMO_ACT_RELU6) {
        const wv8 six = zero + 6.0f;
        wv8i big = v > six;
        v = (wv8)(((wv8i)v & ~big) | ((wv8i)six & big));
    }
    return v;
}

/* A^T M A for channel row mk of the GEMM results (element (xi, tile i) at mk[xi * ms + i]),
 * into yb[(o * m + o2) * TB + i]; bias and activation applied here when fuse. */
WINO_ATTR static void WFN(wino_output)(int m, int64_t tb, const float *restrict mk, int64_t ms,
                                      float *restrict yb, float bias, int act)
{
    for (int64_t i0 = 0; i0 < tb; i0 += WVW) {
        if (m == 4) {
            wv8 s[4][6];
            for (int j = 0; j < 6; j++) {
                const wv8 m0 = WLD(mk + (0 * 6 + j) * ms + i0), m1 = WLD(mk + (1 * 6 + j) * ms + i0);
                const wv8 m2 = WLD(mk + (2 * 6 + j) * ms + i0), m3 = WLD(mk + (3 * 6 + j) * ms + i0);
                const wv8 m4 = WLD(mk + (4 * 6 + j) * ms + i0), m5 = WLD(mk + (5 * 6 + j) * ms + i0);
                const wv8 a = m1 + m2, b = m1 - m2, c = m3 + m4, d = m3 - m4;
                s[0][j] = m0 + a + c;
                s[1][j] = b + 2.0f * d;
                s[2][j] = a + 4.0f * c;
                s[3][j] = b + 8.0f * d + m5;
            }
            for (int o = 0; o < 4; o++) {
                const wv8 a = s[o][1] + s[o][2], b = s[o][1] - s[o][2];
                const wv8 c = s[o][3] + s[o][4], d = s[o][3] - s[o][4];
                float *dst = yb + o * 4 * tb + i0;
                WST(dst + 0 * tb, WFN(wino_act)(s[o][0] + a + c + bias, act));
                WST(dst + 1 * tb, WFN(wino_act)(b + 2.0f * d + bias, act));
                WST(dst + 2 * tb, WFN(wino_act)(a + 4.0f * c + bias, act));
                WST(dst + 3 * tb, WFN(wino_act)(b + 8.0f * d + s[o][5] + bias, act));
            }
        } else {
            wv8 s[2][4];
            for (int j = 0; j < 4; j++) {
                const wv8 m0 = WLD(mk + (0 * 4 + j) * ms + i0), m1 = WLD(mk + (1 * 4 + j) * ms + i0);
                const wv8 m2 = WLD(mk + (2 * 4 + j) * ms + i0), m3 = WLD(mk + (3 * 4 + j) * ms + i0);
                s[0][j] = m0 + m1 + m2;
                s[1][j] = m1 - m2 - m3;
            }
            for (int o = 0; o < 2; o++) {
                float *dst = yb + o * 2 * tb + i0;
                WST(dst, WFN(wino_act)(s[o][0] + s[o][1] + s[o][2] + bias, act));
                WST(dst + tb, WFN(wino_act)(s[o][1] - s[o][2] - s[o][3] + bias, act));
            }
        }
    }
}

typedef float wv8u __attribute__((vector_size(32), aligned(4)));

/* The outputs of 8 consecutive whole tiles of one tile row: src[(o * m + j) * tb + t] is
 * position (o, j) of tile t, dst[o * ldd + t * m + j] its place in the plane (m = 4 or 2);
 * a residual (same layout as dst) is added, then the activation. Each output row is the
 * 8 tiles' position vectors interleaved. */
WINO_ATTR static inline __attribute__((always_inline)) void WFN(wino_scatter8)(
    int m, const float *src, int64_t tb, float *dst, int64_t ldd, const float *res, int act)
{
    const wv8i lo = {0, 8, 1, 9, 2, 10, 3, 11}, hi = {4, 12, 5, 13, 6, 14, 7, 15};
    const wv8i pair_lo = {0, 1, 8, 9, 2, 3, 10, 11}, pair_hi = {4, 5, 12, 13, 6, 7, 14, 15};
    for (int o = 0; o < m; o++) {
        const float *s = src + o * m * tb;
        wv8 out[4];
        if (m == 4) {
            const wv8u v0 = *(const wv8u *)s, v1 = *(const wv8u *)(s + tb);
            const wv8u v2 = *(const wv8u *)(s + 2 * tb), v3 = *(const wv8u *)(s + 3 * tb);
            const wv8 a = __builtin_shuffle((wv8)v0, (wv8)v1, lo);
            const wv8 b = __builtin_shuffle((wv8)v0, (wv8)v1, hi);
            const wv8 c = __builtin_shuffle((wv8)v2, (wv8)v3, lo);
            const wv8 d = __builtin_shuffle((wv8)v2, (wv8)v3, hi);
            out[0] = __builtin_shuffle(a, c, pair_lo);
            out[1] = __builtin_shuffle(a, c, pair_hi);
            out[2] = __builtin_shuffle(b, d, pair_lo);
            out[3] = __builtin_shuffle(b, d, pair_hi);
        } else {
            const wv8u v0 = *(const wv8u *)s, v1 = *(const wv8u *)(s + tb);
            out[0] = __builtin_shuffle((wv8)v0, (wv8)v1, lo);
            out[1] = __builtin_shuffle((wv8)v0, (wv8)v1, hi);
        }
        float *d = dst + o * ldd;
        for (int q = 0; q < m; q++) {
            wv8 v = out[q];
            if (res) {
                v += (wv8)(*(const wv8u *)(res + o * ldd + q * WVW));
                v = WFN(wino_act)(v, act);
            }
            *(wv8u *)(d + q * WVW) = v;
        }
    }
}

/* One input row of 8 side-by-side F(4x4, 3x3) tiles (row[4 t + j] is element j of tile t's
 * patch row) into the patch rows p[j * tb + t], j < 6: the row deinterleaved by 4, elements
 * 4 and 5 taken from the next tile's 0 and 1. Reads row[0, 40). */
WINO_ATTR static inline __attribute__((always_inline)) void WFN(wino_gather8)(
    const float *row, float *p, int64_t tb)
{
    const wv8i even4 = {0, 4, 8, 12, 1, 5, 9, 13}, odd4 = {2, 6, 10, 14, 3, 7, 11, 15};
    const wv8i lo = {0, 1, 2, 3, 8, 9, 10, 11}, hi = {4, 5, 6, 7, 12, 13, 14, 15};
    const wv8i next0 = {1, 2, 3, 4, 5, 6, 7, 8}, next1 = {1, 2, 3, 4, 5, 6, 7, 9};
    const wv8 v0 = (wv8)(*(const wv8u *)row), v1 = (wv8)(*(const wv8u *)(row + 8));
    const wv8 v2 = (wv8)(*(const wv8u *)(row + 16)), v3 = (wv8)(*(const wv8u *)(row + 24));
    const wv8 e = (wv8)(*(const wv8u *)(row + 32));
    const wv8 a = __builtin_shuffle(v0, v1, even4), b = __builtin_shuffle(v0, v1, odd4);
    const wv8 c = __builtin_shuffle(v2, v3, even4), d = __builtin_shuffle(v2, v3, odd4);
    const wv8 ph0 = __builtin_shuffle(a, c, lo), ph1 = __builtin_shuffle(a, c, hi);
    const wv8 ph2 = __builtin_shuffle(b, d, lo), ph3 = __builtin_shuffle(b, d, hi);
    *(wv8u *)p = ph0;
    *(wv8u *)(p + tb) = ph1;
    *(wv8u *)(p + 2 * tb) = ph2;
    *(wv8u *)(p + 3 * tb) = ph3;
    *(wv8u *)(p + 4 * tb) = __builtin_shuffle(ph0, e, next0);
    *(wv8u *)(p + 5 * tb) = __builtin_shuffle(ph1, e, next1);
}

WINO_ATTR void WINO_CAT(asymo_wino_block, WINO_SFX)(const asymo_winograd_job *job, int64_t n,
                                                    int64_t tblock, int64_t kb,
                                                    float *scratch)
{
    const asymo_conv_geometry *g = &job->geom;
    const int m = job->tile, alpha = m + 2, a2 = alpha * alpha;
    const int64_t C = g->channels, H = g->height, W = g->width;
    const int64_t OH = g->out_h, OW = g->out_w;
    const int64_t tb = job->tiles_per_task, nb = tb / WNR;
    /* the tiles are dealt evenly to the blocks (each gets at most tb): equal tasks */
    const int64_t T = job->tiles_h * job->tiles_w;
    const int64_t t0 = T * tblock / job->tile_blocks;
    const int64_t ntiles = T * (tblock + 1) / job->tile_blocks - t0;
    const int64_t K = job->out_channels;
    const int64_t k0 = kb * job->k_per_block;
    const int64_t k1 = k0 + job->k_per_block < K ? k0 + job->k_per_block : K;
    const int64_t kc = wino_kc(tb);
    const int act = job->activation;
    float *V = scratch;
    float *M = V + a2 * C * tb;
    float *P = M + a2 * kc * tb;
    float *Yb = P + a2 * tb;
    const float *x = (const float *)job->x + n * job->x_image_stride;
    const float *bias = (const float *)job->bias;
    const float *res = job->residual
        ? (const float *)job->residual + n * job->residual_image_stride : NULL;
    float *y = (float *)job->y + n * job->y_image_stride;

    if (ntiles <= 0)
        return;
    /* tile origins (input row / column of the patch's top-left element) */
    int64_t ys[WINO_MAX_TB], xs[WINO_MAX_TB];
    for (int64_t i = 0; i < ntiles; i++) {
        const int64_t t = t0 + i, ty = t / job->tiles_w, tx = t - ty * job->tiles_w;
        ys[i] = ty * m - g->pad_h;
        xs[i] = tx * m - g->pad_w;
    }
    if (ntiles < tb)
        memset(P, 0, sizeof(float) * (size_t)(a2 * tb));

    /* The block's tiles gather from a window of the input around them, zero-padded where
     * they cross the plane's edge (no bounds checks per element), read WINO_WIN_SLACK floats
     * past its end at most (zeros). */
    int64_t wy0 = ys[0], wy1 = ys[0], wx0 = xs[0], wx1 = xs[0];
    for (int64_t i = 0; i < ntiles; i++) {
        wy1 = ys[i] > wy1 ? ys[i] : wy1;
        wx0 = xs[i] < wx0 ? xs[i] : wx0;
        wx1 = xs[i] > wx1 ? xs[i] : wx1;
    }
    wy1 += alpha;
    wx1 += alpha;
    const int64_t wc = wx1 - wx0, wn = (wy1 - wy0) * wc;
    const int64_t vy0 = wy0 > 0 ? wy0 : 0, vy1 = wy1 < H ? wy1 : H;
    const int64_t vx0 = wx0 > 0 ? wx0 : 0, vx1 = wx1 < W ? wx1 : W;
    float *win = Yb + m * m * tb + WVW;
    const int edges = vy0 != wy0 || vy1 != wy1 || vx0 != wx0 || vx1 != wx1;
    memset(win + (edges ? 0 : wn), 0, sizeof(float) * (size_t)((edges ? wn : 0) + WINO_WIN_SLACK));

    /* input transform, channel by channel: gather the patches, then B^T d B */
    for (int64_t c = 0; c < C; c++) {
        const float *xc = x + c * H * W;
        if (vx1 > vx0)
            for (int64_t iy = vy0; iy < vy1; iy++)
                memcpy(win + (iy - wy0) * wc + (vx0 - wx0), xc + iy * W + vx0,
                       sizeof(float) * (size_t)(vx1 - vx0));
        for (int64_t i = 0; i < ntiles;) {
            int64_t run = 1;
            while (run < WVW && i + run < ntiles && ys[i + run] == ys[i])
                run++;
            const float *src = win + (ys[i] - wy0) * wc + (xs[i] - wx0);
            if (m == 4 && i + WVW <= tb) {
                /* lanes past the run get the window's next values: overwritten by the next
                   run, or tiles past the block's end (never stored) */
                for (int r = 0; r < alpha; r++)
                    WFN(wino_gather8)(src + r * wc, P + r * alpha * tb + i, tb);
            } else {
                for (int64_t t = 0; t < run; t++)
                    for (int r = 0; r < alpha; r++)
                        for (int j = 0; j < alpha; j++)
                            P[(r * alpha + j) * tb + i + t] = src[r * wc + t * m + j];
            }
            i += run;
        }
        WFN(wino_input)(m, tb, P, V + c * WNR, nb * C * WNR, C * WNR);
    }

    /* per chunk of kc output channels: alpha^2 GEMMs, then the output transform */
    const int64_t panels_per_xi = job->k_padded / WMR;
    const float *u = (const float *)job->u;
    for (int64_t kc0 = k0; kc0 < k1; kc0 += kc) {
        const int64_t kc1 = kc0 + kc < k1 ? kc0 + kc : k1;
        const int64_t npan = (kc1 - kc0 + WMR - 1) / WMR;
        for (int xi = 0; xi < a2; xi++) {
            for (int64_t p = 0; p < npan; p++) {
                const float *up = u + ((xi * panels_per_xi + kc0 / WMR + p) * C) * WMR;
                for (int64_t q = 0; q < nb; q++)
                    WFN(wino_kernel)(C, up, V + (xi * nb + q) * C * WNR,
                                     M + (xi * kc + p * WMR) * tb + q * WNR, tb);
            }
        }
        for (int64_t k = kc0; k < kc1; k++) {
            const float b = bias ? bias[k] : 0.0f;
            /* with a residual the activation comes after the residual, in the scatter */
            WFN(wino_output)(m, tb, M + (k - kc0) * tb, kc * tb, Yb, b,
                             res ? ASYMO_ACT_NONE : act);
            float *yk = y + k * OH * OW;
            const float *rk = res ? res + k * OH * OW : NULL;
            for (int64_t i = 0; i < ntiles;) {
                const int64_t oy0 = ys[i] + g->pad_h, ox0 = xs[i] + g->pad_w;
                /* the run of tiles from i in this tile row (at most 8): one interleave
                   gives all its output rows */
                int64_t run = 1;
                while (run < WVW && i + run < ntiles && ys[i + run] == ys[i])
                    run++;
                const int64_t rows = OH - oy0 < m ? OH - oy0 : m;
                const int64_t cols = OW - ox0 < run * m ? OW - ox0 : run * m;
                float *dst = yk + oy0 * OW + ox0;
                const float *rr = rk ? rk + oy0 * OW + ox0 : NULL;
                if (rows == m && cols == WVW * m) {
                    WFN(wino_scatter8)(m, Yb + i, tb, dst, OW, rr, act);
                } else {
                    /* a short run or a plane's edge: interleave into a row buffer, then
                       copy the rows' valid parts (Yb's slack makes the 8-tile read safe) */
                    float rowbuf[4 * 4 * WVW] __attribute__((aligned(32)));
                    WFN(wino_scatter8)(m, Yb + i, tb, rowbuf, WVW * m, NULL, ASYMO_ACT_NONE);
                    for (int64_t o = 0; o < rows; o++) {
                        const float *src = rowbuf + o * WVW * m;
                        float *d = dst + o * OW;
                        if (rr) {
                            const float *ro = rr + o * OW;
                            for (int64_t c = 0; c < cols; c++)
                                d[c] = wino_act1(src[c] + ro[c], act);
                        } else {
                            for (int64_t c = 0; c < cols; c++)
                                d[c] = src[c];
                        }
                    }
                }
                i += run;
            }
        }
    }
}
