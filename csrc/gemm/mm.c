/* MM: the packed five-loop product; one task = an mc x nc block of C over the whole K loop.
 *
 * Packing B without barriers, just in time. Every task of a cluster needs the kc x nc panels of
 * B for its column block. A panel is cut into nr-wide slivers, each with a state (free, being
 * packed, packed). A task reaching a sliver that is not packed yet claims it and packs it, or,
 * when another thread is packing it right now, spins until it is done. A claimed sliver is
 * always being packed by a running thread that never waits while packing, so no task ever
 * waits for work that needs the waiting thread (or any queued task): a stolen task cannot
 * deadlock, and no barrier exists. Each panel is packed exactly once per cluster, by the
 * cluster that computes with it; a task stolen by another cluster packs a private copy.
 *
 * Split along M over one column block (a 7 x 7 plane's layers), every cluster needs all of B,
 * and a slower cluster packing its own copy packs the whole of B at its speed for its share of
 * the rows. There the slower clusters read the fastest cluster's panels instead (b_reader,
 * dispatch.c decides): their threads wait for a sliver the fastest cluster is packing or has
 * yet to reach, and claim one only after it has stayed free for OWNER_WAIT_NS, so nobody ever
 * waits on a free sliver without bound and the argument above holds.
 *
 * While the kernel works on one sliver, the rows of B the next one will be packed from are
 * fetched into L2 (B in memory only): a 1x1 convolution's image is read once per sliver, one
 * cache line per row at the stride of a whole image row, and packing whole panels up front
 * left the packer waiting on memory with nothing to overlap it (docs/tuning.md). */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gemm/gemm_internal.h"
#include "pool/spin.h" /* now_ns, cpu_relax */

/* A sliver's state in cluster_part.ready */
enum { SLIVER_FREE, SLIVER_PACKING, SLIVER_PACKED };

/* How long a thread of a slower cluster waits for a free sliver of the fastest cluster's panel
 * before packing it itself: far longer than a sliver takes to pack and compute with, so it
 * packs only when the fastest cluster is not on the panel at all (preempted, or busy). */
#define OWNER_WAIT_NS 50000

/* Wait until a sliver is packed (returns 1), or until it has stayed free, nobody packing it,
 * for `free_ns` (returns 0: the caller claims it). A sliver being packed is being packed by a
 * running thread, so that wait ends; a claimed sliver is never free again (free_ns INT64_MAX). */
static int wait_packed(_Atomic unsigned char *state, int64_t free_ns)
{
    int64_t free_since = -1;
    for (unsigned spins = 1;; spins++) {
        const unsigned char s = atomic_load_explicit(state, memory_order_acquire);
        if (s == SLIVER_PACKED)
            return 1;
        if (s == SLIVER_PACKING) {
            free_since = -1;
        } else if (spins % 64 == 0) {
            const int64_t t = now_ns();
            if (free_since < 0)
                free_since = t;
            else if (t - free_since >= free_ns)
                return 0;
        }
        cpu_relax();
        if (spins % (1u << 14) == 0) /* the packer was preempted: let it run */
            sched_yield();
    }
}

/* One nr-wide sliver of B (columns [jj, jj + cols), rows [p0, p0 + kb)) into dst: from
 * memory, or from the caller's implicit-B packer. */
static inline void pack_b_sliver(const job *J, const operands *o, void *dst, int64_t jj,
                                 int64_t cols, int64_t p0, int64_t kb)
{
    if (o->pack_b)
        o->pack_b(o->pack_b_ctx, dst, jj, cols, p0, kb, J->nr);
    else
        J->ops->pack_b(dst, o->b, o->rsb, o->csb, jj, cols, p0, kb, J->nr);
}

/* Where sliver t of a panel of kb rows whose slivers start at `bpanel` lives. */
static inline char *sliver_at(const job *J, const char *bpanel, int64_t t, int64_t kb)
{
    return (char *)bpanel + (size_t)(t * kb * J->nr) * J->es;
}

/* Sliver t of a panel whose slivers start at `bpanel` (the panel's columns from j0 to j1). */
static inline void pack_panel_sliver(const job *J, const operands *o, const char *bpanel,
                                     int64_t t, int64_t j0, int64_t j1, int64_t p0, int64_t kb)
{
    const int64_t jj = j0 + t * J->nr;
    pack_b_sliver(J, o, sliver_at(J, bpanel, t, kb), jj, min64(J->nr, j1 - jj), p0, kb);
}

