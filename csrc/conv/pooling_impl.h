/* Pooling kernels, instantiated by pooling.c once per element type and ISA. Expects T
 * (element type), IT (integer type of the same size) and FN(name) (a unique name per
 * instantiation) to be defined; no include guard on purpose.
 *
 * Four shapes of work: a window covering the whole plane is one contiguous reduction; 3x3 max
 * pooling with stride 1 or 2 (nearly every CNN max pool) walks strips of outputs down the
 * plane straight from the input (pool_planes_3x3, below); other small stride-1 planes, and
 * small stride-2 planes under max pooling, are reduced as flat arrays (pool_plane_flat,
 * pool_plane_flat_s2); other planes one output row at a time: the window's input rows are
 * reduced column by column into a buffer (contiguous), then each output reduces its kw buffered values; outputs whose window lies
 * inside the row do that as kw passes over the buffer, contiguous for stride 1 and
 * de-interleaved for stride 2 (every CNN pool), so both passes run on vectors. Max pooling
 * checks each plane for NaN first and, when there is none, uses the plain max instruction
 * instead of the NaN-propagating select. GCC vector
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

/* a > b ? a : b lane by lane (drops a NaN in a, so only for planes checked to hold none:
 * any_nan): one instruction under AVX, whose maxps / maxpd follow exactly this rule (named
 * through the builtins: GCC does not always turn the lane-wise form into them), a select
 * elsewhere */
static inline FN(vec) FN(vmax_plain)(FN(vec) a, FN(vec) b)
{
#if defined(__AVX__)
    typedef float v8sf __attribute__((vector_size(32)));
    typedef double v4df __attribute__((vector_size(32)));
    if (sizeof(T) == sizeof(float))
        return (FN(vec))__builtin_ia32_maxps256((v8sf)a, (v8sf)b);
    return (FN(vec))__builtin_ia32_maxpd256((v4df)a, (v4df)b);
#else
    const FN(ivec) m = a > b;
    return (FN(vec))((m & (FN(ivec))a) | (~m & (FN(ivec))b));
#endif
}

static inline __attribute__((always_inline)) FN(vec) FN(vop)(FN(vec) a, FN(vec) b, int op)
{
    return op == POOL_SUM ? a + b : op == POOL_MAX ? FN(vmax)(a, b) : FN(vmax_plain)(a, b);
}

static inline __attribute__((always_inline)) T FN(sop)(T a, T b, int op)
{
    return op == POOL_SUM ? a + b : op == POOL_MAX ? FN(smax)(a, b) : (a > b ? a : b);
}

/* Whether a sum of inputs (nan in pool_plane_body) may have met a NaN: a sum is NaN if any
 * term is (and, rarely, when +inf and -inf meet: a false alarm only costs the
 * NaN-propagating pass) */
static inline int FN(any_nan)(FN(vec) acc)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    T s = 0;
    for (int l = 0; l < L; l++)
        s += acc[l];
    return s != s;
}

/* The even (odd = 0) or odd elements of a then b (see load_deinterleaved) */
static inline __attribute__((always_inline)) FN(vec) FN(deinterleave)(FN(vec) a, FN(vec) b,
                                                                      int odd)
{
    enum { L = sizeof(FN(vec)) / sizeof(T), Q = 16 / sizeof(T) };
    FN(ivec) m;
    for (int h = 0; h < L / Q; h++)
        for (int i = 0; i < Q / 2; i++) {
            m[h * Q + i] = h * Q + 2 * i + odd;
            m[h * Q + Q / 2 + i] = L + h * Q + 2 * i + odd;
        }
    return __builtin_shuffle(a, b, m);
}

/* The even (odd = 0) or odd elements of the 2L at src, in the order a shuffle within 128-bit
 * lanes gives them (one shufps / shufpd under AVX, where a shuffle across them costs three
 * instructions): in each 128-bit half of the result, the first vector's elements of that half,
 * then the second's. An elementwise reduction of such vectors is put in order once, by
 * deinterleaved_order. Reads src[0 .. 2L), one element past the last odd = 0 uses. */
static inline __attribute__((always_inline)) FN(vec) FN(load_deinterleaved)(const T *src,
                                                                           int odd)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    return FN(deinterleave)(*(const FN(uvec) *)src, *(const FN(uvec) *)(src + L), odd);
}

/* The lane of output k (< L) in a deinterleave's result: its first half from the first
 * vector's elements, the second from the second's, within 128-bit lanes */
static inline __attribute__((always_inline)) int FN(dpos)(int k)
{
    enum { L = sizeof(FN(vec)) / sizeof(T), Q = 16 / sizeof(T) };
    const int hi = k >= L / 2, j = k % (L / 2);
    return (j / (Q / 2)) * Q + (hi ? Q / 2 : 0) + j % (Q / 2);
}

