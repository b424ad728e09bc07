/* GEMM driver: the BLIS five loops cut into pool tasks, plus the skinny and outer-product
 * paths. See gemm.h for the model.
 *
 * Packing B without barriers. Every task of a cluster needs the kc x nc panels of B for its
 * column block. A panel is cut into nr-wide slivers; a task that reaches a panel claims slivers
 * from the panel's atomic counter and packs them until none is left, then computes sliver by
 * sliver, spinning only on a sliver another thread has claimed and is packing right now. A
 * claimed sliver is always being packed by a running thread that never waits while packing,
 * so no task ever waits for work that needs the waiting thread (or any queued task): a stolen
 * task cannot deadlock, and no barrier exists. Each panel is packed exactly once per cluster,
 * by the cluster that computes with it; a task stolen by another cluster packs a private copy. */
#define _GNU_SOURCE /* sched_getcpu */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu_features.h"
#include "gemm.h"
#include "gemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAXC ASYMO_GEMM_MAX_CLUSTERS

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ------------------------------------------------------------------------------------------
 * Workspace cache. Packed panels of a large GEMM are megabytes; fresh pages on every call
 * would cost more in page faults than the packing itself, so buffers are kept for reuse.
 * ---------------------------------------------------------------------------------------- */
#define WS_SLOTS 6
#define WS_HUGE ((size_t)2 << 20)

static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t size;
} ws_cache[WS_SLOTS];

/* A fork while another thread holds ws_lock would leave the child's copy locked forever:
 * the child starts with a fresh lock and an empty cache (the parent's buffers are leaked
 * there, not freed: they may be in use by the parent's threads' copies). */
static void ws_after_fork_child(void)
{
    pthread_mutex_init(&ws_lock, NULL);
    memset(ws_cache, 0, sizeof ws_cache);
}

__attribute__((constructor)) static void ws_register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, ws_after_fork_child);
}

static void *ws_alloc(size_t size)
{
    void *p = NULL;
    size_t align = size >= WS_HUGE ? WS_HUGE : ASYMO_ALIGN;
    if (posix_memalign(&p, align, size) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    /* Panels are streamed with large strides between slivers: huge pages spare TLB misses. */
    if (size >= WS_HUGE)
        madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

static void *ws_acquire(size_t want, size_t *got)
{
    int best = -1;
    want = want >= WS_HUGE ? round_up(want, WS_HUGE) : round_up(want, 4096);
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++)
        if (ws_cache[i].p && ws_cache[i].size >= want
            && (best < 0 || ws_cache[i].size < ws_cache[best].size))
            best = i;
    if (best >= 0) {
        void *p = ws_cache[best].p;
        *got = ws_cache[best].size;
        ws_cache[best].p = NULL;
        ws_cache[best].size = 0;
        pthread_mutex_unlock(&ws_lock);
        return p;
    }
    pthread_mutex_unlock(&ws_lock);
    *got = want;
    return ws_alloc(want);
}

static void ws_release(void *p, size_t size)
{
    int slot = -1;
    if (!p)
        return;
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++)
        if (!ws_cache[i].p) {
            slot = i;
            break;
        }
    if (slot < 0) { /* evict the smallest buffer if this one is larger */
        int small = 0;
        for (int i = 1; i < WS_SLOTS; i++)
            if (ws_cache[i].size < ws_cache[small].size)
                small = i;
        if (ws_cache[small].size < size) {
            free(ws_cache[small].p);
            slot = small;
        }
    }
    if (slot >= 0) {
        ws_cache[slot].p = p;
        ws_cache[slot].size = size;
        p = NULL;
    }
    pthread_mutex_unlock(&ws_lock);
    free(p);
}

int64_t asymo_gemm_workspace_bytes(void)
{
    int64_t total = 0;
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++)
        total += (int64_t)ws_cache[i].size;
    pthread_mutex_unlock(&ws_lock);
    return total;
}

void asymo_gemm_workspace_trim(void)
{
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++) {
        free(ws_cache[i].p);
        ws_cache[i].p = NULL;
        ws_cache[i].size = 0;
    }
    pthread_mutex_unlock(&ws_lock);
}

/* Bump allocator over one workspace buffer. */
typedef struct {
    char *base;
    size_t used;
} carve;

static void *carve_take(carve *cv, size_t bytes)
{
    void *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += round_up(bytes, ASYMO_ALIGN);
    return p;
}

/* ------------------------------------------------------------------------------------------
 * Kernel choice
 * ---------------------------------------------------------------------------------------- */
static const asymo_gemm_kernel *kernel_for(int isa, int dtype)
{
    if (isa < 0 || isa > 31 || !(asymo_isa_supported() & (1u << isa)))
        return NULL;
    switch (isa) {
    case ASYMO_ISA_PORTABLE:
        return dtype == ASYMO_DTYPE_F32 ? &asymo_gemm_portable_f32 : &asymo_gemm_portable_f64;
#if defined(__x86_64__)
    case ASYMO_ISA_AVX2_FMA:
        return dtype == ASYMO_DTYPE_F32 ? &asymo_gemm_avx2_f32 : &asymo_gemm_avx2_f64;
    case ASYMO_ISA_AVX512:
        return dtype == ASYMO_DTYPE_F32 ? &asymo_gemm_avx512_f32 : &asymo_gemm_avx512_f64;
#endif
#if defined(__aarch64__)
    case ASYMO_ISA_NEON:
        return dtype == ASYMO_DTYPE_F32 ? &asymo_gemm_neon_f32 : &asymo_gemm_neon_f64;
#endif
    default:
        return NULL;
    }
}

