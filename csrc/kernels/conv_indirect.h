/* Internal: the indirect-B micro-kernels of the convolution frame's indirect path
 * (conv/conv_indirect.c). Not part of the cffi API. */
#ifndef ASYMO_CONV_INDIRECT_KERNELS_H
#define ASYMO_CONV_INDIRECT_KERNELS_H

#include <stdint.h>

/* c[0:6, 0:16] (row stride rsc) = sum over p < k of a[p * 6 + i] * b[off[p] + j]: the GEMM
 * micro-kernel's product with B row p read in place at its own offset (a row of a
 * stride-phase plane of the image, see conv_indirect.c) instead of from a packed sliver. */
typedef void (*asymo_ukr_indirect_fn)(int64_t k, const float *a, const float *b,
                                      const int64_t *off, float *c, int64_t rsc);

enum { ASYMO_INDIRECT_MR = 6, ASYMO_INDIRECT_NR = 16 };

/* The AVX-512 form: a 16 x 16 tile (a[p * 16 + i]), accumulators started at bias[0:16]
 * (NULL: zero), the shortcut res (row stride rsr; NULL: none) added and act (ASYMO_ACT_*)
 * applied before the store of the first `rows` rows' first `cols` (1..16) columns; only the
 * first `cols` elements of each B row (and of the shortcut's first `rows` rows) are read. */
typedef void (*asymo_ukr_indirect16_fn)(int64_t k, const float *a, const float *b,
                                        const int64_t *off, float *c, int64_t rsc,
                                        const float *bias, const float *res, int64_t rsr,
                                        int act, int rows, int cols);

enum { ASYMO_INDIRECT_MR16 = 16 };

extern const asymo_ukr_indirect_fn asymo_ukr_indirect_portable_f32;
#if defined(__x86_64__)
extern const asymo_ukr_indirect_fn asymo_ukr_indirect_avx2_f32;
extern const asymo_ukr_indirect16_fn asymo_ukr_indirect_avx512_f32;
#endif

#endif