/* a[lane of output o], o < L: the outputs of load_deinterleaved vectors in order */
static inline __attribute__((always_inline)) FN(vec) FN(deinterleaved_order)(FN(vec) a)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    FN(ivec) m;
    for (int o = 0; o < L; o++)
        m[o] = FN(dpos)(o);
    return __builtin_shuffle(a, m);
}

/* dst[c] = op over r < rows of src[r * ld + c], c < n: each vector reduced in registers and
 * stored once (a store followed by a load of an overlapping vector stalls store forwarding).
 * With the plain max, *nan (if not NULL) accumulates the inputs too (see any_nan): the NaN
 * check rides on loads the reduction makes anyway. */
static inline __attribute__((always_inline)) void FN(reduce_rows_n)(
    T *restrict dst, const T *restrict src, int64_t ld, int64_t rows, int64_t n, int op,
    FN(vec) *restrict nan)
{
    const int check = op == POOL_MAX_PLAIN && nan;
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    int64_t c = 0;
    for (;; c += L) {
        if (c + L > n) {
            if (n < L || c == n)
                break;
            c = n - L; /* the tail as a vector overlapping the last one (same values) */
        }
        FN(vec) acc = *(const FN(uvec) *)(src + c), sum = acc;
        for (int64_t r = 1; r < rows; r++) {
            const FN(vec) in = *(const FN(uvec) *)(src + r * ld + c);
            acc = FN(vop)(acc, in, op);
            if (check)
                sum += in;
        }
        if (check)
            *nan += sum;
        *(FN(uvec) *)(dst + c) = acc;
        if (c + L == n)
            return;
    }
    for (; c < n; c++) {
        T acc = src[c], sum = acc;
        for (int64_t r = 1; r < rows; r++) {
            acc = FN(sop)(acc, src[r * ld + c], op);
            sum += src[r * ld + c];
        }
        if (check)
            (*nan)[0] += sum;
        dst[c] = acc;
    }
}

/* reduce_rows with the usual window heights (2 and 3 rows) as constants, so that the row
 * loop unrolls: with a variable count the loop kept its bounds and pointers on the stack and
 * cost small planes more than their loads */
static inline __attribute__((always_inline)) void FN(reduce_rows)(
    T *restrict dst, const T *restrict src, int64_t ld, int64_t rows, int64_t n, int op,
    FN(vec) *restrict nan)
{
    if (rows == 3)
        FN(reduce_rows_n)(dst, src, ld, 3, n, op, nan);
    else if (rows == 2)
        FN(reduce_rows_n)(dst, src, ld, 2, n, op, nan);
    else
        FN(reduce_rows_n)(dst, src, ld, rows, n, op, nan);
}

/* dst[o] = op over j < kw of src[o * stride + j], o < n (stride 1 or 2: vectors; stride 2
 * reads one element past the last used) */
static inline __attribute__((always_inline)) void FN(reduce_windows)(
    T *restrict dst, const T *restrict src, int64_t n, int64_t kw, int64_t stride, int op)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    int64_t o = 0;
    for (; stride <= 2; o += L) {
        if (o + L > n) {
            if (n < L || o == n)
                break;
            o = n - L;
        }
        if (stride == 1) {
            FN(vec) acc = *(const FN(uvec) *)(src + o);
            for (int64_t j = 1; j < kw; j++)
                acc = FN(vop)(acc, *(const FN(uvec) *)(src + o + j), op);
            *(FN(uvec) *)(dst + o) = acc;
        } else {
            /* window element j: the even elements from 2o + j, or the odd ones from
               2o + j - 1 (j odd), reduced in the shuffled order, then put in order */
            FN(vec) acc = FN(load_deinterleaved)(src + 2 * o, 0);
            for (int64_t j = 1; j < kw; j += 2) /* (a constant shuffle each) */
                acc = FN(vop)(acc, FN(load_deinterleaved)(src + 2 * o + j - 1, 1), op);
            for (int64_t j = 2; j < kw; j += 2)
                acc = FN(vop)(acc, FN(load_deinterleaved)(src + 2 * o + j, 0), op);
            *(FN(uvec) *)(dst + o) = FN(deinterleaved_order)(acc);
        }
        if (o + L == n)
            return;
    }
    for (; o < n; o++) {
        T acc = src[o * stride];
        for (int64_t j = 1; j < kw; j++)
            acc = FN(sop)(acc, src[o * stride + j], op);
        dst[o] = acc;
    }
}

/* One plane row by row. With the plain max, the inputs are checked for NaN as the vertical
 * reduction loads them: returns whether one may have been seen, the plane's result then being
 * wrong (the caller redoes it with POOL_MAX); else 0. Inputs no window reaches are not
 * checked: they change nothing. */