#if defined(__x86_64__)
#include <cpuid.h>
/* AMD family 19h with AVX-512 is Zen 4: its 512-bit FMAs are double-pumped 256-bit ones. On the
 * development machine (EPYC Zen 4, 2 cores) the AVX-512 kernel matched AVX2 on one core but
 * fell to 0.5-0.8x of it when both cores ran it, while AVX2 kept its speed on both. */
static int double_pumped_avx512(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx))
        return 0;
    const int amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
    if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    unsigned family = (eax >> 8) & 0xf;
    if (family == 0xf)
        family += (eax >> 20) & 0xff;
    return family == 0x19;
}
#endif

int asymo_gemm_current_cpu(void)
{
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
}

int asymo_gemm_default_isa(void)
{
    int best = asymo_isa_best();
#if defined(__x86_64__)
    if (best == ASYMO_ISA_AVX512 && double_pumped_avx512()
        && (asymo_isa_supported() & (1u << ASYMO_ISA_AVX2_FMA)))
        best = ASYMO_ISA_AVX2_FMA;
#endif
    return kernel_for(best, ASYMO_DTYPE_F32) ? best : ASYMO_ISA_PORTABLE;
}

int asymo_gemm_kernel_tile(int isa, int dtype, int *mr, int *nr)
{
    const asymo_gemm_kernel *k;
    if (dtype != ASYMO_DTYPE_F32 && dtype != ASYMO_DTYPE_F64)
        return ASYMO_EINVAL;
    k = kernel_for(isa, dtype);
    if (!k)
        return ASYMO_EINVAL;
    if (mr)
        *mr = k->mr;
    if (nr)
        *nr = k->nr;
    return ASYMO_OK;
}

/* ------------------------------------------------------------------------------------------
 * Packing (templated on the element type)
 * ---------------------------------------------------------------------------------------- */
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

typedef struct {
    void (*pack_a)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int, asymo_pack_rows_fn);
    void (*pack_b)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int);
    void (*merge)(void *, int64_t, int64_t, const void *, int, int64_t, int64_t, int);
    asymo_skinny_fn skinny_strided;
    void (*outer)(const void *, int64_t, const void *, int64_t, void *, int64_t, int64_t,
                  int64_t, int64_t, int64_t, int64_t);
    void (*reduce)(void *, int64_t, int64_t, void *, int64_t, int64_t, int64_t, int64_t);
    void (*zero)(void *, int64_t, int64_t, int64_t, int64_t);
} dtype_ops;

#define OPS(SUFFIX)                                                                            \
    {(void (*)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,    \
               int, asymo_pack_rows_fn))pack_a_##SUFFIX,                                                           \
     (void (*)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,    \
               int))pack_b_##SUFFIX,                                                           \
     (void (*)(void *, int64_t, int64_t, const void *, int, int64_t, int64_t,                 \
               int))merge_tile_##SUFFIX,                                                       \
     skinny_strided_##SUFFIX, outer_##SUFFIX, reduce_##SUFFIX, zero_##SUFFIX}

static const dtype_ops ops_f32 = OPS(f32);
static const dtype_ops ops_f64 = OPS(f64);

/* ------------------------------------------------------------------------------------------
 * Problem in canonical form (one batch item) and per-cluster task geometry
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    const char *a, *b;
    char *c;
    int64_t m, n, k, rsa, csa, rsb, csb, rsc, csc;
    void (*pack_b)(const void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t);
    const void *pack_b_ctx;
} operands;

/* The skinny product out(L x S) = mat(L x K) @ vec(K x S) seen from one orientation. */
typedef struct {
    const char *mat, *vec;
    char *out;
    int64_t l, s, k, rsl, csp, rsp, css, orl, ocs;
} skinny_view;

static skinny_view skinny_orient(const operands *o, int long_is_m)
{
    skinny_view v;
    if (long_is_m) {
        v = (skinny_view){o->a, o->b, o->c, o->m, o->n, o->k,
                          o->rsa, o->csa, o->rsb, o->csb, o->rsc, o->csc};
    } else { /* C^T = B^T A^T */
        v = (skinny_view){o->b, o->a, o->c, o->n, o->m, o->k,
                          o->csb, o->rsb, o->csa, o->rsa, o->csc, o->rsc};
    }
    return v;
}

typedef struct {
    int64_t r0, r1, q0, q1; /* rows and columns of C this cluster computes */
    int64_t mc, nc, kc;
    int64_t ntm, ntn, npc;  /* blocks along M, N and panels along K */
    int64_t chunk;          /* MV / OUTER: elements of the split dimension per task */
    int64_t k0, k1, kchunk; /* MV in axpy form: the cluster's share of K, K per task */
    int64_t task0, ntasks;
    /* MM only */
    int64_t nsl;            /* slivers in a full-width panel */
    int64_t panel_elems;    /* elements of a full panel */
    char *bpack;
    const char *apre, *bpre; /* pre-packed A / B layout this cluster uses, or NULL */
    _Atomic int64_t *claim; /* per panel: next sliver to pack */
    _Atomic unsigned char *ready; /* per panel and sliver: packed */
} cluster_part;

typedef struct {
    const asymo_gemm_kernel *kern;
    const dtype_ops *ops;
    int kind, split_dim, es, mr, nr;
    int64_t mpad, npad;     /* M and N rounded up to mr and nr (pre-packed layouts) */
    int nclusters;
    int nslots;
    const asymo_pool *pool;
    int long_is_m;          /* MV: orientation */
    int vec_copied;         /* MV dot form: vec copied into vecbuf */
    int ksplit;             /* MV axpy form: tasks own K ranges, partial sums reduced */
    char *partial;          /* ksplit: one S x L partial result per task */
    size_t partial_bytes;
    int64_t ktasks;
    _Atomic int64_t *kdone; /* ksplit: tasks finished; the last one reduces */
    operands o;
    skinny_view sv;
    asymo_skinny_fn skinny;
    cluster_part cl[MAXC];
    /* per-slot scratch (slot = pool worker, last slot for the submitting thread) */
    char *apack;
    size_t apack_bytes;
    char *tile;
    size_t tile_bytes;
    char *bslot;            /* SPLIT_BATCH: per-slot B panel */
    size_t bslot_bytes;
    char *vecbuf;           /* MV dot form: contiguous copy of the vectors (shared or per slot) */
    size_t vec_bytes;
    /* batch */
    const asymo_gemm_args *args;
    int64_t item;
} job;

