/* The asymmetry-aware thread pool: one pinned worker per core, tasks grouped per cluster.
 *
 * The pool knows nothing of GEMM: a job is `ntasks` calls of `fn(task, ctx)`; task ids
 * [0, counts[0]) belong to cluster 0 (the fastest), the next counts[1] ids to cluster 1, and
 * so on. Which worker runs a task is the policy's business (see ASYMO_POLICY_*).
 */
#ifndef ASYMO_POOL_H
#define ASYMO_POOL_H

#include <stdint.h>

/* CDEF BEGIN */
typedef void (*asymo_task_fn)(int64_t task, void *ctx);
typedef struct asymo_pool asymo_pool;

enum {
    ASYMO_POLICY_ASYMO = 0,  /* per-cluster split, shortest-queue submit, steal in cluster,
                                then faster may steal from slower; slower from faster only
                                one task of an ASYMO_RUN_BACKUP job at a time, from a queue
                                of as many tasks as the thief's time per task is of the
                                owner's (ASYMO_POOL_STEAL_UP_MIN when unmeasured, and at
                                most) */
    ASYMO_POLICY_EVEN = 1,   /* static equal split over all workers, no stealing */
    ASYMO_POLICY_SHARED = 2, /* one shared atomic counter, all workers take the next task */
    ASYMO_POLICY_STEAL = 3   /* equal split, stealing in any direction */
};

enum {
    ASYMO_OK = 0,
    ASYMO_EINVAL = -1,   /* bad argument */
    ASYMO_ENOMEM = -2,
    ASYMO_ETHREAD = -3,  /* a worker thread could not be started */
    ASYMO_EBUSY = -4,    /* a task trace is already on (lab/trace.h) */
    ASYMO_EOVERFLOW = -5 /* a trace buffer overflowed; the jobs still ran (lab/trace.h) */
};

/* Per-worker queue implementations (measured against each other by bench/pool_queues.py). */
enum {
    ASYMO_QUEUE_DEFAULT = -1, /* the built-in choice: the one measured faster (mutex) */
    ASYMO_QUEUE_MUTEX = 0,    /* short mutex-protected deque of task ranges */
    ASYMO_QUEUE_CHASELEV = 1  /* lock-free Chase-Lev deque of ranges, plus a submit inbox */
};

/* Job flags of asymo_pool_run. CLUSTER_LOCAL: no task leaves its cluster, even where the
 * policy would let a faster cluster steal it (pipeline stages pinned to one cluster). INLINE:
 * the calling thread runs every task itself, in order (a job too small to be worth waking
 * the workers; the plan decides).
 *
 * BACKUP: a task that another worker has been running far longer than the job's tasks take
 * (a worker stopped or preempted; asymo_pool_set_backup says how long) is run again by the
 * submitting thread, with the tasks that worker had taken but not begun; the job ends when
 * every task has finished once, and the late copy goes on running after asymo_pool_run
 * returns (a "superseded" task). So the tasks must be idempotent: each writes its outputs
 * once, with their final values, reads nothing the job writes, and keeps no state between
 * calls but per-thread scratch. The caller keeps `ctx` and every byte the tasks read or write
 * valid and unchanged until asymo_pool_fence(pool, s) returns for an s at or above the job's
 * number (asymo_pool_last_job() read after asymo_pool_run returns is one). Applies to the
 * asymo policy's jobs without CLUSTER_LOCAL, submitted from outside the pool's tasks; ignored
 * otherwise. */
enum { ASYMO_RUN_CLUSTER_LOCAL = 1, ASYMO_RUN_INLINE = 2, ASYMO_RUN_BACKUP = 4 };

