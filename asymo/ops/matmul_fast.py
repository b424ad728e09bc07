"""asymo.matmul's C fast path: loading it, planning for it, keeping it in step with the pools.

`asymo.matmul` first hands its arguments to ``asymo._matmul_fast.matmul`` (a CPython extension,
csrc/python/matmul_fast.c). It computes the common case itself -- two ndarrays (exact type) of
the same native float32 or float64 dtype, 2-D @ 2-D, 2-D @ 1-D or 1-D @ 2-D, aligned, strides a
whole number of elements, ``out`` None or a writeable array of the result's shape and dtype that
overlaps neither the operands nor itself, the C backend, the default pool or an `asymo.Pool` --
with well under a microsecond between Python and the GEMM, and returns None for everything else, which the
Python implementation then handles (NumPy's semantics and errors, unchanged).

The extension decides nothing about how a product is cut up: on the first call of a shape it
asks `_plan` here, which returns what `asymo.plan.matmul.plan_for_matmul` would use, and caches
it by (M, K, N, dtype, pool, thread limit). What can change a plan empties that cache:
`asymo.plan.matmul.clear_cache` (new calibration), `asymo.plan.gemm.force_isa` and
`set_block_chooser` (through `gemm_plan.clear_plan_cache`), a new default pool (env
``ASYMO_TOPOLOGY`` / ``ASYMO_POOL_POLICY`` changed, the emulator's topology change, a closed
pool); a plan adjusted for the current load expires when its load reading does.

Environment: ``ASYMO_MATMUL_FAST=0`` switches the fast path off (read at import).

If the extension was not built or cannot be loaded (no compiler, no numpy headers at build
time, a NumPy ABI it was not built for), asymo works without it: `status` and ``asymo info``
say why.
"""
from __future__ import annotations

import contextlib
import os

from asymo.plan import gemm as _gemm_plan
from asymo.plan import matmul as _matmul_plan
from asymo.runtime import pool as _pool
from asymo.runtime.ffi import ffi, lib

__all__ = ["status", "disabled", "counters", "reset_counters", "ENV_VAR", "matmul"]

#: env var: "0" (or "no", "off", "false") switches the fast path off
ENV_VAR = "ASYMO_MATMUL_FAST"

try:
    from asymo import _matmul_fast as _ext
except ImportError as exc:  # not built, or built for another NumPy ABI
    _ext = None
    _missing = f"{type(exc).__name__}: {exc}"
else:
    _missing = None

#: the C core's entry points the extension calls, with the C types it was written for (cffi
#: spelling): a core whose signatures changed is not called through stale assumptions
CORE_FUNCTIONS = {
    "asymo_gemm_2d_checked": "int(*)(struct asymo_pool *, asymo_gemm_plan *, int, int64_t, "
                             "int64_t, int64_t, void *, int64_t, int64_t, void *, int64_t, "
                             "int64_t, void *, int64_t, int64_t)",
    "asymo_pool_get_limit": "int(*)(struct asymo_pool *)",
    "asymo_gemm_current_cpu": "int(*)()",
}


def _core_mismatch():
    """Why the C core does not fit the extension, or None."""
    for name, ctype in CORE_FUNCTIONS.items():
        try:
            have = ffi.typeof(ffi.addressof(lib, name)).cname
        except (AttributeError, ffi.error) as exc:
            return f"the C core has no {name} ({exc})"
        if have != ctype:
            return (f"the C core's {name} is {have}, the fast path was written for {ctype} "
                    "(update csrc/python/matmul_fast.c)")
    return None


if _ext is not None:
    _missing = _core_mismatch()
    if _missing is not None:
        _ext = None

_off_by_env = os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "no", "off", "false")
_DTYPES = {lib.ASYMO_DTYPE_F32: "float32", lib.ASYMO_DTYPE_F64: "float64"}


def _address(x):
    return int(ffi.cast("uintptr_t", x))


