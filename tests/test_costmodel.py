"""AsyMo's block-size cost model (asymo.plan.costmodel): Table 2 features, constraints, candidates,
the scikit-learn estimator and its JSON form."""
import json
import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import cross_val_score

from asymo.calibrate import costfit
from asymo.plan import costmodel as cm


# ---------------------------------------------------------------------------------------------
# Table 2 features
# ---------------------------------------------------------------------------------------------
def test_table2_features_hand_computed():
    # M=64, K=128, N=96 with mc=32, nc=48, kc=64 on 2 threads, float32, 64-byte lines
    X = [[64, 128, 96, 32, 48, 64, 2, 0]]
    f = cm.table2_features(X, itemsize=4, line_size=64)[0]
    flop_task = 32 * 48 * 64                             # (1) 98304
    data_task = 4 / 64 * (32 * 64 + 64 * 48 + 2 * 32 * 48)  # (1) 512 cache lines
    ksteps, units = 128 / 64, (64 / 32) * (96 / 48)      # 2 sequential steps, 4 units
    assert data_task == 512
    np.testing.assert_allclose(f, [units / 2 * ksteps * flop_task,   # (3) with t_comp
                                   units / 2 * ksteps * data_task,   # (3) with t_data
                                   ksteps * flop_task,               # (4) p * Cost_seq
                                   ksteps * data_task,
                                   units * ksteps])                  # (4) t_sched: 8 tasks
    assert f[0] == 64 * 128 * 96 / 2  # Cost_par's FLOPs are the product's over the threads


def test_table2_blocks_larger_than_the_matrix_are_clipped():
    # section 4.2: a block larger than M means M is not partitioned
    a = cm.table2_features([[16, 64, 256, 999, 64, 999, 1, 0]])
    b = cm.table2_features([[16, 64, 256, 16, 64, 64, 1, 0]])
    np.testing.assert_array_equal(a, b)


def test_table2_kind_column_is_optional_and_ignored():
    a = cm.table2_features([[256, 128, 1, 32, 1, 128, 2]])
    b = cm.table2_features([[256, 128, 1, 32, 1, 128, 2, 1]])
    np.testing.assert_array_equal(a, b)


def test_extended_features_hand_computed():
    # 100 x 64 x 50 with 48 x 32 x 32 blocks on 2 threads, register tile 12 x 16
    f = dict(zip(cm.EXTENDED_FEATURES, cm.extended_features(
        [[100, 64, 50, 48, 32, 32, 2, 0]], mr=12, nr=16)[0]))
    ntm, ntn, npc = 3, 2, 2            # ceil(100/48), ceil(50/32), ceil(64/32)
    tasks, waves = ntm * ntn, 3        # 6 tasks on 2 threads
    assert f["mm_flop"] == 108 * 64 * 64 / 2        # M, N padded to 12 and 16
    assert f["mm_crit_flop"] == waves * 48 * 32 * 64
    assert f["mm_pack_a"] == ntn * 100 * 64 / 2
    assert f["mm_pack_b"] == 50 * 64 / 2
    assert f["mm_c_update"] == 100 * 50 * npc / 2
    assert f["mm_tasks"] == tasks / 2 and f["mm_steps"] == tasks * npc / 2
    assert f["mv"] == f["mv_stream"] == f["mv_tasks"] == 0   # MM rows leave MV columns 0


def test_extended_features_skinny_path():
    f = dict(zip(cm.EXTENDED_FEATURES, cm.extended_features(
        [[1000, 256, 1, 96, 1, 256, 2, 1]])[0]))
    assert f["mv"] == 1 and f["mv_stream"] == 1000 * 256 / 2
    assert f["mv_tasks"] == math.ceil(1000 / 96) / 2
    assert f["mv_crit"] == math.ceil(11 / 2) * 96 * 256
    assert f["mm_flop"] == f["mm_tasks"] == 0
    # (1, K, N): the long dimension is N and the task is nc columns
    g = dict(zip(cm.EXTENDED_FEATURES, cm.extended_features(
        [[1, 256, 1000, 1, 96, 256, 2, 1]])[0]))
    assert g == f


