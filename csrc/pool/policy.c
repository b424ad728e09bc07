/* The four policies (see ASYMO_POLICY_* in asymo/pool.h): where a job's tasks are queued
 * when it is submitted, and which queues an idle worker may steal from.
 *
 *   asymo   cluster c's tasks go to the shortest queues of cluster c's workers; an idle worker
 *           steals from the longest queue of its own cluster, then from slower clusters
 *           (nearest first); a slower cluster never steals from a faster one.
 *   even    equal contiguous blocks over all workers, no stealing (OpenMP static, OpenBLAS).
 *   shared  one atomic counter per job, every worker takes the next task (ARM-CL feeder).
 *   steal   equal blocks, an idle worker steals from the next non-empty queue in any
 *           direction (pthreadpool).
 */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include <sched.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------ */
/* submitting: where the ranges go */

/* Queue a range at worker w. Only a failed allocation (growing the ring) can stop that; then
 * the submitting thread runs the range itself, so no task is ever lost. */
static void queue_or_run(asymo_pool *p, int w, job_t *j, int64_t lo, int64_t hi)
{
    range_t r = {j, lo, hi, -1, j->flags, j->seq};
    if (rq_push_back(&p->workers[w].q, &r) == 0)
        return;
    for (int64_t t = lo; t < hi; t++)
        j->fn(t, j->ctx);
    job_finish_tasks(j, hi - lo);
}

/* Queue n tasks starting at `first` on the workers idx[0..nw): each task goes to the queue
 * that is shortest at that point (water-filling over the current queue lengths), and each
 * worker receives one contiguous range, in worker order, so neighbouring tasks share a core. */
