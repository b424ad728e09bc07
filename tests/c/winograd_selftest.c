/* Winograd task body on its own (csrc/conv/winograd.c + kernels/portable): transforms the
 * weights in double here, runs every task of a few layers in one thread and compares with a
 * direct double convolution. Built natively and for AArch64 (NEON, under qemu) by
 * tests/test_winograd_c.py. Prints OK on success. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv/winograd_internal.h"

#if !defined(__x86_64__)
/* winograd.c consults the conv kernels' ISA only on x86-64 */
#endif

static const double G2[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, -.5, .5}, {0, 0, 1}};
static const double G4[6][3] = {{1. / 4, 0, 0}, {-1. / 6, -1. / 6, -1. / 6},
                                {-1. / 6, 1. / 6, -1. / 6}, {1. / 24, 1. / 12, 1. / 6},
                                {1. / 24, -1. / 12, 1. / 6}, {0, 0, 1}};

static double frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xFFFF) / 32768.0 - 1.0;
}

static int run_case(int m, int C, int K, int H, int W, int pad, int act, int with_res)
{
    const int alpha = m + 2, a2 = alpha * alpha;
    const int OH = H + 2 * pad - 2, OW = W + 2 * pad - 2;
    const int Kp = (K + ASYMO_WINO_MR - 1) / ASYMO_WINO_MR * ASYMO_WINO_MR;
    unsigned seed = 7u + (unsigned)(m * 1000 + C * 31 + K);
    float *x = malloc(sizeof(float) * C * H * W), *w = malloc(sizeof(float) * K * C * 9);
    float *b = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * K * OH * OW);
    float *res = malloc(sizeof(float) * K * OH * OW);
    float *u = calloc((size_t)a2 * Kp * C, sizeof(float));
    for (int i = 0; i < C * H * W; i++) x[i] = (float)frand(&seed);
    for (int i = 0; i < K * C * 9; i++) w[i] = (float)frand(&seed);
    for (int i = 0; i < K; i++) b[i] = (float)frand(&seed);
    for (int i = 0; i < K * OH * OW; i++) res[i] = (float)frand(&seed);
    /* U = G g G^T, packed [xi][Kp / MR][C][MR] */
    for (int k = 0; k < K; k++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < alpha; i++)
                for (int j = 0; j < alpha; j++) {
                    double s = 0;
                    for (int p = 0; p < 3; p++)
                        for (int q = 0; q < 3; q++) {
                            const double gi = m == 4 ? G4[i][p] : G2[i][p];
                            const double gj = m == 4 ? G4[j][q] : G2[j][q];
                            s += gi * w[((k * C + c) * 3 + p) * 3 + q] * gj;
                        }
                    const int xi = i * alpha + j, pn = k / ASYMO_WINO_MR, r = k % ASYMO_WINO_MR;
                    u[(((int64_t)xi * (Kp / ASYMO_WINO_MR) + pn) * C + c) * ASYMO_WINO_MR + r] =
                        (float)s;
                }
    asymo_winograd_job job;
    memset(&job, 0, sizeof job);
    job.geom.channels = C; job.geom.height = H; job.geom.width = W;
    job.geom.kernel_h = job.geom.kernel_w = 3;
    job.geom.stride_h = job.geom.stride_w = job.geom.dilation_h = job.geom.dilation_w = 1;
    job.geom.pad_h = job.geom.pad_w = pad;
    job.geom.out_h = OH; job.geom.out_w = OW;
    job.activation = act; job.tile = m; job.batch = 1; job.out_channels = K;
    job.x = x; job.x_image_stride = C * H * W; job.u = u; job.weight = w; job.k_padded = Kp;
    job.bias = b; job.residual = with_res ? res : NULL;
    job.residual_image_stride = K * OH * OW;
    job.y = y; job.y_image_stride = K * OH * OW;
    job.tiles_h = (OH + m - 1) / m; job.tiles_w = (OW + m - 1) / m;
    job.tiles_per_task = 2 * ASYMO_WINO_NR;
    job.tile_blocks = (job.tiles_h * job.tiles_w + job.tiles_per_task - 1) / job.tiles_per_task;
    job.k_per_block = 2 * ASYMO_WINO_MR;
    job.k_blocks = (K + job.k_per_block - 1) / job.k_per_block;
    const int64_t ntasks = job.tile_blocks * job.k_blocks;
    for (int64_t t = 0; t < ntasks; t++)
        asymo_winograd_task(t, &job);
    double worst = 0, scale = 0;
    for (int k = 0; k < K; k++)
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                double s = b[k], a = fabs(b[k]);
                for (int c = 0; c < C; c++)
                    for (int p = 0; p < 3; p++)
                        for (int q = 0; q < 3; q++) {
                            const int iy = oy + p - pad, ix = ox + q - pad;
                            if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                continue;
                            const double t = (double)w[((k * C + c) * 3 + p) * 3 + q]
                                             * x[(c * H + iy) * W + ix];
                            s += t;
                            a += fabs(t);
                        }
                if (with_res) {
                    s += res[(k * OH + oy) * OW + ox];
                    a += fabs(res[(k * OH + oy) * OW + ox]);
                }
                if (act == ASYMO_ACT_RELU) s = s < 0 ? 0 : s;
                if (act == ASYMO_ACT_RELU6) s = s < 0 ? 0 : (s > 6 ? 6 : s);
                const double e = fabs(s - y[(k * OH + oy) * OW + ox]);
                worst = e > worst ? e : worst;
                scale = a > scale ? a : scale;
            }
    const double bound = (m == 4 ? 128.0 : 8.0) * 1.1920929e-7 * scale;
    printf("F(%d) C=%d K=%d %dx%d pad %d act %d res %d: max err %.3g (bound %.3g)\n", m, C, K,
           H, W, pad, act, with_res, worst, bound);
    free(x); free(w); free(b); free(y); free(res); free(u);
    return worst <= bound;
}

int main(void)
{
    int ok = 1;
    ok &= run_case(4, 13, 29, 17, 23, 1, ASYMO_ACT_RELU, 0);
    ok &= run_case(2, 13, 29, 17, 23, 1, ASYMO_ACT_NONE, 1);
    ok &= run_case(4, 8, 7, 5, 6, 0, ASYMO_ACT_RELU6, 1);
    ok &= run_case(2, 20, 40, 9, 9, 2, ASYMO_ACT_RELU, 0);
    ok &= run_case(4, 64, 64, 14, 14, 1, ASYMO_ACT_NONE, 0);
    puts(ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
}
