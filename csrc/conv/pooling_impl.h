/* Pooling kernels, instantiated by pooling.c once per element type and ISA. Expects T
 * (element type), IT (integer type of the same size) and FN(name) (a unique name per
 * instantiation) to be defined; no include guard on purpose.
 *
 * One plane, one output row at a time: the window's input rows are reduced column by column
 * into a buffer (contiguous), then each output reduces its kw buffered values; outputs whose
 * window lies inside the row do that as kw passes over the buffer, contiguous for stride 1 and
 * de-interleaved for stride 2 (every CNN pool), so both passes run on vectors. GCC vector
 * extensions give 32-byte vectors: AVX registers under the x86 targets, register pairs on
 * NEON and SSE. */

typedef T FN(vec) __attribute__((vector_size(32)));
typedef T FN(uvec) __attribute__((vector_size(32), aligned(sizeof(T))));
typedef IT FN(ivec) __attribute__((vector_size(32)));

/* max letting NaN win (torch.max_pool2d): a where a > b or a is NaN, else b (NaN if b is) */
static inline FN(vec) FN(vmax)(FN(vec) a, FN(vec) b)
{
    const FN(ivec) m = (a > b) | (a != a);
    return (FN(vec))((m & (FN(ivec))a) | (~m & (FN(ivec))b));
}

static inline T FN(smax)(T a, T b)
{
    return (a > b) | (a != a) ? a : b;
}

/* One vector of src[o * stride], o < L, for stride 1 or 2 (the even lanes of two
 * consecutive vectors; reads one element past the last used: callers leave a vector of
 * slack) */
static inline __attribute__((always_inline)) FN(vec) FN(load_strided)(const T *src,
                                                                      int64_t stride)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    if (stride == 1)
        return *(const FN(uvec) *)src;
    FN(ivec) even; /* 0, 2, 4, ...: folded to a constant */
    for (int i = 0; i < L; i++)
        even[i] = 2 * i;
    return __builtin_shuffle(*(const FN(uvec) *)src, *(const FN(uvec) *)(src + L), even);
}

static inline __attribute__((always_inline)) FN(vec) FN(vop)(FN(vec) a, FN(vec) b, int is_max)
{
    return is_max ? FN(vmax)(a, b) : a + b;
}

/* dst[c] = op over r < rows of src[r * ld + c], c < n: each vector reduced in registers and
 * stored once (a store followed by a load of an overlapping vector stalls store forwarding) */
static inline __attribute__((always_inline)) void FN(reduce_rows)(
    T *restrict dst, const T *restrict src, int64_t ld, int64_t rows, int64_t n, int is_max)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    int64_t c = 0;
    for (;; c += L) {
        if (c + L > n) {
            if (n < L || c == n)
                break;
            c = n - L; /* the tail as a vector overlapping the last one (same values) */
        }
        FN(vec) acc = *(const FN(uvec) *)(src + c);
        for (int64_t r = 1; r < rows; r++)
            acc = FN(vop)(acc, *(const FN(uvec) *)(src + r * ld + c), is_max);
        *(FN(uvec) *)(dst + c) = acc;
        if (c + L == n)
            return;
    }
    for (; c < n; c++) {
        T acc = src[c];
        for (int64_t r = 1; r < rows; r++)
            acc = is_max ? FN(smax)(acc, src[r * ld + c]) : acc + src[r * ld + c];
        dst[c] = acc;
    }
}

/* dst[o] = op over j < kw of src[o * stride + j], o < n (stride 1 or 2: vectors) */
static inline __attribute__((always_inline)) void FN(reduce_windows)(
    T *restrict dst, const T *restrict src, int64_t n, int64_t kw, int64_t stride, int is_max)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    int64_t o = 0;
    for (; stride <= 2; o += L) {
        if (o + L > n) {
            if (n < L || o == n)
                break;
            o = n - L;
        }
        FN(vec) acc = FN(load_strided)(src + o * stride, stride);
        for (int64_t j = 1; j < kw; j++)
            acc = FN(vop)(acc, FN(load_strided)(src + o * stride + j, stride), is_max);
        *(FN(uvec) *)(dst + o) = acc;
        if (o + L == n)
            return;
    }
    for (; o < n; o++) {
        T acc = src[o * stride];
        for (int64_t j = 1; j < kw; j++)
            acc = is_max ? FN(smax)(acc, src[o * stride + j]) : acc + src[o * stride + j];
        dst[o] = acc;
    }
}