static inline __attribute__((always_inline)) int FN(pool_plane_body)(
    const asymo_pool2d_job *job, const T *x, T *y, const int op, const int64_t sw)
{
    const int is_max = op != POOL_SUM;
    FN(vec) nan = {0}; /* with the plain max: the inputs reduced, summed */
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
                FN(reduce_rows)(buf, x + y_lo * W + c0, W, y_hi - y_lo, nc, op, &nan);
                /* outputs whose window lies inside the row: vectors; the clipped rest (at
                   the edges) one by one */
                const int64_t end = c1 - kw + pw;
                int64_t oa = pmax(ox0, (c0 + pw + sw - 1) / sw);
                int64_t ob = end >= 0 ? pmin(ox1, end / sw + 1) : ox0;
                if (ob <= oa)
                    oa = ob = ox1;
                else
                    FN(reduce_windows)(yr + oa, buf + (oa * sw - pw - c0), ob - oa, kw, sw, op);
                for (int64_t ox = ox0; ox < ox1; ox++) {
                    if (ox == oa)
                        ox = ob;
                    if (ox >= ox1)
                        break;
                    const int64_t ix0 = ox * sw - pw;
                    T acc = init;
                    for (int64_t c = pmax(ix0, c0); c < pmin(ix0 + kw, c1); c++)
                        acc = FN(sop)(acc, buf[c - c0], op);
                    yr[ox] = acc;
                }
            } else {
                /* a window wider than the buffer (a global pool of a very wide plane):
                   element by element */
                for (int64_t ox = ox0; ox < ox1; ox++) {
                    const int64_t ix0 = ox * sw - pw;
                    T acc = init;
                    for (int64_t iy = y_lo; iy < y_hi; iy++)
                        for (int64_t c = pmax(ix0, 0); c < pmin(ix0 + kw, W); c++) {
                            acc = FN(sop)(acc, x[iy * W + c], op);
                            if (op == POOL_MAX_PLAIN)
                                nan[0] += x[iy * W + c];
                        }
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
    return FN(any_nan)(nan);
}

/* The body for planes of any size: specialised for strides 1, 2 and any */
static inline __attribute__((always_inline)) int FN(pool_plane_rows)(
    const asymo_pool2d_job *job, const T *x, T *y, const int op)
{
    const int64_t sw = job->geom.stride_w;
    if (sw == 1)
        return FN(pool_plane_body)(job, x, y, op, 1);
    if (sw == 2)
        return FN(pool_plane_body)(job, x, y, op, 2);
    return FN(pool_plane_body)(job, x, y, op, sw);
}

static void FN(rows_sum)(const asymo_pool2d_job *job, const T *x, T *y)
{
    FN(pool_plane_rows)(job, x, y, POOL_SUM);
}

static void FN(rows_max)(const asymo_pool2d_job *job, const T *x, T *y)
{
    FN(pool_plane_rows)(job, x, y, POOL_MAX);
}

static int FN(rows_max_plain)(const asymo_pool2d_job *job, const T *x, T *y)
{
    return FN(pool_plane_rows)(job, x, y, POOL_MAX_PLAIN);
}

/* The outputs of one row (stride 1) whose window is clipped by the row's ends, from the row's
 * vertical reductions vr: those left of c_lo reduce prefixes of the row, each one element
 * longer than the last, those from c_hi on suffixes, likewise; a row narrower than the
 * window clips both ends of some windows, reduced one by one. */
static inline __attribute__((always_inline)) void FN(clipped_windows)(
    T *restrict yr, const T *restrict vr, int64_t W, int64_t ow, int64_t kw, int64_t pw,
    int64_t c_lo, int64_t c_hi, const int op)
{
    const T init = op == POOL_SUM ? (T)0 : -(T)INFINITY;
    if (c_hi == c_lo && W < kw) {
        for (int64_t ox = 0; ox < ow; ox++) {
            const int64_t c0 = pmax(ox - pw, 0), c1 = pmin(ox - pw + kw, W);
            T acc = init;
            for (int64_t c = c0; c < c1; c++)
                acc = FN(sop)(acc, vr[c], op);
            yr[ox] = acc;
        }
        return;
    }
    /* output ox < c_lo: window [0, ox - pw + kw) */
    T acc = init;
    for (int64_t c = 0; c < kw - pw - 1; c++)
        acc = FN(sop)(acc, vr[c], op);
    for (int64_t ox = 0; ox < c_lo; ox++) {
        acc = FN(sop)(acc, vr[ox - pw + kw - 1], op);
        yr[ox] = acc;
    }
    /* output ox >= c_hi: window [ox - pw, W) */
    acc = init;
    for (int64_t c = ow - pw; c < W; c++)
        acc = FN(sop)(acc, vr[c], op);
    for (int64_t ox = ow - 1; ox >= c_hi; ox--) {
        acc = FN(sop)(acc, vr[ox - pw], op);
        yr[ox] = acc;
    }
}

/* A small plane with stride 1 (both axes), reduced as one flat array rather than row by row:
 * the vertical windows of all output rows whose window lies inside the plane are one
 * contiguous pass (input rows r - 1, r, r + 1 are offsets -W, 0, +W of the flat plane), the
 * clipped top and bottom rows apart; then the horizontal windows of the whole buffer are one
 * contiguous pass too, wrong only where a window wraps into the neighbouring row: the first
 * pw and the last kw - 1 - pw columns, redone by clipped_windows. Nothing is paid per row but
 * those few columns, which is what planes of a vector or two wide need. v and t hold out_h x
 * width elements (POOL_FLAT_SIZE). Returns what pool_plane_body does (the NaN check). */
static inline __attribute__((always_inline)) int FN(pool_plane_flat)(
    const asymo_pool2d_job *job, const T *x, T *y, const int op, T *restrict v, T *restrict t)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t kh = g->kernel_h, kw = g->kernel_w, ph = g->pad_h, pw = g->pad_w;
    /* output rows [a, b) have their kh input rows inside the plane (padding <= kernel / 2
       keeps every window non-empty) */
    const int64_t a = ph, b = H - kh + ph + 1;
    FN(vec) nan = {0}; /* with the plain max: the inputs reduced, summed (see pool_plane_body) */
    if (b > a)
        FN(reduce_rows)(v + a * W, x + (a - ph) * W, W, kh, (b - a) * W, op, &nan);
    for (int64_t oy = 0; oy < oh; oy++) {
        if (oy == a && b > a)
            oy = b;
        if (oy >= oh)
            break;
        const int64_t y_lo = pmax(oy - ph, 0), y_hi = pmin(oy - ph + kh, H);
        FN(reduce_rows)(v + oy * W, x + y_lo * W, W, y_hi - y_lo, W, op, &nan);
    }
    /* the flat horizontal pass: element i of the result is output (i / W, i % W) when the
       output rows are W wide (odd kernel, padding kw / 2), else it goes through t */
    T *dst = ow == W ? y : t;
    if (oh * W - kw + 1 > 0)
        FN(reduce_windows)(dst + pw, v, oh * W - kw + 1, kw, 1, op);
    /* output columns [c_lo, c_hi) have their window inside the row */
    const int64_t c_lo = pmin(pw, ow), c_hi = pmax(W - kw + pw + 1, c_lo);
    for (int64_t oy = 0; oy < oh; oy++) {
        if (dst != y && c_hi > c_lo)
            memcpy(y + oy * ow + c_lo, t + oy * W + c_lo, (size_t)(c_hi - c_lo) * sizeof(T));
        FN(clipped_windows)(y + oy * ow, v + oy * W, W, ow, kw, pw, c_lo, c_hi, op);
    }
    return FN(any_nan)(nan);
}

