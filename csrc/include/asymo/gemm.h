/* BLIS-style GEMM on the asymmetry-aware pool: C = A @ B for float32 / float64.
 *
 * The work is first split between clusters along one dimension (the processor-level split of
 * AsyMo 4.2), then each cluster's part of C is cut into mc x nc blocks, one pool task each (the
 * core-level partition). A task runs the K loop over its block: B is packed in kc x nc panels
 * that the cluster's tasks pack cooperatively and share (a packed panel is never repacked per
 * task), A in mc x kc blocks packed by the task itself into its worker's scratch, and an
 * mr x nr register micro-kernel chosen at run time by ISA computes each tile.
 *
 * Skinny shapes do not pack: matrix-vector and small M or N (ASYMO_GEMM_MV) stream the big
 * operand once with the small one read in place; outer products (K = 1, ASYMO_GEMM_OUTER)
 * write C directly. Batches of small products (split_dim = ASYMO_SPLIT_BATCH) give whole
 * products to tasks.
 *
 * Everything the driver decides is in the plan (block sizes, cluster ranges, kernel family):
 * plans are made in Python (asymo/plan/gemm.py) and cached per shape.
 */
#ifndef ASYMO_GEMM_H
#define ASYMO_GEMM_H

#include <stdint.h>

#include "asymo/pool.h"

/* CDEF BEGIN */
enum {
    ASYMO_DTYPE_F32 = 0,
    ASYMO_DTYPE_F64 = 1
};

enum {
    ASYMO_GEMM_MM = 0,     /* packed five-loop GEMM */
    ASYMO_GEMM_MV = 1,     /* no packing: min(M, N) small, the long dimension is split */
    ASYMO_GEMM_OUTER = 2   /* K == 1: C[i, j] = A[i, 0] * B[0, j] */
};

enum {
    ASYMO_SPLIT_M = 0,     /* clusters own row ranges of C */
    ASYMO_SPLIT_N = 1,     /* clusters own column ranges of C */
    ASYMO_SPLIT_BATCH = 2  /* clusters own ranges of batch items; each task computes whole items */
};

#define ASYMO_GEMM_MAX_CLUSTERS 8

/* A plan: plain data. Cluster c owns [start[c], stop[c]) along split_dim; the ranges are in
 * order and cover the dimension (empty ranges allowed). Block sizes (mc, nc, kc) are per
 * cluster and used by the MM kind (also inside each item of a SPLIT_BATCH plan); chunk[c] is
 * the number of elements of split_dim per task for the MV and OUTER kinds and the number of
 * items per task for SPLIT_BATCH (ignored for an MM split along M or N). */
typedef struct {
    int kind;
    int split_dim;
    int isa;                                   /* ASYMO_ISA_*; must be supported by the CPU */
    int nclusters;
    int64_t start[8];
    int64_t stop[8];
    int64_t mc[8];
    int64_t nc[8];
    int64_t kc[8];
    int64_t chunk[8];
} asymo_gemm_plan;

/* A constant operand packed once into the micro-panel layout of one or more kernels
 * (asymo_gemm_pack), reused on every call: a layout per (isa, kc) a plan may use. side A: the
 * M x K operand, kc-blocks of mr-row micro-panels; side B: the K x N operand, kc-blocks of
 * nr-column slivers (see asymo_gemm_pack). A cluster whose isa and kc have no layout here, or
 * whose row (column) blocks do not start on a multiple of mr (nr), packs from the plain
 * operand as usual, which must then be given. */
enum {
    ASYMO_PACK_A = 0,
    ASYMO_PACK_B = 1
};

typedef struct {
    int side;                                  /* ASYMO_PACK_A or ASYMO_PACK_B */
    int dtype;
    int64_t dim;                               /* M (side A) or N (side B) */
    int64_t k;
    int nlayouts;                              /* 0..8 */
    int isa[8];
    int64_t kc[8];
    const void *data[8];                       /* from asymo_gemm_pack, 64-byte aligned */
} asymo_gemm_packed;

