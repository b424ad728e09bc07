"""asymo.matmul against NumPy: values (error bounds scaled by K), shapes, dtypes, out= and errors,
for every backend, every micro-kernel family the CPU runs, and asymmetric pools."""
import os
import threading
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asymo
from asymo.ops import matmul as gemm
from asymo.plan import gemm as gemm_plan
from asymo.runtime.pool import Pool
from asymo.hw.topology import parse_spec

NCPU = len(os.sched_getaffinity(0))
ISAS = gemm_plan.supported_isas()
DIMS = [0, 1, 2, 3, 5, 7, 13, 17, 31, 37, 64, 67, 131]
LAYOUTS = ["C", "F", "strided", "reversed"]


def make(rng, shape, dtype, layout):
    """An array of logical ``shape`` with the given memory layout."""
    if layout == "C" or len(shape) < 2:
        base = rng.standard_normal(shape)
        if layout == "reversed" and len(shape) == 1:
            return np.asarray(base[::-1], dtype)
        if layout == "strided" and len(shape) == 1:
            wide = np.asarray(rng.standard_normal(2 * shape[0]), dtype)
            return wide[::2]
        return np.asarray(base, dtype)
    if layout == "F":
        return np.asfortranarray(rng.standard_normal(shape).astype(dtype))
    if layout == "strided":
        big = rng.standard_normal(shape[:-2] + (2 * shape[-2] + 1, 3 * shape[-1] + 2))
        return np.asarray(big, dtype)[..., 1::2, ::3][..., :shape[-2], :shape[-1]]
    if layout == "reversed":
        return np.asarray(rng.standard_normal(shape), dtype)[..., ::-1, ::-1]
    raise AssertionError(layout)


def check_close(r, a, b):
    """|r - a@b| <= 2 (K + 2) eps (|a| @ |b|) elementwise, against an extended-precision
    reference (the standard forward error bound of a length-K dot product)."""
    ref_dtype = np.longdouble if a.dtype == np.float64 else np.float64
    aa, bb = a.astype(ref_dtype), b.astype(ref_dtype)
    ref = np.matmul(aa, bb)
    mag = np.matmul(np.abs(aa), np.abs(bb))
    K = a.shape[-1]
    eps = np.finfo(a.dtype).eps
    tol = 2 * (K + 2) * eps * mag + np.finfo(a.dtype).tiny
    assert np.shape(r) == np.shape(ref)
    err = np.abs(np.asarray(r, ref_dtype) - ref)
    assert np.all(err <= tol), f"max error {err.max()} vs bound {tol.max()} (K = {K})"


@st.composite
def operands(draw):
    M, K, N = (draw(st.sampled_from(DIMS)) for _ in range(3))
    batch = tuple(draw(st.lists(st.sampled_from([1, 2, 3]), max_size=2)))
    # each operand keeps some batch dimensions, with broadcasting ones replaced by 1
    a_batch = tuple(d if draw(st.booleans()) else 1 for d in batch)
    b_batch = tuple(d if draw(st.booleans()) else 1 for d in batch)
    if draw(st.booleans()):
        b_batch = b_batch[draw(st.integers(0, len(b_batch))):]
    a_shape = a_batch + (M, K)
    b_shape = b_batch + (K, N)
    one_d = draw(st.sampled_from(["none", "none", "a", "b", "both"]))
    if one_d in ("a", "both"):
        a_shape = (K,)
    if one_d in ("b", "both"):
        b_shape = (K,)
    return (a_shape, b_shape, draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(LAYOUTS)),
            draw(st.sampled_from([np.float32, np.float64])), draw(st.integers(0, 2**32 - 1)))


def run_case(case, **kw):
    a_shape, b_shape, la, lb, dtype, seed = case
    rng = np.random.default_rng(seed)
    a = make(rng, a_shape, dtype, la)
    b = make(rng, b_shape, dtype, lb)
    r = asymo.matmul(a, b, **kw)
    e = np.matmul(a, b)
    assert type(r) is type(e)
    assert np.asarray(r).dtype == e.dtype
    check_close(r, a, b)


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=60, **SETTINGS)
@given(case=operands())
def test_matches_numpy_c_backend(case, isa):
    with gemm_plan.force_isa(isa):
        assert gemm_plan.best_isa() == isa
        run_case(case, backend="c")


