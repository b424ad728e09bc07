"""asymo.matmul's C fast path (asymo._matmul_fast): the same results as the Python path and
NumPy, taken exactly for the cases it covers (its counters say so), the Python path for the
rest with NumPy's errors, threads, nested calls, and its plans kept in step with pools,
thread limits, topology changes and cache clears. Without the extension asymo still works."""
import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import asymo
from asymo.plan import gemm as gemm_plan
from asymo.ops import matmul_fast
from asymo.plan import matmul as matmul_plan
from asymo.runtime import pool as pool_mod
from asymo.runtime.ffi import ffi
from asymo.runtime.pool import Pool

NCPU = len(os.sched_getaffinity(0))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_ext = pytest.mark.skipif(matmul_fast.matmul is None,
                               reason=f"fast path not built: {matmul_fast.status()['state']}")


def counts():
    return matmul_fast.counters()


def fast_calls():
    return counts()["fast"]


def fallbacks(reason):
    return counts()["fallback"][reason]


def python_path(a, b, out=None, **kw):
    with matmul_fast.disabled():
        return asymo.matmul(a, b, out=out, **kw)


def layout(rng, shape, dtype, kind):
    if len(shape) == 1:
        if kind == "strided":
            return np.asarray(rng.standard_normal(3 * shape[0]), dtype)[::3]
        if kind == "reversed":
            return np.asarray(rng.standard_normal(shape[0]), dtype)[::-1]
        return np.asarray(rng.standard_normal(shape), dtype)
    if kind == "C":
        return np.asarray(rng.standard_normal(shape), dtype)
    if kind == "F":
        return np.asfortranarray(rng.standard_normal(shape).astype(dtype))
    if kind == "strided":
        big = np.asarray(rng.standard_normal((2 * shape[0] + 1, 3 * shape[1] + 2)), dtype)
        return big[1::2, ::3][:shape[0], :shape[1]]
    if kind == "reversed":
        return np.asarray(rng.standard_normal(shape), dtype)[::-1, ::-1]
    raise AssertionError(kind)


def tolerance(dtype, K):
    eps = np.finfo(dtype).eps
    return 4 * (K + 2) * eps


# (M, K, N); N = 0 below means "b is 1-D", M = 0 "a is 1-D"
SHAPES = [(1, 1, 1), (2, 2, 2), (3, 5, 7), (17, 31, 13), (64, 64, 0), (256, 128, 0),
          (0, 128, 256), (0, 7, 3), (1, 300, 1), (100, 300, 50), (129, 257, 65),
          (2048, 64, 0), (0, 512, 1024)]


@needs_ext
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["C", "F", "strided", "reversed"])
@pytest.mark.parametrize("with_out", ["none", "C", "strided"])
def test_same_result_as_python_path_and_numpy(dtype, shape, kind, with_out):
    rng = np.random.default_rng(hash((shape, kind)) % 2**32)
    M, K, N = shape
    a = layout(rng, (M, K) if M else (K,), dtype, kind)
    b = layout(rng, (K, N) if N else (K,), dtype, "F" if kind == "C" else kind)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = out2 = None
    if with_out == "C":
        out, out2 = np.empty(ref.shape, dtype), np.empty(ref.shape, dtype)
    elif with_out == "strided":
        out = np.zeros((2,) + ref.shape, dtype)[1]
        out = out[..., ::-1] if out.ndim else out
        out2 = out.copy()
    before = fast_calls()
    r = asymo.matmul(a, b, out=out)
    assert fast_calls() == before + 1
    if out is not None:
        assert r is out
    slow = python_path(a, b, out=out2)
    assert fast_calls() == before + 1
    assert r.dtype == dtype and r.shape == ref.shape and r.flags.c_contiguous == (
        out is None or out.flags.c_contiguous)
    np.testing.assert_array_equal(r, slow)  # same plan, same kernels: the same bits
    mag = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    assert np.all(np.abs(r - ref) <= tolerance(dtype, K) * mag + 1e-30)


@needs_ext
def test_fast_path_is_taken_with_explicit_pool_and_backend():
    a = np.ones((8, 8), np.float32)
    with Pool(topology=f"c0:0-{NCPU - 1}@1" if NCPU > 1 else "c0:0@1") as p:
        before = counts()
        r = asymo.matmul(a, a, pool=p, backend="c")
        r2 = asymo.matmul(a, a, pool=p)
        after = counts()
        assert after["fast"] == before["fast"] + 2
        assert after["planned"] == before["planned"] + 1  # the second call hit the cache
        np.testing.assert_array_equal(r, np.full((8, 8), 8, np.float32))
        np.testing.assert_array_equal(r2, r)
    # numba backend: the Python path
    before = fast_calls()
    np.testing.assert_allclose(asymo.matmul(a, a, backend="numba"), a @ a)
    assert fast_calls() == before


