/* Direct 3x3 depthwise kernels for AVX2+FMA (see conv/dwconv3x3.h).
 *
 * float: one ymm holds 8 outputs of a row; each valid input row contributes 3 FMAs. Stride 1
 * loads the taps unaligned at ix, ix + 1, ix + 2; stride 2 loads 16 inputs, splits them into
 * even and odd lanes (taps 0 and 1) and takes tap 2 from the even lanes of the 16 inputs 2
 * further on. Rows up to STAGE_MAX_W wide are first copied into zero-padded buffers on the
 * stack, so every tap is a plain load and only the row's last store is masked; wider rows
 * load straight from the plane, with masked loads (which read zero outside the row and never
 * fault there) for the padding columns and the tail. Padding rows are skipped. Bias, residual
 * and activation are applied before the one store.
 *
 * double: the plain-C kernel (conv/dwconv3x3_impl.h), compiled here for AVX2+FMA. */
#include "conv/dwconv3x3.h"

#include <stddef.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define ATTR __attribute__((target("avx2,fma")))
#define INLINE ATTR static inline __attribute__((always_inline))

/* Lanes ix .. ix + 7 of a row of W floats, zero outside [0, W). The masked-off lanes are not
 * read, so row + ix may point before or past the row. */
INLINE __m256 load_masked(const float *row, int64_t ix, int64_t W)
{
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)ix),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i inside = _mm256_andnot_si256(
        _mm256_cmpgt_epi32(_mm256_setzero_si256(), idx),
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)W), idx));
    return _mm256_maskload_ps((const float *)((uintptr_t)row + (uintptr_t)(ix * 4)), inside);
}

INLINE __m256 load8(const float *row, int64_t ix, int64_t W, int masked)
{
    return masked ? load_masked(row, ix, W) : _mm256_loadu_ps(row + ix);
}

/* The first n (1..7) lanes of v to p. Not vmaskmovps: its store form is slow on AMD cores
 * (a quarter of a 7x7 layer's time went to it). */
INLINE void store_first(float *p, __m256 v, int64_t n)
{
    __m128 lo = _mm256_castps256_ps128(v);
    if (n >= 4) {
        _mm_storeu_ps(p, lo);
        lo = _mm256_extractf128_ps(v, 1);
        p += 4;
        n -= 4;
    }
    if (n >= 2) {
        _mm_storel_pi((__m64 *)p, lo);
        lo = _mm_movehl_ps(lo, lo);
        p += 2;
        n -= 2;
    }
    if (n)
        _mm_store_ss(p, lo);
}

/* What a channel's rows need: its taps broadcast, its bias, its output and residual planes. */
typedef struct {
    __m256 wk[9];
    __m256 bias;
    float *y;
    const float *res;
} channel;

INLINE void channel_setup(channel *ch, const asymo_dwconv_job *job, int64_t n, int64_t oc)
{
    const int64_t plane = job->geom.out_h * job->geom.out_w;
    const float *w = (const float *)job->weight + oc * 9;
    for (int t = 0; t < 9; t++)
        ch->wk[t] = _mm256_set1_ps(w[t]);
    ch->bias = _mm256_set1_ps(job->bias ? ((const float *)job->bias)[oc] : 0.0f);
    ch->y = (float *)job->y + n * job->y_image_stride + oc * plane;
    ch->res = job->residual ? (const float *)job->residual + n * job->residual_image_stride
                                  + oc * plane
                            : NULL;
}

/* the activation, then the first n (1..8) lanes of acc to p: vmaxps / vminps return their
 * second operand when either is NaN, so NaN propagates as in torch */
INLINE void act_store(float *p, __m256 acc, int act, int64_t n)
{
    if (act == ASYMO_ACT_RELU)
        acc = _mm256_max_ps(_mm256_setzero_ps(), acc);
    else if (act == ASYMO_ACT_RELU6)
        acc = _mm256_min_ps(_mm256_set1_ps(6.0f), _mm256_max_ps(_mm256_setzero_ps(), acc));
    if (n >= 8)
        _mm256_storeu_ps(p, acc);
    else
        store_first(p, acc, n);
}

/* the three rows' partial sums, activated and stored (n lanes) */
INLINE void finish(float *p, const __m256 *part, int act, int64_t n)
{
    act_store(p, _mm256_add_ps(_mm256_add_ps(part[0], part[1]), part[2]), act, n);
}

