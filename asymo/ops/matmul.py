"""`asymo.matmul`: a drop-in for `numpy.matmul` that runs asymo's GEMM on the pool.

float32 and float64 products (both operands of the same dtype, and ``out`` of that dtype when
given) are computed by asymo: the plan of `asymo.plan.gemm` splits C between the clusters and
into per-cluster tasks, the C kernels (or the Numba ones, ``backend="numba"``) do the work with
the GIL released. Everything else -- integer, complex, float16, bool and object arrays, mixed
dtypes, an ``out`` of another dtype, ndarray subclasses and foreign array types -- is handed to
`numpy.matmul` and gives exactly its result.

Shapes follow `numpy.matmul`: 1-D operands are promoted to a row (``a``) or a column (``b``)
and the added dimension is removed from the result; leading dimensions are broadcast as a
batch; any strides and memory orders are accepted (strided operands are packed directly from
their strides, nothing is copied except operands whose strides are not a whole number of
elements or whose data is misaligned).

The common case -- 2-D @ 2-D, 2-D @ 1-D or 1-D @ 2-D ndarrays of one float dtype, ``out`` None
or a matching array, the C backend -- is computed by a C fast path (`asymo.ops.matmul_fast`) with
well under a microsecond of overhead; it returns None for everything else, handled here.
"""
from __future__ import annotations

import math
import os

import numpy as np

from asymo.runtime.ffi import ffi, lib
from asymo.runtime.memory import empty_result
from asymo.plan import gemm as _plans
from asymo.plan.matmul import plan_for_matmul as _plan_for_matmul
from asymo.ops.matmul_fast import matmul as _fast_matmul
from asymo.ops.packed import PackedOperand, prepack
from asymo.ops.tensors import as_array, out_array, tensor_result, torch_of

__all__ = ["matmul", "gemm", "prepack", "PackedOperand", "BACKENDS", "BACKEND_ENV_VAR"]

#: the available backends
BACKENDS = ("c", "numba")
#: env var choosing the default backend
BACKEND_ENV_VAR = "ASYMO_GEMM_BACKEND"

_COMPUTED = (np.dtype(np.float32), np.dtype(np.float64))
_CODES = {np.dtype(np.float32): lib.ASYMO_DTYPE_F32, np.dtype(np.float64): lib.ASYMO_DTYPE_F64}

_ERRORS = {
    lib.ASYMO_EINVAL: "invalid argument",
    lib.ASYMO_ENOMEM: "out of memory",
}


def _fail(rc, M, K, N, plan):
    msg = (f"asymo GEMM failed ({_ERRORS.get(rc, rc)}) for shape (M, K, N) = ({M}, {K}, {N}), "
           f"plan {plan}")
    if rc == lib.ASYMO_ENOMEM:
        return _CoreMemoryError(msg)
    return RuntimeError(msg)


#: default backend: env ASYMO_GEMM_BACKEND, read once at import
_default_backend = os.environ.get(BACKEND_ENV_VAR) or "c"


def _check_backend(backend):
    if backend is None:
        backend = _default_backend
        if backend in BACKENDS:
            return backend
        source = f"env {BACKEND_ENV_VAR}"
    elif backend in BACKENDS:
        return backend
    else:
        source = "backend"
    raise ValueError(f"{source}={backend!r} is not a GEMM backend; expected one of "
                     f"{list(BACKENDS)}")


from asymo.runtime.pool import Pool as _Pool  # noqa: E402  (type test on the fast path)
from asymo.runtime.pool import acquire as _acquire  # noqa: E402


def _hold_pool(pool):
    """The pool to run on (the given one, else the process-wide default), held until
    ``pool._release()`` (see `asymo.runtime.pool.acquire`): closing or replacing it in
    another thread meanwhile waits for this product, or lets it finish on the old pool."""
    if pool is not None and type(pool) is not _Pool and not isinstance(pool, _Pool):
        raise TypeError(f"pool must be an asymo.Pool, not {type(pool).__name__}")
    try:
        return _acquire(pool)
    except ValueError:
        raise ValueError("pool is closed") from None


_NULL = ffi.NULL
_from_buffer = ffi.from_buffer


def _addr(x):
    return ffi.cast("void *", x.__array_interface__["data"][0])


