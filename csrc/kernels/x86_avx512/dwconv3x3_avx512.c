/* Direct 3x3 depthwise kernels with AVX-512 (see conv/dwconv3x3.h): small stride-1 "same"
 * planes as flat arrays (asymo_dw3x3_f32_avx512_flat), and stride 2 each way on planes of any
 * size (asymo_dw3x3_f32_avx512_s2).
 *
 * Flat planes (stride 1, padding 1, output plane = input plane, asymo_dw3x3_flat_applies).
 * The row kernels (kernels/x86_avx2/dwconv3x3_avx2.c) pay a row's setup (staging its input
 * rows, a partial last vector) for every output row: on MobileNet's 7x7 and 14x14 planes that
 * is most of the work (a 7-wide row fills 7 of 8 lanes of one vector). Here a plane is one
 * flat array: output o = (i, j) takes tap (a, b) from input o + a * W + b, so 16 consecutive
 * outputs, across row ends, take each tap from 16 consecutive inputs. What differs per lane
 * is only which taps exist: the row above / below (outside the plane at the first / last
 * row) and the column left / right (wrapping into the neighbouring row at the first / last
 * column). Those lanes are masked off in the tap's load (an AVX-512 masked load reads zero
 * there and never faults, even before or past the plane), with masks made once per task for
 * all its channels. 49 outputs of a 7x7 plane are 4 vectors, 196 of a 14x14 plane 13.
 * Bias, residual and activation are applied before the one store.
 *
 * Stride 2. The AVX2 row kernel stages every input row through a buffer, split into even and
 * odd columns, and then reads it back; on the small planes of MobileNet's stride-2 layers
 * (14x14 -> 7x7, 28x28 -> 14x14) that staging, its masked AVX2 loads and the per-row setup
 * cost more than the arithmetic. Here the 16 outputs of a row chunk take their taps from 33
 * consecutive input columns, read straight from the plane with masked loads (zero outside the
 * row, no fault) into two vectors and one lane, and split in registers by two-source permutes
 * (vpermt2ps: even columns, odd columns) and a one-lane shift; nothing goes through memory.
 * A chunk walks down the plane: each input row's three tap vectors are made once and kept in
 * registers for the second output row that reads them (rows 2i + 1 - pad_h serve output rows
 * i and i + 1). */
#include "conv/dwconv3x3.h"

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/x86_templates.h"

#define ATTR __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))

#include "kernels/x86_avx512/stride2_taps.h" /* (uses ATTR) */

enum { FLAT_MAX_VECS = (ASYMO_DW3X3_FLAT_MAX + 15) / 16 };

/* Output channels [oc0, oc1) of image n, flat outputs [o0, o0 + 16 nv) with the masks of
 * asymo_dw3x3_f32_avx512_flat. */
ATTR static inline __attribute__((always_inline)) void channels(
    const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1, int64_t o0, int64_t nv,
    const __mmask16 (*m)[9], const __mmask16 *mst, const int act)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t W = g->width, C = g->channels, HW = g->height * W;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t oc = oc0; oc < oc1; oc++) {
        const float *x = (const float *)job->x + (n * C + oc) * HW + o0;
        float *y = (float *)job->y + n * job->y_image_stride + oc * HW + o0;
        const float *res = job->residual ? (const float *)job->residual
                                               + n * job->residual_image_stride + oc * HW + o0
                                         : NULL;
        const float *wt = (const float *)job->weight + oc * 9;
        __m512 wk[9];
        for (int t = 0; t < 9; t++)
            wk[t] = _mm512_set1_ps(wt[t]);
        const __m512 bias = _mm512_set1_ps(job->bias ? ((const float *)job->bias)[oc] : 0.0f);
        for (int64_t v = 0; v < nv; v++) {
            const float *p = x + 16 * v;
            const __mmask16 *mv = m[v];
            /* one chain per input row: a 9-FMA chain's latency would bound the small planes */
            __m512 part[3];
            part[0] = res ? _mm512_add_ps(bias, _mm512_maskz_loadu_ps(mst[v], res + 16 * v))
                          : bias;
            part[1] = zero;
            part[2] = zero;
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++)
                    part[a] = _mm512_fmadd_ps(
                        _mm512_maskz_loadu_ps(mv[3 * a + b], shifted(p, (a - 1) * W + b - 1)),
                        wk[3 * a + b], part[a]);
            const __m512 acc =
                activate_ps512(_mm512_add_ps(_mm512_add_ps(part[0], part[1]), part[2]), act);
            if (mst[v] == (__mmask16)0xFFFF)
                _mm512_storeu_ps(y + 16 * v, acc);
            else
                _mm512_mask_storeu_ps(y + 16 * v, mst[v], acc);
        }
    }
}