def _plan(M, K, N, code, pool):
    """What the extension caches for one shape on ``pool`` (None: the default pool).

    Returns ``(pool, plan struct, its address, serial, serial_cpus, thread limit, expires)``
    (``expires``: `time.monotonic` deadline of a load-adjusted plan, 0.0 for none, negative
    not to cache), or None to let the Python path handle the call (a closed pool, for one).
    """
    default = pool is None
    if default:
        pool = _pool.get_pool()
        built_for = _pool._default_built_for
        if (_pool._default_pool is not pool or _pool._environ_data is None
                or built_for is None):
            return None
    # held while planning (the plan reads the pool's C handle): a close() in another thread
    # waits; a pool closed already is left to the Python path
    try:
        pool._acquire()
    except ValueError:
        return None
    try:
        return _plan_held(M, K, N, code, pool, default, built_for if default else None)
    finally:
        pool._release()


def _plan_held(M, K, N, code, pool, default, built_for):
    handle = pool._handle
    if _ext.register_pool(pool, _address(handle)) < 0:
        return None
    if default:
        _ext.set_default(pool, built_for[0], built_for[1])
    limit = lib.asymo_pool_get_limit(handle)
    since = _matmul_plan.plan_expiry(pool)
    plan, cdata = _matmul_plan.plan_for_matmul(M, K, N, _DTYPES[code], pool, 1, True)
    expires = _matmul_plan.plan_expiry(pool)
    # the limit changed, or a new load window began (this call's sample or another thread's),
    # meanwhile: the plan may be for the old one, so plan again next call
    if lib.asymo_pool_get_limit(handle) != limit or expires != since:
        expires = -1.0
    return (pool, cdata, _address(cdata), plan.serial, plan.serial_cpus, limit, expires)


def _forget(handle, wait):
    _ext.forget_pool(_address(handle), wait)


def _install():
    _ext.set_core(*(_address(ffi.addressof(lib, name)) for name in CORE_FUNCTIONS),
                  lib.ASYMO_OK, lib.ASYMO_GEMM_OVERLAP, lib.ASYMO_DTYPE_F32,
                  lib.ASYMO_DTYPE_F64, lib.ASYMO_ENOMEM)
    _ext.set_context(_pool.Pool, _plan, _pool._environ_data, _pool._TOPOLOGY_KEY,
                     _pool._POLICY_KEY)
    _pool._destroy_hooks.append(_forget)
    _gemm_plan.on_plans_cleared(_ext.clear_plans)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_ext.after_fork)
    if _off_by_env:
        _ext.set_enabled(False)


if _ext is not None:
    _install()
    #: ``matmul(a, b, out, pool)``: the product, or None for the Python path to handle
    matmul = _ext.matmul
else:
    matmul = None


def status():
    """The fast path's state: ``{"state": str, "available": bool, "enabled": bool}``.

    ``state`` is ``"active"``, ``"switched off (env ASYMO_MATMUL_FAST=...)"`` or
    ``"not available (<why the extension could not be imported>)"``.
    """
    if _ext is None:
        return {"state": f"not available ({_missing}); asymo.matmul uses its Python path",
                "available": False, "enabled": False}
    on = _ext.set_enabled(True)
    _ext.set_enabled(on)
    if on:
        state = "active"
    else:
        state = (f"switched off (env {ENV_VAR}={os.environ.get(ENV_VAR)!r})" if _off_by_env
                 else "switched off")
    return {"state": state, "available": True, "enabled": bool(on)}


@contextlib.contextmanager
def disabled(off=True):
    """Switch the fast path off inside the block (benchmarks, tests); ``off=False`` leaves it
    as it is. Process-wide: other threads take the Python path meanwhile too."""
    if _ext is None or not off:
        yield
        return
    was = _ext.set_enabled(False)
    try:
        yield
    finally:
        _ext.set_enabled(was)


def counters():
    """``{"fast": calls computed, "planned": planner calls, "nogil": calls that released the
    GIL, "fallback": {reason: calls left to the Python path}, "pools", "cached_plans",
    "default_pool"}``, or None without the extension."""
    return None if _ext is None else _ext.counters()


def reset_counters():
    if _ext is not None:
        _ext.reset_counters()
