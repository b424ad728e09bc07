/* The blocked-channel layout (asymo/conv.h, NCHW8c): weight packing, the jobs' checks and
 * task decomposition; the micro-kernels are in kernels/x86_avx2/conv_blocked_avx2.c. */
#include <stddef.h>
#include <string.h>

#include "asymo/conv.h"
#include "asymo/isa.h"
#include "kernels/conv_blocked.h"

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* a 1x1 task's run of pixels: its input in about this many bytes (half a 512 KB L2) */
enum { RUN_BYTES = 96 << 10 };
/* a part of a 1x1 layer's input channels: its weights for one group in about this many bytes
 * (with the tile's input lines beside them in L1: docs/tuning.md) */
enum { PW_K_PART_BYTES = 12 << 10 };
/* ... of a dense layer's input blocks, all taps */
enum { DENSE_K_PART_BYTES = 24 << 10 };
/* the most pixels of a run whose input channels go in parts (a multiple of 12) */
enum { PART_PIXELS = 96 };
/* ... of a dense layer's run (rows of the output, or a segment of a wider row): its sums, 24
 * KB for a group of three blocks, stay in L1 with a part's weights */
enum { DENSE_RUN_PIXELS = 256 };
/* the most taps of a dense layer's kernel (a part of one input block then has this many
 * offsets, 8 KB) */
enum { DENSE_MAX_TAPS = 1024 };

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
 * (a 7 x 7 plane of up to 408 input channels is one run: the weights of a wide layer,
 * megabytes, are read once; wider inputs go in several runs, the last one short, which
 * docs/tuning.md measured as costing little). */
void asymo_pointwise_blocked_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_pointwise_blocked_job *job = (const asymo_pointwise_blocked_job *)job_;
    const int64_t P = job->pixels, blocks = job->out_channels / 8;
    const int64_t groups = asymo_pw_blocked_groups(blocks);
    const int64_t gpt = job->groups_per_task > 0 ? job->groups_per_task : 1;
    const int64_t chunk = job->chunk_pixels > 0 ? job->chunk_pixels : P;
    const int64_t gtasks = cdiv(groups, gpt), ctasks = cdiv(P, chunk);
    const int64_t ci = job->groups_outer ? t % ctasks : t / gtasks;
    const int64_t gi = job->groups_outer ? t / ctasks : t % gtasks;
    const int64_t c0 = ci * chunk, c1 = c0 + chunk < P ? c0 + chunk : P;
    const int64_t g0 = gi * gpt, g1 = g0 + gpt < groups ? g0 + gpt : groups;
    /* a run's input: channels x run x 4 bytes in about RUN_BYTES */
    int64_t run = RUN_BYTES / (job->channels * 4) / 12 * 12;
    if (run < 12)
        run = 12;
    /* input channels in parts whose weights, for a group of three blocks, fit in about
     * PW_K_PART_BYTES of L1 (the 960-input layers of MobileNet V2 read 92 KB a group); the
     * sums between parts stay in the task's own buffer */
    const int64_t K = job->channels;
    const int64_t parts = cdiv(K * 8 * ASYMO_PW_BLOCKED_GROUP * 4, PW_K_PART_BYTES);
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

/* ---- dense, through a padded NCHW8c copy -------------------------------------------------- */
/* The padded copy: every window's extent, (out - 1) * stride + kernel rows and columns, per
 * input block (a 64-byte multiple of floats); the packed weights after it when the prepare
 * job packs them. */
typedef struct {
    int64_t hp, wp, ldb, copy_floats;
} dense_layout;

static dense_layout dense_layout_of(const asymo_dense_blocked_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    dense_layout L;
    L.hp = (g->out_h - 1) * g->stride_h + g->kernel_h;
    L.wp = (g->out_w - 1) * g->stride_w + g->kernel_w;
    L.ldb = cdiv(L.hp * L.wp * 8, 16) * 16;
    L.copy_floats = g->channels / 8 * L.ldb;
    return L;
}

int asymo_dense_blocked_supported(const asymo_dense_blocked_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t o = g->out_h, w = g->out_w;
    return asymo_blocked_supported() && g->channels > 0 && g->channels % 8 == 0
           && job->out_channels > 0 && job->out_channels % 8 == 0 && g->kernel_h >= 1
           && g->kernel_w >= 1 && g->stride_h == g->stride_w
           && (g->stride_h == 1 || g->stride_h == 2) && g->dilation_h == 1
           && g->dilation_w == 1 && g->pad_h >= 0 && g->pad_w >= 0 && g->height >= 1
           && g->width >= 1 && o >= 1 && w >= 1
           /* a part's (input block, tap) offsets are on the task's stack */
           && g->kernel_h * g->kernel_w <= DENSE_MAX_TAPS
           /* the gather of the shortcut indexes a block's channels in int32 */
           && 8 * o * w < ((int64_t)1 << 31)
           && (job->activation == ASYMO_ACT_NONE || job->activation == ASYMO_ACT_RELU
               || job->activation == ASYMO_ACT_RELU6);
}

