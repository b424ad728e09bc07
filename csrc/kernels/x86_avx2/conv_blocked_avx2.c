/* AVX2 kernels of the blocked-channel layout, float32 (kernels/conv_blocked.h; asymo/conv.h,
 * NCHW8c): a pixel's 8 channels of a block are one ymm vector.
 *
 * 1x1. A tile is up to three output blocks (24 channels) by 12 / blocks pixels: per input
 * channel, the blocks' weight vectors and the pixels' broadcast values feed twelve
 * multiply-adds into twelve accumulators (with the weights and a broadcast, at most 16
 * registers).
 * Unlike the NCHW pixel-row kernels (x86_avx2/conv_pointwise_avx2.c) the four pixels' inputs
 * of a block are one 128-byte run, and each accumulator is stored as it is: no transpose.
 *
 * Depthwise 3x3. Each output vector is 9 multiply-adds of input vectors by the block's 9
 * weight vectors (kept in registers); four outputs of a row at a time, inside the plane,
 * without bounds checks; the edge columns and padding rows with them. Stride 2 is only
 * another pixel step. An NCHW input (a chain's first layer) is reordered a row at a time
 * into L1 as the rows are reached, instead of by a pass of its own over the image. */
#if defined(__x86_64__)

#include "kernels/conv_blocked.h"
#include "kernels/x86_templates.h"

enum { GROUP = ASYMO_PW_BLOCKED_GROUP };

/* ---- reorders ----------------------------------------------------------------------------- */
ATTR_AVX2 void asymo_reorder_block_avx2(const float *x, float *y, int64_t pixels, int64_t ldp,
                                        int to_blocked)
{
    int64_t p = 0;
    __m256 r[8];
    if (to_blocked) {
        for (; p + 8 <= pixels; p += 8) {
            for (int c = 0; c < 8; c++)
                r[c] = _mm256_loadu_ps(x + c * ldp + p);
            transpose_8x8(r);
            for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(y + (p + i) * 8, r[i]);
        }
        for (; p < pixels; p++)
            for (int c = 0; c < 8; c++)
                y[p * 8 + c] = x[c * ldp + p];
    } else {
        for (; p + 8 <= pixels; p += 8) {
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_ps(x + (p + i) * 8);
            transpose_8x8(r);
            for (int c = 0; c < 8; c++)
                _mm256_storeu_ps(y + c * ldp + p, r[c]);
        }
        for (; p < pixels; p++)
            for (int c = 0; c < 8; c++)
                y[c * ldp + p] = x[p * 8 + c];
    }
}

/* ---- the tiles both kernels run ------------------------------------------------------------ */
/* The sums of NB output blocks by R pixels (NB x R <= 12) over nq (input block, tap) pairs:
 * pair q's 8 input channels of pixel r at x + (off ? off[q] : q * ldb) + r * S * 8 (pixels S
 * vectors apart), its weights at w + q * 64 NB (w[c * 8 NB + 8 j + lane]). The first part of
 * a layer's input channels starts from the bias (or zero), a later one from the sums the part
 * before left in `part` (the task's own buffer, blocks ldp apart: y is written once, with its
 * final values, as a backed-up task's late copy must). NB, R and S are constants in each
 * inlined copy; every loop over the accumulators is unrolled (one left rolled kept them in
 * memory, stored at every step of the loop over the pairs). */