/* Scratch slot of the calling thread: its worker index in the job's pool, or the last slot
 * for the thread that submitted the job (which may run tasks itself). */
/* The cluster part a task id belongs to: parts hold consecutive task ranges, cluster order. */
static inline const cluster_part *part_of_task(const job *J, int64_t t)
{
    int c = 0;
    while (t >= J->cl[c].task0 + J->cl[c].ntasks)
        c++;
    return &J->cl[c];
}

static int slot_of(const job *J)
{
    if (J->pool && asymo_pool_current() == J->pool) {
        int w = asymo_pool_current_worker();
        if (w >= 0 && w < J->nslots - 1)
            return w;
    }
    return J->nslots - 1;
}

static operands item_operands(const asymo_gemm_args *g, int64_t i)
{
    operands o = {(const char *)g->a, (const char *)g->b, (char *)g->c, g->m, g->n, g->k,
                  g->rsa, g->csa, g->rsb, g->csb, g->rsc, g->csc, g->pack_b, g->pack_b_ctx};
    if (g->nbatch > 1) {
        o.a += g->a_offsets[i];
        o.b += g->b_offsets[i];
        o.c += g->c_offsets[i];
    }
    return o;
}

/* ------------------------------------------------------------------------------------------
 * MM: one task = an mc x nc block of C over the whole K loop
 * ---------------------------------------------------------------------------------------- */
static void spin_until_ready(_Atomic unsigned char *flag)
{
    unsigned spins = 0;
    while (!atomic_load_explicit(flag, memory_order_acquire)) {
        CPU_RELAX();
        if (++spins == (1u << 14)) { /* the packer was preempted: let it run */
            sched_yield();
            spins = 0;
        }
    }
}

/* One nr-wide sliver of B (columns [jj, jj + cols), rows [p0, p0 + kb)) into dst: from
 * memory, or from the caller's implicit-B packer. */
static inline void pack_b_sliver(const job *J, const operands *o, void *dst, int64_t jj,
                                 int64_t cols, int64_t p0, int64_t kb)
{
    if (o->pack_b)
        o->pack_b(o->pack_b_ctx, dst, jj, cols, p0, kb, J->nr);
    else
        J->ops->pack_b(dst, o->b, o->rsb, o->csb, jj, cols, p0, kb, J->nr);
}

/* Compute C[i0:i1, j0:j1] += / = Apack @ Bsliver... for one kc step; `bsl(s)` gives sliver s. */
static void mm_macro(const job *J, const operands *o, const char *apack, char *tile,
                     int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t kb, int accumulate,
                     const cluster_part *C, int64_t panel, const char *bpanel)
{
    const int mr = J->mr, nr = J->nr, es = J->es;
    const int64_t nsl = cdiv(j1 - j0, nr);
    for (int64_t s = 0; s < nsl; s++) {
        const int64_t jj = j0 + s * nr;
        const int64_t cols = min64(nr, j1 - jj);
        if (C)
            spin_until_ready(&C->ready[panel * C->nsl + s]);
        const char *bs = bpanel + (size_t)(s * kb * nr) * es;
        const char *ap = apack;
        for (int64_t ii = i0; ii < i1; ii += mr) {
            const int64_t rows = min64(mr, i1 - ii);
            char *cp = o->c + (ii * o->rsc + jj * o->csc) * es;
            if (rows == mr && cols == nr && o->csc == 1) {
                J->kern->ukr(kb, ap, bs, cp, o->rsc, accumulate);
            } else {
                J->kern->ukr(kb, ap, bs, tile, nr, 0);
                J->ops->merge(cp, o->rsc, o->csc, tile, nr, rows, cols, accumulate);
            }
            ap += (size_t)(kb * mr) * es;
        }
    }
}