def _misaligned(dtype, shape):
    raw = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize + 1, np.uint8)
    x = raw[1:].view(dtype).reshape(shape)
    assert not x.flags.aligned
    x[...] = 1.5
    return x


class _Sub(np.ndarray):
    pass


@needs_ext
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
@pytest.mark.parametrize("case,reason", [
    ("int", "dtype"), ("mixed", "dtype"), ("float16", "dtype"), ("complex", "dtype"),
    ("byteswapped", "dtype"), ("list", "type"), ("subclass", "type"), ("matrix", "type"),
    ("vec@vec", "ndim"), ("batched", "ndim"), ("scalar", "type"), ("zero_d", "ndim"), ("zero_m", "empty"),
    ("zero_k", "empty"), ("misaligned", "layout"), ("bytestride", "layout"),
    ("out_other_dtype", "out"), ("out_readonly", None), ("out_overlap", "overlap"),
    ("out_wrong_shape", None), ("out_not_array", "type"), ("pool_not_pool", None),
])
def test_other_cases_take_the_python_path(case, reason):
    rng = np.random.default_rng(1)
    f = rng.standard_normal((6, 5)).astype(np.float32)
    g = rng.standard_normal((5, 4)).astype(np.float32)
    kw = {}
    a, b = f, g
    if case == "int":
        a, b = (f * 10).astype(np.int64), (g * 10).astype(np.int64)
    elif case == "mixed":
        b = g.astype(np.float64)
    elif case == "float16":
        a, b = f.astype(np.float16), g.astype(np.float16)
    elif case == "complex":
        a, b = f.astype(np.complex64), g.astype(np.complex64)
    elif case == "byteswapped":
        a, b = f.astype(">f4"), g.astype(">f4")
    elif case == "list":
        a = f.tolist()
    elif case == "subclass":
        a = f.view(_Sub)
    elif case == "matrix":
        a = np.asmatrix(f)
    elif case == "vec@vec":
        a, b = f[0], g[:, 0]
    elif case == "batched":
        a = np.stack([f, f])
    elif case == "scalar":
        a = np.float32(2.0)
    elif case == "zero_d":
        a = np.array(2.0, np.float32)
    elif case == "zero_m":
        a = f[:0]
    elif case == "zero_k":
        a, b = f[:, :0], g[:0]
    elif case == "misaligned":
        a = _misaligned(np.float32, (6, 5))
    elif case == "bytestride":
        a = np.zeros((6, 5), [("x", np.float32), ("pad", np.int8)])["x"]
        a[...] = f
    elif case == "out_other_dtype":
        kw["out"] = np.empty((6, 4), np.float64)
    elif case == "out_readonly":
        kw["out"] = np.empty((6, 4), np.float32)
        kw["out"].flags.writeable = False
    elif case == "out_overlap":
        a = np.ascontiguousarray(f[:, :4].T @ f[:, :4])  # (4, 4), out = a
        b = np.ascontiguousarray(g[:4, :4])
        kw["out"] = a
    elif case == "out_wrong_shape":
        kw["out"] = np.empty((4, 6), np.float32)
    elif case == "out_not_array":
        kw["out"] = [[0.0] * 4] * 6
    elif case == "pool_not_pool":
        kw["pool"] = "default"

    def run(fast):
        kw2 = dict(kw)
        if isinstance(kw.get("out"), np.ndarray):
            kw2["out"] = kw["out"].copy() if case != "out_overlap" else None
            if case == "out_overlap":
                a2 = a.copy()
                kw2["out"] = a2
            if case == "out_readonly":
                kw2["out"].flags.writeable = False
        else:
            a2 = a
        args = (a2 if case == "out_overlap" else a, b)
        try:
            if fast:
                return asymo.matmul(*args, **kw2), None
            return python_path(*args, **kw2), None
        except Exception as exc:  # noqa: BLE001 - compared below
            return None, exc

    c0 = counts()
    r_fast, e_fast = run(True)
    c1 = counts()
    r_slow, e_slow = run(False)
    assert c1["fast"] == c0["fast"]
    if reason is not None:
        assert c1["fallback"][reason] == c0["fallback"][reason] + 1
    assert (e_fast is None) == (e_slow is None)
    if e_fast is not None:
        assert type(e_fast) is type(e_slow) and str(e_fast) == str(e_slow)
        return
    np.testing.assert_array_equal(np.asarray(r_fast), np.asarray(r_slow))
    assert type(r_fast) is type(r_slow)
    if case not in ("out_overlap",):
        with np.errstate(all="ignore"):
            ref = np.matmul(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(r_fast), ref, rtol=1e-3, atol=1e-3)