def _wptr(x):
    """``void *`` to element [0, ..., 0] of a writeable x."""
    if x.flags.c_contiguous:
        return ffi.from_buffer(x, require_writable=True)
    return ffi.cast("void *", x.__array_interface__["data"][0])


def _ptr(x):
    """``void *`` to element [0, ..., 0] of x (buffer protocol when contiguous: fast)."""
    if x.flags.c_contiguous:
        return ffi.from_buffer(x)
    return ffi.cast("void *", x.__array_interface__["data"][0])


def _foreign(x):
    """True for operands NumPy itself must handle (subclasses, other array libraries)."""
    if isinstance(x, np.ndarray):
        return type(x) is not np.ndarray
    if isinstance(x, np.generic):
        return False
    return hasattr(type(x), "__array_ufunc__") or hasattr(type(x), "__array_function__")


def _shape_error(a, b, detail):
    return ValueError(f"matmul: a has shape {tuple(a.shape)} but b has shape "
                      f"{tuple(b.shape)}: {detail}")


def _result_geometry(a, b):
    """(batch shape, M, K, N, result shape), raising ValueError naming the shapes."""
    na, nb = a.ndim, b.ndim
    if na == 0 or nb == 0:
        which = "a" if na == 0 else "b"
        raise _shape_error(a, b, f"{which} is a scalar; matmul needs at least 1 dimension "
                                 "per operand (use * to multiply by a scalar)")
    sa, sb = a.shape, b.shape
    M = 1 if na == 1 else sa[-2]
    K = sa[-1]
    Kb = sb[0] if nb == 1 else sb[-2]
    N = 1 if nb == 1 else sb[-1]
    if K != Kb:
        raise _shape_error(a, b, f"the last dimension of a ({K}) must equal the "
                                 f"{'first' if nb == 1 else 'second-to-last'} dimension "
                                 f"of b ({Kb})")
    if na <= 2 and nb <= 2:
        batch = ()
    else:
        try:
            batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        except ValueError:
            raise _shape_error(a, b, f"the batch dimensions {tuple(sa[:-2])} and "
                                     f"{tuple(sb[:-2])} do not broadcast") from None
    result = batch + ((M,) if na > 1 else ()) + ((N,) if nb > 1 else ())
    return batch, M, K, N, result


def _usable(x):
    """Strides a whole number of elements and aligned data: the C driver can read x."""
    return x.flags.aligned and all(s % x.itemsize == 0 for s in x.strides)


def _overlaps_itself(x):
    """True unless no two elements of x can share memory (a writeable as_strided view can
    alias its own elements: NumPy computes into a temporary then, and so does asymo, where the
    pool's workers would race on the shared elements). Conservative: dimensions whose strides
    interleave without aliasing count as overlapping too."""
    flags = x.flags
    if flags.c_contiguous or flags.f_contiguous:  # the common case, cheaply
        return False
    dims = sorted((abs(s), n) for n, s in zip(x.shape, x.strides) if n > 1)
    span = x.itemsize  # bytes covered by one step of the next larger stride, at least
    for stride, n in dims:
        if stride < span:
            return True
        span = stride * (n - 1) + span
    return False