static void mm_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const operands *o = &J->o;
    const int64_t lt = t - C->task0;
    const int64_t tn = lt / C->ntm, tm = lt % C->ntm;
    const int64_t i0 = C->r0 + tm * C->mc, i1 = min64(i0 + C->mc, C->r1);
    const int64_t j0 = C->q0 + tn * C->nc, j1 = min64(j0 + C->nc, C->q1);
    const int64_t nsl = cdiv(j1 - j0, J->nr);
    const int slot = slot_of(J);
    char *apack = J->apack + J->apack_bytes * slot;
    char *tile = J->tile + J->tile_bytes * slot;
    const int es = J->es, nr = J->nr;
    /* A task stolen by a worker of another (faster) cluster packs its B panels into that
     * worker's own scratch: it never waits on the owning cluster's packers, one of which may
     * be descheduled mid-sliver, and it keeps its data in the thief's caches. */
    const int stolen = J->bslot_bytes > 0 && J->pool && asymo_pool_current() == J->pool
                       && asymo_pool_current_cluster() != (int)(C - J->cl);

    for (int64_t pc = 0; pc < C->npc; pc++) {
        const int64_t p0 = pc * C->kc, kb = min64(C->kc, o->k - p0);
        const int64_t panel = tn * C->npc + pc;
        const char *ap = apack;
        if (C->apre)
            ap = C->apre + (size_t)(p0 * J->mpad + i0 * kb) * es;
        else
            J->ops->pack_a(apack, o->a, o->rsa, o->csa, i0, i1, p0, kb, J->mr,
                           J->kern->pack_a_rows);
        if (C->bpre) {
            mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, NULL, 0,
                     C->bpre + (size_t)(p0 * J->npad + j0 * kb) * es);
            continue;
        }
        if (stolen) {
            char *own = J->bslot + J->bslot_bytes * slot;
            for (int64_t s = 0; s < nsl; s++) {
                const int64_t jj = j0 + s * nr;
                pack_b_sliver(J, o, own + (size_t)(s * kb * nr) * es, jj,
                              min64(nr, j1 - jj), p0, kb);
            }
            mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, NULL, 0, own);
            continue;
        }
        char *bpanel = C->bpack + (size_t)(panel * C->panel_elems) * es;
        /* help pack the shared panel */
        if (atomic_load_explicit(&C->claim[panel], memory_order_relaxed) < nsl) {
            for (;;) {
                const int64_t s = atomic_fetch_add_explicit(&C->claim[panel], 1,
                                                            memory_order_relaxed);
                if (s >= nsl)
                    break;
                const int64_t jj = j0 + s * nr;
                pack_b_sliver(J, o, bpanel + (size_t)(s * kb * nr) * es, jj,
                              min64(nr, j1 - jj), p0, kb);
                atomic_store_explicit(&C->ready[panel * C->nsl + s], 1, memory_order_release);
            }
        }
        mm_macro(J, o, ap, tile, i0, i1, j0, j1, kb, pc > 0, C, panel, bpanel);
    }
}