static void FN(flat_sum)(const asymo_pool2d_job *job, const T *x, T *y, T *v, T *t)
{
    FN(pool_plane_flat)(job, x, y, POOL_SUM, v, t);
}

static void FN(flat_max)(const asymo_pool2d_job *job, const T *x, T *y, T *v, T *t)
{
    FN(pool_plane_flat)(job, x, y, POOL_MAX, v, t);
}

static int FN(flat_max_plain)(const asymo_pool2d_job *job, const T *x, T *y, T *v, T *t)
{
    return FN(pool_plane_flat)(job, x, y, POOL_MAX_PLAIN, v, t);
}

/* A small plane with stride 2 (both axes), max pooling: the stride-2 counterpart of
 * pool_plane_flat. Each output row's window rows are reduced into a row of v, shifted right
 * by pw and padded to an even pitch Wv with -inf on both sides (what padding and ceil-mode
 * windows past the edge reduce with), so that every window of output (oy, ox) is
 * v[oy * Wv + 2 * ox + j], j < kw: one flat stride-2 pass over all of v (the windows of the
 * columns past ow straddle two rows; their results are dropped). Rows of 7 to 28 outputs
 * would otherwise pay a row's setup for one or two vectors of work. v holds out_h x Wv
 * elements and the pass's slack (POOL_FLAT_S2_SIZE), t out_h x Wv / 2. Returns the NaN check
 * of pool_plane_body. */
