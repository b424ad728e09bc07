"""Pipe-it DSE (Algorithms 1-3, Eq. 1-2), the exact DP, and paper 004's two-stage split,
checked against brute force on random instances and against the papers' own numbers."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from asymo.pipeline.configs import CoreConfig, core_configs, stage_cpus
from asymo.pipeline.dse import (bottleneck, design_points, find_split, merge_stage,
                                pipeline_count, work_flow)
from asymo.pipeline.optimal import (StageCost, optimal_partition, optimal_pipeline,
                                    stage_configurations)
from asymo.pipeline.table import LayerTimes
from asymo.pipeline.two_stage import (best_two_stage, candidates, evaluate, pareto_set,
                                      transfer_costs, two_stage_partition)
from asymo.hw.topology import parse_spec


def random_table(rng, W, sizes, *, decreasing=True):
    """A plausible time matrix: per-layer work, clusters slower by a factor, concave
    multi-core speedup, some layers parallelising badly."""
    work = rng.uniform(0.2, 3.0, W)
    if decreasing:
        work = np.sort(work)[::-1] * rng.uniform(0.7, 1.3, W)
    par = rng.uniform(0.3, 1.0, W)  # parallel fraction per layer
    configs, cols = [], []
    for c, h in enumerate(sizes):
        slow = 1.0 + 1.5 * c * rng.uniform(0.8, 1.2)
        for n in range(1, h + 1):
            configs.append(CoreConfig(c, n))
            cols.append(work * slow * ((1 - par) + par / n) + 0.01)
    out_bytes = rng.integers(1_000, 100_000, W).astype(float)
    return LayerTimes(configs, np.stack(cols, axis=1), out_bytes=out_bytes, source="random")


def all_partitions(W, p, allow_empty=True):
    """Every contiguous split of W layers into p stages, as lists of (start, stop)."""
    rng_cuts = range(0, W + 1)
    for cuts in itertools.combinations_with_replacement(rng_cuts, p - 1):
        bounds = (0,) + cuts + (W,)
        L = [(bounds[i], bounds[i + 1]) for i in range(p)]
        if not allow_empty and any(a == b for a, b in L):
            continue
        yield L


# --- Eq. 1 and Eq. 2 -------------------------------------------------------------------------

def test_pipeline_count_matches_paper_hikey970():
    # "There are in total 64 possible pipelines (with p = 2 to 8) ... eight-core"
    assert sum(pipeline_count(p, (4, 4)) for p in range(2, 9)) == 64
    # Eq. 1 as printed, term by term
    HB = Hs = 4
    for p in range(2, 9):
        ref = sum(math.comb(HB - 1, pB - 1) * math.comb(Hs - 1, p - pB - 1)
                  for pB in range(max(1, p - Hs), min(HB, p - 1) + 1))
        assert pipeline_count(p, (HB, Hs)) == ref


def test_design_points_matches_paper_number():
    # Eq. 2 as printed for W = 28; the paper's quoted 5,379,616 is Eq. 2 at W = 29
    ref = sum(math.comb(27, p - 1) * pipeline_count(p, (4, 4)) for p in range(2, 9))
    assert design_points(28, (4, 4)) == ref == 4_272_048
    assert design_points(29, (4, 4)) == 5_379_616


@pytest.mark.parametrize("sizes", [(4, 4), (3, 2), (2, 3, 1), (1, 1), (2, 2, 2)])
def test_pipeline_count_equals_enumeration(sizes):
    per_p = {}
    for stages in stage_configurations(sizes):
        per_p[len(stages)] = per_p.get(len(stages), 0) + 1
    for p in range(1, sum(sizes) + 2):
        assert pipeline_count(p, sizes) == per_p.get(p, 0)


def test_design_points_equals_enumeration_small():
    sizes, W = (2, 2), 5
    n = sum(1 for stages in stage_configurations(sizes) if len(stages) >= 2
            for _ in all_partitions(W, len(stages), allow_empty=False))
    assert design_points(W, sizes) == n


# --- Algorithm 1 ----------------------------------------------------------------------------

def test_find_split_moves_from_the_end_while_helpful():
    t_i = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    t_n = 2 * t_i
    Li, Ln = find_split((0, 5), t_i, t_n)
    # l5: 15-1=14 > 2  move; l4: 14-2=12 > 2+4=6 move; l3: 12-3=9 > 6+6=12? no -> stop
    assert Li == (0, 3) and Ln == (3, 5)


def test_find_split_sub_range_and_nothing_to_move():
    t = np.ones(10)
    assert find_split((4, 4), t, t) == ((4, 4), (4, 4))
    assert find_split((2, 3), t, t) == ((2, 3), (3, 3))  # 0 > 1 fails: keep the layer
    Li, Ln = find_split((2, 8), t, t)
    assert Li == (2, 6) and Ln == (6, 8)  # 5>1, 4>2, then 3>3 fails


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_find_split_stops_exactly_where_the_paper_says(W, seed):
    rng = np.random.default_rng(seed)
    t_i, t_n = rng.uniform(0.1, 2, W), rng.uniform(0.1, 4, W)
    (a, s), (s2, b) = find_split((0, W), t_i, t_n)
    assert a == 0 and b == W and s == s2
    Ti, Tn = t_i[:s].sum(), t_n[s:].sum()
    if s < W:  # the last move was helpful when made
        assert Ti > Tn - 1e-12
    if s > 0:  # the next move would not be
        assert not (Ti - t_i[s - 1] > Tn + t_n[s - 1])


# --- Algorithm 2 ----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.integers(2, 20), st.sampled_from([(2, 2), (4, 4), (3, 1), (1, 1, 1)]),
       st.integers(0, 2**31 - 1))
def test_work_flow_reaches_a_fixed_point(W, sizes, seed):
    rng = np.random.default_rng(seed)
    table = random_table(rng, W, sizes)
    P = [CoreConfig(c, 1) for c, h in enumerate(sizes) for _ in range(h)]
    L = work_flow(P, (0, W), table)
    assert L[0][0] == 0 and L[-1][1] == W
    assert all(L[i][1] == L[i + 1][0] for i in range(len(L) - 1))
    # one more sweep of Algorithm 1 over the stages changes nothing (or we stopped on a cycle
    # at its best state, which cannot be worse than the first sweep's result)
    L2 = list(L)
    for i in range(len(P) - 1):
        L2[i], L2[i + 1] = find_split((L2[i][0], L2[i + 1][1]), table.T(P[i]), table.T(P[i + 1]))
    assert L2 == L or bottleneck(P, L, table) <= bottleneck(P, L2, table) + 1e-12


def test_work_flow_literal_strict_inequality_on_equal_layers():
    # Algorithm 1 moves a layer only if P_i stays strictly slower afterwards, so 12 equal
    # layers over 3 equal stages settle at 6-4-2, not 4-4-4: the DP measures this gap.
    table = LayerTimes([CoreConfig(0, 1)], np.ones((12, 1)))
    P = [CoreConfig(0, 1)] * 3
    L = work_flow(P, (0, 12), table)
    assert [b - a for a, b in L] == [6, 4, 2]
    assert optimal_partition(P, table)[0] == 4.0


# --- Algorithm 3 ----------------------------------------------------------------------------

def test_merge_stage_resnet50_shaped_example():
    """The worked example of Sect. VI-D: 54 layers, 4 Big + 4 Small cores. The paper's time
    matrix is not published, so we use a ResNet50-shaped one and check the steps the text
    describes: an 8-stage start whose last stages starve, a first merge of P1 and P2 into
    (B, 2), growth of that stage, then the Small cluster, and a final pipeline that the
    optimum of the same stage configuration cannot beat by much."""
    rng = np.random.default_rng(5)
    W = 54
    work = np.concatenate([np.linspace(3.0, 1.0, 20), np.linspace(1.2, 0.5, 33), [0.2]])
    par = np.clip(0.95 - 0.4 * np.arange(W) / W + rng.uniform(-0.05, 0.05, W), 0.3, 0.99)
    cfgs, cols = [], []
    for c, slow in ((0, 1.0), (1, 2.6)):
        for n in range(1, 5):
            cfgs.append(CoreConfig(c, n))
            cols.append(work * slow * ((1 - par) + par / n))
    table = LayerTimes(cfgs, np.stack(cols, 1))
    P8 = [CoreConfig(0, 1)] * 4 + [CoreConfig(1, 1)] * 4
    L8 = work_flow(P8, (0, W), table)
    assert len(L8) == 8 and L8[0] == (0, L8[1][0])
    res = merge_stage((0, W), (4, 4), table)
    first = res.trace[0]
    assert first[0] == 0 and first[1] == 0 and first[2] == CoreConfig(0, 2) and first[3]
    assert sum(s.count for s in res.P) == 8
    assert [s.cluster for s in res.P] == sorted(s.cluster for s in res.P)
    v_opt, _ = optimal_partition(res.P, table)
    assert bottleneck(res.P, res.L, table) <= 1.25 * v_opt
    assert bottleneck(res.P, res.L, table) < bottleneck(P8, L8, table)


def test_merge_stage_on_reject_advance_vs_break():
    """Table V has B2-B2 pipelines: after B1+B1 -> B2 and a rejected B2+B1 -> B3, the next
    pair B1+B1 must still be tried ("advance"); the literal "break" cannot produce B2-B2."""
    W = 8
    # layers that scale to 2 cores but not beyond; Small cluster useless
    t1 = np.full(W, 1.0)
    cfgs = [CoreConfig(0, 1), CoreConfig(0, 2), CoreConfig(0, 3), CoreConfig(0, 4),
            CoreConfig(1, 1)]
    cols = [t1, t1 / 2, t1 / 1.2, t1 / 1.1, t1 * 100]
    table = LayerTimes(cfgs, np.stack(cols, 1))
    adv = merge_stage((0, W), (4, 1), table)
    brk = merge_stage((0, W), (4, 1), table, on_reject="break")
    assert adv.P[:2] == [CoreConfig(0, 2), CoreConfig(0, 2)]
    assert brk.P[:3] == [CoreConfig(0, 2), CoreConfig(0, 1), CoreConfig(0, 1)]
    assert bottleneck(adv.P, adv.L, table) < bottleneck(brk.P, brk.L, table)


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 16), st.sampled_from([(2, 2), (3, 2), (2, 1, 2)]),
       st.integers(0, 2**31 - 1))
def test_heuristic_never_beats_the_optimum(W, sizes, seed):
    rng = np.random.default_rng(seed)
    table = random_table(rng, W, sizes)
    res = merge_stage((0, W), sizes, table)
    h = bottleneck(res.P, res.L, table)
    v_fixed, _ = optimal_partition(res.P, table)
    opt = optimal_pipeline(table, sizes)
    assert opt.value <= v_fixed + 1e-12 <= h + 2e-12
    assert math.isclose(bottleneck(opt.P, opt.L, table), opt.value, rel_tol=1e-9)


# --- the exact DP ---------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.booleans(), st.sampled_from(["max", "sum"]),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_optimal_partition_equals_brute_force(W, p, allow_empty, combine, transfer, seed):
    if not allow_empty and p > W:
        return
    rng = np.random.default_rng(seed)
    table = random_table(rng, W, (4, 3), decreasing=False)
    stages = [table.configs[i] for i in rng.integers(0, len(table.configs), p)]
    k = {c: float(rng.uniform(0, 2e-5)) for c in table.configs} if transfer else None
    cost = StageCost(table, transfer_k=k)
    v, L = optimal_partition(stages, table, combine=combine, allow_empty=allow_empty,
                             cost=cost)
    op = max if combine == "max" else sum
    ref = min(op([cost(s, a, b) for s, (a, b) in zip(stages, LL)])
              for LL in all_partitions(W, p, allow_empty))
    assert math.isclose(v, ref, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(op([cost(s, a, b) for s, (a, b) in zip(stages, L)]), v, rel_tol=1e-9)
    assert L[0][0] == 0 and L[-1][1] == W


def test_optimal_pipeline_equals_brute_force_small():
    rng = np.random.default_rng(3)
    W, sizes = 6, (2, 2)
    table = random_table(rng, W, sizes)
    best = min(bottleneck(P, L, table) for P in stage_configurations(sizes)
               for L in all_partitions(W, len(P)))
    assert math.isclose(optimal_pipeline(table, sizes).value, best, rel_tol=1e-12)


def test_optimal_pipeline_refuses_huge_spaces():
    table = LayerTimes([CoreConfig(0, n) for n in range(1, 13)], np.ones((4, 12)))
    with pytest.raises(ValueError, match="merge_stage"):
        optimal_pipeline(table, (12,), max_configurations=100)


# --- paper 004 Algorithm 1 --------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_two_stage_partition_equals_brute_force(N, seed):
    rng = np.random.default_rng(seed)
    t0, t1 = rng.uniform(0.1, 3, N), rng.uniform(0.1, 3, N)
    B = rng.uniform(0, 1e5, N)
    k0, k1 = 1e-6, 3e-6
    r = two_stage_partition(t0, t1, k0 * B, k1 * B, devices=("gpu", "cpu"))
    ref = []
    for (a, ta, ka), (b, tb, kb) in itertools.permutations(
            [("gpu", t0, k0), ("cpu", t1, k1)], 2):
        for i in range(N):
            ref.append((max(ta[:i + 1].sum() + ka * B[i], tb[i + 1:].sum() + kb * B[i]),
                        i, a, b))
    best = min(ref, key=lambda x: x[0])
    assert math.isclose(r.t, best[0], rel_tol=1e-9)
    assert math.isclose(max((t0 if r.h0 == "gpu" else t1)[:r.n + 1].sum()
                            + (k0 if r.h0 == "gpu" else k1) * B[r.n],
                            (t1 if r.h1 == "cpu" else t0)[r.n + 1:].sum()
                            + (k1 if r.h1 == "cpu" else k0) * B[r.n]), r.t, rel_tol=1e-9)


def test_two_stage_transfer_cost_moves_the_cut_to_a_small_activation():
    t = np.ones(6)
    B = np.array([10, 10, 1e6, 10, 10, 10], float)
    free = two_stage_partition(t, t)
    assert free.n == 2  # 3 + 3
    costly = two_stage_partition(t, t, 1e-5 * B, 1e-5 * B)
    assert costly.n != 2 and costly.t < 3 + 10  # avoids the 1 MB cut


def test_best_two_stage_over_clusters_matches_dp_with_transfer():
    rng = np.random.default_rng(7)
    table = random_table(rng, 15, (2, 2))
    k = {c: 1e-6 for c in table.configs}
    r, P, L = best_two_stage(table, (2, 2), transfer_k=k)
    cost = StageCost(table, transfer_k=k)
    best = float("inf")
    for a in table.configs:
        for b in table.configs:
            if a == b or (a.cluster == b.cluster and a.count + b.count > 2):
                continue
            v, _ = optimal_partition((a, b), table, cost=cost, allow_empty=False)
            best = min(best, v, cost(a, 0, 15))
    assert math.isclose(r.t, best, rel_tol=1e-9)
    assert math.isclose(evaluate(P, L, table, transfer_k=k).period, r.t, rel_tol=1e-9)


def test_pareto_set_is_exactly_the_non_dominated_candidates():
    rng = np.random.default_rng(11)
    table = random_table(rng, 10, (2, 2))
    power = {c: (1.0 if c.cluster == 0 else 0.25) * c.count for c in table.configs}
    cands = candidates(table, (2, 2))
    front = pareto_set(cands, table=table, power=power)
    ms = [evaluate(P, L, table, power=power) for P, L in cands]
    fm = [m for _, _, m in front]

    def dom(x, y):
        return all(a <= b for a, b in zip(x, y)) and tuple(x) != tuple(y)

    for m in fm:
        assert not any(dom(o, m) for o in ms)
    for m in ms:
        assert any(dom(f, m) or tuple(f) == tuple(m) for f in fm)
    # the extremes are in the front
    assert min(m.period for m in ms) == min(m.period for m in fm)
    assert min(m.latency for m in ms) == min(m.latency for m in fm)
    assert min(m.energy for m in ms) == min(m.energy for m in fm)


def test_transfer_costs_no_cut_after_last_layer():
    table = LayerTimes([CoreConfig(0, 1)], np.ones((3, 1)), out_bytes=[4, 8, 16])
    assert transfer_costs(table, 2.0).tolist() == [8, 16, 0]


# --- configs --------------------------------------------------------------------------------

def test_core_configs_and_stage_cpus():
    top = parse_spec("big:0-3@1.0,little:4-7@0.45")
    assert len(core_configs(top)) == 8
    stages = (CoreConfig(0, 4), CoreConfig(1, 2), CoreConfig(1, 2))
    assert stage_cpus(stages, top) == [(0, 1, 2, 3), (4, 5), (6, 7)]
    with pytest.raises(ValueError, match="uses 5 cores|use 5 cores"):
        stage_cpus((CoreConfig(1, 3), CoreConfig(1, 2)), top)
    with pytest.raises(ValueError, match="cluster 2"):
        stage_cpus((CoreConfig(2, 1),), top)
    with pytest.raises(ValueError):
        CoreConfig(0, 0)


def test_layer_times_validation_and_roundtrip():
    t = LayerTimes([CoreConfig(0, 1), CoreConfig(1, 1)], [[1, 2], [3, 4]], out_bytes=[5, 6],
                   source="measured")
    t2 = LayerTimes.from_dict(t.to_dict())
    assert np.array_equal(t2.times, t.times) and t2.configs == t.configs
    with pytest.raises(ValueError, match="shape"):
        LayerTimes([CoreConfig(0, 1)], [[1, 2]])
    with pytest.raises(ValueError, match="finite"):
        LayerTimes([CoreConfig(0, 1)], [[float("nan")]])
    with pytest.raises(KeyError, match="no times"):
        t.T(CoreConfig(0, 2))
