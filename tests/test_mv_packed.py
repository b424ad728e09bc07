"""Matrix-vector products with a matrix packed into 16-row panels (asymo.ops.packed.PackedMatVec,
C asymo_mv_pack / asymo_mv_packed_task): against float64 products on one- and two-cluster
pools, the errors, and a model's Gemm at batch 1 (which runs through it) against batch 2 (the
GEMM) and ONNX Runtime."""
import numpy as np
import pytest

import asymo
from asymo.ops.packed import PackedMatVec
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import hold

RNG = np.random.default_rng(7)


def _ref(a, x, b, act):
    r = a.astype(np.float64) @ x.astype(np.float64)
    if b is not None:
        r += b
    if act == "relu":
        r = np.maximum(r, 0)
    elif act == "relu6":
        r = np.clip(r, 0, 6)
    return r


@pytest.mark.parametrize("spec", ["c0:0", "c0:0,1", "c0:0@1,c1:1@0.5"])
@pytest.mark.parametrize("m,k,act,bias", [
    (1000, 1280, None, True), (17, 5, "relu", True), (1, 1, "relu6", False),
    (16, 3, None, False), (47, 130, "relu", False), (33, 0, None, True)])
def test_matches_float64(spec, m, k, act, bias):
    a = RNG.standard_normal((m, k), dtype=np.float32)
    x = RNG.standard_normal(k).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32) * 3 if bias else None
    y = np.full(m, np.nan, np.float32)
    with asymo.Pool(spec) as pool, hold(pool) as held:
        PackedMatVec(a).bind(x, y, bias=b, activation=act, pool=held)()
    want = _ref(a, x, b, act)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * (1 + np.sqrt(k)))


def test_packed_copy_ignores_later_changes():
    a = RNG.standard_normal((20, 9), dtype=np.float32)
    x = RNG.standard_normal(9).astype(np.float32)
    p = PackedMatVec(a)
    want = _ref(a, x, None, None)
    a[:] = 0
    y = np.empty(20, np.float32)
    with hold(asymo.get_pool()) as pool:
        p.bind(x, y, pool=pool)()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_errors_are_clear():
    pool = asymo.get_pool()
    with pytest.raises(ValueError, match="2-D float32"):
        PackedMatVec(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="2-D float32"):
        PackedMatVec(np.zeros(4, np.float32))
    p = PackedMatVec(np.ones((3, 4), np.float32))
    x, y = np.ones(4, np.float32), np.empty(3, np.float32)
    with pytest.raises(ValueError, match="x must be a contiguous float32 array of 4"):
        p.bind(np.ones(5, np.float32), y, pool=pool)
    with pytest.raises(ValueError, match="y must be a contiguous float32 array of 3"):
        p.bind(x, np.empty(3, np.float64), pool=pool)
    with pytest.raises(ValueError, match="apart from x"):
        buf = np.ones(4, np.float32)
        PackedMatVec(np.ones((4, 4), np.float32)).bind(buf, buf, pool=pool)
    with pytest.raises(ValueError, match="bias must have shape"):
        p.bind(x, y, bias=np.ones(2, np.float32), pool=pool)
    with pytest.raises(ValueError, match="activation"):
        p.bind(x, y, activation="gelu", pool=pool)


def test_c_check_refuses_bad_jobs():
    job = ffi.new("asymo_mv_packed_job *")
    buf = np.zeros(64, np.float32)
    ptr = ffi.cast("float *", buf.ctypes.data)
    job.isa, job.m, job.k, job.panels_per_task = lib.asymo_gemm_default_isa(), 4, 4, 1
    job.a, job.x, job.y = ptr, ptr, ptr
    assert lib.asymo_mv_packed_check(job) == lib.ASYMO_OK
    for field, bad in (("isa", 99), ("m", -1), ("k", -1), ("panels_per_task", 0),
                       ("activation", 3)):
        old = getattr(job, field)
        setattr(job, field, bad)
        assert lib.asymo_mv_packed_check(job) == lib.ASYMO_EINVAL, field
        setattr(job, field, old)
    job.y = ffi.NULL
    assert lib.asymo_mv_packed_check(job) == lib.ASYMO_EINVAL
    assert lib.asymo_mv_packed_floats(-1, 3) < 0
    assert lib.asymo_mv_packed_floats(17, 3) == 32 * 3


def test_model_gemm_at_batch_one_agrees_with_batch_two_and_onnxruntime():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    fw = RNG.standard_normal((37, 70), dtype=np.float32) * 0.2
    fb = RNG.standard_normal(37).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "fw", "fb"], ["g"], transB=1),
         helper.make_node("Relu", ["g"], ["y"])], "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 70])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(fw, "fw"), numpy_helper.from_array(fb, "fb")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = asymo.from_onnx(model)
    x = RNG.standard_normal((2, 70)).astype(np.float32)
    both = m(x)
    one = np.concatenate([m(x[:1]), m(x[1:])])
    np.testing.assert_allclose(one, both, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(one, np.maximum(x.astype(np.float64) @ fw.T + fb, 0),
                               rtol=1e-5, atol=1e-4)
    # batch 1 ran the packed product, its weights packed once for every instance
    from asymo.models.graph_model import _MatVecStep

    pool = asymo.get_pool()
    one_a, one_b = m._acquire(1, pool), m._acquire(1, pool)
    steps = [[s for s in i.steps if isinstance(s, _MatVecStep)] for i in (one_a, one_b)]
    assert len(steps[0]) == 1 and steps[0][0].packed is steps[1][0].packed
    assert not any(isinstance(s, _MatVecStep) for s in m._acquire(2, pool).steps)
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(m(x[:1]), s.run(None, {"x": x[:1]})[0], rtol=1e-4, atol=1e-5)
