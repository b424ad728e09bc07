/* Convolution kernels: im2col and the bias + activation epilogue (depthwise: depthwise.c).
 *
 * The loops are written so the compiler vectorises the innermost one (contiguous output
 * pixels of one row); each kernel is compiled three times (portable, AVX2+FMA, AVX-512) through
 * per-function target attributes, and the variant is chosen once at run time. */
#include "asymo/conv.h"
#include "asymo/isa.h"
#include "gemm/epilogue.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* dtype codes, equal to gemm.h's ASYMO_DTYPE_F32 / ASYMO_DTYPE_F64 */
enum { CONV_DTYPE_F32 = 0, CONV_DTYPE_F64 = 1 };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE int64_t ceil_div_nonneg(int64_t a, int64_t b) { return (a + b - 1) / b; }
ALWAYS_INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
ALWAYS_INLINE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Output columns ox in [*lo, *hi) read input column ox * stride + offset inside [0, width). */
ALWAYS_INLINE void valid_range(int64_t offset, int64_t stride, int64_t width, int64_t out,
                               int64_t *lo, int64_t *hi)
{
    int64_t a = offset >= 0 ? 0 : ceil_div_nonneg(-offset, stride);
    int64_t b = width - offset <= 0 ? 0 : ceil_div_nonneg(width - offset, stride);
    a = min64(a, out);
    b = max64(a, min64(b, out));
    *lo = a;
    *hi = b;
}

/* ---------------------------------------------------------------------------------------- */
/* Strided row gather, the inner loop of both im2col forms: d[o] = src[o * sw] for o < n.
 * Unit and stride-2 rows (every CNN layer but a few stems) run on 32-byte vectors: a stride-2
 * vector is the even lanes of two consecutive loads, so it reads one element past the last
 * one used; `avail` (elements readable from src) bounds the vector loop, the rest is scalar.
 * GCC vector extensions: AVX registers in the AVX2 / AVX-512 variants, pairs elsewhere. */
#pragma GCC diagnostic ignored "-Wpsabi" /* static inline vector helpers: no ABI crosses */

