/* Asymmetry emulator: occupy one core for a fixed share of every short period.
 *
 * A thread that calls asymo_occupy_core() pins itself to `cpu`, raises itself to SCHED_FIFO
 * (or, in the approximate mode, to the lowest nice value it may use) and then, on a grid of
 * absolute deadlines `period_ns` apart, spins for `busy_fraction` of each period and sleeps for
 * the rest. Every other thread on that core then gets about `1 - busy_fraction` of it, whatever
 * library it runs. The call returns when `time_limit_s` has passed or the parent is gone; it is
 * meant to run in a helper process of its own (see asymo/lab/occupier.py). */
#ifndef ASYMO_EMULATE_H
#define ASYMO_EMULATE_H

#include <stdint.h>

/* CDEF BEGIN */
enum {
    ASYMO_OCCUPY_FIFO = 0,        /* SCHED_FIFO priority 1: preempts every SCHED_OTHER thread */
    ASYMO_OCCUPY_APPROXIMATE = 1  /* SCHED_OTHER at the lowest nice value permitted */
};

enum {
    ASYMO_OCCUPY_TIME_LIMIT = 0,  /* ran until time_limit_s */
    ASYMO_OCCUPY_PARENT_GONE = 1  /* parent_pid is no longer our parent */
};

typedef struct {
    int cpu;
    double busy_fraction;  /* share of each period spent spinning, in [0, 1) */
    int64_t period_ns;     /* length of one spin + sleep cycle */
    double time_limit_s;   /* hard limit on the whole run */
    int mode;              /* ASYMO_OCCUPY_FIFO or ASYMO_OCCUPY_APPROXIMATE */
    int parent_pid;        /* > 0: die with this parent (PR_SET_PDEATHSIG + getppid checks) */
    int ready_fd;          /* >= 0: one status line is written (then closed) once set up */
} asymo_occupy_params;

typedef struct {
    int64_t periods;       /* periods in which the helper spun */
    int64_t skipped;       /* periods skipped because the helper ran late */
    int64_t busy_ns;       /* wall time spent spinning; the core was taken from other
                            * threads for busy_ns + late_ns */
    int64_t elapsed_ns;    /* wall time from the first period to the return */
    int64_t late_ns;       /* summed delays from each deadline to the helper running */
    int nice;              /* nice value in effect (approximate mode) */
    int stop_reason;       /* ASYMO_OCCUPY_TIME_LIMIT or ASYMO_OCCUPY_PARENT_GONE */
} asymo_occupy_stats;

/* Runs the occupation loop in the calling thread. Returns 0 when it stopped normally (see
 * stats->stop_reason), or -errno when setting up failed: -EINVAL (bad parameters or cpu not
 * allowed), -EPERM (real-time scheduling refused), -ESRCH (parent already gone). The status
 * line written to ready_fd is "ok <mode> <detail>\n" or "error <step> <errno>\n".
 * `stats` may be NULL. */
int asymo_occupy_core(const asymo_occupy_params *params, asymo_occupy_stats *stats);
/* CDEF END */

#endif