/* even and odd lanes of the 16 floats a, b */
INLINE __m256 even_lanes(__m256 a, __m256 b)
{
    const __m256 s = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

INLINE __m256 odd_lanes(__m256 a, __m256 b)
{
    const __m256 s = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* acc + the three taps of input row r for the 8 outputs whose first tap is at column ix */
INLINE __m256 row_taps(__m256 acc, const float *r, int64_t ix, int64_t W, const __m256 *wk,
                       int stride, int masked)
{
    if (stride == 1) {
        acc = _mm256_fmadd_ps(load8(r, ix, W, masked), wk[0], acc);
        acc = _mm256_fmadd_ps(load8(r, ix + 1, W, masked), wk[1], acc);
        return _mm256_fmadd_ps(load8(r, ix + 2, W, masked), wk[2], acc);
    }
    const __m256 a = load8(r, ix, W, masked), b = load8(r, ix + 8, W, masked);
    const __m256 c = load8(r, ix + 2, W, masked), d = load8(r, ix + 10, W, masked);
    acc = _mm256_fmadd_ps(even_lanes(a, b), wk[0], acc);
    acc = _mm256_fmadd_ps(odd_lanes(a, b), wk[1], acc);
    return _mm256_fmadd_ps(even_lanes(c, d), wk[2], acc);
}

/* One output row: outputs [0, ow) from input rows r[0..2] (NULL: a padding row). */
INLINE void out_row(float *yr, const float *rr, const float *const *r, const __m256 *wk,
                    __m256 bias, int act, int64_t W, int64_t ow, int64_t pw, int stride)
{
    /* the columns of full vectors whose taps all lie in [0, W) */
    const int64_t reach = stride == 1 ? 10 : 18;  /* last column loaded + 1, from ix */
    for (int64_t ox = 0; ox < ow; ox += 8) {
        const int64_t ix = ox * stride - pw;
        const int64_t left = ow - ox;
        const int masked = ix < 0 || ix + reach > W || left < 8;
        __m256 acc = bias;
        __m256i keep = _mm256_setzero_si256();
        if (masked) {
            keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(left < 8 ? left : 8)),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            if (rr)
                acc = _mm256_add_ps(acc, _mm256_maskload_ps(rr + ox, keep));
            for (int k = 0; k < 3; k++)
                if (r[k])
                    acc = row_taps(acc, r[k], ix, W, wk + 3 * k, stride, 1);
        } else {
            if (rr)
                acc = _mm256_add_ps(acc, _mm256_loadu_ps(rr + ox));
            for (int k = 0; k < 3; k++)
                if (r[k])
                    acc = row_taps(acc, r[k], ix, W, wk + 3 * k, stride, 0);
        }
        act_store(yr + ox, acc, act, left);
    }
}

/* The output rows of a plane whose input rows are read with masked loads (wide rows, beyond
 * what the row ring below holds). */
ATTR static void plane_masked(const asymo_dwconv_job *job, int64_t n, int64_t oc, int64_t oy0,
                              int64_t oy1)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, C = g->channels, ow = g->out_w;
    const int64_t sh = g->stride_h, ph = g->pad_h, pw = g->pad_w;
    const float *x = (const float *)job->x + (n * C + oc) * H * W;
    channel ch;
    channel_setup(&ch, job, n, oc);
    const __m256 *wk = ch.wk, bias = ch.bias;
    float *y = ch.y;
    const float *res = ch.res;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        const float *r[3];
        for (int64_t k = 0; k < 3; k++) {
            const int64_t iy = oy * sh - ph + k;
            r[k] = iy >= 0 && iy < H ? x + iy * W : NULL;
        }
        const float *rr = res ? res + oy * ow : NULL;
        /* the stride as a constant in each copy of the row loop */
        if (g->stride_w == 1)
            out_row(y + oy * ow, rr, r, wk, bias, job->activation, W, ow, pw, 1);
        else
            out_row(y + oy * ow, rr, r, wk, bias, job->activation, W, ow, pw, 2);
    }
}

/* Rows up to this wide are staged (below); wider ones read the planes with masked loads. */
enum { STAGE_MAX_W = 256, STAGE_LEFT = 8, STAGE_FLOATS = 2048 };

/* The accumulator's start for outputs [ox, ox + 8): bias, plus the residual row when there is
 * one (a masked load past the row's end). */
INLINE __m256 bias_residual(__m256 bias, const float *rr, int64_t ox, int full, __m256i tail)
{
    if (!rr)
        return bias;
    return _mm256_add_ps(bias, full ? _mm256_loadu_ps(rr + ox)
                                    : _mm256_maskload_ps(rr + ox, tail));
}

/* One output row from zero-padded input rows (column ix at r[k][ix], r[k][-STAGE_LEFT .. -1]
 * and everything past the row zero): plain loads only; the last vector's store is masked. */