/* Group g of output blocks [b0, b0 + nb) (asymo_pw_blocked_group) at packed[8 b0 K] (K =
 * channels x taps): input block ib, tap t, channel c, output channel 8 b0 + j at
 * ((ib x taps + t) x 8 + c) x 8 nb + j after it. */
int64_t asymo_dense_blocked_packed_size(const asymo_dense_blocked_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    return job->out_channels * g->channels * g->kernel_h * g->kernel_w;
}

void asymo_dense_blocked_pack(const asymo_dense_blocked_job *job, const float *w, float *packed)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t taps = g->kernel_h * g->kernel_w, c = g->channels, k = c * taps;
    const int64_t blocks = job->out_channels / 8, groups = asymo_pw_blocked_groups(blocks);
    for (int64_t gi = 0; gi < groups; gi++) {
        int64_t b0;
        const int nb = asymo_pw_blocked_group(blocks, gi, &b0);
        float *p = packed + 8 * b0 * k;
        for (int64_t ib = 0; ib < c / 8; ib++)
            for (int64_t t = 0; t < taps; t++)
                for (int64_t ci = 0; ci < 8; ci++)
                    for (int64_t j = 0; j < 8 * nb; j++)
                        *p++ = w[((8 * b0 + j) * c + ib * 8 + ci) * taps + t];
    }
}

int64_t asymo_dense_blocked_plane(const asymo_dense_blocked_job *job)
{
    return dense_layout_of(job).ldb;
}

int64_t asymo_dense_blocked_scratch(const asymo_dense_blocked_job *job)
{
    const dense_layout L = dense_layout_of(job);
    return L.copy_floats + (job->apack ? 0 : asymo_dense_blocked_packed_size(job));
}

int64_t asymo_dense_blocked_prepare_tasks(const asymo_dense_blocked_job *job)
{
    const int64_t cb = job->copy_blocks > 0 ? job->copy_blocks : 1;
    return cdiv(job->geom.channels / 8, cb) + (job->apack ? 0 : 1);
}

/* Task t below the copy's tasks: input blocks [t * copy_blocks, ...) of the padded copy, each
 * row reordered to the block's layout between its zero columns; the next (when apack is
 * NULL): the packed weights, after the copy. */
void asymo_dense_blocked_prepare_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_dense_blocked_job *job = (const asymo_dense_blocked_job *)job_;
    const asymo_conv_geometry *g = &job->geom;
    const dense_layout L = dense_layout_of(job);
    const int64_t nblocks = g->channels / 8, cb = job->copy_blocks > 0 ? job->copy_blocks : 1;
    const int64_t copies = cdiv(nblocks, cb);
    if (t >= copies) {
        asymo_dense_blocked_pack(job, (const float *)job->weight,
                                  (float *)job->scratch + L.copy_floats);
        return;
    }
    const int64_t H = g->height, W = g->width, hw = H * W;
    /* the image's columns inside the copy: [pad_w, pad_w + cols) */
    const int64_t cols = W < L.wp - g->pad_w ? W : (L.wp - g->pad_w > 0 ? L.wp - g->pad_w : 0);
    const int64_t tail = L.wp - g->pad_w - cols > 0 ? L.wp - g->pad_w - cols : 0;
    const int64_t left = g->pad_w < L.wp ? g->pad_w : L.wp;
    for (int64_t b = t * cb; b < nblocks && b < (t + 1) * cb; b++) {
        float *dst = (float *)job->scratch + b * L.ldb;
        for (int64_t r = 0; r < L.hp; r++) {
            float *d = dst + r * L.wp * 8;
            const int64_t iy = r - g->pad_h;
            if (iy < 0 || iy >= H || cols == 0) {
                memset(d, 0, (size_t)L.wp * 8 * sizeof(float));
                continue;
            }
            memset(d, 0, (size_t)left * 8 * sizeof(float));
            const float *x = (const float *)job->x + b * 8 * hw + iy * W;
            asymo_reorder_block_avx2(x, d + left * 8, cols, hw, 1);
            memset(d + (left + cols) * 8, 0, (size_t)tail * 8 * sizeof(float));
        }
    }
