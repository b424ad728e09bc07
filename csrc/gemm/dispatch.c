/* GEMM dispatch: validate the arguments against the plan, lay the tasks out per cluster,
 * size and carve the workspace, and run the plan's kind on the pool. See asymo/gemm.h for
 * the model and gemm_internal.h for the frame's files. */
#define _GNU_SOURCE /* sched_getcpu */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "asymo/isa.h"
#include "config/config.h"
#include "gemm/gemm_internal.h"

int asymo_gemm_current_cpu(void)
{
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
}

/* ------------------------------------------------------------------------------------------
 * SPLIT_BATCH: a task computes whole products
 * ---------------------------------------------------------------------------------------- */
/* One whole item in the calling thread. */
static void item_serial(const job *J, const operands *o, const cluster_part *C, int slot)
{
    if (o->m == 0 || o->n == 0)
        return;
    if (o->k == 0) {
        J->ops->zero(o->c, o->rsc, o->csc, o->m, o->n);
        return;
    }
    if (J->kind == ASYMO_GEMM_OUTER) {
        J->ops->outer(o->a, o->rsa, o->b, o->csb, o->c, o->rsc, o->csc, 0, o->m, 0, o->n);
    } else if (J->kind == ASYMO_GEMM_MV) {
        skinny_view v = skinny_orient(o, J->long_is_m);
        int copy;
        asymo_skinny_fn fn = skinny_pick(J, &v, &copy);
        char *vec = (char *)v.vec;
        if (copy) {
            vec = J->vecbuf + J->vec_bytes * slot;
            copy_vectors(J, &v, vec);
        }
        skinny_run(J, &v, fn, vec, copy, 0, v.l);
    } else {
        mm_serial(J, o, C, slot);
    }
}

static void batch_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const int slot = slot_of(J);
    const int64_t first = C->r0 + (t - C->task0) * C->chunk;
    const int64_t last = min64(first + C->chunk, C->r1);
    for (int64_t i = first; i < last; i++) {
        operands o = item_operands(J->args, i);
        item_serial(J, &o, C, slot);
    }
}

/* ------------------------------------------------------------------------------------------
 * Validation, geometry, dispatch
 * ---------------------------------------------------------------------------------------- */