def matmul(a, b, out=None, *, backend=None, pool=None):
    """Matrix product of two arrays with `numpy.matmul` semantics, computed on asymo's pool.

    Parameters
    ----------
    a, b : array_like
        Operands; 1-D operands are promoted (``a`` to a row, ``b`` to a column) and the added
        dimension is removed from the result; leading dimensions broadcast as a batch.
    out : ndarray, optional
        Where to write the result; it must have the result's shape. NumPy's rules apply
        (an ``out`` of another dtype is filled by `numpy.matmul` with its casting rules).
        ``out`` may overlap the operands or alias its own elements (a writeable
        ``as_strided`` view): the result goes through a temporary then, as in NumPy.
    backend : {"c", "numba"}, optional
        Kernel implementation; default ``"c"`` (or env ``ASYMO_GEMM_BACKEND`` at import).
    pool : asymo.Pool, optional
        Pool to run on; default ``asymo.get_pool()``.

    Returns
    -------
    ndarray or scalar
        The product (a NumPy scalar when both operands are 1-D and ``out`` is None); a torch
        tensor when an operand is one (tensors that require grad are detached: asymo is
        inference-only).

    Raises
    ------
    ValueError
        When the shapes do not fit: ``matmul: a has shape (3, 4) but b has shape (5, 6): ...``.

    Notes
    -----
    asymo computes float32 and float64 (both operands the same dtype, native byte order,
    ``out`` None or of that dtype). Other dtypes, mixed dtypes, ndarray subclasses and other
    array types go to `numpy.matmul` and return exactly its result.
    """
    # When the C core cannot allocate its work buffers (a packed copy of a broadcast operand
    # with K >= 2^31, say), NumPy's own loop may need none: do what NumPy does then (its own
    # MemoryError if it cannot either).
    if backend is None:
        backend = _default_backend
    if backend == "c" and _fast_matmul is not None:
        # the common case in C (asymo/matmul_fast.py); None: not a case it takes
        try:
            res = _fast_matmul(a, b, out, pool)
        except MemoryError as exc:
            if "asymo GEMM failed" not in str(exc):  # the result array's allocation
                raise
            return np.matmul(a, b, out=out)
        if res is not None:
            return res
    if type(a) is PackedOperand or type(b) is PackedOperand:
        try:
            return _matmul_packed(a, b, out, backend, pool)
        except _CoreMemoryError:
            return np.matmul(np.asarray(a), np.asarray(b), out=out)
    try:
        return _matmul_general(a, b, out, backend, pool)
    except _CoreMemoryError:
        return np.matmul(a, b, out=out)


class _CoreMemoryError(MemoryError):
    """The C core's ASYMO_ENOMEM (its work buffers), not the result's allocation."""


def _matmul_general(a, b, out, backend, pool):
    if (backend == "c" and type(a) is np.ndarray and type(b) is np.ndarray and a.ndim == 2
            and 0 < b.ndim <= 2 and (out is None or type(out) is np.ndarray)):
        res = _matmul_2d(a, b, out, pool)
        if res is not None:
            return res
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        torch = torch_of(a, b, out)
        if torch is not None:
            return _matmul_torch(torch, a, b, out, backend, pool)
    backend = _check_backend(backend)
    if type(a) is not np.ndarray:
        if _foreign(a):
            return np.matmul(a, b, out=out)
        a = np.asarray(a)
    if type(b) is not np.ndarray:
        if _foreign(b):
            return np.matmul(a, b, out=out)
        b = np.asarray(b)
    if out is not None and type(out) is not np.ndarray:
        return np.matmul(a, b, out=out)
    batch, M, K, N, rshape = _result_geometry(a, b)
    dt = a.dtype
    if (dt != b.dtype or dt not in _COMPUTED or not dt.isnative
            or (out is not None and (out.dtype != dt or out.shape != rshape
                                     or not out.flags.writeable))):
        return np.matmul(a, b, out=out)

    scalar = a.ndim == 1 and b.ndim == 1 and out is None
    res = empty_result(rshape, dt) if out is None else out
    # views with the promoted dimensions restored: a2 (..., M, K), b2 (..., K, N), c2 (..., M, N)
    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b
    if a.ndim == 1:
        c2 = res[..., np.newaxis, :] if b.ndim > 1 else res[..., np.newaxis, np.newaxis]
    elif b.ndim == 1:
        c2 = res[..., np.newaxis]
    else:
        c2 = res
    nbatch = math.prod(batch)
    if nbatch == 0 or M == 0 or N == 0:
        return res[()] if scalar else res
    if K == 0:
        c2[...] = 0
        return res[()] if scalar else res

    if not _usable(a2):
        a2 = np.ascontiguousarray(a2)
    if not _usable(b2):
        b2 = np.ascontiguousarray(b2)
    target = c2
    if out is not None and (not _usable(c2) or np.may_share_memory(c2, a2)
                            or np.may_share_memory(c2, b2) or _overlaps_itself(c2)):
        target = empty_result(c2.shape, dt)
    pool = _hold_pool(pool)
    try:
        _run(a2, b2, target, batch, M, K, N, backend, pool)
    finally:
        pool._release()
    if target is not c2:
        c2[...] = target
    return res[()] if scalar else res