@settings(max_examples=25, **SETTINGS)
@given(case=operands())
def test_matches_numpy_numba_backend(case):
    run_case(case, backend="numba")


@pytest.fixture(scope="module")
def asym_pool():
    if NCPU < 2:
        pytest.skip("needs 2 cores")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pool = Pool(parse_spec("big:0@1.0,little:1@0.5"))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def steal_pool():
    if NCPU < 2:
        pytest.skip("needs 2 cores")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pool = Pool(parse_spec("big:0@1.0,little:1@0.5"), policy="steal")
    yield pool
    pool.close()


@settings(max_examples=30, **SETTINGS)
@given(case=operands())
def test_matches_numpy_on_asymmetric_pool(case, asym_pool):
    run_case(case, pool=asym_pool)


@settings(max_examples=20, **SETTINGS)
@given(case=operands())
def test_matches_numpy_with_stealing_any_direction(case, steal_pool):
    run_case(case, pool=steal_pool)


@pytest.mark.parametrize("backend", ["c", "numba"])
@pytest.mark.parametrize("shape", [(300, 700, 257), (1, 2000, 999), (999, 2000, 1),
                                   (4, 513, 300), (300, 513, 3), (500, 1, 400), (2, 5000, 2)])
def test_large_and_skinny_shapes(shape, backend, asym_pool):
    M, K, N = shape
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        a = rng.standard_normal((M, K)).astype(dtype)
        b = rng.standard_normal((K, N)).astype(dtype)
        check_close(asymo.matmul(a, b, backend=backend), a, b)
        check_close(asymo.matmul(a, b, backend=backend, pool=asym_pool), a, b)


def test_long_k_error_scales_with_k():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((33, 20000)).astype(np.float32)
    b = rng.standard_normal((20000, 35)).astype(np.float32)
    check_close(asymo.matmul(a, b), a, b)


@pytest.mark.parametrize("isa_name", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["mm", "mv", "outer"])
def test_explicit_plans_every_kernel(isa_name, dtype, kind, asym_pool):
    """Plans are data: odd block sizes, every split, one cluster only, every kernel family."""
    rng = np.random.default_rng(3)
    shapes = {"mm": [(37, 29, 41), (12, 100, 64), (1, 5, 1)],
              "mv": [(61, 43, 3), (3, 43, 61), (1, 200, 1)],
              "outer": [(61, 1, 47), (1, 1, 5)]}[kind]
    mr, nr = gemm_plan.kernel_tile(isa_name, dtype)
    for M, K, N in shapes:
        for la, lb in (("C", "C"), ("F", "strided"), ("reversed", "F")):
            a = make(rng, (M, K), dtype, la)
            b = make(rng, (K, N), dtype, lb)
            for blocks in ((1, 1, 1), (mr + 1, nr - 1, 3), (5 * mr, 3 * nr, 1000)):
                for split in ((1, 0), (0, 1), (0.5, 0.5)):
                    for split_dim in ("M", "N"):
                        if kind == "mv" and ((split_dim == "M" and N > 8)
                                             or (split_dim == "N" and M > 8)):
                            continue
                        plan = gemm_plan.plan_gemm(M, K, N, dtype, asym_pool, split=split,
                                                   blocks=blocks, isa=isa_name, kind=kind,
                                                   split_dim=split_dim)
                        out = np.full((M, N), np.nan, dtype)
                        r = gemm.gemm(a, b, out, plan=plan, pool=asym_pool)
                        assert r is out
                        check_close(r, a, b)


def test_batch_split_plan(asym_pool):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((50, 7, 9)).astype(np.float32)
    b = rng.standard_normal((50, 9, 5)).astype(np.float32)
    plan = gemm_plan.plan_gemm(7, 9, 5, np.float32, asym_pool, nbatch=50)
    assert plan.split_dim == "batch"
    assert sum(plan.task_counts()) >= 2
    check_close(asymo.matmul(a, b, pool=asym_pool), a, b)
    # a batch whose every operand is broadcast differently
    a = rng.standard_normal((5, 1, 30, 20))
    b = rng.standard_normal((1, 4, 20, 10))[..., ::-1]
    check_close(asymo.matmul(a, b, pool=asym_pool), a, b)