ATTR void asymo_dw3x3_f32_avx512_flat(const asymo_dwconv_job *job, int64_t n, int64_t oc0,
                                      int64_t oc1, int64_t oy0, int64_t oy1)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, HW = H * W;
    const int64_t o0 = oy0 * W, o1 = oy1 * W;
    if (o1 <= o0 || oc1 <= oc0)
        return;
    const int64_t nv = (o1 - o0 + 15) / 16;
    /* per vector: the 9 taps' lane masks and the store mask */
    __mmask16 m[FLAT_MAX_VECS][9], mst[FLAT_MAX_VECS];
    {
        const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                               15);
        const __m512i vW = _mm512_set1_epi32((int32_t)W), vlast = _mm512_set1_epi32((int32_t)(W - 1));
        const __m512i vend = _mm512_set1_epi32((int32_t)o1);
        const __m512i vdown = _mm512_set1_epi32((int32_t)(HW - W));
        const __m512 fW = _mm512_set1_ps((float)W);
        for (int64_t v = 0; v < nv; v++) {
            const __m512i o = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(o0 + 16 * v)), iota);
            /* o / W: exact in float for these sizes (o < 2^11: the quotient is at least 1/W
               from the next integer, far above float's rounding) */
            const __m512i q = _mm512_cvttps_epi32(
                _mm512_roundscale_ps(_mm512_div_ps(_mm512_cvtepi32_ps(o), fW),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
            const __m512i j = _mm512_sub_epi32(o, _mm512_mullo_epi32(q, vW));
            const __mmask16 in = _mm512_cmplt_epi32_mask(o, vend);
            const __mmask16 row[3] = {
                (__mmask16)(in & _mm512_cmpge_epi32_mask(o, vW)),    /* a row above */
                in,
                (__mmask16)(in & _mm512_cmplt_epi32_mask(o, vdown)), /* a row below */
            };
            const __mmask16 col[3] = {
                _mm512_cmpneq_epi32_mask(j, _mm512_setzero_si512()), /* a column left */
                (__mmask16)0xFFFF,
                _mm512_cmpneq_epi32_mask(j, vlast),                  /* a column right */
            };
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++)
                    m[v][3 * a + b] = (__mmask16)(row[a] & col[b]);
            mst[v] = in;
        }
    }
    /* the activation as a constant in each copy of the channel loop */
    switch (job->activation) {
    case ASYMO_ACT_RELU: channels(job, n, oc0, oc1, o0, nv, m, mst, ASYMO_ACT_RELU); break;
    case ASYMO_ACT_RELU6: channels(job, n, oc0, oc1, o0, nv, m, mst, ASYMO_ACT_RELU6); break;
    default: channels(job, n, oc0, oc1, o0, nv, m, mst, ASYMO_ACT_NONE); break;
    }
}

/* Channel oc of image n at stride 2: its input, output and shortcut (NULL: none) planes, its
 * nine taps and its bias, broadcast. */
ATTR static inline __attribute__((always_inline)) void s2_channel(
    const asymo_dwconv_job *job, int64_t n, int64_t oc, const float **x, float **y,
    const float **res, __m512 wk[9], __m512 *bias)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t plane = g->out_h * g->out_w;
    *x = (const float *)job->x + (n * g->channels + oc) * g->height * g->width;
    *y = (float *)job->y + n * job->y_image_stride + oc * plane;
    *res = job->residual ? (const float *)job->residual + n * job->residual_image_stride
                               + oc * plane
                         : NULL;
    const float *wt = (const float *)job->weight + oc * 9;
    for (int t = 0; t < 9; t++)
        wk[t] = _mm512_set1_ps(wt[t]);
    *bias = _mm512_set1_ps(job->bias ? ((const float *)job->bias)[oc] : 0.0f);
}

