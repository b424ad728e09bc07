/* Cross-core transfer probe (lab/crosscore.h). */
#define _GNU_SOURCE
#include "lab/crosscore.h"
#include "pool/spin.h" /* now_ns */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPS 1000
#define MIN_BYTES 4096
#define MAX_BYTES (64ll << 20)

/* State both sides share; A writes in even steps, B in odd ones. */
typedef struct {
    int64_t *buf;
    int64_t words;
    int reps;
    _Atomic int step;
    _Atomic int failed; /* a side could not pin itself: both stop */
    int64_t *cross, *own; /* B's times per repetition */
    /* the line passed back and forth: A stores odd values, B even ones (its own line) */
    _Alignas(64) _Atomic int64_t ball;
    char pad[64 - sizeof(int64_t)];
    int64_t trip[ASYMO_ROUND_TRIP_BATCHES]; /* A's time per batch of round trips */
} probe_t;

/* One side: the shared state and the cpu it runs on. */
typedef struct {
    probe_t *p;
    int cpu;
    int err;
} side_t;

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* Whole lines written, as a kernel writes its outputs; the barrier keeps the compiler from
 * dropping a pass that the next one overwrites. */
static void write_pass(int64_t *buf, int64_t words, int64_t value)
{
    for (int64_t i = 0; i < words; i++)
        buf[i] = value + i;
    __asm__ volatile("" ::: "memory");
}

/* Wait for step `s` (or a failure); returns 0 on failure. */
static int await_step(probe_t *p, int s)
{
    while (atomic_load_explicit(&p->step, memory_order_acquire) != s)
        if (atomic_load_explicit(&p->failed, memory_order_relaxed))
            return 0;
    return 1;
}

/* Pin a side to its cpu; if it cannot be, tell the other side to stop. */
static int pin_side(side_t *me)
{
    if ((me->err = pin(me->cpu)) != 0) {
        atomic_store(&me->p->failed, 1);
        return 0;
    }
    return 1;
}

static void *side_b(void *arg)
{
    side_t *me = arg;
    probe_t *p = me->p;
    if (!pin_side(me))
        return NULL;
    for (int r = 0; r < p->reps; r++) {
        if (!await_step(p, 2 * r + 1))
            return NULL;
        int64_t t0 = now_ns();
        write_pass(p->buf, p->words, 2 * r);
        int64_t t1 = now_ns();
        write_pass(p->buf, p->words, 2 * r + 1);
        int64_t t2 = now_ns();
        p->cross[r] = t1 - t0;
        p->own[r] = t2 - t1;
        atomic_store_explicit(&p->step, 2 * r + 2, memory_order_release);
    }
    const int64_t n = (int64_t)ASYMO_ROUND_TRIP_BATCHES * ASYMO_ROUND_TRIP_PASSES;
    for (int64_t i = 0; i < n; i++) {
        while (atomic_load_explicit(&p->ball, memory_order_acquire) != 2 * i + 1)
            if (atomic_load_explicit(&p->failed, memory_order_relaxed))
                return NULL;
        atomic_store_explicit(&p->ball, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

static void *side_a(void *arg)
{
    side_t *me = arg;
    probe_t *p = me->p;
    if (!pin_side(me))
        return NULL;
    for (int r = 0; r < p->reps; r++) {
        if (!await_step(p, 2 * r))
            return NULL;
        write_pass(p->buf, p->words, -r);
        atomic_store_explicit(&p->step, 2 * r + 1, memory_order_release);
    }
    if (!await_step(p, 2 * p->reps))
        return NULL;
    int64_t i = 0;
    for (int b = 0; b < ASYMO_ROUND_TRIP_BATCHES; b++) {
        const int64_t t0 = now_ns();
        for (int k = 0; k < ASYMO_ROUND_TRIP_PASSES; k++, i++) {
            atomic_store_explicit(&p->ball, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&p->ball, memory_order_acquire) != 2 * i + 2)
                if (atomic_load_explicit(&p->failed, memory_order_relaxed))
                    return NULL;
        }
        p->trip[b] = now_ns() - t0;
    }
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int asymo_transfer_probe(int cpu_a, int cpu_b, int64_t nbytes, int reps,
                         asymo_transfer_result *out)
{
    if (!out || cpu_a < 0 || cpu_b < 0 || cpu_a == cpu_b || cpu_a >= CPU_SETSIZE ||
        cpu_b >= CPU_SETSIZE || nbytes < MIN_BYTES || nbytes > MAX_BYTES || reps < 1 ||
        reps > MAX_REPS)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    const int64_t words = nbytes / (int64_t)sizeof(int64_t);
    const size_t bytes = (size_t)words * sizeof(int64_t);
    int64_t *buf = aligned_alloc(64, bytes);
    int64_t *times = malloc(sizeof(int64_t) * 2 * (size_t)reps);
    if (!buf || !times) {
        free(buf);
        free(times);
        return -ENOMEM;
    }
    memset(buf, 0, bytes); /* fault the pages in before anything is timed */
    probe_t p = {.buf = buf, .words = words, .reps = reps, .cross = times,
                 .own = times + reps};
    side_t a = {&p, cpu_a, 0}, b = {&p, cpu_b, 0};
    pthread_t ta, tb;
    int rc = pthread_create(&tb, NULL, side_b, &b);
    if (rc == 0) {
        rc = pthread_create(&ta, NULL, side_a, &a);
        if (rc != 0)
            atomic_store(&p.failed, 1); /* B stops waiting */
        else
            pthread_join(ta, NULL);
        pthread_join(tb, NULL);
    }
    if (rc != 0)
        rc = -rc;
    else if (atomic_load(&p.failed))
        rc = -(a.err ? a.err : b.err ? b.err : EINVAL);
    else {
        qsort(p.cross, (size_t)reps, sizeof(int64_t), cmp_i64);
        qsort(p.own, (size_t)reps, sizeof(int64_t), cmp_i64);
        out->cross_ns = p.cross[reps / 2];
        out->own_ns = p.own[reps / 2];
        out->reps = reps;
        qsort(p.trip, ASYMO_ROUND_TRIP_BATCHES, sizeof(int64_t), cmp_i64);
        out->round_trip_ns = p.trip[ASYMO_ROUND_TRIP_BATCHES / 2] / ASYMO_ROUND_TRIP_PASSES;
        out->round_trip_min_ns = p.trip[0] / ASYMO_ROUND_TRIP_PASSES;
    }
    free(buf);
    free(times);
    return rc;
}
