"""Pipe-it's time model (Eq. 5-8) on synthetic measurements with a known ground truth."""
import json
import warnings

import numpy as np
import pytest

from asymo.pipeline.configs import CoreConfig
from asymo.pipeline.timemodel import (KERNEL_LEVEL, GemmTimeRegressor, LayerTimeModel,
                                      MultiCoreModel, TimeModelWarning, eq5_features,
                                      layer_operations)
from asymo.hw.topology import parse_spec

TRUE_BETA = np.array([2e-8, 1e-8, 3e-8, 4e-11, 5e-11, 6e-11, 1.1e-11, 2e-5])


def grid_X():
    g = [(iw * iw, f * f * d, m) for iw in (7, 14, 28, 56, 112) for f in (1, 3, 5, 7, 11)
         for d in (32, 64, 92, 128, 192, 256) for m in (32, 64, 92, 128, 192, 256)]
    return np.array(g, dtype=float)


def eq5(X, beta=TRUE_BETA):
    return eq5_features(X) @ beta[:7] + beta[7]


def test_eq5_recovers_a_noiseless_ground_truth():
    X = grid_X()
    y = eq5(X)
    r = GemmTimeRegressor().fit(X, y)
    np.testing.assert_allclose(r.predict(X), y, rtol=1e-6)
    np.testing.assert_allclose(r.coef_[6], TRUE_BETA[6], rtol=1e-4)


def test_eq5_relative_error_with_noise_is_small():
    rng = np.random.default_rng(0)
    X = grid_X()
    y = eq5(X) * rng.lognormal(0, 0.08, len(X))
    r = GemmTimeRegressor().fit(X, y)
    Xt = np.array([[3136, 576, 64], [196, 2304, 256], [784, 1152, 128], [49, 4608, 512]], float)
    err = np.abs(r.predict(Xt) / eq5(Xt) - 1)
    assert err.max() < 0.1
    # the relative fit beats plain least squares on the small layers
    plain = GemmTimeRegressor(relative=False).fit(X, y)
    small = X[:, 0] * X[:, 1] * X[:, 2] < 1e6
    e_rel = np.mean(np.abs(r.predict(X[small]) / eq5(X[small]) - 1))
    e_abs = np.mean(np.abs(plain.predict(X[small]) / eq5(X[small]) - 1))
    assert e_rel < e_abs


def test_eq5_is_a_sklearn_estimator_and_serialises():
    from sklearn.base import clone
    X = grid_X()[:50]
    r = GemmTimeRegressor().fit(X, eq5(X))
    assert clone(r).get_params() == {"relative": True}
    r2 = GemmTimeRegressor.from_dict(json.loads(json.dumps(r.to_dict())))
    np.testing.assert_allclose(r2.predict(X), r.predict(X))
    assert r.score(X, eq5(X)) > 0.999
    with pytest.raises(RuntimeError, match="not fitted"):
        GemmTimeRegressor().predict(X)
    with pytest.raises(ValueError, match="positive"):
        GemmTimeRegressor().fit(X, -eq5(X))
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        GemmTimeRegressor().fit(X[:, :2], eq5(X))
    with pytest.raises(ValueError, match="8 finite"):
        GemmTimeRegressor.from_dict({"coef": [1, 2]})


def test_multicore_eq8_recovers_alphas():
    X = grid_X()
    T = eq5(X)
    a1, a2, a3, ts = 1e-4, 3e-6, 5e-5, 64
    rows, ys = [], []
    for H in (2, 3, 4):
        rows.append(np.stack([X[:, 0], T, np.full(len(X), H)], 1))
        ys.append((T - a1) / H + a2 * X[:, 0] / (ts * H) + a3)
    R, Y = np.concatenate(rows), np.concatenate(ys)
    m = MultiCoreModel(tile=ts).fit(R, Y)
    np.testing.assert_allclose(m.alpha_, [a1, a2, a3], rtol=1e-5, atol=1e-10)
    np.testing.assert_allclose(m.predict(R), Y, rtol=1e-6)
    m2 = MultiCoreModel.from_dict(m.to_dict())
    np.testing.assert_allclose(m2.predict(R), Y, rtol=1e-6)


