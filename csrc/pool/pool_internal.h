/* The pool's internals, shared by the files of csrc/pool/ (and by csrc/lab/trace.c, which
 * acts as a worker). Not installed, not seen by cffi.
 *
 * One worker per core, pinned. Each worker owns a queue of task ranges [lo, hi) (a range is
 * a slice of one job's task ids, so a million-task job costs a handful of queue entries).
 * The owner takes chunks from the front of its first range; a thief takes half of the last
 * range. Policies differ only in where a job's ranges are queued and who may steal from whom
 * (policy.c). Files:
 *
 *   lifecycle.c       create / destroy, thread start and stop, settings, statistics
 *   run.c             submitting a job, waiting for it (and helping), the worker loop
 *   policy.c          the four policies: where a job's ranges go, who steals from whom,
 *                     the shared-counter policy
 *   worker_queue.c    one interface over the two queue kinds
 *   queue_mutex.c     the mutex-protected ring of ranges (also the Chase-Lev kind's inbox)
 *   queue_chaselev.c  the lock-free Chase-Lev deque of ranges
 *   backup.c          ASYMO_RUN_BACKUP: publishing the running task, running a late one
 *                     again, the fence
 *   fork.c            the registry of live pools and the fork handlers
 *   tasks.c           diagnostic tasks
 *   multi.c           asymo_multi_task: one job made of parts of others
 */
#ifndef ASYMO_POOL_INTERNAL_H
#define ASYMO_POOL_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>
#include <sys/syscall.h>

#include "asymo/pool.h"

/* Symbols shared between the pool's files but not part of the library's interface. */
#define POOL_INTERNAL __attribute__((visibility("hidden")))

#define MAX_CLUSTERS 8
#define MAX_WORKERS 4096
#define CACHELINE 64
#define DEFAULT_SPIN_US 200
/* Chunk growth and stealing up: ASYMO_POOL_* in asymo/pool.h (the simulator reads them from
 * there, and the submitter's default spin). */
#define CHUNK_TARGET_NS ((int64_t)ASYMO_POOL_CHUNK_TARGET_NS)
#define CHUNK_MAX ((int64_t)ASYMO_POOL_CHUNK_MAX)
#define STEAL_UP_MIN ((int64_t)ASYMO_POOL_STEAL_UP_MIN)
/* The longest a submitter of a backup job sleeps before it looks for late tasks again. */
#define BACKUP_RECHECK_NS 200000
/* Spinning threads yield the core every this many polling rounds (16 pauses each). */
#define YIELD_EVERY 8
/* The queue kind ASYMO_QUEUE_DEFAULT stands for; chosen by measurement
 * (bench/pool_queues.py). */
#define DEFAULT_QUEUE ASYMO_QUEUE_MUTEX

/* ------------------------------------------------------------------------------------------ */
/* jobs and ranges */

/* One submitted job. It lives on the submitter's stack for the duration of asymo_pool_run. */
typedef struct job {
    asymo_task_fn fn;          /* the task function */
    void *ctx;                 /* its context argument */
    int64_t ntasks;            /* task ids are [0, ntasks) */
    unsigned flags;            /* ASYMO_RUN_* */
    uint64_t seq;              /* the pool's job number (job addresses are reused) */
    _Atomic int64_t remaining; /* tasks not finished yet */
    _Atomic uint32_t done;     /* futex word: 0 running, 2 submitter asleep, 1 done */
    /* shared policy only */
    _Atomic int64_t next;      /* the one shared counter: next task id to take */
    int users;                 /* workers holding a pointer to this job; under shared_lock */
    int listed;                /* still in the pool's shared list; under shared_lock */
    struct job *shared_next;   /* next job of the pool's shared list */
} job_t;

/* A slice [lo, hi) of one job's task ids, the unit every queue holds. */
typedef struct {
    job_t *job;     /* the job the tasks belong to */
    int64_t lo;     /* first task id */
    int64_t hi;     /* one past the last task id */
    int origin;     /* -1: queued here by the submitter; c >= 0: stolen from a cluster-c worker */
    unsigned flags; /* the job's flags, copied so thieves never dereference `job` to decide */
    uint64_t seq;   /* the job's number: job addresses are reused (submitters' stacks) */
} range_t;

/* A short mutex-protected deque of ranges (ring buffer). `pending` mirrors the number of
 * queued tasks so victims and shortest queues can be chosen without taking locks. */
