"""Data reuse (AsyMo Eq. 2), least-energy frequency selection, frequency plans and reports."""
import json
import math
import os
import warnings

import pytest
from hypothesis import given, settings, strategies as st

import asymo
from asymo.dvfs import (CpuFreq, CpuFreqError, DvfsWarning, PowerModel, compute_weight,
                        data_reuse, estimate_curves, least_energy_frequency, model_reuse,
                        plan_frequencies, predict_cluster)
from asymo.dvfs.curves import curves_from_section, curves_to_section
from asymo.profile import Profile, ProfileWarning
from asymo.hw.topology import Cluster, Topology

from _dvfs_fakes import (CONV_SHAPES, FC_SHAPES, FakeModel, kirin_curves, kirin_topology,
                         make_kirin970, read)


# ------------------------------------------------------------------------------ Eq. 2

def test_data_reuse_equation_2():
    assert data_reuse(64, 64, 64) == 32.0  # 2*64^3 / (3 * 64^2 + 64^2)
    m, k, n = 3136, 576, 64
    assert data_reuse(m, k, n) == pytest.approx(2 * m * n * k / (m * k + n * k + 2 * m * n))
    assert data_reuse(m, k, n) == pytest.approx(2 / (1 / n + 1 / m + 2 / k))
    assert data_reuse(1, 4096, 4096) == pytest.approx(2 / (1 + 1 / 4096 + 2 / 4096))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 5000), st.integers(1, 5000))
def test_data_reuse_bounds(m, k, n):
    r = data_reuse(m, k, n)
    assert r == pytest.approx(data_reuse(n, k, m))  # symmetric in M and N
    assert r < min(2 * m, 2 * n, k)  # bounded by the smallest dimension (paper, sec. 4.4)
    if min(m, n) == 1:
        assert r < 2.0  # MV: at most 2


@pytest.mark.parametrize("bad,exc", [((0, 3, 4), ValueError), ((2.5, 3, 4), TypeError),
                                     ((True, 3, 4), TypeError)])
def test_data_reuse_rejects_bad_dims(bad, exc):
    with pytest.raises(exc, match="dimension"):
        data_reuse(*bad)


def test_model_reuse_is_time_weighted():
    shapes = [(3136, 576, 64), (1, 4096, 4096)]
    f, b = 8.8e9, 4.6e9
    s = model_reuse(shapes, peak_flops=f, peak_bytes=b)
    t = [max(2 * m * n * k / f, 4 * (m * k + n * k + 2 * m * n) / b) for m, k, n in shapes]
    r = [data_reuse(*x) for x in shapes]
    assert s.reuse == pytest.approx((t[0] * r[0] + t[1] * r[1]) / sum(t))
    assert s.time_s == pytest.approx(sum(t))
    assert (s.n_mm, s.n_mv) == (1, 1)
    assert s.mv_time_share == pytest.approx(t[1] / sum(t))
    assert s.ridge_reuse == pytest.approx(f / (b / 4))
    # a model object and a plain list give the same answer
    assert model_reuse(FakeModel("m", shapes), peak_flops=f, peak_bytes=b) == s


def test_shapes_are_validated():
    with pytest.raises(ValueError, match="no matmul shapes"):
        model_reuse([])
    with pytest.raises(ValueError, match="op 1"):
        model_reuse([(2, 2, 2), (2, 2)])
    with pytest.raises(TypeError):
        model_reuse("resnet50")
    with pytest.raises(ValueError, match="op 0"):
        model_reuse([(2, -1, 2)])


def test_compute_weight_interpolates_by_reuse():
    assert compute_weight(1.5, 2.0, 8.0) == 0.0
    assert compute_weight(2.0, 2.0, 8.0) == 0.0
    assert compute_weight(4.0, 2.0, 8.0) == pytest.approx(0.5)  # log-linear
    assert compute_weight(8.0, 2.0, 8.0) == 1.0
    assert compute_weight(500.0, 2.0, 8.0) == 1.0


