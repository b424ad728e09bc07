/* One pool job made of parts of other jobs (asymo_multi_task, asymo/pool.h). */
#include "asymo/pool.h"

_Static_assert(sizeof(((asymo_multi_job *)0)->first) / sizeof(int64_t) == ASYMO_MULTI_MAX_PARTS
                   && sizeof(((asymo_multi_job *)0)->parts) / sizeof(asymo_job_part)
                          == ASYMO_MULTI_MAX_PARTS,
               "asymo_multi_job's arrays hold ASYMO_MULTI_MAX_PARTS parts");

void asymo_multi_task(int64_t task, void *ctx)
{
    const asymo_multi_job *m = (const asymo_multi_job *)ctx;
    /* the last part whose first task is at or before `task` (first[] ascends) */
    int64_t lo = 0, hi = m->nparts - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (m->first[mid] <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    const asymo_job_part *p = &m->parts[lo];
    p->fn(p->lo + (task - m->first[lo]), p->ctx);
}