typedef struct {
    pthread_mutex_t lock;    /* guards items, head and count */
    range_t *items;          /* ring of cap slots */
    int cap;                 /* slots in items (grows by doubling) */
    int head;                /* slot of the front range */
    int count;               /* ranges queued (some may have been emptied by thieves) */
    _Atomic int64_t pending; /* tasks queued, readable without the lock */
} rqueue_t;

/* A Chase-Lev work-stealing deque (Le, Pop, Cohen, Zappa Nardelli, PPoPP 2013) of ranges:
 * the owner pushes and takes at the bottom without locks, thieves take the top with one CAS.
 * Slots hold ranges by value (read field by field with relaxed atomics; a thief's copy is only
 * used when its CAS on `top` succeeds). Arrays are grown by the owner; retired arrays are
 * kept until the pool is destroyed because a thief may still be reading one. */
typedef struct cl_array {
    int64_t size;              /* slots, a power of two */
    struct cl_array *retired;  /* the smaller array this one replaced (freed at destroy) */
    range_t buf[];             /* slot i & (size - 1) holds logical entry i */
} cl_array_t;

typedef struct {
    _Atomic int64_t top __attribute__((aligned(CACHELINE)));    /* next entry thieves take */
    _Atomic int64_t bottom __attribute__((aligned(CACHELINE))); /* next entry the owner pushes */
    cl_array_t *_Atomic array; /* the current slot array */
} cldeque_t;

/* One worker: a pinned thread, its queue, and its counters. */
typedef struct worker {
    struct asymo_pool *pool; /* the pool it belongs to */
    pthread_t thread;        /* its thread, valid while thread_started */
    int index;               /* position in pool->workers */
    int cpu;                 /* core it is pinned to, -1 for none */
    int cluster;             /* cluster index, 0 = fastest */
    int thread_started;      /* 1 between pthread_create and pthread_join; under life_lock */
    _Atomic int pinned;      /* 1 once pinning to `cpu` succeeded */
    _Atomic int running;     /* inside a task: a thread sharing this core should stay off it */
    _Atomic int claimed;     /* 1 while a thread (the worker's own or a submitter) acts as it */
    /* QUEUE_MUTEX: q is the worker's queue. QUEUE_CHASELEV: q is the inbox submitters fill
     * (the owner moves its ranges into d, thieves may take from both). */
    rqueue_t q;
    cldeque_t d;
    /* scheduling state private to whoever acts as the worker (see `claimed`) */
    uint64_t chunk_seq;      /* job the chunk size was learnt on */
    int64_t chunk;           /* tasks the owner takes at once from its front range */
    /* The task it runs of an ASYMO_RUN_BACKUP job (backup.c), read by that job's submitter.
     * bk_state is (tag << 2) | BK_IDLE, BK_RUNNING or BK_TAKEN; the other fields describe
     * the range of tag, written while the state is BK_IDLE, before the tag's BK_RUNNING. */
    _Atomic uint64_t bk_state __attribute__((aligned(CACHELINE)));
    _Atomic uint64_t bk_seq;     /* the job's number */
    _Atomic int64_t bk_lo;       /* the task running */
    _Atomic int64_t bk_hi;       /* one past the last task taken (lo + 1 .. hi - 1 not begun) */
    _Atomic int64_t bk_start_ns; /* when task lo began */
    uint64_t bk_tag;             /* last tag used; private to whoever acts as the worker */
    /* the time per task of its last ASYMO_RUN_BACKUP job (the submitter's backup limit) */
    _Atomic uint64_t est_seq;
    _Atomic int64_t est_ns, est_tasks;
    /* counters: written by the thread acting as this worker only (see asymo_worker_stats) */
    int64_t tasks_run;
    int64_t tasks_stolen;
    int64_t stolen_from[MAX_CLUSTERS];
    int64_t busy_ns;
    int64_t steals;
    int64_t tasks_inline;
    int64_t sleeps;
    int64_t tasks_caller;
    int64_t tasks_backup;
    int64_t tasks_superseded;
    /* counter values at the last reset (under pool->stats_lock) */
    asymo_worker_stats base;
} __attribute__((aligned(CACHELINE))) worker_t;

