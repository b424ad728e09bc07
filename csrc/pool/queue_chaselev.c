/* The lock-free Chase-Lev deque of task ranges (ASYMO_QUEUE_CHASELEV); see the
 * declaration of cldeque_t in pool_internal.h. */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include <stdlib.h>

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

int cl_init(cldeque_t *d)
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

void cl_free(cldeque_t *d)
{
    cl_array_t *a = atomic_load(&d->array);
    while (a) {
        cl_array_t *next = a->retired;
        free(a);
        a = next;
    }
    atomic_store(&d->array, NULL);
}

/* Owner only. */
int cl_push(cldeque_t *d, const range_t *r)
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
int cl_take(cldeque_t *d, range_t *out)
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
int cl_steal(cldeque_t *d, int thief_cluster, int victim_cluster, range_t *out)
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
