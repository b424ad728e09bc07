/* Convolution kernels: im2col (the producer of a convolution's GEMM), a direct depthwise
 * convolution, and a bias + activation epilogue.
 *
 * Each kernel is a job struct plus a task function `void fn(int64_t task, void *job)` with the
 * pool's asymo_task_fn signature, so Python hands the job to asymo_pool_run and chooses which
 * cluster runs which tasks (im2col tasks go to the cluster whose GEMM consumes their columns).
 * The task functions never fail: Python validates shapes before building a job.
 *
 * Layouts: images are NCHW, C-contiguous within an image. dtype codes are those of gemm.h's
 * ASYMO_DTYPE_F32 (0) and ASYMO_DTYPE_F64 (1) (declared there, once, for cffi).
 */
#ifndef ASYMO_CONV_H
#define ASYMO_CONV_H

#include <stdint.h>

/* CDEF BEGIN */
enum {
    ASYMO_ACT_NONE = 0,
    ASYMO_ACT_RELU = 1,
    ASYMO_ACT_RELU6 = 2
};

/* Geometry of a 2-D sliding window over channels x height x width planes. pad_h / pad_w are
 * the top / left padding; out_h / out_w fix the bottom / right extent, so asymmetric
 * ("same" with an even kernel) padding needs no extra fields. Input outside the plane is 0. */
typedef struct {
    int64_t channels, height, width;
    int64_t kernel_h, kernel_w;
    int64_t stride_h, stride_w;
    int64_t pad_h, pad_w;
    int64_t dilation_h, dilation_w;
    int64_t out_h, out_w;
} asymo_conv_geometry;

/* im2col of one image (one group's channels): col row r = (c * kernel_h + ky) * kernel_w + kx,
 * column n = oy * out_w + ox. Tasks are (column block, row block) pairs, column blocks
 * outermost, so the tasks of a contiguous run of column blocks form a contiguous task range:
 * give that range to the cluster whose GEMM reads those columns. */
typedef struct {
    asymo_conv_geometry geom;
    int32_t dtype;
    const void *x;              /* channels x height x width */
    void *col;                  /* K x ldcol, K = channels * kernel_h * kernel_w */
    int64_t ldcol;              /* elements between rows of col */
    int64_t col_offset;         /* column index held in col's first column (col may hold a
                                   chunk [col_offset, col_offset + ldcol) of the columns) */
    const int64_t *col_bounds;  /* ncolblocks + 1 increasing column indices */
    int64_t ncolblocks;
    int64_t nrowblocks;         /* row blocks per column block: ntasks = ncolblocks * nrowblocks */
} asymo_im2col_job;

void asymo_im2col_task(int64_t task, void *job);
/* The same, single-threaded, for rows [k0, k1) and columns [n0, n1). */
void asymo_im2col(const asymo_im2col_job *job, int64_t k0, int64_t k1, int64_t n0, int64_t n1);

/* Implicit im2col: the GEMM's B packer (asymo_gemm_args.pack_b with pack_b_ctx = an
 * asymo_im2col_job; uses geom, dtype, x and col_offset, the column of the job's first GEMM
 * column). The column matrix is packed sliver by sliver straight from the image. */
void asymo_im2col_pack_b(const void *job, void *dst, int64_t j0, int64_t cols, int64_t p0,
                         int64_t kb, int64_t nr);

/* Direct depthwise convolution (groups == channels, one input channel per group, out_channels
 * = multiplier * channels) with fused bias, residual and activation:
 * y = act(conv(x) + bias + residual). Output channel oc reads input channel oc / multiplier;
 * weight is out_channels x kernel_h x kernel_w.
 *
 * A task is one image, a block of ASYMO_DW_LANES output channels and rows_per_task output
 * rows: ntasks = batch * ceil(out_channels / ASYMO_DW_LANES) * ceil(out_h / rows_per_task).
 * Method 0 runs 3x3 layers with stride 1 or 2, dilation 1, padding <= 1 and multiplier 1 plane
 * by plane, vectorised along the output row (conv/dwconv3x3.h); every other layer transposes
 * its input rows to channel-interleaved order so that the innermost loop runs over channels
 * (vector lanes) for any plane size, stride or dilation. */
