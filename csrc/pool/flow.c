/* asymo_flow_task: consecutive dependent jobs as one pool job (asymo/pool.h). */
#include <string.h>

#include "pool/pool_internal.h"

enum { FLOW_IDLE = 0, FLOW_DONE = 1, FLOW_RUNNING = 2 };

static void flow_run(const asymo_flow_job *f, int64_t id)
{
    /* the last layer whose first task is at or before id (lo ascends) */
    int64_t lo = 0, hi = f->nlayers - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (f->layers[mid].lo <= id)
            lo = mid;
        else
            hi = mid - 1;
    }
    const asymo_job_part *l = &f->layers[lo];
    l->fn(id - l->lo, l->ctx);
}

/* Flow task id done when this returns: run here if nobody had begun it (its dependencies
 * first: a task is marked running only once they are done, so a running task never waits),
 * else by whoever had, or again here once a slower cluster's worker has held it redo_ns (a
 * stopped core). Recursion follows dependencies into earlier layers only, so it is at most a
 * flow's layers deep. */
static void flow_ensure(const asymo_flow_job *f, int64_t id, int32_t cluster, int64_t redo_ns)
{
    _Atomic int32_t *s = (_Atomic int32_t *)&f->state[id];
    if (atomic_load_explicit(s, memory_order_acquire) == FLOW_DONE)
        return;
    for (int32_t k = f->dep_start[id]; k < f->dep_start[id + 1]; k++)
        flow_ensure(f, f->deps[k], cluster, redo_ns);
    int32_t expected = FLOW_IDLE;
    int again = 0;
    if (!atomic_compare_exchange_strong_explicit(s, &expected, FLOW_RUNNING + cluster,
                                                 memory_order_acq_rel,
                                                 memory_order_acquire)) {
        const int64_t t0 = now_ns();
        for (;;) {
            const int32_t v = atomic_load_explicit(s, memory_order_acquire);
            if (v == FLOW_DONE)
                return;
            if (v - FLOW_RUNNING > cluster && now_ns() - t0 >= redo_ns)
                break; /* a slower core holds it: run it again */
            cpu_relax();
        }
        again = 1;
    }
    flow_run(f, id);
    const int32_t before = atomic_exchange_explicit(s, FLOW_DONE, memory_order_acq_rel);
    if (f->counts && again)
        atomic_fetch_add_explicit((_Atomic int64_t *)&f->counts[0], 1, memory_order_relaxed);
    if (f->counts && before == FLOW_DONE)
        atomic_fetch_add_explicit((_Atomic int64_t *)&f->counts[1], 1, memory_order_relaxed);
}

void asymo_flow_task(int64_t task, void *ctx)
{
    const asymo_flow_job *f = (const asymo_flow_job *)ctx;
    const int cluster = asymo_pool_current_cluster();
    /* a pool whose backups are off (asymo_pool_set_backup) runs nothing twice */
    const asymo_pool *pool = asymo_pool_current();
    const int64_t redo_ns =
        pool && asymo_pool_get_backup_factor(pool) <= 0 ? INT64_MAX : f->redo_ns;
    flow_ensure(f, f->order[task], cluster < 0 ? 0 : cluster, redo_ns);
}

void asymo_flow_reset_task(int64_t task, void *ctx)
{
    (void)task;
    const asymo_flow_job *f = (const asymo_flow_job *)ctx;
    memset(f->state, 0, (size_t)f->ntasks * sizeof *f->state);
}