/* Bytes of one packed layout of a dim x k (side A) or k x dim (side B) operand for the
 * kernel of (isa, dtype): the same for every kc. Negative on a bad argument. */
int64_t asymo_gemm_packed_bytes(int isa, int dtype, int side, int64_t dim, int64_t k);

/* Pack x into dst (asymo_gemm_packed_bytes bytes, 64-byte aligned): side A, x is dim x k
 * with element strides (rs, cs); side B, x is k x dim with strides (rs, cs). Layout: K is cut
 * into blocks of kc (the last shorter, kb = min(kc, k - p0)); block p0 starts at element
 * p0 * dim_pad (dim rounded up to mr / nr); inside it, side A: rows [i, i + mr) at i * kb as
 * one micro-panel (element [p][i'] at p * mr + i', rows past dim zero); side B: columns
 * [j, j + nr) at j * kb (element [p][j'] at p * nr + j', columns past dim zero). */
int asymo_gemm_pack(int isa, int dtype, int side, int64_t dim, int64_t k, int64_t kc,
                    const void *x, int64_t rs, int64_t cs, void *dst);

/* Operands: element strides (any sign), C = A @ B with A m x k, B k x n, C m x n. For a batch,
 * item i uses a + a_offsets[i] bytes (likewise b, c); offsets are NULL when nbatch == 1.
 * C must not overlap A or B. */
typedef struct {
    int dtype;
    int64_t m;
    int64_t n;
    int64_t k;
    const void *a;
    int64_t rsa;
    int64_t csa;
    const void *b;
    int64_t rsb;
    int64_t csb;
    void *c;
    int64_t rsc;
    int64_t csc;
    int64_t nbatch;
    const int64_t *a_offsets;
    const int64_t *b_offsets;
    const int64_t *c_offsets;
    /* Implicit B (optional, NULL: B is read from b / rsb / csb): pack_b(pack_b_ctx, dst, j0,
     * cols, p0, kb, nr) writes rows [p0, p0 + kb) x columns [j0, j0 + cols) of B as one
     * nr-wide sliver, dst[p * nr + j], columns cols..nr-1 zero. Lets a producer (conv2d's
     * im2col) write straight into the packed panels so B is never materialised. MM kind,
     * nbatch == 1 only; b is then ignored. */
    void (*pack_b)(const void *pack_b_ctx, void *dst, int64_t j0, int64_t cols, int64_t p0,
                   int64_t kb, int64_t nr);
    const void *pack_b_ctx;
    /* Pre-packed operands (optional, NULL: none; MM kind, nbatch == 1): used by the clusters
     * whose layout they hold (see asymo_gemm_packed). b_packed takes precedence over pack_b.
     * a (b) may be NULL when a_packed (b_packed) serves every cluster. */
    const asymo_gemm_packed *a_packed;
    const asymo_gemm_packed *b_packed;
    /* Epilogue (optional: NULL / 0 for none; MM kind split along M or N, nbatch == 1, unit
     * column stride of C): each block of C, right after its last K panel while it is in
     * cache, becomes act(C + row_bias[i] + residual[i * rs_residual + j]); activation is
     * conv.h's ASYMO_ACT_* (0 none, 1 ReLU, 2 ReLU6). A convolution's bias, shortcut and
     * activation without another pass over its output. */
    const void *row_bias;
    const void *residual;
    int64_t rs_residual;
    int32_t activation;
} asymo_gemm_args;

/* Run the plan on the pool (or serially in the calling thread when pool is NULL). Returns
 * ASYMO_OK or ASYMO_EINVAL / ASYMO_ENOMEM (or the pool's error). */
int asymo_gemm(struct asymo_pool *pool, const asymo_gemm_args *args,
               const asymo_gemm_plan *plan);