def _matmul_torch(torch, a, b, out, backend, pool):
    """``matmul`` on tensors: CPU tensors are read without a copy (detached: asymo is
    inference-only) and the result comes back as a tensor (see `asymo.ops.tensors`)."""
    res = matmul(*(as_array(torch, x, "matmul", n, floats_only=False)
                   for x, n in ((a, "a"), (b, "b"))),
                 out=out_array(torch, out, "matmul"), backend=backend, pool=pool)
    return tensor_result(torch, res, out)


def _matmul_packed(a, b, out, backend, pool):
    """`matmul` with a `PackedOperand`: x @ W (W packed as b; x 1-D, 2-D, or a stack whose
    rows fold into M) and W @ x (W packed as a; x 1-D or 2-D) use the packed layouts on a
    matrix-product plan; every other case is the product with the operand's matrix."""
    pa = a if type(a) is PackedOperand else None
    pb = b if type(b) is PackedOperand else None
    plain_a = pa.array if pa is not None else a
    plain_b = pb.array if pb is not None else b
    if backend is None:
        backend = _default_backend
    usable = (backend == "c" and (pa is None or pa.side == "a")
              and (pb is None or pb.side == "b"))
    if usable and pa is not None and pb is not None:
        other = None
    elif usable:
        other = plain_a if pb is not None else plain_b
        usable = (type(other) is np.ndarray and other.dtype == (pa or pb).dtype
                  and other.dtype.isnative and 1 <= other.ndim <= (2 if pa is not None else 32)
                  and (out is None or (type(out) is np.ndarray and out.dtype == other.dtype
                                       and out.flags.writeable)))
    if not usable:
        return matmul(plain_a, plain_b, out, backend=backend, pool=pool)
    dt = (pa or pb).dtype
    if pb is not None and pa is None:
        K, N = pb.shape
        if other.shape[-1] != K:
            return matmul(plain_a, plain_b, out, backend=backend, pool=pool)  # NumPy's error
        lead = other.shape[:-1]
        rshape = lead + (N,)
        if K == 0 or 0 in lead:  # (reshape(-1, 0) is ambiguous): NumPy's empty product
            return matmul(plain_a, plain_b, out, backend=backend, pool=pool)
        a2 = other.reshape(-1, K)
        M = a2.shape[0]
        b2 = None
    else:
        M, K = pa.shape
        b2 = plain_b if pb is None else None
        if pb is None:
            if other.shape[0] != K:
                return matmul(plain_a, plain_b, out, backend=backend, pool=pool)
            N = 1 if other.ndim == 1 else other.shape[1]
            rshape = (M,) if other.ndim == 1 else (M, N)
            b2 = other[:, np.newaxis] if other.ndim == 1 else other
        else:
            if pb.shape[0] != K:
                return matmul(plain_a, plain_b, out, backend=backend, pool=pool)
            N = pb.shape[1]
            rshape = (M, N)
        a2 = None
    if out is not None and out.shape != rshape:
        return matmul(plain_a, plain_b, out, backend=backend, pool=pool)
    if M == 0 or N == 0 or K == 0:
        return matmul(plain_a, plain_b, out, backend=backend, pool=pool)
    held = _hold_pool(pool)
    try:
        plan = _plan_for_matmul(M, K, N, dt, held, 1)
        packed_plan = plan.kind == "mm" and plan.split_dim != "batch"
        if packed_plan:
            res = _packed_product(a2, b2, out, pa, pb, M, K, N, rshape, dt, plan, held)
    finally:
        held._release()
    if packed_plan:
        return res
    return matmul(plain_a, plain_b, out, backend=backend, pool=pool)


def _packed_product(a2, b2, out, pa, pb, M, K, N, rshape, dt, plan, pool):
    """The product of `_matmul_packed` on a matrix-product plan (the pool held)."""
    if a2 is not None and not _usable(a2):
        a2 = np.ascontiguousarray(a2)
    if b2 is not None and not _usable(b2):
        b2 = np.ascontiguousarray(b2)
    res = empty_result(rshape, dt) if out is None else out
    if out is None:
        c2 = res.reshape(M, N)  # a view: res is fresh and contiguous
    elif (out.ndim == 2 and _usable(out) and not _overlaps_itself(out)
          and not (a2 is not None and np.may_share_memory(out, a2))
          and not (b2 is not None and np.may_share_memory(out, b2))):
        c2 = out
    else:
        c2 = empty_result((M, N), dt)
    _run_packed(pa.array if a2 is None else a2, pb.array if b2 is None else b2, c2, M, K, N,
                plan, pool, pa, pb)
    if out is not None and c2 is not out:
        out[...] = c2.reshape(rshape)
    return res