# ------------------------------------------------------------------------ selection

def test_prediction_matches_direct_reference():
    cv = kirin_curves()["big"]
    pred = predict_cluster(cv, CONV_SHAPES)
    assert pred.weight == 1.0
    f_pk, b_pk = cv.peak_flops, cv.peak_bytes
    t_max = sum(max(2 * m * n * k / f_pk, 4 * (m * k + n * k + 2 * m * n) / b_pk)
                for m, k, n in CONV_SHAPES)
    for khz, t, e in zip(pred.freqs_khz, pred.time_s, pred.energy_j):
        tc = cv.compute.time_at(khz) / cv.compute.time_at(cv.fmax_khz)
        assert t == pytest.approx(t_max * tc)
        assert e == pytest.approx(t_max * tc * cv.compute.power_at(khz))


def test_compute_bound_model_gets_a_higher_frequency_than_memory_bound():
    topo = kirin_topology()
    curves = kirin_curves(latency_drop=False)
    conv = plan_frequencies(CONV_SHAPES, "energy", topology=topo, curves=curves)
    fc = plan_frequencies(FC_SHAPES, "energy", topology=topo, curves=curves)
    assert conv.clusters[0]["compute_weight"] == 1.0 and fc.clusters[0]["compute_weight"] == 0
    assert conv.frequencies["big"] > fc.frequencies["big"]
    # and a mix lands in between, moving up monotonically with the compute share
    chosen = []
    for n_fc in (12, 3, 1, 0):
        r = plan_frequencies(CONV_SHAPES + FC_SHAPES * n_fc, "energy", topology=topo,
                             curves=curves)
        chosen.append(r.frequencies["big"])
    assert chosen == sorted(chosen)
    assert fc.frequencies["big"] <= chosen[0] < chosen[-1] == conv.frequencies["big"]


def test_same_holds_on_estimated_curves(tmp_path):
    make_kirin970(tmp_path, opp="debugfs")
    topo = kirin_topology()
    pm = PowerModel.from_system(topo, str(tmp_path))
    curves = estimate_curves(topo, pm)
    assert all(c.source == "estimate" for c in curves.values())
    conv = plan_frequencies(CONV_SHAPES, "energy", topology=topo, curves=curves)
    fc = plan_frequencies(FC_SHAPES, "energy", topology=topo, curves=curves)
    assert conv.frequencies["big"] > fc.frequencies["big"]
    assert conv.estimated and "ESTIMATED" in str(conv)


def test_kirin970_shape_gives_the_papers_choice():
    """Paper, sec. 4.4-6: on the Kirin 970 the least-energy frequency of Conv-dominant models
    is 1.86 GHz on the big cluster with the little cluster fixed at its highest (1.84 GHz);
    memory-bound (RNN / FC) work has its energy drop above 1.86 GHz, where the random-access
    latency drops (Fig. 9b, 10), so it is cheapest at a higher frequency."""
    topo = kirin_topology()
    curves = kirin_curves(latency_drop=True)
    conv = plan_frequencies(FakeModel("ResNet-like", CONV_SHAPES), "energy", topology=topo,
                            curves=curves)
    assert conv.frequencies == {"big": 1863000, "little": 1844000}
    assert [c["fixed_at_max"] for c in conv.clusters] == [False, True]
    rnn = plan_frequencies(FC_SHAPES, "energy", topology=topo, curves=curves)
    assert rnn.frequencies["big"] > 1863000
    assert rnn.frequencies["little"] == 1844000
    # without the latency drop the memory-bound choice falls below 1.86 GHz
    flat = plan_frequencies(FC_SHAPES, "energy", topology=topo,
                            curves=kirin_curves(latency_drop=False))
    assert flat.frequencies["big"] < 1863000
    # latency-first: everything at the maximum
    lat = plan_frequencies(CONV_SHAPES, "latency", topology=topo, curves=curves)
    assert lat.frequencies == {"big": 2362000, "little": 1844000}
    e_lat, e_en = conv.predicted["latency"], conv.predicted["energy"]
    assert e_en["energy_j"] < e_lat["energy_j"] and e_en["time_s"] > e_lat["time_s"]


