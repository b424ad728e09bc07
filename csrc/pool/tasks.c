/* Diagnostic tasks for tests, benchmarks and self-checks (declared in asymo/pool.h). */
#include "asymo/pool.h"

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