#define DEFINE_GATHER(T, IT, SFX)                                                             \
typedef T vec_##SFX __attribute__((vector_size(32), aligned(sizeof(T))));                     \
typedef IT ivec_##SFX __attribute__((vector_size(32)));                                       \
ALWAYS_INLINE void gather_run_##SFX(T *restrict d, const T *restrict src, int64_t n,          \
                                    int64_t sw, int64_t avail)                               \
{                                                                                             \
    enum { L = 32 / sizeof(T) };                                                              \
    int64_t o = 0;                                                                            \
    if (sw == 1) {                                                                            \
        for (; o + L <= n; o += L)                                                            \
            *(vec_##SFX *)(d + o) = *(const vec_##SFX *)(src + o);                            \
    } else if (sw == 2) {                                                                     \
        ivec_##SFX even;                                                                      \
        for (int i = 0; i < L; i++)                                                           \
            even[i] = 2 * i;                                                                  \
        for (; o + L <= n && 2 * (o + L) <= avail; o += L)                                    \
            *(vec_##SFX *)(d + o) = __builtin_shuffle(*(const vec_##SFX *)(src + 2 * o),     \
                                                      *(const vec_##SFX *)(src + 2 * o + L),  \
                                                      even);                                  \
    }                                                                                         \
    for (; o < n; o++)                                                                        \
        d[o] = src[o * sw];                                                                   \
}

DEFINE_GATHER(float, int32_t, f32)
DEFINE_GATHER(double, int64_t, f64)

/* ---------------------------------------------------------------------------------------- */
/* Kernel bodies, instantiated per element type. */

#define DEFINE_BODIES(T, SFX)                                                                 \
ALWAYS_INLINE void im2col_body_##SFX(const asymo_im2col_job *job, int64_t k0, int64_t k1,     \
                                     int64_t n0, int64_t n1)                                  \
{                                                                                             \
    const asymo_conv_geometry *g = &job->geom;                                               \
    const T *x = (const T *)job->x;                                                           \
    T *col = (T *)job->col;                                                                   \
    const int64_t kh = g->kernel_h, kw = g->kernel_w, H = g->height, W = g->width;            \
    const int64_t ow = g->out_w, sh = g->stride_h, sw = g->stride_w;                          \
    for (int64_t r = k0; r < k1; r++) {                                                       \
        const int64_t kx = r % kw, ky = (r / kw) % kh, c = r / (kw * kh);                     \
        const T *xc = x + c * H * W;                                                          \
        T *dst = col + r * job->ldcol;                                                        \
        const int64_t dy = ky * g->dilation_h - g->pad_h;                                     \
        const int64_t dx = kx * g->dilation_w - g->pad_w;                                     \
        int64_t lo, hi;                                                                       \
        valid_range(dx, sw, W, ow, &lo, &hi);                                                 \
        if (sh == 1 && sw == 1 && ow == W) {                                                  \
            /* Unit stride and out_w == width: a column row and the input plane have the     \
               same row pitch, so the whole chunk is one shifted copy; then the few edge     \
               columns that read across a row boundary (or outside the plane) are zeroed. */  \
            T *d = dst - job->col_offset; /* d[n]: column n */                                \
            const int64_t shift = dy * W + dx;                                                \
            const int64_t oy_lo = dy < 0 ? -dy : 0, oy_hi = min64(g->out_h, H - dy);          \
            const int64_t a = min64(max64(n0, oy_lo * W), n1);                                \
            const int64_t b = max64(a, min64(n1, oy_hi * W));                                 \
            const int64_t ca = max64(a, -shift), cb = min64(b, H * W - shift);               \
            if (a > n0)                                                                       \
                memset(d + n0, 0, (size_t)(a - n0) * sizeof(T));                              \
            if (cb > ca)                                                                      \
                memcpy(d + ca, xc + ca + shift, (size_t)(cb - ca) * sizeof(T));               \
            if (n1 > b)                                                                       \
                memset(d + b, 0, (size_t)(n1 - b) * sizeof(T));                               \
            if (lo > 0 || hi < ow) {                                                          \
                for (int64_t oy = a / W; oy * W < b; oy++) {                                  \
                    const int64_t base = oy * W;                                              \
                    for (int64_t ox = 0; ox < lo; ox++)                                       \
                        if (base + ox >= a && base + ox < b)                                  \
                            d[base + ox] = (T)0;                                              \
                    for (int64_t ox = hi; ox < ow; ox++)                                      \
                        if (base + ox >= a && base + ox < b)                                  \
                            d[base + ox] = (T)0;                                              \
                }                                                                             \
            }                                                                                 \
            continue;                                                                         \
        }                                                                                     \
        int64_t n = n0;                                                                       \
        while (n < n1) {                                                                      \
            const int64_t oy = n / ow, ox0 = n - oy * ow;                                     \
            const int64_t ox1 = ox0 + min64(n1 - n, ow - ox0);                                \
            T *d = dst + (oy * ow - job->col_offset); /* d[ox]: column oy * ow + ox */          \
            const int64_t iy = oy * sh + dy;                                                  \
            if (iy < 0 || iy >= H) {                                                          \
                memset(d + ox0, 0, (size_t)(ox1 - ox0) * sizeof(T));                          \
            } else {                                                                          \
                const int64_t a = min64(max64(ox0, lo), ox1);                                 \
                const int64_t b = max64(a, min64(ox1, hi));                                   \
                if (a > ox0)                                                                  \
                    memset(d + ox0, 0, (size_t)(a - ox0) * sizeof(T));                        \
                const T *src = xc + iy * W + dx + a * sw;                                     \
                if (b == a) {                                                                 \
                } else if (sw == 1) {                                                         \
                    memcpy(d + a, src, (size_t)(b - a) * sizeof(T));                          \
                } else {                                                                      \
                    gather_run_##SFX(d + a, src, b - a, sw, W - dx - a * sw);                 \
                }                                                                             \
                if (ox1 > b)                                                                  \
                    memset(d + b, 0, (size_t)(ox1 - b) * sizeof(T));                          \
            }                                                                                 \
            n += ox1 - ox0;                                                                   \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_BODIES(float, f32)
DEFINE_BODIES(double, f64)

/* ---------------------------------------------------------------------------------------- */
/* Implicit im2col: the GEMM's B packer (asymo_gemm_args.pack_b) reading the image itself.
 *
 * Packs rows [p0, p0 + kb) x columns [j0, j0 + cols) of the column matrix as one nr-wide
 * sliver (dst[p * nr + j]) without ever writing the column matrix: the GEMM's tasks pack their
 * panels on the cluster that consumes them, and a convolution is one GEMM job, no separate
 * im2col pass and no synchronisation between the two. Per row p = (c, ky, kx) the valid
 * output-column range depends only on kx, so it is computed once per call. */
#define PACK_MAX_KW 32

#define DEFINE_PACK_B(T, SFX)                                                                 \
ALWAYS_INLINE void im2col_pack_b_body_##SFX(const asymo_im2col_job *job, T *restrict dst,     \
                                             int64_t j0, int64_t cols, int64_t p0, int64_t kb, \
                                             int64_t nr, const int64_t sw)                    \
{                                                                                             \
    const asymo_conv_geometry *g = &job->geom;                                               \
    const T *x = (const T *)job->x;                                                           \
    const int64_t kh = g->kernel_h, kw = g->kernel_w, H = g->height, W = g->width;            \
    const int64_t ow = g->out_w, sh = g->stride_h;                                            \
    int64_t los[PACK_MAX_KW], his[PACK_MAX_KW];                                               \
    for (int64_t q = 0; q < kw && q < PACK_MAX_KW; q++)                                       \
        valid_range(q * g->dilation_w - g->pad_w, sw, W, ow, &los[q], &his[q]);               \
    j0 += job->col_offset;                                                                    \
    const int64_t oy0 = j0 / ow, ox0 = j0 - oy0 * ow;                                         \
    const int64_t khw = kh * kw;                                                              \
    int64_t c = p0 / khw, rem = p0 - c * khw, ky = rem / kw, kx = rem - ky * kw;              \
    /* a full sliver inside one output row, 64 bytes wide (the AVX2 kernels' nr): the     \
       vector loop unrolls to two vectors */                                                  \
    enum { ROW_SLIVER = 64 / sizeof(T) };                                                     \
    const int row_sliver = nr == ROW_SLIVER && cols == nr && ox0 + cols <= ow;                \
    for (int64_t p = 0; p < kb; p++) {                                                        \
        T *restrict d = dst + p * nr;                                                         \
        const T *xc = x + c * H * W;                                                          \
        const int64_t dy = ky * g->dilation_h - g->pad_h, dx = kx * g->dilation_w - g->pad_w; \
        int64_t lo, hi;                                                                       \
        if (kx < PACK_MAX_KW) {                                                               \
            lo = los[kx];                                                                     \
            hi = his[kx];                                                                     \
        } else {                                                                              \
            valid_range(dx, sw, W, ow, &lo, &hi);                                             \
        }                                                                                     \
        if (row_sliver) {                                                                     \
            /* the common case: the whole sliver reads one input row, inside the plane */     \
            const int64_t iy = oy0 * sh + dy, sx = ox0 * sw + dx;                             \
            if (iy >= 0 && iy < H && sx >= 0 && sx + nr * sw <= W) {                          \
                gather_run_##SFX(d, xc + iy * W + sx, ROW_SLIVER, sw, W - sx);                \
                goto next_row;                                                                \
            }                                                                                 \
        }                                                                                     \
        int64_t j = 0, oy = oy0, ox = ox0;                                                    \
        while (j < cols) {                                                                    \
            const int64_t run = min64(cols - j, ow - ox);                                     \
            const int64_t iy = oy * sh + dy;                                                  \
            T *restrict dd = d + j - ox; /* dd[o]: output column o of this output row */      \
            if (iy < 0 || iy >= H) {                                                          \
                for (int64_t o = ox; o < ox + run; o++)                                       \
                    dd[o] = (T)0;                                                             \
            } else {                                                                          \
                const int64_t a = min64(max64(ox, lo), ox + run);                             \
                const int64_t b = max64(a, min64(ox + run, hi));                              \
                const T *src = xc + iy * W + dx; /* src[o * sw]: output column o */          \
                for (int64_t o = ox; o < a; o++)                                              \
                    dd[o] = (T)0;                                                             \
                gather_run_##SFX(dd + a, src + a * sw, b - a, sw, W - dx - a * sw);           \
                for (int64_t o = b; o < ox + run; o++)                                        \
                    dd[o] = (T)0;                                                             \
            }                                                                                 \
            j += run;                                                                         \
            ox = 0;                                                                           \
            oy++;                                                                             \
        }                                                                                     \
        for (; j < nr; j++)                                                                   \
            d[j] = (T)0;                                                                      \
    next_row:                                                                                 \
        if (++kx == kw) {                                                                     \
            kx = 0;                                                                           \
            if (++ky == kh) {                                                                 \
                ky = 0;                                                                       \
                c++;                                                                          \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_PACK_B(float, f32)
DEFINE_PACK_B(double, f64)

/* ---------------------------------------------------------------------------------------- */
/* ISA variants and run-time dispatch. */

typedef struct {
    void (*im2col_f32)(const asymo_im2col_job *, int64_t, int64_t, int64_t, int64_t);
    void (*im2col_f64)(const asymo_im2col_job *, int64_t, int64_t, int64_t, int64_t);
    void (*pack_b_f32)(const asymo_im2col_job *, void *, int64_t, int64_t, int64_t, int64_t,
                       int64_t);
    void (*pack_b_f64)(const asymo_im2col_job *, void *, int64_t, int64_t, int64_t, int64_t,
                       int64_t);
    const char *name;
} conv_kernels;

#define DEFINE_VARIANT(ATTR, ISA)                                                             \
ATTR static void im2col_f32_##ISA(const asymo_im2col_job *j, int64_t a, int64_t b,            \
                                  int64_t c, int64_t d) { im2col_body_f32(j, a, b, c, d); }   \
ATTR static void im2col_f64_##ISA(const asymo_im2col_job *j, int64_t a, int64_t b,            \
                                  int64_t c, int64_t d) { im2col_body_f64(j, a, b, c, d); }   \
ATTR static void pack_b_f32_##ISA(const asymo_im2col_job *j, void *d, int64_t j0,            \
                                  int64_t cols, int64_t p0, int64_t kb, int64_t nr)           \
{                                                                                             \
    const int64_t sw = j->geom.stride_w; /* constant strides: the gathers unroll */           \
    if (sw == 1) im2col_pack_b_body_f32(j, (float *)d, j0, cols, p0, kb, nr, 1);              \
    else if (sw == 2) im2col_pack_b_body_f32(j, (float *)d, j0, cols, p0, kb, nr, 2);         \
    else im2col_pack_b_body_f32(j, (float *)d, j0, cols, p0, kb, nr, sw);                     \
}                                                                                             \
ATTR static void pack_b_f64_##ISA(const asymo_im2col_job *j, void *d, int64_t j0,            \
                                  int64_t cols, int64_t p0, int64_t kb, int64_t nr)           \
{                                                                                             \
    const int64_t sw = j->geom.stride_w;                                                      \
    if (sw == 1) im2col_pack_b_body_f64(j, (double *)d, j0, cols, p0, kb, nr, 1);             \
    else if (sw == 2) im2col_pack_b_body_f64(j, (double *)d, j0, cols, p0, kb, nr, 2);        \
    else im2col_pack_b_body_f64(j, (double *)d, j0, cols, p0, kb, nr, sw);                    \
}                                                                                             \
static const conv_kernels kernels_##ISA = {                                                   \
    im2col_f32_##ISA, im2col_f64_##ISA, pack_b_f32_##ISA, pack_b_f64_##ISA, #ISA};

DEFINE_VARIANT(, portable)
#if defined(__x86_64__)
DEFINE_VARIANT(__attribute__((target("avx2,fma"))), avx2_fma)
DEFINE_VARIANT(__attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma"))), avx512)
#endif

static const conv_kernels *select_kernels(void)
{
#if defined(__x86_64__)
    switch (asymo_conv_isa()) {
    case ASYMO_ISA_AVX512: return &kernels_avx512;
    case ASYMO_ISA_AVX2_FMA: return &kernels_avx2_fma;
    default: break;
    }
#endif
    return &kernels_portable;
}

/* ---------------------------------------------------------------------------------------- */
/* Task entry points. */

void asymo_im2col(const asymo_im2col_job *job, int64_t k0, int64_t k1, int64_t n0, int64_t n1)
{
    const conv_kernels *k = select_kernels();
    if (job->dtype == CONV_DTYPE_F64)
        k->im2col_f64(job, k0, k1, n0, n1);
    else
        k->im2col_f32(job, k0, k1, n0, n1);
}

void asymo_im2col_task(int64_t task, void *ctx)
{
    const asymo_im2col_job *job = (const asymo_im2col_job *)ctx;
    const int64_t j = task / job->nrowblocks, i = task % job->nrowblocks;
    const int64_t K = job->geom.channels * job->geom.kernel_h * job->geom.kernel_w;
    const int64_t k0 = K * i / job->nrowblocks, k1 = K * (i + 1) / job->nrowblocks;
    asymo_im2col(job, k0, k1, job->col_bounds[j], job->col_bounds[j + 1]);
}

void asymo_bias_act_task(int64_t task, void *ctx)
{
    /* the GEMM epilogue's row loops, one plane per row */
    const asymo_bias_act_job *job = (const asymo_bias_act_job *)ctx;
    const int64_t n = task / job->channel_blocks, cb = task % job->channel_blocks;
    const int64_t c0 = cb * job->channels_per_task;
    const int64_t c1 = min64(job->channels, c0 + job->channels_per_task);
    if (c1 <= c0)
        return;
    const int64_t es = job->dtype == CONV_DTYPE_F64 ? 8 : 4, plane = job->plane_size;
    const gemm_epilogue_fn f = gemm_epilogue_for(asymo_conv_isa(), job->dtype);
    f((char *)job->y + (n * job->image_stride + c0 * plane) * es, plane, c1 - c0, plane,
      job->bias ? (const char *)job->bias + c0 * es : NULL,
      job->residual ? (const char *)job->residual
                          + (n * job->residual_image_stride + c0 * plane) * es : NULL,
      plane, job->activation);
}


void asymo_im2col_pack_b(const void *ctx, void *dst, int64_t j0, int64_t cols, int64_t p0,
                         int64_t kb, int64_t nr)
{
    const asymo_im2col_job *job = (const asymo_im2col_job *)ctx;
    const conv_kernels *k = select_kernels();
    if (job->dtype == CONV_DTYPE_F64)
        k->pack_b_f64(job, dst, j0, cols, p0, kb, nr);
    else
        k->pack_b_f32(job, dst, j0, cols, p0, kb, nr);
}