@needs_ext
def test_shape_mismatch_raises_the_python_paths_error():
    a, b = np.ones((3, 4), np.float32), np.ones((5, 6), np.float32)
    before = fallbacks("shape")
    with pytest.raises(ValueError, match=r"a has shape \(3, 4\) but b has shape \(5, 6\)"):
        asymo.matmul(a, b)
    assert fallbacks("shape") == before + 1


@needs_ext
def test_closed_pool_raises_like_the_python_path():
    a = np.ones((4, 4))
    p = Pool(topology="c0:0@1")
    asymo.matmul(a, a, pool=p)
    registered = counts()["pools"]
    p.close()
    assert counts()["pools"] == registered - 1
    with pytest.raises(ValueError, match="pool is closed"):
        asymo.matmul(a, a, pool=p)


@needs_ext
def test_collected_pool_is_forgotten():
    a = np.ones((300, 300))
    registered = counts()["pools"]
    p = Pool(topology="c0:0@1")
    np.testing.assert_array_equal(asymo.matmul(a, a, pool=p), np.full((300, 300), 300.0))
    assert counts()["pools"] == registered + 1
    del p
    gc.collect()
    assert counts()["pools"] == registered


@needs_ext
def test_concurrent_threads_get_right_results():
    rng = np.random.default_rng(2)
    cases = []
    for M, K, N in [(2, 3, 4), (64, 64, 1), (300, 200, 1), (200, 150, 120), (1, 512, 256),
                    (1024, 256, 1)]:
        a = rng.standard_normal((M, K))
        b = rng.standard_normal((K, N)) if N > 1 else rng.standard_normal(K)
        cases.append((a, b, a @ b))
    errors = []
    before = fast_calls()

    def worker(seed):
        order = np.random.default_rng(seed).permutation(len(cases) * 8) % len(cases)
        for i in order:
            a, b, ref = cases[i]
            r = asymo.matmul(a, b)
            if not np.allclose(r, ref, rtol=1e-10, atol=1e-10):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert fast_calls() - before == 4 * 8 * len(cases)
    assert counts()["nogil"] > 0


@needs_ext
def test_nested_call_from_a_pool_task():
    """A Python task running on the pool calls asymo.matmul: the job runs inline there."""
    a = np.random.default_rng(3).standard_normal((400, 300))
    b = np.random.default_rng(4).standard_normal((300, 200))
    ref = a @ b
    results = [None] * 4

    @ffi.callback("void(int64_t, void *)")
    def task(i, ctx):
        results[i] = asymo.matmul(a, b)

    before = fast_calls()
    asymo.get_pool().parallel_for(task, 4)
    assert fast_calls() == before + 4
    for r in results:
        np.testing.assert_allclose(r, ref, rtol=1e-10, atol=1e-10)


@needs_ext
def test_default_pool_change_is_noticed(monkeypatch):
    a = np.random.default_rng(5).standard_normal((2048, 256))
    b = np.random.default_rng(6).standard_normal(256)
    ref = a @ b
    np.testing.assert_allclose(asymo.matmul(a, b), ref)
    old = asymo.get_pool()
    # a topology with one cluster on cpu 0 only (what the emulator does through the env)
    monkeypatch.setenv("ASYMO_TOPOLOGY", "solo:0@1")
    planned = counts()["planned"]
    r = asymo.matmul(a, b)
    new = asymo.get_pool()
    assert new is not old and old.closed and new.nworkers == 1
    assert counts()["planned"] == planned + 1
    np.testing.assert_allclose(r, ref)
    # the one worker runs the product for a caller on another cpu; a caller on cpu 0 runs it
    # itself (handing it over would only make the worker preempt the caller)
    saved = os.sched_getaffinity(0)
    others = saved - {0}
    try:
        if others:
            os.sched_setaffinity(0, others)
        new.reset_stats()
        asymo.matmul(a, b)
        ran = sum(w["tasks_run"] for w in new.stats()["workers"])
        assert ran > 0 if others else ran == 0
        os.sched_setaffinity(0, {0})
        new.reset_stats()
        np.testing.assert_allclose(asymo.matmul(a, b), ref)
        assert sum(w["tasks_run"] for w in new.stats()["workers"]) == 0
    finally:
        os.sched_setaffinity(0, saved)
    monkeypatch.delenv("ASYMO_TOPOLOGY")
    np.testing.assert_allclose(asymo.matmul(a, b), ref)
    assert asymo.get_pool() is not new and new.closed