/* An output vector's sum starts at the bias plus its shortcut lanes m (none: res NULL); one
 * chain per input row follows, since a 9-FMA chain's latency would bound short rows. */
ATTR static inline __attribute__((always_inline)) __m512 s2_start(__m512 bias, const float *res,
                                                                  __mmask16 m)
{
    return res ? _mm512_add_ps(bias, _mm512_maskz_loadu_ps(m, res)) : bias;
}

/* The vector's one store: act(the three rows' chains), lanes m. */
ATTR static inline __attribute__((always_inline)) void s2_store(float *y, __mmask16 m,
                                                                const __m512 part[3],
                                                                const int act)
{
    _mm512_mask_storeu_ps(
        y, m, activate_ps512(_mm512_add_ps(_mm512_add_ps(part[0], part[1]), part[2]), act));
}

/* One channel's output rows [oy0, oy1) in chunks of 16 outputs (x, y, res: its planes). */
ATTR static inline __attribute__((always_inline)) void s2_rows(
    const asymo_conv_geometry *g, const float *x, float *y, const float *res, const __m512 wk[9],
    __m512 bias, int64_t oy0, int64_t oy1, const int act)
{
    const int64_t H = g->height, W = g->width, ow = g->out_w, ph = g->pad_h, pw = g->pad_w;
    for (int64_t ox = 0; ox < ow; ox += 16) {
        const int64_t c = 2 * ox - pw;
        const s2_cols m = {inside16(c, W), inside16(c + 16, W),
                           (__mmask16)(inside16(c + 32, W) & 1)};
        const __mmask16 mst = ow - ox >= 16 ? (__mmask16)0xFFFF
                                            : (__mmask16)((1u << (ow - ox)) - 1u);
        /* tap vectors of input rows 2 oy - ph + 0, 1, 2; row 2 becomes the next row 0 */
        __m512 t[3][3];
        int64_t r = 2 * oy0 - ph;
        s2_taps(t[0], r >= 0 && r < H ? x + r * W : NULL, c, m);
        for (int64_t oy = oy0; oy < oy1; oy++) {
            r = 2 * oy - ph;
            s2_taps(t[1], r + 1 >= 0 && r + 1 < H ? x + (r + 1) * W : NULL, c, m);
            s2_taps(t[2], r + 2 >= 0 && r + 2 < H ? x + (r + 2) * W : NULL, c, m);
            __m512 part[3] = {s2_start(bias, res ? res + oy * ow + ox : NULL, mst),
                              _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++)
                    part[a] = _mm512_fmadd_ps(t[a][b], wk[3 * a + b], part[a]);
            s2_store(y + oy * ow + ox, mst, part, act);
            for (int b = 0; b < 3; b++)
                t[0][b] = t[2][b];
        }
    }
}

/* The pair form's lanes (see s2_pairs): tap b of lane l is column 2 j + b - pw of the first
 * row (l = j < ow) or the second (l = ow + j, index + 16); lanes of column -1 masked off. */
typedef struct {
    __m512i idx[3];
    __mmask16 mtap[3], mrow;
} s2_pair_lanes;

ATTR static inline __attribute__((always_inline)) s2_pair_lanes
s2_pair_lanes_of(const asymo_conv_geometry *g)
{
    const int64_t ow = g->out_w, pw = g->pad_w;
    s2_pair_lanes L;
    L.mrow = inside16(0, g->width);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 second = _mm512_cmpge_epi32_mask(iota, _mm512_set1_epi32((int32_t)ow));
    const __m512i j = _mm512_mask_sub_epi32(iota, second, iota, _mm512_set1_epi32((int32_t)ow));
    const __m512i base = _mm512_mask_add_epi32(_mm512_add_epi32(j, j), second,
                                               _mm512_add_epi32(j, j), _mm512_set1_epi32(16));
    for (int b = 0; b < 3; b++) {
        L.idx[b] = _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)(b - pw)));
        L.mtap[b] = b - pw < 0 ? _mm512_cmpneq_epi32_mask(j, _mm512_setzero_si512())
                               : (__mmask16)0xFFFF;
    }
    return L;
}

