/* The asymmetry-aware thread pool (AsyMo, section 4.3).
 *
 * One worker per core, pinned. Each worker owns a queue of task ranges [lo, hi) (a range is
 * a slice of one job's task ids, so a million-task job costs a handful of queue entries).
 * The owner takes chunks from the front of its first range; a thief takes half of the last
 * range. Policies differ only in where a job's ranges are queued and who may steal from whom:
 *
 *   asymo   cluster c's tasks go to the shortest queues of cluster c's workers; an idle worker
 *           steals from the longest queue of its own cluster, then from slower clusters
 *           (nearest first); a slower cluster never steals from a faster one.
 *   even    equal contiguous blocks over all workers, no stealing (OpenMP static, OpenBLAS).
 *   shared  one atomic counter per job, every worker takes the next task (ARM-CL feeder).
 *   steal   equal blocks, an idle worker steals from the next non-empty queue in any
 *           direction (pthreadpool).
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
 *
 * Queue kinds: the per-worker queue exists in two variants measured against each other by
 * bench/pool_queues.py; see QUEUE_* below.
 */
#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>
#include <sys/syscall.h>

#define MAX_CLUSTERS 8
#define MAX_WORKERS 4096
#define CACHELINE 64
#define DEFAULT_SPIN_US 200
/* Chunk growth and the submitter's spin: see ASYMO_POOL_* in pool.h (the simulator reads them). */
#define CHUNK_TARGET_NS ((int64_t)ASYMO_POOL_CHUNK_TARGET_NS)
#define CHUNK_MAX ((int64_t)ASYMO_POOL_CHUNK_MAX)
#define SUBMIT_SPIN_NS ((int64_t)ASYMO_POOL_SUBMIT_SPIN_NS)
/* Spinning threads yield the core every this many polling rounds (16 pauses each). */
#define YIELD_EVERY 8
/* The queue kind used unless env ASYMO_POOL_QUEUE or asymo_pool_create_ex says otherwise;
 * chosen by measurement (bench/pool_queues.py). */
#define DEFAULT_QUEUE ASYMO_QUEUE_MUTEX