static inline __attribute__((always_inline)) int FN(pool_plane_flat_s2)(
    const asymo_pool2d_job *job, const T *x, T *y, const int op, const int64_t Wv,
    T *restrict v, T *restrict t)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t kh = g->kernel_h, kw = g->kernel_w, ph = g->pad_h, pw = g->pad_w;
    const T ninf = -(T)INFINITY;
    FN(vec) nan = {0};
    for (int64_t oy = 0; oy < oh; oy++) {
        T *restrict vr = v + oy * Wv;
        const int64_t y_lo = pmax(2 * oy - ph, 0), y_hi = pmin(2 * oy - ph + kh, H);
        int64_t c = 0;
        if (y_hi > y_lo) {
            for (; c < pw; c++)
                vr[c] = ninf;
            FN(reduce_rows)(vr + pw, x + y_lo * W, W, y_hi - y_lo, W, op, &nan);
            c = pw + W;
        }
        for (; c < Wv; c++)
            vr[c] = ninf;
    }
    /* the stride-2 pass reads a vector and a window past its last output's window */
    for (int64_t i = oh * Wv; i < oh * Wv + POOL_FLAT_S2_SLACK; i++)
        v[i] = ninf;
    const int64_t half = Wv / 2;
    T *dst = half == ow ? y : t;
    FN(reduce_windows)(dst, v, (oh - 1) * half + ow, kw, 2, op);
    if (dst != y)
        for (int64_t oy = 0; oy < oh; oy++)
            memcpy(y + oy * ow, t + oy * half, (size_t)ow * sizeof(T));
    return FN(any_nan)(nan);
}

/* The even pitch of pool_plane_flat_s2's rows: every window of the row inside it */
static inline int64_t FN(flat_s2_pitch)(const asymo_conv_geometry *g)
{
    const int64_t need = pmax(g->pad_w + g->width, 2 * (g->out_w - 1) + g->kernel_w);
    return need + (need & 1);
}

/* y[i] /= d[i], i < n (division, not a reciprocal: the quotient torch computes) */
static void FN(divide)(T *restrict y, const T *restrict d, int64_t n)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    int64_t i = 0;
    for (; i + L <= n; i += L)
        *(FN(uvec) *)(y + i) = *(const FN(uvec) *)(y + i) / *(const FN(uvec) *)(d + i);
    for (; i < n; i++)
        y[i] /= d[i];
}

/* A window covering the whole plane without padding: one contiguous reduction (two vector
 * accumulators to overlap their latencies), the sum divided by the plane's size */
static void FN(pool_plane_global)(const T *x, int64_t n, T *y, int op)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    const T init = op == POOL_SUM ? (T)0 : -(T)INFINITY;
    FN(vec) a, b;
    for (int l = 0; l < L; l++)
        a[l] = b[l] = init;
    int64_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
        a = FN(vop)(a, *(const FN(uvec) *)(x + i), op);
        b = FN(vop)(b, *(const FN(uvec) *)(x + i + L), op);
    }
    if (i + L <= n) {
        a = FN(vop)(a, *(const FN(uvec) *)(x + i), op);
        i += L;
    }
    a = FN(vop)(a, b, op);
    T acc = init;
    for (; i < n; i++)
        acc = FN(sop)(acc, x[i], op);
    for (int l = 0; l < L; l++)
        acc = FN(sop)(acc, a[l], op);
    *y = op == POOL_SUM ? acc / (T)n : acc;
}

/* ---- 3x3 max pooling, stride 1 or 2, straight from the input ----
 *
 * The row path above reduces a row's three input rows into a buffer and reads the buffer
 * back at offsets +1 and +2 (stride 1) or shuffled in pairs (stride 2): loads that straddle
 * the vector stores just made, which store forwarding cannot serve; and every output row
 * reduces all three of its input rows again, though it shares one (stride 2) or two (stride
 * 1) with the row before.
 * Here an output strip of L columns walks down the plane: each input row's horizontal window
 * maximum h is taken from unaligned loads of the input itself (no buffer), kept in registers,
 * and each output row is the maximum of three consecutive h (stride 1: two rows share the
 * maximum of their two common h, so a row costs one input row's h and 1.5 maxima). Strips
 * of consecutive columns reuse the cache lines the strip before brought in. Columns of
 * padding (pw = 1) are replaced by a copy of the window's neighbouring column through a
 * shuffle, so the edge strips stay vectors; rows of padding and ceil-mode rows past the
 * plane are -inf. The NaN check (plain max first, the plane redone if any input met is NaN)
 * ORs unordered compares of loads the reduction makes anyway: a compare covers two vectors,
 * and the ORs form a one-cycle chain across the plane (a running sum, as the row path keeps,
 * would be a three-cycle one). Tried and not kept: bands of output rows (the strips' h carried
 * across bands) and software prefetch of the rows ahead, both slower or no faster. */

/* lanes where a or b is NaN (all bits set) */
static inline __attribute__((always_inline)) FN(ivec) FN(unord)(FN(vec) a, FN(vec) b)
{
#if defined(__AVX__)
    typedef float v8sf __attribute__((vector_size(32)));
    typedef double v4df __attribute__((vector_size(32)));
    if (sizeof(T) == sizeof(float))
        return (FN(ivec))__builtin_ia32_cmpps256((v8sf)a, (v8sf)b, 3 /* _CMP_UNORD_Q */);
    return (FN(ivec))__builtin_ia32_cmppd256((v4df)a, (v4df)b, 3);
#else
    return (a != a) | (b != b);
#endif
}


