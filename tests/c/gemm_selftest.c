/* Stand-alone check of the C GEMM (no Python): every compiled kernel family the CPU runs,
 * float32 and float64, every path (MM / MV / OUTER / batch split), strided and transposed
 * operands, serial and on a two-cluster pool, against a naive reference. Used to test the
 * NEON kernels under qemu-aarch64 (tests/test_gemm_c.py) and natively.
 * Prints one line per ISA tested and exits non-zero on the first mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "asymo/asymo.h"

static unsigned long long rng_state = 88172645463325252ull;
static double rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state % 2000001) / 1000000.0 - 1.0;
}

typedef struct {
    int64_t m, k, n;
    int kind, split;
} shape_t;

/* B with a column stride of 2, or (unit_b) unit column stride and padded rows: the layout
 * whose full slivers small-M blocks read in place (DIRECT_B_MAX_ROWS) */
static int check_one(asymo_pool *pool, int isa, int dtype, const shape_t *s, int transpose_a,
                     int mc, int nc, int kc, int unit_b)
{
    const int es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    const int64_t m = s->m, k = s->k, n = s->n;
    double *ad = malloc(sizeof(double) * (size_t)(m * k + 1));
    double *bd = malloc(sizeof(double) * (size_t)(k * n + 1));
    double *ref = calloc((size_t)(m * n + 1), sizeof(double));
    double *mag = calloc((size_t)(m * n + 1), sizeof(double));
    char *a = malloc((size_t)(m * k + 1) * es), *b = malloc((size_t)(2 * k * n + 3 * k + 1) * es);
    char *c = malloc((size_t)(m * n + 1) * es);
    int bad = 0;
    for (int64_t i = 0; i < m * k; i++)
        ad[i] = rnd();
    for (int64_t i = 0; i < k * n; i++)
        bd[i] = rnd();
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t p = 0; p < k; p++) {
                ref[i * n + j] += ad[i * k + p] * bd[p * n + j];
                mag[i * n + j] += fabs(ad[i * k + p] * bd[p * n + j]);
            }
    /* A row-major or column-major */
    const int64_t rsb = unit_b ? n + 3 : 2 * n, csb = unit_b ? 1 : 2;
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++) {
            int64_t at = transpose_a ? p * m + i : i * k + p;
            if (es == 4)
                ((float *)a)[at] = (float)ad[i * k + p];
            else
                ((double *)a)[at] = ad[i * k + p];
        }
    for (int64_t p = 0; p < k; p++)
        for (int64_t j = 0; j < n; j++) {
            if (es == 4)
                ((float *)b)[p * rsb + csb * j] = (float)bd[p * n + j];
            else
                ((double *)b)[p * rsb + csb * j] = bd[p * n + j];
        }
    for (int64_t i = 0; i < m * n; i++) {
        if (es == 4)
            ((float *)c)[i] = NAN;
        else
            ((double *)c)[i] = NAN;
    }
    asymo_gemm_args g;
    memset(&g, 0, sizeof g);
    g.dtype = dtype;
    g.m = m;
    g.k = k;
    g.n = n;
    g.a = a;
    g.rsa = transpose_a ? 1 : k;
    g.csa = transpose_a ? m : 1;
    g.b = b;
    g.rsb = rsb;
    g.csb = csb;
    g.c = c;
    g.rsc = n;
    g.csc = 1;
    g.nbatch = 1;
    asymo_gemm_plan p;
    memset(&p, 0, sizeof p);
    p.kind = s->kind;
    p.split_dim = s->split;
    p.isa = isa;
    p.nclusters = 2;
    int64_t dim = s->split == ASYMO_SPLIT_M ? m : n;
    p.start[0] = 0;
    p.stop[0] = p.start[1] = dim / 3;
    p.stop[1] = dim;
    for (int cl = 0; cl < 2; cl++) {
        p.mc[cl] = mc;
        p.nc[cl] = nc;
        p.kc[cl] = kc;
        p.chunk[cl] = 5;
    }
    int rc = asymo_gemm(pool, &g, &p);
    if (rc != ASYMO_OK) {
        printf("asymo_gemm failed: %d\n", rc);
        bad = 1;
    }
    const double eps = es == 4 ? 1.2e-7 : 2.3e-16;
    for (int64_t i = 0; i < m && !bad; i++)
        for (int64_t j = 0; j < n; j++) {
            double got = es == 4 ? ((float *)c)[i * n + j] : ((double *)c)[i * n + j];
            double tol = 2.0 * (k + 2) * eps * mag[i * n + j] + 1e-30;
            if (!(fabs(got - ref[i * n + j]) <= tol)) {
                printf("MISMATCH isa=%s dtype=%d shape=%lldx%lldx%lld kind=%d at (%lld,%lld): "
                       "%g vs %g\n", asymo_isa_name(isa), dtype, (long long)m, (long long)k,
                       (long long)n, s->kind, (long long)i, (long long)j, got, ref[i * n + j]);
                bad = 1;
                break;
            }
        }
    free(ad);
    free(bd);
    free(ref);
    free(mag);
    free(a);
    free(b);
    free(c);
    return bad;
}

