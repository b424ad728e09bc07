/* Task tracing (a lab tool, for the simulator's calibration: asymo.lab.sim.trace).
 *
 * Not part of the public API (include/asymo/ does not include it). It is compiled into the
 * runtime module all the same, because it takes over a live pool's jobs and acts as one of
 * its workers: it needs the pool's internals (csrc/pool/pool_internal.h) and the very pool
 * object Python holds, which a separately linked module could not share.
 *
 * While a trace of `pool` is on, every job submitted to it (outside a task) runs serially in
 * the submitting thread, tasks in id order, the thread acting as the first active worker of
 * cluster `as_cluster` (asymo_pool_current_worker/_cluster report that worker, whose scratch
 * it uses), and each task's duration is recorded: what one worker of that cluster takes for
 * each task of the job, on whatever core the caller is pinned to. Only one trace at a time,
 * process-wide. */
#ifndef ASYMO_LAB_TRACE_H
#define ASYMO_LAB_TRACE_H

#include <stdint.h>

#include "asymo/pool.h"

/* CDEF BEGIN */
typedef struct {
    int64_t ntasks;
    int64_t counts[8];        /* per-cluster task counts as submitted; all -1 when NULL */
    int64_t first;            /* index of the job's first task in the task_ns array */
    int64_t submit_ns;        /* when the job was submitted, ns since the trace started */
    int64_t done_ns;          /* when its last task returned */
    uint64_t fn;              /* task function address (identifies the kind of job) */
} asymo_trace_job;

/* Returns ASYMO_OK, ASYMO_EINVAL (bad arguments, or no active worker in as_cluster), or
 * ASYMO_EBUSY (a trace is already on). Buffers must stay valid until asymo_pool_trace_stop. */
int asymo_pool_trace_start(asymo_pool *pool, int as_cluster, asymo_trace_job *jobs,
                           int64_t max_jobs, int64_t *task_ns, int64_t max_tasks);
/* Ends the trace; returns the number of jobs recorded and sets *ntasks, or ASYMO_EOVERFLOW
 * when a buffer overflowed (the jobs still ran), or ASYMO_EINVAL when no trace of `pool` is
 * on. */
int64_t asymo_pool_trace_stop(asymo_pool *pool, int64_t *ntasks);
/* CDEF END */

#endif