/* The horizontal window maxima of one input row p for the strip whose first window starts at
 * column base (stride 2: in deinterleaved order). ORs into *bad the lanes of loads that hold
 * a NaN (only with the plain max). Reads columns [base, base + sw * L + 3 - sw) of the row,
 * less the padding column of an edge variant. */
static inline __attribute__((always_inline)) FN(vec) FN(p3_row)(
    const T *p, int64_t base, const int sw, const int variant, const int op,
    FN(ivec) *restrict bad)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    const int check = op == POOL_MAX_PLAIN;
    FN(vec) a0, a1, a2;
    if (sw == 1) {
        if (variant == P3_LEFT) { /* column base = -1 is padding: column 0 stands in */
            FN(ivec) m;
            for (int k = 0; k < L; k++)
                m[k] = k > 0 ? k - 1 : 0;
            a1 = *(const FN(uvec) *)p;
            a2 = *(const FN(uvec) *)(p + 1);
            a0 = __builtin_shuffle(a1, m);
            if (check)
                *bad |= FN(unord)(a1, a2);
        } else if (variant == P3_RIGHT) { /* column base + L + 1 is padding */
            FN(ivec) m;
            for (int k = 0; k < L; k++)
                m[k] = k < L - 1 ? k + 1 : L - 1;
            a0 = *(const FN(uvec) *)(p + base);
            a1 = *(const FN(uvec) *)(p + base + 1);
            a2 = __builtin_shuffle(a1, m);
            if (check)
                *bad |= FN(unord)(a0, a1);
        } else {
            a0 = *(const FN(uvec) *)(p + base);
            a1 = *(const FN(uvec) *)(p + base + 1);
            a2 = *(const FN(uvec) *)(p + base + 2);
            if (check)
                *bad |= FN(unord)(a0, a2);
        }
    } else {
        /* a0, a1, a2: columns base + 2k, + 1, + 2 of output k */
        if (variant == P3_LEFT) { /* base = -1: the window's column 1 stands in for it */
            const FN(vec) x = *(const FN(uvec) *)p, y = *(const FN(uvec) *)(p + L);
            FN(ivec) m;
            for (int k = 0; k < L; k++)
                m[FN(dpos)(k)] = FN(dpos)(k > 0 ? k - 1 : 0);
            a1 = FN(deinterleave)(x, y, 0);
            a2 = FN(deinterleave)(x, y, 1);
            a0 = __builtin_shuffle(a2, m);
            if (check)
                *bad |= FN(unord)(x, y);
        } else {
            const FN(vec) a = *(const FN(uvec) *)(p + base);
            const FN(vec) b = *(const FN(uvec) *)(p + base + L);
            a0 = FN(deinterleave)(a, b, 0);
            a1 = FN(deinterleave)(a, b, 1);
            if (check)
                *bad |= FN(unord)(a, b);
            if (variant == P3_RIGHT) { /* column base + 2L is padding: base + 2L - 1 stands in */
                FN(ivec) m;
                for (int k = 0; k < L; k++)
                    m[FN(dpos)(k)] = k < L - 1 ? FN(dpos)(k + 1) : L + FN(dpos)(L - 1);
                a2 = __builtin_shuffle(a0, a1, m);
            } else {
                const FN(vec) x = *(const FN(uvec) *)(p + base + 1);
                const FN(vec) y = *(const FN(uvec) *)(p + base + 1 + L);
                a2 = FN(deinterleave)(x, y, 1);
                if (check && variant == P3_LAST)
                    *bad |= FN(unord)(x, y);
            }
        }
    }
    return FN(vop)(FN(vop)(a0, a1, op), a2, op);
}

/* One strip: outputs [o, o + L) of every output row, walking down the plane (see above) */
static inline __attribute__((always_inline)) void FN(p3_strip)(
    const asymo_pool2d_job *job, const T *x, T *y, int64_t o, const int s, const int variant,
    const int op, FN(ivec) *restrict bad)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w, ph = g->pad_h;
    const int64_t base = o * s - g->pad_w;
    FN(vec) ninf;
    for (size_t l = 0; l < sizeof(FN(vec)) / sizeof(T); l++)
        ninf[l] = -(T)INFINITY;
