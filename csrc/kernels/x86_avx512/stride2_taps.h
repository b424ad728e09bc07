/* Internal: the taps of a stride-2 3-wide window for 16 consecutive outputs of a row, read
 * straight from an NCHW input row (the stride-2 depthwise kernel, kernels/x86_avx512/
 * dwconv3x3_avx512.c, and the direct convolution of few input channels,
 * kernels/x86_avx512/conv_direct_avx512.c). The 16 outputs take their taps from 33
 * consecutive input columns, read with masked loads (zero outside the row, no fault) into two
 * vectors and one lane and split in registers by two-source permutes (vpermt2ps: even
 * columns, odd columns) and a one-lane shift. Include after <immintrin.h>, with ATTR defined
 * as the including file's AVX-512 target attribute. */
#ifndef ASYMO_KERNELS_X86_AVX512_STRIDE2_TAPS_H
#define ASYMO_KERNELS_X86_AVX512_STRIDE2_TAPS_H

#include <stdint.h>

/* p + d floats as an address (p + d may lie outside the plane: only masked loads use it) */
static inline const float *shifted(const float *p, int64_t d)
{
    return (const float *)((uintptr_t)p + (uintptr_t)(d * (int64_t)sizeof(float)));
}

/* Lanes of columns [c, c + 16) that lie inside a row of W columns. */
static inline __mmask16 inside16(int64_t c, int64_t W)
{
    const int64_t lo = c < 0 ? -c : 0, hi = W - c < 16 ? W - c : 16;
    if (hi <= lo)
        return 0;
    return (__mmask16)((((uint32_t)1 << hi) - 1u) & ~(((uint32_t)1 << lo) - 1u));
}

/* Column masks of a 16-output chunk whose first tap is column c (see s2_taps). */
typedef struct {
    __mmask16 lo, hi, next;
} s2_cols;

/* t[b] = the tap-b inputs of a 16-output chunk from input row p (NULL: a padding row), whose
 * first tap is column c: t[b][j] = p[c + 2 j + b], zero outside the row. */
ATTR static inline __attribute__((always_inline)) void s2_taps(__m512 *t, const float *p,
                                                               int64_t c, s2_cols m)
{
    if (!p) {
        t[0] = t[1] = t[2] = _mm512_setzero_ps();
        return;
    }
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512 lo = _mm512_maskz_loadu_ps(m.lo, shifted(p, c));
    const __m512 hi = _mm512_maskz_loadu_ps(m.hi, shifted(p, c + 16));
    /* column c + 32 (tap 2 of the chunk's last output) in lane 0 */
    const __m512 next = _mm512_maskz_loadu_ps(m.next, shifted(p, c + 32));
    t[0] = _mm512_permutex2var_ps(lo, even, hi);
    t[1] = _mm512_permutex2var_ps(lo, odd, hi);
    t[2] = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(next),
                                                   _mm512_castps_si512(t[0]), 1));
}

#endif
