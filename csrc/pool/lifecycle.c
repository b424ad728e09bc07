/* The pool's lifecycle: create and destroy, starting and stopping the worker threads, the
 * settings (limit, spin time, caller help) and the statistics. */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* worker threads */

static void stop_threads(asymo_pool *p)
{
    atomic_store(&p->stop, 1);
    wake_workers(p);
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].thread_started) {
            pthread_join(p->workers[i].thread, NULL);
            p->workers[i].thread_started = 0;
        }
    }
}

/* life_lock held. */
static int spawn_threads(asymo_pool *p)
{
    sigset_t all, old;
    sigfillset(&all);
    /* workers never take signals: they belong to the application's threads */
    pthread_sigmask(SIG_BLOCK, &all, &old);
    atomic_store(&p->stop, 0);
    p->nstarted = 0;
    int rc = 0, launched = 0;
    for (int i = 0; i < p->nworkers; i++) {
        worker_t *w = &p->workers[i];
        w->chunk_seq = 0;
        w->chunk = 1;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            rc = ASYMO_ETHREAD;
            break;
        }
        w->thread_started = 1;
        launched++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_lock(&p->start_lock);
    while (p->nstarted < launched)
        pthread_cond_wait(&p->start_cond, &p->start_lock);
    pthread_mutex_unlock(&p->start_lock);
    if (rc != 0) {
        stop_threads(p);
        return rc;
    }
    atomic_store(&p->threads_alive, 1);
    return ASYMO_OK;
}

int ensure_threads(asymo_pool *p)
{
    if (atomic_load_explicit(&p->threads_alive, memory_order_acquire))
        return ASYMO_OK;
    pthread_mutex_lock(&p->life_lock);
    int rc = ASYMO_OK;
    if (!atomic_load(&p->threads_alive))
        rc = spawn_threads(p);
    pthread_mutex_unlock(&p->life_lock);
    return rc;
}

void zero_counters(worker_t *w)
{
    w->tasks_run = w->tasks_stolen = w->busy_ns = w->steals = w->tasks_inline = w->sleeps = 0;
    w->tasks_caller = w->tasks_backup = w->tasks_superseded = 0;
    memset(w->stolen_from, 0, sizeof w->stolen_from);
    memset(&w->base, 0, sizeof w->base);
}

/* ------------------------------------------------------------------------------------------ */
/* create, destroy, settings */

asymo_pool *asymo_pool_create(int nworkers, const int *cpus, const int *worker_cluster,
                              int nclusters, int policy, int queue, int *err)
{
    int e = ASYMO_EINVAL;
    asymo_pool *p = NULL;
    if (queue == ASYMO_QUEUE_DEFAULT)
        queue = DEFAULT_QUEUE;
    if (nworkers < 1 || nworkers > MAX_WORKERS || !cpus || !worker_cluster || nclusters < 1 ||
        nclusters > MAX_CLUSTERS || policy < ASYMO_POLICY_ASYMO || policy > ASYMO_POLICY_STEAL ||
        (queue != ASYMO_QUEUE_MUTEX && queue != ASYMO_QUEUE_CHASELEV))
        goto fail;
    int per_cluster[MAX_CLUSTERS] = {0};
    for (int i = 0; i < nworkers; i++) {
        if (worker_cluster[i] < 0 || worker_cluster[i] >= nclusters)
            goto fail;
        per_cluster[worker_cluster[i]]++;
    }
    for (int c = 0; c < nclusters; c++)
        if (per_cluster[c] == 0) /* every cluster needs a worker to own its tasks */
            goto fail;

    e = ASYMO_ENOMEM;
    p = calloc(1, sizeof *p);
    if (!p)
        goto fail;
    p->nworkers = nworkers;
    p->nclusters = nclusters;
    p->policy = policy;
    p->queue = queue;
    atomic_store(&p->limit, nworkers);
    atomic_store(&p->spin_us, DEFAULT_SPIN_US);
    atomic_store(&p->submit_spin_us, (int)(ASYMO_POOL_SUBMIT_SPIN_NS / 1000));
    atomic_store(&p->caller_helps, 1);
    atomic_store(&p->caller_to_fastest, 1);
    atomic_store(&p->backup_factor, ASYMO_POOL_BACKUP_FACTOR);
    atomic_store(&p->backup_min_ns, ASYMO_POOL_BACKUP_MIN_NS);
    mutex_init_adaptive(&p->shared_lock);
    pthread_mutex_init(&p->life_lock, NULL);
    pthread_mutex_init(&p->start_lock, NULL);
    pthread_cond_init(&p->start_cond, NULL);
    pthread_mutex_init(&p->stats_lock, NULL);
    if (posix_memalign((void **)&p->workers, CACHELINE, sizeof(worker_t) * nworkers) != 0) {
        p->workers = NULL;
        goto fail_free;
    }
    memset(p->workers, 0, sizeof(worker_t) * nworkers);
    for (int c = 0; c < nclusters; c++) {
        p->cluster_workers[c] = malloc(sizeof(int) * per_cluster[c]);
        if (!p->cluster_workers[c])
            goto fail_free;
    }
    p->ncpu_map = 1;
    for (int i = 0; i < nworkers; i++)
        if (cpus[i] >= 0 && cpus[i] < CPU_SETSIZE && cpus[i] + 1 > p->ncpu_map)
            p->ncpu_map = cpus[i] + 1;
    p->cpu_worker = malloc(sizeof(int) * p->ncpu_map);
    if (!p->cpu_worker)
        goto fail_free;
    for (int c = 0; c < p->ncpu_map; c++)
        p->cpu_worker[c] = -1;
    for (int i = 0; i < nworkers; i++)
        if (cpus[i] >= 0 && cpus[i] < CPU_SETSIZE)
            p->cpu_worker[cpus[i]] = i;
    int queues_ok = 0;
    for (int i = 0; i < nworkers; i++) {
        worker_t *w = &p->workers[i];
        w->pool = p;
        w->index = i;
        w->cpu = cpus[i];
        w->cluster = worker_cluster[i];
        w->chunk = 1;
        if (w->cluster == 0 && w->cpu >= 0 && w->cpu < CPU_SETSIZE)
            CPU_SET(w->cpu, &p->fastest_cpus);
        p->cluster_workers[w->cluster][p->cluster_nw[w->cluster]++] = i;
        if (rq_init(&w->q) != 0)
            break;
        if (cl_init(&w->d) != 0) {
            rq_free(&w->q);
            break;
        }
        queues_ok++;
    }
    if (queues_ok < nworkers) {
        for (int i = 0; i < queues_ok; i++) {
            rq_free(&p->workers[i].q);
            cl_free(&p->workers[i].d);
        }
        goto fail_free;
    }
    registry_add(p);
    pthread_mutex_lock(&p->life_lock);
    e = spawn_threads(p);
    pthread_mutex_unlock(&p->life_lock);
    if (e != ASYMO_OK) {
        registry_remove(p);
        for (int i = 0; i < nworkers; i++) {
            rq_free(&p->workers[i].q);
            cl_free(&p->workers[i].d);
        }
        goto fail_free;
    }
    if (err)
        *err = ASYMO_OK;
    return p;

fail_free:
    for (int c = 0; c < MAX_CLUSTERS; c++)
        free(p->cluster_workers[c]);
    free(p->cpu_worker);
    free(p->workers);
    free(p);
fail:
    if (err)
        *err = e;
    return NULL;
}

