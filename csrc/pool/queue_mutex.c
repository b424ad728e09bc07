/* The mutex-protected ring of task ranges: the worker queue of ASYMO_QUEUE_MUTEX, and the
 * inbox submitters fill under ASYMO_QUEUE_CHASELEV. */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include <stdlib.h>

void mutex_init_adaptive(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

int rq_init(rqueue_t *q)
{
    mutex_init_adaptive(&q->lock);
    q->cap = 8;
    q->head = q->count = 0;
    atomic_store(&q->pending, 0);
    q->items = malloc(sizeof(range_t) * q->cap);
    return q->items ? 0 : -1;
}

void rq_free(rqueue_t *q)
{
    pthread_mutex_destroy(&q->lock);
    free(q->items);
    q->items = NULL;
}

static inline range_t *rq_at(rqueue_t *q, int i) { return &q->items[(q->head + i) % q->cap]; }

/* Lock held. */
static int rq_grow(rqueue_t *q)
{
    int ncap = q->cap * 2;
    range_t *items = malloc(sizeof(range_t) * ncap);
    if (!items)
        return -1;
    for (int i = 0; i < q->count; i++)
        items[i] = *rq_at(q, i);
    free(q->items);
    q->items = items;
    q->cap = ncap;
    q->head = 0;
    return 0;
}

static int rq_push(rqueue_t *q, const range_t *r, int front)
{
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap && rq_grow(q) != 0) {
        pthread_mutex_unlock(&q->lock);
        return -1;
    }
    if (front) {
        q->head = (q->head + q->cap - 1) % q->cap;
        q->items[q->head] = *r;
    } else {
        *rq_at(q, q->count) = *r;
    }
    q->count++;
    atomic_fetch_add(&q->pending, r->hi - r->lo);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

int rq_push_back(rqueue_t *q, const range_t *r) { return rq_push(q, r, 0); }

int rq_push_front(rqueue_t *q, const range_t *r) { return rq_push(q, r, 1); }

/* Owner: take a chunk from the front range. The chunk starts at one task for each new job
 * and grows while chunks run short (run_range); never more than a quarter of what is left
 * is taken in hand, the rest stays stealable. */
int rq_pop_front(rqueue_t *q, uint64_t *chunk_seq, int64_t *chunk, range_t *out)
{
    if (atomic_load_explicit(&q->pending, memory_order_acquire) == 0)
        return 0;
    pthread_mutex_lock(&q->lock);
    while (q->count > 0) {
        range_t *r = rq_at(q, 0);
        int64_t n = r->hi - r->lo;
        if (n == 0) { /* emptied by a thief while not at the back */
            q->head = (q->head + 1) % q->cap;
            q->count--;
            continue;
        }
        if (r->seq != *chunk_seq) {
            *chunk_seq = r->seq;
            *chunk = 1;
        }
        int64_t k = *chunk;
        int64_t quarter = n / 4 > 0 ? n / 4 : 1;
        if (k > quarter)
            k = quarter;
        /* a backup job's tasks one at a time: what is queued can be stolen, what is in hand
         * only backed up (backup.c) */
        if (r->flags & ASYMO_RUN_BACKUP)
            k = 1;
        *out = *r;
        out->hi = r->lo + k;
        r->lo += k;
        if (r->lo == r->hi) {
            q->head = (q->head + 1) % q->cap;
            q->count--;
        }
        atomic_fetch_sub(&q->pending, k);
        pthread_mutex_unlock(&q->lock);
        return 1;
    }
    pthread_mutex_unlock(&q->lock);
    return 0;
}

/* Thief: take the back half of the last range it may take. `thief_cluster` and the victim's
 * cluster decide whether cluster-local jobs are eligible. */
int rq_steal_back(rqueue_t *q, int thief_cluster, int victim_cluster, range_t *out)
{
    if (atomic_load_explicit(&q->pending, memory_order_acquire) == 0)
        return 0;
    pthread_mutex_lock(&q->lock);
    for (int i = q->count - 1; i >= 0; i--) {
        range_t *r = rq_at(q, i);
        int64_t n = r->hi - r->lo;
        if (n == 0)
            continue;
        if ((r->flags & ASYMO_RUN_CLUSTER_LOCAL) && thief_cluster != victim_cluster)
            continue;
        int64_t k = (n + 1) / 2;
        *out = *r;
        out->lo = r->hi - k;
        r->hi -= k;
        while (q->count > 0 && rq_at(q, q->count - 1)->hi == rq_at(q, q->count - 1)->lo)
            q->count--;
        atomic_fetch_sub(&q->pending, k);
        pthread_mutex_unlock(&q->lock);
        return 1;
    }
    pthread_mutex_unlock(&q->lock);
    return 0;
}

/* Thief of a faster cluster's queue: the last task of the last ASYMO_RUN_BACKUP range, when
 * the queue holds at least min_pending tasks. */
int rq_steal_one_backup(rqueue_t *q, int64_t min_pending, range_t *out)
{
    if (atomic_load_explicit(&q->pending, memory_order_acquire) < min_pending)
        return 0;
    pthread_mutex_lock(&q->lock);
    for (int i = q->count - 1; i >= 0 && q->pending >= min_pending; i--) {
        range_t *r = rq_at(q, i);
        if (r->hi == r->lo || !(r->flags & ASYMO_RUN_BACKUP))
            continue;
        *out = *r;
        out->lo = --r->hi;
        while (q->count > 0 && rq_at(q, q->count - 1)->hi == rq_at(q, q->count - 1)->lo)
            q->count--;
        atomic_fetch_sub(&q->pending, 1);
        pthread_mutex_unlock(&q->lock);
        return 1;
    }
    pthread_mutex_unlock(&q->lock);
    return 0;
}

/* Take the whole first non-empty range. */
int rq_take_front(rqueue_t *q, range_t *out)
{
    if (atomic_load_explicit(&q->pending, memory_order_acquire) == 0)
        return 0;
    pthread_mutex_lock(&q->lock);
    while (q->count > 0) {
        range_t *r = rq_at(q, 0);
        q->head = (q->head + 1) % q->cap;
        q->count--;
        if (r->hi > r->lo) {
            *out = *r;
            atomic_fetch_sub(&q->pending, r->hi - r->lo);
            pthread_mutex_unlock(&q->lock);
            return 1;
        }
    }
    pthread_mutex_unlock(&q->lock);
    return 0;
}

void rq_clear(rqueue_t *q)
{
    q->head = q->count = 0;
    atomic_store(&q->pending, 0);
}
