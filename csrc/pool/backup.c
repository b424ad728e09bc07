/* Backup tasks (ASYMO_RUN_BACKUP in asymo/pool.h): a job does not wait for a worker that has
 * stopped in the middle of a task (a core taken by another thread, an emulated slow core's
 * pause); its submitter runs the task again and the job ends with whichever copy finishes
 * first, as MapReduce's backup tasks do for stragglers.
 *
 * A worker running a range of such a job publishes, task by task, which task it runs and
 * the tasks of the range it has not begun, in a state word tagged per task: BK_RUNNING while
 * it runs the task. The submitter takes them over with one compare-and-swap, RUNNING ->
 * TAKEN of the same tag; the worker, its task done, swaps RUNNING -> IDLE. Exactly one of the
 * two swaps succeeds, and that side counts the tasks as finished: the job's `remaining`
 * cannot reach zero before both are settled, so a worker that loses touches the job no more
 * (the job lives on its submitter's stack) and only sets its state back to IDLE once its late
 * copy has returned. asymo_pool_fence waits for that.
 */
#include "pool/pool_internal.h"

enum { BK_IDLE = 0, BK_RUNNING = 1, BK_TAKEN = 2 };

static inline unsigned bk_kind(uint64_t s) { return (unsigned)(s & 3u); }

void run_range_backup(worker_t *w, const range_t *r)
{
    job_t *j = r->job;
    const asymo_task_fn fn = j->fn;
    void *const ctx = j->ctx;
    int64_t done = 0, t;
    int superseded = 0;
    atomic_store_explicit(&w->running, 1, memory_order_relaxed);
    const int64_t t0 = now_ns();
    int64_t start = t0;
    for (t = r->lo; t < r->hi; t++) {
        const uint64_t tag = ++w->bk_tag;
        atomic_store_explicit(&w->bk_seq, r->seq, memory_order_relaxed);
        atomic_store_explicit(&w->bk_lo, t, memory_order_relaxed);
        atomic_store_explicit(&w->bk_hi, r->hi, memory_order_relaxed);
        atomic_store_explicit(&w->bk_start_ns, start, memory_order_relaxed);
        uint64_t running = tag << 2 | BK_RUNNING;
        atomic_store_explicit(&w->bk_state, running, memory_order_release);
        fn(t, ctx);
        if (!atomic_compare_exchange_strong_explicit(&w->bk_state, &running, tag << 2 | BK_IDLE,
                                                     memory_order_acq_rel,
                                                     memory_order_acquire)) {
            superseded = 1; /* [t, hi) are the backup's */
            break;
        }
        done++;
        start = now_ns();
    }
    const int64_t dt = now_ns() - t0;
    atomic_store_explicit(&w->running, 0, memory_order_relaxed);
    count_tasks(w, r, done, dt);
    if (superseded) {
        counter_add(&w->tasks_superseded, 1);
        if (done > 0) /* the job is alive: the backup's tasks keep `remaining` above zero */
            job_finish_tasks(j, done);
        /* the late copy has returned: the fence may let its memory go */
        atomic_store_explicit(&w->bk_state, w->bk_tag << 2 | BK_IDLE, memory_order_release);
        return;
    }
    /* the time per task, for this job's backup limit (a range of the same job adds to it) */
    if (atomic_load_explicit(&w->est_seq, memory_order_relaxed) != r->seq) {
        atomic_store_explicit(&w->est_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&w->est_tasks, 0, memory_order_relaxed);
        atomic_store_explicit(&w->est_seq, r->seq, memory_order_relaxed);
    }
    atomic_store_explicit(&w->est_ns, atomic_load_explicit(&w->est_ns, memory_order_relaxed)
                                      + dt, memory_order_relaxed);
    atomic_store_explicit(&w->est_tasks,
                          atomic_load_explicit(&w->est_tasks, memory_order_relaxed) + done,
                          memory_order_relaxed);
    adapt_chunk(w, r, dt);
    job_finish_tasks(j, done);
}

/* w's time per task of job seq, or 0 when it has run none of its tasks. */
static int64_t task_ns(const worker_t *w, uint64_t seq)
{
    worker_t *m = (worker_t *)w;
    if (atomic_load_explicit(&m->est_seq, memory_order_relaxed) != seq)
        return 0;
    const int64_t n = atomic_load_explicit(&m->est_tasks, memory_order_relaxed);
    return n > 0 ? atomic_load_explicit(&m->est_ns, memory_order_relaxed) / n : 0;
}

/* Whether `mine`, which has nothing else to run, should back up the task v began `elapsed`
 * ns ago: when v has stopped (the task has run backup_factor times mine's time per task of
 * job j, and backup_min_ns), or when v's own time per task of j says the task would end later
 * than a fresh copy run by mine (a core slower than its share assumed: the end of the job
 * is the submitter's to bring forward). Never while mine has run none of j's tasks. */