/* Sliver s of a shared panel (states `st`, slivers at `bpanel`, columns from j0 to j1), packed
 * once the call returns: by this thread if no other has claimed it. While another thread packs
 * it, this one packs the panel's later free slivers rather than spin: every task of a cluster
 * whose tasks share one column block (a 7 x 7 plane has one) reaches each sliver at once, and
 * the packing would otherwise run on one thread at a time. */
static void take_sliver(const job *J, const operands *o, _Atomic unsigned char *st,
                        const char *bpanel,
                        int64_t s, int64_t nsl, int64_t j0, int64_t j1, int64_t p0, int64_t kb)
{
    unsigned char expect = SLIVER_FREE;
    if (atomic_compare_exchange_strong_explicit(&st[s], &expect, SLIVER_PACKING,
                                                memory_order_acquire, memory_order_acquire)) {
        pack_panel_sliver(J, o, bpanel, s, j0, j1, p0, kb);
        atomic_store_explicit(&st[s], SLIVER_PACKED, memory_order_release);
        return;
    }
    if (expect == SLIVER_PACKED)
        return;
    for (int64_t t = s + 1;
         t < nsl && atomic_load_explicit(&st[s], memory_order_relaxed) != SLIVER_PACKED; t++) {
        unsigned char free_state = SLIVER_FREE;
        if (atomic_load_explicit(&st[t], memory_order_relaxed) != SLIVER_FREE
            || !atomic_compare_exchange_strong_explicit(&st[t], &free_state, SLIVER_PACKING,
                                                        memory_order_relaxed,
                                                        memory_order_relaxed))
            continue;
        pack_panel_sliver(J, o, bpanel, t, j0, j1, p0, kb);
        atomic_store_explicit(&st[t], SLIVER_PACKED, memory_order_release);
    }
    wait_packed(&st[s], INT64_MAX);
}

/* Rows [p, p + n) of B's columns [jj, jj + nr) into L2 (B in memory, unit column stride): both
 * ends of each row's piece, which straddles two lines when rows are not line multiples. */
static inline void prefetch_b_rows(const job *J, const operands *o, int64_t jj, int64_t p,
                                   int64_t n)
{
    const size_t row = (size_t)o->rsb * J->es, last = (size_t)J->nr * J->es - 1;
    const char *src = o->b + ((size_t)p * o->rsb + jj) * J->es;
    for (int64_t r = 0; r < n; r++, src += row) {
        __builtin_prefetch(src, 0, 2);
        __builtin_prefetch(src + last, 0, 2);
    }
}

/* Compute C[i0:i1, j0:j1] += / = Apack @ Bsliver... for one kc step; sliver s is packed at
 * bpanel + s * kb * nr (with `C`, the cluster's shared panel `panel`: packed by the first task
 * to reach the sliver), or, when `bdirect` is set (B read in place, rows p0.. of B), full
 * slivers are read there and only a partial one is packed (into bpanel, by this thread).
 * `last`: the last K step, after which the block gets the epilogue while it is in cache; `p0`:
 * its first row of B (for slivers packed here); `reader`: the panel is the fastest cluster's
 * and this thread is not of it (wait for its packers first). */