/* Per-worker counters, accumulated since creation or the last reset. */
typedef struct {
    int cpu;                 /* core the worker is pinned to, -1 if unpinned */
    int cluster;
    int pinned;              /* 1 if pinning succeeded */
    int64_t tasks_run;
    int64_t tasks_stolen;    /* tasks run that were queued for another worker */
    int64_t stolen_from_cluster[8]; /* stolen tasks, by the victim's cluster index */
    int64_t busy_ns;         /* time spent inside task functions */
    /* fields added after the first contract */
    int64_t steals;          /* successful steal operations (each moves a range of tasks) */
    int64_t tasks_inline;    /* tasks of nested jobs this worker ran inline */
    int64_t sleeps;          /* times the worker went to sleep (futex wait) when idle */
    int64_t tasks_caller;    /* of tasks_run: run by a submitting thread acting as this worker
                                while it waited for its job (see asymo_pool_run) */
    int64_t tasks_backup;    /* of tasks_run: backups of tasks another worker was late with
                                (ASYMO_RUN_BACKUP) */
    int64_t tasks_superseded; /* tasks this worker finished after a backup had (not counted in
                                 tasks_run) */
} asymo_worker_stats;

/* Create a pool of `nworkers` workers; worker i is pinned to cpus[i] (or unpinned if
 * cpus[i] < 0) and belongs to cluster worker_cluster[i]. Clusters are numbered 0..nclusters-1,
 * fastest first. `queue` is an ASYMO_QUEUE_* kind. The pool reads no environment: callers
 * pass every setting (spin time and caller help have setters below). Returns NULL and sets
 * *err on failure. */
asymo_pool *asymo_pool_create(int nworkers, const int *cpus, const int *worker_cluster,
                              int nclusters, int policy, int queue, int *err);
void asymo_pool_destroy(asymo_pool *pool);

int asymo_pool_nworkers(const asymo_pool *pool);
int asymo_pool_nclusters(const asymo_pool *pool);
int asymo_pool_policy(const asymo_pool *pool);
int asymo_pool_queue(const asymo_pool *pool);
/* Cap the number of active workers (threadpoolctl); workers beyond the cap take no tasks. */
int asymo_pool_set_limit(asymo_pool *pool, int max_workers);
int asymo_pool_get_limit(const asymo_pool *pool);

/* Run a job and wait for it. cluster_counts has nclusters entries summing to ntasks, or is NULL
 * for an even split by worker count; `flags` is 0 or ASYMO_RUN_* bits. A job submitted from
 * inside a task (of any pool) runs inline on the calling worker. Several threads may submit
 * at once. While it waits, the submitting thread runs queued work as the worker pinned to
 * the core it is on (with that worker's identity: asymo_pool_current_worker/_cluster report
 * it, and never two threads act as one worker at once), taking tasks exactly as that worker
 * would under the policy. So it may run tasks of other submitters' jobs: a task must not
 * wait for something a submitting thread does only after its own job returns (as with TBB's
 * waiting threads). asymo_pool_set_caller_helps(pool, 0) turns helping off. The baseline
 * policies (even, shared, steal) validate cluster_counts but ignore it: they know no
 * clusters. Returns ASYMO_OK or an error code. */
int asymo_pool_run(asymo_pool *pool, asymo_task_fn fn, void *ctx, int64_t ntasks,
                   const int64_t *cluster_counts, unsigned flags);

/* asymo_run_job.wait values other than an index into the marks: no fence, or a fence for
 * every job so far */
enum { ASYMO_WAIT_NONE = -1, ASYMO_WAIT_ALL = -2 };

/* One job of asymo_pool_run_jobs: asymo_pool_run's arguments, and the fence before it. */
typedef struct {
    asymo_task_fn fn;              /* the task function */
    void *ctx;                     /* its context */
    int64_t ntasks;                /* the job's tasks */
    const int64_t *cluster_counts; /* per-cluster task counts, or NULL */
    unsigned flags;                /* ASYMO_RUN_* */
    int64_t wait;                  /* before the job, asymo_pool_fence(pool, marks[wait]) for
                                      wait >= 0, asymo_pool_fence(pool, UINT64_MAX) for
                                      ASYMO_WAIT_ALL; ASYMO_WAIT_NONE: none */
    int64_t mark;                  /* >= 0: marks[mark] = the last job number before this job
                                      (as the fence, or asymo_pool_last_job(), returns it);
                                      -1: none */
} asymo_run_job;