@pytest.mark.parametrize("X, match", [
    ([[64, 64, 64, 0, 8, 8, 1, 0]], "mc = 0"),
    ([[64, 64, 64, 8, 8, 8, 0, 0]], "threads = 0"),
    ([[64, 64, 64, 8, 8, 8]], "shape"),
    ([[64, 64, 64, 8, 8, 8, 1, 3]], "kind"),
    ([[64, np.nan, 64, 8, 8, 8, 1, 0]], "NaN"),
])
def test_bad_settings_are_rejected(X, match):
    with pytest.raises(ValueError, match=match):
        cm.table2_features(X)


# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------
def _synthetic_settings(seed=0, n_shapes=12, kinds=("mm",)):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_shapes):
        for kind in kinds:
            if kind == "mm":
                M, K, N = (int(v) for v in rng.choice([32, 64, 128, 256, 512, 1024], 3))
            else:
                M, K, N = int(rng.choice([256, 1024, 4096])), int(rng.choice([128, 1024])), 1
            T = int(rng.choice([1, 2, 4]))
            for mc, nc, kc in cm.block_candidates(M, K, N, threads=T, l1_bytes=32768,
                                                  l2_bytes=1 << 20, mr=8, nr=16, kind=kind):
                rows.append([M, K, N, mc, nc, kc, T, cm.KIND_CODES[kind]])
    return np.array(rows, dtype=np.float64)


def test_fit_recovers_table2_parameters():
    X = _synthetic_settings()
    t_comp, t_data, p, t_sched, t_fram = 2e-11, 3e-9, 0.4, 2e-6, 5e-5
    F = cm.table2_features(X)
    y = F @ [t_comp, t_data, p * t_comp, p * t_data, t_sched] + t_fram
    model = costfit.BlockCostModel().fit(X, y)
    got = model.table2_parameters()
    for name, want in dict(t_comp=t_comp, t_data=t_data, p=p, t_sched=t_sched,
                           t_fram=t_fram).items():
        assert got[name] == pytest.approx(want, rel=1e-6), name
    np.testing.assert_allclose(model.predict(X), y, rtol=1e-9)


@pytest.mark.parametrize("regressor, relative", [("linear", True), ("positive", False),
                                                 ("positive", True)])
def test_fit_recovers_extended_coefficients(regressor, relative):
    X = _synthetic_settings(seed=1, kinds=("mm", "mv"))
    true = np.array([1e-11, 2e-11, 1e-9, 5e-10, 2e-10, 3e-10, 1e-6, 2e-7,
                     4e-6, 1e-10, 3e-11, 5e-7])
    model = costfit.BlockCostModel(features="extended", regressor=regressor, relative=relative,
                              mr=8, nr=16)
    y = model.transform(X) @ true + 2e-5
    model.fit(X, y)
    np.testing.assert_allclose(model.predict(X), y, rtol=1e-6)
    np.testing.assert_allclose(model.coef_, true, rtol=1e-4, atol=1e-15)


def test_noisy_fit_cross_validates_well_and_noise_costs_r2():
    X = _synthetic_settings(seed=2, n_shapes=20)
    y = cm.table2_features(X) @ [2e-11, 3e-9, 8e-12, 1e-9, 2e-6] + 5e-5
    rng = np.random.default_rng(0)
    clean = costfit.cross_validate(costfit.BlockCostModel(), X, y)
    noisy = costfit.cross_validate(costfit.BlockCostModel(), X, y * rng.lognormal(0, 0.3, len(y)))
    assert clean["r2"] > 0.999 and clean["mdape"] < 1e-6
    assert len(clean["r2_folds"]) == 10 and clean["n"] == len(y)
    assert noisy["r2"] < clean["r2"] and noisy["mdape"] > 0.05


def test_estimator_is_scikit_learn_compatible():
    X = _synthetic_settings(seed=3)
    y = cm.table2_features(X) @ [2e-11, 3e-9, 8e-12, 1e-9, 2e-6] + 5e-5
    model = costfit.BlockCostModel(relative=True)
    assert clone(model).get_params() == model.get_params()
    scores = cross_val_score(model, X, y, cv=5)   # RegressorMixin.score is R^2
    assert np.all(scores > 0.999)