static void mm_macro(const job *J, const operands *o, const char *apack, char *tile,
                     int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t kb, int accumulate,
                     const cluster_part *C, int64_t panel, const char *bpanel, int last,
                     const char *bdirect, int64_t p0, int reader)
{
    const int epi = last && (o->bias || o->res || o->act);
    /* bias, residual and activation in each tile's store (B read in place: that path keeps
     * the pass over the block) */
    const int fuse = epi && J->kern->ukr_epi && !bdirect && o->csc == 1;
    const int mr = J->mr, nr = J->nr, es = J->es;
    const int64_t nsl = cdiv(j1 - j0, nr);
    const int64_t npan = cdiv(i1 - i0, mr);
    /* B rows the next sliver is packed from, fetched a share per micro-panel */
    const int fetch = C && !reader && !o->pack_b && o->csb == 1;
    const int64_t share = cdiv(kb, npan);
    for (int64_t s = 0; s < nsl; s++) {
        const int64_t jj = j0 + s * nr;
        const int64_t cols = min64(nr, j1 - jj);
        const char *bs = sliver_at(J, bpanel, s, kb);
        if (C) {
            _Atomic unsigned char *st = &C->ready[panel * C->nsl];
            if (atomic_load_explicit(&st[s], memory_order_acquire) != SLIVER_PACKED) {
                if (!reader || !wait_packed(&st[s], OWNER_WAIT_NS))
                    take_sliver(J, o, st, bpanel, s, nsl, j0, j1, p0, kb);
            }
        }
        const int fetch_next = fetch && s + 1 < nsl && jj + nr + nr <= j1
                               && atomic_load_explicit(&C->ready[panel * C->nsl + s + 1],
                                                       memory_order_relaxed) == SLIVER_FREE;
        int64_t fetched = 0;
        const int in_place = bdirect && cols == nr;
        if (in_place)
            bs = bdirect + jj * es;
        else if (bdirect)
            pack_panel_sliver(J, o, bpanel, s, j0, j1, p0, kb);
        const char *ap = apack;
        for (int64_t ii = i0; ii < i1; ii += mr) {
            const int64_t rows = min64(mr, i1 - ii);
            char *cp = o->c + (ii * o->rsc + jj * o->csc) * es;
            /* the tile's rows of the bias and residual (fused epilogue) */
            const char *tb = o->bias ? o->bias + ii * es : NULL;
            const char *tr = o->res ? o->res + (ii * o->rsr + jj) * es : NULL;
            if (in_place) {
                if (rows == mr && o->csc == 1) {
                    J->kern->ukr_strided_b(kb, ap, bs, o->rsb, cp, o->rsc, accumulate);
                } else {
                    J->kern->ukr_strided_b(kb, ap, bs, o->rsb, tile, nr, 0);
                    J->ops->merge(cp, o->rsc, o->csc, tile, nr, rows, cols, accumulate);
                }
            } else if (rows == mr && cols == nr && o->csc == 1) {
                if (fuse)
                    J->kern->ukr_epi(kb, ap, bs, cp, o->rsc, accumulate, tb, tr, o->rsr,
                                     o->act);
                else
                    J->kern->ukr(kb, ap, bs, cp, o->rsc, accumulate);
            } else {
                /* an edge: into the tile, then the valid part into C */
                if (cols <= J->kern->narrow_cols) {
                    J->kern->ukr_narrow(kb, ap, bs, cols, tile, nr);
                } else {
                    const asymo_ukr_fn edge = cols <= nr / 2 && J->kern->ukr_half
                                              ? J->kern->ukr_half : J->kern->ukr;
                    edge(kb, ap, bs, tile, nr, 0);
                }
                J->ops->merge(cp, o->rsc, o->csc, tile, nr, rows, cols, accumulate);
                if (fuse)
                    J->epilogue(cp, o->rsc, rows, cols, tb, tr, o->rsr, o->act);
            }
            ap += (size_t)(kb * mr) * es;
            if (fetch_next && fetched < kb) {
                const int64_t n = min64(share, kb - fetched);
                prefetch_b_rows(J, o, jj + nr, p0 + fetched, n);
                fetched += n;
            }
        }
    }
    if (epi && !fuse) /* the block is in L2: one pass with long rows (per tile measured slower) */
        J->epilogue(o->c + (i0 * o->rsc + j0) * es, o->rsc, i1 - i0, j1 - j0,
                    o->bias ? o->bias + i0 * es : NULL,
                    o->res ? o->res + (i0 * o->rsr + j0) * es : NULL, o->rsr, o->act);
}

/* The packed A block (tm, pc), kept for the cluster's other column blocks (dispatch.c decides
 * when): the first task to reach it packs it into the cluster's buffer and owns it; later
 * tasks of the same thread read it there instead of packing it again (a tall-K product with few
 * rows of A otherwise packs each A block once per column block). Another thread packs a
 * private copy rather than read a block written by another core, and a task never waits for a
 * block still being packed. Returns the block, or NULL: pack privately. */
static const char *kept_a_block(const job *J, const operands *o, const cluster_part *C,
                                int slot, int64_t tm, int64_t pc, int64_t i0, int64_t i1,
                                int64_t p0, int64_t kb)
{
    const int64_t blk = tm * C->npc + pc;
    char *ab = C->akeep + (size_t)(blk * C->nmp * J->mr * min64(C->kc, o->k)) * J->es;
    int owner = atomic_load_explicit(&C->aowner[blk], memory_order_relaxed);
    if (owner == slot + 1)
        return ab;
    if (owner || !atomic_compare_exchange_strong_explicit(&C->aowner[blk], &owner, slot + 1,
                                                         memory_order_relaxed,
                                                         memory_order_relaxed))
        return NULL;
    J->ops->pack_a(ab, o->a, o->rsa, o->csa, i0, i1, p0, kb, J->mr, J->kern->pack_a_rows);
    return ab;
}

