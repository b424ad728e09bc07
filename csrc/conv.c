/* Convolution kernels: im2col, direct depthwise convolution, bias + activation epilogue.
 *
 * The loops are written so the compiler vectorises the innermost one (contiguous output
 * pixels of one row); each kernel is compiled three times (portable, AVX2+FMA, AVX-512) through
 * per-function target attributes, and the variant is chosen once at run time. */
#include "conv.h"
#include "cpu_features.h"

#include <math.h>
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
                    T *restrict dd = d + a;                                                   \
                    for (int64_t o = 0; o < b - a; o++)                                       \
                        dd[o] = src[o * sw];                                                  \
                }                                                                             \
                if (ox1 > b)                                                                  \
                    memset(d + b, 0, (size_t)(ox1 - b) * sizeof(T));                          \
            }                                                                                 \
            n += ox1 - ox0;                                                                   \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
ALWAYS_INLINE void activate_row_##SFX(T *restrict y, int64_t n, int activation)              \
{                                                                                             \
    if (activation == ASYMO_ACT_RELU) {                                                       \
        for (int64_t i = 0; i < n; i++)                                                       \
            y[i] = y[i] > (T)0 ? y[i] : (T)0;                                                 \
    } else if (activation == ASYMO_ACT_RELU6) {                                               \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T v = y[i] > (T)0 ? y[i] : (T)0;                                                  \
            y[i] = v < (T)6 ? v : (T)6;                                                       \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* Rows [oy0, oy1) of one depthwise output plane. Each tap (ky, kx) adds w * shifted input    \
 * row over its valid output range; the output row stays in L1 across the taps. */            \
ALWAYS_INLINE void dw_rows_body_##SFX(const asymo_conv_geometry *g, const T *x,               \
                                      const T *w, T bias, T *y, int64_t oy0, int64_t oy1,     \
                                      int activation)                                         \
{                                                                                             \
    const int64_t H = g->height, W = g->width, ow = g->out_w;                                 \
    const int64_t kh = g->kernel_h, kw = g->kernel_w, sh = g->stride_h, sw = g->stride_w;     \
    for (int64_t oy = oy0; oy < oy1; oy++) {                                                  \
        T *restrict yr = y + oy * ow;                                                         \
        for (int64_t ox = 0; ox < ow; ox++)                                                   \
            yr[ox] = bias;                                                                    \
        for (int64_t ky = 0; ky < kh; ky++) {                                                 \
            const int64_t iy = oy * sh + ky * g->dilation_h - g->pad_h;                       \
            if (iy < 0 || iy >= H)                                                            \
                continue;                                                                     \
            const T *xr = x + iy * W;                                                         \
            for (int64_t kx = 0; kx < kw; kx++) {                                             \
                const T wv = w[ky * kw + kx];                                                 \
                const int64_t dx = kx * g->dilation_w - g->pad_w;                             \
                int64_t lo, hi;                                                               \
                valid_range(dx, sw, W, ow, &lo, &hi);                                         \
                const T *restrict src = xr + dx + lo * sw;                                    \
                T *restrict dst = yr + lo;                                                    \
                const int64_t len = hi - lo;                                                  \
                if (sw == 1) {                                                                \
                    for (int64_t o = 0; o < len; o++)                                         \
                        dst[o] += wv * src[o];                                                \
                } else if (sw == 2) {                                                         \
                    for (int64_t o = 0; o < len; o++)                                         \
                        dst[o] += wv * src[2 * o];                                            \
                } else {                                                                      \
                    for (int64_t o = 0; o < len; o++)                                         \
                        dst[o] += wv * src[o * sw];                                           \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        activate_row_##SFX(yr, ow, activation);                                               \
    }                                                                                         \
}                                                                                             \
                                                                                              \
ALWAYS_INLINE void bias_act_body_##SFX(T *restrict y, const T *restrict r, int64_t n,      \
                                       T bias, int activation)                                \
{                                                                                             \
    /* one pass over y per plane: the residual, bias and activation in the same loop */       \
    if (r) {                                                                                  \
        if (activation == ASYMO_ACT_RELU) {                                                   \
            for (int64_t i = 0; i < n; i++) {                                                 \
                T v = y[i] + bias + r[i];                                                     \
                y[i] = v > (T)0 ? v : (T)0;                                                   \
            }                                                                                 \
        } else if (activation == ASYMO_ACT_RELU6) {                                           \
            for (int64_t i = 0; i < n; i++) {                                                 \
                T v = y[i] + bias + r[i];                                                     \
                v = v > (T)0 ? v : (T)0;                                                      \
                y[i] = v < (T)6 ? v : (T)6;                                                   \
            }                                                                                 \
        } else {                                                                              \
            for (int64_t i = 0; i < n; i++)                                                   \
                y[i] = y[i] + bias + r[i];                                                    \
        }                                                                                     \
        return;                                                                               \
    }                                                                                         \
    if (activation == ASYMO_ACT_RELU) {                                                       \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T v = y[i] + bias;                                                                \
            y[i] = v > (T)0 ? v : (T)0;                                                       \
        }                                                                                     \
    } else if (activation == ASYMO_ACT_RELU6) {                                               \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T v = y[i] + bias;                                                                \
            v = v > (T)0 ? v : (T)0;                                                          \
            y[i] = v < (T)6 ? v : (T)6;                                                       \
        }                                                                                     \
    } else {                                                                                  \
        for (int64_t i = 0; i < n; i++)                                                       \
            y[i] += bias;                                                                     \
    }                                                                                         \
}

DEFINE_BODIES(float, f32)
DEFINE_BODIES(double, f64)

/* ---------------------------------------------------------------------------------------- */
/* ISA variants and run-time dispatch. */

typedef struct {
    void (*im2col_f32)(const asymo_im2col_job *, int64_t, int64_t, int64_t, int64_t);
    void (*im2col_f64)(const asymo_im2col_job *, int64_t, int64_t, int64_t, int64_t);
    void (*dw_rows_f32)(const asymo_conv_geometry *, const float *, const float *, float,
                        float *, int64_t, int64_t, int);
    void (*dw_rows_f64)(const asymo_conv_geometry *, const double *, const double *, double,
                        double *, int64_t, int64_t, int);
    void (*bias_act_f32)(float *, const float *, int64_t, float, int);
    void (*bias_act_f64)(double *, const double *, int64_t, double, int);
    const char *name;
} conv_kernels;

#define DEFINE_VARIANT(ATTR, ISA)                                                             \
ATTR static void im2col_f32_##ISA(const asymo_im2col_job *j, int64_t a, int64_t b,            \
                                  int64_t c, int64_t d) { im2col_body_f32(j, a, b, c, d); }   \
