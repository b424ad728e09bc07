"""Pre-packed constant operands (asymo.prepack): same results as the unpacked product on every
kernel family the machine runs, every plan shape, and the fall-backs."""
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asymo
from asymo.hw.topology import parse_spec
from asymo.ops import matmul as gemm
from asymo.ops.packed import PackedOperand
from asymo.plan import gemm as gemm_plan
from asymo.runtime.pool import Pool

from test_matmul import check_close, make

ISAS = gemm_plan.supported_isas()
DIMS = [1, 2, 5, 7, 13, 17, 31, 37, 64, 67, 131]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def asym_pool():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pool = Pool(parse_spec("big:0@1.0,little:1@0.5"))
    yield pool
    pool.close()


@st.composite
def cases(draw):
    M, K, N = (draw(st.sampled_from(DIMS)) for _ in range(3))
    return (M, K, N, draw(st.sampled_from(["C", "F", "strided", "reversed"])),
            draw(st.sampled_from([np.float32, np.float64])), draw(st.sampled_from("ab")),
            draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=40, **SETTINGS)
@given(case=cases())
def test_packed_operand_matches_unpacked(case, isa):
    M, K, N, layout, dtype, side, seed = case
    rng = np.random.default_rng(seed)
    a = make(rng, (M, K), dtype, layout)
    b = make(rng, (K, N), dtype, layout)
    with gemm_plan.force_isa(isa):
        if side == "b":
            p = asymo.prepack(b)
            r = asymo.matmul(a, p)
            r2 = asymo.matmul(a, p)  # the layout is reused
        else:
            p = asymo.prepack(a, side="a")
            r = asymo.matmul(p, b)
            r2 = asymo.matmul(p, b)
    check_close(r, a, b)
    np.testing.assert_array_equal(r, r2)


@pytest.mark.parametrize("isa_name", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_on_explicit_plans(isa_name, dtype, asym_pool):
    """Both operands packed, plans split either way across two clusters, K blocks shorter than
    K, blocks that are not multiples of the tile (those clusters pack from the plain array)."""
    rng = np.random.default_rng(5)
    mr, nr = gemm_plan.kernel_tile(isa_name, dtype)
    M, K, N = 67, 131, 53
    a = make(rng, (M, K), dtype, "C")
    b = make(rng, (K, N), dtype, "F")
    pa, pb = asymo.prepack(a, side="a"), asymo.prepack(b)
    for blocks in ((2 * mr, 2 * nr, 32), (mr + 1, nr - 1, 40), (5 * mr, 3 * nr, 1000)):
        for split in ((1, 0), (0.5, 0.5)):
            for split_dim in ("M", "N"):
                plan = gemm_plan.plan_gemm(M, K, N, dtype, asym_pool, split=split,
                                           blocks=blocks, isa=isa_name, kind="mm",
                                           split_dim=split_dim)
                for x, y in ((pa, b), (a, pb), (pa, pb)):
                    out = np.full((M, N), np.nan, dtype)
                    r = gemm.gemm(x, y, out, plan=plan, pool=asym_pool)
                    assert r is out
                    check_close(r, a, b)
    assert len(pa.layouts) >= 2 and len(pb.layouts) >= 2


def test_packed_shapes_and_fallbacks():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    pw = asymo.prepack(w)
    x3 = rng.standard_normal((2, 3, 96)).astype(np.float32)
    check_close(asymo.matmul(x3, pw), x3, w)                 # stacked rows fold into M
    v = rng.standard_normal(96).astype(np.float32)
    check_close(asymo.matmul(v, pw), v, w)                   # MV plan: the plain copy
    check_close(asymo.matmul(x3.astype(np.float64), pw), x3.astype(np.float64), w)
    out = np.empty((2, 3, 40), np.float32)
    assert asymo.matmul(x3, pw, out=out) is out
    check_close(out, x3, w)
    # the packed copy does not follow later changes of the caller's array
    x = rng.standard_normal((50, 96)).astype(np.float32)
    before = asymo.matmul(x, pw)
    w[:] = 0
    np.testing.assert_array_equal(asymo.matmul(x, pw), before)
    with pytest.raises(ValueError, match="shape"):
        asymo.matmul(rng.standard_normal((5, 7)).astype(np.float32), pw)
    # a packed A used in the B position (and vice versa) is the plain product
    pa = asymo.prepack(x, side="a")
    check_close(asymo.matmul(x.T.copy(), pa), x.T, x)


def test_prepack_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        asymo.prepack(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        asymo.prepack(np.ones((3, 3), np.int64))
    with pytest.raises(ValueError, match="side"):
        asymo.prepack(np.ones((3, 3), np.float32), side="c")
    p = asymo.prepack(np.ones((3, 3), np.float32))
    assert isinstance(p, PackedOperand) and not p.array.flags.writeable
    assert asymo.prepack(p) is p


def test_packed_products_with_an_empty_inner_dimension():
    # K = 0: NumPy's zeros (a reshape(-1, 0) of the other operand raised an unclear error)
    for side, a, b in (("b", np.ones((3, 0), np.float32), np.ones((0, 5), np.float32)),
                       ("a", np.ones((3, 0), np.float32), np.ones((0, 5), np.float32))):
        packed = asymo.prepack(b if side == "b" else a, side=side)
        got = asymo.matmul(a, packed) if side == "b" else asymo.matmul(packed, b)
        np.testing.assert_array_equal(got, np.zeros((3, 5), np.float32))