def _run_packed(a2, b2, c2, M, K, N, plan, pool, pa, pb):
    """One 2-D product on a matrix-product plan with pre-packed operands (pa for A, pb for
    B, either None); a2 and b2 are the plain matrices (used where no layout serves)."""
    es = a2.itemsize
    g = ffi.new("asymo_gemm_args *")
    g.dtype = _CODES[a2.dtype]
    g.m, g.k, g.n = M, K, N
    g.a = _ptr(a2)
    g.rsa, g.csa = a2.strides[0] // es, a2.strides[1] // es
    g.b = _ptr(b2)
    g.rsb, g.csb = b2.strides[0] // es, b2.strides[1] // es
    g.c = _wptr(c2)
    g.rsc, g.csc = c2.strides[0] // es, c2.strides[1] // es
    g.nbatch = 1
    if pa is not None:
        g.a_packed = pa.cdata_for(plan)
    if pb is not None:
        g.b_packed = pb.cdata_for(plan)
    handle = pool._handle if pool is not None and not plan.in_caller() else ffi.NULL
    rc = lib.asymo_gemm(handle, g, plan.cdata())
    if rc != lib.ASYMO_OK:
        raise _fail(rc, M, K, N, plan)


def _matmul_2d(a, b, out, pool):
    """The common case on a short path: 2-D @ 2-D or 2-D @ 1-D, float32/float64, ``out``
    None or a plain writeable array of the result's shape and dtype, not overlapping.

    One native call does the work (and the overlap test: the cost of a call is a few
    microseconds of Python at most, which matters for products that take as little).
    Returns None when anything is unusual (the general path then handles it)."""
    dt = a.dtype
    code = _CODES.get(dt)
    if code is None or b.dtype != dt:
        return None
    M, K = a.shape
    if b.ndim == 2:
        Kb, N = b.shape
        rsb, csb = b.strides
        rshape = (M, N)
    else:
        Kb, N = b.shape[0], 1
        rsb, csb = b.strides[0], 0
        rshape = (M,)
    if K != Kb or M == 0 or N == 0 or K == 0:
        return None
    rsa, csa = a.strides
    es = dt.itemsize
    fa, fb = a.flags, b.flags
    if (rsa | csa | rsb | csb) % es or not (fa.aligned and fb.aligned):  # es: a power of 2
        return None
    if out is None:
        c = empty_result(rshape, dt)
        rsc, csc = N, 1
        pc = _from_buffer(c)
    else:
        fo = out.flags
        if (out.dtype != dt or out.shape != rshape or not fo.writeable or not fo.aligned):
            return None
        c = out
        if len(rshape) == 2:
            rsc, csc = out.strides
        else:
            rsc, csc = out.strides[0], es
        if (rsc | csc) % es or _overlaps_itself(out):
            return None
        rsc, csc = rsc // es, csc // es
        # writeable was checked above: from_buffer need not check it again (a third faster)
        pc = _from_buffer(c) if fo.c_contiguous else _addr(c)
    pool = _hold_pool(pool)
    try:
        plan, cplan = _plan_for_matmul(M, K, N, dt, pool, 1, True)
        # plan.in_caller(), inlined
        serial_cpus = plan.serial_cpus
        rc = _gemm_2d_checked(
            _NULL if plan.serial or (serial_cpus and _current_cpu() in serial_cpus)
            else pool._handle, cplan, code, M, K, N,
            _from_buffer(a) if fa.c_contiguous else _addr(a), rsa // es, csa // es,
            _from_buffer(b) if fb.c_contiguous else _addr(b), rsb // es, csb // es, pc, rsc,
            csc)
    finally:
        pool._release()
    if rc != _OK:
        if rc == _OVERLAP:
            return None
        raise _fail(rc, M, K, N, plan)
    return c


