/* Internal: the GEMM epilogue's row loops (epilogue.c), shared with the convolution frame's
 * separate bias / residual / activation pass. Not seen by cffi. */
#ifndef ASYMO_GEMM_EPILOGUE_H
#define ASYMO_GEMM_EPILOGUE_H

#include <stdint.h>

/* c[i, j] = act(c[i, j] + bias[i] + res[i * rsr + j]) on rows x n (row stride rsc, unit
 * column stride); bias / res may be NULL; act is ASYMO_ACT_* (0 none, 1 ReLU, 2 ReLU6). */
typedef void (*gemm_epilogue_fn)(void *c, int64_t rsc, int64_t rows, int64_t n,
                                 const void *bias, const void *res, int64_t rsr, int act);

/* The loop for an ISA (ASYMO_ISA_*) and dtype (ASYMO_DTYPE_*). */
__attribute__((visibility("hidden"))) gemm_epilogue_fn gemm_epilogue_for(int isa, int dtype);

#endif