def test_json_round_trip_without_pickle():
    X = _synthetic_settings(seed=4, kinds=("mm", "mv"))
    y = cm.extended_features(X, mr=8, nr=16) @ np.linspace(1e-11, 1e-9, 12) + 1e-5
    model = costfit.BlockCostModel(features="extended", regressor="positive", mr=8, nr=16).fit(X, y)
    text = json.dumps(model.to_dict())
    back = costfit.BlockCostModel.from_dict(json.loads(text))
    assert back.get_params() == model.get_params()
    np.testing.assert_array_equal(back.predict(X), model.predict(X))
    unfitted = costfit.BlockCostModel.from_dict(costfit.BlockCostModel().to_dict())
    with pytest.raises(ValueError, match="not fitted"):
        unfitted.predict(X)


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(format="pickle"),
    lambda d: d.update(version=99),
    lambda d: d["params"].update(features="quadratic"),
    lambda d: d["params"].update(evil=1),
    lambda d: d.update(coef=d["coef"][:-1]),
    lambda d: d.update(coef=[float("nan")] * 5),
    lambda d: d.update(feature_names=["a"] * 5),
    lambda d: d.pop("params"),
])
def test_from_dict_rejects_malformed_models(mutate):
    X = _synthetic_settings(seed=5)
    y = cm.table2_features(X) @ [2e-11, 3e-9, 8e-12, 1e-9, 2e-6] + 5e-5
    d = costfit.BlockCostModel().fit(X, y).to_dict()
    mutate(d)
    with pytest.raises(ValueError, match="not a BlockCostModel"):
        costfit.BlockCostModel.from_dict(d)