ATTR static void im2col_f64_##ISA(const asymo_im2col_job *j, int64_t a, int64_t b,            \
                                  int64_t c, int64_t d) { im2col_body_f64(j, a, b, c, d); }   \
ATTR static void dw_rows_f32_##ISA(const asymo_conv_geometry *g, const float *x,              \
                                   const float *w, float bias, float *y, int64_t oy0,         \
                                   int64_t oy1, int act)                                      \
{ dw_rows_body_f32(g, x, w, bias, y, oy0, oy1, act); }                                        \
ATTR static void dw_rows_f64_##ISA(const asymo_conv_geometry *g, const double *x,             \
                                   const double *w, double bias, double *y, int64_t oy0,      \
                                   int64_t oy1, int act)                                      \
{ dw_rows_body_f64(g, x, w, bias, y, oy0, oy1, act); }                                        \
ATTR static void bias_act_f32_##ISA(float *y, const float *r, int64_t n, float b, int act)    \
{ bias_act_body_f32(y, r, n, b, act); }                                                       \
ATTR static void bias_act_f64_##ISA(double *y, const double *r, int64_t n, double b, int act) \
{ bias_act_body_f64(y, r, n, b, act); }                                                       \
static const conv_kernels kernels_##ISA = {                                                   \
    im2col_f32_##ISA, im2col_f64_##ISA, dw_rows_f32_##ISA, dw_rows_f64_##ISA,                 \
    bias_act_f32_##ISA, bias_act_f64_##ISA, #ISA};