/* ------------------------------------------------------------------------------------------ */
/* small helpers */

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Counters written by one thread only and read by others: relaxed atomics, no RMW. */
static inline void counter_add(int64_t *c, int64_t v)
{
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

static inline int64_t counter_get(const int64_t *c)
{
    return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------------------------------ */
/* jobs and ranges */

typedef struct job {
    asymo_task_fn fn;
    void *ctx;
    int64_t ntasks;
    unsigned flags;
    uint64_t seq;
    _Atomic int64_t remaining; /* tasks not finished yet */
    _Atomic uint32_t done;     /* futex word: 0 running, 2 submitter asleep, 1 done */
    /* shared policy only */
    _Atomic int64_t next;      /* the one shared counter */
    int users;                 /* workers holding a pointer to this job; under shared_lock */
    int listed;                /* still in the pool's shared list; under shared_lock */
    struct job *shared_next;
} job_t;

typedef struct {
    job_t *job;
    int64_t lo, hi;
    int origin;     /* -1: queued here by the submitter; c >= 0: stolen from a cluster-c worker */
    unsigned flags; /* the job's flags, copied so thieves never dereference `job` to decide */
    uint64_t seq;   /* the job's number: job addresses are reused (submitters' stacks) */
} range_t;

/* A short mutex-protected deque of ranges (ring buffer). `pending` mirrors the number of
 * queued tasks so victims and shortest queues can be chosen without taking locks. */
typedef struct {
    pthread_mutex_t lock;
    range_t *items;
    int cap, head, count;
    _Atomic int64_t pending;
} rqueue_t;

/* A Chase-Lev work-stealing deque (Le, Pop, Cohen, Zappa Nardelli, PPoPP 2013) of ranges:
 * the owner pushes and takes at the bottom without locks, thieves take the top with one CAS.
 * Slots hold ranges by value (read field by field with relaxed atomics; a thief's copy is only
 * used when its CAS on `top` succeeds). Arrays are grown by the owner; retired arrays are
 * kept until the pool is destroyed because a thief may still be reading one. */
typedef struct cl_array {
    int64_t size; /* power of two */
    struct cl_array *retired;
    range_t buf[];
} cl_array_t;

typedef struct {
    _Atomic int64_t top __attribute__((aligned(CACHELINE)));
    _Atomic int64_t bottom __attribute__((aligned(CACHELINE)));
    cl_array_t *_Atomic array;
} cldeque_t;

typedef struct worker {
    struct asymo_pool *pool;
    pthread_t thread;
    int index, cpu, cluster;
    int thread_started;
    _Atomic int pinned;
    _Atomic int running; /* inside a task: a thread sharing this core should stay off it */
    _Atomic int claimed; /* 1 while a thread (the worker's own or a submitter) acts as it */
    /* QUEUE_MUTEX: q is the worker's queue. QUEUE_CHASELEV: q is the inbox submitters fill
     * (the owner moves its ranges into d, thieves may take from both). */
    rqueue_t q;
    cldeque_t d;
    /* scheduling state private to the worker */
    uint64_t chunk_seq; /* job the chunk size was learnt on */
    int64_t chunk;
    /* counters: written by this worker only */
    int64_t tasks_run, tasks_stolen, stolen_from[MAX_CLUSTERS], busy_ns, steals, tasks_inline,
        sleeps, tasks_caller;
    /* values at the last reset (under pool->stats_lock) */
    asymo_worker_stats base;
} __attribute__((aligned(CACHELINE))) worker_t;

struct asymo_pool {
    int nworkers, nclusters, policy, queue;
    worker_t *workers;
    int *cluster_workers[MAX_CLUSTERS]; /* worker indices of each cluster, ascending */
    int *cpu_worker; /* cpu -> index of the worker pinned there, or -1 */
    int ncpu_map;
    int cluster_nw[MAX_CLUSTERS];
    _Atomic int limit;
    _Atomic int spin_us;
    _Atomic int caller_helps; /* submitters run work while they wait (see the top) */
    _Atomic uint64_t job_seq;

    _Atomic uint32_t wake_seq __attribute__((aligned(CACHELINE)));
    _Atomic int sleepers;
    _Atomic int stop;

    pthread_mutex_t shared_lock __attribute__((aligned(CACHELINE)));
    job_t *shared_head; /* written under shared_lock, read with atomic loads */

    pthread_mutex_t life_lock; /* thread (re)spawn */
    _Atomic int threads_alive;
    pthread_mutex_t start_lock;
    pthread_cond_t start_cond;
    int nstarted;

    pthread_mutex_t stats_lock;

    struct asymo_pool *reg_prev, *reg_next;
};

static __thread asymo_pool *tls_pool = NULL;
static __thread int tls_worker = -1;
static __thread int tls_helping = 0; /* a submitter acting as tls_worker while it waits */

/* ------------------------------------------------------------------------------------------ */
/* registry of live pools, for fork handling */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static asymo_pool *registry_head = NULL;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void pool_reset_after_fork(asymo_pool *p);

static void atfork_prepare(void) { pthread_mutex_lock(&registry_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&registry_lock); }

static void atfork_child(void)
{
    /* Only the forking thread exists in the child: every pool's workers are gone and its
     * locks may be held by threads that no longer exist. Reset each pool to a fresh state;
     * workers are started again on the first job. */
    pthread_mutex_init(&registry_lock, NULL);
    for (asymo_pool *p = registry_head; p; p = p->reg_next)
        pool_reset_after_fork(p);
    tls_pool = NULL;
    tls_worker = -1;
    tls_helping = 0;
}

static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void registry_add(asymo_pool *p)
{
    pthread_mutex_lock(&registry_lock);
    p->reg_prev = NULL;
    p->reg_next = registry_head;
    if (registry_head)
        registry_head->reg_prev = p;
    registry_head = p;
    pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(asymo_pool *p)
{
    pthread_mutex_lock(&registry_lock);
    if (p->reg_prev)
        p->reg_prev->reg_next = p->reg_next;
    else if (registry_head == p)
        registry_head = p->reg_next;
    if (p->reg_next)
        p->reg_next->reg_prev = p->reg_prev;
    pthread_mutex_unlock(&registry_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* the range queue */

static void mutex_init_adaptive(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

static int rq_init(rqueue_t *q)
{
    mutex_init_adaptive(&q->lock);
    q->cap = 8;
    q->head = q->count = 0;
    atomic_store(&q->pending, 0);
    q->items = malloc(sizeof(range_t) * q->cap);
    return q->items ? 0 : -1;
}

static void rq_free(rqueue_t *q)
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

static int rq_push_back(rqueue_t *q, const range_t *r)
{
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap && rq_grow(q) != 0) {
        pthread_mutex_unlock(&q->lock);
        return -1;
    }
    *rq_at(q, q->count) = *r;
    q->count++;
    atomic_fetch_add(&q->pending, r->hi - r->lo);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

static int rq_push_front(rqueue_t *q, const range_t *r)
{
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap && rq_grow(q) != 0) {
        pthread_mutex_unlock(&q->lock);
        return -1;
    }
    q->head = (q->head + q->cap - 1) % q->cap;
    q->items[q->head] = *r;
    q->count++;
    atomic_fetch_add(&q->pending, r->hi - r->lo);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

/* Owner: take a chunk from the front range. The chunk starts at one task for each new job
 * and grows while chunks run short (run_range); never more than a quarter of what is left
 * is taken in hand, the rest stays stealable. */
static int rq_pop_front(rqueue_t *q, uint64_t *chunk_seq, int64_t *chunk, range_t *out)
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
static int rq_steal_back(rqueue_t *q, int thief_cluster, int victim_cluster, range_t *out)
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

/* Take the whole first non-empty range. */
static int rq_take_front(rqueue_t *q, range_t *out)
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

static inline void slot_store(range_t *s, const range_t *r)
{
    __atomic_store_n(&s->job, r->job, __ATOMIC_RELAXED);
    __atomic_store_n(&s->lo, r->lo, __ATOMIC_RELAXED);
    __atomic_store_n(&s->hi, r->hi, __ATOMIC_RELAXED);
    __atomic_store_n(&s->origin, r->origin, __ATOMIC_RELAXED);
    __atomic_store_n(&s->flags, r->flags, __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, r->seq, __ATOMIC_RELAXED);
}

static inline void slot_load(range_t *s, range_t *r)
{
    r->job = __atomic_load_n(&s->job, __ATOMIC_RELAXED);
    r->lo = __atomic_load_n(&s->lo, __ATOMIC_RELAXED);
    r->hi = __atomic_load_n(&s->hi, __ATOMIC_RELAXED);
    r->origin = __atomic_load_n(&s->origin, __ATOMIC_RELAXED);
    r->flags = __atomic_load_n(&s->flags, __ATOMIC_RELAXED);
    r->seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
}

static int cl_init(cldeque_t *d)
{
    cl_array_t *a = malloc(sizeof(cl_array_t) + 64 * sizeof(range_t));
    if (!a)
        return -1;
    a->size = 64;
    a->retired = NULL;
    atomic_store(&d->top, 0);
    atomic_store(&d->bottom, 0);
    atomic_store(&d->array, a);
    return 0;
}

static void cl_free(cldeque_t *d)
{
    cl_array_t *a = atomic_load(&d->array);
    while (a) {
        cl_array_t *next = a->retired;
        free(a);
        a = next;
    }
    atomic_store(&d->array, NULL);
}

static inline int64_t cl_size(cldeque_t *d)
{
    int64_t n = atomic_load_explicit(&d->bottom, memory_order_relaxed) -
                atomic_load_explicit(&d->top, memory_order_relaxed);
    return n > 0 ? n : 0;
}

/* Owner only. */
static int cl_push(cldeque_t *d, const range_t *r)
{
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_relaxed);
    int64_t t = atomic_load_explicit(&d->top, memory_order_acquire);
    cl_array_t *a = atomic_load_explicit(&d->array, memory_order_relaxed);
    if (b - t > a->size - 1) {
        cl_array_t *na = malloc(sizeof(cl_array_t) + 2 * a->size * sizeof(range_t));
        if (!na)
            return -1;
        na->size = 2 * a->size;
        na->retired = a;
        for (int64_t i = t; i < b; i++) {
            range_t tmp;
            slot_load(&a->buf[i & (a->size - 1)], &tmp);
            slot_store(&na->buf[i & (na->size - 1)], &tmp);
        }
        atomic_store_explicit(&d->array, na, memory_order_release);
        a = na;
    }
    slot_store(&a->buf[b & (a->size - 1)], r);
    atomic_store_explicit(&d->bottom, b + 1, memory_order_release);
    return 0;
}

/* Owner only. */
static int cl_take(cldeque_t *d, range_t *out)
{
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_relaxed) - 1;
    cl_array_t *a = atomic_load_explicit(&d->array, memory_order_relaxed);
    atomic_store_explicit(&d->bottom, b, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    int64_t t = atomic_load_explicit(&d->top, memory_order_relaxed);
    if (t > b) {
        atomic_store_explicit(&d->bottom, b + 1, memory_order_relaxed);
        return 0;
    }
    slot_load(&a->buf[b & (a->size - 1)], out);
    if (t == b) { /* last entry: race the thieves for it */
        int won = atomic_compare_exchange_strong_explicit(&d->top, &t, t + 1,
                                                          memory_order_seq_cst,
                                                          memory_order_relaxed);
        atomic_store_explicit(&d->bottom, b + 1, memory_order_relaxed);
        return won;
    }
    return 1;
}

/* Any thread. */
static int cl_steal(cldeque_t *d, int thief_cluster, int victim_cluster, range_t *out)
{
    int64_t t = atomic_load_explicit(&d->top, memory_order_acquire);
    atomic_thread_fence(memory_order_seq_cst);
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_acquire);
    if (t >= b)
        return 0;
    cl_array_t *a = atomic_load_explicit(&d->array, memory_order_acquire);
    slot_load(&a->buf[t & (a->size - 1)], out);
    if ((out->flags & ASYMO_RUN_CLUSTER_LOCAL) && thief_cluster != victim_cluster)
        return 0;
    return atomic_compare_exchange_strong_explicit(&d->top, &t, t + 1, memory_order_seq_cst,
                                                   memory_order_relaxed);
}

static void rq_clear(rqueue_t *q)
{
    q->head = q->count = 0;
    atomic_store(&q->pending, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* running tasks */

static inline void job_finish_tasks(job_t *j, int64_t k)
{
    if (atomic_fetch_sub_explicit(&j->remaining, k, memory_order_acq_rel) == k) {
        /* A syscall only when the submitter went to sleep. It may wake spuriously and return
         * before this wake: FUTEX_WAKE does not touch the memory, and every futex wait here
         * tolerates spurious wake-ups. */
        if (atomic_exchange_explicit(&j->done, 1, memory_order_acq_rel) == 2)
            futex_wake(&j->done, 1);
    }
}

static void run_range(worker_t *w, const range_t *r)
{
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
    counter_add(&w->busy_ns, dt);
    counter_add(&w->tasks_run, k);
    if (tls_helping)
        counter_add(&w->tasks_caller, k);
    if (r->origin >= 0) {
        counter_add(&w->tasks_stolen, k);
        counter_add(&w->stolen_from[r->origin], k);
    }
    /* adapt the chunk to the task length */
    if (w->chunk_seq == r->seq) {
        if (dt < CHUNK_TARGET_NS) {
            if (w->chunk < CHUNK_MAX)
                w->chunk *= 2;
        } else if (dt > 4 * CHUNK_TARGET_NS && w->chunk > 1) {
            w->chunk /= 2;
        }
    }
    job_finish_tasks(j, k);
}

/* ---- the worker queue: one interface over both queue kinds ---- */

/* Queued work at w, for choosing victims and shortest queues without locks: tasks for the
 * mutex queue; inbox tasks plus deque entries for the Chase-Lev queue. */
static inline int64_t wq_pending(const worker_t *w)
{
    int64_t n = atomic_load_explicit(&((worker_t *)w)->q.pending, memory_order_relaxed);
    if (w->pool->queue == ASYMO_QUEUE_CHASELEV)
        n += cl_size(&((worker_t *)w)->d);
    return n;
}

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
static void wq_push_own(worker_t *w, const range_t *r)
{
    if (w->pool->queue == ASYMO_QUEUE_CHASELEV) {
        cl_push_pieces(w, *r);
    } else if (rq_push_front(&w->q, r) != 0) {
        run_range(w, r); /* no memory to grow the queue: run it now */
    }
}

/* Owner: the next chunk to run. */
static int pop_own(worker_t *w, range_t *r)
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
    if (r->hi - r->lo > w->chunk) {
        range_t rest = *r;
        rest.lo = r->lo + w->chunk;
        r->hi = rest.lo;
        cl_push_pieces(w, rest);
    }
    return 1;
}

/* Thief w takes work queued at v. */
static int wq_steal(worker_t *w, worker_t *v, range_t *r)
{
    if (w->pool->queue == ASYMO_QUEUE_CHASELEV &&
        cl_steal(&v->d, w->cluster, v->cluster, r))
        return 1;
    return rq_steal_back(&v->q, w->cluster, v->cluster, r);
}

static inline int worker_active(const asymo_pool *p, const worker_t *w)
{
    return w->index < atomic_load_explicit(&p->limit, memory_order_relaxed);
}

static int steal_from(worker_t *w, worker_t *v)
{
    range_t r;
    if (!wq_steal(w, v, &r))
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

static int try_steal(asymo_pool *p, worker_t *w)
{
    if (!worker_active(p, w))
        return 0;
    switch (p->policy) {
    case ASYMO_POLICY_ASYMO:
        /* own cluster first (longest queue), then slower clusters, nearest first; a faster
         * cluster is never a victim */
        for (int c = w->cluster; c < p->nclusters; c++) {
            for (int attempt = 0; attempt < 2; attempt++) {
                worker_t *v = longest_queue(p, c, w);
                if (!v)
                    break;
                if (steal_from(w, v))
                    return 1;
            }
        }
        return 0;
    case ASYMO_POLICY_STEAL:
        for (int i = 1; i < p->nworkers; i++) {
            worker_t *v = &p->workers[(w->index + i) % p->nworkers];
            if (wq_pending(v) > 0 &&
                steal_from(w, v))
                return 1;
        }
        return 0;
    default:
        return 0;
    }
}

/* Shared policy: take tasks one by one from the first job in the pool's list that has any. */
static int run_shared(asymo_pool *p, worker_t *w)
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
    if (tls_helping)
        counter_add(&w->tasks_caller, ran);

    pthread_mutex_lock(&p->shared_lock);
    j->users--;
    pthread_mutex_unlock(&p->shared_lock);
    return 1;
}

static int find_and_run(asymo_pool *p, worker_t *w)
{
    range_t r;
    if (pop_own(w, &r)) {
        run_range(w, &r);
        return 1;
    }
    if (__atomic_load_n(&p->shared_head, __ATOMIC_ACQUIRE) && worker_active(p, w) &&
        run_shared(p, w))
        return 1;
    if (try_steal(p, w))
        return 1;
    return 0;
}

/* Act as worker w for one find_and_run, if no other thread does. Acquire/release on the
 * claim order everything one holder did as w before the next holder's work as w. */
static inline int claim_worker(worker_t *w)
{
    int expect = 0;
    return atomic_load_explicit(&w->claimed, memory_order_relaxed) == 0 &&
           atomic_compare_exchange_strong_explicit(&w->claimed, &expect, 1,
                                                   memory_order_acquire, memory_order_relaxed);
}

static inline void release_worker(worker_t *w)
{
    atomic_store_explicit(&w->claimed, 0, memory_order_release);
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

static void wake_workers(asymo_pool *p);

/* Submitter: run one piece of work as `w` (the worker pinned to the core the submitter is
 * on). Returns 1 if it ran something. */
static int help_as(asymo_pool *p, worker_t *w)
{
    if (!atomic_load_explicit(&p->caller_helps, memory_order_relaxed) || !worker_active(p, w) ||
        !claim_worker(w))
        return 0;
    tls_pool = p;
    tls_worker = w->index;
    tls_helping = 1;
    int r = find_and_run(p, w);
    tls_helping = 0;
    tls_worker = -1;
    tls_pool = NULL;
    release_worker(w);
    /* A range the submitter stole as w now waits in w's queue, and w's own thread may have
     * gone to sleep while the submitter held its identity. If the submitter is then moved to
     * another core it never comes back for that range: wake the owner (the same ordering as
     * submit: queue, then wake_seq, then sleepers). */
    if (wq_pending(w) > 0)
        wake_workers(p);
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

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    asymo_pool *p = w->pool;
    int pinned = w->cpu >= 0 && pin_self(w->cpu) == 0;
    atomic_store(&w->pinned, pinned);
    tls_pool = p;
    tls_worker = w->index;
    pthread_mutex_lock(&p->start_lock);
    p->nstarted++;
    pthread_cond_broadcast(&p->start_cond);
    pthread_mutex_unlock(&p->start_lock);
    worker_loop(p, w);
    return NULL;
}

static void wake_workers(asymo_pool *p)
{
    atomic_fetch_add(&p->wake_seq, 1);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake(&p->wake_seq, INT_MAX);
}

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

static int ensure_threads(asymo_pool *p)
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

static void zero_counters(worker_t *w)
{
    w->tasks_run = w->tasks_stolen = w->busy_ns = w->steals = w->tasks_inline = w->sleeps = 0;
    w->tasks_caller = 0;
    memset(w->stolen_from, 0, sizeof w->stolen_from);
    memset(&w->base, 0, sizeof w->base);
}

static void pool_reset_after_fork(asymo_pool *p)
{
    mutex_init_adaptive(&p->shared_lock);
    pthread_mutex_init(&p->life_lock, NULL);
    pthread_mutex_init(&p->start_lock, NULL);
    pthread_cond_init(&p->start_cond, NULL);
    pthread_mutex_init(&p->stats_lock, NULL);
    p->shared_head = NULL;
    atomic_store(&p->sleepers, 0);
    atomic_store(&p->stop, 0);
    atomic_store(&p->threads_alive, 0);
    for (int i = 0; i < p->nworkers; i++) {
        worker_t *w = &p->workers[i];
        mutex_init_adaptive(&w->q.lock);
        rq_clear(&w->q);
        atomic_store(&w->d.top, 0);
        atomic_store(&w->d.bottom, 0);
        w->thread_started = 0;
        atomic_store(&w->pinned, 0);
        atomic_store(&w->claimed, 0);
        zero_counters(w);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* public API */

static int default_queue(void)
{
    const char *env = getenv("ASYMO_POOL_QUEUE");
    if (env && strcmp(env, "mutex") == 0)
        return ASYMO_QUEUE_MUTEX;
    if (env && strcmp(env, "chaselev") == 0)
        return ASYMO_QUEUE_CHASELEV;
    return DEFAULT_QUEUE;
}

asymo_pool *asymo_pool_create(int nworkers, const int *cpus, const int *worker_cluster,
                              int nclusters, int policy, int *err)
{
    return asymo_pool_create_ex(nworkers, cpus, worker_cluster, nclusters, policy,
                                ASYMO_QUEUE_DEFAULT, err);
}

asymo_pool *asymo_pool_create_ex(int nworkers, const int *cpus, const int *worker_cluster,
                                 int nclusters, int policy, int queue, int *err)
{
    int e = ASYMO_EINVAL;
    asymo_pool *p = NULL;
    if (queue == ASYMO_QUEUE_DEFAULT)
        queue = default_queue();
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
    atomic_store(&p->caller_helps, 1);
    const char *helps = getenv("ASYMO_POOL_CALLER_HELPS");
    if (helps && strcmp(helps, "0") == 0)
        atomic_store(&p->caller_helps, 0);
    const char *env = getenv("ASYMO_POOL_SPIN_US");
    if (env && *env) {
        long v = strtol(env, NULL, 10);
        if (v >= 0 && v <= 1000000)
            atomic_store(&p->spin_us, (int)v);
    }
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
    pthread_once(&atfork_once, register_atfork);
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
    if (tls_pool == pool) {
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

int asymo_pool_current_worker(void) { return tls_worker; }

int asymo_pool_current_cluster(void)
{
    return tls_pool ? tls_pool->workers[tls_worker].cluster : -1;
}

const asymo_pool *asymo_pool_current(void) { return tls_pool; }

int asymo_pool_worker_of(const asymo_pool *pool)
{
    return pool && tls_pool == pool ? tls_worker : -1;
}

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
    int64_t deadline = now_ns() + SUBMIT_SPIN_NS;
    unsigned spins = 0;
    while (atomic_load_explicit(&j->done, memory_order_acquire) != 1) {
        /* help: run queued work as the worker of this core (see the top of this file) */
        worker_t *mine = worker_on_my_core(p);
        if (mine && help_as(p, mine)) {
            deadline = now_ns() + SUBMIT_SPIN_NS;
            continue;
        }
        if (now_ns() < deadline) {
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
        if (atomic_compare_exchange_strong(&j->done, &expect, 2) || expect == 2)
            futex_wait(&j->done, 2);
    }
}

/* task tracing (see asymo_pool_trace_start; defined at the end of this file) */
static _Atomic(asymo_pool *) trace_pool;
static int trace_run(asymo_pool *p, asymo_task_fn fn, void *ctx, int64_t ntasks,
                     const int64_t *counts);

int asymo_pool_run_flags(asymo_pool *pool, asymo_task_fn fn, void *ctx, int64_t ntasks,
                         const int64_t *cluster_counts, unsigned flags)
{
    if (!pool || !fn || ntasks < 0 || (flags & ~(unsigned)ASYMO_RUN_CLUSTER_LOCAL))
        return ASYMO_EINVAL;
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
    if (tls_pool) {
        /* nested: the calling worker already owns a core; queuing and waiting here could
         * deadlock, so run the job inline */
        worker_t *w = &tls_pool->workers[tls_worker];
        for (int64_t t = 0; t < ntasks; t++)
            fn(t, ctx);
        counter_add(&w->tasks_inline, ntasks);
        return ASYMO_OK;
    }
    if (atomic_load_explicit(&trace_pool, memory_order_acquire) == pool)
        return trace_run(pool, fn, ctx, ntasks, cluster_counts);
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

    if (pool->policy == ASYMO_POLICY_SHARED) {
        pthread_mutex_lock(&pool->shared_lock);
        job_t **link = &pool->shared_head;
        while (*link)
            link = &(*link)->shared_next;
        j.listed = 1;
        __atomic_store_n(link, &j, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&pool->shared_lock);
    } else {
        rc = submit_queues(pool, &j, cluster_counts);
        if (rc != ASYMO_OK)
            return rc; /* nothing was queued */
    }
    wake_workers(pool);
    wait_job(pool, &j);
    if (pool->policy == ASYMO_POLICY_SHARED) {
        /* unlink, then wait until no worker still holds a pointer to the job */
        pthread_mutex_lock(&pool->shared_lock);
        if (j.listed) {
            for (job_t **link = &pool->shared_head; *link;
                 link = &(*link)->shared_next)
                if (*link == &j) {
                    __atomic_store_n(link, j.shared_next, __ATOMIC_RELEASE);
                    break;
                }
            j.listed = 0;
        }
        while (j.users > 0) {
            pthread_mutex_unlock(&pool->shared_lock);
            sched_yield();
            pthread_mutex_lock(&pool->shared_lock);
        }
        pthread_mutex_unlock(&pool->shared_lock);
    }
    return rc;
}

int asymo_pool_run(asymo_pool *pool, asymo_task_fn fn, void *ctx, int64_t ntasks,
                   const int64_t *cluster_counts)
{
    return asymo_pool_run_flags(pool, fn, ctx, ntasks, cluster_counts, 0);
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
    }
    pthread_mutex_unlock(&pool->stats_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* diagnostic tasks */

void asymo_task_noop(int64_t task, void *ctx)
{
    (void)task;
    (void)ctx;
}

void asymo_task_count(int64_t task, void *ctx)
{
    __atomic_fetch_add(&((int32_t *)ctx)[task], 1, __ATOMIC_RELAXED);
}

void asymo_task_spin(int64_t task, void *ctx)
{
    int64_t n = *(const int64_t *)ctx;
    /* four independent dependency chains: bound by FP throughput/latency, not memory */
    double a = 1.0 + 1e-9 * (double)(task & 7), b = 1.0, c = 1.0, d = 1.0, e = 1.0;
    for (int64_t i = 0; i < n; i += 4) {
        b = b * a + 1e-9;
        c = c * a + 2e-9;
        d = d * a + 3e-9;
        e = e * a + 4e-9;
    }
    volatile double sink = b + c + d + e;
    (void)sink;
}

/* ------------------------------------------------------------------------------------------ */
/* task tracing: every job of the traced pool runs serially, timed task by task */

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
    if (atomic_load(&trace_pool)) {
        pthread_mutex_unlock(&trace_lock);
        return -4;
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
    atomic_store_explicit(&trace_pool, pool, memory_order_release);
    pthread_mutex_unlock(&trace_lock);
    return ASYMO_OK;
}

int64_t asymo_pool_trace_stop(asymo_pool *pool, int64_t *ntasks)
{
    pthread_mutex_lock(&trace_lock);
    if (!pool || atomic_load(&trace_pool) != pool) {
        pthread_mutex_unlock(&trace_lock);
        return ASYMO_EINVAL;
    }
    atomic_store_explicit(&trace_pool, NULL, memory_order_release);
    int64_t n = trace.overflow ? -5 : trace.njobs;
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
    tls_pool = p;
    tls_worker = w->index;
    int64_t t = now_ns();
    for (int64_t i = 0; i < ntasks; i++) {
        fn(i, ctx);
        const int64_t u = now_ns();
        if (times)
            times[i] = u - t;
        t = u;
    }
    tls_worker = -1;
    tls_pool = NULL;
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