/* A whole product in the calling thread with its slot's scratch (SPLIT_BATCH tasks). */
static void mm_serial(const job *J, const operands *o, const cluster_part *C, int slot)
{
    char *apack = J->apack + J->apack_bytes * slot;
    char *tile = J->tile + J->tile_bytes * slot;
    char *bpanel = J->bslot + J->bslot_bytes * slot;
    const int es = J->es, nr = J->nr;
    for (int64_t j0 = 0; j0 < o->n; j0 += C->nc) {
        const int64_t j1 = min64(j0 + C->nc, o->n);
        for (int64_t p0 = 0; p0 < o->k; p0 += C->kc) {
            const int64_t kb = min64(C->kc, o->k - p0);
            for (int64_t jj = j0, s = 0; jj < j1; jj += nr, s++)
                pack_b_sliver(J, o, bpanel + (size_t)(s * kb * nr) * es, jj,
                              min64(nr, j1 - jj), p0, kb);
            for (int64_t i0 = 0; i0 < o->m; i0 += C->mc) {
                const int64_t i1 = min64(i0 + C->mc, o->m);
                J->ops->pack_a(apack, o->a, o->rsa, o->csa, i0, i1, p0, kb, J->mr, J->kern->pack_a_rows);
                mm_macro(J, o, apack, tile, i0, i1, j0, j1, kb, p0 > 0, NULL, 0, bpanel);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * MV and OUTER
 * ---------------------------------------------------------------------------------------- */
static asymo_skinny_fn skinny_pick(const job *J, const skinny_view *v, int *copy_vec)
{
    *copy_vec = 0;
    if (v->csp == 1 || v->k == 1) {
        *copy_vec = !(v->rsp == 1 || v->k == 1);
        return J->kern->skinny_dot;
    }
    if (v->rsl == 1 || v->l == 1)
        return J->kern->skinny_axpy;
    return J->ops->skinny_strided;
}

/* Copy the vectors of the dot form into dst as S contiguous rows of K. */
static void copy_vectors(const job *J, const skinny_view *v, char *dst)
{
    const int es = J->es;
    for (int64_t s = 0; s < v->s; s++)
        for (int64_t p = 0; p < v->k; p++)
            memcpy(dst + (size_t)(s * v->k + p) * es, v->vec + (p * v->rsp + s * v->css) * es,
                   (size_t)es);
}

static void skinny_run(const job *J, const skinny_view *v, asymo_skinny_fn fn, const char *vec,
                       int copied, int64_t l0, int64_t l1)
{
    const int64_t rsp = copied ? 1 : v->rsp, css = copied ? v->k : v->css;
    fn(l0, l1, v->s, v->k, v->mat, v->rsl, v->csp, vec, rsp, css, v->out, v->orl, v->ocs);
}

static void mv_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const skinny_view *v = &J->sv;
    const int64_t start = J->split_dim == ASYMO_SPLIT_M ? C->r0 : C->q0;
    const int64_t stop = J->split_dim == ASYMO_SPLIT_M ? C->r1 : C->q1;
    const int64_t l0 = start + (t - C->task0) * C->chunk, l1 = min64(l0 + C->chunk, stop);
    skinny_run(J, v, J->skinny, J->vec_copied ? J->vecbuf : v->vec, J->vec_copied, l0, l1);
}

/* MV whose big operand runs along the long dimension (x @ W with W row-major): splitting the
 * long dimension would cut every row of W into short pieces read by different cores, so the
 * clusters' shares are applied to K instead. Each task reads whole rows of W for its K range
 * into a private partial result; the last task to finish adds the partials up (no task ever
 * waits). */
static void mv_ksplit_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const skinny_view *v = &J->sv;
    const int es = J->es;
    const int64_t p0 = C->k0 + (t - C->task0) * C->kchunk, p1 = min64(p0 + C->kchunk, C->k1);
    char *part = J->partial + J->partial_bytes * (size_t)t;
    J->skinny(0, v->l, v->s, p1 - p0, v->mat + p0 * v->csp * es, v->rsl, v->csp,
              v->vec + p0 * v->rsp * es, v->rsp, v->css, part, 1, v->l);
    if (atomic_fetch_add_explicit(J->kdone, 1, memory_order_acq_rel) == J->ktasks - 1)
        J->ops->reduce(v->out, v->orl, v->ocs, J->partial, J->ktasks,
                       (int64_t)(J->partial_bytes / (size_t)es), v->s, v->l);
}

static void outer_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const operands *o = &J->o;
    int64_t i0 = 0, i1 = o->m, j0 = 0, j1 = o->n;
    if (J->split_dim == ASYMO_SPLIT_M) {
        i0 = C->r0 + (t - C->task0) * C->chunk;
        i1 = min64(i0 + C->chunk, C->r1);
    } else {
        j0 = C->q0 + (t - C->task0) * C->chunk;
        j1 = min64(j0 + C->chunk, C->q1);
    }
    J->ops->outer(o->a, o->rsa, o->b, o->csb, o->c, o->rsc, o->csc, i0, i1, j0, j1);
}

/* One whole item in the calling thread. */
static void item_serial(const job *J, const operands *o, const cluster_part *C, int slot)
{
    if (o->m == 0 || o->n == 0)
        return;
    if (o->k == 0) {
        J->ops->zero(o->c, o->rsc, o->csc, o->m, o->n);
        return;
    }
    if (J->kind == ASYMO_GEMM_OUTER) {
        J->ops->outer(o->a, o->rsa, o->b, o->csb, o->c, o->rsc, o->csc, 0, o->m, 0, o->n);
    } else if (J->kind == ASYMO_GEMM_MV) {
        skinny_view v = skinny_orient(o, J->long_is_m);
        int copy;
        asymo_skinny_fn fn = skinny_pick(J, &v, &copy);
        char *vec = (char *)v.vec;
        if (copy) {
            vec = J->vecbuf + J->vec_bytes * slot;
            copy_vectors(J, &v, vec);
        }
        skinny_run(J, &v, fn, vec, copy, 0, v.l);
    } else {
        mm_serial(J, o, C, slot);
    }
}

static void batch_task(int64_t t, void *ctx)
{
    const job *J = (const job *)ctx;
    const cluster_part *C = part_of_task(J, t);
    const int slot = slot_of(J);
    const int64_t first = C->r0 + (t - C->task0) * C->chunk;
    const int64_t last = min64(first + C->chunk, C->r1);
    for (int64_t i = first; i < last; i++) {
        operands o = item_operands(J->args, i);
        item_serial(J, &o, C, slot);
    }
}

/* ------------------------------------------------------------------------------------------
 * Validation, geometry, dispatch
 * ---------------------------------------------------------------------------------------- */
static int check(const asymo_gemm_args *g, const asymo_gemm_plan *p)
{
    if (!g || !p)
        return ASYMO_EINVAL;
    if (g->dtype != ASYMO_DTYPE_F32 && g->dtype != ASYMO_DTYPE_F64)
        return ASYMO_EINVAL;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->nbatch < 1)
        return ASYMO_EINVAL;
    if (g->nbatch > 1 && (!g->a_offsets || !g->b_offsets || !g->c_offsets))
        return ASYMO_EINVAL;
    if (g->m > 0 && g->n > 0
        && (!g->c || (g->k > 0 && ((!g->a && !g->a_packed)
                                   || (!g->b && !g->pack_b && !g->b_packed)))))
        return ASYMO_EINVAL;
    if ((g->a_packed || g->b_packed)
        && (p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH || g->nbatch != 1))
        return ASYMO_EINVAL;
    if (g->a_packed && (g->a_packed->side != ASYMO_PACK_A || g->a_packed->dtype != g->dtype
                        || g->a_packed->dim != g->m || g->a_packed->k != g->k
                        || g->a_packed->nlayouts < 0 || g->a_packed->nlayouts > MAXC))
        return ASYMO_EINVAL;
    if (g->b_packed && (g->b_packed->side != ASYMO_PACK_B || g->b_packed->dtype != g->dtype
                        || g->b_packed->dim != g->n || g->b_packed->k != g->k
                        || g->b_packed->nlayouts < 0 || g->b_packed->nlayouts > MAXC))
        return ASYMO_EINVAL;
    if (g->pack_b && (p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH
                      || g->nbatch != 1))
        return ASYMO_EINVAL;
    if (p->nclusters < 1 || p->nclusters > MAXC)
        return ASYMO_EINVAL;
    if (p->kind < ASYMO_GEMM_MM || p->kind > ASYMO_GEMM_OUTER)
        return ASYMO_EINVAL;
    if (p->split_dim < ASYMO_SPLIT_M || p->split_dim > ASYMO_SPLIT_BATCH)
        return ASYMO_EINVAL;
    if (!kernel_for(p->isa, g->dtype))
        return ASYMO_EINVAL;
    const int64_t dim = p->split_dim == ASYMO_SPLIT_M ? g->m
                        : p->split_dim == ASYMO_SPLIT_N ? g->n : g->nbatch;
    for (int c = 0; c < p->nclusters; c++) {
        if (p->start[c] > p->stop[c] || (c == 0 ? p->start[c] != 0
                                                : p->start[c] != p->stop[c - 1]))
            return ASYMO_EINVAL;
        if (p->mc[c] < 1 || p->nc[c] < 1 || p->kc[c] < 1)
            return ASYMO_EINVAL;
        if ((p->kind != ASYMO_GEMM_MM || p->split_dim == ASYMO_SPLIT_BATCH) && p->chunk[c] < 1)
            return ASYMO_EINVAL;
    }
    if (p->stop[p->nclusters - 1] != dim)
        return ASYMO_EINVAL;
    if (p->kind == ASYMO_GEMM_OUTER && g->k > 1)
        return ASYMO_EINVAL;
    if (p->kind == ASYMO_GEMM_MV) {
        if (p->split_dim == ASYMO_SPLIT_M && g->n > ASYMO_SKINNY_MAX)
            return ASYMO_EINVAL;
        if (p->split_dim == ASYMO_SPLIT_N && g->m > ASYMO_SKINNY_MAX)
            return ASYMO_EINVAL;
        if (p->split_dim == ASYMO_SPLIT_BATCH && g->m > ASYMO_SKINNY_MAX
            && g->n > ASYMO_SKINNY_MAX)
            return ASYMO_EINVAL;
    }
    return ASYMO_OK;
}