static int check(const asymo_gemm_args *g, const asymo_gemm_plan *p)
{
    if (!g || !p)
        return ASYMO_EINVAL;
    if (g->dtype != ASYMO_DTYPE_F32 && g->dtype != ASYMO_DTYPE_F64)
        return ASYMO_EINVAL;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->nbatch < 1)
        return ASYMO_EINVAL;
    if (g->nbatch > 1 && (!g->a_offsets || !g->b_offsets || !g->c_offsets))
        return ASYMO_EINVAL;
    if (g->m > 0 && g->n > 0
        && (!g->c || (g->k > 0 && ((!g->a && !g->a_packed)
                                   || (!g->b && !g->pack_b && !g->b_packed)))))
        return ASYMO_EINVAL;
    if ((g->a_packed || g->b_packed)
        && (p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH || g->nbatch != 1))
        return ASYMO_EINVAL;
    if (g->a_packed && (g->a_packed->side != ASYMO_PACK_A || g->a_packed->dtype != g->dtype
                        || g->a_packed->dim != g->m || g->a_packed->k != g->k
                        || g->a_packed->nlayouts < 0 || g->a_packed->nlayouts > MAXC))
        return ASYMO_EINVAL;
    if (g->b_packed && (g->b_packed->side != ASYMO_PACK_B || g->b_packed->dtype != g->dtype
                        || g->b_packed->dim != g->n || g->b_packed->k != g->k
                        || g->b_packed->nlayouts < 0 || g->b_packed->nlayouts > MAXC))
        return ASYMO_EINVAL;
    if (g->pack_b && (p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH
                      || g->nbatch != 1))
        return ASYMO_EINVAL;
    if ((g->row_bias || g->residual || g->activation)
        && (p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH || g->nbatch != 1
            || g->csc != 1 || g->activation < 0 || g->activation > 2 || g->k < 1))
        return ASYMO_EINVAL;
    if (p->nclusters < 1 || p->nclusters > MAXC)
        return ASYMO_EINVAL;
    if (p->kind < ASYMO_GEMM_MM || p->kind > ASYMO_GEMM_OUTER)
        return ASYMO_EINVAL;
    if (p->split_dim < ASYMO_SPLIT_M || p->split_dim > ASYMO_SPLIT_BATCH)
        return ASYMO_EINVAL;
    if (!asymo_gemm_kernel_for(p->isa, g->dtype))
        return ASYMO_EINVAL;
    const int64_t dim = p->split_dim == ASYMO_SPLIT_M ? g->m
                        : p->split_dim == ASYMO_SPLIT_N ? g->n : g->nbatch;
    for (int c = 0; c < p->nclusters; c++) {
        if (p->start[c] > p->stop[c] || (c == 0 ? p->start[c] != 0
                                                : p->start[c] != p->stop[c - 1]))
            return ASYMO_EINVAL;
        if (p->mc[c] < 1 || p->nc[c] < 1 || p->kc[c] < 1)
            return ASYMO_EINVAL;
        if ((p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH) && p->chunk[c] < 1)
            return ASYMO_EINVAL;
    }
    if (p->stop[p->nclusters - 1] != dim)
        return ASYMO_EINVAL;
    if (p->kind == ASYMO_GEMM_OUTER && g->k > 1)
        return ASYMO_EINVAL;
    if (p->kind == ASYMO_GEMM_MV) {
        if (p->split_dim == ASYMO_SPLIT_M && g->n > ASYMO_SKINNY_MAX)
            return ASYMO_EINVAL;
        if (p->split_dim == ASYMO_SPLIT_N && g->m > ASYMO_SKINNY_MAX)
            return ASYMO_EINVAL;
        if (p->split_dim == ASYMO_SPLIT_BATCH && g->m > ASYMO_SKINNY_MAX
            && g->n > ASYMO_SKINNY_MAX)
            return ASYMO_EINVAL;
    }
    return ASYMO_OK;
}

/* Fill the geometry of every cluster; returns the total number of tasks. */
/* The layout of pk packed for (isa, kc), or NULL. Two kc that both cover K give one block. */
static const char *packed_layout(const asymo_gemm_packed *pk, int isa, int64_t kc, int64_t k)
{
    if (!pk)
        return NULL;
    for (int l = 0; l < pk->nlayouts; l++)
        if (pk->isa[l] == isa && pk->data[l] && (pk->kc[l] == kc || (pk->kc[l] >= k && kc >= k)))
            return (const char *)pk->data[l];
    return NULL;
}

static int64_t geometry(job *J, const asymo_gemm_args *g, const asymo_gemm_plan *p)
{
    int64_t total = 0;
    J->nclusters = p->nclusters;
    for (int c = 0; c < p->nclusters; c++) {
        cluster_part *C = &J->cl[c];
        memset(C, 0, sizeof *C);
        C->r0 = 0;
        C->r1 = g->m;
        C->q0 = 0;
        C->q1 = g->n;
        if (p->split_dim == ASYMO_SPLIT_M || p->split_dim == ASYMO_SPLIT_BATCH) {
            C->r0 = p->start[c];
            C->r1 = p->stop[c];
        } else {
            C->q0 = p->start[c];
            C->q1 = p->stop[c];
        }
        C->mc = p->mc[c];
        C->nc = p->nc[c];
        C->kc = p->kc[c];
        C->task0 = total;
        if (p->split_dim == ASYMO_SPLIT_BATCH) {
            C->chunk = p->chunk[c];
            C->ntasks = cdiv(C->r1 - C->r0, C->chunk);
        } else if (g->m == 0 || g->n == 0 || g->k == 0) {
            C->ntasks = 0;
        } else if (p->kind == ASYMO_GEMM_MM) {
            C->ntm = cdiv(C->r1 - C->r0, C->mc);
            C->ntn = cdiv(C->q1 - C->q0, C->nc);
            C->npc = cdiv(g->k, C->kc);
            C->ntasks = C->ntm * C->ntn;
        } else {
            C->chunk = p->chunk[c];
            C->ntasks = p->split_dim == ASYMO_SPLIT_M ? cdiv(C->r1 - C->r0, C->chunk)
                                                      : cdiv(C->q1 - C->q0, C->chunk);
        }
        if (C->r1 <= C->r0 || C->q1 <= C->q0)
            C->ntasks = 0;
        total += C->ntasks;
    }
    return total;
}

