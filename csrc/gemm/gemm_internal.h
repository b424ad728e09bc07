/* The GEMM frame's internals, shared by the files of csrc/gemm/. Not seen by cffi.
 *
 *   dispatch.c   validation, task geometry, workspace sizing, running a plan (asymo_gemm)
 *   mm.c         the packed five-loop product: one task = an mc x nc block of C
 *   mv.c         the skinny products (MV, no packing) and outer products
 *   pack.c       element-type routines: packing A and B, edge tiles, reference loops
 *   workspace.c  the cache of packed-buffer memory
 * The micro-kernels are in csrc/kernels/, the choice of kernel per ISA / CPU in csrc/config/.
 */
#ifndef ASYMO_GEMM_INTERNAL_H
#define ASYMO_GEMM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "asymo/gemm.h"
#include "kernels/gemm_kernels.h"

#define GEMM_INTERNAL __attribute__((visibility("hidden")))

#define MAXC ASYMO_GEMM_MAX_CLUSTERS

/* A cluster computing at most this many rows of C has its kernel read B in place (when the
 * kernel family can): a packed B sliver would serve only a few micro-panels of mr rows, too
 * few to repay the copy. */
#ifndef DIRECT_B_MAX_ROWS
#define DIRECT_B_MAX_ROWS 48
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Element-type routines of the frame (pack.c), one table per dtype. */
typedef struct {
    void (*pack_a)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int, asymo_pack_rows_fn);
    void (*pack_b)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int);
    void (*merge)(void *, int64_t, int64_t, const void *, int, int64_t, int64_t, int);
    asymo_skinny_fn skinny_strided;
    void (*outer)(const void *, int64_t, const void *, int64_t, void *, int64_t, int64_t,
                  int64_t, int64_t, int64_t, int64_t);
    void (*reduce)(void *, int64_t, int64_t, void *, int64_t, int64_t, int64_t, int64_t);
    void (*zero)(void *, int64_t, int64_t, int64_t, int64_t);
} dtype_ops;

#include "gemm/epilogue.h"

GEMM_INTERNAL extern const dtype_ops gemm_ops_f32, gemm_ops_f64;

/* ------------------------------------------------------------------------------------------
 * Problem in canonical form (one batch item) and per-cluster task geometry
 * ---------------------------------------------------------------------------------------- */
/* One batch item's operands (byte pointers, element strides). */
typedef struct {
    const char *a, *b;
    char *c;
    int64_t m, n, k, rsa, csa, rsb, csb, rsc, csc;
    void (*pack_b)(const void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t);
    const void *pack_b_ctx;
    /* epilogue (see asymo_gemm_args); none when bias, res and act are all zero */
    const char *bias, *res;
    int64_t rsr;
    int act;
} operands;

/* The skinny product out(L x S) = mat(L x K) @ vec(K x S) seen from one orientation. */
typedef struct {
    const char *mat, *vec;
    char *out;
    int64_t l, s, k, rsl, csp, rsp, css, orl, ocs;
} skinny_view;

typedef struct {
    int64_t r0, r1, q0, q1; /* rows and columns of C this cluster computes */
    int64_t mc, nc, kc;
    int64_t ntm, ntn, npc;  /* blocks along M, N and panels along K */
    int64_t chunk;          /* MV / OUTER: elements of the split dimension per task */
    int64_t k0, k1, kchunk; /* MV in axpy form: the cluster's share of K, K per task */
    int64_t task0, ntasks;
    /* MM only */
    int64_t nsl;            /* slivers in a full-width panel */
    int64_t panel_elems;    /* elements of a full panel */
    char *bpack;
    const char *apre, *bpre; /* pre-packed A / B layout this cluster uses, or NULL */
    int direct_b;           /* B read in place by the kernel (no shared panels, see mm.c) */
    int b_reader;           /* reads cluster 0's B panels instead of packing its own (mm.c) */
    _Atomic unsigned char *ready; /* per panel and sliver: free, being packed, packed (mm.c) */
    /* A blocks kept for the cluster's other column blocks (see mm.c), or NULL: block
     * (tm, pc) of nmp micro-panels at akeep + (tm * npc + pc) * nmp * mr * kc elements */
    char *akeep;
    int64_t nmp;            /* micro-panels in a full row block */
    _Atomic int *aowner;    /* per A block: 1 + the slot that packed it, 0: none yet */
} cluster_part;

