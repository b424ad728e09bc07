/* Skinny-product kernels written once and compiled per ISA: the includer defines
 *   SK_T        element type
 *   SK_SUFFIX   name suffix (e.g. avx2_f32)
 *   SK_LANES    independent accumulator lanes in the dot form (a multiple of the vector width
 *               large enough to hide FMA latency)
 *   SK_ATTR     the function attributes of its ISA (__attribute__((target(...))) or empty)
 *   SK_NO_DOT   (optional) leave out the dot form (the ISA has its own).
 * The loops are written so the compiler vectorizes them without -ffast-math: element-wise
 * over lanes, never a scalar reduction inside the hot loop. */

#define SK_CAT2(a, b) a##_##b
#define SK_CAT(a, b) SK_CAT2(a, b)
#define SK_FN(name) SK_CAT(name, SK_SUFFIX)

#ifndef SK_NO_DOT
/* Dot form: mat rows contiguous along p (mat_csp == 1), vectors contiguous along p
 * (vec_rsp == 1, vector s starts at vec + s * vec_css). Four rows share each vector load. */
static SK_ATTR void SK_FN(skinny_dot)(int64_t l0, int64_t l1, int64_t ns, int64_t k,
                              const void *mat_, int64_t mat_rsl, int64_t mat_csp,
                              const void *vec_, int64_t vec_rsp, int64_t vec_css,
                              void *out_, int64_t out_rsl, int64_t out_css)
{
    const SK_T *mat = (const SK_T *)mat_;
    const SK_T *vec = (const SK_T *)vec_;
    SK_T *out = (SK_T *)out_;
    const int64_t kv = k - k % SK_LANES;
    (void)mat_csp;
    (void)vec_rsp;
    int64_t l = l0;
    for (; l + 4 <= l1; l += 4) {
        const SK_T *r0 = mat + l * mat_rsl, *r1 = r0 + mat_rsl, *r2 = r1 + mat_rsl,
                   *r3 = r2 + mat_rsl;
        for (int64_t s = 0; s < ns; s++) {
            const SK_T *v = vec + s * vec_css;
            SK_T a0[SK_LANES] = {0}, a1[SK_LANES] = {0}, a2[SK_LANES] = {0},
                 a3[SK_LANES] = {0};
            for (int64_t p = 0; p < kv; p += SK_LANES) {
                for (int j = 0; j < SK_LANES; j++) {
                    SK_T x = v[p + j];
                    a0[j] += r0[p + j] * x;
                    a1[j] += r1[p + j] * x;
                    a2[j] += r2[p + j] * x;
                    a3[j] += r3[p + j] * x;
                }
            }
            for (int w = SK_LANES / 2; w >= 1; w /= 2)
                for (int j = 0; j < w; j++) {
                    a0[j] += a0[j + w];
                    a1[j] += a1[j + w];
                    a2[j] += a2[j + w];
                    a3[j] += a3[j + w];
                }
            SK_T t0 = a0[0], t1 = a1[0], t2 = a2[0], t3 = a3[0];
            for (int64_t p = kv; p < k; p++) {
                SK_T x = v[p];
                t0 += r0[p] * x;
                t1 += r1[p] * x;
                t2 += r2[p] * x;
                t3 += r3[p] * x;
            }
            SK_T *o = out + l * out_rsl + s * out_css;
            o[0] = t0;
            o[out_rsl] = t1;
            o[2 * out_rsl] = t2;
            o[3 * out_rsl] = t3;
        }
    }
    for (; l < l1; l++) {
        const SK_T *r0 = mat + l * mat_rsl;
        for (int64_t s = 0; s < ns; s++) {
            const SK_T *v = vec + s * vec_css;
            SK_T a0[SK_LANES] = {0};
            for (int64_t p = 0; p < kv; p += SK_LANES)
                for (int j = 0; j < SK_LANES; j++)
                    a0[j] += r0[p + j] * v[p + j];
            for (int w = SK_LANES / 2; w >= 1; w /= 2)
                for (int j = 0; j < w; j++)
                    a0[j] += a0[j + w];
            SK_T t0 = a0[0];
            for (int64_t p = kv; p < k; p++)
                t0 += r0[p] * v[p];
            out[l * out_rsl + s * out_css] = t0;
        }
    }
}

#endif /* SK_NO_DOT */

/* Axpy form: mat columns contiguous along l (mat_rsl == 1). The task's rows are processed in
 * chunks whose accumulators (ns x chunk) stay in L1; each pass streams the chunk of every
 * mat column once, four columns at a time so each accumulator load/store serves four FMAs. */