INLINE void out_row_staged(float *yr, const float *rr, const float *const *r, const __m256 *wk,
                           __m256 bias, int act, int64_t ow, int64_t pw, __m256i tail,
                           int stride)
{
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t ox = 0; ox < ow; ox += 8) {
        const int64_t ix = ox * stride - pw;
        const int full = ox + 8 <= ow;
        /* one chain per input row: a 9-FMA chain's latency bounded the small planes */
        __m256 part[3] = {bias_residual(bias, rr, ox, full, tail), zero, zero};
        for (int k = 0; k < 3; k++)
            if (r[k])
                part[k] = row_taps(part[k], r[k], ix, 0, wk + 3 * k, stride, 0);
        finish(yr + ox, part, act, full ? 8 : ow - ox);
    }
}

/* out_row_staged for stride 2 along the row, the input rows staged split: even columns at
 * r[k][0 ..], odd columns at r[k][half ..]. Taps of output column ox: columns 2 ox - pw + t,
 * i.e. even ox, odd ox, even ox + 1 (pw 0) or odd ox - 1, even ox, odd ox (pw 1). */
INLINE void out_row_staged_s2(float *yr, const float *rr, const float *const *r,
                              const __m256 *wk, __m256 bias, int act, int64_t ow, int64_t half,
                              __m256i tail, int pw)
{
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t ox = 0; ox < ow; ox += 8) {
        const int full = ox + 8 <= ow;
        __m256 part[3] = {bias_residual(bias, rr, ox, full, tail), zero, zero};
        for (int k = 0; k < 3; k++) {
            if (!r[k])
                continue;
            const float *e = r[k] + ox, *o = e + half;
            const __m256 t0 = pw ? _mm256_loadu_ps(o - 1) : _mm256_loadu_ps(e);
            const __m256 t1 = pw ? _mm256_loadu_ps(e) : _mm256_loadu_ps(o);
            const __m256 t2 = pw ? _mm256_loadu_ps(o) : _mm256_loadu_ps(e + 1);
            part[k] = _mm256_fmadd_ps(t0, wk[3 * k], part[k]);
            part[k] = _mm256_fmadd_ps(t1, wk[3 * k + 1], part[k]);
            part[k] = _mm256_fmadd_ps(t2, wk[3 * k + 2], part[k]);
        }
        finish(yr + ox, part, act, full ? 8 : ow - ox);
    }
}

/* A piece of work: output rows [a, min(a + chunk, oy1)) of channel oc. */
typedef struct {
    int64_t oc, a;
} stage_item;

/* The staged kernel for stride sw along the rows (a constant in each copy). */
INLINE void staged(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1, int64_t oy0,
                   int64_t oy1, int sw)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, C = g->channels, ow = g->out_w;
    const int64_t sh = g->stride_h, ph = g->pad_h, pw = g->pad_w;
    /* The input rows of a chunk of output rows are copied into a zero-padded buffer first, so
       that every tap is a plain load (masked loads of the padding columns and row tails cost
       more than the copy on small planes). Two buffers alternate: the next chunk is copied
       before the current one is computed, so no load reads a store still in flight (reading
       a just-copied row stalled on store forwarding). A buffer row holds STAGE_LEFT zeros, the
       row, and zeros up to the furthest column a vector reads (ow rounded up to 8, + 10);
       only the row part is ever rewritten, so the zeros are written once per call. Stride 2
       along the row stages a row as its even columns then its odd columns (half floats
       each), split once per row rather than once per use: its taps are plain loads too. */
    const int64_t ow8 = (ow + 7) & ~(int64_t)7, w8 = (W + 7) & ~(int64_t)7;
    const int64_t w16 = (W + 15) & ~(int64_t)15;
    int64_t span = sw == 1 ? ow8 + 18 : ow8 + 10;
    if (sw == 1)
        span = span > w8 ? span : w8;
    else
        span = span > w16 / 2 ? span : w16 / 2;
    const int64_t half = (STAGE_LEFT + span + 7) & ~(int64_t)7;
    const int64_t len = sw == 1 ? half : 2 * half;
    int64_t chunk = (STAGE_FLOATS / len - 3) / sh + 1;  /* output rows per buffer */
    chunk = chunk < oy1 - oy0 ? chunk : oy1 - oy0;
    const int64_t rows = (chunk - 1) * sh + 3;
    float buf[2][STAGE_FLOATS] __attribute__((aligned(32)));
    memset(buf[0], 0, (size_t)(rows * len) * sizeof(float));
    memset(buf[1], 0, (size_t)(rows * len) * sizeof(float));
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i row_tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(W - (w8 - 8))), iota);
    /* the two halves of the last 16 columns (stride 2) */
    const __m256i tail16a = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(W - (w16 - 16))), iota);
    const __m256i tail16b =
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(W - (w16 - 16) - 8)), iota);
    const __m256i out_tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(ow - (ow8 - 8))), iota);

    stage_item cur = {oc0, oy0};
    int which = 0;
    /* stage: copy the input rows of item it into buf[b] */