def test_fixed_clusters_are_configurable():
    topo = kirin_topology()
    curves = kirin_curves()
    free = plan_frequencies(FC_SHAPES, "energy", topology=topo, curves=curves,
                            fixed_at_max=())
    own = least_energy_frequency(predict_cluster(curves["little"], FC_SHAPES))
    assert free.frequencies["little"] == own < 1844000
    assert not free.clusters[1]["fixed_at_max"]
    pinned = plan_frequencies(CONV_SHAPES, "energy", topology=topo, curves=curves,
                              fixed_at_max=[0, "little"])
    assert pinned.frequencies == {"big": 2362000, "little": 1844000}
    with pytest.raises(ValueError, match="no cluster 'mid'"):
        plan_frequencies(CONV_SHAPES, "energy", topology=topo, curves=curves,
                         fixed_at_max=["mid"])
    with pytest.raises(ValueError, match="mode"):
        plan_frequencies(CONV_SHAPES, "fast", topology=topo, curves=curves)


def test_tolerance_prefers_faster_near_ties():
    topo = Topology(clusters=(Cluster("big", (4, 5, 6, 7), 1.0),))
    curves = {"big": kirin_curves()["big"]}
    exact = plan_frequencies(CONV_SHAPES, "energy", topology=topo, curves=curves)
    assert exact.frequencies["big"] == 1863000  # single cluster: not fixed at max
    loose = plan_frequencies(CONV_SHAPES, "energy", topology=topo, curves=curves,
                             tolerance=0.2)
    assert loose.frequencies["big"] > 1863000
    # one cluster: energy-first never predicts more energy than latency-first
    assert exact.predicted["energy"]["energy_j"] <= exact.predicted["latency"]["energy_j"]


def test_report_is_plain_data_and_printable():
    r = plan_frequencies(CONV_SHAPES, "energy", topology=kirin_topology(),
                         curves=kirin_curves())
    d = json.loads(json.dumps(r.to_dict()))
    assert d["mode"] == "energy" and not d["estimated"]
    assert set(d["predicted"]) == {"latency", "energy"}
    text = str(r)
    assert "latency-first" in text and "energy-first" in text and "1863 MHz" in text
    assert "measured" in text and "ESTIMATED" not in text


# --------------------------------------------------------------------- frequency_plan

@pytest.fixture
def kirin_cf(tmp_path):
    paths = make_kirin970(tmp_path, opp="debugfs")
    cf = CpuFreq(kirin_topology(), sysfs_root=str(tmp_path))
    yield cf, paths, tmp_path
    cf.restore()


def test_frequency_plan_applies_and_restores_exactly(kirin_cf):
    cf, paths, root = kirin_cf
    model = FakeModel("ResNet-like", CONV_SHAPES)
    with asymo.frequency_plan(model, mode="energy", cpufreq=cf, curves=kirin_curves()) as plan:
        assert plan.report.applied and plan.frequencies == {"big": 1863000, "little": 1844000}
        assert [(os.path.relpath(p, root), v) for p, v in cf.write_log] == [
            ("devices/system/cpu/cpufreq/policy4/scaling_governor", "userspace"),
            ("devices/system/cpu/cpufreq/policy4/scaling_setspeed", "1863000"),
            ("devices/system/cpu/cpufreq/policy0/scaling_governor", "userspace"),
            ("devices/system/cpu/cpufreq/policy0/scaling_setspeed", "1844000")]
        n = len(cf.write_log)
    assert [(os.path.relpath(p, root), v) for p, v in cf.write_log[n:]] == [
        ("devices/system/cpu/cpufreq/policy4/scaling_governor", "schedutil"),
        ("devices/system/cpu/cpufreq/policy0/scaling_governor", "schedutil")]
    assert not cf.changed


