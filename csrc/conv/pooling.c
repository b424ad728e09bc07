/* 2-D max / average pooling over NCHW planes (see pooling_impl.h for the kernel); a task is a
 * run of planes. */
#include "asymo/pooling.h"
#include "asymo/isa.h"

#include <math.h>
#include <string.h>

/* dtype codes, equal to gemm.h's ASYMO_DTYPE_F32 / ASYMO_DTYPE_F64 */
enum { CONV_DTYPE_F32 = 0, CONV_DTYPE_F64 = 1 };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE int64_t pmin(int64_t a, int64_t b) { return a < b ? a : b; }
ALWAYS_INLINE int64_t pmax(int64_t a, int64_t b) { return a > b ? a : b; }

/* Input columns reduced per pass: the vertical reduction of a block of rows lands in a stack
 * buffer of this many elements, then each output column reduces its window of it. */
#define POOL_COLS 512

/* Stride-1 planes at most this many vectors wide, whose out_h x width fits POOL_FLAT_SIZE
 * elements, are pooled as one flat array (pool_plane_flat): their rows are too short to pay
 * a row's setup each */
#define POOL_FLAT_WIDTH_VECS 4
#define POOL_FLAT_SIZE 1536
/* Stride-2 max pooling of planes whose padded rows are at most this many vectors wide and
 * fit POOL_FLAT_S2_SIZE elements with the pass's slack (pool_plane_flat_s2) */
#define POOL_FLAT_S2_WIDTH_VECS 8
#define POOL_FLAT_S2_SIZE 2048
#define POOL_FLAT_S2_SLACK 64

/* 3x3 max pooling walks strips down planes of at most this many bytes (L1) */
#define P3_MAX_PLANE_BYTES (32 << 10)

/* the reduction a pass applies: sum, max letting NaN win, or the plain max (for inputs known
 * to hold no NaN) */
enum { POOL_SUM = 0, POOL_MAX = 1, POOL_MAX_PLAIN = 2 };

/* the edge variant of a strip of p3_plane (pooling_impl.h): inside the row, holding
 * the left / right column of padding, or (stride 2) the last strip inside the row, whose last
 * column the NaN check must still cover */
enum { P3_INNER = 0, P3_LEFT = 1, P3_RIGHT = 2, P3_LAST = 3 };

/* cells an average divides by for the window [i0, i0 + k) along one axis: clipped to the
 * padded input [-pad, size + pad) when count_include_pad, else to the input [0, size) */
ALWAYS_INLINE int64_t pool_window_count(int64_t i0, int64_t k, int64_t size, int64_t pad,
                                        int include_pad)
{
    const int64_t lo = include_pad ? -pad : 0, hi = include_pad ? size + pad : size;
    return pmin(i0 + k, hi) - pmax(i0, lo);
}

#pragma GCC diagnostic ignored "-Wpsabi" /* static inline vector helpers: no ABI crosses */

#define IMPL_HEADER "pooling_impl.h"
#include "conv/instantiate.h"

typedef void (*pool_f32_fn)(const asymo_pool2d_job *, const float *, float *, int64_t);
typedef void (*pool_f64_fn)(const asymo_pool2d_job *, const double *, double *, int64_t);

typedef struct {
    pool_f32_fn f32;
    pool_f64_fn f64;
} pool_kernels;

static const pool_kernels *select_pool_kernels(void)
{
    static const pool_kernels portable = {pool_planes_f32_portable, pool_planes_f64_portable};
#if defined(__x86_64__)
    /* AVX-512 machines run the AVX2 variant: a pooling pass is bound by memory, not width */
    static const pool_kernels avx2 = {pool_planes_f32_avx2_fma, pool_planes_f64_avx2_fma};
    switch (asymo_conv_isa()) {
    case ASYMO_ISA_AVX512:
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
    const int64_t n = pmin(job->nplanes, p0 + job->planes_per_task) - p0;
    const int64_t in_plane = g->height * g->width, out_plane = g->out_h * g->out_w;
    const pool_kernels *k = select_pool_kernels();
    if (n <= 0)
        return;
    if (job->dtype == CONV_DTYPE_F64)
        k->f64(job, (const double *)job->x + p0 * in_plane, (double *)job->y + p0 * out_plane, n);
    else
        k->f32(job, (const float *)job->x + p0 * in_plane, (float *)job->y + p0 * out_plane, n);
}