#define P3_H(i) ((i) < H ? FN(p3_row)(x + (i) * W, base, s, variant, op, bad) : ninf)
    T *yo = y + o;
    FN(vec) ha = ph ? ninf : P3_H(0);
    if (s == 1) {
        /* out[r] = max(h[r - ph], h[r - ph + 1], h[r - ph + 2]) */
        FN(vec) hb = P3_H(1 - ph);
        int64_t r = 0;
        for (; r + 1 < oh; r += 2) {
            const int64_t i = r + 2 - ph;
            const FN(vec) hc = P3_H(i), hd = P3_H(i + 1);
            const FN(vec) m = FN(vop)(hb, hc, op);
            *(FN(uvec) *)(yo + r * ow) = FN(vop)(ha, m, op);
            *(FN(uvec) *)(yo + (r + 1) * ow) = FN(vop)(m, hd, op);
            ha = hc;
            hb = hd;
        }
        if (r < oh) {
            const FN(vec) hc = P3_H(r + 2 - ph);
            *(FN(uvec) *)(yo + r * ow) = FN(vop)(FN(vop)(ha, hb, op), hc, op);
        }
    } else {
        /* out[r] = max(h[2r - ph], h[2r - ph + 1], h[2r - ph + 2]) */
        for (int64_t r = 0; r < oh; r++) {
            const int64_t i = 2 * r + 1 - ph;
            const FN(vec) hb = P3_H(i), hc = P3_H(i + 1);
            *(FN(uvec) *)(yo + r * ow) =
                FN(deinterleaved_order)(FN(vop)(FN(vop)(ha, hb, op), hc, op));
            ha = hc;
        }
    }
#undef P3_H
}

/* Whether p3_plane takes a plane of this geometry: max pooling by 3x3 windows, equal
 * strides 1 or 2, more than one vector of outputs per row, and an input plane of at most
 * P3_MAX_PLANE_BYTES. A larger plane outgrows L1, and inside a network (its input just
 * written by the layer before, in L2 and L3) the strips' walk down its whole height ran
 * slower than the row path's reads in memory order: docs/pooling.md. */
static inline int FN(p3_fits)(const asymo_pool2d_job *job)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    const asymo_conv_geometry *g = &job->geom;
    return job->kind == ASYMO_POOL_MAX && g->kernel_h == 3 && g->kernel_w == 3 &&
           g->stride_h == g->stride_w && (g->stride_w == 1 || g->stride_w == 2) &&
           g->pad_h <= 1 && g->pad_w <= 1 && g->out_w > L &&
           g->height * g->width * (int64_t)sizeof(T) <= P3_MAX_PLANE_BYTES;
}

/* One plane (p3_fits): the strips left to right, the last one overlapping the one before
 * when L does not divide the outputs; stride 2 with both a left and a ceil-mode right column
 * past the row leaves the last output of each row, whose window holds one input column, to
 * the scalar code. Returns whether a NaN may have been met (plain max), as pool_plane_body. */
static inline __attribute__((always_inline)) int FN(p3_plane)(
    const asymo_pool2d_job *job, const T *x, T *y, const int s, const int op)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t ph = g->pad_h, pw = g->pad_w;
    /* columns the last window reaches past the row */
    const int64_t over = (ow - 1) * s - pw + 3 - W;
    const int64_t ob = over > 1 ? ow - 1 : ow; /* outputs [0, ob) as vectors */
    FN(ivec) bad = {0};
    int64_t o = 0;
    if (pw) {
        FN(p3_strip)(job, x, y, 0, s, P3_LEFT, op, &bad);
        o = L;
    }
    for (; o + L < ob; o += L)
        FN(p3_strip)(job, x, y, o, s, P3_INNER, op, &bad);
    if (over == 1)
        FN(p3_strip)(job, x, y, ob - L, s, P3_RIGHT, op, &bad);
    else if (o < ob || !pw) /* (pw: the left strip may have been the last) */
        FN(p3_strip)(job, x, y, ob - L, s, s == 2 ? P3_LAST : P3_INNER, op, &bad);
    if (ob < ow) {
        /* the window of output ob holds input column W - 1 alone (the scalar NaN-letting
           max: right whatever the check says) */
        for (int64_t r = 0; r < oh; r++) {
            T acc = -(T)INFINITY;
            for (int64_t iy = pmax(r * s - ph, 0); iy < pmin(r * s - ph + 3, H); iy++)
                acc = FN(smax)(acc, x[iy * W + W - 1]);
            y[r * ow + ob] = acc;
        }
    }
    int any = 0;
    for (size_t l = 0; l < sizeof(FN(vec)) / sizeof(T); l++)
        any |= bad[l] != 0;
    return any;
}

static int FN(p3_plain_s1)(const asymo_pool2d_job *job, const T *x, T *y)
{
    return FN(p3_plane)(job, x, y, 1, POOL_MAX_PLAIN);
}

static int FN(p3_plain_s2)(const asymo_pool2d_job *job, const T *x, T *y)
{
    return FN(p3_plane)(job, x, y, 2, POOL_MAX_PLAIN);
}