/* Implicit B for the packed test: rows [p0, p0 + kb) x columns [j0, j0 + cols) of a row-major
 * k x n matrix as one nr-wide sliver (what conv2d's im2col producer does). */
typedef struct {
    const char *b;
    int64_t n;
    int es;
} implicit_b;

static void implicit_pack_b(const void *ctx_, void *dst, int64_t j0, int64_t cols, int64_t p0,
                            int64_t kb, int64_t nr)
{
    const implicit_b *ctx = (const implicit_b *)ctx_;
    for (int64_t p = 0; p < kb; p++)
        for (int64_t j = 0; j < nr; j++) {
            char *d = (char *)dst + (p * nr + j) * ctx->es;
            if (j < cols)
                memcpy(d, ctx->b + ((p0 + p) * ctx->n + j0 + j) * ctx->es, (size_t)ctx->es);
            else
                memset(d, 0, (size_t)ctx->es);
        }
}

/* Pre-packed A and B (asymo_gemm_pack, plain pointers NULL) and row-major contiguous B, on a
 * plan split along split_dim at a multiple of the tile; kc smaller than K so several K blocks
 * are packed. `shared`: instead, one cluster whose tasks are single micro-panels of rows over
 * one column block, so every task of the pool needs every sliver of each panel at once (the
 * packers race, and a thread that finds a sliver being packed packs the panel's later ones
 * meanwhile). `shared` 2: two clusters split along M over one column block, whose second
 * cluster reads the first one's panels (and a thread of either cluster may steal the other's
 * tasks). Returns the number of failures. */
