/* MV and OUTER: the skinny products. Matrix-vector and small M or N stream the big operand
 * once with the small one read in place (no packing); outer products (K = 1) write C
 * directly. */
#include <stdatomic.h>
#include <string.h>

#include "config/config.h"
#include "gemm/gemm_internal.h"

asymo_skinny_fn skinny_pick(const job *J, const skinny_view *v, int *copy_vec)
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
void copy_vectors(const job *J, const skinny_view *v, char *dst)
{
    const int es = J->es;
    for (int64_t s = 0; s < v->s; s++)
        for (int64_t p = 0; p < v->k; p++)
            memcpy(dst + (size_t)(s * v->k + p) * es, v->vec + (p * v->rsp + s * v->css) * es,
                   (size_t)es);
}

void skinny_run(const job *J, const skinny_view *v, asymo_skinny_fn fn, const char *vec,
                       int copied, int64_t l0, int64_t l1)
{
    const int64_t rsp = copied ? 1 : v->rsp, css = copied ? v->k : v->css;
    fn(l0, l1, v->s, v->k, v->mat, v->rsl, v->csp, vec, rsp, css, v->out, v->orl, v->ocs);
}

void mv_task(int64_t t, void *ctx)
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
void mv_ksplit_task(int64_t t, void *ctx)
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

void outer_task(int64_t t, void *ctx)
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

/* ------------------------------------------------------------------------------------------
 * Matrix-vector products with a matrix packed into panels (asymo_mv_pack)
 * ---------------------------------------------------------------------------------------- */
int64_t asymo_mv_packed_floats(int64_t m, int64_t k)
{
    if (m < 0 || k < 0 || m > (INT64_MAX / ASYMO_MV_PANEL) / (k > 0 ? k : 1) - ASYMO_MV_PANEL)
        return -1;
    return cdiv(m, ASYMO_MV_PANEL) * ASYMO_MV_PANEL * k;
}

void asymo_mv_pack(const float *a, int64_t m, int64_t k, int64_t lda, float *panels)
{
    enum { R = ASYMO_MV_PANEL };
    for (int64_t i0 = 0; i0 < m; i0 += R) {
        float *dst = panels + i0 * k;
        const int64_t rows = min64(R, m - i0);
        for (int64_t p = 0; p < k; p++)
            for (int64_t r = 0; r < R; r++)
                dst[p * R + r] = r < rows ? a[(i0 + r) * lda + p] : 0.0f;
    }
}

int asymo_mv_packed_check(const asymo_mv_packed_job *J)
{
    const asymo_gemm_kernel *kern = asymo_gemm_kernel_for(J->isa, ASYMO_DTYPE_F32);
    if (!kern || !kern->mv_panel || J->m < 0 || J->k < 0 || J->panels_per_task < 1
        || asymo_mv_packed_floats(J->m, J->k) < 0 || J->activation < 0 || J->activation > 2
        || (J->m > 0 && (!J->y || (J->k > 0 && (!J->a || !J->x)))))
        return ASYMO_EINVAL;
    return ASYMO_OK;
}

void asymo_mv_packed_task(int64_t task, void *ctx)
{
    enum { R = ASYMO_MV_PANEL };
    const asymo_mv_packed_job *J = (const asymo_mv_packed_job *)ctx;
    const asymo_gemm_kernel *kern = asymo_gemm_kernel_for(J->isa, ASYMO_DTYPE_F32);
    const int64_t npanels = cdiv(J->m, R);
    const int64_t p0 = task * J->panels_per_task, p1 = min64(p0 + J->panels_per_task, npanels);
    const gemm_epilogue_fn epilogue = gemm_epilogue_for(J->isa, ASYMO_DTYPE_F32);
    float t[R] __attribute__((aligned(64)));
    for (int64_t p = p0; p < p1; p++) {
        const int64_t i0 = p * R, rows = min64(R, J->m - i0);
        if (J->k > 0)
            kern->mv_panel(J->k, J->a + i0 * J->k, J->x, t);
        else
            memset(t, 0, sizeof t);
        if (J->bias || J->activation) /* the panel's rows as a column of `rows` rows */
            epilogue(t, 1, rows, 1, J->bias ? J->bias + i0 : NULL, NULL, 0, J->activation);
        memcpy(J->y + i0, t, (size_t)rows * sizeof(float));
    }
}
