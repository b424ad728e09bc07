/* asymo._matmul_fast: asymo.matmul's common case from Python to the C GEMM in one call.
 *
 * asymo.matmul is written in Python; for a product that takes a few microseconds the checks,
 * the plan lookup and the cffi call cost as much as the work. This module does the common
 * case -- two ndarrays (exact type) of the same native float32/float64 dtype, 2-D @ 2-D,
 * 2-D @ 1-D or 1-D @ 2-D, aligned, strides a whole number of elements, out None or a matching
 * array -- against the CPython and NumPy C APIs and returns None for anything else, so that
 * the Python implementation (asymo/ops/matmul.py) handles it with NumPy's semantics and errors.
 *
 * Nothing is decided twice. The C core (pool, GEMM driver) is the one inside asymo._native:
 * its entry points come as addresses from cffi (set_core), so there is one pool state. Plans
 * are made by the Python planner (asymo/ops/matmul_fast.py, which asks asymo.plan.matmul) on the
 * first call of a shape and cached here by (M, K, N, dtype, pool, thread limit); the Python
 * side empties the cache when what plans depend on changes (clear_plans), a cached plan made
 * under load adjustment carries the time its load reading expires. Pools are registered by
 * the planner (register_pool) and forgotten before their handle is destroyed (forget_pool,
 * which waits for the calls that are running on it). The default pool is the one registered
 * with set_default while env ASYMO_TOPOLOGY / ASYMO_POOL_POLICY keep the values it was built
 * for (as asymo.get_pool checks them).
 *
 * Every function here runs with the GIL held except the GEMM itself, so the module's state
 * needs no lock; a pool's in-flight count is atomic because calls leave it without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* --- the C core, by address (asymo._native) ------------------------------------------------ */
typedef int (*gemm_2d_fn)(void *pool, const void *plan, int dtype, int64_t m, int64_t k,
                          int64_t n, const void *a, int64_t rsa, int64_t csa, const void *b,
                          int64_t rsb, int64_t csb, void *c, int64_t rsc, int64_t csc);
typedef int (*get_limit_fn)(const void *pool);
typedef int (*current_cpu_fn)(void);

static gemm_2d_fn core_gemm_2d_checked;
static get_limit_fn core_pool_get_limit;
static current_cpu_fn core_current_cpu;
static int core_ok, core_overlap, core_f32, core_f64, core_enomem;

/* --- why a call was not taken (counters, for tests and `asymo info`) ----------------------- */
enum {
    WHY_DISABLED, WHY_TYPE, WHY_DTYPE, WHY_NDIM, WHY_SHAPE, WHY_EMPTY, WHY_LAYOUT, WHY_OUT,
    WHY_POOL, WHY_PLAN, WHY_OVERLAP, NWHY
};
static const char *const why_names[NWHY] = {
    "disabled", "type", "dtype", "ndim", "shape", "empty", "layout", "out", "pool", "plan",
    "overlap"
};
static Py_ssize_t n_fast, n_plans, n_nogil, n_why[NWHY];
static int enabled = 1;

/* products of at least this many FLOPs run with the GIL released */
static double nogil_flops = 65536.0;

/* --- registered pools ------------------------------------------------------------------------ */
#define MAX_POOLS 16
typedef struct {
    PyObject *pool;      /* borrowed: forget_pool runs (from the Pool's finalizer) before it dies */
    void *handle;        /* asymo_pool * */
    int live;            /* 0 once forget_pool started: no new calls */
    long inflight;       /* calls running on handle (atomic) */
} pool_slot;

static pool_slot pools[MAX_POOLS];
static int default_slot = -1;
static PyObject *environ_data;                 /* os.environ._data (bytes -> bytes) */
static PyObject *env_keys[2];                  /* b"ASYMO_TOPOLOGY", b"ASYMO_POOL_POLICY" */
static PyObject *default_env[2];               /* values the default pool was built for */
static PyObject *pool_type;                    /* asymo.runtime.pool.Pool */
static PyObject *planner;                      /* asymo.ops.matmul_fast._plan */