_gemm_2d_checked = lib.asymo_gemm_2d_checked
_current_cpu = lib.asymo_gemm_current_cpu
_OK = lib.ASYMO_OK
_OVERLAP = lib.ASYMO_GEMM_OVERLAP


def _merged_rows(x, shape):
    """Row stride if x broadcast to ``shape`` (..., rows, cols) is one strided run of rows
    (the batch dimensions fold into the row dimension without a copy), else None."""
    strides = np.broadcast_to(x, shape).strides
    dims = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    if not dims:
        return strides[-2]
    for (n_outer, s_outer), (n_inner, s_inner) in zip(dims, dims[1:]):
        if s_outer != s_inner * n_inner:
            return None
    return dims[-1][1]


def _run(a2, b2, c2, batch, M, K, N, backend, pool):
    nb = len(batch)
    if nb == 0:
        _call(a2, b2, c2, None, M, K, N, 1, backend, pool)
        return
    nbatch = math.prod(batch)
    ab = np.broadcast_to(a2, batch + (M, K))
    bb = np.broadcast_to(b2, batch + (K, N))
    idx = (0,) * nb
    if nbatch == 1:
        _call(ab[idx], bb[idx], c2[idx], None, M, K, N, 1, backend, pool)
        return
    if not any(n != 1 and s != 0 for n, s in zip(batch, bb.strides[:nb])):
        # one B for every product: fold the batch into M when A and C allow it (x @ W)
        ra = _merged_rows(a2, batch + (M, K))
        rc = _merged_rows(c2, batch + (M, N))
        if ra is not None and rc is not None:
            rows = nbatch * M
            a_view = np.lib.stride_tricks.as_strided(
                ab, shape=(rows, K), strides=(ra, ab.strides[-1]), writeable=False)
            c_view = np.lib.stride_tricks.as_strided(
                c2, shape=(rows, N), strides=(rc, c2.strides[-1]))
            _call(a_view, bb[idx], c_view, None, rows, K, N, 1, backend, pool)
            return
    offsets = []
    for arr in (ab, bb, c2):
        off = np.zeros(batch, np.int64)
        for d in range(nb):
            shape = [1] * nb
            shape[d] = batch[d]
            off = off + (np.arange(batch[d], dtype=np.int64) * arr.strides[d]).reshape(shape)
        offsets.append(np.ascontiguousarray(off.reshape(-1)))
    _call(ab[idx], bb[idx], c2[idx], offsets, M, K, N, nbatch, backend, pool)