ATTR_AVX2 static inline __attribute__((always_inline)) void tile_sums(
    __m256 acc[GROUP][12], const int NB, const int R, const int S, int64_t nq,
    const int64_t *off, int64_t ldb, const float *x, const float *w, const float *bias,
    int first, const float *part, int64_t ldp)
{
    _Pragma("GCC unroll 3") for (int j = 0; j < NB; j++) {
        const __m256 b = bias ? _mm256_loadu_ps(bias + 8 * j) : _mm256_setzero_ps();
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
            acc[j][r] = first ? b : _mm256_loadu_ps(part + j * ldp + r * 8);
    }
    /* one loop over the pairs (nested loops over blocks and taps made GCC store the
     * accumulators every step) */
    for (int64_t q = 0; q < nq; q++) {
        const float *xb = x + (off ? off[q] : q * ldb);
        const float *wb = w + q * 64 * NB;
        /* (not unrolled: unrolled, GCC ran out of registers and read each weight vector
         * once per pixel) */
        _Pragma("GCC unroll 1") for (int c = 0; c < 8; c++) {
            __m256 wv[GROUP];
            _Pragma("GCC unroll 3") for (int j = 0; j < NB; j++)
                wv[j] = _mm256_loadu_ps(wb + c * 8 * NB + 8 * j);
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {
                const __m256 xv = _mm256_broadcast_ss(xb + r * S * 8 + c);
                _Pragma("GCC unroll 3") for (int j = 0; j < NB; j++)
                    acc[j][r] = _mm256_fmadd_ps(xv, wv[j], acc[j][r]);
            }
        }
    }
}

/* The sums left for the next part. */
ATTR_AVX2 static inline __attribute__((always_inline)) void tile_to_part(
    __m256 acc[GROUP][12], const int NB, const int R, float *part, int64_t ldp)
{
    _Pragma("GCC unroll 3") for (int j = 0; j < NB; j++)
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
            _mm256_storeu_ps(part + j * ldp + r * 8, acc[j][r]);
}

/* A tile of r pixels (1 to 12 / NB): CALL(NB, R, ...) with R the constant r. */
#define TILE_R(NB, R) (12 / (NB) < (R) ? 12 / (NB) : (R))
#define TILE_SWITCH(r, NB, CALL, ...)                                                         \
    switch (r) {                                                                              \
    case 1: CALL(NB, 1, __VA_ARGS__); break;                                                  \
    case 2: CALL(NB, TILE_R(NB, 2), __VA_ARGS__); break;                                      \
    case 3: CALL(NB, TILE_R(NB, 3), __VA_ARGS__); break;                                      \
    case 4: CALL(NB, TILE_R(NB, 4), __VA_ARGS__); break;                                      \
    case 5: CALL(NB, TILE_R(NB, 5), __VA_ARGS__); break;                                      \
    case 6: CALL(NB, TILE_R(NB, 6), __VA_ARGS__); break;                                      \
    case 7: CALL(NB, TILE_R(NB, 7), __VA_ARGS__); break;                                      \
    case 8: CALL(NB, TILE_R(NB, 8), __VA_ARGS__); break;                                      \
    case 9: CALL(NB, TILE_R(NB, 9), __VA_ARGS__); break;                                      \
    case 10: CALL(NB, TILE_R(NB, 10), __VA_ARGS__); break;                                    \
    case 11: CALL(NB, TILE_R(NB, 11), __VA_ARGS__); break;                                    \
    default: CALL(NB, 12 / (NB), __VA_ARGS__); break;                                         \
    }

/* ---- 1x1 ---------------------------------------------------------------------------------- */
/* NB output blocks by R pixels, input channels [k0, k0 + kc): x at the tile's first pixel of
 * block k0 / 8 (blocks ldb apart), w the group's packed weights of channel k0, res and y at
 * the tile's first pixel of the group's first block (blocks ldb apart); the last part adds
 * the shortcut, applies the activation and stores to y. */
ATTR_AVX2 static inline __attribute__((always_inline)) void pw_tile(
    const int NB, const int R, int64_t kc, const float *x, int64_t ldb, const float *w,
    const float *bias, const float *res, float *y, const int act, int first, int last,
    float *part, int64_t ldp)
{
    __m256 acc[GROUP][12];
    tile_sums(acc, NB, R, 1, kc / 8, NULL, ldb, x, w, bias, first, part, ldp);
    if (!last) {
        tile_to_part(acc, NB, R, part, ldp);
        return;
    }
    _Pragma("GCC unroll 3") for (int j = 0; j < NB; j++)
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {
            __m256 v = acc[j][r];
            if (res)
                v = _mm256_add_ps(v, _mm256_loadu_ps(res + j * ldb + r * 8));
            _mm256_storeu_ps(y + j * ldb + r * 8, activate_ps256(v, act));
        }
}