/* --- the plan cache -------------------------------------------------------------------------- */
#define PLAN_WAYS 2
#define PLAN_SETS 256
#define SERIAL_CPU_WORDS 4                     /* serial_cpus below 256 are cached */
typedef struct {
    int64_t m, k, n;
    int dtype, slot, limit, used;
    const void *plan;                          /* asymo_gemm_plan * inside keep */
    PyObject *keep;                            /* the cffi struct (strong reference) */
    int serial, has_cpus;
    uint64_t cpus[SERIAL_CPU_WORDS];
    double expires;                            /* CLOCK_MONOTONIC seconds; 0: never */
    unsigned stamp;                            /* for replacing the older of a set */
} plan_entry;

static plan_entry plans[PLAN_SETS][PLAN_WAYS];
static unsigned plan_clock;

static void clear_entry(plan_entry *e)
{
    PyObject *keep = e->keep;
    memset(e, 0, sizeof *e);
    Py_XDECREF(keep);
}

static void purge_plans(int slot)
{
    for (int s = 0; s < PLAN_SETS; s++)
        for (int w = 0; w < PLAN_WAYS; w++)
            if (plans[s][w].used && (slot < 0 || plans[s][w].slot == slot))
                clear_entry(&plans[s][w]);
}

static unsigned plan_set(int64_t m, int64_t k, int64_t n, int dtype, int slot)
{
    uint64_t h = (uint64_t)m * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)k * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    h ^= (uint64_t)n * 0x165667B19E3779F9ull + (h << 6) + (h >> 2);
    h ^= (uint64_t)(dtype * MAX_POOLS + slot) * 0x27D4EB2F165667C5ull;
    return (unsigned)((h ^ (h >> 29)) % PLAN_SETS);
}

static double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static plan_entry *find_plan(int64_t m, int64_t k, int64_t n, int dtype, int slot, int limit)
{
    plan_entry *set = plans[plan_set(m, k, n, dtype, slot)];
    for (int w = 0; w < PLAN_WAYS; w++) {
        plan_entry *e = &set[w];
        if (e->used && e->m == m && e->k == k && e->n == n && e->dtype == dtype
                && e->slot == slot && e->limit == limit) {
            if (e->expires != 0.0 && monotonic_now() >= e->expires)
                return NULL;
            return e;
        }
    }
    return NULL;
}

/* --- pools ----------------------------------------------------------------------------------- */
static int slot_of_object(PyObject *pool)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool == pool && pools[i].live)
            return i;
    return -1;
}

