/* Backup tasks (ASYMO_RUN_BACKUP) of the pool's C core, built by
 * tests/test_pool_sanitized.py with -fsanitize=thread and with -fsanitize=address: worker 1
 * (the slower cluster's) stops for STALL_NS in one task of every third job, as a core taken
 * away would (when it gets one: the submitter may have taken them all). The submitter must run that task again and return without waiting for the stop;
 * the late copy must keep to the job's memory until asymo_pool_fence lets it go (the job's
 * context is freed right after the fence: a late write after it is a use after free).
 *
 * Tasks write their outputs with relaxed atomic stores: a backup and its late copy write the
 * same values to the same place, which plain stores would make a data race in C11's terms.
 *
 * usage: pool_backup QUEUE SUBMITTERS JOBS; prints "ok JOBS jobs, B backups, S superseded,
 * E early, T stalled" (E: jobs that returned while their late copy still ran; T: jobs whose
 * task worker 1 stopped in). */
#include "asymo/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NTASKS 64
#define STALL_NS 20000000L
#define SPIN_FLOPS 4000

typedef struct {
    int64_t id;
    int64_t stall_task;      /* the task worker 1 stops in, -1 for none */
    _Atomic int stalled;     /* the stop happens once */
    _Atomic int in_flight;   /* copies of tasks running */
    _Atomic int32_t runs[NTASKS];
    int64_t out[NTASKS];
} job_ctx;

static asymo_pool *pool;
static int jobs_per_thread;
static _Atomic int64_t early, stalled;

static void task(int64_t t, void *ctx_)
{
    job_ctx *c = ctx_;
    atomic_fetch_add(&c->in_flight, 1);
    int64_t flops = SPIN_FLOPS;
    asymo_task_spin(t, &flops);
    if (t == c->stall_task && asymo_pool_current_worker() == 1 &&
        atomic_exchange(&c->stalled, 1) == 0) {
        atomic_fetch_add(&stalled, 1);
        struct timespec ts = {0, STALL_NS};
        nanosleep(&ts, NULL);
    }
    __atomic_store_n(&c->out[t], c->id * NTASKS + t, __ATOMIC_RELAXED);
    atomic_fetch_add(&c->runs[t], 1);
    atomic_fetch_sub(&c->in_flight, 1);
}

static void *submitter(void *arg)
{
    int64_t base = (int64_t)(uintptr_t)arg * 1000000;
    for (int it = 0; it < jobs_per_thread; it++) {
        job_ctx *c = calloc(1, sizeof *c);
        c->id = base + it;
        c->stall_task = it % 3 == 0 ? NTASKS / 2 : -1;
        int64_t counts[2] = {NTASKS / 2, NTASKS - NTASKS / 2};
        int rc = asymo_pool_run(pool, task, c, NTASKS, counts, ASYMO_RUN_BACKUP);
        if (rc != ASYMO_OK) {
            fprintf(stderr, "run failed: %d\n", rc);
            exit(2);
        }
        if (atomic_load(&c->in_flight) > 0)
            atomic_fetch_add(&early, 1);
        for (int64_t t = 0; t < NTASKS; t++) /* every output is there when the job returns */
            if (atomic_load(&c->runs[t]) < 1 ||
                __atomic_load_n(&c->out[t], __ATOMIC_RELAXED) != c->id * NTASKS + t) {
                fprintf(stderr, "job %lld task %lld missing at return\n", (long long)c->id,
                        (long long)t);
                exit(1);
            }
        asymo_pool_fence(pool, asymo_pool_last_job(pool));
        if (atomic_load(&c->in_flight) != 0) {
            fprintf(stderr, "job %lld: a late copy still ran after the fence\n",
                    (long long)c->id);
            exit(1);
        }
        for (int64_t t = 0; t < NTASKS; t++)
            if (atomic_load(&c->runs[t]) > 2) { /* a task and at most one backup */
                fprintf(stderr, "job %lld task %lld ran %d times\n", (long long)c->id,
                        (long long)t, atomic_load(&c->runs[t]));
                exit(1);
            }
        free(c);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 64;
    int queue = atoi(argv[1]), nsub = atoi(argv[2]), err;
    jobs_per_thread = atoi(argv[3]) / (nsub > 0 ? nsub : 1);
    int cpus[2] = {0, 1}, clusters[2] = {0, 1};
    pool = asymo_pool_create(2, cpus, clusters, 2, ASYMO_POLICY_ASYMO, queue, &err);
    if (!pool) {
        fprintf(stderr, "create failed: %d\n", err);
        return 3;
    }
    pthread_t th[8];
    for (int i = 0; i < nsub && i < 8; i++)
        pthread_create(&th[i], NULL, submitter, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < nsub && i < 8; i++)
        pthread_join(th[i], NULL);
    asymo_worker_stats st[2];
    asymo_pool_stats(pool, st, 2);
    asymo_pool_destroy(pool);
    printf("ok %d jobs, %lld backups, %lld superseded, %lld early, %lld stalled\n",
           jobs_per_thread * nsub, (long long)(st[0].tasks_backup + st[1].tasks_backup),
           (long long)(st[0].tasks_superseded + st[1].tasks_superseded), (long long)early,
           (long long)stalled);
    return 0;
}
