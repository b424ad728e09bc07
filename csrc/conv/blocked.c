/* The blocked-channel layout (asymo/conv.h, NCHW8c): weight packing, the jobs' checks and
 * task decomposition; the micro-kernels are in kernels/x86_avx2/conv_blocked_avx2.c. */
#include <stddef.h>

#include "asymo/conv.h"
#include "asymo/isa.h"
#include "kernels/conv_blocked.h"

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* a 1x1 task's run of pixels: its input in about this many bytes (half a 512 KB L2) */
enum { RUN_BYTES = 96 << 10 };
/* a part of a 1x1 layer's input channels: its weights for one group in about this many bytes */
enum { K_PART_BYTES = 24 << 10 };
/* the most pixels of a run whose input channels go in parts (a multiple of 12) */
enum { PART_PIXELS = 96 };

int asymo_blocked_supported(void)
{
#if defined(__x86_64__)
    const int isa = asymo_conv_isa();
    return isa == ASYMO_ISA_AVX2_FMA || isa == ASYMO_ISA_AVX512;
#else
    return 0;
#endif
}

int64_t asymo_reorder_tasks(const asymo_reorder_job *job)
{
    return cdiv(job->pixels, job->chunk_pixels > 0 ? job->chunk_pixels : job->pixels);
}

void asymo_reorder_task(int64_t task, void *job_)
{
#if defined(__x86_64__)
    const asymo_reorder_job *job = (const asymo_reorder_job *)job_;
    const int64_t P = job->pixels, chunk = job->chunk_pixels > 0 ? job->chunk_pixels : P;
    const int64_t p0 = task * chunk, n = p0 + chunk < P ? chunk : P - p0;
    for (int64_t b = 0; b < job->channels / 8; b++) {
        const float *x = job->to_blocked ? job->x + b * 8 * P + p0 : job->x + (b * P + p0) * 8;
        float *y = job->to_blocked ? job->y + (b * P + p0) * 8 : job->y + b * 8 * P + p0;
        asymo_reorder_block_avx2(x, y, n, P, job->to_blocked);
    }
#else
    (void)task;
    (void)job_;
#endif
}

/* Group g of blocks [b0, b0 + nb) (asymo_pw_blocked_group): input channel ci, output channel
 * 8 b0 + j at packed[8 b0 * channels + ci * 8 nb + j]. */
int64_t asymo_pointwise_blocked_packed_size(int64_t channels, int64_t out_channels)
{
    return channels * out_channels;
}

void asymo_pointwise_blocked_pack(const float *w, int64_t channels, int64_t out_channels,
                                  float *packed)
{
    const int64_t blocks = out_channels / 8, groups = asymo_pw_blocked_groups(blocks);
    for (int64_t g = 0; g < groups; g++) {
        int64_t b0;
        const int nb = asymo_pw_blocked_group(blocks, g, &b0);
        for (int64_t ci = 0; ci < channels; ci++)
            for (int64_t j = 0; j < 8 * nb; j++)
                packed[8 * b0 * channels + ci * 8 * nb + j] = w[(8 * b0 + j) * channels + ci];
    }
}

int64_t asymo_pointwise_blocked_groups(int64_t out_channels)
{
    return asymo_pw_blocked_groups(out_channels / 8);
}

int64_t asymo_pointwise_blocked_tasks(const asymo_pointwise_blocked_job *job)
{
    const int64_t groups = asymo_pw_blocked_groups(job->out_channels / 8);
    const int64_t gpt = job->groups_per_task > 0 ? job->groups_per_task : 1;
    const int64_t chunk = job->chunk_pixels > 0 ? job->chunk_pixels : job->pixels;
    return cdiv(job->pixels, chunk) * cdiv(groups, gpt);
}

/* Task t: chunk t / gtasks of the pixels, groups [t % gtasks * gpt, ...) of output blocks;
 * inside it the chunk goes in runs of pixels whose input (every input block) stays in L2
 * while each group of the task passes over them, so a group's weights are read once a run
 * (a 7 x 7 plane is one run: the weights of a wide layer, megabytes, are read once). */