#define STAGE(it, b)                                                                           \
    do {                                                                                       \
        const float *x_ = (const float *)job->x + (n * C + (it).oc) * H * W;                   \
        const int64_t b1_ = (it).a + chunk < oy1 ? (it).a + chunk : oy1;                       \
        const int64_t iy0_ = (it).a * sh - ph, iy1_ = (b1_ - 1) * sh - ph + 3;                 \
        for (int64_t iy = iy0_ < 0 ? 0 : iy0_; iy < iy1_ && iy < H; iy++) {                    \
            float *d_ = buf[b] + (iy - iy0_) * len + STAGE_LEFT;                               \
            const float *s_ = x_ + iy * W;                                                     \
            int64_t i_ = 0;                                                                    \
            if (sw == 1) {                                                                     \
                for (; i_ + 8 <= W; i_ += 8)                                                   \
                    _mm256_store_ps(d_ + i_, _mm256_loadu_ps(s_ + i_));                        \
                if (i_ < W) /* lanes past the row load as zero: the padding stays zero */       \
                    _mm256_store_ps(d_ + i_, _mm256_maskload_ps(s_ + i_, row_tail));           \
                continue;                                                                      \
            }                                                                                  \
            for (; i_ + 16 <= W; i_ += 16) {                                                   \
                const __m256 a_ = _mm256_loadu_ps(s_ + i_), c_ = _mm256_loadu_ps(s_ + i_ + 8); \
                _mm256_store_ps(d_ + i_ / 2, even_lanes(a_, c_));                              \
                _mm256_store_ps(d_ + half + i_ / 2, odd_lanes(a_, c_));                        \
            }                                                                                  \
            if (i_ < W) {                                                                      \
                const __m256 a_ = _mm256_maskload_ps(s_ + i_, tail16a);                        \
                const __m256 c_ = _mm256_maskload_ps(s_ + i_ + 8, tail16b);                    \
                _mm256_store_ps(d_ + i_ / 2, even_lanes(a_, c_));                              \
                _mm256_store_ps(d_ + half + i_ / 2, odd_lanes(a_, c_));                        \
            }                                                                                  \
        }                                                                                      \
    } while (0)
    STAGE(cur, 0);
    while (cur.oc < oc1) {
        stage_item next = {cur.oc, cur.a + chunk};
        if (next.a >= oy1) {
            next.a = oy0;
            next.oc++;
        }
        if (next.oc < oc1)
            STAGE(next, which ^ 1);

        const int64_t oc = cur.oc, b1 = cur.a + chunk < oy1 ? cur.a + chunk : oy1;
        channel ch;
        channel_setup(&ch, job, n, oc);
        const __m256 *wk = ch.wk, bias = ch.bias;
        float *y = ch.y;
        const float *res = ch.res;
        const int64_t iy0 = cur.a * sh - ph;
        for (int64_t oy = cur.a; oy < b1; oy++) {
            const float *r[3];
            for (int64_t k = 0; k < 3; k++) {
                const int64_t iy = oy * sh - ph + k;
                r[k] = iy >= 0 && iy < H ? buf[which] + (iy - iy0) * len + STAGE_LEFT : NULL;
            }
            const float *rr = res ? res + oy * ow : NULL;
            if (sw == 1)
                out_row_staged(y + oy * ow, rr, r, wk, bias, job->activation, ow, pw, out_tail,
                               1);
            else if (pw == 0)
                out_row_staged_s2(y + oy * ow, rr, r, wk, bias, job->activation, ow, half,
                                  out_tail, 0);
            else
                out_row_staged_s2(y + oy * ow, rr, r, wk, bias, job->activation, ow, half,
                                  out_tail, 1);
        }
        cur = next;
        which ^= 1;
    }
#undef STAGE
}

ATTR void asymo_dw3x3_f32_avx2(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1,
                               int64_t oy0, int64_t oy1)
{
    const asymo_conv_geometry *g = &job->geom;
    if (g->width > STAGE_MAX_W || g->out_w > STAGE_MAX_W || oy0 >= oy1) {
        for (int64_t oc = oc0; oc < oc1; oc++)
            plane_masked(job, n, oc, oy0, oy1);
    } else if (g->stride_w == 1) {
        staged(job, n, oc0, oc1, oy0, oy1, 1);
    } else {
        staged(job, n, oc0, oc1, oy0, oy1, 2);
    }
}

#define DW3_ATTR ATTR
#define DW3_T double
#define DW3_FN(name) name##_f64_avx2
#include "conv/dwconv3x3_impl.h"
#undef DW3_FN
#undef DW3_T
#undef DW3_ATTR

#else
typedef int asymo_dwconv3x3_avx2_unused;  /* nothing to build on other architectures */
#endif
