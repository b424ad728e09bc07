/* AVX-512 pixel-row micro-kernels of the pointwise path's row form and of the rows path of
 * other convolutions, float32 (see kernels/conv_pointwise.h, conv/conv_pointwise.c and
 * conv/conv_rows.c).
 *
 * A tile is R pixels (rows) by NV zmm of output channels; each k step loads NV weight
 * vectors and broadcasts R input values, so the input is read where it is, one value per
 * pixel and input channel, and no pixel lane is padded. Three widths share one body: NV 2, 3,
 * 4 with at most 12, 8, 6 rows (24 accumulators; the rest of the 32 registers hold the
 * weights and the broadcast). Bias and, without a shortcut, the activation are applied to the
 * accumulators; the tile is then transposed in registers, eight rows at a time, into the NCHW
 * output (a shortcut is added and the activation applied there, in order). The taps form
 * reads input value p of pixel r at x[koff[p] + r * SX] instead of x[p * ldx + r]: any
 * convolution's taps over an image, its output pixels SX apart there. */
#if defined(__x86_64__)

#include "asymo/conv.h"
#include "kernels/conv_pointwise.h"
#include "kernels/x86_templates.h"

#define MAX_ROWS 16

/* Eight rows of 16 channels, transposed: out[j] holds channel j of rows 0..7 (j < 16). Two
 * channels per register after the in-lane 4 x 4 transposes and one cross-lane permute per
 * pair; the caller stores each half. */
ATTR_AVX512 static inline __attribute__((always_inline)) void
transpose_8x16(const __m512 r[8], __m256 out[16])
{
    __m512 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[j] (j < 4): channel 4L + j of rows 0..3 in lane L; u[4 + j]: rows 4..7 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm512_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                         30, 31);
    for (int j = 0; j < 4; j++) {
        const __m512 a = _mm512_permutex2var_ps(u[j], lo, u[4 + j]);
        const __m512 b = _mm512_permutex2var_ps(u[j], hi, u[4 + j]);
        out[j] = _mm512_castps512_ps256(a);
        out[4 + j] = _mm512_extractf32x8_ps(a, 1);
        out[8 + j] = _mm512_castps512_ps256(b);
        out[12 + j] = _mm512_extractf32x8_ps(b, 1);
    }
}

ATTR_AVX512 static inline __attribute__((always_inline)) void
pixel_rows(const int R, const int NV, const int SX, int64_t k, const float *x, int64_t ldx,
           const int64_t *koff, const float *w, float *y, int64_t ldy, const float *bias,
           const float *res, int64_t ldr, int act, int chans)
{
    __m512 acc[MAX_ROWS][4];
    _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m512 wv[4];
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            wv[v] = _mm512_loadu_ps(w + p * NV * 16 + v * 16);
        const float *xp = koff ? x + koff[p] : x + p * ldx;
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(xp[r * SX]);
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                acc[r][v] = _mm512_fmadd_ps(xb, wv[v], acc[r][v]);
        }
    }
    /* the bias, and the activation when no shortcut comes between, on the accumulators */
    if (bias) {
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
            const int left = chans - v * 16;
            const __mmask16 m = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
            const __m512 bv = _mm512_maskz_loadu_ps(m, bias + v * 16);
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
                acc[r][v] = _mm512_add_ps(acc[r][v], bv);
        }
    }
    if (!res && act != ASYMO_ACT_NONE) {
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                acc[r][v] = activate_ps512(acc[r][v], act);
    }
    /* transposed into y, eight rows at a time: channel c's rows are contiguous there */
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
        if (v * 16 >= chans)
            break;
        const int nch = chans - v * 16 < 16 ? chans - v * 16 : 16;
        _Pragma("GCC unroll 2") for (int g = 0; g * 8 < R; g++) {
            __m512 rows8[8];
            __m256 out[16];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                rows8[i] = g * 8 + i < R ? acc[g * 8 + i][v] : _mm512_setzero_ps();
            transpose_8x16(rows8, out);
            const int left = R - g * 8;
            const __mmask8 m = (__mmask8)(left >= 8 ? 0xff : (1u << left) - 1u);
            float *yc = y + (int64_t)v * 16 * ldy + g * 8;
            if (res) {
                const float *rc = res + (int64_t)v * 16 * ldr + g * 8;
                _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
                    if (j < nch)
                        _mm256_mask_storeu_ps(yc + j * ldy, m, activate_ps256(_mm256_add_ps(
                            out[j], _mm256_maskz_loadu_ps(m, rc + j * ldr)), act));
            } else {
                _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
                    if (j < nch)
                        _mm256_mask_storeu_ps(yc + j * ldy, m, out[j]);
            }
        }
    }
}

#define PIXEL_ROWS_ATTR ATTR_AVX512
#include "kernels/pixel_rows_instances.h"
PIXEL_ROWS_UPTO12(2)
PIXEL_ROWS_UPTO8(3)
PIXEL_ROWS_UPTO6(4)

const asymo_pixel_rows_family asymo_pixel_rows_avx512_f32[3] = {
    {32, 12, {NULL, PIXEL_ROWS_FN12(pixel_rows_, 2)}},
    {48, 8, {NULL, PIXEL_ROWS_FN8(pixel_rows_, 3)}},
    {64, 6, {NULL, PIXEL_ROWS_FN6(pixel_rows_, 4)}},
};

const asymo_pixel_rows_family asymo_taps_rows_avx512_f32[2][3] = {
    {{32, 12, {NULL, PIXEL_ROWS_FN12(taps_rows_, 2)}},
     {48, 8, {NULL, PIXEL_ROWS_FN8(taps_rows_, 3)}},
     {64, 6, {NULL, PIXEL_ROWS_FN6(taps_rows_, 4)}}},
    {{32, 12, {NULL, PIXEL_ROWS_FN12(taps_rows_s2_, 2)}},
     {48, 8, {NULL, PIXEL_ROWS_FN8(taps_rows_s2_, 3)}},
     {64, 6, {NULL, PIXEL_ROWS_FN6(taps_rows_s2_, 4)}}},
};

#endif /* __x86_64__ */