enum { ASYMO_DW_LANES = 16 };

typedef struct {
    asymo_conv_geometry geom;   /* channels = input channels */
    int32_t dtype;
    int32_t activation;
    int64_t batch;
    int64_t out_channels;
    const void *x;              /* batch x channels x height x width, contiguous */
    const void *weight;
    const void *bias;           /* out_channels values or NULL */
    void *y;                    /* image n, channel oc at y + n * y_image_stride + oc * out_h * out_w */
    int64_t y_image_stride;
    int64_t rows_per_task;
    int32_t method;             /* 0: the best kernel for the layer (above); 1: plane-by-plane
                                   reference loop (slow; the fallback when scratch memory is
                                   short); 2: the channel-interleaved kernel for every layer */
    const void *residual;       /* same layout as y with its own image stride, or NULL */
    int64_t residual_image_stride;
} asymo_dwconv_job;

void asymo_dwconv_task(int64_t task, void *job);

/* y[n, c, :] = act(y[n, c, :] + bias[c] + residual[n, c, :]) over planes of plane_size
 * contiguous elements (the convolution epilogue; residual is a ResNet shortcut). A task is
 * channels_per_task channels of one image. */
typedef struct {
    int32_t dtype;
    int32_t activation;
    void *y;
    const void *bias;           /* channels values or NULL */
    const void *residual;       /* same layout as y (own image_stride below) or NULL */
    int64_t residual_image_stride;
    int64_t batch, channels, plane_size;
    int64_t image_stride;       /* elements between images */
    int64_t channels_per_task;
    int64_t channel_blocks;     /* ntasks = batch * channel_blocks */
} asymo_bias_act_job;

void asymo_bias_act_task(int64_t task, void *job);

/* Indirect convolution (float32, one group, dilation 1, equal strides): the layers with few
 * input channels (a CNN's first convolution), whose GEMM would spend a large part of its
 * time packing B straight from the image for a handful of rows of A. The padded image is
 * split once into stride-phase planes, phase (py, px) holding the pixels (r * s + py,
 * q * s + px); then the input of output pixel (oy, ox) for weight tap (c, ky, kx) is element
 * (oy + ky / s, ox + kx / s) of plane (c, ky % s, kx % s), so a run of 16 output pixels of
 * a row is 16 contiguous elements of one row of a plane, and the micro-kernel reads B in
 * place through one offset per tap. y = act(conv(x) + bias).
 *
 * Two jobs per image: asymo_conv_indirect_prepare_task (asymo_conv_indirect_prepare_tasks
 * tasks: the phase planes, and the weights packed into 6-row micro-panels, or 16-row ones
 * and the bias when wide is set) into scratch, then
 * asymo_conv_indirect_task (ceil(out_h / rows_per_task) tasks: blocks of output rows, every
 * output channel, bias and activation on each row once computed). */
enum { ASYMO_INDIRECT_MAX_K = 256 };

typedef struct {
    asymo_conv_geometry geom;   /* channels = input channels; stride_h == stride_w */
    int32_t activation;
    int64_t out_channels;
    const void *x;              /* channels x height x width, one image */
    const void *weight;         /* out_channels x channels x kernel_h x kernel_w */
    const void *bias;           /* out_channels values or NULL */
    void *y;                    /* out_channels x out_h x out_w */
    void *scratch;              /* asymo_conv_indirect_scratch(job) floats */
    int64_t rows_per_task;
    const int64_t *offsets;     /* per tap, its B row in the planes: made once per plan by
                                   asymo_conv_indirect_offsets (channels x kernel entries) */
    int32_t wide;               /* 1: 16-row micro-panels and the AVX-512 kernel (bias and
                                   activation fused), set once per plan; 0: 6-row panels */
} asymo_conv_indirect_job;

/* Whether a layer can take the path on this CPU with the kernels now selected
 * (asymo_conv_isa): the geometry's limits (K = channels * kernel_h * kernel_w <=
 * ASYMO_INDIRECT_MAX_K, strides 1 or 2, dilation 1) and an x86 CPU with AVX2. */