/* Fill the geometry of every cluster; returns the total number of tasks. */
/* The layout of pk packed for (isa, kc), or NULL. Two kc that both cover K give one block. */
static const char *packed_layout(const asymo_gemm_packed *pk, int isa, int64_t kc, int64_t k)
{
    if (!pk)
        return NULL;
    for (int l = 0; l < pk->nlayouts; l++)
        if (pk->isa[l] == isa && pk->data[l] && (pk->kc[l] == kc || (pk->kc[l] >= k && kc >= k)))
            return (const char *)pk->data[l];
    return NULL;
}

static int64_t geometry(job *J, const asymo_gemm_args *g, const asymo_gemm_plan *p)
{
    int64_t total = 0;
    J->nclusters = p->nclusters;
    for (int c = 0; c < p->nclusters; c++) {
        cluster_part *C = &J->cl[c];
        memset(C, 0, sizeof *C);
        C->r0 = 0;
        C->r1 = g->m;
        C->q0 = 0;
        C->q1 = g->n;
        if (p->split_dim == ASYMO_SPLIT_M || p->split_dim == ASYMO_SPLIT_BATCH) {
            C->r0 = p->start[c];
            C->r1 = p->stop[c];
        } else {
            C->q0 = p->start[c];
            C->q1 = p->stop[c];
        }
        C->mc = p->mc[c];
        C->nc = p->nc[c];
        C->kc = p->kc[c];
        C->task0 = total;
        if (p->split_dim == ASYMO_SPLIT_BATCH) {
            C->chunk = p->chunk[c];
            C->ntasks = cdiv(C->r1 - C->r0, C->chunk);
        } else if (g->m == 0 || g->n == 0 || g->k == 0) {
            C->ntasks = 0;
        } else if (p->kind == ASYMO_GEMM_MM) {
            C->ntm = cdiv(C->r1 - C->r0, C->mc);
            C->ntn = cdiv(C->q1 - C->q0, C->nc);
            C->npc = cdiv(g->k, C->kc);
            C->ntasks = C->ntm * C->ntn;
        } else {
            C->chunk = p->chunk[c];
            C->ntasks = p->split_dim == ASYMO_SPLIT_M ? cdiv(C->r1 - C->r0, C->chunk)
                                                      : cdiv(C->q1 - C->q0, C->chunk);
        }
        if (C->r1 <= C->r0 || C->q1 <= C->q0)
            C->ntasks = 0;
        total += C->ntasks;
    }
    return total;
}

int64_t asymo_gemm_task_counts(const asymo_gemm_args *g, const asymo_gemm_plan *p,
                               int64_t *counts)
{
    job J;
    int err = check(g, p);
    if (err)
        return err;
    int64_t total = geometry(&J, g, p);
    if (counts)
        for (int c = 0; c < p->nclusters; c++)
            counts[c] = J.cl[c].ntasks;
    return total;
}

static int run_tasks(asymo_pool *pool, asymo_task_fn fn, job *J, int64_t total)
{
    int64_t counts[MAXC] = {0};
    if (total == 0)
        return ASYMO_OK;
    if (!pool) {
        for (int64_t t = 0; t < total; t++)
            fn(t, J);
        return ASYMO_OK;
    }
    for (int c = 0; c < J->nclusters; c++)
        counts[c] = J->cl[c].ntasks;
    return asymo_pool_run(pool, fn, J, total, counts);
}

