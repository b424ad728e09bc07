/* The depthwise task (csrc/conv/depthwise.c with its direct 3x3 kernels) on its own: runs
 * every task of a set of layers in one thread, with method 0 (the direct 3x3 kernel where it
 * applies) and 2 (the channel-interleaved kernel), and compares with a direct double
 * convolution. Built natively and for AArch64 (the plain-C kernel as GCC vectorises it there,
 * under qemu) by tests/test_dwconv_c.py. Prints OK on success. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "asymo/conv.h"

static double frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xFFFF) / 32768.0 - 1.0;
}

static int run_case(int N, int C, int H, int W, int s, int pad, int act, int with_res,
                    int with_bias, int method)
{
    const int OH = (H + 2 * pad - 3) / s + 1, OW = (W + 2 * pad - 3) / s + 1;
    const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
    unsigned seed = 11u + (unsigned)(C * 131 + H * 17 + W * 3 + s + pad * 7);
    float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * C * 9);
    float *b = malloc(sizeof(float) * C), *y = malloc(sizeof(float) * ny);
    float *res = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < nx; i++) x[i] = (float)frand(&seed);
    for (int i = 0; i < C * 9; i++) w[i] = (float)frand(&seed);
    for (int i = 0; i < C; i++) b[i] = (float)frand(&seed);
    for (size_t i = 0; i < ny; i++) res[i] = (float)frand(&seed);
    for (size_t i = 0; i < ny; i++) y[i] = NAN;  /* every output must be written */

    asymo_dwconv_job job;
    memset(&job, 0, sizeof job);
    asymo_conv_geometry *g = &job.geom;
    g->channels = C; g->height = H; g->width = W;
    g->kernel_h = g->kernel_w = 3;
    g->stride_h = g->stride_w = s;
    g->pad_h = g->pad_w = pad;
    g->dilation_h = g->dilation_w = 1;
    g->out_h = OH; g->out_w = OW;
    job.dtype = 0;
    job.activation = act;
    job.batch = N;
    job.out_channels = C;
    job.x = x; job.weight = w; job.bias = with_bias ? b : NULL; job.y = y;
    job.y_image_stride = (int64_t)C * OH * OW;
    job.rows_per_task = 5;
    job.method = method;
    job.residual = with_res ? res : NULL;
    job.residual_image_stride = (int64_t)C * OH * OW;
    const int64_t ntasks = (int64_t)N * ((C + ASYMO_DW_LANES - 1) / ASYMO_DW_LANES)
                           * ((OH + 4) / 5);
    for (int64_t t = 0; t < ntasks; t++)
        asymo_dwconv_task(t, &job);

    int bad = 0;
    for (int n = 0; n < N && !bad; n++)
        for (int c = 0; c < C && !bad; c++)
            for (int oy = 0; oy < OH && !bad; oy++)
                for (int ox = 0; ox < OW && !bad; ox++) {
                    double acc = with_bias ? b[c] : 0.0;
                    for (int ky = 0; ky < 3; ky++)
                        for (int kx = 0; kx < 3; kx++) {
                            const int iy = oy * s - pad + ky, ix = ox * s - pad + kx;
                            if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                                acc += (double)w[c * 9 + ky * 3 + kx]
                                       * x[(((size_t)n * C + c) * H + iy) * W + ix];
                        }
                    const size_t o = (((size_t)n * C + c) * OH + oy) * OW + ox;
                    if (with_res)
                        acc += res[o];
                    if (act == ASYMO_ACT_RELU)
                        acc = acc < 0 ? 0 : acc;
                    else if (act == ASYMO_ACT_RELU6)
                        acc = acc < 0 ? 0 : (acc > 6 ? 6 : acc);
                    if (!(fabs(y[o] - acc) <= 1e-4 * (1 + fabs(acc)))) {
                        printf("mismatch N%d C%d %dx%d s%d p%d act%d res%d bias%d method%d at "
                               "(%d,%d,%d,%d): %g vs %g\n", N, C, H, W, s, pad, act, with_res,
                               with_bias, method, n, c, oy, ox, y[o], acc);
                        bad = 1;
                    }
                }
    free(x); free(w); free(b); free(y); free(res);
    return bad;
}

int main(void)
{
    static const int sizes[][2] = {{1, 1}, {2, 2}, {3, 3}, {7, 7}, {14, 14}, {5, 9},
                                   {4, 17}, {6, 40}, {3, 300}, {15, 15}, {16, 16},
                                   {13, 33}, {9, 34}};
    int fails = 0, cases = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int s = 1; s <= 2; s++)
            for (int pad = 0; pad <= 1; pad++) {
                const int H = sizes[i][0], W = sizes[i][1];
                if (H + 2 * pad < 3 || W + 2 * pad < 3)
                    continue;
                for (int method = 0; method <= 2; method += 2) {
                    const int k = (int)i + s + pad;
                    fails += run_case(1 + k % 2, k % 3 ? 5 : 18, H, W, s, pad, k % 3,
                                      k % 2, (k / 2) % 2, method);
                    cases++;
                }
            }
    if (fails) {
        printf("%d of %d cases failed\n", fails, cases);
        return 1;
    }
    printf("%d cases OK\n", cases);
    return 0;
}