int asymo_conv_indirect_supported(const asymo_conv_indirect_job *job);
int64_t asymo_conv_indirect_scratch(const asymo_conv_indirect_job *job);
int64_t asymo_conv_indirect_prepare_tasks(const asymo_conv_indirect_job *job);
void asymo_conv_indirect_offsets(const asymo_conv_indirect_job *job, int64_t *offsets);
void asymo_conv_indirect_prepare_task(int64_t task, void *job);
void asymo_conv_indirect_task(int64_t task, void *job);

/* Direct 3x3 stride-2 convolution of few input channels (float32, one group, dilation 1; a
 * CNN's first layer: MobileNet's, SqueezeNet's, EfficientNet's stems). K = channels x 9 is
 * too small for a GEMM to amortise packing its B (the whole image, nine times over) and a
 * micro-tile's stores. Here 16 consecutive output pixels of a row are one vector: their
 * channels x 9 tap vectors are read straight from the NCHW rows (kernels/x86_avx512/
 * stride2_taps.h) once, then every output channel is a chain of channels x 9 multiply-adds
 * of those vectors by its broadcast weights, stored to its plane in place: no packing, no
 * transposed store, no padding copy. y = act(conv(x) + bias). A task is rows_per_task
 * output rows of one image, every output channel (ceil(out_h / rows_per_task) tasks a job,
 * one job per image). */
enum { ASYMO_DIRECT_MAX_CHANNELS = 3 };

typedef struct {
    asymo_conv_geometry geom;   /* kernel 3x3, stride 2x2, dilation 1 */
    int32_t activation;
    int64_t out_channels;
    const void *x;              /* channels x height x width, one image */
    const void *weight;         /* out_channels x channels x 3 x 3, as given */
    const void *bias;           /* out_channels values or NULL */
    void *y;                    /* out_channels x out_h x out_w */
    int64_t rows_per_task;
} asymo_conv_direct_job;

/* Whether a layer can take the path on this CPU: the geometry above, 1 <= channels <=
 * ASYMO_DIRECT_MAX_CHANNELS, pads below 3, and AVX-512. */
int asymo_conv_direct_supported(const asymo_conv_direct_job *job);
void asymo_conv_direct_task(int64_t task, void *job);

/* The weights of the indirect and pointwise paths as micro-panels: out_channels x k
 * row-major weights into ceil(out_channels / mr) panels of k x mr (panels[p * mr + i] of each,
 * zero rows past out_channels). */
void asymo_conv_pack_panels(const float *weight, int64_t out_channels, int64_t k, int64_t mr,
                            float *panels);

/* Pointwise convolution in place (float32, 1x1, stride 1, no padding, one group),
 * y[M x N] = act(W[M x K] @ x[K x N] + bias + residual) over the N = height x width pixels of
 * one image, x and y read and written where they are (no packed B, no edge tile, no epilogue
 * pass: bias, shortcut and activation are applied before the one store). Two forms:
 *
 * - runs (ASYMO_POINTWISE_RUNS): the 16 x 16 indirect micro-kernel, 16 output channels by a
 *   run of 16 pixels (tap p at offset p * N); every 16-row panel of weights against each run
 *   while it is in L1. A run shorter than 16 pixels (the image's last) is loaded with a lane
 *   mask, so no load passes the end of x. M is a multiple of 16: no panel has rows to pad, and
 *   the bias is read where it is. For large planes with few output channels.
 * - rows (ASYMO_POINTWISE_ROWS): the pixel-row micro-kernels (kernels/conv_pointwise.h), a
 *   tile of up to 12 pixels by panel_rows (32, 48, 64; on AVX2 8, 16, 24) output channels,
 *   each input value broadcast, the tile transposed into y. No pixel lane is padded, so small
 *   planes (7 x 7, 14 x 14) waste nothing; any M (the last panel's extra channels are neither
 *   read nor stored).
 *
 * Per image: when apack is NULL, asymo_conv_pointwise_prepare_task (one task: the weights'
 * micro-panels into scratch); then asymo_conv_pointwise_task (asymo_conv_pointwise_tasks:
 * runs form, runs of pixels with every output channel; rows form, panels of output channels
 * by tiles of pixels, panel-major). */