static int check_packed(asymo_pool *pool, int isa, int dtype, int64_t m, int64_t k, int64_t n,
                        int split_dim, int64_t kc, int pack_a, int pack_b, int shared)
{
    const int es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    int mr, nr, bad = 0;
    asymo_gemm_kernel_tile(isa, dtype, &mr, &nr);
    double *ad = malloc(sizeof(double) * (size_t)(m * k)), *bd = malloc(sizeof(double) * (size_t)(k * n));
    char *a = malloc((size_t)(m * k) * es), *b = malloc((size_t)(k * n) * es);
    char *c = malloc((size_t)(m * n) * es);
    for (int64_t i = 0; i < m * k; i++) {
        ad[i] = rnd();
        if (es == 4) ((float *)a)[i] = (float)ad[i]; else ((double *)a)[i] = ad[i];
    }
    for (int64_t i = 0; i < k * n; i++) {
        bd[i] = rnd();
        if (es == 4) ((float *)b)[i] = (float)bd[i]; else ((double *)b)[i] = bd[i];
    }
    asymo_gemm_packed pa, pb;
    void *abuf = NULL, *bbuf = NULL;
    memset(&pa, 0, sizeof pa);
    memset(&pb, 0, sizeof pb);
    int64_t abytes = asymo_gemm_packed_bytes(isa, dtype, ASYMO_PACK_A, m, k);
    int64_t bbytes = asymo_gemm_packed_bytes(isa, dtype, ASYMO_PACK_B, n, k);
    if (posix_memalign(&abuf, 64, (size_t)abytes + 64) || posix_memalign(&bbuf, 64, (size_t)bbytes + 64))
        return 1;
    pa.side = ASYMO_PACK_A; pa.dtype = dtype; pa.dim = m; pa.k = k; pa.nlayouts = 1;
    pa.isa[0] = isa; pa.kc[0] = kc; pa.data[0] = abuf;
    pb.side = ASYMO_PACK_B; pb.dtype = dtype; pb.dim = n; pb.k = k; pb.nlayouts = 1;
    pb.isa[0] = isa; pb.kc[0] = kc; pb.data[0] = bbuf;
    if (asymo_gemm_pack(isa, dtype, ASYMO_PACK_A, m, k, kc, a, k, 1, abuf) != ASYMO_OK
        || asymo_gemm_pack(isa, dtype, ASYMO_PACK_B, n, k, kc, b, n, 1, bbuf) != ASYMO_OK) {
        printf("asymo_gemm_pack failed\n");
        return 1;
    }
    asymo_gemm_args g;
    memset(&g, 0, sizeof g);
    g.dtype = dtype; g.m = m; g.k = k; g.n = n;
    g.a = pack_a ? NULL : a; g.rsa = k; g.csa = 1;
    g.b = pack_b ? NULL : b; g.rsb = n; g.csb = 1;
    g.c = c; g.rsc = n; g.csc = 1; g.nbatch = 1;
    g.a_packed = pack_a ? &pa : NULL;
    g.b_packed = pack_b == 1 ? &pb : NULL;
    implicit_b ib = {b, n, es};
    if (pack_b == 2) { /* packed A with an implicit B (conv2d: weights @ im2col) */
        g.b = NULL;
        g.pack_b = implicit_pack_b;
        g.pack_b_ctx = &ib;
    }
    asymo_gemm_plan p;
    memset(&p, 0, sizeof p);
    p.kind = ASYMO_GEMM_MM; p.split_dim = split_dim; p.isa = isa; p.nclusters = 2;
    const int64_t dim = split_dim == ASYMO_SPLIT_M ? m : n, unit = split_dim == ASYMO_SPLIT_M ? mr : nr;
    p.stop[0] = p.start[1] = dim / 3 / unit * unit;
    p.stop[1] = dim;
    for (int cl = 0; cl < 2; cl++) {
        p.mc[cl] = 2 * mr; p.nc[cl] = 2 * nr; p.kc[cl] = kc; p.chunk[cl] = 1;
    }
    if (shared == 2) {
        for (int cl = 0; cl < 2; cl++) {
            p.mc[cl] = mr;
            p.nc[cl] = (n + nr - 1) / nr * nr;
        }
    } else if (shared) {
        p.nclusters = 1;
        p.stop[0] = dim;
        p.mc[0] = mr;
        p.nc[0] = (n + nr - 1) / nr * nr;
    }
    int rc = asymo_gemm(pool, &g, &p);
    if (rc != ASYMO_OK) {
        printf("packed asymo_gemm failed: %d\n", rc);
        bad = 1;
    }
    const double eps = es == 4 ? 1.2e-7 : 2.3e-16;
    for (int64_t i = 0; i < m && !bad; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                ref += ad[i * k + q] * bd[q * n + j];
                mag += fabs(ad[i * k + q] * bd[q * n + j]);
            }
            double got = es == 4 ? ((float *)c)[i * n + j] : ((double *)c)[i * n + j];
            if (!(fabs(got - ref) <= 2.0 * (k + 2) * eps * mag + 1e-30)) {
                printf("MISMATCH packed isa=%s dtype=%d %lldx%lldx%lld (%d%d) at (%lld,%lld)\n",
                       asymo_isa_name(isa), dtype, (long long)m, (long long)k, (long long)n,
                       pack_a, pack_b, (long long)i, (long long)j);
                bad = 1;
                break;
            }
        }
    free(ad); free(bd); free(a); free(b); free(c); free(abuf); free(bbuf);
    return bad;
}