/* One 2-D product, operands passed as plain arguments: the cheapest call from Python. */
int asymo_gemm_2d(struct asymo_pool *pool, const asymo_gemm_plan *plan, int dtype, int64_t m,
                  int64_t k, int64_t n, const void *a, int64_t rsa, int64_t csa,
                  const void *b, int64_t rsb, int64_t csb, void *c, int64_t rsc,
                  int64_t csc);

/* asymo_gemm_2d for asymo.matmul's fast path: returns ASYMO_GEMM_OVERLAP (and computes
 * nothing) when the extent of C in memory overlaps that of A or B (the caller then goes
 * through a temporary), so Python needs no separate overlap test. */
enum { ASYMO_GEMM_OVERLAP = 1 };
int asymo_gemm_2d_checked(struct asymo_pool *pool, const asymo_gemm_plan *plan, int dtype,
                          int64_t m, int64_t k, int64_t n, const void *a, int64_t rsa,
                          int64_t csa, const void *b, int64_t rsb, int64_t csb, void *c,
                          int64_t rsc, int64_t csc);

/* The kernel family used by default: the widest the CPU runs, except on CPUs that execute
 * 512-bit FMAs as two 256-bit halves (AMD Zen 4) where AVX2+FMA has the same peak and keeps
 * it with every core busy. */
int asymo_gemm_default_isa(void);

/* The cpu the calling thread runs on (sched_getcpu), -1 when unknown. */
int asymo_gemm_current_cpu(void);

/* Register tile of the micro-kernel for (isa, dtype); returns ASYMO_OK or ASYMO_EINVAL when
 * that kernel family is not compiled into this build or the CPU cannot run it. */
int asymo_gemm_kernel_tile(int isa, int dtype, int *mr, int *nr);

/* Number of pool tasks the plan gives each cluster (counts has plan->nclusters entries);
 * returns the total, or a negative error code. */
int64_t asymo_gemm_task_counts(const asymo_gemm_args *args, const asymo_gemm_plan *plan,
                               int64_t *counts);

/* Packed-buffer cache: bytes held for reuse across calls, and a way to release them. */
int64_t asymo_gemm_workspace_bytes(void);
void asymo_gemm_workspace_trim(void);
/* Matrix-vector products y = act(A x + bias) with a constant float32 A (m x k) packed once by
 * asymo_mv_pack (a model's classifier at batch 1): panels of ASYMO_MV_PANEL (16) rows
 * interleaved along K, element [i][p] at (i / 16) * 16 * k + p * 16 + i % 16, rows past m
 * zero. Each panel is read as one stream in address order; the dot form of the MV kind reads
 * four rows at once. */
enum { ASYMO_MV_PANEL = 16 }; /* rows per panel */

typedef struct {
    int32_t isa;             /* ASYMO_ISA_*: whose kernel runs (the CPU must support it) */
    int32_t activation;      /* ASYMO_ACT_* (asymo/conv.h) */
    int64_t m;
    int64_t k;
    const float *a;          /* asymo_mv_pack's panels */
    const float *x;          /* k, contiguous */
    const float *bias;       /* m, or NULL */
    float *y;                /* m, contiguous; must not overlap a, x or bias */
    int64_t panels_per_task; /* ntasks = ceil(ceil(m / ASYMO_MV_PANEL) / panels_per_task) */
} asymo_mv_packed_job;

/* Floats of asymo_mv_pack's output for an m x k matrix; negative on a bad size. */
int64_t asymo_mv_packed_floats(int64_t m, int64_t k);

/* Pack a (m x k, row stride lda, unit column stride) into panels (asymo_mv_packed_floats). */
void asymo_mv_pack(const float *a, int64_t m, int64_t k, int64_t lda, float *panels);

/* ASYMO_OK when a job may run (its ISA supported, sizes and pointers sane), else
 * ASYMO_EINVAL. */
int asymo_mv_packed_check(const asymo_mv_packed_job *job);

void asymo_mv_packed_task(int64_t task, void *job);
/* CDEF END */

#endif