typedef struct {
    const asymo_gemm_kernel *kern;
    const dtype_ops *ops;
    gemm_epilogue_fn epilogue; /* the plan's ISA and dtype */
    int kind, split_dim, es, mr, nr;
    int64_t mpad, npad;     /* M and N rounded up to mr and nr (pre-packed layouts) */
    int nclusters;
    int nslots;
    const asymo_pool *pool;
    int long_is_m;          /* MV: orientation */
    int vec_copied;         /* MV dot form: vec copied into vecbuf */
    int ksplit;             /* MV axpy form: tasks own K ranges, partial sums reduced */
    char *partial;          /* ksplit: one S x L partial result per task */
    size_t partial_bytes;
    int64_t ktasks;
    _Atomic int64_t *kdone; /* ksplit: tasks finished; the last one reduces */
    operands o;
    skinny_view sv;
    asymo_skinny_fn skinny;
    cluster_part cl[MAXC];
    /* per-slot scratch (slot = pool worker, last slot for the submitting thread) */
    char *apack;
    size_t apack_bytes;
    char *tile;
    size_t tile_bytes;
    char *bslot;            /* SPLIT_BATCH: per-slot B panel */
    size_t bslot_bytes;
    char *vecbuf;           /* MV dot form: contiguous copy of the vectors (shared or per slot) */
    size_t vec_bytes;
    /* batch */
    const asymo_gemm_args *args;
    int64_t item;
} job;

/* The cluster part a task id belongs to: parts hold consecutive task ranges, cluster order. */
static inline const cluster_part *part_of_task(const job *J, int64_t t)
{
    int c = 0;
    while (t >= J->cl[c].task0 + J->cl[c].ntasks)
        c++;
    return &J->cl[c];
}

/* Scratch slot of the calling thread: its worker index in the job's pool, or the last slot
 * for the thread that submitted the job (which may run tasks itself). */
static inline int slot_of(const job *J)
{
    if (J->pool && asymo_pool_current() == J->pool) {
        int w = asymo_pool_current_worker();
        if (w >= 0 && w < J->nslots - 1)
            return w;
    }
    return J->nslots - 1;
}

static inline operands item_operands(const asymo_gemm_args *g, int64_t i)
{
    operands o = {(const char *)g->a, (const char *)g->b, (char *)g->c, g->m, g->n, g->k,
                  g->rsa, g->csa, g->rsb, g->csb, g->rsc, g->csc, g->pack_b, g->pack_b_ctx,
                  (const char *)g->row_bias, (const char *)g->residual, g->rs_residual,
                  g->activation};
    if (g->nbatch > 1) {
        o.a += g->a_offsets[i];
        o.b += g->b_offsets[i];
        o.c += g->c_offsets[i];
    }
    return o;
}

static inline skinny_view skinny_orient(const operands *o, int long_is_m)
{
    skinny_view v;
    if (long_is_m) {
        v = (skinny_view){o->a, o->b, o->c, o->m, o->n, o->k,
                          o->rsa, o->csa, o->rsb, o->csb, o->rsc, o->csc};
    } else { /* C^T = B^T A^T */
        v = (skinny_view){o->b, o->a, o->c, o->n, o->m, o->k,
                          o->csb, o->rsb, o->csa, o->rsa, o->csc, o->rsc};
    }
    return v;
}

/* ------------------------------------------------------------------------------------------
 * Workspace (workspace.c)
 * ---------------------------------------------------------------------------------------- */
GEMM_INTERNAL void *ws_acquire(size_t want, size_t *got);
GEMM_INTERNAL void ws_release(void *p, size_t size);

/* Bump allocator over one workspace buffer. */
typedef struct {
    char *base;
    size_t used;
} carve;

static inline void *carve_take(carve *cv, size_t bytes)
{
    void *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += round_up(bytes, ASYMO_ALIGN);
    return p;
}

/* ------------------------------------------------------------------------------------------
 * Tasks (mm.c, mv.c); each has the pool's asymo_task_fn signature, ctx = the job
 * ---------------------------------------------------------------------------------------- */
GEMM_INTERNAL void mm_task(int64_t t, void *ctx);
GEMM_INTERNAL void mm_serial(const job *J, const operands *o, const cluster_part *C, int slot);
GEMM_INTERNAL asymo_skinny_fn skinny_pick(const job *J, const skinny_view *v, int *copy_vec);
GEMM_INTERNAL void copy_vectors(const job *J, const skinny_view *v, char *dst);
GEMM_INTERNAL void skinny_run(const job *J, const skinny_view *v, asymo_skinny_fn fn,
                              const char *vec, int copied, int64_t l0, int64_t l1);
GEMM_INTERNAL void mv_task(int64_t t, void *ctx);
GEMM_INTERNAL void mv_ksplit_task(int64_t t, void *ctx);
GEMM_INTERNAL void outer_task(int64_t t, void *ctx);

#endif
