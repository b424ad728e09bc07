/* Internal: the clock and the pause hint of busy waits, shared by the pool (pool_internal.h),
 * the GEMM's sliver waits (gemm/mm.c) and the lab's emulator and probes. Not part of the cffi
 * API. */
#ifndef ASYMO_POOL_SPIN_H
#define ASYMO_POOL_SPIN_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds */
static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One step of a spin loop: the CPU's pause hint (x86 pause, Arm yield), a compiler barrier
 * elsewhere */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

#endif
