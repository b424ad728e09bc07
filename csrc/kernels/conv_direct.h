/* Internal: the micro-kernels of the direct stride-2 convolution of few input channels
 * (conv/conv_direct.c; asymo/conv.h, asymo_conv_direct_job). Not part of the cffi API. */
#ifndef ASYMO_CONV_DIRECT_KERNELS_H
#define ASYMO_CONV_DIRECT_KERNELS_H

#include "asymo/conv.h"

#if defined(__x86_64__)
/* Output rows [oy0, oy1) of the job's image, every output channel. */
void asymo_conv_direct3x3s2_f32_avx512(const asymo_conv_direct_job *job, int64_t oy0,
                                       int64_t oy1);
#endif

#endif
