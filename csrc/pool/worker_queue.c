/* The worker queue: one interface over both queue kinds, used by the run loop and the
 * policies. */
#include "pool/pool_internal.h"

/* Chase-Lev owner: queue a range as pieces halving towards the bottom (the front task is
 * taken first, thieves take the largest, oldest piece: the back half). */
static void cl_push_pieces(worker_t *w, range_t r)
{
    while (r.hi - r.lo > 1) {
        range_t piece = r;
        piece.lo = r.hi - (r.hi - r.lo) / 2;
        if (cl_push(&w->d, &piece) != 0)
            run_range(w, &piece); /* no memory to grow the deque: run it now */
        r.hi = piece.lo;
    }
    if (cl_push(&w->d, &r) != 0)
        run_range(w, &r);
}

/* Owner: queue a range it stole at the front of its own queue. */
void wq_push_own(worker_t *w, const range_t *r)
{
    if (w->pool->queue == ASYMO_QUEUE_CHASELEV) {
        cl_push_pieces(w, *r);
    } else if (rq_push_front(&w->q, r) != 0) {
        run_range(w, r); /* no memory to grow the queue: run it now */
    }
}

/* Owner: the next chunk to run. */
int wq_pop_own(worker_t *w, range_t *r)
{
    if (w->pool->queue != ASYMO_QUEUE_CHASELEV)
        return rq_pop_front(&w->q, &w->chunk_seq, &w->chunk, r);
    for (;;) {
        if (cl_take(&w->d, r))
            break;
        range_t in; /* deque empty: move the next range submitted to the inbox */
        if (!rq_take_front(&w->q, &in))
            return 0;
        cl_push_pieces(w, in);
    }
    if (r->seq != w->chunk_seq) {
        w->chunk_seq = r->seq;
        w->chunk = 1;
    }
    const int64_t chunk = (r->flags & ASYMO_RUN_BACKUP) ? 1 : w->chunk; /* (rq_pop_front) */
    if (r->hi - r->lo > chunk) {
        range_t rest = *r;
        rest.lo = r->lo + chunk;
        r->hi = rest.lo;
        cl_push_pieces(w, rest);
    }
    return 1;
}

/* The tasks v must have queued for w to take one of them: as many as w's time per task is
 * of v's (v would reach the task no sooner than w finishes it), when both have measured the
 * same job; STEAL_UP_MIN otherwise. */
static int64_t steal_up_min(const worker_t *w, const worker_t *v)
{
    worker_t *a = (worker_t *)w, *b = (worker_t *)v;
    const uint64_t seq = atomic_load_explicit(&a->est_seq, memory_order_relaxed);
    if (seq == 0 || atomic_load_explicit(&b->est_seq, memory_order_relaxed) != seq)
        return STEAL_UP_MIN;
    const int64_t na = atomic_load_explicit(&a->est_tasks, memory_order_relaxed);
    const int64_t nb = atomic_load_explicit(&b->est_tasks, memory_order_relaxed);
    const int64_t ta = atomic_load_explicit(&a->est_ns, memory_order_relaxed);
    const int64_t tb = atomic_load_explicit(&b->est_ns, memory_order_relaxed);
    if (na <= 0 || nb <= 0 || ta <= 0 || tb <= 0)
        return STEAL_UP_MIN;
    /* ceil((ta / na) / (tb / nb)) */
    const double ratio = ((double)ta * (double)nb) / ((double)tb * (double)na);
    return ratio >= (double)STEAL_UP_MIN ? STEAL_UP_MIN : ratio <= 1.0 ? 1 : (int64_t)ratio + 1;
}

/* Thief w of a slower cluster takes one task of a backup job queued at v (the mutex queue, or
 * the Chase-Lev kind's inbox), if v has enough queued (steal_up_min). */
int wq_steal_up(worker_t *w, worker_t *v, range_t *r)
{
    return rq_steal_one_backup(&v->q, steal_up_min(w, v), r);
}

/* Thief w takes work queued at v. */
int wq_steal(worker_t *w, worker_t *v, range_t *r)
{
    if (w->pool->queue == ASYMO_QUEUE_CHASELEV &&
        cl_steal(&v->d, w->cluster, v->cluster, r))
        return 1;
    return rq_steal_back(&v->q, w->cluster, v->cluster, r);
}