int64_t asymo_gemm_task_counts(const asymo_gemm_args *g, const asymo_gemm_plan *p,
                               int64_t *counts)
{
    job J;
    int err = check(g, p);
    if (err)
        return err;
    int64_t total = geometry(&J, g, p);
    if (counts)
        for (int c = 0; c < p->nclusters; c++)
            counts[c] = J.cl[c].ntasks;
    return total;
}

/* Whether cluster c (> 0) of a product split along M reads the B panels of cluster 0 (the
 * fastest) instead of packing all of B itself (mm.c): both have the same single column block
 * and K panels, so every panel c needs is one cluster 0's tasks pack, and a pool runs them. */
static int reads_fastest_panels(const job *J, const asymo_pool *pool, const asymo_gemm_plan *p,
                                int c)
{
    const cluster_part *F = &J->cl[0], *C = &J->cl[c];
    return pool && c > 0 && p->split_dim == ASYMO_SPLIT_M && F->ntasks > 0 && !F->bpre
           && !F->direct_b && F->ntn == 1 && C->ntn == 1 && C->q0 == F->q0 && C->q1 == F->q1
           && C->nc == F->nc && C->kc == F->kc;
}

static int run_tasks(asymo_pool *pool, asymo_task_fn fn, job *J, int64_t total)
{
    int64_t counts[MAXC] = {0};
    if (total == 0)
        return ASYMO_OK;
    if (!pool) {
        for (int64_t t = 0; t < total; t++)
            fn(t, J);
        return ASYMO_OK;
    }
    for (int c = 0; c < J->nclusters; c++)
        counts[c] = J->cl[c].ntasks;
    return asymo_pool_run(pool, fn, J, total, counts, 0);
}