static int env_matches(int i)
{
    PyObject *now = PyDict_GetItemWithError(environ_data, env_keys[i]);  /* borrowed */
    if (now == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (now == default_env[i])
        return 1;
    if (now == NULL || default_env[i] == Py_None)
        return (now == NULL) == (default_env[i] == Py_None);
    int eq = PyObject_RichCompareBool(now, default_env[i], Py_EQ);
    if (eq < 0) {
        PyErr_Clear();
        return 0;
    }
    return eq;
}

/* The registered slot for the pool argument, or -1 (then the planner is asked). */
static int resolve_pool(PyObject *pool)
{
    if (pool == Py_None) {
        if (default_slot < 0 || !pools[default_slot].live || environ_data == NULL)
            return -1;
        if (!env_matches(0) || !env_matches(1))
            return -1;
        return default_slot;
    }
    return slot_of_object(pool);
}

/* --- argument checks ------------------------------------------------------------------------- */
/* Element strides of x if its data and strides suit the GEMM driver (aligned, strides a whole
 * number of elements), else -1. */
static int element_strides(PyArrayObject *x, int es, int64_t *s0, int64_t *s1)
{
    if (!PyArray_ISALIGNED(x))
        return -1;
    const npy_intp *st = PyArray_STRIDES(x);
    npy_intp r = st[0], c = PyArray_NDIM(x) == 2 ? st[1] : 0;
    if ((r | c) & (es - 1))
        return -1;
    *s0 = (int64_t)(r / es);
    *s1 = (int64_t)(c / es);
    return 0;
}

/* 1 unless no two elements of x (1-D or 2-D) can share memory: NumPy computes into a temporary
 * for an out like that (a writeable as_strided view) and the Python path does the same, where
 * the GEMM's workers would race on the shared elements. Conservative: strides that interleave
 * without aliasing count as overlapping too. */
static int may_overlap_itself(PyArrayObject *x, int es)
{
    const npy_intp *d = PyArray_DIMS(x), *st = PyArray_STRIDES(x);
    npy_intp n0 = d[0], s0 = st[0] < 0 ? -st[0] : st[0], n1 = 1, s1 = 0;
    if (PyArray_NDIM(x) == 2) {
        n1 = d[1];
        s1 = st[1] < 0 ? -st[1] : st[1];
    }
    if (n0 <= 1)
        return n1 > 1 && s1 == 0;
    if (n1 <= 1)
        return s0 == 0;
    if (s0 < s1) {          /* (n1, s1): the dimension of the smaller stride */
        npy_intp t = n0; n0 = n1; n1 = t;
        t = s0; s0 = s1; s1 = t;
    }
    /* s1 >= es and each run along the smaller stride ends before the next one starts */
    return s1 < es || s0 / s1 < n1 - 1 || s0 - (n1 - 1) * s1 < es;
}

/* The result array, its data on a cache line from RESULT_ALIGN_BYTES on (asymo.runtime.memory:
 * NumPy aligns to 16 bytes, and the kernels' 64-byte tile rows would straddle two lines): a
 * view of a uint8 buffer that is its base. */
#define CACHE_LINE 64
#define RESULT_ALIGN_BYTES 4096
static PyArrayObject *new_result(int nd, npy_intp *dims, int type, int es)
{
    const npy_intp nbytes = PyArray_MultiplyList(dims, nd) * es;
    if (nbytes < RESULT_ALIGN_BYTES)
        return (PyArrayObject *)PyArray_SimpleNew(nd, dims, type);
    npy_intp rawn = nbytes + CACHE_LINE;
    PyArrayObject *raw = (PyArrayObject *)PyArray_SimpleNew(1, &rawn, NPY_UINT8);
    if (raw == NULL)
        return NULL;
    char *data = PyArray_BYTES(raw);
    data += (CACHE_LINE - (uintptr_t)data % CACHE_LINE) % CACHE_LINE;
    PyArrayObject *c = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, PyArray_DescrFromType(type), nd, dims, NULL, data, NPY_ARRAY_CARRAY, NULL);
    if (c == NULL) {
        Py_DECREF(raw);
        return NULL;
    }
    if (PyArray_SetBaseObject(c, (PyObject *)raw) < 0) { /* the reference is stolen either way */
        Py_DECREF(c);
        return NULL;
    }
    return c;
}

static int dtype_code(PyArrayObject *x)
{
    int t = PyArray_TYPE(x);
    if (!PyArray_ISNOTSWAPPED(x))
        return -1;
    if (t == NPY_FLOAT32)
        return core_f32;
    if (t == NPY_FLOAT64)
        return core_f64;
    return -1;
}

static PyObject *not_taken(int why)
{
    n_why[why]++;
    Py_RETURN_NONE;
}

/* Ask the Python planner for (M, K, N, dtype) on `pool_arg` and cache its answer. Returns the
 * entry, or NULL with an exception set (the planner failed) or without (not cacheable: the
 * call goes to the Python path). */