@needs_ext
def test_reset_default_pool_and_topology_change_hook():
    from asymo.lab import emulate
    a = np.ones((64, 64), np.float32)
    asymo.matmul(a, a)
    old = asymo.get_pool()
    emulate._notify_topology_change()  # what the emulator calls on entry and exit
    assert old.closed and not counts()["default_pool"]
    np.testing.assert_array_equal(asymo.matmul(a, a), np.full((64, 64), 64, np.float32))
    assert counts()["default_pool"] and asymo.get_pool() is not old


@needs_ext
def test_thread_limit_and_cache_clears_replan():
    a = np.random.default_rng(7).standard_normal((512, 512))
    asymo.matmul(a, a)
    c0 = counts()
    asymo.matmul(a, a)
    assert counts()["planned"] == c0["planned"]
    pool_mod.set_thread_limit(1)
    try:
        r = asymo.matmul(a, a)
        assert counts()["planned"] == c0["planned"] + 1
    finally:
        pool_mod.set_thread_limit(None)
    np.testing.assert_allclose(r, a @ a)
    matmul_plan.clear_cache()
    assert counts()["cached_plans"] == 0
    with gemm_plan.force_isa("portable"):
        r = asymo.matmul(a, a)
        slow = python_path(a, a)
    np.testing.assert_array_equal(r, slow)
    np.testing.assert_allclose(r, a @ a)


@needs_ext
def test_plans_expire_when_their_load_reading_does(monkeypatch):
    a = np.ones((40, 41), np.float32)
    b = np.ones((41, 42), np.float32)
    window_end = time.monotonic() + 0.2  # one load window: the same end until it is over
    monkeypatch.setattr(matmul_plan, "plan_expiry", lambda pool: window_end)
    matmul_plan.clear_cache()
    c0 = counts()["planned"]
    asymo.matmul(a, b)
    asymo.matmul(a, b)
    assert counts()["planned"] == c0 + 1
    time.sleep(0.25)
    asymo.matmul(a, b)
    assert counts()["planned"] == c0 + 2
    monkeypatch.setattr(matmul_plan, "plan_expiry", lambda pool: -1.0)  # not cacheable
    matmul_plan.clear_cache()
    c1 = counts()
    for _ in range(3):
        np.testing.assert_array_equal(asymo.matmul(a, b), np.full((40, 42), 41, np.float32))
    assert counts()["planned"] == c1["planned"] + 3
    assert counts()["fast"] == c1["fast"]


@needs_ext
@pytest.mark.skipif(NCPU < 2, reason="needs 2 cpus")
def test_asymmetric_pool_tiny_products_in_caller():
    """Tiny products on an asymmetric pool run in the caller when it is on the fast cluster
    (the plan's serial_cpus), else on the pool: both give the right result."""
    with Pool(topology="big:0@1.0,little:1@0.5") as p:
        a = np.random.default_rng(8).standard_normal((9, 10))
        b = np.random.default_rng(9).standard_normal((10, 11))
        saved = os.sched_getaffinity(0)
        try:
            for cpu in (0, 1):
                os.sched_setaffinity(0, {cpu})
                np.testing.assert_allclose(asymo.matmul(a, b, pool=p), a @ b)
        finally:
            os.sched_setaffinity(0, saved)


def _run_python(code, env=None):
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_without_the_extension_asymo_still_works():
    code = """
import sys
sys.modules["asymo._matmul_fast"] = None  # as if it had not been built
import numpy as np, asymo
from asymo.ops import matmul_fast
assert matmul_fast.matmul is None and matmul_fast.counters() is None
print(matmul_fast.status()["state"])
a = np.arange(12.0).reshape(3, 4)
np.testing.assert_array_equal(asymo.matmul(a, a.T), a @ a.T)
np.testing.assert_array_equal(asymo.matmul(a[0], a.T), a[0] @ a.T)
from asymo.cli import main
main(["info"])
"""
    res = _run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("not available (ModuleNotFoundError")
    assert "matmul fast path: not available" in res.stdout