/* pixels [p0, p1) of NB blocks, tiles of 12 / NB pixels and a last smaller one */
#define PW_PIXELS(NB, ACT)                                                                    \
    for (int64_t p = p0; p < p1; p += 12 / (NB)) {                                            \
        const int r = (int)(p1 - p < 12 / (NB) ? p1 - p : 12 / (NB));                         \
        const float *xp = x + p * 8;                                                          \
        const float *rp = res ? res + p * 8 : NULL;                                           \
        float *yp = y + p * 8;                                                                \
        float *pp = part ? part + (p - p0) * 8 : NULL;                                        \
        TILE_SWITCH(r, NB, pw_tile, kc, xp, ldb, w, bias, rp, yp, ACT, first, last, pp, ldp)  \
    }

#define PW_BODY(ACT)                                                                          \
    if (nb == 3) {                                                                            \
        PW_PIXELS(3, ACT)                                                                     \
    } else if (nb == 2) {                                                                     \
        PW_PIXELS(2, ACT)                                                                     \
    } else {                                                                                  \
        PW_PIXELS(1, ACT)                                                                     \
    }

ATTR_AVX2 void asymo_pointwise_blocked_avx2(const asymo_pointwise_blocked_job *job, int64_t b0,
                                            int nb, int64_t p0, int64_t p1, int64_t k0,
                                            int64_t k1, float *part)
{
    const int64_t ldp = (p1 - p0) * 8;
    const int64_t k = job->channels, kc = k1 - k0, ldb = job->pixels * 8;
    const int first = k0 == 0, last = k1 == k;
    const float *x = job->x + k0 / 8 * ldb;
    const float *w = job->weight + b0 * 8 * k + k0 * 8 * nb;
    const float *bias = job->bias ? job->bias + b0 * 8 : NULL;
    const float *res = job->residual ? job->residual + b0 * ldb : NULL;
    float *y = job->y + b0 * ldb;
    switch (job->activation) {
    case ASYMO_ACT_RELU: PW_BODY(ASYMO_ACT_RELU) break;
    case ASYMO_ACT_RELU6: PW_BODY(ASYMO_ACT_RELU6) break;
    default: PW_BODY(ASYMO_ACT_NONE) break;
    }
}

/* ---- dense, any kernel, NCHW output -------------------------------------------------------- */
/* NB output blocks by R pixels of one output row, S apart in the padded copy x (at the tile's
 * first window's top-left corner, input block ib0 of the part), the part's nq (input block,
 * tap) pairs at x + off[q], w the group's packed weights of block ib0; the last part adds the
 * shortcut, applies the activation and stores to y, NCHW (y and res at the tile's first pixel
 * of the group's first channel; channels `plane` floats apart). */
ATTR_AVX2 static inline __attribute__((always_inline)) void dense_tile(
    const int NB, const int R, const int S, int64_t nq, const int64_t *off, const float *x,
    const float *w, const float *bias, int first, int last, float *part, int64_t ldp,
    float *y, const float *res, int64_t plane, int act)
{
    __m256 acc[GROUP][12];
    tile_sums(acc, NB, R, S, nq, off, 0, x, w, bias, first, part, ldp);
    if (!last) {
        tile_to_part(acc, NB, R, part, ldp);
        return;
    }
    /* a channel's values of the tile are R consecutive floats of its plane: each pixel's
     * vector goes out lane by lane (a few stores per tile of thousands of multiply-adds) */
    const __m256i lanes = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32((int)plane));
    _Pragma("GCC unroll 3") for (int j = 0; j < NB; j++)
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {
            __m256 v = acc[j][r];
            if (res)
                v = _mm256_add_ps(v, _mm256_i32gather_ps(res + 8 * j * plane + r, lanes, 4));
            float t[8];
            _mm256_storeu_ps(t, activate_ps256(v, act));
            float *yp = y + 8 * j * plane + r;
            for (int l = 0; l < 8; l++)
                yp[l * plane] = t[l];
        }
}