struct asymo_pool {
    int nworkers;                       /* workers, one per core */
    int nclusters;                      /* clusters, 0 = fastest */
    int policy;                         /* ASYMO_POLICY_* */
    int queue;                          /* ASYMO_QUEUE_MUTEX or ASYMO_QUEUE_CHASELEV */
    worker_t *workers;                  /* nworkers entries, cache-line aligned */
    int *cluster_workers[MAX_CLUSTERS]; /* worker indices of each cluster, ascending */
    int *cpu_worker;                    /* cpu -> index of the worker pinned there, or -1 */
    int ncpu_map;                       /* entries of cpu_worker */
    int cluster_nw[MAX_CLUSTERS];       /* workers of each cluster */
    _Atomic int limit;                  /* workers [0, limit) are active (threadpoolctl cap) */
    _Atomic int spin_us;                /* idle workers spin this long before sleeping */
    _Atomic int submit_spin_us;         /* a submitter out of work polls its job this long
                                         * before it sleeps (run.c: wait_job) */
    _Atomic int caller_helps;           /* submitters run work while they wait (run.c) */
    _Atomic int caller_to_fastest;      /* a submitter on a slower cluster's core moves to the
                                         * fastest cluster's cores for its job (run.c) */
    _Atomic int64_t backup_factor;      /* backup tasks (backup.c): a task is run again after
                                         * this many times the job's time per task, 0: never */
    _Atomic int64_t backup_min_ns;      /* ... and no sooner than this */
    cpu_set_t fastest_cpus;             /* cores of cluster 0's pinned workers */
    _Atomic uint64_t job_seq;           /* last job number handed out */

    _Atomic uint32_t wake_seq __attribute__((aligned(CACHELINE))); /* futex idle workers
                                                                     * sleep on; bumped on
                                                                     * every submit */
    _Atomic int sleepers;               /* workers asleep (or about to be) on wake_seq */
    _Atomic int stop;                   /* 1: workers exit their loop */

    pthread_mutex_t shared_lock __attribute__((aligned(CACHELINE))); /* the shared list */
    job_t *shared_head; /* shared policy: jobs with tasks left; written under shared_lock,
                         * read with atomic loads */

    pthread_mutex_t life_lock;          /* thread (re)spawn */
    _Atomic int threads_alive;          /* workers are running (0 after a fork until a job) */
    pthread_mutex_t start_lock;         /* with start_cond: wait for workers to start */
    pthread_cond_t start_cond;
    int nstarted;                       /* workers started so far; under start_lock */

    pthread_mutex_t stats_lock;         /* asymo_pool_stats against asymo_pool_reset_stats */

    struct asymo_pool *reg_prev;        /* registry of live pools (fork.c) */
    struct asymo_pool *reg_next;
};

/* The calling thread's worker identity: set in a worker thread for its life, and in a
 * submitting (or tracing) thread while it acts as a worker. */
extern __thread asymo_pool *pool_tls_pool POOL_INTERNAL;
extern __thread int pool_tls_worker POOL_INTERNAL;
extern __thread int pool_tls_helping POOL_INTERNAL; /* a submitter acting as pool_tls_worker */

/* A lab tool (csrc/lab/trace.c) may take over every job submitted to one pool: when
 * pool_intercepted is that pool, asymo_pool_run hands the job to pool_intercept_run instead
 * of queuing it. Set the function before the pool (release), clear the pool first. */
typedef int (*pool_intercept_fn)(asymo_pool *p, asymo_task_fn fn, void *ctx, int64_t ntasks,
                                 const int64_t *counts);
extern _Atomic(asymo_pool *) pool_intercepted POOL_INTERNAL;
extern _Atomic(pool_intercept_fn) pool_intercept_run POOL_INTERNAL;

/* ------------------------------------------------------------------------------------------ */
/* small helpers */

#include "pool/spin.h" /* now_ns, cpu_relax */

static inline void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

/* futex_wait that returns after ns nanoseconds at the latest */
static inline void futex_wait_ns(_Atomic uint32_t *addr, uint32_t expected, int64_t ns)
{
    const struct timespec t = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, &t, NULL, 0);
}

static inline void futex_wake(_Atomic uint32_t *addr, int n)
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

/* k tasks of j are done; the last ones wake the submitter. */
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

static inline int worker_active(const asymo_pool *p, const worker_t *w)
{
    return w->index < atomic_load_explicit(&((asymo_pool *)p)->limit, memory_order_relaxed);
}