enum { ASYMO_POINTWISE_RUNS = 0, ASYMO_POINTWISE_ROWS = 1 };

typedef struct {
    int64_t channels;           /* K: input channels */
    int64_t out_channels;       /* M (runs form: a multiple of 16) */
    int64_t pixels;             /* N: height x width */
    int32_t activation;
    int32_t form;               /* ASYMO_POINTWISE_RUNS or ASYMO_POINTWISE_ROWS */
    int64_t panel_rows;         /* output channels per weight micro-panel: 16 (runs form);
                                   32, 48 or 64 (rows form; 8, 16 or 24 on AVX2) */
    const void *x;              /* channels x pixels, one image */
    const void *weight;         /* out_channels x channels */
    const void *bias;           /* out_channels values or NULL */
    const void *residual;       /* out_channels x pixels (a shortcut added before the
                                   activation) or NULL */
    const void *apack;          /* the weights as micro-panels (asymo_conv_pack_panels, mr
                                   panel_rows), made once for weights that do not change;
                                   NULL: the prepare task packs them into scratch */
    void *y;                    /* out_channels x pixels */
    void *scratch;              /* asymo_conv_pointwise_scratch(job) floats (apack NULL) */
    int64_t runs_per_task;      /* runs form: 16-pixel runs per task */
    int64_t panels_per_task;    /* rows form: micro-panels of output channels per task */
    int64_t tiles_per_task;     /* rows form: tiles of pixels per task (of
                                   asymo_conv_pointwise_tiles) */
    const int64_t *offsets;     /* runs form: p * pixels per input channel p, made once per
                                   plan by asymo_conv_pointwise_offsets */
} asymo_conv_pointwise_job;

/* Whether a layer can take the path in its form on this CPU: channels, out_channels and
 * pixels >= 1; runs form, AVX-512, panel_rows 16 and out_channels a multiple of 16; rows form,
 * panel_rows 32, 48 or 64 on AVX-512, 8, 16 or 24 on AVX2 (kernels/conv_pointwise.h). */
int asymo_conv_pointwise_supported(const asymo_conv_pointwise_job *job);
int64_t asymo_conv_pointwise_scratch(const asymo_conv_pointwise_job *job);
/* rows form: the tiles the pixels are cut into (as even as possible, each at most the
 * panel width's maximum rows) */
int64_t asymo_conv_pointwise_tiles(const asymo_conv_pointwise_job *job);
int64_t asymo_conv_pointwise_tasks(const asymo_conv_pointwise_job *job);
void asymo_conv_pointwise_offsets(const asymo_conv_pointwise_job *job, int64_t *offsets);
void asymo_conv_pointwise_prepare_task(int64_t task, void *job);
void asymo_conv_pointwise_task(int64_t task, void *job);

/* A convolution in the pointwise path's rows form (float32, one group, dilation 1, equal
 * strides 1 or 2, any kernel), for layers whose GEMM spends its time packing B from the image
 * (ResNet's stride-2 3x3 and 1x1 layers). The image is read where it is, or, when the
 * windows reach past it (padding), from a zero-padded copy the prepare job makes per image:
 * tap p = (c, ky, kx) of output pixel (oy, ox) is element offsets[p] + (oy * s) * row +
 * ox * s of it (row: its row length), so a tile of up to 12 consecutive output pixels of one
 * row reads each tap's values s apart, each value broadcast, against a micro-panel of
 * panel_rows output channels of the weights (asymo_conv_pack_panels, mr panel_rows), and
 * the tile is transposed into y. Bias, shortcut and activation are applied before the one
 * store. y = act(conv(x) + bias + residual).
 *
 * Per image: a prepare job when the image is padded or apack is NULL
 * (asymo_conv_rows_prepare_tasks: with copy_bands, the padded copy by the layer's bands of
 * output rows when its tasks are such bands -- every output channel, more than one band --,
 * each band's rows copied by the prepare task of the same number, so a worker mostly reads
 * what it copied; else by blocks of copy_channels channels; then one task packing the weights
 * into scratch when apack is NULL), then asymo_conv_rows_task
 * (asymo_conv_rows_tasks: panels_per_task panels of output channels by tiles_per_task tiles
 * of asymo_conv_rows_tiles, panel-major). Scratch (asymo_conv_rows_scratch floats): the
 * padded copy, then the weights' panels when apack is NULL. */
