/* The pool's run loop: submitting a job and waiting for it, the submitter's help while it
 * waits, and the loop of a worker thread.
 *
 * Several jobs may be in flight at once (several submitting threads); each submitter sleeps on
 * its own job's futex. Idle workers spin for spin_us then sleep on the pool's wake futex, so an
 * idle pool costs no CPU. A job submitted from a worker runs inline on that worker.
 *
 * The submitter helps while it waits (like pthreadpool's caller, which is thread 0): it runs
 * as the worker pinned to the core it is on, taking work exactly as that worker would (its
 * queue, then stealing by the policy's rules), so a job does not wait for a context switch
 * to the worker that shares the submitter's core. "Runs as" means the worker's identity:
 * asymo_pool_current_worker()/_cluster() report it, its counters and chunk state are used,
 * and a per-worker claim flag makes sure only one thread at a time -- the worker's own thread
 * or one submitter -- acts as a given worker, so per-worker scratch buffers stay private.
 * Policies are unchanged: a task still runs under the identity of a worker the policy allows
 * to run it. A submitter on a core without a pinned worker of this pool does not help.
 */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include <sched.h>

__thread asymo_pool *pool_tls_pool = NULL;
__thread int pool_tls_worker = -1;
__thread int pool_tls_helping = 0;

_Atomic(asymo_pool *) pool_intercepted;
_Atomic(pool_intercept_fn) pool_intercept_run;

/* ------------------------------------------------------------------------------------------ */
/* running tasks */

/* Adapt w's chunk to the length of the range it ran in dt ns. */
void adapt_chunk(worker_t *w, const range_t *r, int64_t dt)
{
    if (w->chunk_seq != r->seq)
        return;
    if (dt < CHUNK_TARGET_NS) {
        if (w->chunk < CHUNK_MAX)
            w->chunk *= 2;
    } else if (dt > 4 * CHUNK_TARGET_NS && w->chunk > 1) {
        w->chunk /= 2;
    }
}

/* w ran k tasks of range r in dt ns (its counters; r->origin says whether they were stolen). */
void count_tasks(worker_t *w, const range_t *r, int64_t k, int64_t dt)
{
    counter_add(&w->busy_ns, dt);
    counter_add(&w->tasks_run, k);
    if (pool_tls_helping)
        counter_add(&w->tasks_caller, k);
    if (r->origin >= 0) {
        counter_add(&w->tasks_stolen, k);
        counter_add(&w->stolen_from[r->origin], k);
    }
}

void run_range(worker_t *w, const range_t *r)
{
    if (r->flags & ASYMO_RUN_BACKUP) {
        run_range_backup(w, r);
        return;
    }
    job_t *j = r->job;
    asymo_task_fn fn = j->fn;
    void *ctx = j->ctx;
    int64_t k = r->hi - r->lo;
    atomic_store_explicit(&w->running, 1, memory_order_relaxed);
    int64_t t0 = now_ns();
    for (int64_t t = r->lo; t < r->hi; t++)
        fn(t, ctx);
    int64_t dt = now_ns() - t0;
    atomic_store_explicit(&w->running, 0, memory_order_relaxed);
    count_tasks(w, r, k, dt);
    adapt_chunk(w, r, dt);
    job_finish_tasks(j, k);
}

static int find_and_run(asymo_pool *p, worker_t *w)
{
    range_t r;
    if (wq_pop_own(w, &r)) {
        run_range(w, &r);
        return 1;
    }
    if (__atomic_load_n(&p->shared_head, __ATOMIC_ACQUIRE) && worker_active(p, w) &&
        policy_run_shared(p, w))
        return 1;
    if (policy_try_steal(p, w))
        return 1;
    return 0;
}

/* The worker thread: find and run work unless a submitter is acting as this worker. Then
 * the submitter is on this core running tasks, and the worker thread only takes cycles from
 * it: it hands the core over (sched_yield) instead of spinning. */
static int find_and_run_claimed(asymo_pool *p, worker_t *w)
{
    if (!claim_worker(w)) {
        sched_yield();
        return 0;
    }
    int r = find_and_run(p, w);
    release_worker(w);
    return r;
}

/* Submitter: take on the identity of `w` (the worker pinned to the core the submitter is on),
 * which it has claimed, and give it back. */
static void enter_as(asymo_pool *p, worker_t *w)
{
    pool_tls_pool = p;
    pool_tls_worker = w->index;
    pool_tls_helping = 1;
}