#else
    (void)t;
    (void)job_;
#endif
}

int64_t asymo_dense_blocked_tasks(const asymo_dense_blocked_job *job)
{
    const int64_t oh = job->geom.out_h;
    const int64_t groups = asymo_pw_blocked_groups(job->out_channels / 8);
    const int64_t rpt = job->rows_per_task > 0 ? job->rows_per_task : 1;
    const int64_t gpt = job->groups_per_task > 0 ? job->groups_per_task : 1;
    return cdiv(oh, rpt) * cdiv(groups, gpt);
}

/* Task t: rows t / gtasks of the output, groups [t % gtasks * gpt, ...) of output blocks.
 * Group by group (its weights, all input channels, stay in L2 over the task's rows), in runs
 * of rows of at most DENSE_RUN_PIXELS pixels (a row wider than that in segments); over a run,
 * input blocks in parts whose weights for the group fit in about DENSE_K_PART_BYTES of L1, each
 * part's weights read from L1 for every row of the run (the sums between parts in the task's
 * own buffer). */
void asymo_dense_blocked_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_dense_blocked_job *job = (const asymo_dense_blocked_job *)job_;
    const asymo_conv_geometry *g = &job->geom;
    const dense_layout L = dense_layout_of(job);
    const int64_t oh = g->out_h, ow = g->out_w, blocks = job->out_channels / 8;
    const int64_t groups = asymo_pw_blocked_groups(blocks);
    const int64_t rpt = job->rows_per_task > 0 ? job->rows_per_task : 1;
    const int64_t gpt = job->groups_per_task > 0 ? job->groups_per_task : 1;
    const int64_t gtasks = cdiv(groups, gpt);
    const int64_t oy0 = t / gtasks * rpt, oy1 = oy0 + rpt < oh ? oy0 + rpt : oh;
    const int64_t g0 = t % gtasks * gpt, g1 = g0 + gpt < groups ? g0 + gpt : groups;
    const int64_t nblocks = g->channels / 8, taps = g->kernel_h * g->kernel_w;
    const int64_t block_bytes = taps * 64 * ASYMO_PW_BLOCKED_GROUP * 4;
    int64_t kp = DENSE_K_PART_BYTES / block_bytes;
    if (kp < 1)
        kp = 1;
    const int parts = kp < nblocks;
    /* a run: rows x seg pixels */
    const int64_t seg = ow < DENSE_RUN_PIXELS ? ow : DENSE_RUN_PIXELS;
    const int64_t run_rows = DENSE_RUN_PIXELS / seg;
    const float *wpack = job->apack ? (const float *)job->apack
                                     : (const float *)job->scratch + L.copy_floats;
    float part[DENSE_RUN_PIXELS * 8 * ASYMO_PW_BLOCKED_GROUP];
    /* a part's (input block, tap) offsets from its first block's window corner: the same for
     * every part, row and group of the task (a shorter last part uses the first ones) */
    const int64_t pk = kp < nblocks ? kp : nblocks;
    int64_t off[pk * taps];
    for (int64_t ib = 0, q = 0; ib < pk; ib++)
        for (int64_t ky = 0; ky < g->kernel_h; ky++)
            for (int64_t kx = 0; kx < g->kernel_w; kx++)
                off[q++] = ib * L.ldb + (ky * L.wp + kx) * 8;
    for (int64_t gi = g0; gi < g1; gi++) {
        int64_t b0;
        const int nb = asymo_pw_blocked_group(blocks, gi, &b0);
        for (int64_t r0 = oy0; r0 < oy1; r0 += run_rows) {
            const int64_t r1 = r0 + run_rows < oy1 ? r0 + run_rows : oy1;
            for (int64_t x0 = 0; x0 < ow; x0 += seg) {
                const int64_t x1 = x0 + seg < ow ? x0 + seg : ow;
                const int64_t ldp = (r1 - r0) * (x1 - x0) * 8;
                for (int64_t ib = 0; ib < nblocks; ib += kp)
                    for (int64_t oy = r0; oy < r1; oy++)
                        asymo_dense_blocked_avx2(
                            job, (const float *)job->scratch, L.wp, L.ldb, off, wpack, b0, nb,
                            oy, x0, x1, ib, ib + kp < nblocks ? ib + kp : nblocks,
                            parts ? part + (oy - r0) * (x1 - x0) * 8 : NULL, ldp);
            }
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