def test_fit_rejects_bad_targets():
    X = _synthetic_settings(seed=6)[:5]
    with pytest.raises(ValueError, match="latencies"):
        costfit.BlockCostModel().fit(X, [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        costfit.BlockCostModel().fit(X, [1.0, 2.0, 0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="features"):
        costfit.BlockCostModel(features="cubic").fit(X, np.ones(5))


def test_choice_regret_is_zero_for_the_true_model_and_positive_for_a_wrong_one():
    X = _synthetic_settings(seed=7, n_shapes=15)
    groups = [f"{int(r[0])}x{int(r[1])}x{int(r[2])}x{int(r[6])}" for r in X]
    coef = [2e-11, 3e-9, 8e-12, 1e-9, 2e-6]
    y = cm.table2_features(X) @ coef + 5e-5
    assert costfit.choice_regret(costfit.BlockCostModel(), X, y, groups)["max"] == pytest.approx(0)
    # timings with a sweet spot at 8 tasks per size (a U in log(tasks)): Table 2's terms are
    # monotonic in the block size, so a non-negative fit cannot find the middle
    tasks = cm.table2_features(X)[:, 4]
    y_u = (1.0 + np.log(tasks / 8.0) ** 2) * 1e-3
    r = costfit.choice_regret(costfit.BlockCostModel(regressor="positive"), X, y_u, groups)
    assert set(r["per_size"]) == set(groups)
    assert r["mean"] > 0.05 and r["max"] > r["median"] >= 0


# ---------------------------------------------------------------------------------------------
# Constraints and candidates
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("l1, mr, nr, itemsize", [(32768, 12, 32, 4), (65536, 8, 12, 4),
                                                  (32768, 6, 8, 8), (16384, 4, 4, 4)])
def test_kc_is_the_largest_the_l1_constraint_allows(l1, mr, nr, itemsize):
    def fits(kc):
        return (mr * kc + nr * kc + mr * nr) * itemsize <= l1     # constraint (1)

    whole = [K for K in range(8, 4000, 8) if cm.kc_for_l1(K, l1, mr, nr, itemsize) == K]
    kc_max = max(whole)
    assert fits(kc_max) and not fits(kc_max + 8)        # the largest multiple of 8 that fits
    assert whole == list(range(8, kc_max + 1, 8))       # K up to it is one panel
    assert cm.kc_for_l1(37, l1, mr, nr, itemsize) == 37
    for K in (kc_max + 8, 3 * kc_max - 5, 10000):
        kc = cm.kc_for_l1(K, l1, mr, nr, itemsize)
        panels = math.ceil(K / kc)
        assert fits(kc) and panels == math.ceil(K / kc_max)   # fewest panels ...
        assert K - (panels - 1) * kc > kc / 2                 # ... of (nearly) equal depth


def test_candidates_follow_constraint_2_and_the_cache_constraint():
    M, K, N, T = 1024, 1024, 1024, 4
    cands = cm.block_candidates(M, K, N, threads=T, l1_bytes=32768, l2_bytes=2 << 20,
                                mr=8, nr=8)
    kc = cm.kc_for_l1(K, 32768, 8, 8)
    assert cands and all(c[2] == kc for c in cands)
    for mc, nc, _ in cands:
        assert cm.fits_l2(mc, nc, kc, T, 2 << 20)                      # constraint (1)
        assert mc % 8 == 0 and nc % 8 == 0 and abs(mc - nc) <= 8        # mc = nc (tile-rounded)
        i = M * N / (mc * nc * T)                                        # constraint (2)
        assert abs(i - round(i)) < 0.35 * max(1, round(i))
    sides = [c[0] for c in cands]
    assert sides == sorted(sides, reverse=True)          # fewest tasks first
    # the largest candidate that fits the L2 is the first one listed
    assert not cm.fits_l2(sides[0] + 64, sides[0] + 64, kc, T, 2 << 20) or sides[0] >= M


def test_small_dimension_is_not_partitioned():
    # M << N: every candidate keeps the whole of M
    cands = cm.block_candidates(16, 256, 50000, threads=2, l1_bytes=32768, l2_bytes=1 << 20,
                                mr=8, nr=16)
    assert cands and all(c[0] == 16 for c in cands)
    assert len({c[1] for c in cands}) > 3
    # N << M
    cands = cm.block_candidates(50000, 256, 24, threads=2, l1_bytes=32768, l2_bytes=1 << 20,
                                mr=8, nr=16)
    assert cands and all(c[1] == 24 for c in cands)


def test_mv_candidates_split_the_long_dimension_in_units():
    cands = cm.block_candidates(4096, 1024, 1, threads=2, l1_bytes=32768, l2_bytes=1 << 20,
                                kind="mv")
    assert cands and all(c[1] == 1 and c[2] == 1024 and c[0] % 16 == 0 for c in cands)
    # one task per thread down to one unit per task; no L2 bound (the matrix is read once)
    assert cands[0][0] == 2048 and cands[-1][0] == 16
    two = cm.block_candidates(4096, 1024, 1, threads=2, l1_bytes=32768, l2_bytes=1 << 20,
                              kind="mv", min_i=2)
    assert two[0][0] == 1024 and two[1:] == cands[2:]
    # the vector-times-matrix orientation splits N
    cands = cm.block_candidates(1, 1024, 4096, threads=2, l1_bytes=32768, l2_bytes=1 << 20,
                                kind="mv")
    assert all(c[0] == 1 and c[1] % 16 == 0 for c in cands)


def test_min_i_keeps_tasks_to_steal():
    kw = dict(threads=2, l1_bytes=32768, l2_bytes=1 << 20, mr=8, nr=8)
    every = cm.block_candidates(256, 256, 256, **kw)
    two = cm.block_candidates(256, 256, 256, min_i=2, **kw)
    assert set(two) < set(every) and two == [c for c in every if c in two]
    assert all(math.ceil(256 / c[0]) * math.ceil(256 / c[1]) >= 4 for c in two)


def test_candidates_never_empty_and_check_arguments():
    # a tiny L2: nothing fits, the smallest footprint is returned
    cands = cm.block_candidates(512, 512, 512, threads=8, l1_bytes=32768, l2_bytes=1024,
                                mr=8, nr=8)
    assert len(cands) == 1
    with pytest.raises(ValueError, match="threads"):
        cm.block_candidates(8, 8, 8, threads=0, l1_bytes=1, l2_bytes=1)
    with pytest.raises(ValueError, match="kind"):
        cm.block_candidates(8, 8, 8, threads=1, l1_bytes=1, l2_bytes=1, kind="conv")


def test_choose_blocks_takes_the_least_predicted_latency():
    X = _synthetic_settings(seed=8)
    y = cm.table2_features(X) @ [2e-11, 3e-9, 8e-12, 1e-9, 2e-6] + 5e-5
    model = costfit.BlockCostModel().fit(X, y)
    cache = dict(l1_bytes=32768, l2_bytes=1 << 20, mr=8, nr=16)
    cands = cm.block_candidates(512, 512, 512, threads=2, **cache)
    blocks, t = cm.choose_blocks(model, 512, 512, 512, threads=2, **cache)
    pred = model.predict([[512, 512, 512, *c, 2, 0] for c in cands])
    assert blocks == cands[int(np.argmin(pred))] and t == pytest.approx(pred.min())
    with pytest.raises(ValueError, match="no candidates"):
        cm.choose_blocks(model, 8, 8, 8, threads=1, candidates=[])