static void leave_as(asymo_pool *p, worker_t *w)
{
    pool_tls_helping = 0;
    pool_tls_worker = -1;
    pool_tls_pool = NULL;
    release_worker(w);
    /* A range the submitter stole as w (or another submitter queued for w) now waits in w's
     * queue, and w's own thread may have gone to sleep while the submitter held its identity.
     * If the submitter is then moved to another core it never comes back for that range:
     * wake the owner (the same ordering as submit: queue, then wake_seq, then sleepers). */
    if (wq_pending(w) > 0)
        wake_workers(p);
}

/* Submitter of j: run one piece of work as `w` (queued work, else, for an ASYMO_RUN_BACKUP
 * job, a backup of a late task of j). Returns 1 if it ran something. */
static int help_as(asymo_pool *p, worker_t *w, job_t *j)
{
    if (!atomic_load_explicit(&p->caller_helps, memory_order_relaxed) || !worker_active(p, w) ||
        !claim_worker(w))
        return 0;
    enter_as(p, w);
    int r = find_and_run(p, w);
    if (!r && (j->flags & ASYMO_RUN_BACKUP))
        r = backup_late_tasks(p, w, j);
    leave_as(p, w);
    return r;
}

/* Work this worker must not sleep on: its own queue or a shared job. Steal candidates are
 * only looked for while spinning. */
static int must_stay_awake(asymo_pool *p, worker_t *w)
{
    return wq_pending(w) > 0 ||
           (__atomic_load_n(&p->shared_head, __ATOMIC_ACQUIRE) != NULL && worker_active(p, w)) ||
           atomic_load(&p->stop);
}

static void worker_loop(asymo_pool *p, worker_t *w)
{
    for (;;) {
        if (find_and_run_claimed(p, w))
            continue;
        if (atomic_load(&p->stop))
            return;
        int found = 0;
        int64_t deadline = now_ns() + (int64_t)atomic_load(&p->spin_us) * 1000;
        unsigned spins = 0;
        do {
            for (int i = 0; i < 16; i++)
                cpu_relax();
            /* Spin politely: a submitting thread (which brings the next job) or another
             * process may be waiting for this core. A yield costs a syscall, so not every
             * round: a runnable thread waits a couple of microseconds at most. */
            if (++spins % YIELD_EVERY == 0)
                sched_yield();
            if (find_and_run_claimed(p, w)) {
                found = 1;
                break;
            }
            if (atomic_load(&p->stop))
                return;
        } while (now_ns() < deadline);
        if (found)
            continue;
        /* Sleep. Ordering with submit(): the submitter queues work, bumps wake_seq, then wakes
         * if sleepers > 0; we count ourselves, read wake_seq, then re-check for work. */
        atomic_fetch_add(&p->sleepers, 1);
        uint32_t seq = atomic_load(&p->wake_seq);
        if (!must_stay_awake(p, w)) {
            counter_add(&w->sleeps, 1);
            futex_wait(&p->wake_seq, seq);
        }
        atomic_fetch_sub(&p->sleepers, 1);
    }
}

static int pin_self(int cpu)
{
    if (cpu < 0 || cpu >= CPU_SETSIZE)
        return -1;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0 ? 0 : -1;
}

void *worker_main(void *arg)
{
    worker_t *w = arg;
    asymo_pool *p = w->pool;
    int pinned = w->cpu >= 0 && pin_self(w->cpu) == 0;
    atomic_store(&w->pinned, pinned);
    pool_tls_pool = p;
    pool_tls_worker = w->index;
    pthread_mutex_lock(&p->start_lock);
    p->nstarted++;
    pthread_cond_broadcast(&p->start_cond);
    pthread_mutex_unlock(&p->start_lock);
    worker_loop(p, w);
    return NULL;
}

void wake_workers(asymo_pool *p)
{
    atomic_fetch_add(&p->wake_seq, 1);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake(&p->wake_seq, INT_MAX);
}

/* The worker pinned to the core the calling thread runs on, if any. */
static worker_t *worker_on_my_core(asymo_pool *p)
{
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= p->ncpu_map || p->cpu_worker[cpu] < 0)
        return NULL;
    worker_t *w = &p->workers[p->cpu_worker[cpu]];
    return atomic_load_explicit(&w->pinned, memory_order_relaxed) ? w : NULL;
}