int main(void)
{
    const shape_t shapes[] = {
        {37, 29, 41, ASYMO_GEMM_MM, ASYMO_SPLIT_M}, {64, 300, 70, ASYMO_GEMM_MM, ASYMO_SPLIT_N},
        {1, 7, 1, ASYMO_GEMM_MM, ASYMO_SPLIT_M},    {61, 43, 3, ASYMO_GEMM_MV, ASYMO_SPLIT_M},
        {3, 43, 61, ASYMO_GEMM_MV, ASYMO_SPLIT_N},  {29, 1, 33, ASYMO_GEMM_OUTER, ASYMO_SPLIT_M},
        /* few rows: B read in place by both clusters (M split 4 + 9, N split), by one */
        {13, 45, 53, ASYMO_GEMM_MM, ASYMO_SPLIT_M}, {40, 37, 70, ASYMO_GEMM_MM, ASYMO_SPLIT_N},
        {120, 20, 35, ASYMO_GEMM_MM, ASYMO_SPLIT_M},
    };
    const int cpus[2] = {-1, -1}, clusters[2] = {0, 1};
    int err = 0;
    asymo_pool *pool = asymo_pool_create(2, cpus, clusters, 2, ASYMO_POLICY_STEAL, ASYMO_QUEUE_DEFAULT, &err);
    const int one_cluster[2] = {0, 0};
    asymo_pool *shared_pool = asymo_pool_create(2, cpus, one_cluster, 1, ASYMO_POLICY_STEAL,
                                                ASYMO_QUEUE_DEFAULT, &err);
    if (!pool || !shared_pool) {
        printf("pool creation failed: %d\n", err);
        return 2;
    }
    int failures = 0;
    for (int isa = 0; isa < 4; isa++) {
        int mr, nr;
        if (asymo_gemm_kernel_tile(isa, ASYMO_DTYPE_F32, &mr, &nr) != ASYMO_OK)
            continue;
        int cases = 0;
        for (int dtype = 0; dtype < 2; dtype++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int ta = 0; ta < 2; ta++)
                    for (int use_pool = 0; use_pool < 2; use_pool++) {
                        for (int ub = 0; ub < 2; ub++) {
                            failures += check_one(use_pool ? pool : NULL, isa, dtype,
                                                  &shapes[si], ta, mr + 1, nr - 1, 13, ub);
                            failures += check_one(use_pool ? pool : NULL, isa, dtype,
                                                  &shapes[si], ta, 4 * mr, 2 * nr, 1000, ub);
                            cases += 2;
                        }
                    }
        for (int dtype = 0; dtype < 2; dtype++)
            for (int pk = 0; pk < 5; pk++)
                for (int use_pool = 0; use_pool < 2; use_pool++) {
                    /* (A packed, B packed / plain / implicit): 11, 01, 10, 11, 12 */
                    failures += check_packed(use_pool ? pool : NULL, isa, dtype, 53, 75, 61,
                                             pk & 1 ? ASYMO_SPLIT_N : ASYMO_SPLIT_M, 32,
                                             pk != 1, pk == 4 ? 2 : pk != 2, 0);
                    cases++;
                }
        /* packers meeting on one column block, B plain and implicit (a 7 x 7 plane's
         * convolution), repeated so they meet in many orders: one cluster of two workers
         * sharing each panel's slivers (shared 1), two clusters whose second reads the first
         * one's panels (shared 2) */
        for (int shared = 1; shared <= 2; shared++)
            for (int dtype = 0; dtype < 2; dtype++)
                for (int rep = 0; rep < 20; rep++)
                    for (int implicit = 0; implicit < 2; implicit++) {
                        failures += check_packed(shared == 1 ? shared_pool : pool, isa, dtype,
                                                 24 * mr, 150, 49, ASYMO_SPLIT_M, 16, 1,
                                                 implicit ? 2 : 0, shared);
                        cases++;
                    }
        asymo_gemm_kernel_tile(isa, ASYMO_DTYPE_F32, &mr, &nr);
        printf("isa %s: f32 tile %dx%d, %d cases\n", asymo_isa_name(isa), mr, nr, cases);
    }
    asymo_pool_destroy(pool);
    asymo_pool_destroy(shared_pool);
    printf("%s\n", failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}