static inline __attribute__((always_inline)) void FN(pool_plane_body)(
    const asymo_pool2d_job *job, const T *x, T *y, const int is_max, const int64_t sw)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t kh = g->kernel_h, kw = g->kernel_w, sh = g->stride_h;
    const int64_t ph = g->pad_h, pw = g->pad_w;
    const T init = is_max ? -(T)INFINITY : (T)0;
    /* output columns per block: their windows span at most POOL_COLS inputs */
    const int64_t per = pmax(1, (POOL_COLS - kw) / sw + 1);
    /* + slack: the stride-2 loads read one vector past the last element used */
    T buf[POOL_COLS + 2 * sizeof(FN(vec)) / sizeof(T)];
    for (int64_t oy = 0; oy < oh; oy++) {
        T *restrict yr = y + oy * ow;
        const int64_t iy0 = oy * sh - ph;
        const int64_t y_lo = pmax(iy0, 0), y_hi = pmin(iy0 + kh, H);
        int64_t cnt_y = 0;
        if (!is_max) {
            const int64_t lo = job->count_include_pad ? -ph : 0;
            const int64_t hi = job->count_include_pad ? H + ph : H;
            cnt_y = pmin(iy0 + kh, hi) - pmax(iy0, lo);
        }
        for (int64_t ox0 = 0; ox0 < ow; ox0 += per) {
            const int64_t ox1 = pmin(ow, ox0 + per);
            /* inputs [c0, c1) cover the windows of outputs [ox0, ox1), clipped to the row */
            const int64_t c0 = pmax(0, ox0 * sw - pw);
            const int64_t c1 = pmin(W, (ox1 - 1) * sw - pw + kw);
            const int64_t nc = y_hi > y_lo ? c1 - c0 : 0;
            if (nc <= 0) {
                for (int64_t ox = ox0; ox < ox1; ox++)
                    yr[ox] = init;
            } else if (nc <= POOL_COLS) {
                FN(reduce_rows)(buf, x + y_lo * W + c0, W, y_hi - y_lo, nc, is_max);
                /* outputs whose window lies inside the row: vectors; the clipped rest (at
                   the edges) one by one */
                const int64_t end = c1 - kw + pw;
                int64_t oa = pmax(ox0, (c0 + pw + sw - 1) / sw);
                int64_t ob = end >= 0 ? pmin(ox1, end / sw + 1) : ox0;
                if (ob <= oa)
                    oa = ob = ox1;
                else
                    FN(reduce_windows)(yr + oa, buf + (oa * sw - pw - c0), ob - oa, kw, sw,
                                       is_max);
                for (int64_t ox = ox0; ox < ox1; ox++) {
                    if (ox == oa)
                        ox = ob;
                    if (ox >= ox1)
                        break;
                    const int64_t ix0 = ox * sw - pw;
                    T acc = init;
                    for (int64_t c = pmax(ix0, c0); c < pmin(ix0 + kw, c1); c++)
                        acc = is_max ? FN(smax)(acc, buf[c - c0]) : acc + buf[c - c0];
                    yr[ox] = acc;
                }
            } else {
                /* a window wider than the buffer (a global pool of a very wide plane):
                   element by element */
                for (int64_t ox = ox0; ox < ox1; ox++) {
                    const int64_t ix0 = ox * sw - pw;
                    T acc = init;
                    for (int64_t iy = y_lo; iy < y_hi; iy++)
                        for (int64_t c = pmax(ix0, 0); c < pmin(ix0 + kw, W); c++)
                            acc = is_max ? FN(smax)(acc, x[iy * W + c]) : acc + x[iy * W + c];
                    yr[ox] = acc;
                }
            }
            /* average: cells counted, the window clipped to the padded input (include_pad)
               or to the input itself; kw columns for a window inside the row */
            if (!is_max) {
                const int64_t lo_x = job->count_include_pad ? -pw : 0;
                const int64_t hi_x = job->count_include_pad ? W + pw : W;
                for (int64_t ox = ox0; ox < ox1; ox++) {
                    const int64_t ix0 = ox * sw - pw;
                    if (ix0 >= 0 && ix0 + kw <= W) {
                        /* the run of inner windows: one divisor */
                        int64_t o1 = ox;
                        while (o1 < ox1 && o1 * sw - pw + kw <= W)
                            o1++;
                        const T d = (T)(cnt_y * kw);
                        for (int64_t o = ox; o < o1; o++)
                            yr[o] = cnt_y > 0 ? yr[o] / d : (T)0;
                        ox = o1 - 1;
                        continue;
                    }
                    const int64_t cnt = cnt_y * (pmin(ix0 + kw, hi_x) - pmax(ix0, lo_x));
                    yr[ox] = cnt > 0 ? yr[ox] / (T)cnt : (T)0;
                }
            }
        }
    }
}

/* the body specialised for max / average and strides 1, 2 and any */
static void FN(pool_plane)(const asymo_pool2d_job *job, const T *x, T *y)
{
    const int64_t sw = job->geom.stride_w;
    if (job->kind == ASYMO_POOL_MAX) {
        if (sw == 1)
            FN(pool_plane_body)(job, x, y, 1, 1);
        else if (sw == 2)
            FN(pool_plane_body)(job, x, y, 1, 2);
        else
            FN(pool_plane_body)(job, x, y, 1, sw);
    } else {
        if (sw == 1)
            FN(pool_plane_body)(job, x, y, 0, 1);
        else if (sw == 2)
            FN(pool_plane_body)(job, x, y, 0, 2);
        else
            FN(pool_plane_body)(job, x, y, 0, sw);
    }
}