/* One channel's output rows [oy0, oy1) when rows have at most 8 columns, all of whose taps lie
 * in the first 16 columns of their input rows (2 ow - pad_w <= 15: MobileNet's 14x14 ->
 * 7x7): two output rows per vector, lanes [0, ow) row i and [ow, 2 ow) row i + 1, which are
 * also consecutive in the output and residual planes (one load, one store). A row chunk
 * would fill 7 of 16 lanes; here the lanes of tap (a, b) come from input rows 2 i - ph + a
 * and 2 i + 2 - ph + a by one two-source permute, each input row loaded once (masked: zero
 * past the row). */
ATTR static inline __attribute__((always_inline)) void s2_pairs(
    const asymo_conv_geometry *g, const s2_pair_lanes *L, const float *x, float *y,
    const float *res, const __m512 wk[9], __m512 bias, int64_t oy0, int64_t oy1, const int act)
{
    const int64_t H = g->height, W = g->width, ow = g->out_w, ph = g->pad_h;
    const __m512 zero = _mm512_setzero_ps();
    /* (the lanes in registers for the channel's rows, not reloaded from *L) */
    const __m512i idx[3] = {L->idx[0], L->idx[1], L->idx[2]};
    const __mmask16 mtap[3] = {L->mtap[0], L->mtap[1], L->mtap[2]}, mrow = L->mrow;
    /* input rows 2 i - ph + k, k = 0..4; row 4 becomes the next pair's row 0 */
    __m512 q[5];
#define S2_ROW(r) ((r) >= 0 && (r) < H ? _mm512_maskz_loadu_ps(mrow, x + (r) * W) : zero)
    q[0] = S2_ROW(2 * oy0 - ph);
    for (int64_t oy = oy0; oy < oy1; oy += 2) {
        const int64_t r = 2 * oy - ph;
        for (int k = 1; k < 5; k++)
            q[k] = S2_ROW(r + k);
        const int64_t nout = (oy + 1 < oy1 ? 2 : 1) * ow;
        const __mmask16 mst = (__mmask16)((1u << nout) - 1u);
        __m512 part[3] = {s2_start(bias, res ? res + oy * ow : NULL, mst), zero, zero};
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                part[a] = _mm512_fmadd_ps(
                    _mm512_maskz_permutex2var_ps(mtap[b], q[a], idx[b], q[a + 2]),
                    wk[3 * a + b], part[a]);
        s2_store(y + oy * ow, mst, part, act);
        q[0] = q[4];
    }
#undef S2_ROW
}

/* Output channels [oc0, oc1), rows [oy0, oy1) of image n, stride 2, in one form. */
ATTR static inline __attribute__((always_inline)) void s2_form(
    const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1, int64_t oy0, int64_t oy1,
    int pairs, const int act)
{
    const asymo_conv_geometry *g = &job->geom;
    s2_pair_lanes L;
    if (pairs)
        L = s2_pair_lanes_of(g);
    for (int64_t oc = oc0; oc < oc1; oc++) {
        const float *x, *res;
        float *y;
        __m512 wk[9], bias;
        s2_channel(job, n, oc, &x, &y, &res, wk, &bias);
        if (pairs)
            s2_pairs(g, &L, x, y, res, wk, bias, oy0, oy1, act);
        else
            s2_rows(g, x, y, res, wk, bias, oy0, oy1, act);
    }
}

/* the activation as a constant in each copy of the channel loop */
ATTR static inline __attribute__((always_inline)) void s2_act(
    const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1, int64_t oy0, int64_t oy1,
    const int pairs)
{
    switch (job->activation) {
    case ASYMO_ACT_RELU: s2_form(job, n, oc0, oc1, oy0, oy1, pairs, ASYMO_ACT_RELU); break;
    case ASYMO_ACT_RELU6: s2_form(job, n, oc0, oc1, oy0, oy1, pairs, ASYMO_ACT_RELU6); break;
    default: s2_form(job, n, oc0, oc1, oy0, oy1, pairs, ASYMO_ACT_NONE); break;
    }
}

ATTR void asymo_dw3x3_f32_avx512_s2(const asymo_dwconv_job *job, int64_t n, int64_t oc0,
                                    int64_t oc1, int64_t oy0, int64_t oy1)
{
    /* the form a constant too */
    if (2 * job->geom.out_w - job->geom.pad_w <= 15)
        s2_act(job, n, oc0, oc1, oy0, oy1, 1);
    else
        s2_act(job, n, oc0, oc1, oy0, oy1, 0);
}

#endif