void mm_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const operands *o = &J->o;
    const int64_t lt = t - C->task0;
    const int64_t tn = lt / C->ntm, tm = lt % C->ntm;
    const int64_t i0 = C->r0 + tm * C->mc, i1 = min64(i0 + C->mc, C->r1);
    const int64_t j0 = C->q0 + tn * C->nc, j1 = min64(j0 + C->nc, C->q1);
    const int64_t nsl = cdiv(j1 - j0, J->nr);
    const int slot = slot_of(J);
    char *apack = J->apack + J->apack_bytes * slot;
    char *tile = J->tile + J->tile_bytes * slot;
    const int es = J->es;
    /* A task stolen by a worker of another (faster) cluster packs its B panels into that
     * worker's own scratch: it never waits on the owning cluster's packers, one of which may
     * be descheduled mid-sliver, and it keeps its data in the thief's caches. The task of a
     * b_reader cluster reads the fastest cluster's panels: when a worker of the fastest
     * cluster steals it, they are that worker's own. */
    const int mine = (int)(C - J->cl), owner = C->b_reader ? 0 : mine;
    const int here = J->pool && asymo_pool_current() == J->pool ? asymo_pool_current_cluster()
                                                                : mine;
    const int stolen = J->bslot_bytes > 0 && here != mine && here != owner;
    const int reader = !stolen && here != owner;

    for (int64_t pc = 0; pc < C->npc; pc++) {
        const int64_t p0 = pc * C->kc, kb = min64(C->kc, o->k - p0);
        const int64_t panel = tn * C->npc + pc;
        const char *ap = NULL;
        if (C->apre)
            ap = C->apre + (size_t)(p0 * J->mpad + i0 * kb) * es;
        else if (C->akeep && !stolen)
            ap = kept_a_block(J, o, C, slot, tm, pc, i0, i1, p0, kb);
        if (!ap) {
            J->ops->pack_a(apack, o->a, o->rsa, o->csa, i0, i1, p0, kb, J->mr,
                           J->kern->pack_a_rows);
            ap = apack;
        }
        if (C->bpre) {
            mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, NULL, 0,
                     C->bpre + (size_t)(p0 * J->npad + j0 * kb) * es, pc == C->npc - 1,
                     NULL, 0, 0);
            continue;
        }
        if (C->direct_b) { /* few rows of A: the kernel reads B where it is */
            mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, NULL, 0,
                     J->bslot + J->bslot_bytes * slot, pc == C->npc - 1,
                     o->b + p0 * o->rsb * es, p0, 0);
            continue;
        }
        if (stolen) {
            char *own = J->bslot + J->bslot_bytes * slot;
            for (int64_t s = 0; s < nsl; s++)
                pack_panel_sliver(J, o, own, s, j0, j1, p0, kb);
            mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, NULL, 0, own,
                     pc == C->npc - 1, NULL, 0, 0);
            continue;
        }
        char *bpanel = C->bpack + (size_t)(panel * C->panel_elems) * es;
        mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, C, panel, bpanel,
                 pc == C->npc - 1, NULL, p0, reader);
    }
}

/* A whole product in the calling thread with its slot's scratch (SPLIT_BATCH tasks). */
void mm_serial(const job *J, const operands *o, const cluster_part *C, int slot)
{
    char *apack = J->apack + J->apack_bytes * slot;
    char *tile = J->tile + J->tile_bytes * slot;
    char *bpanel = J->bslot + J->bslot_bytes * slot;
    const int nr = J->nr;
    for (int64_t j0 = 0; j0 < o->n; j0 += C->nc) {
        const int64_t j1 = min64(j0 + C->nc, o->n);
        for (int64_t p0 = 0; p0 < o->k; p0 += C->kc) {
            const int64_t kb = min64(C->kc, o->k - p0);
            for (int64_t s = 0, nsl = cdiv(j1 - j0, nr); s < nsl; s++)
                pack_panel_sliver(J, o, bpanel, s, j0, j1, p0, kb);
            for (int64_t i0 = 0; i0 < o->m; i0 += C->mc) {
                const int64_t i1 = min64(i0 + C->mc, o->m);
                J->ops->pack_a(apack, o->a, o->rsa, o->csa, i0, i1, p0, kb, J->mr,
                               J->kern->pack_a_rows);
                mm_macro(J, o, apack, tile, i0, i1, j0, j1, kb, p0 > 0, NULL, 0, bpanel,
                         p0 + kb == o->k, NULL, 0, 0);
            }
        }
    }
}