static plan_entry *make_plan(int64_t m, int64_t k, int64_t n, int dtype, PyObject *pool_arg,
                             int *slot_out)
{
    if (planner == NULL)
        return NULL;
    n_plans++;
    PyObject *res = PyObject_CallFunction(planner, "LLLiO", (long long)m, (long long)k,
                                          (long long)n, dtype, pool_arg);
    if (res == NULL)
        return NULL;
    if (res == Py_None) {
        Py_DECREF(res);
        return NULL;
    }
    /* (pool, plan cdata, plan address, serial, serial_cpus, limit, expires) */
    PyObject *pool, *keep, *cpus;
    unsigned long long addr;
    int serial, limit;
    double expires;
    if (!PyArg_ParseTuple(res, "OOKpOid", &pool, &keep, &addr, &serial, &cpus, &limit,
                          &expires)) {
        Py_DECREF(res);
        return NULL;
    }
    int slot = pool_arg == Py_None ? resolve_pool(Py_None) : slot_of_object(pool);
    if (slot < 0 || pools[slot].pool != pool || expires < 0.0) {
        Py_DECREF(res);
        return NULL;
    }
    plan_entry fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.m = m;
    fresh.k = k;
    fresh.n = n;
    fresh.dtype = dtype;
    fresh.slot = slot;
    fresh.limit = limit;
    fresh.used = 1;
    fresh.plan = (const void *)(uintptr_t)addr;
    fresh.serial = serial;
    fresh.expires = expires;
    Py_ssize_t ncpu = PyTuple_Check(cpus) ? PyTuple_GET_SIZE(cpus) : -1;
    if (ncpu < 0) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_TypeError, "matmul fast path: serial_cpus must be a tuple");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ncpu; i++) {
        long cpu = PyLong_AsLong(PyTuple_GET_ITEM(cpus, i));
        if (cpu == -1 && PyErr_Occurred()) {
            Py_DECREF(res);
            return NULL;
        }
        if (cpu < 0 || cpu >= 64 * SERIAL_CPU_WORDS) {  /* not representable: not cached */
            Py_DECREF(res);
            return NULL;
        }
        fresh.cpus[cpu / 64] |= 1ull << (cpu % 64);
        fresh.has_cpus = 1;
    }
    Py_INCREF(keep);
    fresh.keep = keep;
    Py_DECREF(res);

    plan_entry *set = plans[plan_set(m, k, n, dtype, slot)];
    plan_entry *victim = &set[0];
    for (int w = 0; w < PLAN_WAYS; w++) {
        plan_entry *e = &set[w];
        if (e->used && e->m == m && e->k == k && e->n == n && e->dtype == dtype
                && e->slot == slot && e->limit == limit) {
            victim = e;
            break;
        }
        if (!e->used || (victim->used && e->stamp < victim->stamp))
            victim = e;
    }
    clear_entry(victim);
    *victim = fresh;
    victim->stamp = ++plan_clock;
    *slot_out = slot;
    return victim;
}