typedef struct {
    asymo_conv_geometry geom;   /* channels = input channels; stride_h == stride_w (1 or 2) */
    int32_t activation;
    int64_t out_channels;
    int64_t panel_rows;         /* output channels per weight micro-panel: 32, 48 or 64
                                   (AVX-512), 8, 16 or 24 (AVX2) */
    const void *x;              /* channels x height x width, one image */
    const void *weight;         /* out_channels x channels x kernel_h x kernel_w */
    const void *bias;           /* out_channels values or NULL */
    const void *residual;       /* out_channels x out_h x out_w (added before the
                                   activation) or NULL */
    const void *apack;          /* the weights as micro-panels, made once for weights that do
                                   not change; NULL: the prepare job packs them into scratch */
    void *y;                    /* out_channels x out_h x out_w */
    void *scratch;              /* asymo_conv_rows_scratch(job) floats, or NULL when there is
                                   no prepare job */
    int64_t copy_channels;      /* channels per task of the padded copy (0 counts as 1) */
    int64_t copy_bands;         /* nonzero: the padded copy by the layer's bands of output
                                   rows where its tasks are such bands (above) */
    int64_t panels_per_task;    /* micro-panels of output channels per task (0 counts as 1) */
    int64_t tiles_per_task;     /* tiles of asymo_conv_rows_tiles per task (0 counts as 1) */
    const int64_t *offsets;     /* per tap, made once per plan by asymo_conv_rows_offsets
                                   (channels x kernel_h x kernel_w entries) */
} asymo_conv_rows_job;

/* Whether a layer can take the path on this CPU: the geometry above, out_channels >= 1,
 * panel_rows 32, 48 or 64 on AVX-512, 8, 16 or 24 on AVX2. */
int asymo_conv_rows_supported(const asymo_conv_rows_job *job);
/* Whether the windows reach past the image (then the prepare job copies it, padded). */
int asymo_conv_rows_padded(const asymo_conv_rows_job *job);
/* Floats per channel of the image the taps are read from (the padded copy's or x's plane). */
int64_t asymo_conv_rows_plane(const asymo_conv_rows_job *job);
int64_t asymo_conv_rows_scratch(const asymo_conv_rows_job *job);
/* Tiles per image: every output row cut into the fewest tiles of at most the panel width's
 * rows, as even as possible. */
int64_t asymo_conv_rows_tiles(const asymo_conv_rows_job *job);
int64_t asymo_conv_rows_tasks(const asymo_conv_rows_job *job);
int64_t asymo_conv_rows_prepare_tasks(const asymo_conv_rows_job *job);
void asymo_conv_rows_offsets(const asymo_conv_rows_job *job, int64_t *offsets);
void asymo_conv_rows_prepare_task(int64_t task, void *job);
void asymo_conv_rows_task(int64_t task, void *job);

/* Blocked-channel layout (NCHW8c, as ONNX Runtime's MLAS and oneDNN use on AVX2): an image of
 * C channels (a multiple of 8) is C / 8 blocks, each a plane of pixels of 8 channels, so a
 * pixel's 8 channels are one vector. Inside a chain of convolutions that keep it (a model's
 * plan decides, asymo.models.graph_model), a 1x1 convolution reads each pixel's channels as
 * contiguous vectors (NCHW reads one line per channel plane) and writes whole vectors with no
 * transpose, and a depthwise 3x3 one wastes no lanes on narrow planes and needs no split of
 * even and odd columns at stride 2. Float32, AVX2 kernels (run where the convolution kernels
 * are AVX2 or AVX-512). One image per job; every field is set by the caller. */
enum { ASYMO_BLOCK = 8 };

