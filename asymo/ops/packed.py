"""Pre-packed constant operands: `prepack` packs a matrix that is reused across many products
(layer weights, a fixed projection) once into the micro-panel layout of the GEMM kernels.

A `PackedOperand` is accepted wherever its matrix is by `asymo.matmul` (as ``b``, or as ``a``
when packed with ``side="a"``) and by `asymo.ops.matmul.gemm`. A plan's clusters each use the
layout of their kernel and K block (``kc``); a layout is made the first time a plan needs it and
kept (at most `MAX_LAYOUTS`), so every later call skips the packing of that operand. Calls the
packed layout cannot serve -- a matrix-vector plan, a batch of products, other dtypes -- use the
operand's own copy of the matrix and give the same result as the unpacked product.

The matrix is copied when packed: later changes to the caller's array do not reach the packed
operand.

`PackedMatVec` packs a constant float32 matrix for matrix-vector products ``act(A @ x + b)``
(a model's classifier at batch 1) into panels of ``ASYMO_MV_PANEL`` (16) rows interleaved along
K, so the product reads the matrix as one stream in address order (``asymo_mv_pack``).
"""
from __future__ import annotations

import threading

import numpy as np

from asymo.runtime.ffi import ffi, lib
from asymo.runtime.memory import empty_aligned

__all__ = ["PackedOperand", "prepack", "PackedMatVec", "MAX_LAYOUTS"]

#: layouts kept per operand (the C driver reads at most this many)
MAX_LAYOUTS = 8

_SIDES = {"a": lib.ASYMO_PACK_A, "b": lib.ASYMO_PACK_B}
_DTYPES = {np.dtype(np.float32): lib.ASYMO_DTYPE_F32, np.dtype(np.float64): lib.ASYMO_DTYPE_F64}


class PackedOperand:
    """A constant 2-D float32/float64 matrix packed for asymo's GEMM (see `prepack`).

    Attributes
    ----------
    array : ndarray
        Read-only C-contiguous copy of the matrix.
    side : {"a", "b"}
        Which operand of ``a @ b`` it is packed as.
    shape, dtype, ndim : as of ``array``
    """

    __slots__ = ("array", "side", "_struct", "_buffers", "_lock", "__weakref__")

    def __init__(self, array, side):
        self.array = array
        self.side = side
        self._buffers = {}
        self._lock = threading.Lock()
        s = ffi.new("asymo_gemm_packed *")
        s.side = _SIDES[side]
        s.dtype = _DTYPES[array.dtype]
        if side == "a":
            s.dim, s.k = array.shape
        else:
            s.k, s.dim = array.shape
        self._struct = s

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def ndim(self):
        return 2

    def __repr__(self):
        return (f"PackedOperand(side={self.side!r}, shape={self.shape}, dtype={self.dtype}, "
                f"layouts={sorted(self._buffers)})")

    def __array__(self, dtype=None, copy=None):
        # np.asarray(packed) gives the matrix (read-only), so NumPy functions accept it
        return self.array if dtype is None else self.array.astype(dtype)

    @property
    def layouts(self):
        """The (isa value, kc) pairs packed so far."""
        return tuple(self._buffers)

    def cdata_for(self, plan):
        """The ``asymo_gemm_packed *`` holding the layouts ``plan``'s clusters use (made now
        for those missing, while fewer than `MAX_LAYOUTS` exist)."""
        isa = plan.cdata().isa
        K = plan.shape[1]
        for (lo, hi), (_mc, _nc, kc) in zip(plan.cluster_ranges, plan.blocks):
            if hi <= lo:
                continue
            key = (isa, min(int(kc), max(K, 1)))  # every kc >= K is one block: one layout
            if key not in self._buffers:
                self._pack(*key)
        return self._struct

    def _pack(self, isa, kc):
        with self._lock:
            if (isa, kc) in self._buffers or len(self._buffers) >= MAX_LAYOUTS:
                return
            s = self._struct
            nbytes = lib.asymo_gemm_packed_bytes(isa, s.dtype, s.side, s.dim, s.k)
            if nbytes < 0:
                raise ValueError(f"prepack: the kernel family {isa} cannot pack this operand")
            buf = empty_aligned(nbytes, np.uint8)
            x = self.array
            es = x.itemsize
            rc = lib.asymo_gemm_pack(isa, s.dtype, s.side, s.dim, s.k, kc,
                                     ffi.cast("void *", x.ctypes.data), x.strides[0] // es,
                                     x.strides[1] // es,
                                     ffi.cast("void *", buf.ctypes.data))
            if rc != lib.ASYMO_OK:
                raise ValueError(f"prepack: packing failed ({rc})")
            n = s.nlayouts
            s.isa[n] = isa
            s.kc[n] = kc
            s.data[n] = ffi.cast("void *", buf.ctypes.data)
            self._buffers[(isa, kc)] = buf  # keeps the memory alive
            s.nlayouts = n + 1