int asymo_gemm(struct asymo_pool *pool, const asymo_gemm_args *g,
               const asymo_gemm_plan *p)
{
    job J;
    int err = check(g, p);
    if (err)
        return err;
    if (pool && asymo_pool_nclusters(pool) < p->nclusters)
        return ASYMO_EINVAL;
    memset(&J, 0, sizeof J);
    J.kern = asymo_gemm_kernel_for(p->isa, g->dtype);
    J.ops = g->dtype == ASYMO_DTYPE_F32 ? &gemm_ops_f32 : &gemm_ops_f64;
    J.epilogue = gemm_epilogue_for(p->isa, g->dtype);
    J.es = g->dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    J.mr = J.kern->mr;
    J.nr = J.kern->nr;
    J.kind = p->kind;
    J.split_dim = p->split_dim;
    J.args = g;
    J.pool = pool;
    J.nslots = (pool ? asymo_pool_nworkers(pool) : 0) + 1;
    J.long_is_m = p->split_dim == ASYMO_SPLIT_M
                  || (p->split_dim == ASYMO_SPLIT_BATCH && g->n <= ASYMO_SKINNY_MAX
                      && (g->m > ASYMO_SKINNY_MAX || g->m >= g->n));
    if (g->m == 0 || g->n == 0)
        return ASYMO_OK;

    const int64_t total = geometry(&J, g, p);
    const int es = J.es, mr = J.mr, nr = J.nr;
    int any_direct = 0;
    J.mpad = cdiv(g->m, mr) * mr;
    J.npad = cdiv(g->n, nr) * nr;
    if (p->kind == ASYMO_GEMM_MM && p->split_dim != ASYMO_SPLIT_BATCH && g->k > 0) {
        for (int c = 0; c < p->nclusters; c++) {
            cluster_part *C = &J.cl[c];
            if (!C->ntasks)
                continue;
            if (C->r0 % mr == 0 && C->mc % mr == 0)
                C->apre = packed_layout(g->a_packed, p->isa, C->kc, g->k);
            if (C->q0 % nr == 0 && C->nc % nr == 0)
                C->bpre = packed_layout(g->b_packed, p->isa, C->kc, g->k);
            if ((!C->apre && !g->a) || (!C->bpre && !g->b && !g->pack_b))
                return ASYMO_EINVAL;
            C->direct_b = !C->bpre && !g->pack_b && g->b && g->csb == 1
                          && J.kern->ukr_strided_b && C->r1 - C->r0 <= DIRECT_B_MAX_ROWS;
            any_direct |= C->direct_b;
        }
    }


    /* ---- size the workspace ---- */
    int64_t max_mc = 1, max_nc = 1, max_kc = 1;
    for (int c = 0; c < p->nclusters; c++) {
        max_mc = J.cl[c].mc > max_mc ? J.cl[c].mc : max_mc;
        max_nc = J.cl[c].nc > max_nc ? J.cl[c].nc : max_nc;
        max_kc = J.cl[c].kc > max_kc ? J.cl[c].kc : max_kc;
    }
    const int batch_split = p->split_dim == ASYMO_SPLIT_BATCH;
    const int need_mm = p->kind == ASYMO_GEMM_MM && g->k > 0;
    const int64_t kcap = min64(max_kc, g->k > 0 ? g->k : 1);
    if (need_mm) {
        J.apack_bytes = round_up((size_t)(cdiv(min64(max_mc, g->m), mr) * mr * kcap) * es,
                                 ASYMO_ALIGN);
        J.tile_bytes = round_up((size_t)(mr * nr) * es, ASYMO_ALIGN);
        if (batch_split || (pool && p->nclusters > 1) || any_direct)
            J.bslot_bytes = round_up(
                (size_t)(cdiv(min64(max_nc, g->n), nr) * nr * kcap) * es, ASYMO_ALIGN);
    }
    if (p->kind == ASYMO_GEMM_MV && g->k > 0)
        J.vec_bytes = round_up((size_t)(ASYMO_SKINNY_MAX * g->k) * es, ASYMO_ALIGN);
    int64_t ntasks = total;
    if (p->kind == ASYMO_GEMM_MV && !batch_split && g->k > 1) {
        /* the layout decides the form; every item of a batch has the same strides */
        int copy;
        J.o = item_operands(g, 0);
        J.sv = skinny_orient(&J.o, J.long_is_m);
        if (skinny_pick(&J, &J.sv, &copy) == J.kern->skinny_axpy && J.sv.l > 1) {
            const int64_t L = J.sv.l, K = g->k;
            J.ksplit = 1;
            ntasks = 0;
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                const int64_t a = p->split_dim == ASYMO_SPLIT_M ? C->r0 : C->q0;
                const int64_t b = p->split_dim == ASYMO_SPLIT_M ? C->r1 : C->q1;
                C->k0 = a * K / L;
                C->k1 = c == p->nclusters - 1 ? K : b * K / L;
                C->kchunk = cdiv(p->chunk[c] * K, L);
                C->kchunk = C->kchunk < 128 ? 128 : C->kchunk;
                C->task0 = ntasks;
                C->ntasks = C->k1 > C->k0 ? cdiv(C->k1 - C->k0, C->kchunk) : 0;
                ntasks += C->ntasks;
            }
            J.ktasks = ntasks;
            J.partial_bytes = round_up((size_t)(J.sv.s * L) * es, ASYMO_ALIGN);
        }
    }

    size_t need = 0;
    carve cv = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        cv.used = 0;
        J.apack = carve_take(&cv, J.apack_bytes * J.nslots);
        J.tile = carve_take(&cv, J.tile_bytes * J.nslots);
        J.bslot = carve_take(&cv, J.bslot_bytes * J.nslots);
        J.vecbuf = carve_take(&cv, J.vec_bytes * (batch_split ? J.nslots : 1));
        J.partial = carve_take(&cv, J.partial_bytes * (size_t)J.ktasks);
        J.kdone = carve_take(&cv, sizeof(_Atomic int64_t));
        if (need_mm && !batch_split) {
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                if (!C->ntasks || C->bpre || C->direct_b)
                    continue;
                C->b_reader = reads_fastest_panels(&J, pool, p, c);
                if (C->b_reader) {
                    const cluster_part *F = &J.cl[0];
                    C->nsl = F->nsl;
                    C->panel_elems = F->panel_elems;
                    C->bpack = F->bpack;
                    C->ready = F->ready;
                    continue;
                }
                C->nsl = cdiv(min64(C->nc, C->q1 - C->q0), nr);
                C->panel_elems = C->nsl * nr * min64(C->kc, g->k);
                const int64_t npanels = C->ntn * C->npc;
                C->bpack = carve_take(&cv, (size_t)(npanels * C->panel_elems) * es);
                C->ready = carve_take(&cv, (size_t)(npanels * C->nsl));
            }
            /* A blocks are kept for reuse (mm.c) only when one thread runs the whole product
             * (a one-worker pool, or no pool): with two busy cores, each reusing the blocks
             * it packed, keeping them measured no faster than repacking (docs/matmul.md). */
            const int keep_a = !pool || asymo_pool_nworkers(pool) == 1;
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                C->akeep = NULL;
                if (!keep_a || !C->ntasks || C->apre || C->ntn < 2)
                    continue;
                C->nmp = cdiv(min64(C->mc, C->r1 - C->r0), mr);
                const int64_t nblocks = C->ntm * C->npc;
                C->akeep = carve_take(&cv, (size_t)(nblocks * C->nmp * mr
                                                    * min64(C->kc, g->k)) * es);
                C->aowner = carve_take(&cv, sizeof(_Atomic int) * nblocks);
            }
        }
        if (pass == 0) {
            cv.base = ws_acquire(cv.used > 0 ? cv.used : 1, &need);
            if (!cv.base)
                return ASYMO_ENOMEM;
        }
    }

    for (int64_t item = 0; item < (batch_split ? 1 : g->nbatch) && err == ASYMO_OK; item++) {
        J.item = item;
        J.o = item_operands(g, item);
        if (batch_split) {
            err = run_tasks(pool, batch_task, &J, total);
        } else if (g->k == 0) {
            J.ops->zero(J.o.c, J.o.rsc, J.o.csc, g->m, g->n);
        } else if (p->kind == ASYMO_GEMM_MM) {
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                if (!C->ntasks || C->bpre || C->direct_b || C->b_reader)
                    continue;
                const int64_t npanels = C->ntn * C->npc;
                memset((void *)C->ready, 0, (size_t)(npanels * C->nsl));
            }
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                if (!C->akeep)
                    continue;
                for (int64_t i = 0; i < C->ntm * C->npc; i++)
                    atomic_init(&C->aowner[i], 0);
            }
            err = run_tasks(pool, mm_task, &J, total);
        } else if (p->kind == ASYMO_GEMM_MV) {
            int copy;
            J.sv = skinny_orient(&J.o, J.long_is_m);
            J.skinny = skinny_pick(&J, &J.sv, &copy);
            J.vec_copied = copy;
            if (J.ksplit) {
                atomic_init(J.kdone, 0);
                err = run_tasks(pool, mv_ksplit_task, &J, ntasks);
            } else {
                if (copy)
                    copy_vectors(&J, &J.sv, J.vecbuf);
                err = run_tasks(pool, mv_task, &J, total);
            }
        } else {
            err = run_tasks(pool, outer_task, &J, total);
        }
    }
    ws_release(cv.base, need);
    return err;
}