DEFINE_VARIANT(, portable)
#if defined(__x86_64__)
DEFINE_VARIANT(__attribute__((target("avx2,fma"))), avx2_fma)
DEFINE_VARIANT(__attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma"))), avx512)
#endif

static const conv_kernels *select_kernels(void)
{
    static const conv_kernels *chosen;
    const conv_kernels *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (k)
        return k;
    k = &kernels_portable;
#if defined(__x86_64__)
    uint32_t isa = asymo_isa_supported();
    if (isa & (1u << ASYMO_ISA_AVX512))
        k = &kernels_avx512;
    else if (isa & (1u << ASYMO_ISA_AVX2_FMA))
        k = &kernels_avx2_fma;
#endif
    __atomic_store_n(&chosen, k, __ATOMIC_RELEASE);
    return k;
}

const char *asymo_conv_isa(void) { return select_kernels()->name; }

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

void asymo_dwconv_task(int64_t task, void *ctx)
{
    const asymo_dwconv_job *job = (const asymo_dwconv_job *)ctx;
    const asymo_conv_geometry *g = &job->geom;
    const int64_t rb = task % job->row_blocks, plane = task / job->row_blocks;
    const int64_t n = plane / job->out_channels, oc = plane % job->out_channels;
    const int64_t mult = job->out_channels / g->channels;
    const int64_t ic = oc / mult;
    const int64_t oy0 = rb * job->rows_per_task;
    const int64_t oy1 = min64(g->out_h, oy0 + job->rows_per_task);
    const int64_t in_off = (n * g->channels + ic) * g->height * g->width;
    const int64_t out_off = n * job->y_image_stride + oc * g->out_h * g->out_w;
    const int64_t taps = g->kernel_h * g->kernel_w;
    const conv_kernels *k = select_kernels();
    if (job->dtype == CONV_DTYPE_F64) {
        const double *b = (const double *)job->bias;
        k->dw_rows_f64(g, (const double *)job->x + in_off, (const double *)job->weight + oc * taps,
                       b ? b[oc] : 0.0, (double *)job->y + out_off, oy0, oy1, job->activation);
    } else {
        const float *b = (const float *)job->bias;
        k->dw_rows_f32(g, (const float *)job->x + in_off, (const float *)job->weight + oc * taps,
                       b ? b[oc] : 0.0f, (float *)job->y + out_off, oy0, oy1, job->activation);
    }
}

void asymo_bias_act_task(int64_t task, void *ctx)
{
    const asymo_bias_act_job *job = (const asymo_bias_act_job *)ctx;
    const int64_t n = task / job->channel_blocks, cb = task % job->channel_blocks;
    const int64_t c0 = cb * job->channels_per_task;
    const int64_t c1 = min64(job->channels, c0 + job->channels_per_task);
    const conv_kernels *k = select_kernels();
    for (int64_t c = c0; c < c1; c++) {
        const int64_t off = n * job->image_stride + c * job->plane_size;
        const int64_t roff = n * job->residual_image_stride + c * job->plane_size;
        if (job->dtype == CONV_DTYPE_F64) {
            const double *b = (const double *)job->bias;
            const double *r = (const double *)job->residual;
            k->bias_act_f64((double *)job->y + off, r ? r + roff : NULL, job->plane_size,
                            b ? b[c] : 0.0, job->activation);
        } else {
            const float *b = (const float *)job->bias;
            const float *r = (const float *)job->residual;
            k->bias_act_f32((float *)job->y + off, r ? r + roff : NULL, job->plane_size,
                            b ? b[c] : 0.0f, job->activation);
        }
    }
}
