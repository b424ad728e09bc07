/* asymo: the one public C header. Each part of the C core declares its API in its own header,
 * included here; Python sees the blocks between CDEF markers through cffi. */
#ifndef ASYMO_H
#define ASYMO_H

#include <stdint.h>
#include <stddef.h>

#include "cpu_features.h"
#include "pool.h"
#include "emulate.h"
#include "gemm.h"
#include "conv.h"
#include "include/asymo/winograd.h"
#include "pooling.h"

#endif