int asymo_gemm_2d(struct asymo_pool *pool, const asymo_gemm_plan *plan, int dtype, int64_t m,
                  int64_t k, int64_t n, const void *a, int64_t rsa, int64_t csa,
                  const void *b, int64_t rsb, int64_t csb, void *c, int64_t rsc,
                  int64_t csc)
{
    asymo_gemm_args g;
    memset(&g, 0, sizeof g);
    g.dtype = dtype;
    g.m = m;
    g.k = k;
    g.n = n;
    g.a = a;
    g.rsa = rsa;
    g.csa = csa;
    g.b = b;
    g.rsb = rsb;
    g.csb = csb;
    g.c = c;
    g.rsc = rsc;
    g.csc = csc;
    g.nbatch = 1;
    return asymo_gemm(pool, &g, plan);
}

/* [lo, hi) bytes spanned by an r x q matrix with element strides rs, cs. */
static void extent(const void *x, int64_t r, int64_t q, int64_t rs, int64_t cs, int es,
                   uintptr_t *lo, uintptr_t *hi)
{
    int64_t first = 0, last = 0;
    if (rs < 0)
        first += (r - 1) * rs;
    else
        last += (r - 1) * rs;
    if (cs < 0)
        first += (q - 1) * cs;
    else
        last += (q - 1) * cs;
    *lo = (uintptr_t)x + (uintptr_t)(first * es);
    *hi = (uintptr_t)x + (uintptr_t)(last * es) + (uintptr_t)es;
}