int asymo_gemm(struct asymo_pool *pool, const asymo_gemm_args *g,
               const asymo_gemm_plan *p)
{
    job J;
    int err = check(g, p);
    if (err)
        return err;
    if (pool && asymo_pool_nclusters(pool) < p->nclusters)
        return ASYMO_EINVAL;
    memset(&J, 0, sizeof J);
    J.kern = kernel_for(p->isa, g->dtype);
    J.ops = g->dtype == ASYMO_DTYPE_F32 ? &ops_f32 : &ops_f64;
    J.es = g->dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    J.mr = J.kern->mr;
    J.nr = J.kern->nr;
    J.kind = p->kind;
    J.split_dim = p->split_dim;
    J.args = g;
    J.pool = pool;
    J.nslots = (pool ? asymo_pool_nworkers(pool) : 0) + 1;
    J.long_is_m = p->split_dim == ASYMO_SPLIT_M
                  || (p->split_dim == ASYMO_SPLIT_BATCH && g->n <= ASYMO_SKINNY_MAX
                      && (g->m > ASYMO_SKINNY_MAX || g->m >= g->n));
    if (g->m == 0 || g->n == 0)
        return ASYMO_OK;

    const int64_t total = geometry(&J, g, p);
    const int es = J.es, mr = J.mr, nr = J.nr;
    J.mpad = cdiv(g->m, mr) * mr;
    J.npad = cdiv(g->n, nr) * nr;
    if (p->kind == ASYMO_GEMM_MM && p->split_dim != ASYMO_SPLIT_BATCH && g->k > 0) {
        for (int c = 0; c < p->nclusters; c++) {
            cluster_part *C = &J.cl[c];
            if (!C->ntasks)
                continue;
            if (C->r0 % mr == 0 && C->mc % mr == 0)
                C->apre = packed_layout(g->a_packed, p->isa, C->kc, g->k);
            if (C->q0 % nr == 0 && C->nc % nr == 0)
                C->bpre = packed_layout(g->b_packed, p->isa, C->kc, g->k);
            if ((!C->apre && !g->a) || (!C->bpre && !g->b && !g->pack_b))
                return ASYMO_EINVAL;
        }
    }

    /* ---- size the workspace ---- */
    int64_t max_mc = 1, max_nc = 1, max_kc = 1;
    for (int c = 0; c < p->nclusters; c++) {
        max_mc = J.cl[c].mc > max_mc ? J.cl[c].mc : max_mc;
        max_nc = J.cl[c].nc > max_nc ? J.cl[c].nc : max_nc;
        max_kc = J.cl[c].kc > max_kc ? J.cl[c].kc : max_kc;
    }
    const int batch_split = p->split_dim == ASYMO_SPLIT_BATCH;
    const int need_mm = p->kind == ASYMO_GEMM_MM && g->k > 0;
    const int64_t kcap = min64(max_kc, g->k > 0 ? g->k : 1);
    if (need_mm) {
        J.apack_bytes = round_up((size_t)(cdiv(min64(max_mc, g->m), mr) * mr * kcap) * es,
                                 ASYMO_ALIGN);
        J.tile_bytes = round_up((size_t)(mr * nr) * es, ASYMO_ALIGN);
        if (batch_split || (pool && p->nclusters > 1))
            J.bslot_bytes = round_up(
                (size_t)(cdiv(min64(max_nc, g->n), nr) * nr * kcap) * es, ASYMO_ALIGN);
    }
    if (p->kind == ASYMO_GEMM_MV && g->k > 0)
        J.vec_bytes = round_up((size_t)(ASYMO_SKINNY_MAX * g->k) * es, ASYMO_ALIGN);
    int64_t ntasks = total;
    if (p->kind == ASYMO_GEMM_MV && !batch_split && g->k > 1) {
        /* the layout decides the form; every item of a batch has the same strides */
        int copy;
        J.o = item_operands(g, 0);
        J.sv = skinny_orient(&J.o, J.long_is_m);
        if (skinny_pick(&J, &J.sv, &copy) == J.kern->skinny_axpy && J.sv.l > 1) {
            const int64_t L = J.sv.l, K = g->k;
            J.ksplit = 1;
            ntasks = 0;
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                const int64_t a = p->split_dim == ASYMO_SPLIT_M ? C->r0 : C->q0;
                const int64_t b = p->split_dim == ASYMO_SPLIT_M ? C->r1 : C->q1;
                C->k0 = a * K / L;
                C->k1 = c == p->nclusters - 1 ? K : b * K / L;
                C->kchunk = cdiv(p->chunk[c] * K, L);
                C->kchunk = C->kchunk < 128 ? 128 : C->kchunk;
                C->task0 = ntasks;
                C->ntasks = C->k1 > C->k0 ? cdiv(C->k1 - C->k0, C->kchunk) : 0;
                ntasks += C->ntasks;
            }
            J.ktasks = ntasks;
            J.partial_bytes = round_up((size_t)(J.sv.s * L) * es, ASYMO_ALIGN);
        }
    }

    size_t need = 0;
    carve cv = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        cv.used = 0;
        J.apack = carve_take(&cv, J.apack_bytes * J.nslots);
        J.tile = carve_take(&cv, J.tile_bytes * J.nslots);
        J.bslot = carve_take(&cv, J.bslot_bytes * J.nslots);
        J.vecbuf = carve_take(&cv, J.vec_bytes * (batch_split ? J.nslots : 1));
        J.partial = carve_take(&cv, J.partial_bytes * (size_t)J.ktasks);
        J.kdone = carve_take(&cv, sizeof(_Atomic int64_t));
        if (need_mm && !batch_split) {
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                if (!C->ntasks || C->bpre)
                    continue;
                C->nsl = cdiv(min64(C->nc, C->q1 - C->q0), nr);
                C->panel_elems = C->nsl * nr * min64(C->kc, g->k);
                const int64_t npanels = C->ntn * C->npc;
                C->bpack = carve_take(&cv, (size_t)(npanels * C->panel_elems) * es);
                C->claim = carve_take(&cv, sizeof(_Atomic int64_t) * npanels);
                C->ready = carve_take(&cv, (size_t)(npanels * C->nsl));
            }
        }
        if (pass == 0) {
            cv.base = ws_acquire(cv.used > 0 ? cv.used : 1, &need);
            if (!cv.base)
                return ASYMO_ENOMEM;
        }
    }

    for (int64_t item = 0; item < (batch_split ? 1 : g->nbatch) && err == ASYMO_OK; item++) {
        J.item = item;
        J.o = item_operands(g, item);
        if (batch_split) {
            err = run_tasks(pool, batch_task, &J, total);
        } else if (g->k == 0) {
            J.ops->zero(J.o.c, J.o.rsc, J.o.csc, g->m, g->n);
        } else if (p->kind == ASYMO_GEMM_MM) {
            for (int c = 0; c < p->nclusters; c++) {
                cluster_part *C = &J.cl[c];
                if (!C->ntasks || C->bpre)
                    continue;
                const int64_t npanels = C->ntn * C->npc;
                for (int64_t i = 0; i < npanels; i++)
                    atomic_init(&C->claim[i], 0);
                memset((void *)C->ready, 0, (size_t)(npanels * C->nsl));
            }
            err = run_tasks(pool, mm_task, &J, total);
        } else if (p->kind == ASYMO_GEMM_MV) {
            int copy;
            J.sv = skinny_orient(&J.o, J.long_is_m);
            J.skinny = skinny_pick(&J, &J.sv, &copy);
            J.vec_copied = copy;
            if (J.ksplit) {
                atomic_init(J.kdone, 0);
                err = run_tasks(pool, mv_ksplit_task, &J, ntasks);
            } else {
                if (copy)
                    copy_vectors(&J, &J.sv, J.vecbuf);
                err = run_tasks(pool, mv_task, &J, total);
            }
        } else {
            err = run_tasks(pool, outer_task, &J, total);
        }
    }
    ws_release(cv.base, need);
    return err;
}

