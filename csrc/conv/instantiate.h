/* Instantiates a kernel template header for float and double, portable and (x86-64) AVX2+FMA,
 * plus AVX-512 when INSTANTIATE_AVX512 is defined. The template (IMPL_HEADER, a quoted file
 * name) expects T (element type), IT (integer type of the same size) and FN(name) (a unique
 * name per instantiation: name##_f32_portable, _f64_avx2_fma, ...). No include guard on
 * purpose: one inclusion per template. */
#ifndef IMPL_HEADER
#error "define IMPL_HEADER before including conv/instantiate.h"
#endif

#define T float
#define IT int32_t
#define FN(name) name##_f32_portable
#include IMPL_HEADER
#undef FN
#undef T
#undef IT
#define T double
#define IT int64_t
#define FN(name) name##_f64_portable
#include IMPL_HEADER
#undef FN
#undef T
#undef IT

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define T float
#define IT int32_t
#define FN(name) name##_f32_avx2_fma
#include IMPL_HEADER
#undef FN
#undef T
#undef IT
#define T double
#define IT int64_t
#define FN(name) name##_f64_avx2_fma
#include IMPL_HEADER
#undef FN
#undef T
#undef IT
#pragma GCC pop_options

#if defined(INSTANTIATE_AVX512)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#define T float
#define IT int32_t
#define FN(name) name##_f32_avx512
#include IMPL_HEADER
#undef FN
#undef T
#undef IT
#define T double
#define IT int64_t
#define FN(name) name##_f64_avx512
#include IMPL_HEADER
#undef FN
#undef T
#undef IT
#pragma GCC pop_options
#endif
#endif

#undef IMPL_HEADER
#undef INSTANTIATE_AVX512