def synthetic_samples(speeds, *, counts=(1, 2), with_all=True):
    """Samples for clusters of the given speeds; H cores: Eq. 8 with fixed alphas."""
    X = grid_X()[::3]
    out = []
    for c, sp in enumerate(speeds):
        T1 = eq5(X) / sp
        for H in counts:
            t = T1 if H == 1 else (T1 - 1e-5) / H + 2e-6 * X[:, 0] / (64 * H) + 3e-5
            for (N, K, M), s in zip(X, t):
                out.append({"config": CoreConfig(c, H), "family": "conv", "N": int(N),
                            "K": int(K), "M": int(M), "seconds": float(s)})
    if with_all:
        tot = sum(speeds) * max(counts)
        for (N, K, M), s in zip(X, eq5(X) / tot + 1e-4):
            out.append({"config": KERNEL_LEVEL, "family": "conv", "N": int(N), "K": int(K),
                        "M": int(M), "seconds": float(s)})
    return out


def test_layer_time_model_fit_per_configuration_and_eq8_for_unmeasured_counts():
    m = LayerTimeModel.fit(synthetic_samples([1.0, 0.4], counts=(1, 2)))
    X = np.array([[3136, 576, 64]], float)
    t_big = m._predict(X, CoreConfig(0, 1), "conv")[0]
    t_small = m._predict(X, CoreConfig(1, 1), "conv")[0]
    assert abs(t_small / t_big - 2.5) < 0.05
    # 3 cores were never measured: Eq. 8 from the single-core fit and the fitted alphas
    t3 = m._predict(X, CoreConfig(0, 3), "conv")[0]
    ref = (eq5(X)[0] - 1e-5) / 3 + 2e-6 * 3136 / (64 * 3) + 3e-5
    assert abs(t3 / ref - 1) < 0.02
    # families without samples fall back to the conv regressor
    assert m._predict(X, CoreConfig(0, 1), "pool")[0] == t_big


def test_layer_time_model_json_roundtrip_and_bad_documents():
    m = LayerTimeModel.fit(synthetic_samples([1.0, 0.5]), capacities=[1.0, 0.5])
    d = json.loads(json.dumps(m.to_dict()))
    m2 = LayerTimeModel.from_dict(d)
    X = np.array([[784, 1152, 128]], float)
    for c in (CoreConfig(0, 1), CoreConfig(1, 2), KERNEL_LEVEL):
        assert m2._predict(X, c, "conv")[0] == pytest.approx(m._predict(X, c, "conv")[0])
    for bad in ({}, {"format": "x"}, dict(d, version=99),
                dict(d, models={"0x1": {"weird": {"coef": [0] * 8}}})):
        with pytest.raises(ValueError):
            LayerTimeModel.from_dict(bad)


class FakeProfile:
    def __init__(self, sections):
        self.sections = sections


def test_load_uses_profile_section_or_warns_and_falls_back(monkeypatch, tmp_path):
    top = parse_spec("big:0-1@1.0,little:2-3@0.5")
    ref = LayerTimeModel.fit(synthetic_samples([1.0], counts=(1, 2), with_all=False),
                             source="reference fit (synthetic)")
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(ref.to_dict()))
    monkeypatch.setattr(LayerTimeModel, "reference",
                        classmethod(lambda cls: cls.from_dict(json.loads(path.read_text()))))
    cal = LayerTimeModel.fit(synthetic_samples([1.0, 0.5]))
    got = LayerTimeModel.load(top, FakeProfile({"pipeline": cal.to_dict()}))
    assert got.source.startswith("predicted (calibrated")
    with pytest.warns(TimeModelWarning, match="unusable"):
        got = LayerTimeModel.load(top, FakeProfile({"pipeline": {"format": "nope"}}))
    assert "default model" in got.source
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = LayerTimeModel.load(top, FakeProfile({}))
    X = np.array([[3136, 576, 64]], float)
    b = d._predict(X, CoreConfig(0, 1), "conv")[0]
    s = d._predict(X, CoreConfig(1, 1), "conv")[0]
    assert s / b == pytest.approx(2.0)  # scaled by capacity
    kl = d._predict(X, KERNEL_LEVEL, "conv")[0]
    assert b / 3.0 < kl < b  # 2 big + 2 half-speed cores: ideal 1/3, plus Eq. 8 overhead