/* pixels [ox0, ox1) of output row oy in the fewest tiles of at most 12 / NB pixels, as even
 * as possible (a 14-pixel row is 4 + 4 + 3 + 3, not 4 + 4 + 4 + 2) */
#define DENSE_PIXELS(NB, S)                                                                   \
    {                                                                                         \
        const int64_t n = ox1 - ox0, nt = (n + 12 / (NB) - 1) / (12 / (NB));                  \
        int64_t ox = ox0;                                                                     \
        for (int64_t i = 0; i < nt; i++) {                                                    \
            const int r = (int)(n / nt + (i < n % nt));                                       \
            const float *xp = x + (oy * (S) * wp + ox * (S)) * 8;                             \
            const int64_t o = oy * ow + ox;                                                   \
            const float *rp = res ? res + o : NULL;                                           \
            float *yp = y + o;                                                                \
            float *pp = part ? part + (ox - ox0) * 8 : NULL;                                  \
            TILE_SWITCH(r, NB, dense_tile, S, nq, off, xp, w, bias, first, last, pp, ldp, yp, \
                        rp, plane, act)                                                       \
            ox += r;                                                                          \
        }                                                                                     \
    }
#define DENSE_BODY(S)                                                                         \
    if (nb == 3) {                                                                            \
        DENSE_PIXELS(3, S)                                                                    \
    } else if (nb == 2) {                                                                     \
        DENSE_PIXELS(2, S)                                                                    \
    } else {                                                                                  \
        DENSE_PIXELS(1, S)                                                                    \
    }

ATTR_AVX2 void asymo_dense_blocked_avx2(const asymo_dense_blocked_job *job, const float *xpad,
                                        int64_t wp, int64_t ldb, const int64_t *off,
                                        const float *wpack, int64_t b0, int nb, int64_t oy,
                                        int64_t ox0, int64_t ox1, int64_t ib0, int64_t ib1,
                                        float *part, int64_t ldp)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t kh = g->kernel_h, kw = g->kernel_w, ow = g->out_w;
    const int64_t plane = g->out_h * ow, nblocks = g->channels / 8;
    const int first = ib0 == 0, last = ib1 == nblocks, act = job->activation;
    const float *x = xpad + ib0 * ldb;
    /* (a shorter last part reads the table's first pairs) */
    const int64_t nq = (ib1 - ib0) * kh * kw;
    const float *w = wpack + b0 * 8 * g->channels * kh * kw + ib0 * kh * kw * 64 * nb;
    const float *bias = job->bias ? (const float *)job->bias + b0 * 8 : NULL;
    const float *res = job->residual ? (const float *)job->residual + b0 * 8 * plane : NULL;
    float *y = (float *)job->y + b0 * 8 * plane;
    if (g->stride_w == 2) {
        DENSE_BODY(2)
    } else {
        DENSE_BODY(1)
    }
}

/* ---- depthwise 3x3 ------------------------------------------------------------------------ */
/* One output vector at column ox of a row whose input rows are rows[0..2] (NULL: padding),
 * any column (bounds checked). */
ATTR_AVX2 static inline __attribute__((always_inline)) __m256 dw_edge(
    const float *const rows[3], const __m256 wk[9], __m256 acc, int64_t ix0, int64_t W)
{
    for (int ky = 0; ky < 3; ky++) {
        if (!rows[ky])
            continue;
        for (int kx = 0; kx < 3; kx++) {
            const int64_t ix = ix0 + kx;
            if (ix >= 0 && ix < W)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(rows[ky] + ix * 8), wk[3 * ky + kx], acc);
        }
    }
    return acc;
}

ATTR_AVX2 static inline __attribute__((always_inline)) __m256 dw_finish(__m256 v, const float *r,
                                                                        const int act)
{
    if (r)
        v = _mm256_add_ps(v, _mm256_loadu_ps(r));
    return activate_ps256(v, act);
}