void asymo_pool_destroy(asymo_pool *pool)
{
    if (!pool)
        return;
    if (pool_tls_pool == pool) {
        fprintf(stderr, "asymo: asymo_pool_destroy called from one of the pool's own tasks; "
                        "ignored (the pool is leaked)\n");
        return;
    }
    registry_remove(pool);
    pthread_mutex_lock(&pool->life_lock);
    if (atomic_load(&pool->threads_alive))
        stop_threads(pool);
    atomic_store(&pool->threads_alive, 0);
    pthread_mutex_unlock(&pool->life_lock);
    for (int i = 0; i < pool->nworkers; i++) {
        rq_free(&pool->workers[i].q);
        cl_free(&pool->workers[i].d);
    }
    for (int c = 0; c < MAX_CLUSTERS; c++)
        free(pool->cluster_workers[c]);
    free(pool->cpu_worker);
    pthread_mutex_destroy(&pool->shared_lock);
    pthread_mutex_destroy(&pool->life_lock);
    pthread_mutex_destroy(&pool->start_lock);
    pthread_cond_destroy(&pool->start_cond);
    pthread_mutex_destroy(&pool->stats_lock);
    free(pool->workers);
    free(pool);
}

int asymo_pool_nworkers(const asymo_pool *pool) { return pool ? pool->nworkers : ASYMO_EINVAL; }
int asymo_pool_nclusters(const asymo_pool *pool) { return pool ? pool->nclusters : ASYMO_EINVAL; }
int asymo_pool_policy(const asymo_pool *pool) { return pool ? pool->policy : ASYMO_EINVAL; }
int asymo_pool_queue(const asymo_pool *pool) { return pool ? pool->queue : ASYMO_EINVAL; }

int asymo_pool_set_limit(asymo_pool *pool, int max_workers)
{
    if (!pool || max_workers < 1)
        return ASYMO_EINVAL;
    if (max_workers > pool->nworkers)
        max_workers = pool->nworkers;
    atomic_store(&pool->limit, max_workers);
    return max_workers;
}

int asymo_pool_get_limit(const asymo_pool *pool)
{
    return pool ? atomic_load(&((asymo_pool *)pool)->limit) : ASYMO_EINVAL;
}

int asymo_pool_set_spin_us(asymo_pool *pool, int spin_us)
{
    if (!pool || spin_us < 0 || spin_us > 1000000)
        return ASYMO_EINVAL;
    atomic_store(&pool->spin_us, spin_us);
    return ASYMO_OK;
}

int asymo_pool_get_spin_us(const asymo_pool *pool)
{
    return pool ? atomic_load(&((asymo_pool *)pool)->spin_us) : ASYMO_EINVAL;
}