/* Runs jobs[0..n) in order, as n calls of asymo_pool_run would, each after its fence,
 * without returning to the caller between them: a model's run of dependent layers, where the
 * caller's code between jobs (an interpreter's, say) keeps every worker waiting. marks[0..
 * nmarks) hold job numbers the fences read and the marks write (NULL when no job waits on or
 * writes one); the caller may write some between two calls (steps it runs itself). A wait or
 * mark out of range is ASYMO_EINVAL before any job runs. Returns ASYMO_OK, or the first
 * failing job's code with its index in *failed (when failed is not NULL); the jobs after it
 * do not run. */
int asymo_pool_run_jobs(asymo_pool *pool, const asymo_run_job *jobs, int64_t n,
                        uint64_t *marks, int64_t nmarks, int64_t *failed);

/* Index of the calling pool worker (0..nworkers-1 of the pool it belongs to), or -1 when not
 * called from a worker. See asymo_pool_worker_of for jobs nested across pools. */
int asymo_pool_current_worker(void);
/* Cluster of the calling worker, or -1. */
int asymo_pool_current_cluster(void);

int asymo_pool_stats(const asymo_pool *pool, asymo_worker_stats *out, int n);
void asymo_pool_reset_stats(asymo_pool *pool);

/* How long an idle worker spins looking for work before it sleeps (microseconds). */
int asymo_pool_set_spin_us(asymo_pool *pool, int spin_us);
int asymo_pool_get_spin_us(const asymo_pool *pool);

/* How long a submitter that has nothing left to run polls its job before it sleeps on the
 * job's futex (microseconds, 0 to 1000000; a new pool: ASYMO_POOL_SUBMIT_SPIN_NS). Waking it
 * costs a futex wake and a reschedule on its core, tens of microseconds on some machines,
 * added to the job; a shorter poll gives the core back sooner (to other processes, or to save
 * energy). */
int asymo_pool_set_submit_spin_us(asymo_pool *pool, int spin_us);
int asymo_pool_get_submit_spin_us(const asymo_pool *pool);

/* Whether a submitting thread runs queued work as the worker of its core while it waits
 * (1, the default of a new pool) or only waits (0: every task runs on a pool thread). */
int asymo_pool_set_caller_helps(asymo_pool *pool, int on);
int asymo_pool_get_caller_helps(const asymo_pool *pool);

/* Whether a submitting thread that is on a core of a slower cluster moves to the fastest
 * cluster's cores for the job (1, the default of a new pool) or stays where it is (0). The
 * move narrows the thread's own affinity mask to the fastest cluster's cores it already
 * allows and restores the mask before asymo_pool_run returns; a thread that may not run there
 * (a pipeline stage pinned to a slower cluster) is not moved. It keeps the waiting, the help
 * and the wake-up at the end of the job on a big core: on a slow core all three are slower,
 * and on a core that stops (an emulated one) the job waits for it. No effect on one-cluster
 * pools, nested or inline jobs. */
int asymo_pool_set_caller_to_fastest(asymo_pool *pool, int on);
int asymo_pool_get_caller_to_fastest(const asymo_pool *pool);

/* The number of the last job submitted to the pool (by any thread); jobs are numbered from 1
 * in the order they are submitted. */
uint64_t asymo_pool_last_job(const asymo_pool *pool);
/* Wait until no worker runs a superseded task (ASYMO_RUN_BACKUP) of a job numbered `seq` or
 * lower; returns asymo_pool_last_job() as it was when called. */
uint64_t asymo_pool_fence(asymo_pool *pool, uint64_t seq);

