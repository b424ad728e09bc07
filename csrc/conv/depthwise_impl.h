/* Depthwise convolution kernels, instantiated by depthwise.c once per element type and ISA.
 * Expects T (element type), IT (integer type of the same size) and FN(name) (a unique name
 * per instantiation) to be defined; no include guard on purpose.
 *
 * GCC vector extensions give one ASYMO_DW_LANES-wide vector per pixel of a block of
 * channels; the compiler lowers it to the ISA's registers (one zmm for float on AVX-512). */

typedef T FN(vec) __attribute__((vector_size(ASYMO_DW_LANES * sizeof(T))));
/* the same vector for unaligned memory */
typedef T FN(uvec) __attribute__((vector_size(ASYMO_DW_LANES * sizeof(T)), aligned(sizeof(T))));
typedef IT FN(ivec) __attribute__((vector_size(ASYMO_DW_LANES * sizeof(T))));

/* Transpose 16 vectors of 16 lanes in place: four rounds swap the off-diagonal b x b blocks of
 * every 2b x 2b block, b = 8, 4, 2, 1. */
static inline void FN(transpose16)(FN(vec) *r)
{
    if (sizeof(T) == 4) {
        /* float: four 8 x 8 transposes of 32-byte pieces (unpack, shufps, perm2f128 on AVX2;
           GCC lowered the 64-byte generic shuffles below to one scalar move per element) */
        typedef float p8 __attribute__((vector_size(32)));
        typedef int32_t m8 __attribute__((vector_size(32)));
        const m8 ulo = {0, 8, 1, 9, 4, 12, 5, 13}, uhi = {2, 10, 3, 11, 6, 14, 7, 15};
        const m8 slo = {0, 1, 8, 9, 4, 5, 12, 13}, shi = {2, 3, 10, 11, 6, 7, 14, 15};
        const m8 plo = {0, 1, 2, 3, 8, 9, 10, 11}, phi = {4, 5, 6, 7, 12, 13, 14, 15};
        p8 in[16][2], out[16][2];
        memcpy(in, r, sizeof in);
        for (int bi = 0; bi < 2; bi++)
            for (int bj = 0; bj < 2; bj++) {
                p8 t[8], u[8];
                for (int k = 0; k < 8; k += 2) {
                    t[k] = __builtin_shuffle(in[8 * bi + k][bj], in[8 * bi + k + 1][bj], ulo);
                    t[k + 1] = __builtin_shuffle(in[8 * bi + k][bj], in[8 * bi + k + 1][bj],
                                                 uhi);
                }
                for (int k = 0; k < 8; k += 4) {
                    u[k] = __builtin_shuffle(t[k], t[k + 2], slo);
                    u[k + 1] = __builtin_shuffle(t[k], t[k + 2], shi);
                    u[k + 2] = __builtin_shuffle(t[k + 1], t[k + 3], slo);
                    u[k + 3] = __builtin_shuffle(t[k + 1], t[k + 3], shi);
                }
                for (int k = 0; k < 4; k++) {
                    out[8 * bj + k][bi] = __builtin_shuffle(u[k], u[k + 4], plo);
                    out[8 * bj + k + 4][bi] = __builtin_shuffle(u[k], u[k + 4], phi);
                }
            }
        memcpy(r, out, sizeof out);
        return;
    }
#define DW_MASKS(b)                                                                           \
    const FN(ivec) lo##b = {                                                                  \
        ((0 & b) ? 16 + 0 - b : 0), ((1 & b) ? 16 + 1 - b : 1), ((2 & b) ? 16 + 2 - b : 2),  \
        ((3 & b) ? 16 + 3 - b : 3), ((4 & b) ? 16 + 4 - b : 4), ((5 & b) ? 16 + 5 - b : 5),  \
        ((6 & b) ? 16 + 6 - b : 6), ((7 & b) ? 16 + 7 - b : 7), ((8 & b) ? 16 + 8 - b : 8),  \
        ((9 & b) ? 16 + 9 - b : 9), ((10 & b) ? 16 + 10 - b : 10),                           \
        ((11 & b) ? 16 + 11 - b : 11), ((12 & b) ? 16 + 12 - b : 12),                        \
        ((13 & b) ? 16 + 13 - b : 13), ((14 & b) ? 16 + 14 - b : 14),                        \
        ((15 & b) ? 16 + 15 - b : 15)};                                                      \
    const FN(ivec) hi##b = {                                                                  \
        ((0 & b) ? 16 + 0 : 0 + b), ((1 & b) ? 16 + 1 : 1 + b), ((2 & b) ? 16 + 2 : 2 + b),  \
        ((3 & b) ? 16 + 3 : 3 + b), ((4 & b) ? 16 + 4 : 4 + b), ((5 & b) ? 16 + 5 : 5 + b),  \
        ((6 & b) ? 16 + 6 : 6 + b), ((7 & b) ? 16 + 7 : 7 + b), ((8 & b) ? 16 + 8 : 8 + b),  \
        ((9 & b) ? 16 + 9 : 9 + b), ((10 & b) ? 16 + 10 : 10 + b),                           \
        ((11 & b) ? 16 + 11 : 11 + b), ((12 & b) ? 16 + 12 : 12 + b),                        \
        ((13 & b) ? 16 + 13 : 13 + b), ((14 & b) ? 16 + 14 : 14 + b),                        \
        ((15 & b) ? 16 + 15 : 15 + b)};                                                      \
    for (int i = 0; i < 16; i++) {                                                            \
        if (i & b)                                                                            \
            continue;                                                                         \
        const FN(vec) a = r[i], c = r[i + b];                                                 \
        r[i] = __builtin_shuffle(a, c, lo##b);                                                \
        r[i + b] = __builtin_shuffle(a, c, hi##b);                                            \
    }
    {
        DW_MASKS(8)
    }
    {
        DW_MASKS(4)
    }
    {
        DW_MASKS(2)
    }
    {
        DW_MASKS(1)
    }
#undef DW_MASKS
}

/* min(max(a, lo), hi) lane by lane, NaN propagating (as numpy.maximum, torch.relu) */
static inline FN(vec) FN(clamp)(FN(vec) a, FN(vec) lo, FN(vec) hi)
{
    /* in 32-byte pieces: GCC lowered the compare-and-select of a whole 16-lane vector wider
       than the target's registers (64 / 128 bytes under AVX2) to a scalar loop with
       branches, which made a fused activation cost more than the convolution */
    typedef T piece __attribute__((vector_size(32)));
    typedef IT ipiece __attribute__((vector_size(32)));
    enum { NP = sizeof(FN(vec)) / 32 };
    piece pa[NP], pl[NP], ph[NP];
    memcpy(pa, &a, sizeof a);
    memcpy(pl, &lo, sizeof lo);
    memcpy(ph, &hi, sizeof hi);
    for (int i = 0; i < NP; i++) {
        ipiece m = pa[i] < pl[i];
        pa[i] = (piece)((~m & (ipiece)pa[i]) | (m & (ipiece)pl[i]));
        m = pa[i] > ph[i];
        pa[i] = (piece)((~m & (ipiece)pa[i]) | (m & (ipiece)ph[i]));
    }
    memcpy(&a, pa, sizeof a);
    return a;
}

/* Output rows [oy0, oy1) of output channels [oc0, oc0 + nv) of image n. scratch (aligned to
 * DW_ALIGN) holds dw_layout(g, oy1 - oy0).elems elements. */
static void FN(dw_block)(const asymo_dwconv_job *job, int64_t n, int64_t oc0, int64_t nv,
                         int64_t oy0, int64_t oy1, T *restrict scratch)
{
    enum { V = ASYMO_DW_LANES };
    typedef FN(vec) vec;
    typedef FN(uvec) uvec;
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, C = g->channels, oh = g->out_h, ow = g->out_w;
    const int64_t kh = g->kernel_h, kw = g->kernel_w, sh = g->stride_h, sw = g->stride_w;
    const int64_t dh = g->dilation_h, dw = g->dilation_w, pw = g->pad_w, taps = kh * kw;
    const int64_t mult = job->out_channels / C;
    const int64_t R = oy1 - oy0;
    const dw_dims d = dw_layout(g, R);
    const int64_t wp = d.wp, rows_in = d.rows_in;
    const T *x = (const T *)job->x + n * C * H * W;
    const T *w = (const T *)job->weight;
    const T *bias = (const T *)job->bias;
    T *y = (T *)job->y + n * job->y_image_stride;

    vec *restrict xt = (vec *)scratch;        /* rows_in x wp pixels, channel-interleaved */
    vec *restrict wt = xt + rows_in * wp;     /* taps */
    vec *restrict orow = wt + taps + 1;       /* ow pixels (rounded up to 16) */
    vec bv;

    for (int64_t t = 0; t < taps; t++)
        for (int64_t v = 0; v < V; v++)
            wt[t][v] = v < nv ? w[(oc0 + v) * taps + t] : (T)0;
    for (int64_t v = 0; v < V; v++)
        bv[v] = (bias && v < nv) ? bias[oc0 + v] : (T)0;
    const vec zero = bv - bv;
    const vec lo = zero + (job->activation == ASYMO_ACT_NONE ? -(T)INFINITY : (T)0);
    const vec hi = zero + (job->activation == ASYMO_ACT_RELU6 ? (T)6 : (T)INFINITY);

    /* input rows -> channel-interleaved, zero-padded */
    const int64_t iy0 = oy0 * sh - g->pad_h;
    const T *src[V];
    for (int64_t r = 0; r < rows_in; r++) {
        vec *restrict dst = xt + r * wp;
        const int64_t iy = iy0 + r;
        if (iy < 0 || iy >= H) {
            for (int64_t p = 0; p < wp; p++)
                dst[p] = zero;
            continue;
        }
        for (int64_t p = 0; p < pw; p++)
            dst[p] = zero;
        for (int64_t p = pw + W; p < wp; p++)
            dst[p] = zero;
        for (int64_t v = 0; v < nv; v++)
            src[v] = x + ((oc0 + v) / mult * H + iy) * W;
        int64_t ix = 0;
        for (; ix + 16 <= W; ix += 16) {
            vec blk[16];
            for (int64_t v = 0; v < 16; v++)
                blk[v] = v < nv ? (vec)(*(const uvec *)(src[v] + ix)) : zero;
            FN(transpose16)(blk);
            for (int64_t p = 0; p < 16; p++)
                dst[pw + ix + p] = blk[p];
        }
        for (; ix < W; ix++) {
            vec px = zero;
            for (int64_t v = 0; v < nv; v++)
                px[v] = src[v][ix];
            dst[pw + ix] = px;
        }
    }

    for (int64_t r = 0; r < R; r++) {
        const vec *restrict xr0 = xt + r * sh * wp;
        if (kh == 3 && kw == 3 && dh == 1 && dw == 1) {
            /* the common case with its trip counts known: weights stay in registers */
            const vec w0 = wt[0], w1 = wt[1], w2 = wt[2], w3 = wt[3], w4 = wt[4], w5 = wt[5];
            const vec w6 = wt[6], w7 = wt[7], w8 = wt[8];
            for (int64_t ox = 0; ox < ow; ox++) {
                const vec *restrict p0 = xr0 + ox * sw, *restrict p1 = p0 + wp,
                          *restrict p2 = p1 + wp;
                vec acc = bv + w0 * p0[0] + w1 * p0[1] + w2 * p0[2];
                acc += w3 * p1[0] + w4 * p1[1] + w5 * p1[2];
                acc += w6 * p2[0] + w7 * p2[1] + w8 * p2[2];
                orow[ox] = FN(clamp)(acc, lo, hi);
            }
        } else {
            for (int64_t ox = 0; ox < ow; ox++) {
                vec acc = bv;
                for (int64_t ky = 0; ky < kh; ky++) {
                    const vec *restrict px = xr0 + ky * dh * wp + ox * sw;
                    for (int64_t kx = 0; kx < kw; kx++)
                        acc += wt[ky * kw + kx] * px[kx * dw];
                }
                orow[ox] = FN(clamp)(acc, lo, hi);
            }
        }
        /* back to NCHW: transposes of 16-pixel blocks */
        int64_t ox = 0;
        for (; ox + 16 <= ow; ox += 16) {
            vec blk[16];
            for (int64_t p = 0; p < 16; p++)
                blk[p] = orow[ox + p];
            FN(transpose16)(blk);
            for (int64_t v = 0; v < nv; v++)
                *(uvec *)(y + (oc0 + v) * oh * ow + (oy0 + r) * ow + ox) = blk[v];
        }
        for (; ox < ow; ox++)
            for (int64_t v = 0; v < nv; v++)
                y[(oc0 + v) * oh * ow + (oy0 + r) * ow + ox] = orow[ox][v];
    }
}

/* The plain loop over one output plane, rows [oy0, oy1): needs no scratch. */
static void FN(dw_plane_rows)(const asymo_dwconv_job *job, int64_t n, int64_t oc, int64_t oy0,
                              int64_t oy1)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, C = g->channels, oh = g->out_h, ow = g->out_w;
    const int64_t kh = g->kernel_h, kw = g->kernel_w, mult = job->out_channels / C;
    const T *x = (const T *)job->x + (n * C + oc / mult) * H * W;
    const T *w = (const T *)job->weight + oc * kh * kw;
    const T *bias = (const T *)job->bias;
    T *y = (T *)job->y + n * job->y_image_stride + oc * oh * ow;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        for (int64_t ox = 0; ox < ow; ox++) {
            T acc = bias ? bias[oc] : (T)0;
            for (int64_t ky = 0; ky < kh; ky++) {
                const int64_t iy = oy * g->stride_h + ky * g->dilation_h - g->pad_h;
                if (iy < 0 || iy >= H)
                    continue;
                for (int64_t kx = 0; kx < kw; kx++) {
                    const int64_t ix = ox * g->stride_w + kx * g->dilation_w - g->pad_w;
                    if (ix >= 0 && ix < W)
                        acc += w[ky * kw + kx] * x[iy * W + ix];
                }
            }
            if (job->activation == ASYMO_ACT_RELU)
                acc = acc < (T)0 ? (T)0 : acc;
            else if (job->activation == ASYMO_ACT_RELU6)
                acc = acc < (T)0 ? (T)0 : (acc > (T)6 ? (T)6 : acc);
            y[oy * ow + ox] = acc;
        }
    }
}