def prepack(x, *, side="b"):
    """Pack a constant matrix once for repeated products.

    Parameters
    ----------
    x : array_like, 2-D, float32 or float64
        The matrix: ``b`` of ``a @ b`` (shape (K, N)) for ``side="b"``, ``a`` (shape (M, K))
        for ``side="a"``.
    side : {"a", "b"}, keyword-only
        The operand position it will take.

    Returns
    -------
    PackedOperand
        Accepted by `asymo.matmul` (in that position) and `asymo.ops.matmul.gemm`.

    Raises
    ------
    ValueError
        When ``x`` is not 2-D or ``side`` is not "a" or "b".
    TypeError
        When ``x`` is not float32 or float64.

    Examples
    --------
    >>> w = asymo.prepack(weights)          # (K, N)
    >>> y = asymo.matmul(x, w)              # same result as asymo.matmul(x, weights)
    """
    if side not in _SIDES:
        raise ValueError(f"prepack: side must be 'a' or 'b', not {side!r}")
    if isinstance(x, PackedOperand):
        if x.side == side:
            return x
        x = x.array
    arr = np.array(x, copy=True, order="C")
    if arr.ndim != 2:
        raise ValueError(f"prepack: the matrix must be 2-D, got shape {arr.shape}")
    if arr.dtype not in _DTYPES or not arr.dtype.isnative:
        raise TypeError(f"prepack: the matrix must be float32 or float64, got {arr.dtype}")
    arr.flags.writeable = False
    return PackedOperand(arr, side)


class PackedMatVec:
    """A constant float32 matrix ``A`` (m x k) packed once for ``y = act(A @ x + bias)``.

    Parameters
    ----------
    a : ndarray, shape (m, k), float32
        The matrix (copied into the packed layout).

    Call `bind` once per set of arrays and pool; the bound call runs the product.
    """

    def __init__(self, a):
        a = np.asarray(a)
        if a.ndim != 2 or a.dtype != np.float32:
            raise ValueError(f"PackedMatVec: expected a 2-D float32 matrix, got shape "
                             f"{a.shape} and dtype {a.dtype}")
        a = np.ascontiguousarray(a)
        self.shape = a.shape
        m, k = a.shape
        n = lib.asymo_mv_packed_floats(m, k)
        if n < 0:
            raise ValueError(f"PackedMatVec: matrix of shape {a.shape} is too large")
        self.panels = np.empty(max(n, 1), np.float32)
        lib.asymo_mv_pack(ffi.cast("const float *", a.ctypes.data), m, k, k,
                          ffi.cast("float *", self.panels.ctypes.data))

    def bind(self, x, y, *, bias=None, activation=None, pool):
        """The product ``y[:] = act(A @ x + bias)`` on ``pool`` as a call taking no arguments,
        for these arrays: ``x`` (k,) and ``y`` (m,) contiguous float32 (they may carry
        leading axes of length 1), ``bias`` (m,) or None, ``activation`` None, "relu" or
        "relu6". The task split is made here, once (as the convolutions' and pools' bound
        calls do); the caller holds ``pool`` while the call runs."""
        from asymo.plan.split_cost import pool_fastest_only
        from asymo.runtime.partition import even_block_size
        from asymo.runtime.tasks import (ACTIVATION_CODES, INLINE_BYTES, TASK_IDLE,
                                         TASKS_PER_WORKER, BoundJobs, task_counts, task_fn,
                                         tasks_call)

        m, k = self.shape
        x, y = np.asarray(x), np.asarray(y)
        for name, v, size in (("x", x, k), ("y", y, m)):
            if v.dtype != np.float32 or v.size != size or not v.flags.c_contiguous:
                raise ValueError(f"PackedMatVec.bind: {name} must be a contiguous float32 "
                                 f"array of {size} elements, got shape {v.shape}, dtype "
                                 f"{v.dtype}")
        if not y.flags.writeable or np.may_share_memory(y, x):
            raise ValueError("PackedMatVec.bind: y must be writeable and apart from x")
        if bias is not None:
            bias = np.ascontiguousarray(bias, np.float32)
            if bias.shape != (m,):
                raise ValueError(f"PackedMatVec.bind: bias must have shape ({m},), got "
                                 f"{bias.shape}")
        if activation not in ACTIVATION_CODES:
            raise ValueError(f"PackedMatVec.bind: activation must be None, 'relu' or "
                             f"'relu6', got {activation!r}")
        job = ffi.new("asymo_mv_packed_job *")
        job.isa = lib.asymo_gemm_default_isa()
        job.activation = ACTIVATION_CODES[activation]
        job.m, job.k = m, k
        job.a = ffi.cast("const float *", self.panels.ctypes.data)
        job.x = ffi.cast("const float *", x.ctypes.data)
        job.bias = ffi.NULL if bias is None else ffi.cast("const float *", bias.ctypes.data)
        job.y = ffi.cast("float *", y.ctypes.data)
        # the split, as the other element-wise and MV jobs make it: TASKS_PER_WORKER even
        # tasks per worker, on the fastest cluster alone when the MV split rule says so
        npanels = -(-m // lib.ASYMO_MV_PANEL)
        per = even_block_size(max(npanels, 1), TASKS_PER_WORKER * pool.nworkers,
                              pool.nworkers, tolerance=TASK_IDLE)
        job.panels_per_task = per
        if lib.asymo_mv_packed_check(job) != lib.ASYMO_OK:
            raise ValueError("PackedMatVec.bind: no matrix-vector kernel for this CPU")
        ntasks = -(-npanels // per)
        if ntasks == 0:
            return lambda: None
        counts = task_counts(pool, ntasks,
                              fastest_only=pool_fastest_only(pool, 2 * m * k, "mv"))
        run, args = tasks_call(pool, task_fn("asymo_mv_packed_task"), job, ntasks, counts,
                                4 * m * k < INLINE_BYTES)
        # (keep: what the job points into, alive as long as the call)
        return BoundJobs([(run, args)], (self, x, y, bias), "a bound matrix-vector call")