static int backup_due(const asymo_pool *p, const worker_t *mine, const worker_t *v,
                      const job_t *j, int64_t elapsed)
{
    const int64_t own = task_ns(mine, j->seq), theirs = task_ns(v, j->seq);
    if (own <= 0)
        return 0;
    const int64_t factor = atomic_load_explicit(&((asymo_pool *)p)->backup_factor,
                                                memory_order_relaxed);
    const int64_t floor = atomic_load_explicit(&((asymo_pool *)p)->backup_min_ns,
                                               memory_order_relaxed);
    if (elapsed >= factor * own && elapsed >= floor)
        return 1;
    /* (a quarter's margin: the copy starts late and its data are on the other core) */
    return theirs - elapsed > own + own / 4;
}

int job_has_late_candidates(const asymo_pool *p, const worker_t *mine, const job_t *j)
{
    if (atomic_load_explicit(&((asymo_pool *)p)->backup_factor, memory_order_relaxed) <= 0)
        return 0;
    for (int i = 0; i < p->nworkers; i++) {
        worker_t *v = &p->workers[i];
        if (v != mine
            && bk_kind(atomic_load_explicit(&v->bk_state, memory_order_relaxed)) == BK_RUNNING
            && atomic_load_explicit(&v->bk_seq, memory_order_relaxed) == j->seq)
            return 1;
    }
    return 0;
}

/* Submitter of j, acting as `mine`: take over and run the tasks of a worker that has run a
 * task of j past the backup limit. Returns 1 if it ran some. */
int backup_late_tasks(asymo_pool *p, worker_t *mine, job_t *j)
{
    if (atomic_load_explicit(&p->backup_factor, memory_order_relaxed) <= 0)
        return 0;
    const int64_t now = now_ns();
    for (int i = 0; i < p->nworkers; i++) {
        worker_t *v = &p->workers[i];
        if (v == mine)
            continue;
        uint64_t s = atomic_load_explicit(&v->bk_state, memory_order_acquire);
        if (bk_kind(s) != BK_RUNNING)
            continue;
        /* the fields belong to tag s if the swap below succeeds: the worker rewrites them
         * only after leaving s */
        const uint64_t seq = atomic_load_explicit(&v->bk_seq, memory_order_relaxed);
        const int64_t lo = atomic_load_explicit(&v->bk_lo, memory_order_relaxed);
        const int64_t hi = atomic_load_explicit(&v->bk_hi, memory_order_relaxed);
        const int64_t start = atomic_load_explicit(&v->bk_start_ns, memory_order_relaxed);
        if (seq != j->seq || lo >= hi)
            continue;
        if (!backup_due(p, mine, v, j, now - start))
            continue;
        if (!atomic_compare_exchange_strong_explicit(&v->bk_state, &s, (s & ~(uint64_t)3)
                                                     | BK_TAKEN, memory_order_acq_rel,
                                                     memory_order_relaxed))
            continue;
        const range_t taken = {j, lo, hi, -1, j->flags, j->seq};
        atomic_store_explicit(&mine->running, 1, memory_order_relaxed);
        const int64_t t0 = now_ns();
        for (int64_t t = lo; t < hi; t++)
            j->fn(t, j->ctx);
        atomic_store_explicit(&mine->running, 0, memory_order_relaxed);
        count_tasks(mine, &taken, hi - lo, now_ns() - t0);
        counter_add(&mine->tasks_backup, hi - lo);
        job_finish_tasks(j, hi - lo);
        return 1;
    }
    return 0;
}

uint64_t asymo_pool_last_job(const asymo_pool *pool)
{
    return pool ? atomic_load_explicit(&((asymo_pool *)pool)->job_seq, memory_order_acquire)
                : 0;
}

uint64_t asymo_pool_fence(asymo_pool *pool, uint64_t seq)
{
    if (!pool)
        return 0;
    const uint64_t last = atomic_load_explicit(&pool->job_seq, memory_order_acquire);
    for (int i = 0; i < pool->nworkers; i++) {
        worker_t *w = &pool->workers[i];
        unsigned spins = 0;
        for (;;) {
            const uint64_t s = atomic_load_explicit(&w->bk_state, memory_order_acquire);
            if (bk_kind(s) != BK_TAKEN)
                break;
            /* a later job's late task may go on: its memory is not the caller's to free yet */
            if (atomic_load_explicit(&w->bk_seq, memory_order_relaxed) > seq
                && atomic_load_explicit(&w->bk_state, memory_order_acquire) == s)
                break;
            for (int k = 0; k < 16; k++)
                cpu_relax();
            /* the late worker may share this core (it is the one stopped) */
            if (++spins % YIELD_EVERY == 0)
                sched_yield();
        }
    }
    return last;
}
