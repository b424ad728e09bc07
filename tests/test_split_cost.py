"""asymo.plan.split_cost: when a slower cluster's share pays, and the planners that use the rule."""
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asymo
from asymo.plan import gemm as gp
from asymo.plan import split_cost as sc
from asymo.hw.topology import parse_spec

REAL = parse_spec("big:0@1.0,little:1@0.5")            # a real big.LITTLE: no duty cycle
EMU = REAL.replace(emulated={1: 0.5})                   # cpu 1 slowed by the emulator
ONE = parse_spec("all:0-1@1.0")


@pytest.fixture(autouse=True)
def _no_emulation_env(monkeypatch):
    monkeypatch.delenv(sc.PERIOD_ENV_VAR, raising=False)


def reference_gain(flops, rates, overhead):
    """Time alone on cluster 0 minus time split over all clusters plus the overhead."""
    return flops / rates[0] - (flops / sum(rates) + overhead)


def crossover(topology, kind, period=None):
    lo, hi = 1.0, 1e13
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if sc.fastest_only(mid, topology, kind, period=period):
            lo = mid
        else:
            hi = mid
    return lo


def test_one_cluster_never_restricts():
    assert not sc.fastest_only(1.0, ONE)
    assert sc.split_gain(1e9, ONE) == 0.0
    assert not sc.fastest_only(1.0, None)


def test_tail_is_zero_for_real_cores_and_the_duty_cycle_for_emulated_ones():
    assert sc.tail_s(REAL, 1) == 0.0
    assert sc.tail_s(EMU, 0) == 0.0
    assert sc.tail_s(EMU, 1, period=1e-3) == pytest.approx(sc.TAIL_CATCH * 0.25 * 1e-3 / 2)
    slower = REAL.replace(emulated={1: 0.25})
    assert sc.tail_s(slower, 1, period=1e-3) == pytest.approx(
        sc.TAIL_CATCH * 0.75 ** 2 * 1e-3 / 2)


def test_period_comes_from_the_emulator_environment(monkeypatch):
    assert sc.emulated_period() is None
    monkeypatch.setenv(sc.PERIOD_ENV_VAR, "0.00025")
    assert sc.emulated_period() == 2.5e-4
    assert sc.tail_s(EMU, 1) == pytest.approx(sc.tail_s(EMU, 1, period=2.5e-4))
    for bad in ("", "abc", "-1", "nan", "inf"):
        monkeypatch.setenv(sc.PERIOD_ENV_VAR, bad)
        assert sc.emulated_period() is None   # ignored: the default period is assumed
    from asymo.lab.emulate import DEFAULT_PERIOD
    assert sc.tail_s(EMU, 1) == pytest.approx(sc.tail_s(EMU, 1, period=DEFAULT_PERIOD))


@pytest.mark.parametrize("kind", sorted(sc.DEFAULT_RATE))
@pytest.mark.parametrize("topology,period", [(REAL, None), (EMU, 1e-3), (EMU, 2.5e-4)])
def test_gain_matches_the_reference_formula(kind, topology, period):
    rates = [sc.DEFAULT_RATE[kind] * 1.0, sc.DEFAULT_RATE[kind] * 0.5]
    overhead = sc.SYNC_S + sc.tail_s(topology, 1, period)
    for flops in (1e5, 1e6, 1e7, 1e8, 1e9):
        assert sc.split_gain(flops, topology, kind, period=period) == pytest.approx(
            reference_gain(flops, rates, overhead))
    # the crossover: flops / R0 * (1 - R0 / (R0 + R1)) == overhead
    r0, r1 = rates
    expected = overhead * r0 * (r0 + r1) / r1
    assert crossover(topology, kind, period) == pytest.approx(expected, rel=0.01)


@settings(max_examples=40, deadline=None)
@given(st.floats(1e3, 1e11), st.floats(1e3, 1e11), st.sampled_from(sorted(sc.DEFAULT_RATE)))
def test_more_work_never_makes_the_split_worse(f1, f2, kind):
    lo, hi = sorted((f1, f2))
    assert sc.split_gain(hi, EMU, kind, period=1e-3) >= sc.split_gain(lo, EMU, kind,
                                                                       period=1e-3)
    if sc.fastest_only(hi, EMU, kind, period=1e-3):
        assert sc.fastest_only(lo, EMU, kind, period=1e-3)