/* --- matmul ---------------------------------------------------------------------------------- */
static PyObject *fast_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "matmul(a, b, out, pool) takes 4 arguments");
        return NULL;
    }
    if (!enabled)
        return not_taken(WHY_DISABLED);
    PyObject *oa = args[0], *ob = args[1], *oout = args[2], *opool = args[3];
    if (!PyArray_CheckExact(oa) || !PyArray_CheckExact(ob)
            || (oout != Py_None && !PyArray_CheckExact(oout)))
        return not_taken(WHY_TYPE);
    if (opool != Py_None && (PyObject *)Py_TYPE(opool) != pool_type)
        return not_taken(WHY_POOL);
    PyArrayObject *a = (PyArrayObject *)oa, *b = (PyArrayObject *)ob;
    const int dtype = dtype_code(a);
    if (dtype < 0 || PyArray_TYPE(b) != PyArray_TYPE(a) || !PyArray_ISNOTSWAPPED(b))
        return not_taken(WHY_DTYPE);
    const int na = PyArray_NDIM(a), nb = PyArray_NDIM(b);
    if (na < 1 || na > 2 || nb < 1 || nb > 2 || (na == 1 && nb == 1))
        return not_taken(WHY_NDIM);
    const npy_intp *sa = PyArray_DIMS(a), *sb = PyArray_DIMS(b);
    const int64_t M = na == 2 ? sa[0] : 1, K = sa[na - 1], N = nb == 2 ? sb[1] : 1;
    if (sb[0] != K)
        return not_taken(WHY_SHAPE);
    if (M == 0 || N == 0 || K == 0)
        return not_taken(WHY_EMPTY);
    const int es = (int)PyArray_ITEMSIZE(a);
    int64_t rsa, csa, rsb, csb, rsc, csc;
    if (element_strides(a, es, &rsa, &csa) || element_strides(b, es, &rsb, &csb))
        return not_taken(WHY_LAYOUT);
    if (na == 1) {          /* a row: (1, K), as a[np.newaxis, :] */
        csa = rsa;
        rsa = 0;
    }
    /* b 1-D is a column (K, 1), as b[:, np.newaxis]: csb = 0 already */

    /* the result: shape (M, N), (M,) or (N,) */
    const int nr = (na == 2) + (nb == 2);
    npy_intp rdims[2];
    if (nr == 2) {
        rdims[0] = (npy_intp)M;
        rdims[1] = (npy_intp)N;
    } else {
        rdims[0] = (npy_intp)(na == 2 ? M : N);
    }
    PyArrayObject *c;
    if (oout == Py_None) {
        c = NULL;           /* allocated below, once the plan is known */
        if (nr == 2) {
            rsc = N;
            csc = 1;
        } else if (na == 2) {   /* (M,) as c[:, np.newaxis] */
            rsc = 1;
            csc = 1;
        } else {                /* (N,) as c[np.newaxis, :] */
            rsc = 0;
            csc = 1;
        }
    } else {
        c = (PyArrayObject *)oout;
        if (PyArray_TYPE(c) != PyArray_TYPE(a) || !PyArray_ISNOTSWAPPED(c)
                || PyArray_NDIM(c) != nr || !PyArray_ISWRITEABLE(c))
            return not_taken(WHY_OUT);
        const npy_intp *sc = PyArray_DIMS(c);
        if (sc[0] != rdims[0] || (nr == 2 && sc[1] != rdims[1]))
            return not_taken(WHY_OUT);
        int64_t s0, s1;
        if (element_strides(c, es, &s0, &s1) || may_overlap_itself(c, es))
            return not_taken(WHY_OUT);
        if (nr == 2) {
            rsc = s0;
            csc = s1;
        } else if (na == 2) {
            rsc = s0;
            csc = 1;
        } else {
            rsc = 0;
            csc = s0;
        }
    }

    int slot = resolve_pool(opool);
    plan_entry *e = NULL;
    if (slot >= 0)
        e = find_plan(M, K, N, dtype, slot, core_pool_get_limit(pools[slot].handle));
    if (e == NULL) {
        e = make_plan(M, K, N, dtype, opool, &slot);
        if (e == NULL) {
            if (PyErr_Occurred())
                return NULL;
            return not_taken(WHY_PLAN);
        }
    }
    int in_caller = e->serial;
    if (!in_caller && e->has_cpus) {
        int cpu = core_current_cpu();
        in_caller = cpu >= 0 && cpu < 64 * SERIAL_CPU_WORDS
                    && ((e->cpus[cpu / 64] >> (cpu % 64)) & 1);
    }
    /* the entry may be replaced (another thread, a cache clear) while the GIL is released */
    const void *plan = e->plan;
    PyObject *keep = e->keep;
    Py_INCREF(keep);

    if (c == NULL) {
        c = new_result(nr, rdims, PyArray_TYPE(a), es);
        if (c == NULL) {
            Py_DECREF(keep);
            return NULL;
        }
    } else {
        Py_INCREF(c);
    }
    /* a finalizer run by the allocation above may have forgotten the pool */
    if (!pools[slot].live) {
        Py_DECREF(keep);
        Py_DECREF(c);
        return not_taken(WHY_POOL);
    }
    void *handle = in_caller ? NULL : pools[slot].handle;
    const void *pa = PyArray_DATA(a), *pb = PyArray_DATA(b);
    void *pc = PyArray_DATA(c);
    int rc;
    __atomic_fetch_add(&pools[slot].inflight, 1, __ATOMIC_ACQ_REL);
    if (2.0 * (double)M * (double)K * (double)N >= nogil_flops) {
        n_nogil++;
        Py_BEGIN_ALLOW_THREADS
        rc = core_gemm_2d_checked(handle, plan, dtype, M, K, N, pa, rsa, csa, pb, rsb, csb,
                                  pc, rsc, csc);
        __atomic_fetch_sub(&pools[slot].inflight, 1, __ATOMIC_ACQ_REL);
        Py_END_ALLOW_THREADS
    } else {
        rc = core_gemm_2d_checked(handle, plan, dtype, M, K, N, pa, rsa, csa, pb, rsb, csb,
                                  pc, rsc, csc);
        __atomic_fetch_sub(&pools[slot].inflight, 1, __ATOMIC_ACQ_REL);
    }
    Py_DECREF(keep);
    if (rc == core_ok) {
        n_fast++;
        return (PyObject *)c;
    }
    Py_DECREF(c);
    if (rc == core_overlap)
        return not_taken(WHY_OVERLAP);
    PyErr_Format(rc == core_enomem ? PyExc_MemoryError : PyExc_RuntimeError,
                 "asymo GEMM failed (error %d) for shape (M, K, N) = (%lld, %lld, %lld)", rc,
                 (long long)M, (long long)K, (long long)N);
    return NULL;
}

