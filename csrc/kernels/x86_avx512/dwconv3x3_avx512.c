/* Direct 3x3 depthwise kernel for small planes with AVX-512, stride 1, padding 1, output
 * plane = input plane (see conv/dwconv3x3.h, asymo_dw3x3_flat_applies).
 *
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
 * Bias, residual and activation are applied before the one store. */
#include "conv/dwconv3x3.h"

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define ATTR __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))

enum { FLAT_MAX_VECS = (ASYMO_DW3X3_FLAT_MAX + 15) / 16 };

/* p + d floats as an address (p + d may lie outside the plane: only masked loads use it) */
static inline const float *shifted(const float *p, int64_t d)
{
    return (const float *)((uintptr_t)p + (uintptr_t)(d * (int64_t)sizeof(float)));
}

/* Output channels [oc0, oc1) of image n, flat outputs [o0, o0 + 16 nv) with the masks of
 * asymo_dw3x3_f32_avx512_flat. */
ATTR static inline __attribute__((always_inline)) void channels(
    const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t oc1, int64_t o0, int64_t nv,
    const __mmask16 (*m)[9], const __mmask16 *mst, const int act)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t W = g->width, C = g->channels, HW = g->height * W;
    const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
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
            __m512 acc = _mm512_add_ps(_mm512_add_ps(part[0], part[1]), part[2]);
            /* vmaxps / vminps return the second operand when either is NaN: NaN propagates
               as in torch */
            if (act == ASYMO_ACT_RELU)
                acc = _mm512_max_ps(zero, acc);
            else if (act == ASYMO_ACT_RELU6)
                acc = _mm512_min_ps(six, _mm512_max_ps(zero, acc));
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

#endif
