/* AVX2 pixel-row micro-kernels of the pointwise path's row form and of the rows path of other
 * convolutions, float32 (see kernels/conv_pointwise.h, conv/conv_pointwise.c and
 * conv/conv_rows.c): the AVX-512 family's tile (x86_avx512/conv_pointwise_avx512.c) on ymm
 * registers.
 *
 * A tile is R pixels (rows) by NV ymm of output channels; each k step loads NV weight vectors
 * and broadcasts R input values, so the input is read where it is and no pixel lane is
 * padded. Three widths share one body: NV 1, 2, 3 (8, 16, 24 channels) with at most 12, 6, 4
 * rows: 12 accumulators, which with the weights and the broadcast fill the 16 registers. Bias
 * and, without a shortcut, the activation are applied to the accumulators; the tile is then
 * transposed in registers, eight rows by eight channels at a time, into the NCHW output (a
 * shortcut is added and the activation applied there, in order). The taps form reads input
 * value p of pixel r at x[koff[p] + r * SX] instead of x[p * ldx + r]. */
#if defined(__x86_64__)

#include "asymo/conv.h"
#include "kernels/conv_pointwise.h"
#include "kernels/x86_templates.h"

#define MAX_ROWS 12

/* Lane mask of the first n (0..8) lanes, for maskload / maskstore */
ATTR_AVX2 static inline __attribute__((always_inline)) __m256i first_lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first n (1..7) floats of v stored at p, in pieces of 4, 2 and 1 (vmaskmovps stores are
 * slow on some AMD cores; n is a constant in each inlined copy) */
ATTR_AVX2 static inline __attribute__((always_inline)) void store_first(float *p, __m256 v,
                                                                        int n)
{
    __m128 h = _mm256_castps256_ps128(v);
    if (n >= 4) {
        _mm_storeu_ps(p, h);
        p += 4;
        n -= 4;
        h = _mm256_extractf128_ps(v, 1);
    }
    if (n >= 2) {
        _mm_storel_pi((__m64 *)p, h);
        p += 2;
        n -= 2;
        h = _mm_movehl_ps(h, h);
    }
    if (n)
        _mm_store_ss(p, h);
}

/* The first n (0..3) floats at p in the low lanes, the others zero */
ATTR_AVX2 static inline __attribute__((always_inline)) __m128 load_piece(const float *p, int n)
{
    const __m128 zero = _mm_setzero_ps();
    if (n == 3)
        return _mm_movelh_ps(_mm_loadl_pi(zero, (const __m64 *)p), _mm_load_ss(p + 2));
    if (n == 2)
        return _mm_loadl_pi(zero, (const __m64 *)p);
    return n == 1 ? _mm_load_ss(p) : zero;
}

ATTR_AVX2 static inline __attribute__((always_inline)) __m256 load_first(const float *p, int n)
{
    const __m128 lo = n >= 4 ? _mm_loadu_ps(p) : load_piece(p, n);
    const __m128 hi = n > 4 ? load_piece(p + 4, n - 4) : _mm_setzero_ps();
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

ATTR_AVX2 static inline __attribute__((always_inline)) void
pixel_rows(const int R, const int NV, const int SX, int64_t k, const float *x, int64_t ldx,
           const int64_t *koff, const float *w, float *y, int64_t ldy, const float *bias,
           const float *res, int64_t ldr, int act, int chans)
{
    __m256 acc[MAX_ROWS][3];
    _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m256 wv[3];
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++)
            wv[v] = _mm256_loadu_ps(w + p * NV * 8 + v * 8);
        const float *xp = koff ? x + koff[p] : x + p * ldx;
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {
            const __m256 xb = _mm256_broadcast_ss(xp + r * SX);
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++)
                acc[r][v] = _mm256_fmadd_ps(xb, wv[v], acc[r][v]);
        }
    }
    /* the bias, and the activation when no shortcut comes between, on the accumulators */
    if (bias) {
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) {
            const int left = chans - v * 8;
            const __m256 bv = left >= 8 ? _mm256_loadu_ps(bias + v * 8)
                              : left > 0 ? _mm256_maskload_ps(bias + v * 8, first_lanes(left))
                                         : _mm256_setzero_ps();
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
                acc[r][v] = _mm256_add_ps(acc[r][v], bv);
        }
    }
    if (!res && act != ASYMO_ACT_NONE) {
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++)
                acc[r][v] = activate_ps256(acc[r][v], act);
    }
    /* transposed into y, eight rows at a time: channel c's rows are contiguous there */
    _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) {
        if (v * 8 >= chans)
            break;
        const int nch = chans - v * 8 < 8 ? chans - v * 8 : 8;
        _Pragma("GCC unroll 2") for (int g = 0; g * 8 < R; g++) {
            __m256 t[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                t[i] = g * 8 + i < R ? acc[g * 8 + i][v] : _mm256_setzero_ps();
            transpose_8x8(t);
            const int left = R - g * 8;
            float *yc = y + (int64_t)v * 8 * ldy + g * 8;
            const float *rc = res ? res + (int64_t)v * 8 * ldr + g * 8 : NULL;
            if (left >= 8) {
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                    if (j < nch)
                        _mm256_storeu_ps(yc + j * ldy,
                                         rc ? activate_ps256(_mm256_add_ps(t[j], _mm256_loadu_ps(
                                                                              rc + j * ldr)),
                                                      act)
                                            : t[j]);
            } else {
                /* the first `left` lanes, as 4 + 2 + 1 wide pieces (left is a constant in each
                 * instance; vmaskmovps stores are slow on some AMD cores) */
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                    if (j < nch) {
                        __m256 v = t[j];
                        if (rc)
                            v = activate_ps256(
                                _mm256_add_ps(v, load_first(rc + j * ldr, left)), act);
                        store_first(yc + j * ldy, v, left);
                    }
            }
        }
    }
}

#define PIXEL_ROWS_ATTR ATTR_AVX2
#include "kernels/pixel_rows_instances.h"
PIXEL_ROWS_UPTO12(1)
PIXEL_ROWS_UPTO6(2)
PIXEL_ROWS_UPTO4(3)

const asymo_pixel_rows_family asymo_pixel_rows_avx2_f32[3] = {
    {8, 12, {NULL, PIXEL_ROWS_FN12(pixel_rows_, 1)}},
    {16, 6, {NULL, PIXEL_ROWS_FN6(pixel_rows_, 2)}},
    {24, 4, {NULL, PIXEL_ROWS_FN4(pixel_rows_, 3)}},
};

const asymo_pixel_rows_family asymo_taps_rows_avx2_f32[2][3] = {
    {{8, 12, {NULL, PIXEL_ROWS_FN12(taps_rows_, 1)}},
     {16, 6, {NULL, PIXEL_ROWS_FN6(taps_rows_, 2)}},
     {24, 4, {NULL, PIXEL_ROWS_FN4(taps_rows_, 3)}}},
    {{8, 12, {NULL, PIXEL_ROWS_FN12(taps_rows_s2_, 1)}},
     {16, 6, {NULL, PIXEL_ROWS_FN6(taps_rows_s2_, 2)}},
     {24, 4, {NULL, PIXEL_ROWS_FN4(taps_rows_s2_, 3)}}},
};

#endif /* __x86_64__ */