@needs_ext
def test_switched_off_by_env():
    code = """
import numpy as np, asymo
from asymo.ops import matmul_fast
a = np.ones((3, 3))
np.testing.assert_array_equal(asymo.matmul(a, a), a @ a)
c = matmul_fast.counters()
assert c["fast"] == 0 and c["fallback"]["disabled"] == 1, c
print(matmul_fast.status()["state"])
"""
    res = _run_python(code, {"ASYMO_MATMUL_FAST": "0"})
    assert res.returncode == 0, res.stderr
    assert "switched off (env ASYMO_MATMUL_FAST='0')" in res.stdout


@needs_ext
def test_pool_closed_by_another_thread_while_in_use():
    """close() from another thread while calls run on the pool: the calls in flight finish
    with right results (forget_pool waits for them before the handle is destroyed), later
    calls raise the Python path's ValueError; nothing crashes or hangs."""
    a = np.random.default_rng(10).standard_normal((1024, 512))
    b = np.random.default_rng(11).standard_normal(512)
    ref = a @ b
    p = Pool(topology=f"c0:0-{NCPU - 1}@1" if NCPU > 1 else "c0:0@1")
    seen = {"ok": 0, "closed": 0, "wrong": 0}
    started = threading.Event()

    def caller():
        for _ in range(20000):
            try:
                r = asymo.matmul(a, b, pool=p)
            except ValueError as exc:
                assert "closed" in str(exc)
                seen["closed"] += 1
                return
            seen["ok"] += 1
            started.set()
            if not np.allclose(r, ref):
                seen["wrong"] += 1

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    assert started.wait(30)
    time.sleep(0.02)
    p.close()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert seen["ok"] > 0 and seen["closed"] == 2 and seen["wrong"] == 0


def test_core_signature_check(monkeypatch):
    assert matmul_fast._core_mismatch() is None
    monkeypatch.setitem(matmul_fast.CORE_FUNCTIONS, "asymo_pool_get_limit", "int(*)(int)")
    assert "asymo_pool_get_limit is int(*)(struct asymo_pool *)" in matmul_fast._core_mismatch()
    monkeypatch.setitem(matmul_fast.CORE_FUNCTIONS, "asymo_no_such_function", "int(*)()")
    monkeypatch.delitem(matmul_fast.CORE_FUNCTIONS, "asymo_pool_get_limit")
    assert "has no asymo_no_such_function" in matmul_fast._core_mismatch()


# --- review (session 3): cases found by the fast path's review ---------------------------------

def _self_overlapping_out(shape, strides, dtype):
    """A writeable view whose elements share memory (as_strided, broadcast-like strides)."""
    buf = np.zeros(int(np.prod(shape)) + 64, dtype)
    return buf, np.lib.stride_tricks.as_strided(buf, shape, strides)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "python"])
@pytest.mark.parametrize("n,strides", [(200, (8, 8)), (200, (0, 8)), (200, (8, 0)),
                                       (7, (0, 8)), (64, (16, 8))])
def test_out_with_internal_overlap_matches_numpy(fast, n, strides):
    """An ``out`` whose elements alias each other (a writeable as_strided view) gets NumPy's
    result (NumPy computes into a temporary and copies it back), not whichever of the pool's
    workers wrote an element last."""
    rng = np.random.default_rng(20)
    a, b = rng.standard_normal((n, 9)), rng.standard_normal((9, n))
    ref_buf, ref_out = _self_overlapping_out((n, n), strides, np.float64)
    np.matmul(a, b, out=ref_out)
    buf, out = _self_overlapping_out((n, n), strides, np.float64)
    with matmul_fast.disabled(not fast):
        r = asymo.matmul(a, b, out=out)
    assert r is out
    np.testing.assert_array_equal(buf, ref_buf)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "python"])
def test_1d_out_with_zero_stride_matches_numpy(fast):
    rng = np.random.default_rng(21)
    a, b = rng.standard_normal((300, 5)), rng.standard_normal(5)
    ref_buf, ref_out = _self_overlapping_out((300,), (0,), np.float64)
    # not np.matmul(a, b, out=ref_out): NumPy hands that out to BLAS gemv with incy=0, which
    # rejects it ("DGEMV parameter number 11 had an illegal value") and leaves out unwritten
    ref_out[...] = a @ b
    buf, out = _self_overlapping_out((300,), (0,), np.float64)
    with matmul_fast.disabled(not fast):
        asymo.matmul(a, b, out=out)
    np.testing.assert_array_equal(buf, ref_buf)


