/* Direct 3x3 stride-2 convolution of few input channels with AVX-512 (asymo/conv.h,
 * asymo_conv_direct_job). 16 output pixels of a row are one vector: their channels x 9 tap
 * vectors are made once from the input rows (stride2_taps.h), then the output channels go
 * through them eight at a time, eight independent chains of channels x 9 multiply-adds by
 * broadcast weights (two FMA pipes of four cycles' latency need eight), each chain ending in
 * its channel's one masked store. */
#include "kernels/conv_direct.h"

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/x86_templates.h"

#define ATTR __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma,prfchw")))

#include "kernels/x86_avx512/stride2_taps.h" /* (uses ATTR) */

enum { OC_BLOCK = 8, MAX_TAPS = 9 * ASYMO_DIRECT_MAX_CHANNELS, SEGMENT = 8 };

/* Output channels [oc, oc + nb) (nb <= OC_BLOCK) of one 16-pixel vector: taps t[0, K) (in
 * L1), their weights w + oc * K, stored at y + oc * plane with lanes m. */
ATTR static inline __attribute__((always_inline)) void channel_block(
    const __m512 *t, const int K, const float *w, const float *bias, float *y, int64_t plane,
    __mmask16 m, int64_t oc, const int nb, const int act)
{
    __m512 acc[OC_BLOCK];
    for (int j = 0; j < nb; j++)
        acc[j] = bias ? _mm512_set1_ps(bias[oc + j]) : _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m512 tk = t[k];
        for (int j = 0; j < nb; j++)
            acc[j] = _mm512_fmadd_ps(tk, _mm512_set1_ps(w[(oc + j) * K + k]), acc[j]);
    }
    for (int j = 0; j < nb; j++)
        _mm512_mask_storeu_ps(y + (oc + j) * plane, m, activate_ps512(acc[j], act));
}

/* Rows [oy0, oy1), C input channels (a constant in each copy), activation act. A row goes in
 * segments of up to SEGMENT vectors: their tap vectors are made once into `taps` (L1), then
 * each block of OC_BLOCK output channels runs over the whole segment, so each output plane
 * is written a segment's run of lines at a time (NCHW has one write stream per output
 * channel; a cold output, as inside a network, otherwise pays a miss per line and plane) and
 * the next block's runs are fetched for writing meanwhile. */
ATTR static inline __attribute__((always_inline)) void rows(const asymo_conv_direct_job *job,
                                                            int64_t oy0, int64_t oy1,
                                                            const int C, const int act)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t ph = g->pad_h, pw = g->pad_w, plane = oh * ow, M = job->out_channels;
    const int K = 9 * C;
    const float *x = (const float *)job->x, *w = (const float *)job->weight;
    const float *bias = (const float *)job->bias;
    float *y = (float *)job->y;
    __m512 taps[SEGMENT][MAX_TAPS];
    for (int64_t oy = oy0; oy < oy1; oy++) {
        for (int64_t ox0 = 0; ox0 < ow; ox0 += 16 * SEGMENT) {
            const int64_t left_v = (ow - ox0 + 15) / 16;
            const int nv = (int)(left_v < SEGMENT ? left_v : SEGMENT);
            for (int v = 0; v < nv; v++) {
                const int64_t c = 2 * (ox0 + 16 * v) - pw;
                const s2_cols m = {inside16(c, W), inside16(c + 16, W),
                                   (__mmask16)(inside16(c + 32, W) & 1)};
                for (int ci = 0; ci < C; ci++)
                    for (int a = 0; a < 3; a++) {
                        const int64_t r = 2 * oy - ph + a;
                        s2_taps(taps[v] + 9 * ci + 3 * a,
                                r >= 0 && r < H ? x + (ci * H + r) * W : NULL, c, m);
                    }
            }
            float *yo = y + oy * ow + ox0;
            const int64_t run = ow - ox0 < 16 * SEGMENT ? ow - ox0 : 16 * SEGMENT;
            for (int64_t oc = 0; oc < M; oc += OC_BLOCK) {
                const int nb = (int)(M - oc < OC_BLOCK ? M - oc : OC_BLOCK);
                /* the next block's runs, for writing */
                for (int64_t o = oc + OC_BLOCK; o < oc + 2 * OC_BLOCK && o < M; o++)
                    for (int64_t e = 0; e < run; e += 16)
                        __builtin_prefetch(yo + o * plane + e, 1, 3);
                for (int v = 0; v < nv; v++) {
                    const int64_t left = run - 16 * v;
                    const __mmask16 mst = left >= 16 ? (__mmask16)0xFFFF
                                                     : (__mmask16)((1u << left) - 1u);
                    if (nb == OC_BLOCK)
                        channel_block(taps[v], K, w, bias, yo + 16 * v, plane, mst, oc,
                                      OC_BLOCK, act);
                    else
                        for (int j = 0; j < nb; j++)
                            channel_block(taps[v], K, w, bias, yo + 16 * v, plane, mst,
                                          oc + j, 1, act);
                }
            }
        }
    }
}

#define ROWS_FOR_CHANNELS(ACT)                                                                \
    switch (job->geom.channels) {                                                             \
    case 1: rows(job, oy0, oy1, 1, ACT); break;                                               \
    case 2: rows(job, oy0, oy1, 2, ACT); break;                                               \
    default: rows(job, oy0, oy1, 3, ACT); break;                                              \
    }

ATTR void asymo_conv_direct3x3s2_f32_avx512(const asymo_conv_direct_job *job, int64_t oy0,
                                            int64_t oy1)
{
    switch (job->activation) {
    case ASYMO_ACT_RELU: ROWS_FOR_CHANNELS(ASYMO_ACT_RELU); break;
    case ASYMO_ACT_RELU6: ROWS_FOR_CHANNELS(ASYMO_ACT_RELU6); break;
    default: ROWS_FOR_CHANNELS(ASYMO_ACT_NONE); break;
    }
}
#endif