/* When a submitter with nothing else to run backs up a task of an ASYMO_RUN_BACKUP job: once
 * the task has run `factor` times as long as the submitter's own tasks of the job take, and at
 * least min_ns (the worker has stopped); or at once when the running worker's own time per
 * task of the job says the task would end later than a fresh copy on the submitter's core
 * would (a core slower than its share assumed). Never before the submitter has run a task of
 * the job; factor 0: never (the job waits as any other). A new pool has
 * ASYMO_POOL_BACKUP_FACTOR and ASYMO_POOL_BACKUP_MIN_NS. */
int asymo_pool_set_backup(asymo_pool *pool, int factor, int64_t min_ns);
int asymo_pool_get_backup_factor(const asymo_pool *pool);
int64_t asymo_pool_get_backup_min_ns(const asymo_pool *pool);

/* The pool whose worker is calling, or NULL. */
const asymo_pool *asymo_pool_current(void);
/* Index of the calling thread among `pool`'s workers, or -1 if it is not one of them. A job
 * submitted from a task of another pool runs inline on that pool's worker, so per-worker
 * scratch of `pool` must be indexed with this, not asymo_pool_current_worker(). */
int asymo_pool_worker_of(const asymo_pool *pool);

/* Scheduling constants of the pool, here so that its model (asymo.lab.sim) reads them rather
 * than copying them. The owner grows its chunk while a chunk runs shorter than
 * CHUNK_TARGET_NS, so tiny tasks cost few queue operations and long tasks are taken one at a
 * time (and stay stealable), up to CHUNK_MAX tasks. A new pool's submitter polls its job
 * SUBMIT_SPIN_NS before sleeping (asymo_pool_set_submit_spin_us): long enough to cover the
 * other workers' tails of a network's jobs, so that the next job is not held up by the
 * submitter's wake-up, and no core is taken from a worker meanwhile (a submitter on a
 * worker's core runs that worker's work, or yields to its thread while it runs some). */
enum {
    ASYMO_POOL_CHUNK_TARGET_NS = 20000,
    ASYMO_POOL_CHUNK_MAX = 16777216,     /* 1 << 24 */
    ASYMO_POOL_SUBMIT_SPIN_NS = 1000000,
    ASYMO_POOL_BACKUP_FACTOR = 4,
    ASYMO_POOL_BACKUP_MIN_NS = 20000,
    ASYMO_POOL_STEAL_UP_MIN = 4
};

/* A job made of parts of other jobs, so that independent work (sibling branches of a network)
 * shares one submission and one wait, and each part's tasks fill the others' tails. Task t of
 * the multi-job is task parts[i].lo + (t - first[i]) of part i's job, for the last i with
 * first[i] <= t: first[0] = 0, ascending, nparts <= ASYMO_MULTI_MAX_PARTS. Run it with
 * asymo_pool_run(pool, asymo_multi_task, &multi, ntasks, counts, flags); its tasks must be
 * independent of one another, as every job's are. */
enum { ASYMO_MULTI_MAX_PARTS = 32 };
typedef struct {
    asymo_task_fn fn; /* the part's task function */
    void *ctx;        /* its context */
    int64_t lo;       /* the part's first task in its own job's numbering */
} asymo_job_part;
/* (the arrays' length is ASYMO_MULTI_MAX_PARTS written out: cffi's declarations take a
 * literal; multi.c checks that the two agree) */
typedef struct {
    int64_t nparts;           /* parts in use */
    int64_t first[32];        /* the multi-job's task id of each part's first task */
    asymo_job_part parts[32]; /* the parts */
} asymo_multi_job;
void asymo_multi_task(int64_t task, void *ctx);

/* Diagnostic tasks for tests, benchmarks and self-checks. */
void asymo_task_noop(int64_t task, void *ctx);
/* Atomically increments ((int32_t *)ctx)[task]. */
void asymo_task_count(int64_t task, void *ctx);
/* Runs *(const int64_t *)ctx dependent floating-point multiply-adds (2 FLOPs each). */
void asymo_task_spin(int64_t task, void *ctx);
/* CDEF END */

#endif
