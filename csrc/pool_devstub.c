/* TEMPORARY development stand-in for the pool (branch pool owns the real csrc/pool.c): runs
 * every job serially in the calling thread. Deleted when the pool lands on main. */
#include <stdlib.h>
#include <string.h>

#include "pool.h"

struct asymo_pool {
    int nworkers, nclusters, policy, limit;
};

asymo_pool *asymo_pool_create(int nworkers, const int *cpus, const int *worker_cluster,
                              int nclusters, int policy, int *err)
{
    asymo_pool *p;
    (void)cpus;
    (void)worker_cluster;
    if (nworkers < 1 || nclusters < 1) {
        if (err)
            *err = ASYMO_EINVAL;
        return NULL;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        if (err)
            *err = ASYMO_ENOMEM;
        return NULL;
    }
    p->nworkers = nworkers;
    p->nclusters = nclusters;
    p->policy = policy;
    p->limit = nworkers;
    if (err)
        *err = ASYMO_OK;
    return p;
}

void asymo_pool_destroy(asymo_pool *pool) { free(pool); }
int asymo_pool_nworkers(const asymo_pool *pool) { return pool->nworkers; }
int asymo_pool_nclusters(const asymo_pool *pool) { return pool->nclusters; }
int asymo_pool_policy(const asymo_pool *pool) { return pool->policy; }
int asymo_pool_set_limit(asymo_pool *pool, int max_workers)
{
    pool->limit = max_workers;
    return ASYMO_OK;
}
int asymo_pool_get_limit(const asymo_pool *pool) { return pool->limit; }

int asymo_pool_run(asymo_pool *pool, asymo_task_fn fn, void *ctx, int64_t ntasks,
                   const int64_t *cluster_counts)
{
    (void)pool;
    (void)cluster_counts;
    for (int64_t t = 0; t < ntasks; t++)
        fn(t, ctx);
    return ASYMO_OK;
}

int asymo_pool_current_worker(void) { return -1; }
int asymo_pool_current_cluster(void) { return -1; }

int asymo_pool_stats(const asymo_pool *pool, asymo_worker_stats *out, int n)
{
    (void)pool;
    memset(out, 0, sizeof *out * (size_t)n);
    return ASYMO_OK;
}
void asymo_pool_reset_stats(asymo_pool *pool) { (void)pool; }

int asymo_pool_run_flags(asymo_pool *pool, asymo_task_fn fn, void *ctx, int64_t ntasks,
                         const int64_t *cluster_counts, unsigned flags)
{
    (void)flags;
    return asymo_pool_run(pool, fn, ctx, ntasks, cluster_counts);
}
int asymo_pool_set_spin_us(asymo_pool *pool, int spin_us)
{
    (void)pool;
    (void)spin_us;
    return ASYMO_OK;
}
int asymo_pool_get_spin_us(const asymo_pool *pool) { (void)pool; return 0; }
const asymo_pool *asymo_pool_current(void) { return NULL; }
void asymo_task_noop(int64_t task, void *ctx) { (void)task; (void)ctx; }
void asymo_task_count(int64_t task, void *ctx) { ((int32_t *)ctx)[task]++; }
void asymo_task_spin(int64_t task, void *ctx) { (void)task; (void)ctx; }