void asymo_pointwise_blocked_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_pointwise_blocked_job *job = (const asymo_pointwise_blocked_job *)job_;
    const int64_t P = job->pixels, blocks = job->out_channels / 8;
    const int64_t groups = asymo_pw_blocked_groups(blocks);
    const int64_t gpt = job->groups_per_task > 0 ? job->groups_per_task : 1;
    const int64_t chunk = job->chunk_pixels > 0 ? job->chunk_pixels : P;
    const int64_t gtasks = cdiv(groups, gpt);
    const int64_t c0 = t / gtasks * chunk, c1 = c0 + chunk < P ? c0 + chunk : P;
    const int64_t g0 = t % gtasks * gpt, g1 = g0 + gpt < groups ? g0 + gpt : groups;
    /* a run's input: channels x run x 4 bytes in about RUN_BYTES */
    int64_t run = RUN_BYTES / (job->channels * 4) / 12 * 12;
    if (run < 12)
        run = 12;
    /* input channels in parts whose weights, for a group of three blocks, fit in about
     * K_PART_BYTES of L1 (the 960-input layers of MobileNet V2 read 92 KB a group); the sums
     * between parts stay in the task's own buffer */
    const int64_t K = job->channels;
    const int64_t parts = cdiv(K * 8 * ASYMO_PW_BLOCKED_GROUP * 4, K_PART_BYTES);
    const int64_t kp = cdiv(cdiv(K, parts), 8) * 8;
    float part[PART_PIXELS * 8 * ASYMO_PW_BLOCKED_GROUP];
    if (parts > 1 && run > PART_PIXELS)
        run = PART_PIXELS;
    for (int64_t r0 = c0; r0 < c1; r0 += run) {
        const int64_t r1 = r0 + run < c1 ? r0 + run : c1;
        for (int64_t g = g0; g < g1; g++) {
            int64_t b0;
            const int nb = asymo_pw_blocked_group(blocks, g, &b0);
            for (int64_t k0 = 0; k0 < K; k0 += kp)
                asymo_pointwise_blocked_avx2(job, b0, nb, r0, r1, k0, k0 + kp < K ? k0 + kp : K,
                                             parts > 1 ? part : NULL);
        }
    }
#else
    (void)t;
    (void)job_;
#endif
}

void asymo_depthwise_blocked_pack(const float *w, int64_t channels, float *packed)
{
    for (int64_t c = 0; c < channels; c++)
        for (int t = 0; t < 9; t++)
            packed[((c / 8) * 9 + t) * 8 + c % 8] = w[c * 9 + t];
}

int asymo_depthwise_blocked_supported(const asymo_depthwise_blocked_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    return asymo_blocked_supported() && g->channels > 0 && g->channels % 8 == 0
           && g->kernel_h == 3 && g->kernel_w == 3 && g->stride_h == g->stride_w
           && (g->stride_h == 1 || g->stride_h == 2) && g->dilation_h == 1
           && g->dilation_w == 1 && g->pad_h >= 0 && g->pad_h <= 1 && g->pad_w >= 0
           && g->pad_w <= 1 && g->height >= 1 && g->width >= 1 && g->out_h >= 1
           && g->out_w >= 1
           && (!job->x_planar || g->width <= ASYMO_DW_BLOCKED_PLANAR_MAX_WIDTH)
           && (job->activation == ASYMO_ACT_NONE || job->activation == ASYMO_ACT_RELU
               || job->activation == ASYMO_ACT_RELU6);
}

int64_t asymo_depthwise_blocked_tasks(const asymo_depthwise_blocked_job *job)
{
    const int64_t oh = job->geom.out_h, blocks = job->geom.channels / 8;
    const int64_t rpt = job->rows_per_task > 0 ? job->rows_per_task : oh;
    const int64_t bpt = job->blocks_per_task > 0 ? job->blocks_per_task : blocks;
    return cdiv(oh, rpt) * cdiv(blocks, bpt);
}

void asymo_depthwise_blocked_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_depthwise_blocked_job *job = (const asymo_depthwise_blocked_job *)job_;
    const int64_t oh = job->geom.out_h, blocks = job->geom.channels / 8;
    const int64_t rpt = job->rows_per_task > 0 ? job->rows_per_task : oh;
    const int64_t bpt = job->blocks_per_task > 0 ? job->blocks_per_task : blocks;
    const int64_t btasks = cdiv(blocks, bpt);
    const int64_t oy0 = t / btasks * rpt, oy1 = oy0 + rpt < oh ? oy0 + rpt : oh;
    const int64_t b0 = t % btasks * bpt, b1 = b0 + bpt < blocks ? b0 + bpt : blocks;
    for (int64_t b = b0; b < b1; b++)
        asymo_depthwise_blocked_avx2(job, b, oy0, oy1);
#else
    (void)t;
    (void)job_;
#endif
}
