/* Cross-core transfer probe: what it costs one core to write cache lines another core holds.
 *
 * Work split between cores moves data between them: a consumer reads what a producer wrote,
 * and a buffer written by one core in one layer is written by another in the next. Each such
 * line is a transfer between the cores' caches, and its cost is a property of the machine at
 * that moment: across clusters of a big.LITTLE CPU it is higher than within one, and on a
 * virtual machine it changes when the host moves the vCPUs (docs/emulation.md, "the VM's slow
 * state"). Benchmarks record it beside their figures (asymo.cli.bench_model).
 *
 * asymo_transfer_probe() starts two threads pinned to cpu_a and cpu_b. In each repetition A
 * writes a buffer of `nbytes` (its lines now modified in A's caches), then B writes the same
 * buffer twice: the first pass takes every line from A, the second writes lines B already
 * holds. The medians over the repetitions are returned; their ratio is the cost of a line
 * written across the cores relative to one written locally. Then the two threads pass one
 * cache line back and forth (each waits for the other's store, then stores): the round trip
 * is the latency of a line moving between the cores and back, about twice the distance
 * between their caches (on the development VM, 50-90 ns while its two vCPUs share a
 * last-level cache and 310-360 ns while the host runs them on cores that do not, where the
 * buffer's ratio moves only from about 1.6x to 5x). The threads are joined before the call
 * returns; the caller's own affinity is never changed. */
#ifndef ASYMO_CROSSCORE_H
#define ASYMO_CROSSCORE_H

#include <stdint.h>

/* CDEF BEGIN */
typedef struct {
    int64_t cross_ns;  /* median time for B to write the buffer A had just written */
    int64_t own_ns;    /* median time for B to write it again (lines already B's) */
    int reps;          /* repetitions measured */
    int64_t round_trip_ns; /* median of ASYMO_ROUND_TRIP_BATCHES batches of
                              ASYMO_ROUND_TRIP_PASSES round trips, per round trip */
    int64_t round_trip_min_ns; /* the fastest batch's, per round trip: a core the emulator
                                  stops for part of each period misses some batches */
} asymo_transfer_result;

enum { ASYMO_ROUND_TRIP_BATCHES = 15, ASYMO_ROUND_TRIP_PASSES = 100 };

/* Returns 0, or -EINVAL (bad arguments: cpus equal or negative, nbytes outside
 * [4096, 64 MiB], reps outside [1, 1000]), -ENOMEM, or -errno from pinning a thread (a cpu
 * the process may not use) or from starting it. */
int asymo_transfer_probe(int cpu_a, int cpu_b, int64_t nbytes, int reps,
                         asymo_transfer_result *out);
/* CDEF END */

#endif