static void FN(p3_nan_s1)(const asymo_pool2d_job *job, const T *x, T *y)
{
    FN(p3_plane)(job, x, y, 1, POOL_MAX);
}

static void FN(p3_nan_s2)(const asymo_pool2d_job *job, const T *x, T *y)
{
    FN(p3_plane)(job, x, y, 2, POOL_MAX);
}

/* pool_planes for the planes p3_fits takes */
static void FN(pool_planes_3x3)(const asymo_pool2d_job *job, const T *x, T *y, int64_t nplanes)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t in_plane = g->height * g->width, out_plane = g->out_h * g->out_w;
    for (int64_t p = 0; p < nplanes; p++) {
        const T *xp = x + p * in_plane;
        T *yp = y + p * out_plane;
        if (g->stride_w == 1) {
            if (FN(p3_plain_s1)(job, xp, yp))
                FN(p3_nan_s1)(job, xp, yp);
        } else if (FN(p3_plain_s2)(job, xp, yp)) {
            FN(p3_nan_s2)(job, xp, yp);
        }
    }
}

/* nplanes planes of a job: global windows, 3x3 max pooling (strips), small planes (flat) or
 * row by row; max pooling runs the one-instruction max on planes free of NaN */
static void FN(pool_planes)(const asymo_pool2d_job *job, const T *x, T *y, int64_t nplanes)
{
    enum { L = sizeof(FN(vec)) / sizeof(T) };
    const asymo_conv_geometry *g = &job->geom;
    const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
    const int64_t in_plane = H * W, out_plane = oh * ow;
    const int avg = job->kind != ASYMO_POOL_MAX;
    if (g->kernel_h == H && g->kernel_w == W && g->pad_h == 0 && g->pad_w == 0) {
        for (int64_t p = 0; p < nplanes; p++)
            FN(pool_plane_global)(x + p * in_plane, in_plane, y + p * out_plane,
                                  avg ? POOL_SUM : POOL_MAX);
        return;
    }
    if (FN(p3_fits)(job)) {
        FN(pool_planes_3x3)(job, x, y, nplanes);
        return;
    }
    if (g->stride_h == 1 && g->stride_w == 1 && W <= POOL_FLAT_WIDTH_VECS * L &&
        oh * W <= POOL_FLAT_SIZE && out_plane <= POOL_FLAT_SIZE) {
        T v[POOL_FLAT_SIZE], t[POOL_FLAT_SIZE];
        if (avg) {
            /* the divisors of the plane's outputs, the same for every plane */
            T d[POOL_FLAT_SIZE];
            for (int64_t oy = 0; oy < oh; oy++) {
                const int64_t cy = pool_window_count(oy - g->pad_h, g->kernel_h, H, g->pad_h,
                                                     job->count_include_pad);
                for (int64_t ox = 0; ox < ow; ox++)
                    d[oy * ow + ox] = (T)(cy * pool_window_count(ox - g->pad_w, g->kernel_w, W,
                                                                 g->pad_w,
                                                                 job->count_include_pad));
            }
            for (int64_t p = 0; p < nplanes; p++) {
                FN(flat_sum)(job, x + p * in_plane, y + p * out_plane, v, t);
                FN(divide)(y + p * out_plane, d, out_plane);
            }
            return;
        }
        for (int64_t p = 0; p < nplanes; p++) {
            if (FN(flat_max_plain)(job, x + p * in_plane, y + p * out_plane, v, t))
                FN(flat_max)(job, x + p * in_plane, y + p * out_plane, v, t);
        }
        return;
    }
    if (!avg && g->stride_h == 2 && g->stride_w == 2) {
        const int64_t Wv = FN(flat_s2_pitch)(g);
        if (Wv <= POOL_FLAT_S2_WIDTH_VECS * L && oh * Wv + POOL_FLAT_S2_SLACK <= POOL_FLAT_S2_SIZE) {
            T v[POOL_FLAT_S2_SIZE], t[POOL_FLAT_S2_SIZE / 2];
            for (int64_t p = 0; p < nplanes; p++)
                if (FN(pool_plane_flat_s2)(job, x + p * in_plane, y + p * out_plane,
                                           POOL_MAX_PLAIN, Wv, v, t))
                    FN(pool_plane_flat_s2)(job, x + p * in_plane, y + p * out_plane, POOL_MAX,
                                           Wv, v, t);
            return;
        }
    }
    for (int64_t p = 0; p < nplanes; p++) {
        if (avg)
            FN(rows_sum)(job, x + p * in_plane, y + p * out_plane);
        else if (FN(rows_max_plain)(job, x + p * in_plane, y + p * out_plane))
            FN(rows_max)(job, x + p * in_plane, y + p * out_plane);
    }
}

