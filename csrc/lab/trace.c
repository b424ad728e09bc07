/* Task tracing: every job of the traced pool runs serially, timed task by task (see
 * trace.h). It takes the pool's jobs through the run loop's intercept point and acts as one
 * of the pool's workers, so it is built with the pool's internals. */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include "lab/trace.h"

static int trace_run(asymo_pool *p, asymo_task_fn fn, void *ctx, int64_t ntasks,
                     const int64_t *counts);

static struct {
    int worker;
    asymo_trace_job *jobs;
    int64_t max_jobs, njobs;
    int64_t *task_ns;
    int64_t max_tasks, ntasks;
    int64_t t0;
    int overflow;
} trace;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;

int asymo_pool_trace_start(asymo_pool *pool, int as_cluster, asymo_trace_job *jobs,
                           int64_t max_jobs, int64_t *task_ns, int64_t max_tasks)
{
    if (!pool || !jobs || !task_ns || max_jobs < 0 || max_tasks < 0 || as_cluster < 0 ||
        as_cluster >= pool->nclusters)
        return ASYMO_EINVAL;
    int w = -1;
    for (int i = 0; i < pool->nworkers && w < 0; i++)
        if (pool->workers[i].cluster == as_cluster && worker_active(pool, &pool->workers[i]))
            w = i;
    if (w < 0)
        return ASYMO_EINVAL;
    pthread_mutex_lock(&trace_lock);
    if (atomic_load(&pool_intercepted)) {
        pthread_mutex_unlock(&trace_lock);
        return ASYMO_EBUSY;
    }
    trace.worker = w;
    trace.jobs = jobs;
    trace.max_jobs = max_jobs;
    trace.njobs = 0;
    trace.task_ns = task_ns;
    trace.max_tasks = max_tasks;
    trace.ntasks = 0;
    trace.overflow = 0;
    trace.t0 = now_ns();
    atomic_store_explicit(&pool_intercept_run, trace_run, memory_order_relaxed);
    atomic_store_explicit(&pool_intercepted, pool, memory_order_release);
    pthread_mutex_unlock(&trace_lock);
    return ASYMO_OK;
}

int64_t asymo_pool_trace_stop(asymo_pool *pool, int64_t *ntasks)
{
    pthread_mutex_lock(&trace_lock);
    if (!pool || atomic_load(&pool_intercepted) != pool) {
        pthread_mutex_unlock(&trace_lock);
        return ASYMO_EINVAL;
    }
    atomic_store_explicit(&pool_intercepted, NULL, memory_order_release);
    int64_t n = trace.overflow ? ASYMO_EOVERFLOW : trace.njobs;
    if (ntasks)
        *ntasks = trace.ntasks;
    pthread_mutex_unlock(&trace_lock);
    return n;
}

static int trace_run(asymo_pool *p, asymo_task_fn fn, void *ctx, int64_t ntasks,
                     const int64_t *counts)
{
    pthread_mutex_lock(&trace_lock); /* one traced job at a time, whoever submits it */
    worker_t *w = &p->workers[trace.worker];
    while (!claim_worker(w)) /* the worker's own thread is looking for (absent) work */
        sched_yield();
    asymo_trace_job *rec = trace.njobs < trace.max_jobs ? &trace.jobs[trace.njobs] : NULL;
    int64_t *times = trace.ntasks + ntasks <= trace.max_tasks ? trace.task_ns + trace.ntasks
                                                               : NULL;
    if (!rec || !times)
        trace.overflow = 1;
    if (rec) {
        rec->ntasks = ntasks;
        for (int c = 0; c < MAX_CLUSTERS && c < 8; c++)
            rec->counts[c] = counts ? (c < p->nclusters ? counts[c] : 0) : -1;
        rec->first = trace.ntasks;
        rec->fn = (uint64_t)(uintptr_t)fn;
        rec->submit_ns = now_ns() - trace.t0;
    }
    pool_tls_pool = p;
    pool_tls_worker = w->index;
    int64_t t = now_ns();
    for (int64_t i = 0; i < ntasks; i++) {
        fn(i, ctx);
        const int64_t u = now_ns();
        if (times)
            times[i] = u - t;
        t = u;
    }
    pool_tls_worker = -1;
    pool_tls_pool = NULL;
    release_worker(w);
    if (rec) {
        rec->done_ns = t - trace.t0;
        trace.njobs++;
    }
    if (times)
        trace.ntasks += ntasks;
    pthread_mutex_unlock(&trace_lock);
    return ASYMO_OK;
}