static int queue_shortest_first(asymo_pool *p, job_t *j, const int *idx, int nw, int64_t first,
                                int64_t n)
{
    int64_t *L = malloc(sizeof(int64_t) * nw), *give = malloc(sizeof(int64_t) * nw);
    int *order = malloc(sizeof(int) * nw);
    if (!L || !give || !order) {
        free(L);
        free(give);
        free(order);
        return ASYMO_ENOMEM;
    }
    for (int i = 0; i < nw; i++) {
        L[i] = wq_pending(&p->workers[idx[i]]);
        order[i] = i;
        give[i] = 0;
    }
    for (int i = 1; i < nw; i++) { /* stable insertion sort by length */
        int o = order[i], k = i;
        while (k > 0 && L[order[k - 1]] > L[o]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = o;
    }
    /* raise the m shortest queues to a common level while the tasks last */
    int64_t left = n, level = L[order[0]];
    int m = 1;
    while (m < nw) {
        int64_t cost = (int64_t)m * (L[order[m]] - level);
        if (cost > left)
            break;
        left -= cost;
        level = L[order[m]];
        m++;
    }
    int64_t each = left / m, extra = left % m;
    for (int i = 0; i < m; i++)
        give[order[i]] = level - L[order[i]] + each + (i < extra ? 1 : 0);
    int64_t at = first;
    for (int i = 0; i < nw; i++) {
        if (give[i] == 0)
            continue;
        queue_or_run(p, idx[i], j, at, at + give[i]);
        at += give[i];
    }
    free(L);
    free(give);
    free(order);
    return ASYMO_OK;
}

static int submit_queues(asymo_pool *p, job_t *j, const int64_t *counts)
{
    int limit = atomic_load(&p->limit);
    if (p->policy != ASYMO_POLICY_ASYMO) {
        /* even / steal: equal contiguous blocks over the active workers, in worker order */
        int64_t n = j->ntasks, each = n / limit, extra = n % limit, at = 0;
        for (int i = 0; i < limit; i++) {
            int64_t k = each + (i < extra ? 1 : 0);
            if (k > 0)
                queue_or_run(p, i, j, at, at + k);
            at += k;
        }
        return ASYMO_OK;
    }
    int act_n[MAX_CLUSTERS];
    int64_t total_act = 0;
    for (int c = 0; c < p->nclusters; c++) {
        act_n[c] = 0;
        for (int i = 0; i < p->cluster_nw[c]; i++)
            if (p->cluster_workers[c][i] < limit)
                act_n[c]++;
        total_act += act_n[c];
    }
    int64_t cnt[MAX_CLUSTERS];
    if (counts) {
        for (int c = 0; c < p->nclusters; c++)
            cnt[c] = counts[c];
    } else { /* no split given: even over the active workers */
        int64_t given = 0;
        for (int c = 0; c < p->nclusters; c++) {
            cnt[c] = j->ntasks * act_n[c] / total_act;
            given += cnt[c];
        }
        for (int c = 0; given < j->ntasks; c = (c + 1) % p->nclusters)
            if (act_n[c] > 0) {
                cnt[c]++;
                given++;
            }
    }
    int *ids = malloc(sizeof(int) * p->nworkers);
    if (!ids)
        return ASYMO_ENOMEM;
    int64_t first = 0;
    int rc = ASYMO_OK;
    for (int c = 0; c < p->nclusters && rc == ASYMO_OK; c++) {
        if (cnt[c] == 0)
            continue;
        /* A cluster left without active workers by the thread limit: its tasks go to the
         * nearest faster cluster that has one, else the nearest slower. */
        int tc = c;
        if (act_n[tc] == 0) {
            tc = -1;
            for (int d = c - 1; d >= 0 && tc < 0; d--)
                if (act_n[d] > 0)
                    tc = d;
            for (int d = c + 1; d < p->nclusters && tc < 0; d++)
                if (act_n[d] > 0)
                    tc = d;
        }
        int m = 0;
        for (int i = 0; i < p->cluster_nw[tc]; i++)
            if (p->cluster_workers[tc][i] < limit)
                ids[m++] = p->cluster_workers[tc][i];
        rc = queue_shortest_first(p, j, ids, m, first, cnt[c]);
        if (rc != ASYMO_OK) { /* no memory for the bookkeeping: run the rest here */
            for (int64_t t = first; t < j->ntasks; t++)
                j->fn(t, j->ctx);
            job_finish_tasks(j, j->ntasks - first);
            rc = ASYMO_OK;
            break;
        }
        first += cnt[c];
    }
    free(ids);
    return rc;
}

/* Shared policy: the job joins the pool's list, from which every worker takes tasks. */
static void shared_add(asymo_pool *p, job_t *j)
{
    pthread_mutex_lock(&p->shared_lock);
    job_t **link = &p->shared_head;
    while (*link)
        link = &(*link)->shared_next;
    j->listed = 1;
    __atomic_store_n(link, j, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&p->shared_lock);
}

/* Queue a new job's tasks; on failure nothing was queued. */
int policy_submit(asymo_pool *p, job_t *j, const int64_t *counts)
{
    if (p->policy == ASYMO_POLICY_SHARED) {
        shared_add(p, j);
        return ASYMO_OK;
    }
    return submit_queues(p, j, counts);
}

/* After the submitter saw its job done: under the shared policy, unlink the job, then wait
 * until no worker still holds a pointer to it (it lives on the submitter's stack). */
void policy_job_done(asymo_pool *p, job_t *j)
{
    if (p->policy != ASYMO_POLICY_SHARED)
        return;
    pthread_mutex_lock(&p->shared_lock);
    if (j->listed) {
        for (job_t **link = &p->shared_head; *link; link = &(*link)->shared_next)
            if (*link == j) {
                __atomic_store_n(link, j->shared_next, __ATOMIC_RELEASE);
                break;
            }
        j->listed = 0;
    }
    while (j->users > 0) {
        pthread_mutex_unlock(&p->shared_lock);
        sched_yield();
        pthread_mutex_lock(&p->shared_lock);
    }
    pthread_mutex_unlock(&p->shared_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* stealing: who may take from whom */

static int steal_from(worker_t *w, worker_t *v, int up)
{
    range_t r;
    if (!(up ? wq_steal_up(w, v, &r) : wq_steal(w, v, &r)))
        return 0;
    r.origin = v->cluster;
    counter_add(&w->steals, 1);
    wq_push_own(w, &r);
    return 1;
}

/* The non-empty queue with the most pending tasks among cluster c's workers, excluding w. */
static worker_t *longest_queue(asymo_pool *p, int c, const worker_t *w)
{
    worker_t *best = NULL;
    int64_t best_len = 0;
    for (int i = 0; i < p->cluster_nw[c]; i++) {
        worker_t *v = &p->workers[p->cluster_workers[c][i]];
        if (v == w)
            continue;
        int64_t len = wq_pending(v);
        if (len > best_len) {
            best_len = len;
            best = v;
        }
    }
    return best;
}

/* Whether worker w may ever run a task queued for `cluster` under the asymo policy: its own
 * cluster's, and a slower cluster's unless the job is cluster-local (policy_try_steal's
 * rule: a faster cluster steals from slower ones, never the reverse). */
int policy_may_take(const asymo_pool *p, const worker_t *w, int cluster, unsigned flags)
{
    return worker_active(p, w) && (w->cluster == cluster ||
                                   (w->cluster < cluster && !(flags & ASYMO_RUN_CLUSTER_LOCAL)));
}

int policy_try_steal(asymo_pool *p, worker_t *w)
{
    if (!worker_active(p, w))
        return 0;
    switch (p->policy) {
    case ASYMO_POLICY_ASYMO:
        /* own cluster first (longest queue), then slower clusters, nearest first */
        for (int c = w->cluster; c < p->nclusters; c++) {
            for (int attempt = 0; attempt < 2; attempt++) {
                worker_t *v = longest_queue(p, c, w);
                if (!v)
                    break;
                if (steal_from(w, v, 0))
                    return 1;
            }
        }
        /* Faster clusters, nearest first: one task of a backup job, from a queue long enough
         * that its owner would reach the task no sooner than this worker can finish it
         * (wq_steal_up: a slower core that has finished its share early runs faster at the
         * moment than its capacity said, as an emulated core between its pauses does);
         * should it stop in the task, the submitter backs the task up. */
        for (int c = w->cluster - 1; c >= 0; c--) {
            worker_t *v = longest_queue(p, c, w);
            if (v && steal_from(w, v, 1))
                return 1;
        }
        return 0;
    case ASYMO_POLICY_STEAL:
        for (int i = 1; i < p->nworkers; i++) {
            worker_t *v = &p->workers[(w->index + i) % p->nworkers];
            if (wq_pending(v) > 0 &&
                steal_from(w, v, 0))
                return 1;
        }
        return 0;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* the shared policy's workers */

/* Shared policy: take tasks one by one from the first job in the pool's list that has any. */
int policy_run_shared(asymo_pool *p, worker_t *w)
{
    job_t *j = NULL;
    pthread_mutex_lock(&p->shared_lock);
    for (job_t **link = &p->shared_head; *link;) {
        job_t *c = *link;
        if (atomic_load_explicit(&c->next, memory_order_relaxed) < c->ntasks) {
            j = c;
            j->users++;
            break;
        }
        __atomic_store_n(link, c->shared_next, __ATOMIC_RELEASE); /* exhausted: unlink */
        c->listed = 0;
    }
    pthread_mutex_unlock(&p->shared_lock);
    if (!j)
        return 0;

    int64_t ran = 0, t0 = now_ns();
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= j->ntasks)
            break;
        j->fn(t, j->ctx);
        ran++;
        job_finish_tasks(j, 1);
    }
    counter_add(&w->busy_ns, now_ns() - t0);
    counter_add(&w->tasks_run, ran);
    if (pool_tls_helping)
        counter_add(&w->tasks_caller, ran);

    pthread_mutex_lock(&p->shared_lock);
    j->users--;
    pthread_mutex_unlock(&p->shared_lock);
    return 1;
}