/* --- set-up and bookkeeping (called from asymo/ops/matmul_fast.py) --------------------------- */
static PyObject *set_core(PyObject *self, PyObject *args)
{
    unsigned long long gemm, limit, cpu;
    if (!PyArg_ParseTuple(args, "KKKiiiii", &gemm, &limit, &cpu, &core_ok, &core_overlap,
                          &core_f32, &core_f64, &core_enomem))
        return NULL;
    if (!gemm || !limit || !cpu) {
        PyErr_SetString(PyExc_ValueError, "set_core: NULL function address");
        return NULL;
    }
    core_gemm_2d_checked = (gemm_2d_fn)(uintptr_t)gemm;
    core_pool_get_limit = (get_limit_fn)(uintptr_t)limit;
    core_current_cpu = (current_cpu_fn)(uintptr_t)cpu;
    Py_RETURN_NONE;
}

static PyObject *set_context(PyObject *self, PyObject *args)
{
    PyObject *ptype, *plan_fn, *data, *k0, *k1;
    if (!PyArg_ParseTuple(args, "OOOOO", &ptype, &plan_fn, &data, &k0, &k1))
        return NULL;
    if (!PyType_Check(ptype) || !PyCallable_Check(plan_fn)
            || (data != Py_None && !PyDict_Check(data))) {
        PyErr_SetString(PyExc_TypeError, "set_context(pool type, planner, environ dict or "
                                         "None, key, key)");
        return NULL;
    }
    Py_INCREF(ptype);
    Py_XSETREF(pool_type, ptype);
    Py_INCREF(plan_fn);
    Py_XSETREF(planner, plan_fn);
    Py_XSETREF(environ_data, data == Py_None ? NULL : (Py_INCREF(data), data));
    Py_INCREF(k0);
    Py_XSETREF(env_keys[0], k0);
    Py_INCREF(k1);
    Py_XSETREF(env_keys[1], k1);
    Py_RETURN_NONE;
}

static PyObject *register_pool(PyObject *self, PyObject *args)
{
    PyObject *pool;
    unsigned long long handle;
    if (!PyArg_ParseTuple(args, "OK", &pool, &handle))
        return NULL;
    if (!handle) {
        PyErr_SetString(PyExc_ValueError, "register_pool: NULL handle");
        return NULL;
    }
    int i = slot_of_object(pool);
    if (i >= 0 && pools[i].handle == (void *)(uintptr_t)handle)
        return PyLong_FromLong(i);
    for (i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool == NULL)
            break;
    if (i == MAX_POOLS)
        return PyLong_FromLong(-1);  /* full: this pool's calls take the Python path */
    pools[i].pool = pool;
    pools[i].handle = (void *)(uintptr_t)handle;
    pools[i].live = 1;
    pools[i].inflight = 0;
    return PyLong_FromLong(i);
}

static PyObject *set_default(PyObject *self, PyObject *args)
{
    PyObject *pool, *v0, *v1;
    if (!PyArg_ParseTuple(args, "OOO", &pool, &v0, &v1))
        return NULL;
    int i = slot_of_object(pool);
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "set_default: the pool is not registered");
        return NULL;
    }
    Py_INCREF(v0);
    Py_XSETREF(default_env[0], v0);
    Py_INCREF(v1);
    Py_XSETREF(default_env[1], v1);
    default_slot = i;
    Py_RETURN_NONE;
}

/* Stop new calls on the pool with this handle, drop its plans and (wait=True) wait until the
 * calls running on it have returned and free its slot. Called before the handle is destroyed. */