int asymo_pool_set_submit_spin_us(asymo_pool *pool, int spin_us)
{
    if (!pool || spin_us < 0 || spin_us > 1000000)
        return ASYMO_EINVAL;
    atomic_store(&pool->submit_spin_us, spin_us);
    return ASYMO_OK;
}

int asymo_pool_get_submit_spin_us(const asymo_pool *pool)
{
    return pool ? atomic_load(&((asymo_pool *)pool)->submit_spin_us) : ASYMO_EINVAL;
}

int asymo_pool_set_caller_helps(asymo_pool *pool, int on)
{
    if (!pool || (on != 0 && on != 1))
        return ASYMO_EINVAL;
    atomic_store(&pool->caller_helps, on);
    return ASYMO_OK;
}

int asymo_pool_get_caller_helps(const asymo_pool *pool)
{
    return pool ? atomic_load(&((asymo_pool *)pool)->caller_helps) : ASYMO_EINVAL;
}

int asymo_pool_set_caller_to_fastest(asymo_pool *pool, int on)
{
    if (!pool || (on != 0 && on != 1))
        return ASYMO_EINVAL;
    atomic_store(&pool->caller_to_fastest, on);
    return ASYMO_OK;
}

int asymo_pool_get_caller_to_fastest(const asymo_pool *pool)
{
    return pool ? atomic_load(&((asymo_pool *)pool)->caller_to_fastest) : ASYMO_EINVAL;
}

int asymo_pool_set_backup(asymo_pool *pool, int factor, int64_t min_ns)
{
    if (!pool || factor < 0 || factor > 1000 || min_ns < 0)
        return ASYMO_EINVAL;
    atomic_store(&pool->backup_factor, factor);
    atomic_store(&pool->backup_min_ns, min_ns);
    return ASYMO_OK;
}

int asymo_pool_get_backup_factor(const asymo_pool *pool)
{
    return pool ? (int)atomic_load(&((asymo_pool *)pool)->backup_factor) : ASYMO_EINVAL;
}

int64_t asymo_pool_get_backup_min_ns(const asymo_pool *pool)
{
    return pool ? atomic_load(&((asymo_pool *)pool)->backup_min_ns) : ASYMO_EINVAL;
}

int asymo_pool_stats(const asymo_pool *pool, asymo_worker_stats *out, int n)
{
    if (!pool || !out || n < 0)
        return ASYMO_EINVAL;
    asymo_pool *p = (asymo_pool *)pool;
    if (n > p->nworkers)
        n = p->nworkers;
    pthread_mutex_lock(&p->stats_lock);
    for (int i = 0; i < n; i++) {
        worker_t *w = &p->workers[i];
        asymo_worker_stats *s = &out[i];
        memset(s, 0, sizeof *s);
        s->cpu = w->cpu;
        s->cluster = w->cluster;
        s->pinned = atomic_load(&w->pinned);
        s->tasks_run = counter_get(&w->tasks_run) - w->base.tasks_run;
        s->tasks_stolen = counter_get(&w->tasks_stolen) - w->base.tasks_stolen;
        for (int c = 0; c < MAX_CLUSTERS; c++)
            s->stolen_from_cluster[c] =
                counter_get(&w->stolen_from[c]) - w->base.stolen_from_cluster[c];
        s->busy_ns = counter_get(&w->busy_ns) - w->base.busy_ns;
        s->steals = counter_get(&w->steals) - w->base.steals;
        s->tasks_inline = counter_get(&w->tasks_inline) - w->base.tasks_inline;
        s->sleeps = counter_get(&w->sleeps) - w->base.sleeps;
        s->tasks_caller = counter_get(&w->tasks_caller) - w->base.tasks_caller;
        s->tasks_backup = counter_get(&w->tasks_backup) - w->base.tasks_backup;
        s->tasks_superseded = counter_get(&w->tasks_superseded) - w->base.tasks_superseded;
    }
    pthread_mutex_unlock(&p->stats_lock);
    return n;
}

void asymo_pool_reset_stats(asymo_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->stats_lock);
    for (int i = 0; i < pool->nworkers; i++) {
        worker_t *w = &pool->workers[i];
        w->base.tasks_run = counter_get(&w->tasks_run);
        w->base.tasks_stolen = counter_get(&w->tasks_stolen);
        for (int c = 0; c < MAX_CLUSTERS; c++)
            w->base.stolen_from_cluster[c] = counter_get(&w->stolen_from[c]);
        w->base.busy_ns = counter_get(&w->busy_ns);
        w->base.steals = counter_get(&w->steals);
        w->base.tasks_inline = counter_get(&w->tasks_inline);
        w->base.sleeps = counter_get(&w->sleeps);
        w->base.tasks_caller = counter_get(&w->tasks_caller);
        w->base.tasks_backup = counter_get(&w->tasks_backup);
        w->base.tasks_superseded = counter_get(&w->tasks_superseded);
    }
    pthread_mutex_unlock(&pool->stats_lock);
}
