/* Internal: the instances of the pixel-row micro-kernels (kernels/conv_pointwise.h), written
 * once for each ISA's file. The includer defines PIXEL_ROWS_ATTR (its target attribute) and a
 * static inline body
 *     pixel_rows(R, NV, SX, k, x, ldx, koff, w, y, ldy, bias, res, ldr, act, chans)
 * (R rows, NV vectors of output channels, SX the taps form's pixel stride), then instantiates
 * PIXEL_ROWS_UPTO<n>(NV) for each width and lists them in its tables with
 * PIXEL_ROWS_FN<n>(P, NV), P one of pixel_rows_, taps_rows_, taps_rows_s2_. */
#ifndef ASYMO_PIXEL_ROWS_INSTANCES_H
#define ASYMO_PIXEL_ROWS_INSTANCES_H

/* One signature for both forms; TAPS and SX are literals, so each instance keeps only its own
 * addressing. */
#define PIXEL_ROWS_KERNEL(P, SX, TAPS, NV, R)                                                \
    PIXEL_ROWS_ATTR static void P##NV##_##R(                                                 \
        int64_t k, const float *x, int64_t ldx, const int64_t *koff, const float *w,         \
        float *y, int64_t ldy, const float *bias, const float *res, int64_t ldr, int act,    \
        int chans)                                                                           \
    {                                                                                        \
        pixel_rows(R, NV, SX, k, x, ldx, TAPS ? koff : NULL, w, y, ldy, bias, res, ldr, act, \
                   chans);                                                                   \
    }
#define PIXEL_ROWS_KERNELS(NV, R)                                                            \
    PIXEL_ROWS_KERNEL(pixel_rows_, 1, 0, NV, R) PIXEL_ROWS_KERNEL(taps_rows_, 1, 1, NV, R)   \
    PIXEL_ROWS_KERNEL(taps_rows_s2_, 2, 1, NV, R)
#define PIXEL_ROWS_UPTO4(NV)                                                                 \
    PIXEL_ROWS_KERNELS(NV, 1) PIXEL_ROWS_KERNELS(NV, 2) PIXEL_ROWS_KERNELS(NV, 3)            \
    PIXEL_ROWS_KERNELS(NV, 4)
#define PIXEL_ROWS_UPTO6(NV)                                                                 \
    PIXEL_ROWS_UPTO4(NV) PIXEL_ROWS_KERNELS(NV, 5) PIXEL_ROWS_KERNELS(NV, 6)
#define PIXEL_ROWS_UPTO8(NV)                                                                 \
    PIXEL_ROWS_UPTO6(NV) PIXEL_ROWS_KERNELS(NV, 7) PIXEL_ROWS_KERNELS(NV, 8)
#define PIXEL_ROWS_UPTO12(NV)                                                                \
    PIXEL_ROWS_UPTO8(NV) PIXEL_ROWS_KERNELS(NV, 9) PIXEL_ROWS_KERNELS(NV, 10)                \
    PIXEL_ROWS_KERNELS(NV, 11) PIXEL_ROWS_KERNELS(NV, 12)

#define PIXEL_ROWS_FN4(P, NV) P##NV##_1, P##NV##_2, P##NV##_3, P##NV##_4
#define PIXEL_ROWS_FN6(P, NV) PIXEL_ROWS_FN4(P, NV), P##NV##_5, P##NV##_6
#define PIXEL_ROWS_FN8(P, NV) PIXEL_ROWS_FN6(P, NV), P##NV##_7, P##NV##_8
#define PIXEL_ROWS_FN12(P, NV)                                                               \
    PIXEL_ROWS_FN8(P, NV), P##NV##_9, P##NV##_10, P##NV##_11, P##NV##_12

#endif