@needs_ext
def test_planner_error_propagates_and_nothing_is_cached(monkeypatch):
    """A planner that raises: the caller gets its exception (not a SystemError, not a
    result), no plan is cached, and the next call after the planner is repaired is taken."""
    import asymo.ops.matmul  # noqa: F401 - imported before the patch: it binds plan_for_matmul
    a, b = np.ones((5, 7)), np.ones((7, 3))
    matmul_fast._ext.clear_plans()

    def broken(*args, **kwargs):
        raise RuntimeError("planner broke")

    monkeypatch.setattr(matmul_plan, "plan_for_matmul", broken)
    with pytest.raises(RuntimeError, match="planner broke"):
        asymo.matmul(a, b)
    assert counts()["cached_plans"] == 0
    monkeypatch.undo()
    before = fast_calls()
    np.testing.assert_array_equal(asymo.matmul(a, b), a @ b)
    assert fast_calls() == before + 1


@needs_ext
def test_more_pools_than_registry_slots():
    """Past the 16 registered pools, calls take the Python path with right results; the slots
    of collected pools are reused."""
    a = np.random.default_rng(22).standard_normal((6, 6))
    pools = [Pool(topology="c0:0@1") for _ in range(20)]
    for p in pools:
        np.testing.assert_allclose(asymo.matmul(a, a, pool=p), a @ a, rtol=1e-12)
    assert counts()["pools"] <= 16
    for p in pools:
        p.close()
    del pools
    gc.collect()
    p = Pool(topology="c0:0@1")
    before = fast_calls()
    asymo.matmul(a, a, pool=p)
    asymo.matmul(a, a, pool=p)
    assert fast_calls() >= before + 1
    p.close()


@needs_ext
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_uses_the_fast_path_while_parent_threads_were_in_gemm():
    """fork() while another thread is inside a GIL-released GEMM: the child (its pools reset by
    the C pool's atfork handler, in-flight counts by the fast path's) computes right results
    on the default and an explicit pool, and can close that pool without waiting forever."""
    code = """
import os, threading, time
import numpy as np, asymo
from asymo.ops import matmul_fast
from asymo.runtime.pool import Pool
matmul_fast._ext.set_nogil_flops(0)
a = np.random.default_rng(0).standard_normal((160, 160)); ref = a @ a
p = Pool(topology=None)
stop = False
def spin():
    while not stop:
        asymo.matmul(a, a); asymo.matmul(a, a, pool=p)
t = threading.Thread(target=spin); t.start()
time.sleep(0.1)
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        ok = (np.allclose(asymo.matmul(a, a), ref) and np.allclose(asymo.matmul(a, a, pool=p), ref)
              and matmul_fast.counters()["fast"] > 0)
        p.close()
        ok = ok and np.allclose(asymo.matmul(a, a), ref)
        os._exit(0 if ok else 3)
    kids.append(pid)
    time.sleep(0.02)
stop = True; t.join()
print([os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids])
"""
    res = _run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[0, 0, 0]"


@needs_ext
def test_plan_made_as_the_load_window_changes_is_not_cached_past_it(monkeypatch):
    """Another thread can start a new load window while this one plans (the planner runs
    Python, so the GIL is shared): the plan reflects the old reading and must not be cached
    until the end of the new window."""
    import asymo.ops.matmul  # noqa: F401 - imported before the patch: it binds plan_for_matmul
    window = [0]
    base = time.monotonic() + 60.0
    monkeypatch.setattr(matmul_plan, "plan_expiry", lambda pool: base + window[0])
    real = matmul_plan.plan_for_matmul

    def plan_then_new_window(*args, **kwargs):
        res = real(*args, **kwargs)
        window[0] += 1  # a sample taken by another thread meanwhile
        return res

    monkeypatch.setattr(matmul_plan, "plan_for_matmul", plan_then_new_window)
    a, b = np.ones((9, 10), np.float32), np.ones((10, 11), np.float32)
    matmul_plan.clear_cache()
    c0 = counts()["planned"]
    asymo.matmul(a, b)
    asymo.matmul(a, b)
    assert counts()["planned"] == c0 + 2  # the first plan was not kept
    monkeypatch.setattr(matmul_plan, "plan_for_matmul", real)
    asymo.matmul(a, b)
    asymo.matmul(a, b)
    assert counts()["planned"] == c0 + 3  # a plan made within one window is kept