int asymo_gemm_2d(struct asymo_pool *pool, const asymo_gemm_plan *plan, int dtype, int64_t m,
                  int64_t k, int64_t n, const void *a, int64_t rsa, int64_t csa,
                  const void *b, int64_t rsb, int64_t csb, void *c, int64_t rsc,
                  int64_t csc)
{
    asymo_gemm_args g;
    memset(&g, 0, sizeof g);
    g.dtype = dtype;
    g.m = m;
    g.k = k;
    g.n = n;
    g.a = a;
    g.rsa = rsa;
    g.csa = csa;
    g.b = b;
    g.rsb = rsb;
    g.csb = csb;
    g.c = c;
    g.rsc = rsc;
    g.csc = csc;
    g.nbatch = 1;
    return asymo_gemm(pool, &g, plan);
}

/* [lo, hi) bytes spanned by an r x q matrix with element strides rs, cs. */
static void extent(const void *x, int64_t r, int64_t q, int64_t rs, int64_t cs, int es,
                   uintptr_t *lo, uintptr_t *hi)
{
    int64_t first = 0, last = 0;
    if (rs < 0)
        first += (r - 1) * rs;
    else
        last += (r - 1) * rs;
    if (cs < 0)
        first += (q - 1) * cs;
    else
        last += (q - 1) * cs;
    *lo = (uintptr_t)x + (uintptr_t)(first * es);
    *hi = (uintptr_t)x + (uintptr_t)(last * es) + (uintptr_t)es;
}

int asymo_gemm_2d_checked(struct asymo_pool *pool, const asymo_gemm_plan *plan, int dtype,
                          int64_t m, int64_t k, int64_t n, const void *a, int64_t rsa,
                          int64_t csa, const void *b, int64_t rsb, int64_t csb, void *c,
                          int64_t rsc, int64_t csc)
{
    if (m > 0 && n > 0 && k > 0 && (dtype == ASYMO_DTYPE_F32 || dtype == ASYMO_DTYPE_F64)) {
        const int es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
        uintptr_t alo, ahi, blo, bhi, clo, chi;
        extent(a, m, k, rsa, csa, es, &alo, &ahi);
        extent(b, k, n, rsb, csb, es, &blo, &bhi);
        extent(c, m, n, rsc, csc, es, &clo, &chi);
        if ((clo < ahi && alo < chi) || (clo < bhi && blo < chi))
            return ASYMO_GEMM_OVERLAP;
    }
    return asymo_gemm_2d(pool, plan, dtype, m, k, n, a, rsa, csa, b, rsb, csb, c, rsc, csc);
}

/* ------------------------------------------------------------------------------------------
 * Pre-packed operands
 * ---------------------------------------------------------------------------------------- */
int64_t asymo_gemm_packed_bytes(int isa, int dtype, int side, int64_t dim, int64_t k)
{
    const asymo_gemm_kernel *kern;
    if ((dtype != ASYMO_DTYPE_F32 && dtype != ASYMO_DTYPE_F64) || dim < 0 || k < 0
        || (side != ASYMO_PACK_A && side != ASYMO_PACK_B))
        return ASYMO_EINVAL;
    kern = kernel_for(isa, dtype);
    if (!kern)
        return ASYMO_EINVAL;
    const int64_t unit = side == ASYMO_PACK_A ? kern->mr : kern->nr;
    const int64_t es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    if (dim > ((int64_t)1 << 40) / (k > 0 ? k : 1))
        return ASYMO_EINVAL;
    return cdiv(dim, unit) * unit * k * es;
}

int asymo_gemm_pack(int isa, int dtype, int side, int64_t dim, int64_t k, int64_t kc,
                    const void *x, int64_t rs, int64_t cs, void *dst)
{
    const int64_t bytes = asymo_gemm_packed_bytes(isa, dtype, side, dim, k);
    if (bytes < 0 || kc < 1 || (bytes > 0 && (!x || !dst)) || ((uintptr_t)dst % ASYMO_ALIGN))
        return ASYMO_EINVAL;
    const asymo_gemm_kernel *kern = kernel_for(isa, dtype);
    const dtype_ops *ops = dtype == ASYMO_DTYPE_F32 ? &ops_f32 : &ops_f64;
    const int es = dtype == ASYMO_DTYPE_F32 ? 4 : 8;
    const int mr = kern->mr, nr = kern->nr;
    const int64_t pad = cdiv(dim, side == ASYMO_PACK_A ? mr : nr) * (side == ASYMO_PACK_A ? mr : nr);
    for (int64_t p0 = 0; p0 < k; p0 += kc) {
        const int64_t kb = min64(kc, k - p0);
        char *block = (char *)dst + (size_t)(p0 * pad) * es;
        if (side == ASYMO_PACK_A) {
            ops->pack_a(block, x, rs, cs, 0, dim, p0, kb, mr, kern->pack_a_rows);
        } else {
            for (int64_t j = 0; j < pad; j += nr)
                ops->pack_b(block + (size_t)(j * kb) * es, x, rs, cs, j, min64(nr, dim - j), p0,
                            kb, nr);
        }
    }
    return ASYMO_OK;
}
