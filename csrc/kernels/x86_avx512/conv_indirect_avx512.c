/* AVX-512 indirect-B micro-kernel, float32 16 x 16, bias and activation fused (see
 * kernels/conv_indirect.h and conv/conv_indirect.c).
 *
 * One zmm holds a run of 16 output pixels of one output channel; the tile is 16 output
 * channels (16 accumulators), so MobileNet's 32-channel and SqueezeNet's 64-channel stems
 * pad no rows (the 6-row AVX2 tile computes 36 rows for 32). Each k step loads B row p once
 * from its phase plane (b + off[p]) and broadcasts the 16 weights of the packed A
 * micro-panel. The accumulators start at the bias, the shortcut (if any) is added and the
 * activation applied before the one store, so no second pass reads the output back; a run shorter than 16 pixels (the
 * row's last) is loaded and stored with a lane mask and only the tile's first `rows` rows are
 * stored. */
#if defined(__x86_64__)

#include "asymo/conv.h"
#include "kernels/conv_indirect.h"
#include "kernels/x86_templates.h"

#define REP16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) \
    X(14) X(15)
#define DECL(i) __m512 c##i = bias ? _mm512_set1_ps(bias[i]) : _mm512_setzero_ps();
#define FMA_ROW(i) c##i = _mm512_fmadd_ps(_mm512_set1_ps(a[i]), b0, c##i);
#define ACT(i) c##i = act == ASYMO_ACT_RELU6 ? _mm512_min_ps(six, _mm512_max_ps(zero, c##i)) \
                      : act == ASYMO_ACT_RELU ? _mm512_max_ps(zero, c##i) : c##i;
#define ADD_RES(i) if ((i) < rows)                                                          \
    c##i = _mm512_add_ps(c##i, _mm512_maskz_loadu_ps(cols, res + (i) * rsr));
#define STORE(i) if ((i) < rows) _mm512_mask_storeu_ps(c + (i) * rsc, cols, c##i);

ATTR_AVX512 static void ukr_indirect_avx512_f32(int64_t k, const float *a, const float *b,
                                                const int64_t *off, float *c, int64_t rsc,
                                                const float *bias, const float *res,
                                                int64_t rsr, int act, int rows, int cols_)
{
    REP16(DECL)
    /* a partial run reads only its own pixels (masked lanes do not fault): the pointwise
     * path reads the image in place, where the last run may end the buffer */
    const __mmask16 cols = (__mmask16)((1u << cols_) - 1u);
    for (int64_t p = 0; p < k; p++) {
        const __m512 b0 = _mm512_maskz_loadu_ps(cols, b + off[p]);
        REP16(FMA_ROW)
        a += 16;
    }
    if (res) {
        REP16(ADD_RES)
    }
    /* vmaxps / vminps return the second operand when either is NaN: NaN propagates */
    const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
    REP16(ACT)
    REP16(STORE)
}

const asymo_ukr_indirect16_fn asymo_ukr_indirect_avx512_f32 = ukr_indirect_avx512_f32;

#endif /* __x86_64__ */
