/* 2-D max / average pooling. Like the depthwise kernel: one output row at a time, one pass per
 * window tap over the row's valid range, so the inner loop is contiguous (stride 1) or a
 * fixed-stride read that the compiler vectorises. */
#include "asymo/pooling.h"
#include "asymo/isa.h"

#include <math.h>

/* dtype codes, equal to gemm.h's ASYMO_DTYPE_F32 / ASYMO_DTYPE_F64 */
enum { CONV_DTYPE_F32 = 0, CONV_DTYPE_F64 = 1 };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE int64_t pmin(int64_t a, int64_t b) { return a < b ? a : b; }
ALWAYS_INLINE int64_t pmax(int64_t a, int64_t b) { return a > b ? a : b; }

ALWAYS_INLINE void window_range(int64_t offset, int64_t stride, int64_t width, int64_t out,
                                int64_t *lo, int64_t *hi)
{
    int64_t a = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
    int64_t b = width - offset <= 0 ? 0 : (width - offset + stride - 1) / stride;
    a = pmin(a, out);
    b = pmax(a, pmin(b, out));
    *lo = a;
    *hi = b;
}

#define DEFINE_POOL_BODY(T, SFX, NEG_INF)                                                     \
ALWAYS_INLINE void pool_plane_body_##SFX(const asymo_pool2d_job *job, const T *x, T *y)      \
{                                                                                             \
    const asymo_conv_geometry *g = &job->geom;                                               \
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;                  \
    const int64_t kh = g->kernel_h, kw = g->kernel_w, sh = g->stride_h, sw = g->stride_w;     \
    const int is_max = job->kind == ASYMO_POOL_MAX;                                           \
    for (int64_t oy = 0; oy < oh; oy++) {                                                     \
        T *restrict yr = y + oy * ow;                                                         \
        const T init = is_max ? (NEG_INF) : (T)0;                                             \
        for (int64_t ox = 0; ox < ow; ox++)                                                   \
            yr[ox] = init;                                                                    \
        const int64_t iy0 = oy * sh - g->pad_h;                                               \
        for (int64_t ky = 0; ky < kh; ky++) {                                                 \
            const int64_t iy = iy0 + ky;                                                      \
            if (iy < 0 || iy >= H)                                                            \
                continue;                                                                     \
            const T *xr = x + iy * W;                                                         \
            for (int64_t kx = 0; kx < kw; kx++) {                                             \
                const int64_t dx = kx - g->pad_w;                                             \
                int64_t lo, hi;                                                               \
                window_range(dx, sw, W, ow, &lo, &hi);                                        \
                if (hi <= lo)                                                                 \
                    continue;                                                                 \
                const T *restrict src = xr + dx + lo * sw;                                    \
                T *restrict dst = yr + lo;                                                    \
                const int64_t len = hi - lo;                                                  \
                if (is_max) {                                                                 \
                    for (int64_t o = 0; o < len; o++) {                                       \
                        T v = src[o * sw];                                                    \
                        /* NaN wins, as in torch.max_pool2d */                            \
                        dst[o] = (v > dst[o] || v != v) ? v : dst[o];                         \
                    }                                                                         \
                } else {                                                                      \
                    for (int64_t o = 0; o < len; o++)                                         \
                        dst[o] += src[o * sw];                                                \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        if (!is_max) {                                                                        \
            /* rows / columns counted: the window clipped to the padded input (include_pad)   \
               or to the input itself */                                                      \
            const int64_t lo_y = job->count_include_pad ? -g->pad_h : 0;                      \
            const int64_t hi_y = job->count_include_pad ? H + g->pad_h : H;                   \
            const int64_t ny = pmin(iy0 + kh, hi_y) - pmax(iy0, lo_y);                        \
            for (int64_t ox = 0; ox < ow; ox++) {                                             \
                const int64_t ix0 = ox * sw - g->pad_w;                                       \
                const int64_t lo_x = job->count_include_pad ? -g->pad_w : 0;                  \
                const int64_t hi_x = job->count_include_pad ? W + g->pad_w : W;               \
                const int64_t nx = pmin(ix0 + kw, hi_x) - pmax(ix0, lo_x);                    \
                const int64_t cnt = ny * nx;                                                  \
                yr[ox] = cnt > 0 ? yr[ox] / (T)cnt : (T)0;                                    \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_POOL_BODY(float, f32, -INFINITY)
DEFINE_POOL_BODY(double, f64, -INFINITY)

typedef void (*pool_f32_fn)(const asymo_pool2d_job *, const float *, float *);
typedef void (*pool_f64_fn)(const asymo_pool2d_job *, const double *, double *);

#define DEFINE_POOL_VARIANT(ATTR, ISA)                                                        \
ATTR static void pool_plane_f32_##ISA(const asymo_pool2d_job *j, const float *x, float *y)   \
{ pool_plane_body_f32(j, x, y); }                                                             \
ATTR static void pool_plane_f64_##ISA(const asymo_pool2d_job *j, const double *x, double *y) \
{ pool_plane_body_f64(j, x, y); }

DEFINE_POOL_VARIANT(, portable)
#if defined(__x86_64__)
DEFINE_POOL_VARIANT(__attribute__((target("avx2,fma"))), avx2_fma)
DEFINE_POOL_VARIANT(__attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma"))), avx512)
#endif

typedef struct {
    pool_f32_fn f32;
    pool_f64_fn f64;
} pool_kernels;

static const pool_kernels *select_pool_kernels(void)
{
    static const pool_kernels portable = {pool_plane_f32_portable, pool_plane_f64_portable};
#if defined(__x86_64__)
    static const pool_kernels avx2 = {pool_plane_f32_avx2_fma, pool_plane_f64_avx2_fma};
    static const pool_kernels avx512 = {pool_plane_f32_avx512, pool_plane_f64_avx512};
#endif
#if defined(__x86_64__)
    switch (asymo_conv_isa()) {
    case ASYMO_ISA_AVX512: return &avx512;
    case ASYMO_ISA_AVX2_FMA: return &avx2;
    default: break;
    }
#endif
    return &portable;
}

void asymo_pool2d_task(int64_t task, void *ctx)
{
    const asymo_pool2d_job *job = (const asymo_pool2d_job *)ctx;
    const asymo_conv_geometry *g = &job->geom;
    const int64_t p0 = task * job->planes_per_task;
    const int64_t p1 = pmin(job->nplanes, p0 + job->planes_per_task);
    const int64_t in_plane = g->height * g->width, out_plane = g->out_h * g->out_w;
    const pool_kernels *k = select_pool_kernels();
    for (int64_t p = p0; p < p1; p++) {
        if (job->dtype == CONV_DTYPE_F64)
            k->f64(job, (const double *)job->x + p * in_plane, (double *)job->y + p * out_plane);
        else
            k->f32(job, (const float *)job->x + p * in_plane, (float *)job->y + p * out_plane);
    }
}