static PyObject *forget_pool(PyObject *self, PyObject *args)
{
    unsigned long long handle;
    int wait = 1;
    if (!PyArg_ParseTuple(args, "K|p", &handle, &wait))
        return NULL;
    for (int i = 0; i < MAX_POOLS; i++) {
        if (pools[i].pool == NULL || pools[i].handle != (void *)(uintptr_t)handle)
            continue;
        pools[i].live = 0;
        if (default_slot == i)
            default_slot = -1;
        purge_plans(i);
        if (!wait)
            continue;
        if (__atomic_load_n(&pools[i].inflight, __ATOMIC_ACQUIRE) != 0) {
            Py_BEGIN_ALLOW_THREADS
            while (__atomic_load_n(&pools[i].inflight, __ATOMIC_ACQUIRE) != 0) {
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
            }
            Py_END_ALLOW_THREADS
        }
        pools[i].pool = NULL;
        pools[i].handle = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *clear_plans(PyObject *self, PyObject *unused)
{
    purge_plans(-1);
    Py_RETURN_NONE;
}

/* After fork the child has only the forking thread: nothing is in flight there. */
static PyObject *after_fork(PyObject *self, PyObject *unused)
{
    for (int i = 0; i < MAX_POOLS; i++)
        pools[i].inflight = 0;
    Py_RETURN_NONE;
}

static PyObject *set_enabled(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = enabled;
    enabled = on;
    return PyBool_FromLong(was);
}

static PyObject *set_nogil_flops(PyObject *self, PyObject *arg)
{
    double v = PyFloat_AsDouble(arg);
    if (v == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(v >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "nogil_flops must be >= 0");
        return NULL;
    }
    double was = nogil_flops;
    nogil_flops = v;
    return PyFloat_FromDouble(was);
}

static PyObject *counters(PyObject *self, PyObject *unused)
{
    PyObject *why = PyDict_New();
    if (why == NULL)
        return NULL;
    for (int i = 0; i < NWHY; i++) {
        PyObject *v = PyLong_FromSsize_t(n_why[i]);
        if (v == NULL || PyDict_SetItemString(why, why_names[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(why);
            return NULL;
        }
        Py_DECREF(v);
    }
    int npools = 0, nplans = 0;
    for (int i = 0; i < MAX_POOLS; i++)
        npools += pools[i].pool != NULL && pools[i].live;
    for (int s = 0; s < PLAN_SETS; s++)
        for (int w = 0; w < PLAN_WAYS; w++)
            nplans += plans[s][w].used;
    return Py_BuildValue("{s:n,s:n,s:n,s:N,s:i,s:i,s:i}", "fast", n_fast, "planned", n_plans,
                         "nogil", n_nogil, "fallback", why, "pools", npools,
                         "cached_plans", nplans, "default_pool", default_slot >= 0);
}

static PyObject *reset_counters(PyObject *self, PyObject *unused)
{
    n_fast = n_plans = n_nogil = 0;
    memset(n_why, 0, sizeof n_why);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))fast_matmul, METH_FASTCALL,
     "matmul(a, b, out, pool) -> the product, or None when the Python path must handle it."},
    {"set_core", set_core, METH_VARARGS,
     "set_core(gemm_2d_checked, pool_get_limit, current_cpu, OK, OVERLAP, F32, F64, ENOMEM)"},
    {"set_context", set_context, METH_VARARGS,
     "set_context(Pool, planner, os.environ._data or None, topology key, policy key)"},
    {"register_pool", register_pool, METH_VARARGS,
     "register_pool(pool, handle address) -> slot (-1: no free slot)"},
    {"set_default", set_default, METH_VARARGS,
     "set_default(pool, env topology value, env policy value): the default pool"},
    {"forget_pool", forget_pool, METH_VARARGS,
     "forget_pool(handle address, wait=True): before the handle is destroyed"},
    {"clear_plans", clear_plans, METH_NOARGS, "Drop every cached plan."},
    {"after_fork", after_fork, METH_NOARGS, "Reset in-flight counts in a forked child."},
    {"set_enabled", set_enabled, METH_O, "set_enabled(on) -> previous setting"},
    {"set_nogil_flops", set_nogil_flops, METH_O,
     "set_nogil_flops(flops) -> previous: products of at least this many FLOPs release the "
     "GIL"},
    {"counters", counters, METH_NOARGS, "Calls taken, plans asked for, fallbacks by reason."},
    {"reset_counters", reset_counters, METH_NOARGS, "Zero the counters."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "asymo._matmul_fast",
    "asymo.matmul's fast path (C); see asymo/ops/matmul_fast.py.", -1, methods
};

PyMODINIT_FUNC PyInit__matmul_fast(void)
{
    import_array();
    return PyModule_Create(&module);
}
