/* Per-thread scratch memory for the convolution kernels' tasks. */
#ifndef ASYMO_CONV_SCRATCH_H
#define ASYMO_CONV_SCRATCH_H

#include <stddef.h>

enum { ASYMO_SCRATCH_WINOGRAD = 0, ASYMO_SCRATCH_DEPTHWISE = 1, ASYMO_SCRATCH_SLOTS = 2 };

/* A 128-byte aligned buffer of at least `bytes` bytes owned by the calling thread for `slot`,
 * kept between calls (pool workers are long-lived: after the first task nothing is allocated
 * and no page is faulted in again) and freed when the thread exits. The contents are
 * undefined. NULL when memory cannot be had (callers then take a path without scratch). */
void *asymo_conv_scratch(int slot, size_t bytes);

#endif