int asymo_gemm_2d_checked(struct asymo_pool *pool, const asymo_gemm_plan *plan, int dtype,
                          int64_t m, int64_t k, int64_t n, const void *a, int64_t rsa,
                          int64_t csa, const void *b, int64_t rsb, int64_t csb, void *c,
                          int64_t rsc, int64_t csc)
{
    if (m > 0 && n > 0 && k > 0 && (dtype == ASYMO_DTYPE_F32 || dtype == ASYMO_DTYPE_F64)) {
        const int es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
        uintptr_t alo, ahi, blo, bhi, clo, chi;
        extent(a, m, k, rsa, csa, es, &alo, &ahi);
        extent(b, k, n, rsb, csb, es, &blo, &bhi);
        extent(c, m, n, rsc, csc, es, &clo, &chi);
        if ((clo < ahi && alo < chi) || (clo < bhi && blo < chi))
            return ASYMO_GEMM_OVERLAP;
    }
    return asymo_gemm_2d(pool, plan, dtype, m, k, n, a, rsa, csa, b, rsb, csb, c, rsc, csc);
}
/* ------------------------------------------------------------------------------------------
 * Pre-packed operands
 * ---------------------------------------------------------------------------------------- */
int64_t asymo_gemm_packed_bytes(int isa, int dtype, int side, int64_t dim, int64_t k)
{
    const asymo_gemm_kernel *kern;
    if ((dtype != ASYMO_DTYPE_F32 && dtype != ASYMO_DTYPE_F64) || dim < 0 || k < 0
        || (side != ASYMO_PACK_A && side != ASYMO_PACK_B))
        return ASYMO_EINVAL;
    kern = asymo_gemm_kernel_for(isa, dtype);
    if (!kern)
        return ASYMO_EINVAL;
    const int64_t unit = side == ASYMO_PACK_A ? kern->mr : kern->nr;
    const int64_t es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    if (dim > ((int64_t)1 << 40) / (k > 0 ? k : 1))
        return ASYMO_EINVAL;
    return cdiv(dim, unit) * unit * k * es;
}

int asymo_gemm_pack(int isa, int dtype, int side, int64_t dim, int64_t k, int64_t kc,
                    const void *x, int64_t rs, int64_t cs, void *dst)
{
    const int64_t bytes = asymo_gemm_packed_bytes(isa, dtype, side, dim, k);
    if (bytes < 0 || kc < 1 || (bytes > 0 && (!x || !dst)) || ((uintptr_t)dst % ASYMO_ALIGN))
        return ASYMO_EINVAL;
    const asymo_gemm_kernel *kern = asymo_gemm_kernel_for(isa, dtype);
    const dtype_ops *ops = dtype == ASYMO_DTYPE_F32 ? &gemm_ops_f32 : &gemm_ops_f64;
    const int es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    const int mr = kern->mr, nr = kern->nr;
    const int64_t unit = side == ASYMO_PACK_A ? mr : nr, pad = cdiv(dim, unit) * unit;
    for (int64_t p0 = 0; p0 < k; p0 += kc) {
        const int64_t kb = min64(kc, k - p0);
        char *block = (char *)dst + (size_t)(p0 * pad) * es;
        if (side == ASYMO_PACK_A) {
            ops->pack_a(block, x, rs, cs, 0, dim, p0, kb, mr, kern->pack_a_rows);
        } else {
            for (int64_t j = 0; j < pad; j += nr)
                ops->pack_b(block + (size_t)(j * kb) * es, x, rs, cs, j, min64(nr, dim - j), p0,
                            kb, nr);
        }
    }
    return ASYMO_OK;
}