/* The jobs below split an image by pixels (rows) first: every job's task t covers the same
 * part of the image on the same worker, so the data a worker reads is mostly what it wrote
 * in the job before (a split by channels sends half of every tensor to the other cores). */

/* Reorder between NCHW and NCHW8c: planes of `pixels`, `channels` (a multiple of 8). A task
 * is `chunk_pixels` pixels of every channel: ntasks = ceil(pixels / chunk_pixels). */
typedef struct {
    int64_t channels;
    int64_t pixels;
    int32_t to_blocked;         /* 1: x NCHW -> y NCHW8c; 0: x NCHW8c -> y NCHW */
    const float *x;
    float *y;
    int64_t chunk_pixels;
} asymo_reorder_job;

int asymo_blocked_supported(void);
int64_t asymo_reorder_tasks(const asymo_reorder_job *job);
void asymo_reorder_task(int64_t task, void *job);

/* 1x1 stride-1 convolution, NCHW8c -> NCHW8c, y = act(conv(x) + bias + residual). The
 * weights are packed by asymo_pointwise_blocked_pack into groups of three output blocks
 * (asymo_pointwise_blocked_packed_size floats). A task is `groups_per_task` groups of output
 * blocks over one chunk of `chunk_pixels` pixels: ntasks = ceil(pixels / chunk_pixels) x
 * ceil(groups / groups_per_task), where groups = ceil(out_channels / 24); chunk-major (the
 * tasks of one chunk consecutive: a worker reads the pixels it wrote in the job before), or
 * with `groups_outer` group-major (a worker's consecutive tasks share a group's weights; two
 * workers given contiguous ranges share those of the group where the ranges meet). */
typedef struct {
    int64_t channels;           /* input channels, a multiple of 8 */
    int64_t out_channels;       /* a multiple of 8 */
    int64_t pixels;
    int32_t activation;
    const float *x;             /* channels / 8 x pixels x 8 */
    const float *weight;        /* packed */
    const float *bias;          /* out_channels values or NULL */
    const float *residual;      /* like y, or NULL */
    float *y;                   /* out_channels / 8 x pixels x 8 */
    int64_t chunk_pixels;
    int64_t groups_per_task;
    int32_t groups_outer;       /* 1: tasks group-major (see above) */
} asymo_pointwise_blocked_job;

int64_t asymo_pointwise_blocked_packed_size(int64_t channels, int64_t out_channels);
/* Groups of output blocks (of at most three) of a layer of out_channels outputs. */
int64_t asymo_pointwise_blocked_groups(int64_t out_channels);
/* w: out_channels x channels (row-major) into packed (the size above) */
void asymo_pointwise_blocked_pack(const float *w, int64_t channels, int64_t out_channels,
                                  float *packed);
int64_t asymo_pointwise_blocked_tasks(const asymo_pointwise_blocked_job *job);
void asymo_pointwise_blocked_task(int64_t task, void *job);

/* A dense convolution (one group, dilation 1, stride 1 or 2, any padding, a kernel of at most 1024
 * taps) through the blocked layout, NCHW -> NCHW, for the layers whose GEMM packs B from the image
 * once per tap (ResNet's stride-2 3x3 layers on AVX2): per image, a prepare job reorders the image
 * into a zero-padded NCHW8c copy in scratch (and packs the weights there when apack is NULL); then
 * each tile of up to three output blocks by 12 / blocks pixels of one output row reads, per input
 * block and tap, 8 contiguous channels of each of its pixels (one broadcast each) against the
 * blocks' weight vectors, and is stored to the NCHW output with bias, shortcut and activation
 * applied. y = act(conv(x) + bias + residual). Float32, AVX2 kernel.
 *
 * Tasks: asymo_dense_blocked_prepare_tasks (copy_blocks input blocks each, then one packing the
 * weights when apack is NULL), then asymo_dense_blocked_tasks (rows_per_task output rows by
 * groups_per_task groups of output blocks, rows-major). */
