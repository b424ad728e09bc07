/* A submitter that is moved between cores while it helps (built by tests/test_pool_sanitized.py).
 *
 * The submitting thread is not pinned, so the core it runs on -- and with it the worker it acts
 * as while it waits -- can change between two looks. Here a second thread moves it between
 * cpu 0 and cpu 1 at random moments, workers sleep as soon as they find nothing (spin_us = 0)
 * and most tasks go to the slower cluster, so the submitter acting as the fast worker keeps
 * stealing ranges into that worker's queue. Every job must finish: a range left in the queue of
 * a sleeping worker that nobody wakes hangs the job (the caller's alarm then fails the run).
 *
 * usage: pool_migrate POLICY ITERATIONS */
#define _GNU_SOURCE
#include "asymo/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static asymo_pool *pool;
static volatile int done_submitting;
static volatile pid_t submitter_tid;

static void work(int64_t task, void *ctx)
{
    volatile double x = 0;
    for (int i = 0; i < 200 + (int)(task % 7) * 50; i++)
        x += i * 0.5;
    __atomic_fetch_add(&((int32_t *)ctx)[task], 1, __ATOMIC_RELAXED);
}

static void *mover(void *arg)
{
    unsigned seed = 12345;
    (void)arg;
    while (!__atomic_load_n(&done_submitting, __ATOMIC_RELAXED)) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(rand_r(&seed) % 2, &set);
        if (submitter_tid)
            sched_setaffinity(submitter_tid, sizeof set, &set);
        usleep(rand_r(&seed) % 200);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 64;
    int policy = atoi(argv[1]), iterations = atoi(argv[2]), err;
    int cpus[2] = {0, 1}, clusters[2] = {0, 1};
    pool = asymo_pool_create(2, cpus, clusters, 2, policy, ASYMO_QUEUE_MUTEX, &err);
    if (!pool) {
        fprintf(stderr, "create failed: %d\n", err);
        return 3;
    }
    asymo_pool_set_spin_us(pool, 0);
    submitter_tid = (pid_t)syscall(SYS_gettid);
    pthread_t th;
    pthread_create(&th, NULL, mover, NULL);
    unsigned seed = 7;
    for (int it = 0; it < iterations; it++) {
        int64_t n = 2 + rand_r(&seed) % 64;
        int32_t *c = calloc((size_t)n, sizeof *c);
        int64_t counts[2] = {n / 8, n - n / 8};
        if (asymo_pool_run(pool, work, c, n, counts, 0) != ASYMO_OK) {
            fprintf(stderr, "run failed\n");
            return 2;
        }
        for (int64_t i = 0; i < n; i++)
            if (c[i] != 1) {
                fprintf(stderr, "task %lld ran %d times\n", (long long)i, c[i]);
                return 1;
            }
        free(c);
    }
    __atomic_store_n(&done_submitting, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    asymo_pool_destroy(pool);
    printf("ok %d jobs\n", iterations);
    return 0;
}
