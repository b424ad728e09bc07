/* Element-type routines of the GEMM frame, written once and instantiated for float and
 * double: packing A blocks and B slivers, merging edge tiles into C, and the plain loops for
 * layouts no kernel suits (strided skinny product, outer product, K-split reduction, K = 0). */
#include <string.h>

#include "gemm/gemm_internal.h"

/* kb rows of NR values at stride rsb from src into dst (row stride NR) */
#define COPY_ROWS(T, NR)                                                                       \
    for (int64_t p = 0; p < kb; p++) {                                                         \
        __builtin_prefetch(src + (p + 8) * rsb);                                               \
        memcpy(dst + p * (NR), src + p * rsb, sizeof(T) * (size_t)(NR));                       \
    }

#define DEFINE_PACK(T, SUFFIX)                                                                 \
    /* rows [i0, i1) x k-range [p0, p0 + kb) of A as mr-row micro-panels (panel g at      \
     * dst + g * mr * kb, dst[p * mr + i] inside), rows zero-padded up to a multiple of mr so \
     * edge tiles run the full kernel. `fast` packs a full group of row-major A. */           \
    static void pack_a_##SUFFIX(T *dst, const T *a, int64_t rsa, int64_t csa, int64_t i0,    \
                                int64_t i1, int64_t p0, int64_t kb, int mr,                   \
                                asymo_pack_rows_fn fast)                                      \
    {                                                                                          \
        const int64_t rows = i1 - i0;                                                          \
        const T *src = a + i0 * rsa + p0 * csa;                                                \
        for (int64_t g = 0; g < rows; g += mr) {                                               \
            const int64_t r = min64(mr, rows - g);                                             \
            T *d = dst + g * kb;                                                               \
            const T *s = src + g * rsa;                                                        \
            if (r == mr && csa == 1 && fast) {                                                 \
                fast(d, s, rsa, kb);                                                           \
                continue;                                                                      \
            }                                                                                  \
            for (int64_t p = 0; p < kb; p++) {                                                 \
                int64_t i = 0;                                                                 \
                for (; i < r; i++)                                                             \
                    d[p * mr + i] = s[i * rsa + p * csa];                                      \
                for (; i < mr; i++)                                                            \
                    d[p * mr + i] = 0;                                                         \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    /* columns [j0, j0 + cols) x k-range [p0, p0 + kb) of B as one nr-wide sliver. */         \
    static void pack_b_##SUFFIX(T *dst, const T *b, int64_t rsb, int64_t csb, int64_t j0,    \
                                int64_t cols, int64_t p0, int64_t kb, int nr)                 \
    {                                                                                          \
        const T *src = b + p0 * rsb + j0 * csb;                                                \
        if (cols == nr && csb == 1) {                                                          \
            /* constant-size copies are inlined as vector moves; a libc call per 64-byte row \
             * cost as much as the kernel for small M */                                      \
            switch (nr * (int)sizeof(T)) {                                                     \
            case 32: COPY_ROWS(T, 32 / sizeof(T)); break;                                      \
            case 48: COPY_ROWS(T, 48 / sizeof(T)); break;                                      \
            case 64: COPY_ROWS(T, 64 / sizeof(T)); break;                                      \
            case 128: COPY_ROWS(T, 128 / sizeof(T)); break;                                    \
            default: COPY_ROWS(T, nr); break;                                                  \
            }                                                                                  \
        } else if (rsb == 1) {                                                                 \
            for (int64_t jj = 0; jj < cols; jj++) {                                            \
                const T *col = src + jj * csb;                                                 \
                for (int64_t p = 0; p < kb; p++)                                               \
                    dst[p * nr + jj] = col[p];                                                 \
            }                                                                                  \
            for (int64_t jj = cols; jj < nr; jj++)                                             \
                for (int64_t p = 0; p < kb; p++)                                               \
                    dst[p * nr + jj] = 0;                                                      \
        } else {                                                                               \
            for (int64_t p = 0; p < kb; p++) {                                                 \
                int64_t jj = 0;                                                                \
                for (; jj < cols; jj++)                                                        \
                    dst[p * nr + jj] = src[p * rsb + jj * csb];                                \
                for (; jj < nr; jj++)                                                          \
                    dst[p * nr + jj] = 0;                                                      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    /* Edge or strided tile: tile (row stride nr) into C, overwriting or accumulating. */     \
    static void merge_tile_##SUFFIX(T *c, int64_t rsc, int64_t csc, const T *tile, int nr,   \
                                    int64_t rows, int64_t cols, int accumulate)               \
    {                                                                                          \
        for (int64_t i = 0; i < rows; i++)                                                     \
            for (int64_t j = 0; j < cols; j++) {                                               \
                T *dst = c + i * rsc + j * csc;                                                \
                *dst = accumulate ? *dst + tile[i * nr + j] : tile[i * nr + j];                \
            }                                                                                  \
    }                                                                                          \
    /* Strided fallback of the skinny product when neither operand layout suits the kernels */\
    static void skinny_strided_##SUFFIX(int64_t l0, int64_t l1, int64_t ns, int64_t k,       \
                                        const void *mat_, int64_t rsl, int64_t csp,           \
                                        const void *vec_, int64_t rsp, int64_t css,           \
                                        void *out_, int64_t orl, int64_t ocs)                 \
    {                                                                                          \
        const T *mat = (const T *)mat_;                                                        \
        const T *vec = (const T *)vec_;                                                        \
        T *out = (T *)out_;                                                                    \
        for (int64_t l = l0; l < l1; l++)                                                      \
            for (int64_t s = 0; s < ns; s++) {                                                 \
                T acc = 0;                                                                     \
                for (int64_t p = 0; p < k; p++)                                                \
                    acc += mat[l * rsl + p * csp] * vec[p * rsp + s * css];                    \
                out[l * orl + s * ocs] = acc;                                                  \
            }                                                                                  \
    }                                                                                          \
    static void outer_##SUFFIX(const void *a_, int64_t rsa, const void *b_, int64_t csb,      \
                               void *c_, int64_t rsc, int64_t csc, int64_t i0, int64_t i1,   \
                               int64_t j0, int64_t j1)                                        \
    {                                                                                          \
        const T *a = (const T *)a_;                                                            \
        const T *b = (const T *)b_;                                                            \
        T *c = (T *)c_;                                                                        \
        if (csc == 1 || (csc != 1 && rsc != 1)) {                                              \
            for (int64_t i = i0; i < i1; i++) {                                                \
                const T ai = a[i * rsa];                                                       \
                T *row = c + i * rsc;                                                          \
                if (csc == 1 && csb == 1)                                                      \
                    for (int64_t j = j0; j < j1; j++)                                          \
                        row[j] = ai * b[j];                                                    \
                else                                                                           \
                    for (int64_t j = j0; j < j1; j++)                                          \
                        row[j * csc] = ai * b[j * csb];                                        \
            }                                                                                  \
        } else { /* column-major C: write down columns */                                     \
            for (int64_t j = j0; j < j1; j++) {                                                \
                const T bj = b[j * csb];                                                       \
                T *col = c + j * csc;                                                          \
                if (rsa == 1)                                                                  \
                    for (int64_t i = i0; i < i1; i++)                                          \
                        col[i] = a[i] * bj;                                                    \
                else                                                                           \
                    for (int64_t i = i0; i < i1; i++)                                          \
                        col[i] = a[i * rsa] * bj;                                              \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    /* out[l, s] = sum over t of part[t][s][l] (parts of stride `stride` elements) */       \
    static void reduce_##SUFFIX(void *out_, int64_t orl, int64_t ocs, void *part_,           \
                                int64_t nparts, int64_t stride, int64_t ns, int64_t l)       \
    {                                                                                          \
        T *out = (T *)out_;                                                                    \
        T *acc = (T *)part_;                                                                   \
        for (int64_t t = 1; t < nparts; t++) {                                                 \
            const T *p = acc + t * stride;                                                     \
            for (int64_t i = 0; i < ns * l; i++)                                               \
                acc[i] += p[i];                                                                \
        }                                                                                      \
        for (int64_t s = 0; s < ns; s++)                                                       \
            for (int64_t i = 0; i < l; i++)                                                    \
                out[i * orl + s * ocs] = acc[s * l + i];                                       \
    }                                                                                          \
    static void zero_##SUFFIX(void *c_, int64_t rsc, int64_t csc, int64_t m, int64_t n)      \
    {                                                                                          \
        T *c = (T *)c_;                                                                        \
        for (int64_t i = 0; i < m; i++)                                                        \
            for (int64_t j = 0; j < n; j++)                                                    \
                c[i * rsc + j * csc] = 0;                                                      \
    }

DEFINE_PACK(float, f32)
DEFINE_PACK(double, f64)


#define OPS(SUFFIX)                                                                            \
    {(void (*)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,    \
               int, asymo_pack_rows_fn))pack_a_##SUFFIX,                                       \
     (void (*)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,    \
               int))pack_b_##SUFFIX,                                                           \
     (void (*)(void *, int64_t, int64_t, const void *, int, int64_t, int64_t,                 \
               int))merge_tile_##SUFFIX,                                                       \
     skinny_strided_##SUFFIX, outer_##SUFFIX, reduce_##SUFFIX, zero_##SUFFIX}

const dtype_ops gemm_ops_f32 = OPS(f32);
const dtype_ops gemm_ops_f64 = OPS(f64);