def test_a_shorter_period_or_a_faster_little_core_lowers_the_threshold():
    assert (crossover(EMU, "mm", 2.5e-4) < crossover(EMU, "mm", 1e-3)
            < crossover(REAL.replace(emulated={1: 0.25}), "mm", 1e-3))
    assert crossover(REAL, "mm") < crossover(EMU, "mm", 1e-4)


def test_active_workers_and_calibrated_rates_are_used():
    # no active worker on the slow cluster: nothing to split
    assert sc.split_gain(1e9, REAL, "mm", active=[1, 0]) == 0.0
    cal = SimpleNamespace(
        capability=lambda kind: {"mm": [100.0, 10.0], "mv": [20.0, 10.0]}[kind],
        clusters=(SimpleNamespace(threads=1), SimpleNamespace(threads=1)))
    assert sc.cluster_rates(REAL, "mm", calibration=cal) == [100e9, 10e9]
    gain = sc.split_gain(1e8, REAL, "mm", calibration=cal)
    assert gain == pytest.approx(reference_gain(1e8, [100e9, 10e9], sc.SYNC_S))
    with pytest.raises(ValueError, match="kind"):
        sc.cluster_rates(REAL, "conv")


def test_matmul_plans_follow_the_rule(monkeypatch):
    monkeypatch.setenv(sc.PERIOD_ENV_VAR, "0.001")
    small, big = crossover(EMU, "mm") / 3, crossover(EMU, "mm") * 3
    n_small = round((small / 2) ** (1 / 3))
    n_big = round((big / 2) ** (1 / 3))
    p = gp.plan_gemm(n_small, n_small, n_small, "float32", topology=EMU)
    assert p.kind == "mm" and p.cluster_ranges[1][1] == p.cluster_ranges[1][0]
    p = gp.plan_gemm(n_big, n_big, n_big, "float32", topology=EMU)
    assert p.cluster_ranges[1][1] > p.cluster_ranges[1][0]
    # matrix-vector products: their own rate
    mv_cross = crossover(EMU, "mv")
    m = 4096
    k_small = int(mv_cross / 3 / (2 * m))
    k_big = int(mv_cross * 3 / (2 * m))
    p = gp.plan_gemm(m, k_small, 1, "float32", topology=EMU)
    assert p.kind == "mv" and p.cluster_ranges[1][1] == p.cluster_ranges[1][0]
    p = gp.plan_gemm(m, k_big, 1, "float32", topology=EMU)
    assert p.kind == "mv" and p.cluster_ranges[1][1] > p.cluster_ranges[1][0]
    # a shorter emulator period splits a product the 1 ms period keeps on the fast cluster
    n_mid = round((crossover(EMU, "mm", 1e-3) * 0.8 / 2) ** (1 / 3))
    assert sc.fastest_only(2.0 * n_mid ** 3, EMU, "mm", period=1e-3)
    assert not sc.fastest_only(2.0 * n_mid ** 3, EMU, "mm", period=1e-4)
    monkeypatch.setenv(sc.PERIOD_ENV_VAR, "0.0001")
    p = gp.plan_gemm(n_mid, n_mid, n_mid, "float32", topology=EMU)
    assert p.cluster_ranges[1][1] > p.cluster_ranges[1][0]


@pytest.fixture(scope="module")
def emu_pool():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    topo = parse_spec(f"big:{cpus[0]}@1.0,little:{cpus[1]}@0.5").replace(
        emulated={cpus[1]: 0.5})
    with asymo.Pool(topology=topo) as pool:
        yield pool


@pytest.mark.parametrize("shape", [(64, 64, 64), (128, 200, 96), (300, 300, 300),
                                   (1000, 700, 1), (4096, 1024, 1), (1, 900, 2000)])
def test_results_match_numpy_either_side_of_the_threshold(shape, emu_pool, monkeypatch):
    monkeypatch.setenv(sc.PERIOD_ENV_VAR, "0.001")
    M, K, N = shape
    rng = np.random.default_rng(M + K + N)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    got = asymo.matmul(a, b, pool=emu_pool)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4 * math.sqrt(K))
