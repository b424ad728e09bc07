/* asymo: the public C API of the runtime. Each part of the C core declares its API in its own
 * header under include/asymo/, included here; Python sees the blocks between CDEF markers
 * through cffi. Lab tools (the emulator, task tracing) have their headers in csrc/lab/. */
#ifndef ASYMO_H
#define ASYMO_H

#include <stdint.h>
#include <stddef.h>

#include "asymo/isa.h"
#include "asymo/pool.h"
#include "asymo/gemm.h"
#include "asymo/conv.h"
#include "asymo/winograd.h"
#include "asymo/pooling.h"

#endif