static void wait_job(asymo_pool *p, job_t *j)
{
    const int64_t spin_ns =
        (int64_t)atomic_load_explicit(&p->submit_spin_us, memory_order_relaxed) * 1000;
    int64_t deadline = now_ns() + spin_ns;
    unsigned spins = 0;
    while (atomic_load_explicit(&j->done, memory_order_acquire) != 1) {
        /* help: run queued work as the worker of this core (see the top of this file) */
        worker_t *mine = worker_on_my_core(p);
        if (mine && help_as(p, mine, j)) {
            deadline = now_ns() + spin_ns;
            continue;
        }
        /* A backup needs the submitter awake while another worker runs a task of the job. */
        if (now_ns() < deadline ||
            (mine && (j->flags & ASYMO_RUN_BACKUP) && job_has_late_candidates(p, mine, j))) {
            for (int i = 0; i < 16; i++)
                cpu_relax();
            if (mine && atomic_load_explicit(&p->caller_helps, memory_order_relaxed)) {
                /* Nothing this worker may take is left (or its own thread is running a range
                 * of it): the submitter could only hand the core to that thread, which would
                 * look for the same work. Yield only to let a range it runs finish. */
                if (atomic_load_explicit(&mine->claimed, memory_order_relaxed))
                    sched_yield();
                continue;
            }
            /* The submitter is one thread more than there are cores. When the worker pinned
             * to this core has work, every polling round hands the core over to it. */
            if (++spins % YIELD_EVERY == 0)
                mine = NULL;
            if (!mine || wq_pending(mine) > 0 ||
                atomic_load_explicit(&mine->running, memory_order_relaxed))
                sched_yield();
            continue;
        }
        uint32_t expect = 0;
        if (atomic_compare_exchange_strong(&j->done, &expect, 2) || expect == 2) {
            /* A worker may have taken a range of a backup job and not yet published its first
             * task when the check above looked: wake up to look again. */
            if (mine && (j->flags & ASYMO_RUN_BACKUP))
                futex_wait_ns(&j->done, 2, BACKUP_RECHECK_NS);
            else
                futex_wait(&j->done, 2);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* submitting */

/* A submitter on a slower cluster's core moves to the fastest cluster's cores that its mask
 * allows (see asymo_pool_set_caller_to_fastest). Returns 1, with the mask to restore in
 * *saved, if it moved. The check is one sched_getcpu (no system call) for a submitter that is
 * already on the fastest cluster, as it stays once it has moved. */
static int move_to_fastest(asymo_pool *p, cpu_set_t *saved)
{
    if (p->nclusters < 2 || !atomic_load_explicit(&p->caller_to_fastest, memory_order_relaxed))
        return 0;
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= p->ncpu_map || p->cpu_worker[cpu] < 0 ||
        p->workers[p->cpu_worker[cpu]].cluster == 0)
        return 0;
    if (pthread_getaffinity_np(pthread_self(), sizeof *saved, saved) != 0)
        return 0;
    cpu_set_t fast;
    CPU_AND(&fast, saved, &p->fastest_cpus);
    if (CPU_COUNT(&fast) == 0)
        return 0;
    return pthread_setaffinity_np(pthread_self(), sizeof fast, &fast) == 0;
}

/* A job whose tasks only one worker may run -- the worker pinned to the submitter's core,
 * every other worker being unable to take them (with counts: all tasks belong to that
 * worker's cluster and no other worker may take that cluster's tasks, policy_may_take;
 * without: the pool has no other active worker): the submitter runs the whole job as that
 * worker and wakes nobody. (Queued, the job would wake the worker's thread only for the two
 * to take the core in turns.) Returns 1 if it ran the job. */
static int run_as_only_worker(asymo_pool *p, job_t *j, const int64_t *counts)
{
    if (p->policy != ASYMO_POLICY_ASYMO ||
        !atomic_load_explicit(&p->caller_helps, memory_order_relaxed))
        return 0;
    worker_t *mine = worker_on_my_core(p);
    if (!mine || !worker_active(p, mine) || (counts && counts[mine->cluster] != j->ntasks))
        return 0;
    for (int i = 0; i < p->nworkers; i++) {
        const worker_t *w = &p->workers[i];
        if (w != mine && (counts ? policy_may_take(p, w, mine->cluster, j->flags)
                                 : worker_active(p, w)))
            return 0;
    }
    if (!claim_worker(mine))
        return 0;
    const range_t r = {j, 0, j->ntasks, -1, j->flags, j->seq};
    enter_as(p, mine);
    run_range(mine, &r);
    leave_as(p, mine);
    return 1;
}

int asymo_pool_run(asymo_pool *pool, asymo_task_fn fn, void *ctx, int64_t ntasks,
                   const int64_t *cluster_counts, unsigned flags)
{
    if (!pool || !fn || ntasks < 0
        || (flags & ~(unsigned)(ASYMO_RUN_CLUSTER_LOCAL | ASYMO_RUN_INLINE | ASYMO_RUN_BACKUP)))
        return ASYMO_EINVAL;
    if (pool->policy != ASYMO_POLICY_ASYMO || (flags & ASYMO_RUN_CLUSTER_LOCAL))
        flags &= ~(unsigned)ASYMO_RUN_BACKUP;
    if (cluster_counts) {
        int64_t sum = 0;
        for (int c = 0; c < pool->nclusters; c++) {
            if (cluster_counts[c] < 0)
                return ASYMO_EINVAL;
            sum += cluster_counts[c];
        }
        if (sum != ntasks)
            return ASYMO_EINVAL;
    }
    if (ntasks == 0)
        return ASYMO_OK;
    if (flags & ASYMO_RUN_INLINE) {
        for (int64_t t = 0; t < ntasks; t++)
            fn(t, ctx);
        return ASYMO_OK;
    }
    if (pool_tls_pool) {
        /* nested: the calling worker already owns a core; queuing and waiting here could
         * deadlock, so run the job inline */
        worker_t *w = &pool_tls_pool->workers[pool_tls_worker];
        for (int64_t t = 0; t < ntasks; t++)
            fn(t, ctx);
        counter_add(&w->tasks_inline, ntasks);
        return ASYMO_OK;
    }
    if (atomic_load_explicit(&pool_intercepted, memory_order_acquire) == pool) {
        pool_intercept_fn run = atomic_load_explicit(&pool_intercept_run, memory_order_relaxed);
        if (run)
            return run(pool, fn, ctx, ntasks, cluster_counts);
    }
    int rc = ensure_threads(pool);
    if (rc != ASYMO_OK)
        return rc;

    job_t j;
    j.fn = fn;
    j.ctx = ctx;
    j.ntasks = ntasks;
    j.flags = flags;
    j.seq = atomic_fetch_add_explicit(&pool->job_seq, 1, memory_order_relaxed) + 1;
    atomic_store(&j.remaining, ntasks);
    atomic_store(&j.done, 0);
    atomic_store(&j.next, 0);
    j.users = 0;
    j.listed = 0;
    j.shared_next = NULL;

    cpu_set_t saved;
    int moved = move_to_fastest(pool, &saved);
    if (run_as_only_worker(pool, &j, cluster_counts))
        rc = ASYMO_OK;
    else if ((rc = policy_submit(pool, &j, cluster_counts)) == ASYMO_OK) {
        wake_workers(pool);
        wait_job(pool, &j);
        policy_job_done(pool, &j);
    }
    if (moved) /* best effort: a mask the thread may no longer have (cpuset changed) stays */
        pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    return rc;
}

int asymo_pool_run_jobs(asymo_pool *pool, const asymo_run_job *jobs, int64_t n,
                        uint64_t *marks, int64_t nmarks, int64_t *failed)
{
    if (!pool || n < 0 || (n > 0 && !jobs) || nmarks < 0 || (nmarks > 0 && !marks))
        return ASYMO_EINVAL;
    for (int64_t i = 0; i < n; i++) {
        const int64_t w = jobs[i].wait, m = jobs[i].mark;
        if (w < ASYMO_WAIT_ALL || w >= nmarks || m < -1 || m >= nmarks) {
            if (failed)
                *failed = i;
            return ASYMO_EINVAL;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const asymo_run_job *job = &jobs[i];
        if (job->wait != ASYMO_WAIT_NONE || job->mark >= 0) {
            const uint64_t last = job->wait == ASYMO_WAIT_NONE ? asymo_pool_last_job(pool)
                                  : asymo_pool_fence(pool, job->wait == ASYMO_WAIT_ALL
                                                               ? UINT64_MAX
                                                               : marks[job->wait]);
            if (job->mark >= 0)
                marks[job->mark] = last;
        }
        const int rc = asymo_pool_run(pool, job->fn, job->ctx, job->ntasks,
                                      job->cluster_counts, job->flags);
        if (rc != ASYMO_OK) {
            if (failed)
                *failed = i;
            return rc;
        }
    }
    return ASYMO_OK;
}

int asymo_pool_current_worker(void) { return pool_tls_worker; }

int asymo_pool_current_cluster(void)
{
    return pool_tls_pool ? pool_tls_pool->workers[pool_tls_worker].cluster : -1;
}

const asymo_pool *asymo_pool_current(void) { return pool_tls_pool; }

int asymo_pool_worker_of(const asymo_pool *pool)
{
    return pool && pool_tls_pool == pool ? pool_tls_worker : -1;
}