ATTR_AVX2 static inline __attribute__((always_inline)) void dw_rows(
    const asymo_depthwise_blocked_job *job, int64_t b, int64_t oy0, int64_t oy1, const int S,
    const int act)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t ph = g->pad_h, pw = g->pad_w;
    const float *x = job->x + b * H * W * 8;
    /* NCHW input: rows reordered into a ring of three as they are first needed (the rows of
     * output row oy are consecutive, so row iy keeps slot iy % 3 while it is needed) */
    float ring[3][ASYMO_DW_BLOCKED_PLANAR_MAX_WIDTH * 8];
    int64_t staged[3] = {-1, -1, -1};
    const float *xp = job->x_planar ? job->x + b * 8 * H * W : NULL;
    float *y = job->y + b * oh * ow * 8;
    const float *res = job->residual ? job->residual + b * oh * ow * 8 : NULL;
    __m256 wk[9];
    for (int t = 0; t < 9; t++)
        wk[t] = _mm256_loadu_ps(job->weight + (b * 9 + t) * 8);
    const __m256 bias = job->bias ? _mm256_loadu_ps(job->bias + b * 8) : _mm256_setzero_ps();
    /* columns whose three taps lie inside the row: ox * S - pw >= 0, ox * S - pw + 2 < W */
    const int64_t lo = (pw + S - 1) / S;
    int64_t hi = W - 3 + pw >= 0 ? (W - 3 + pw) / S + 1 : 0;
    hi = hi < ow ? hi : ow;
    const int64_t in_lo = lo < hi ? lo : hi;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        const float *rows[3];
        for (int ky = 0; ky < 3; ky++) {
            const int64_t iy = oy * S - ph + ky;
            if (iy < 0 || iy >= H) {
                rows[ky] = NULL;
            } else if (xp) {
                const int slot = (int)(iy % 3);
                if (staged[slot] != iy) {
                    asymo_reorder_block_avx2(xp + iy * W, ring[slot], W, H * W, 1);
                    staged[slot] = iy;
                }
                rows[ky] = ring[slot];
            } else {
                rows[ky] = x + iy * W * 8;
            }
        }
        float *yr = y + oy * ow * 8;
        const float *rr = res ? res + oy * ow * 8 : NULL;
        int64_t ox = 0;
        for (; ox < in_lo; ox++)
            _mm256_storeu_ps(yr + ox * 8, dw_finish(dw_edge(rows, wk, bias, ox * S - pw, W),
                                                    rr ? rr + ox * 8 : NULL, act));
        const int full = rows[0] && rows[1] && rows[2];
        for (; full && ox + 4 <= hi; ox += 4) {
            __m256 acc[4] = {bias, bias, bias, bias};
            for (int ky = 0; ky < 3; ky++) {
                const float *p = rows[ky] + (ox * S - pw) * 8;
                for (int kx = 0; kx < 3; kx++)
                    for (int i = 0; i < 4; i++)
                        acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(p + (i * S + kx) * 8),
                                                 wk[3 * ky + kx], acc[i]);
            }
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(yr + (ox + i) * 8,
                                 dw_finish(acc[i], rr ? rr + (ox + i) * 8 : NULL, act));
        }
        for (; ox < ow; ox++)
            _mm256_storeu_ps(yr + ox * 8, dw_finish(dw_edge(rows, wk, bias, ox * S - pw, W),
                                                    rr ? rr + ox * 8 : NULL, act));
    }
}

#define DW_ACT(S)     \
    switch (job->activation) {                                                                \
    case ASYMO_ACT_RELU: dw_rows(job, b, oy0, oy1, S, ASYMO_ACT_RELU); break;                 \
    case ASYMO_ACT_RELU6: dw_rows(job, b, oy0, oy1, S, ASYMO_ACT_RELU6); break;               \
    default: dw_rows(job, b, oy0, oy1, S, ASYMO_ACT_NONE); break;                             \
    }

ATTR_AVX2 void asymo_depthwise_blocked_avx2(const asymo_depthwise_blocked_job *job, int64_t b,
                                            int64_t oy0, int64_t oy1)
{
    if (job->geom.stride_h == 2) {
        DW_ACT(2)
    } else {
        DW_ACT(1)
    }
}

#endif