def test_shipped_reference_model_loads():
    ref = LayerTimeModel.reference()
    assert ref.reference_config == CoreConfig(0, 1)
    X = np.array([[3136, 576, 64], [196, 2304, 256]], float)
    t = ref._predict(X, CoreConfig(0, 1), "conv")
    assert np.all(t > 0) and np.all(t < 1.0)


def test_layer_operations_of_zoo_like_steps():
    pytest.importorskip("asymo.models")
    from asymo.models.spec import LRN, Concat, Conv, Linear, Pool, Residual
    c1 = Conv("a", (64, 56, 56), (64, 56, 56), (3, 3), padding=(1, 1))
    g2 = Conv("g", (64, 56, 56), (128, 56, 56), (3, 3), padding=(1, 1), groups=2)
    dw = Conv("d", (64, 56, 56), (64, 56, 56), (3, 3), padding=(1, 1), groups=64)
    fc = Linear("f", (9216,), (4096,))
    mp = Pool("max", (64, 56, 56), (64, 28, 28), (2, 2), (2, 2))
    ops = layer_operations((Residual((c1,), (g2,), (64, 56, 56), (64, 56, 56)),
                            Concat(((dw,), (mp,)), (64, 56, 56), (128, 28, 28)), fc,
                            LRN((64, 56, 56), (64, 56, 56))))
    assert ops == [("conv", 3136, 576, 64, 1), ("conv", 3136, 288, 64, 2),
                   ("dwconv", 3136, 9, 64, 1), ("pool", 784, 4, 64, 1),
                   ("fc", 1, 9216, 4096, 1), ("pool", 3136, 5, 64, 1)]


def test_calibration_micro_benchmarks_and_layer_measurements_end_to_end():
    """A tiny grid through the real path: one-node models on a pinned one-core pool, Eq. 5
    fitted per family, and the measured layer times of a small zoo model next to the
    prediction (the Table III figure)."""
    zoo = pytest.importorskip("asymo.models")
    import os

    from asymo.pipeline.calibrate import (calibrate, measure_layer_times, micro_benchmarks,
                                          prediction_errors)
    assert sum(b["family"] == "conv" for b in micro_benchmarks("paper")) == 900
    cpu = sorted(os.sched_getaffinity(0))[0]
    top = parse_spec(f"c0:{cpu}@1.0")
    grid = {"sizes": (7, 14), "filters": (1, 3), "depths": (32, 64), "maps": (32, 64)}
    model, samples = calibrate(top, grid=grid, kernel_level=False, min_time=0.0, co_run=None,
                               min_repeats=2, max_repeats=2)
    fams = {s["family"] for s in samples}
    assert fams == {"conv", "dwconv", "fc", "pool"}
    assert set(model.models[CoreConfig(0, 1)]) == fams
    json.dumps(model.to_dict())
    m = zoo.get("squeezenet", image_size=64)
    meas = measure_layer_times(m, top, kernel_level=False, repeats=2, warmup=1)
    assert meas.times.shape == (len(m.layers), 1) and np.all(meas.times > 0)
    assert meas.source.startswith("measured")
    pred = model.table(m, meas.configs)
    err = prediction_errors(pred, meas)
    assert set(err) == {CoreConfig(0, 1).label()} and np.isfinite(err[CoreConfig(0, 1).label()])