def _call(a, b, c, offsets, M, K, N, nbatch, backend, pool, plan=None):
    """Run one (possibly batched) product; a, b, c are the 2-D views of item 0."""
    if plan is None:  # calibrated by `asymo calibrate` when a profile exists, else default
        plan = _plan_for_matmul(M, K, N, a.dtype, pool, nbatch)
    if backend == "numba":
        from asymo.ops import gemm_numba as _gemm_numba
        _gemm_numba.run(a, b, c, offsets, nbatch, plan, pool)
        return
    es = a.itemsize
    handle = pool._handle if pool is not None and not plan.in_caller() else ffi.NULL
    if offsets is None:
        rc = lib.asymo_gemm_2d(
            handle, plan.cdata(), _CODES[a.dtype], M, K, N, _ptr(a), a.strides[0] // es,
            a.strides[1] // es, _ptr(b), b.strides[0] // es, b.strides[1] // es, _wptr(c),
            c.strides[0] // es, c.strides[1] // es)
        if rc != lib.ASYMO_OK:
            raise _fail(rc, M, K, N, plan)
        return
    g = ffi.new("asymo_gemm_args *")
    g.dtype = _plans.DTYPES[a.dtype.name]
    g.m, g.k, g.n = M, K, N
    g.a = ffi.cast("void *", a.__array_interface__["data"][0])
    g.rsa, g.csa = a.strides[0] // es, a.strides[1] // es
    g.b = ffi.cast("void *", b.__array_interface__["data"][0])
    g.rsb, g.csb = b.strides[0] // es, b.strides[1] // es
    g.c = ffi.cast("void *", c.__array_interface__["data"][0])
    g.rsc, g.csc = c.strides[0] // es, c.strides[1] // es
    g.nbatch = nbatch
    keep = [ffi.cast("int64_t *", o.ctypes.data) for o in offsets]
    g.a_offsets, g.b_offsets, g.c_offsets = keep
    rc = lib.asymo_gemm(handle, g, plan.cdata())
    del keep
    if rc != lib.ASYMO_OK:
        raise _fail(rc, M, K, N, plan)


def gemm(a, b, out=None, *, plan=None, pool=None, backend=None):
    """C = a @ b for 2-D float32/float64 arrays with an explicit plan (or the default one).

    The low-level entry point for callers that build their own `GemmPlan` (calibration,
    conv2d): ``plan.shape`` must be ``(M, K, N)`` and ``plan.dtype`` the operands' dtype.

    Parameters
    ----------
    a : ndarray or PackedOperand (side "a"), shape (M, K)
    b : ndarray or PackedOperand (side "b"), shape (K, N)
        A `PackedOperand` (`asymo.prepack`) is used in its packed layouts on a matrix-product
        plan (conv2d's and the models' weights).
    out : ndarray, shape (M, N), optional
        Must not overlap ``a`` or ``b``.
    plan : GemmPlan, optional
        Default: the plan `asymo.matmul` uses (`asymo.plan_matmul`: calibrated when
        ``asymo calibrate`` made a profile for this CPU, else `asymo.plan.gemm.plan_gemm`).
    pool : asymo.Pool, optional
    backend : {"c", "numba"}, optional

    Returns
    -------
    ndarray
    """
    backend = _check_backend(backend)
    pa = a if type(a) is PackedOperand and a.side == "a" else None
    pb = b if type(b) is PackedOperand and b.side == "b" else None
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm: a has shape {a.shape} and b has shape {b.shape}; both must be "
                         "2-D (use asymo.matmul for other shapes)")
    M, K = a.shape
    if b.shape[0] != K:
        raise _shape_error(a, b, f"the last dimension of a ({K}) must equal the first "
                                 f"dimension of b ({b.shape[0]})")
    N = b.shape[1]
    if a.dtype != b.dtype or a.dtype not in _COMPUTED:
        raise TypeError(f"gemm: a is {a.dtype} and b is {b.dtype}; both must be float32 or "
                        "both float64")
    if out is None:
        out = empty_result((M, N), a.dtype)
    elif (type(out) is not np.ndarray or out.shape != (M, N) or out.dtype != a.dtype
          or not out.flags.writeable):
        raise ValueError(f"gemm: out must be a writeable {a.dtype} ndarray of shape {(M, N)}")
    if np.may_share_memory(out, a) or np.may_share_memory(out, b):
        raise ValueError("gemm: out overlaps a or b")
    if plan is not None:
        if not isinstance(plan, _plans.GemmPlan):
            raise TypeError(f"plan must be a GemmPlan, not {type(plan).__name__}")
        if plan.shape != (M, K, N) or plan.dtype != a.dtype.name or plan.nbatch != 1:
            raise ValueError(f"gemm: the plan is for shape {plan.shape} {plan.dtype} "
                             f"(nbatch {plan.nbatch}), the operands are {(M, K, N)} "
                             f"{a.dtype.name}")
    if M == 0 or N == 0:
        return out
    if K == 0:
        out[...] = 0
        return out
    if not _usable(a):
        a = np.ascontiguousarray(a)
    if not _usable(b):
        b = np.ascontiguousarray(b)
    target = out if _usable(out) else empty_result((M, N), a.dtype)
    pool = _hold_pool(pool)
    try:
        if plan is not None and plan.nclusters > pool.nclusters:
            raise ValueError(f"gemm: the plan has {plan.nclusters} clusters but the pool has "
                             f"{pool.nclusters}")
        if (pa is not None or pb is not None) and backend == "c":
            if plan is None:
                plan = _plan_for_matmul(M, K, N, a.dtype, pool, 1)
            if plan.kind == "mm" and plan.split_dim != "batch":
                _run_packed(a, b, target, M, K, N, plan, pool, pa, pb)
                plan = False
        if plan is not False:
            _call(a, b, target, None, M, K, N, 1, backend, pool, plan=plan)
    finally:
        pool._release()
    if target is not out:
        out[...] = target
    return out