def test_frequency_plan_restores_after_exception(kirin_cf):
    cf, paths, root = kirin_cf
    with pytest.raises(RuntimeError, match="boom"):
        with asymo.frequency_plan(CONV_SHAPES, mode="latency", cpufreq=cf,
                                  curves=kirin_curves()):
            assert read(f"{paths['big']}/scaling_setspeed") == "2362000"
            raise RuntimeError("boom")
    assert read(f"{paths['big']}/scaling_governor") == "schedutil"
    assert read(f"{paths['little']}/scaling_governor") == "schedutil"


def test_frequency_plan_reads_measured_curves_from_the_profile(kirin_cf, tmp_path):
    cf, _, _ = kirin_cf
    prof = Profile.new(cf.topology, path=str(tmp_path / "p.json"))
    prof.sections["energy"] = json.loads(json.dumps(curves_to_section(kirin_curves())))
    plan = asymo.frequency_plan(CONV_SHAPES, cpufreq=cf, profile=prof)
    assert not plan.report.estimated
    assert plan.frequencies == {"big": 1863000, "little": 1844000}
    assert curves_from_section(prof.sections["energy"], cf.topology).keys() == {"big",
                                                                               "little"}
    # a corrupt section is reported and estimated curves are used instead
    prof.sections["energy"]["clusters"]["big"]["compute"]["power_w"] = ["x"]
    with pytest.warns(ProfileWarning, match="unusable"):
        plan = asymo.frequency_plan(CONV_SHAPES, cpufreq=cf, profile=prof)
    assert plan.report.estimated
    assert all(c["curve_source"] == "estimate" for c in plan.report.clusters)


def test_frequency_plan_without_cpufreq_warns_and_runs(tmp_path):
    topo = Topology(clusters=(Cluster("c0", (0, 1), 1.0),))
    cf = CpuFreq(topo, sysfs_root=str(tmp_path))
    plan = asymo.frequency_plan(FC_SHAPES, cpufreq=cf)
    assert plan.report.estimated
    with pytest.warns(DvfsWarning, match="not applied"):
        with plan:
            pass
    assert not plan.report.applied and "no cpufreq policy" in plan.report.applied_reason
    with pytest.raises(CpuFreqError, match="cannot apply"):
        with asymo.frequency_plan(FC_SHAPES, cpufreq=cf, strict=True):
            pass
    assert not os.path.exists(tmp_path / "devices")


def test_default_cpufreq_is_the_live_system():
    # whatever this machine has, planning works and says what it could not do
    plan = asymo.frequency_plan([(1, 256, 256)], mode="latency")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DvfsWarning)
        with plan:
            pass
    assert plan.report.mode == "latency"
    assert all(math.isfinite(v) for v in plan.report.predicted["latency"].values())


def test_clusters_sharing_a_policy_get_one_frequency(tmp_path):
    """An emulated split of a symmetric CPU: two clusters, one cpufreq policy."""
    from _dvfs_fakes import KIRIN_BIG_KHZ, make_policy
    make_policy(str(tmp_path), 0, (4, 5, 6, 7, 0, 1, 2, 3), KIRIN_BIG_KHZ)
    cf = CpuFreq(kirin_topology(), sysfs_root=str(tmp_path))
    curves = kirin_curves()
    curves["little"] = curves["big"].__class__("little", (0, 1, 2, 3), curves["big"].compute,
                                               curves["big"].memory)
    with asymo.frequency_plan(CONV_SHAPES, cpufreq=cf, curves=curves) as plan:
        assert plan.report.applied
        assert read(tmp_path / "devices/system/cpu/cpufreq/policy0/scaling_setspeed") \
            == "2362000"
        assert any("share cpufreq policy" in n for n in plan.report.notes)
        assert [c["applied_khz"] for c in plan.report.clusters] == [2362000, 2362000]
    assert not cf.changed
