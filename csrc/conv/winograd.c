/* Winograd convolution frame (asymo/winograd.h): the pool task, its per-thread scratch, and
 * the choice of the ISA variant of the task body (kernels/<isa>/winograd_*.c). */
#include "conv/winograd_internal.h"
#include "conv/scratch.h"
#include "asymo/isa.h"

#include <stdlib.h>

#pragma GCC diagnostic ignored "-Wpsabi"

/* The same outputs computed directly (no scratch): the task's fallback when memory for the
 * scratch cannot be had, so a task never fails. */
static void wino_direct(const asymo_winograd_job *job, int64_t n, int64_t tblock, int64_t kb)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t m = job->tile, C = g->channels, H = g->height, W = g->width;
    const int64_t OH = g->out_h, OW = g->out_w, K = job->out_channels;
    const int64_t T = job->tiles_h * job->tiles_w;
    const int64_t k0 = kb * job->k_per_block;
    const int64_t k1 = k0 + job->k_per_block < K ? k0 + job->k_per_block : K;
    const int64_t t0 = T * tblock / job->tile_blocks, t1 = T * (tblock + 1) / job->tile_blocks;
    const float *x = (const float *)job->x + n * job->x_image_stride;
    const float *bias = (const float *)job->bias;
    const float *res = job->residual
        ? (const float *)job->residual + n * job->residual_image_stride : NULL;
    float *y = (float *)job->y + n * job->y_image_stride;
    const float *w = (const float *)job->weight;
    for (int64_t k = k0; k < k1; k++) {
        for (int64_t t = t0; t < t1; t++) {
            const int64_t ty = t / job->tiles_w, tx = t - ty * job->tiles_w;
            for (int64_t oy = ty * m; oy < ty * m + m && oy < OH; oy++) {
                for (int64_t ox = tx * m; ox < tx * m + m && ox < OW; ox++) {
                    double acc = bias ? bias[k] : 0.0;
                    for (int64_t c = 0; c < C; c++) {
                        for (int64_t ky = 0; ky < 3; ky++) {
                            const int64_t iy = oy + ky - g->pad_h;
                            if (iy < 0 || iy >= H)
                                continue;
                            for (int64_t kx = 0; kx < 3; kx++) {
                                const int64_t ix = ox + kx - g->pad_w;
                                if (ix >= 0 && ix < W)
                                    acc += (double)w[((k * C + c) * 3 + ky) * 3 + kx]
                                           * x[(c * H + iy) * W + ix];
                            }
                        }
                    }
                    float v = (float)acc;
                    if (res)
                        v += res[(k * OH + oy) * OW + ox];
                    y[(k * OH + oy) * OW + ox] = wino_act1(v, job->activation);
                }
            }
        }
    }
}

static wino_block_fn select_block(void)
{
#if defined(__x86_64__)
    const int isa = asymo_conv_isa();
    if (isa == ASYMO_ISA_AVX2_FMA || isa == ASYMO_ISA_AVX512)
        return asymo_wino_block_avx2;
#endif
    return asymo_wino_block_portable;
}

void asymo_winograd_task(int64_t task, void *ctx)
{
    const asymo_winograd_job *job = (const asymo_winograd_job *)ctx;
    const int64_t per_image = job->tile_blocks * job->k_blocks;
    const int64_t n = task / per_image, rem = task - n * per_image;
    const int64_t tblock = rem / job->k_blocks, kb = rem - tblock * job->k_blocks;
    float *scratch = job->method == 0
        ? (float *)asymo_conv_scratch(ASYMO_SCRATCH_WINOGRAD,
                                      wino_scratch_floats(job) * sizeof(float))
        : NULL;
    if (!scratch) {
        wino_direct(job, n, tblock, kb);
        return;
    }
    select_block()(job, n, tblock, kb, scratch);
}

/* 32 lanes of 32-bit multiply-xor: vectorises (AVX2 vpmulld, NEON mul), so the fingerprint
 * of a layer's weights costs a small fraction of the layer. */
typedef uint32_t fp_vec __attribute__((vector_size(32)));

#define FP_BODY                                                                               \
    const unsigned char *p = (const unsigned char *)data;                                    \
    const uint32_t k32 = 0x9E3779B1u;                                                        \
    fp_vec h0 = {1, 2, 3, 4, 5, 6, 7, 8}, h1 = h0 + 8, h2 = h0 + 16, h3 = h0 + 24;           \
    int64_t i = 0;                                                                            \
    for (; i + 128 <= nbytes; i += 128) {                                                     \
        fp_vec w0, w1, w2, w3;                                                                \
        __builtin_memcpy(&w0, p + i, 32);                                                     \
        __builtin_memcpy(&w1, p + i + 32, 32);                                                \
        __builtin_memcpy(&w2, p + i + 64, 32);                                                \
        __builtin_memcpy(&w3, p + i + 96, 32);                                                \
        h0 = ((h0 ^ w0) * k32); h0 ^= h0 >> 15;                                               \
        h1 = ((h1 ^ w1) * k32); h1 ^= h1 >> 15;                                               \
        h2 = ((h2 ^ w2) * k32); h2 ^= h2 >> 15;                                               \
        h3 = ((h3 ^ w3) * k32); h3 ^= h3 >> 15;                                               \
    }                                                                                         \
    uint32_t lanes[32];                                                                       \
    __builtin_memcpy(lanes, &h0, 32);                                                         \
    __builtin_memcpy(lanes + 8, &h1, 32);                                                     \
    __builtin_memcpy(lanes + 16, &h2, 32);                                                    \
    __builtin_memcpy(lanes + 24, &h3, 32);                                                    \
    uint64_t r = (uint64_t)nbytes * 0x9E3779B97F4A7C15ull;                                    \
    for (; i < nbytes; i++)                                                                   \
        r = (r ^ p[i]) * 0x100000001B3ull;                                                    \
    for (int l = 0; l < 32; l++)                                                              \
        r = (r ^ lanes[l]) * 0x9E3779B97F4A7C15ull;                                           \
    return r ^ (r >> 31);

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t fingerprint_avx2(const void *data,
                                                                 int64_t nbytes)
{
    FP_BODY
}
#endif

static uint64_t fingerprint_base(const void *data, int64_t nbytes)
{
    FP_BODY
}

uint64_t asymo_fingerprint(const void *data, int64_t nbytes)
{
#if defined(__x86_64__)
    if (asymo_isa_supported() & (1u << ASYMO_ISA_AVX2_FMA))
        return fingerprint_avx2(data, nbytes);
#endif
    return fingerprint_base(data, nbytes);
}