#define SK_AXPY_BYTES 16384
static SK_ATTR void SK_FN(skinny_axpy)(int64_t l0, int64_t l1, int64_t ns, int64_t k,
                               const void *mat_, int64_t mat_rsl, int64_t mat_csp,
                               const void *vec_, int64_t vec_rsp, int64_t vec_css,
                               void *out_, int64_t out_rsl, int64_t out_css)
{
    const SK_T *mat = (const SK_T *)mat_;
    const SK_T *vec = (const SK_T *)vec_;
    SK_T *out = (SK_T *)out_;
    SK_T acc[SK_AXPY_BYTES / sizeof(SK_T)] __attribute__((aligned(64)));
    (void)mat_rsl;
    int64_t chunk = (int64_t)(SK_AXPY_BYTES / sizeof(SK_T)) / ns;
    chunk -= chunk % 16;
    if (chunk < 16)
        chunk = 16;
    for (int64_t c0 = l0; c0 < l1; c0 += chunk) {
        const int64_t len = (l1 - c0 < chunk) ? l1 - c0 : chunk;
        for (int64_t s = 0; s < ns; s++) {
            SK_T *a = acc + s * chunk;
            for (int64_t j = 0; j < len; j++)
                a[j] = 0;
        }
        int64_t p = 0;
        for (; p + 4 <= k; p += 4) {
            const SK_T *m0 = mat + p * mat_csp + c0, *m1 = m0 + mat_csp, *m2 = m1 + mat_csp,
                       *m3 = m2 + mat_csp;
            for (int64_t s = 0; s < ns; s++) {
                const SK_T *v = vec + s * vec_css + p * vec_rsp;
                const SK_T w0 = v[0], w1 = v[vec_rsp], w2 = v[2 * vec_rsp], w3 = v[3 * vec_rsp];
                SK_T *a = acc + s * chunk;
                for (int64_t j = 0; j < len; j++)
                    a[j] += w0 * m0[j] + w1 * m1[j] + w2 * m2[j] + w3 * m3[j];
            }
        }
        for (; p < k; p++) {
            const SK_T *m0 = mat + p * mat_csp + c0;
            for (int64_t s = 0; s < ns; s++) {
                const SK_T w0 = vec[s * vec_css + p * vec_rsp];
                SK_T *a = acc + s * chunk;
                for (int64_t j = 0; j < len; j++)
                    a[j] += w0 * m0[j];
            }
        }
        for (int64_t s = 0; s < ns; s++) {
            const SK_T *a = acc + s * chunk;
            SK_T *o = out + c0 * out_rsl + s * out_css;
            if (out_rsl == 1) {
                for (int64_t j = 0; j < len; j++)
                    o[j] = a[j];
            } else {
                for (int64_t j = 0; j < len; j++)
                    o[j * out_rsl] = a[j];
            }
        }
    }
}

#undef SK_AXPY_BYTES
/* Panel form, for a matrix packed by asymo_mv_pack (rows interleaved by ASYMO_MV_PANEL along
 * K): the matrix is read as one stream in address order, which the hardware prefetchers
 * follow better than the dot form's four row streams when it comes from memory. Four partial
 * sums over p hide the FMA latency. */
static SK_ATTR void SK_FN(mv_panel)(int64_t k, const void *panel_, const void *x_, void *y_)
{
    enum { R = ASYMO_MV_PANEL };
    const SK_T *restrict q = (const SK_T *)panel_;
    const SK_T *restrict x = (const SK_T *)x_;
    SK_T *restrict y = (SK_T *)y_;
    SK_T a0[R] = {0}, a1[R] = {0}, a2[R] = {0}, a3[R] = {0};
    int64_t p = 0;
    for (; p + 4 <= k; p += 4) {
        const SK_T x0 = x[p], x1 = x[p + 1], x2 = x[p + 2], x3 = x[p + 3];
        const SK_T *s = q + p * R;
        for (int r = 0; r < R; r++) {
            a0[r] += s[r] * x0;
            a1[r] += s[R + r] * x1;
            a2[r] += s[2 * R + r] * x2;
            a3[r] += s[3 * R + r] * x3;
        }
    }
    for (; p < k; p++)
        for (int r = 0; r < R; r++)
            a0[r] += q[p * R + r] * x[p];
    for (int r = 0; r < R; r++)
        y[r] = (a0[r] + a1[r]) + (a2[r] + a3[r]);
}

#undef SK_FN
#undef SK_CAT
#undef SK_CAT2