typedef struct {
    asymo_conv_geometry geom;   /* channels (input) a multiple of 8, dilation 1 */
    int32_t activation;
    int64_t out_channels;       /* a multiple of 8 */
    const void *x;              /* channels x height x width, one image */
    const void *weight;         /* out_channels x channels x kernel_h x kernel_w */
    const void *bias;           /* out_channels values or NULL */
    const void *residual;       /* like y, or NULL */
    const void *apack;          /* the weights packed (asymo_dense_blocked_pack), made once for
                                   weights that do not change; NULL: the prepare job packs
                                   them into scratch */
    void *y;                    /* out_channels x out_h x out_w */
    void *scratch;              /* asymo_dense_blocked_scratch(job) floats */
    int64_t copy_blocks;        /* input blocks per prepare task (0 counts as 1) */
    int64_t rows_per_task;      /* output rows per task (0 counts as 1) */
    int64_t groups_per_task;    /* groups of three output blocks per task (0 counts as 1) */
} asymo_dense_blocked_job;

int asymo_dense_blocked_supported(const asymo_dense_blocked_job *job);
int64_t asymo_dense_blocked_packed_size(const asymo_dense_blocked_job *job);
/* weight (out_channels x channels x kernel_h x kernel_w) into packed (the size above) */
void asymo_dense_blocked_pack(const asymo_dense_blocked_job *job, const float *weight,
                              float *packed);
/* Floats per input block of the padded copy (every window's extent, 64-byte aligned). */
int64_t asymo_dense_blocked_plane(const asymo_dense_blocked_job *job);
int64_t asymo_dense_blocked_scratch(const asymo_dense_blocked_job *job);
int64_t asymo_dense_blocked_prepare_tasks(const asymo_dense_blocked_job *job);
int64_t asymo_dense_blocked_tasks(const asymo_dense_blocked_job *job);
void asymo_dense_blocked_prepare_task(int64_t task, void *job);
void asymo_dense_blocked_task(int64_t task, void *job);

/* Depthwise 3x3 convolution (one channel per group, multiplier 1), NCHW8c -> NCHW8c, stride
 * 1 or 2 (both axes), padding 0 or 1 (each side), dilation 1, y = act(conv(x) + bias +
 * residual). Weights packed by asymo_depthwise_blocked_pack (channels x 9 floats). A task is
 * `rows_per_task` output rows of `blocks_per_task` channel blocks, rows-major: ntasks =
 * ceil(out_h / rows_per_task) x ceil(channels / 8 / blocks_per_task). */
typedef struct {
    asymo_conv_geometry geom;   /* kernel 3x3, channels a multiple of 8 */
    int32_t activation;
    const float *x;             /* channels / 8 x height x width x 8 */
    const float *weight;        /* packed */
    const float *bias;          /* channels values or NULL */
    const float *residual;      /* like y, or NULL */
    float *y;                   /* channels / 8 x out_h x out_w x 8 */
    int64_t rows_per_task;
    int64_t blocks_per_task;
    int32_t x_planar;           /* 1: x is NCHW (channels x height x width), its rows
                                   reordered in L1 as the task reaches them (width at most
                                   ASYMO_DW_BLOCKED_PLANAR_MAX_WIDTH) */
} asymo_depthwise_blocked_job;
enum { ASYMO_DW_BLOCKED_PLANAR_MAX_WIDTH = 256 };

/* w: channels x 3 x 3 into packed (channels x 9 floats: block b, tap t at (b * 9 + t) * 8) */
void asymo_depthwise_blocked_pack(const float *w, int64_t channels, float *packed);
int64_t asymo_depthwise_blocked_tasks(const asymo_depthwise_blocked_job *job);
int asymo_depthwise_blocked_supported(const asymo_depthwise_blocked_job *job);
void asymo_depthwise_blocked_task(int64_t task, void *job);

/* The ISA variant (ASYMO_ISA_*) the convolution, depthwise and pooling kernels run: the best
 * the CPU supports unless set. asymo_conv_set_isa(isa) selects one (isa < 0: back to the
 * best); it returns 0, or -1 when the CPU cannot run it or the build lacks it. For tests and
 * benchmarks; not to be changed while kernels run. */
int asymo_conv_isa(void);
int asymo_conv_set_isa(int isa);
/* CDEF END */

#endif