/* Act as worker w, if no other thread does. Acquire/release on the claim order everything
 * one holder did as w before the next holder's work as w. */
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

static inline int64_t cl_size(cldeque_t *d)
{
    int64_t n = atomic_load_explicit(&d->bottom, memory_order_relaxed) -
                atomic_load_explicit(&d->top, memory_order_relaxed);
    return n > 0 ? n : 0;
}

/* Queued work at w, for choosing victims and shortest queues without locks: tasks for the
 * mutex queue; inbox tasks plus deque entries for the Chase-Lev queue. */
static inline int64_t wq_pending(const worker_t *w)
{
    int64_t n = atomic_load_explicit(&((worker_t *)w)->q.pending, memory_order_relaxed);
    if (w->pool->queue == ASYMO_QUEUE_CHASELEV)
        n += cl_size(&((worker_t *)w)->d);
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* queue_mutex.c */
POOL_INTERNAL void mutex_init_adaptive(pthread_mutex_t *m);
POOL_INTERNAL int rq_init(rqueue_t *q);
POOL_INTERNAL void rq_free(rqueue_t *q);
POOL_INTERNAL void rq_clear(rqueue_t *q);
POOL_INTERNAL int rq_push_back(rqueue_t *q, const range_t *r);
POOL_INTERNAL int rq_push_front(rqueue_t *q, const range_t *r);
POOL_INTERNAL int rq_pop_front(rqueue_t *q, uint64_t *chunk_seq, int64_t *chunk, range_t *out);
POOL_INTERNAL int rq_steal_back(rqueue_t *q, int thief_cluster, int victim_cluster,
                                range_t *out);
POOL_INTERNAL int rq_take_front(rqueue_t *q, range_t *out);
POOL_INTERNAL int rq_steal_one_backup(rqueue_t *q, int64_t min_pending, range_t *out);

/* queue_chaselev.c */
POOL_INTERNAL int cl_init(cldeque_t *d);
POOL_INTERNAL void cl_free(cldeque_t *d);
POOL_INTERNAL int cl_push(cldeque_t *d, const range_t *r);
POOL_INTERNAL int cl_take(cldeque_t *d, range_t *out);
POOL_INTERNAL int cl_steal(cldeque_t *d, int thief_cluster, int victim_cluster, range_t *out);

/* worker_queue.c */
POOL_INTERNAL void wq_push_own(worker_t *w, const range_t *r);
POOL_INTERNAL int wq_pop_own(worker_t *w, range_t *r);
POOL_INTERNAL int wq_steal(worker_t *w, worker_t *v, range_t *r);
POOL_INTERNAL int wq_steal_up(worker_t *w, worker_t *v, range_t *r);

/* policy.c */
POOL_INTERNAL int policy_submit(asymo_pool *p, job_t *j, const int64_t *counts);
POOL_INTERNAL void policy_job_done(asymo_pool *p, job_t *j);
POOL_INTERNAL int policy_try_steal(asymo_pool *p, worker_t *w);
POOL_INTERNAL int policy_may_take(const asymo_pool *p, const worker_t *w, int cluster,
                                  unsigned flags);
POOL_INTERNAL int policy_run_shared(asymo_pool *p, worker_t *w);

/* run.c */
POOL_INTERNAL void run_range(worker_t *w, const range_t *r);
POOL_INTERNAL void adapt_chunk(worker_t *w, const range_t *r, int64_t dt);
POOL_INTERNAL void count_tasks(worker_t *w, const range_t *r, int64_t k, int64_t dt);
POOL_INTERNAL void wake_workers(asymo_pool *p);
POOL_INTERNAL void *worker_main(void *arg);

/* backup.c */
POOL_INTERNAL void run_range_backup(worker_t *w, const range_t *r);
POOL_INTERNAL int backup_late_tasks(asymo_pool *p, worker_t *mine, job_t *j);
POOL_INTERNAL int job_has_late_candidates(const asymo_pool *p, const worker_t *mine,
                                          const job_t *j);

/* lifecycle.c */
POOL_INTERNAL int ensure_threads(asymo_pool *p);
POOL_INTERNAL void zero_counters(worker_t *w);

/* fork.c */
POOL_INTERNAL void registry_add(asymo_pool *p);
POOL_INTERNAL void registry_remove(asymo_pool *p);

#endif
