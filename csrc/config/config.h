/* Configuration shared with the frames: which kernel serves an ISA. Internal (not seen by
 * cffi); the public side of it is asymo_gemm_default_isa / asymo_gemm_kernel_tile in
 * asymo/gemm.h and asymo_conv_isa / asymo_conv_set_isa in asymo/conv.h. */
#ifndef ASYMO_CONFIG_H
#define ASYMO_CONFIG_H

#include "kernels/gemm_kernels.h"

/* The GEMM kernel family of `isa` for `dtype` (ASYMO_DTYPE_*), or NULL when that family is
 * not compiled into this build or the CPU cannot run it. */
__attribute__((visibility("hidden")))
const asymo_gemm_kernel *asymo_gemm_kernel_for(int isa, int dtype);

#endif