def test_concurrent_calls_from_threads(steal_pool):
    rng = np.random.default_rng(5)
    cases = [(rng.standard_normal((m, k)).astype(np.float32),
              rng.standard_normal((k, n)).astype(np.float32))
             for m, k, n in [(200, 300, 100), (3, 500, 400), (150, 1, 90), (64, 64, 64)]]
    errors = []

    def work(i):
        try:
            for _ in range(15):
                a, b = cases[i % len(cases)]
                for pool in (None, steal_pool):
                    check_close(asymo.matmul(a, b, pool=pool), a, b)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "matmul hung"
    assert not errors, errors[0]


# ---- out= ----------------------------------------------------------------------------------

def test_out_is_filled_and_returned():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((40, 30))
    b = rng.standard_normal((30, 20))
    out = np.full((40, 20), np.nan)
    r = asymo.matmul(a, b, out=out)
    assert r is out
    check_close(out, a, b)
    # non-contiguous and Fortran-ordered out
    big = np.full((80, 60), np.nan)
    r = asymo.matmul(a, b, out=big[::2, 1::3])
    check_close(r, a, b)
    assert np.isnan(big[1::2]).all()
    fo = np.asfortranarray(np.full((40, 20), np.nan))
    check_close(asymo.matmul(a, b, out=fo), a, b)


def test_out_overlapping_inputs():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((50, 50))
    b = rng.standard_normal((50, 50))
    expected = a @ b
    r = asymo.matmul(a, b, out=a)
    assert r is a
    np.testing.assert_allclose(a, expected, rtol=1e-12, atol=1e-12)
    x = rng.standard_normal((6, 6)).astype(np.float32)
    expected = x.T @ x
    asymo.matmul(x.T, x, out=x)
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-5)


def test_out_shapes_for_1d_operands():
    v = np.arange(4.0)
    m = np.ones((4, 3))
    out = np.empty(3)
    assert asymo.matmul(v, m, out=out) is out
    np.testing.assert_array_equal(out, v @ m)
    out0 = np.empty(())
    assert asymo.matmul(v, v, out=out0) is out0
    assert out0[()] == v @ v
    r = asymo.matmul(v.astype(np.float32), v.astype(np.float32))
    assert type(r) is np.float32 and r == 14.0


@pytest.mark.parametrize("bad_out, exc", [
    (np.empty((3, 5)), ValueError),                 # wrong shape
    (np.empty((3, 6), np.int64), TypeError),        # cannot cast float64 -> int64
    ([0.0] * 18, TypeError),                        # not an array
])
def test_out_errors_like_numpy(bad_out, exc):
    a, b = np.ones((3, 4)), np.ones((4, 6))
    with pytest.raises(exc):
        np.matmul(a, b, out=bad_out)
    with pytest.raises(exc):
        asymo.matmul(a, b, out=bad_out)


def test_out_read_only_and_other_dtype():
    a, b = np.ones((3, 4)), np.ones((4, 6))
    ro = np.empty((3, 6))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        asymo.matmul(a, b, out=ro)
    out32 = np.empty((3, 6), np.float32)   # same_kind cast: NumPy computes, result identical
    r = asymo.matmul(a, b, out=out32)
    assert r is out32
    np.testing.assert_array_equal(out32, np.matmul(a, b, out=np.empty((3, 6), np.float32)))


# ---- errors ---------------------------------------------------------------------------------

def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"^matmul: a has shape \(3, 4\) but b has shape "
                                         r"\(5, 6\)"):
        asymo.matmul(np.ones((3, 4)), np.ones((5, 6)))
    with pytest.raises(ValueError, match=r"a has shape \(2, 3, 4\) but b has shape "
                                         r"\(5, 4, 6\).*do not broadcast"):
        asymo.matmul(np.ones((2, 3, 4)), np.ones((5, 4, 6)))
    with pytest.raises(ValueError, match=r"a has shape \(\) .*scalar"):
        asymo.matmul(np.float64(2.0), np.ones(3))
    with pytest.raises(ValueError, match=r"a has shape \(3,\) but b has shape \(4,\)"):
        asymo.matmul(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="backend"):
        asymo.matmul(np.ones((2, 2)), np.ones((2, 2)), backend="cuda")
    with pytest.raises(TypeError, match="pool"):
        asymo.matmul(np.ones((2, 2)), np.ones((2, 2)), pool="fast")


# ---- dtypes and types NumPy handles ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.float16,
                                   np.complex64, np.complex128, np.bool_, object])
