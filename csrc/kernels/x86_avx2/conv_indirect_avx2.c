/* AVX2+FMA indirect-B micro-kernel, float32 6 x 16: the register tile of the GEMM kernel
 * (gemm_avx2.c), B row p loaded from b + off[p]. The rows of one 16-wide output run are
 * rows of the image's stride-phase planes, so the kernel reads the image where it lies and
 * nothing is packed per call but the weights. */
#if defined(__x86_64__)

#include "kernels/conv_indirect.h"
#include "kernels/x86_templates.h"

/* A, read from L2 as one stream, is fetched this many bytes ahead (as in gemm_avx2.c) */
#define AHEAD 384

#define DECL(i) __m256 c##i##a = _mm256_setzero_ps(), c##i##b = _mm256_setzero_ps();
#define FMA_ROW(i) { const __m256 ai = _mm256_broadcast_ss(a + (i));                          \
    c##i##a = _mm256_fmadd_ps(ai, b0, c##i##a); c##i##b = _mm256_fmadd_ps(ai, b1, c##i##b); }
#define STORE(i) _mm256_storeu_ps(c + (i) * rsc, c##i##a);                                    \
    _mm256_storeu_ps(c + (i) * rsc + 8, c##i##b);

ATTR_AVX2 static void ukr_indirect_avx2_f32(int64_t k, const float *a, const float *b,
                                            const int64_t *off, float *c, int64_t rsc)
{
    REP6(DECL)
    for (int64_t p = 0; p < k; p++) {
        _mm_prefetch((const char *)a + AHEAD, _MM_HINT_T0);
        const float *bp = b + off[p];
        const __m256 b0 = _mm256_loadu_ps(bp);
        const __m256 b1 = _mm256_loadu_ps(bp + 8);
        REP6(FMA_ROW)
        a += 6;
    }
    REP6(STORE)
}

const asymo_ukr_indirect_fn asymo_ukr_indirect_avx2_f32 = ukr_indirect_avx2_f32;

#endif /* __x86_64__ */
