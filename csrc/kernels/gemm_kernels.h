/* Internal: the per-ISA GEMM micro-kernels and the skinny-shape kernels the driver picks from.
 * Not part of the cffi API. */
#ifndef ASYMO_GEMM_KERNELS_H
#define ASYMO_GEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "asymo/gemm.h" /* ASYMO_MV_PANEL */

/* c[0:mr, 0:nr] (row stride rsc, unit column stride) = or += the product of a packed A
 * micro-panel and a packed B sliver, BLIS form: k steps of mr contiguous values of A
 * (a[p * mr + i]) and of nr contiguous values of B (b[p * nr + j]). Both panels are read as
 * one forward stream each, so the hardware prefetchers follow them and the broadcasts of A
 * come from one cache line per few k steps instead of mr row streams. */
typedef void (*asymo_ukr_fn)(int64_t k, const void *a, const void *b, void *c, int64_t rsc,
                             int accumulate);

/* The same product with B read in place: b[p * ldb + j], j < nr (unit column stride). */
typedef void (*asymo_ukr_strided_b_fn)(int64_t k, const void *a, const void *b, int64_t ldb,
                                       void *c, int64_t rsc, int accumulate);

/* tile[i * ldt + j] = the product of a packed A micro-panel and the first `cols` columns of a
 * packed B sliver (the packed operands of asymo_ukr_fn), i < mr, j < cols: for an edge of a
 * column or two (a 7 x 7 plane is 3 slivers of 16 and 1 column), where the full or half
 * kernel would spend mr multiply-adds per k step on lanes that are thrown away. */
typedef void (*asymo_ukr_narrow_fn)(int64_t k, const void *a, const void *b, int64_t cols,
                                    void *tile, int64_t ldt);

/* ukr, then c[i, j] = act(c[i, j] + bias[i] + res[i * rsr + j]) before the one store (bias,
 * res NULL: none; act ASYMO_ACT_*: 0 none, 1 ReLU, 2 ReLU6), the same values as ukr followed
 * by the separate epilogue pass. */
typedef void (*asymo_ukr_epi_fn)(int64_t k, const void *a, const void *b, void *c,
                                 int64_t rsc, int accumulate, const void *bias,
                                 const void *res, int64_t rsr, int act);

/* Optional fast packing of an mr-row group of row-major A (unit column stride) into a
 * micro-panel: dst[p * mr + i] = src[i * rsa + p] for i < mr, p < kb. NULL: the driver's
 * generic loops. */
typedef void (*asymo_pack_rows_fn)(void *dst, const void *src, int64_t rsa, int64_t kb);

/* Skinny product, no packing: out[l, s] = sum_p mat[l, p] * vec[p, s] for l in [l0, l1),
 * s < ns (ns <= ASYMO_SKINNY_MAX); strides in elements. `mat_csp == 1` selects the dot form,
 * `mat_rsl == 1` the axpy form; the driver guarantees one of them. In the dot form the vectors
 * are contiguous along p (vec_rsp == 1). */
typedef void (*asymo_skinny_fn)(int64_t l0, int64_t l1, int64_t ns, int64_t k,
                                const void *mat, int64_t mat_rsl, int64_t mat_csp,
                                const void *vec, int64_t vec_rsp, int64_t vec_css,
                                void *out, int64_t out_rsl, int64_t out_css);

#define ASYMO_SKINNY_MAX 8

/* y[r] = sum_p panel[p * ASYMO_MV_PANEL + r] * x[p] for the ASYMO_MV_PANEL rows of one panel
 * of K columns (see asymo_mv_pack); float32 tables only. */
typedef void (*asymo_mv_panel_fn)(int64_t k, const void *panel, const void *x, void *y);

typedef struct {
    int mr;
    int nr;
    asymo_ukr_fn ukr;
    asymo_skinny_fn skinny_dot;
    asymo_skinny_fn skinny_axpy;
    asymo_pack_rows_fn pack_a_rows;
    /* Optional (NULL: none): the kernel for an edge sliver of at most nr / 2 columns. Same
     * packed operands as ukr (B slivers stay nr wide); it computes and stores the first
     * nr / 2 columns only, at half the cost: a plane of 7 x 7 or 14 x 14 pixels leaves such an
     * edge on every row of micro-panels. */
    asymo_ukr_fn ukr_half;
    /* Optional (NULL: none): ukr with B unpacked (see asymo_ukr_strided_b_fn), for products
     * whose blocks have so few rows of A that packing B costs more than it saves. */
    asymo_ukr_strided_b_fn ukr_strided_b;
    /* Optional (NULL: none): the kernel for an edge sliver of at most narrow_cols columns,
     * writing them into a tile of row stride ldt (see asymo_ukr_narrow_fn). */
    asymo_ukr_narrow_fn ukr_narrow;
    int narrow_cols;
    /* Optional (NULL: none): ukr with the epilogue of its product's last K panel applied
     * before the store (see asymo_ukr_epi_fn). */
    asymo_ukr_epi_fn ukr_epi;
    /* The matrix-vector product of one packed panel (see asymo_mv_panel_fn). */
    asymo_mv_panel_fn mv_panel;
} asymo_gemm_kernel;

/* Kernel tables, NULL entries where an ISA is not compiled in for this architecture. */
extern const asymo_gemm_kernel asymo_gemm_portable_f32, asymo_gemm_portable_f64;
#if defined(__x86_64__)
extern const asymo_gemm_kernel asymo_gemm_avx2_f32, asymo_gemm_avx2_f64;
extern const asymo_gemm_kernel asymo_gemm_avx512_f32, asymo_gemm_avx512_f64;
#endif
#if defined(__aarch64__)
extern const asymo_gemm_kernel asymo_gemm_neon_f32, asymo_gemm_neon_f64;
#endif

#define ASYMO_ALIGN 64

#endif