def test_other_dtypes_give_numpys_result(dtype):
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((5, 7)) * 3).astype(dtype)
    b = (rng.standard_normal((7, 4)) * 3).astype(dtype)
    r, e = asymo.matmul(a, b), np.matmul(a, b)
    assert r.dtype == e.dtype
    np.testing.assert_array_equal(r, e)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_mixed_dtypes_lists_and_subclasses():
    a32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    b64 = np.arange(12, dtype=np.float64).reshape(3, 4)
    r, e = asymo.matmul(a32, b64), np.matmul(a32, b64)
    assert r.dtype == e.dtype == np.float64
    np.testing.assert_array_equal(r, e)
    np.testing.assert_array_equal(asymo.matmul([[1.0, 2.0]], [[3.0], [4.0]]), [[11.0]])
    m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    assert type(asymo.matmul(m, m)) is np.matrix
    big_endian = np.arange(4.0).reshape(2, 2).astype(">f8")
    np.testing.assert_array_equal(asymo.matmul(big_endian, big_endian),
                                  np.matmul(big_endian, big_endian))


# ---- zero-size ------------------------------------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape", [((0, 4), (4, 5)), ((3, 4), (4, 0)),
                                              ((3, 0), (0, 5)), ((0,), (0,)),
                                              ((2, 0, 3, 4), (4, 5)), ((0, 3), (3,))])
def test_zero_size(a_shape, b_shape):
    a = np.ones(a_shape, np.float32)
    b = np.ones(b_shape, np.float32)
    r, e = asymo.matmul(a, b), np.matmul(a, b)
    assert np.shape(r) == np.shape(e) and np.asarray(r).dtype == e.dtype
    np.testing.assert_array_equal(r, e)
    if np.ndim(e) >= 1 and e.size:
        out = np.full(e.shape, np.nan, np.float32)
        asymo.matmul(a, b, out=out)
        np.testing.assert_array_equal(out, e)


def test_nan_and_inf_propagate():
    a = np.ones((20, 20))
    a[3, 5] = np.nan
    a[7, 2] = np.inf
    b = np.ones((20, 20))
    np.testing.assert_array_equal(asymo.matmul(a, b), np.matmul(a, b))


def test_tasks_stolen_across_clusters_pack_their_own_panels(asym_pool):
    """All tasks queued on the slow cluster: the fast worker steals them and must compute them
    correctly (it packs B privately instead of sharing the slow cluster's panels)."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((600, 700)).astype(np.float32)
    b = rng.standard_normal((700, 300)).astype(np.float32)
    plan = gemm_plan.plan_gemm(600, 700, 300, np.float32, asym_pool, split=(0.0, 1.0),
                               blocks=(12, 64, 128))
    assert plan.cluster_ranges[0] == (0, 0) and sum(plan.task_counts()) > 100
    asym_pool.reset_stats()
    for _ in range(5):
        check_close(gemm.gemm(a, b, plan=plan, pool=asym_pool), a, b)
    stats = asym_pool.stats()
    assert stats["workers"][0]["tasks_stolen"] > 0


def test_matmul_in_a_forked_child():
    import signal
    rng = np.random.default_rng(10)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 100)).astype(np.float32)
    asymo.matmul(a, b)
    pid = os.fork()
    if pid == 0:  # child: fresh pool workers, a usable packed-buffer cache
        signal.alarm(60)
        ok = False
        try:
            ok = np.allclose(asymo.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("isa", ["portable", "avx2_fma", "avx512", "neon"])
def test_edge_slivers_of_one_and_two_columns(isa):
    # N = 16 q + 1 or + 2 (a 7 x 7 plane: 49) ends every row of micro-panels with an edge of a
    # column or two (AVX2: the narrow kernel); K of every remainder of its 4- and 2-step loops,
    # several K panels (accumulated), rows past mr, one and two clusters
    from asymo.plan import gemm as gemm_plan

    if isa not in gemm_plan.supported_isas():
        pytest.skip(f"{isa} kernels not supported here")
    rng = np.random.default_rng(41)
    with gemm_plan.force_isa(isa):
        for m, k, n in ((64, 37, 49), (13, 5, 18), (7, 600, 33), (130, 258, 50), (6, 1, 17),
                        (97, 1031, 49)):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            for pool in (asymo.get_pool(), None):
                got = asymo.matmul(a, b, pool=pool)
                np.testing.assert_allclose(got, ref, rtol=1e-4,
                                           atol=1e-5 * np.sqrt(k) * np.abs(ref).max())
