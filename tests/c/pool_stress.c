/* Stress test of the pool's C core, built by tests/test_pool_sanitized.py with
 * -fsanitize=thread: several threads submit jobs of random sizes and splits at once to a pool
 * with more workers than cores and two clusters; every task must run exactly once. Submitters
 * help while they wait (acting as the worker of their core): every task also touches its
 * worker's scratch slot without atomics, so two threads acting as one worker at once would
 * be a data race ThreadSanitizer reports.
 *
 * usage: pool_stress QUEUE POLICY ITERATIONS */
#include "asymo/pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static asymo_pool *pool;
static int iterations;

/* per-worker scratch, plain memory: only the thread acting as worker w may touch slot w */
static struct {
    int64_t uses;
    char pad[56];
} scratch[4];

static void count(int64_t task, void *ctx)
{
    int w = asymo_pool_current_worker();
    if (w < 0 || w >= 4 || asymo_pool_current() != pool) {
        fprintf(stderr, "task %lld ran outside a worker identity (%d)\n", (long long)task, w);
        exit(4);
    }
    scratch[w].uses++;
    __atomic_fetch_add(&((int32_t *)ctx)[task], 1, __ATOMIC_RELAXED);
}

static void nested(int64_t task, void *ctx)
{
    /* a job submitted from a task runs inline */
    int32_t *c = (int32_t *)ctx + task * 4;
    if (asymo_pool_run(pool, count, c, 4, NULL, 0) != ASYMO_OK)
        abort();
}

static void *submitter(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int it = 0; it < iterations; it++) {
        int64_t n = rand_r(&seed) % 2000;
        int32_t *c = calloc((size_t)n * 4 + 1, sizeof *c);
        int64_t counts[2] = {n * (rand_r(&seed) % 4) / 3, 0};
        if (counts[0] > n)
            counts[0] = n;
        counts[1] = n - counts[0];
        int kind = it % 3;
        int rc = kind == 2 ? asymo_pool_run(pool, nested, c, n, counts, 0)
                           : asymo_pool_run(pool, count, c, n, kind ? counts : NULL,
                                            kind ? ASYMO_RUN_CLUSTER_LOCAL : 0);
        if (rc != ASYMO_OK) {
            fprintf(stderr, "run failed: %d\n", rc);
            exit(2);
        }
        int64_t m = kind == 2 ? n * 4 : n;
        for (int64_t i = 0; i < m; i++)
            if (c[i] != 1) {
                fprintf(stderr, "task %lld ran %d times (n=%lld kind=%d)\n", (long long)i,
                        c[i], (long long)n, kind);
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
    int queue = atoi(argv[1]), policy = atoi(argv[2]), err;
    iterations = atoi(argv[3]);
    int cpus[4] = {0, 1, -1, -1}, clusters[4] = {0, 0, 1, 1};
    pool = asymo_pool_create(4, cpus, clusters, 2, policy, queue, &err);
    if (!pool) {
        fprintf(stderr, "create failed: %d\n", err);
        return 3;
    }
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, submitter, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    asymo_worker_stats st[4];
    int64_t total = 0, by_callers = 0;
    asymo_pool_stats(pool, st, 4);
    for (int i = 0; i < 4; i++) {
        total += st[i].tasks_run + st[i].tasks_inline;
        by_callers += st[i].tasks_caller;
    }
    asymo_pool_destroy(pool);
    printf("ok %lld tasks, %lld run by submitters\n", (long long)total, (long long)by_callers);
    return 0;
}
