"""asymo.lab.sim.costs: simulator task costs from AsyMo's cost model, against hand-worked numbers."""
import json
import math
import pickle

import numpy as np
import pytest

from asymo.plan import costmodel as cm
from asymo.plan import gemm as gp
from asymo.lab import scaling
from asymo.lab import sim
from asymo.cli import main
from asymo.lab.sim.costs import (ModelCosts, fixed_cost, gemm_task_costs, load_model_costs,
                             share_settings)
from asymo.hw.topology import parse_spec

TWO = parse_spec("big:0-1@1.0,little:2-3@0.5")

# Table 2 coefficients (t_comp, t_data, p*t_comp, p*t_data, t_sched) and intercept t_fram
BIG = cm.CostPredictor(features="table2", coef=[1e-9, 0, 0, 0, 1e-7], intercept=2e-5)
LITTLE = cm.CostPredictor(features="table2", coef=[2e-9, 0, 0, 0, 1e-7], intercept=-1e-5)


def _plan(ranges, blocks, shape=(96, 64, 32), split_dim="M", kind="mm", chunks=None,
          serial=False):
    return gp.GemmPlan(shape=shape, dtype="float32", kind=kind, split_dim=split_dim,
                       cluster_ranges=ranges, blocks=blocks,
                       chunks=chunks or (1,) * len(ranges), isa=gp.best_isa(), serial=serial)


def test_task_costs_equal_hand_worked_values():
    # C is 96 x 32, K = 64. big takes rows [0, 64) in 16 x 32 blocks: 4 tasks; little rows
    # [64, 96): 2 tasks. One task: mc*nc*kc = 16*32*64 = 32768 multiply-adds, one K panel.
    plan = _plan(((0, 64), (64, 96)), ((16, 32, 64), (16, 32, 64)))
    assert plan.task_counts() == (4, 2)
    costs = gemm_task_costs(plan, [BIG, LITTLE], [2, 2])
    # big's share on big (T=2): par_flop = 4/2 * 32768 = 65536 -> 65.536 us, t_sched * 4
    # tasks = 0.4 us; the intercept (20 us) is a per-call cost, not task time; 4 tasks on
    # 2 cores = 2 waves -> (65.536 + 0.4) / 2 = 32.968 us per task.
    # big's share on little (T=2): 2e-9 * 65536 + 0.4 us = 131.472 us, and little's
    # negative intercept (-10 us) is no cost: it stays -> (131.472 - 10) / 2 = 60.736 us.
    # little's share (2 tasks, one wave): on big 32.768 + 0.2 = 32.968 us (the same block
    # costs the same on big, whichever share it belongs to), on little 65.536 + 0.2 - 10 =
    # 55.736 us.
    expect = np.array([[32.968e-6, 60.736e-6]] * 4 + [[32.968e-6, 55.736e-6]] * 2)
    np.testing.assert_allclose(costs, expect, rtol=1e-12)


def test_fixed_cost_per_kind():
    ext = cm.CostPredictor(features="extended", coef=np.arange(12) * 1e-6, intercept=-3e-4)
    assert fixed_cost(ext, 0) == -3e-4
    # the extended model's skinny-path indicator is a constant of "mv" settings
    assert fixed_cost(ext, 1) == pytest.approx(-3e-4 + 8e-6)
    assert fixed_cost(BIG, 1) == fixed_cost(BIG, 0) == 2e-5


def test_waves_when_threads_do_not_divide_tasks():
    plan = _plan(((0, 64), (64, 96)), ((16, 32, 64), (16, 32, 64)))
    costs = gemm_task_costs(plan, [BIG, LITTLE], [3, 1])
    # big's 4 tasks on big's 3 cores: par_flop = 4/3 * 32768, 2 waves
    big_on_big = (1e-9 * 4 / 3 * 32768 + 4e-7) / 2
    # ... on little's 1 core: par_flop = 4 * 32768, 4 waves, little's intercept kept
    big_on_little = (2e-9 * 4 * 32768 + 4e-7 - 1e-5) / 4
    assert big_on_big == pytest.approx(22.045333e-6, rel=1e-6)
    assert big_on_little == pytest.approx(63.136e-6, rel=1e-9)
    # little's 2 tasks: on big's 3 cores one wave of par_flop 2/3 * 32768; on little 2 waves
    lit_on_big = 1e-9 * 2 / 3 * 32768 + 2e-7
    lit_on_little = (2e-9 * 2 * 32768 + 2e-7 - 1e-5) / 2
    np.testing.assert_allclose(costs[:4], [[big_on_big, big_on_little]] * 4, rtol=1e-12)
    np.testing.assert_allclose(costs[4:], [[lit_on_big, lit_on_little]] * 2, rtol=1e-12)


@pytest.mark.parametrize("rows", [96, 80])     # 6 tasks (3 waves) and 5 tasks (3 waves)
def test_one_cluster_alone_reproduces_the_prediction(rows):
    # the divisor ceil(n/T) makes a cluster running its share alone (no simulator overheads)
    # take exactly what its model predicts, less a positive intercept (per-call cost)
    t = parse_spec("a:0-1@1.0")
    plan = _plan(((0, rows),), ((16, 32, 64),), shape=(rows, 64, 32))
    for model, less in ((BIG, BIG.intercept), (LITTLE, 0.0)):
        costs = gemm_task_costs(plan, [model], [2])
        r = sim.simulate(t, sim.Job(costs=costs, split=list(plan.task_counts())),
                         policy="asymo", overheads=sim.Overheads())
        pred = model.predict([[rows, 64, 32, 16, 32, 64, 2, 0]])[0]
        assert r.makespan == pytest.approx(pred - less, rel=1e-12)


def test_a_flop_rate_model_gives_the_capability_costs():
    # t_comp = 2 / (g * 1e9) per multiply-add and nothing else is the capability path's flat
    # g GFLOP/s; where T divides the task count both paths agree exactly
    g = [10.0, 4.0]
    flat = [cm.CostPredictor(features="table2", coef=[2 / (x * 1e9), 0, 0, 0, 0], intercept=0)
            for x in g]
    plan = _plan(((0, 64), (64, 96)), ((16, 32, 64), (16, 32, 64)))
    costs = gemm_task_costs(plan, flat, [2, 2])
    per_task_flops = 2.0 * 16 * 32 * 64
    np.testing.assert_allclose(costs, [[per_task_flops / (x * 1e9) for x in g]] * 6,
                               rtol=1e-12)


def test_skinny_and_serial_plans():
    # mv split along M (N = 2): a task is `chunk` rows over all of K
    plan = _plan(((0, 128), (128, 192)), ((1, 1, 1), (1, 1, 1)), shape=(192, 64, 2),
                 kind="mv", chunks=(64, 32))
    shares = share_settings(plan)
    assert shares == [([128, 64, 2, 64, 2, 64, 0, 1], 2), ([64, 64, 2, 32, 2, 64, 0, 1], 2)]
    # little's share on little: 2e-9 * (2/2 * 32*2*64) + 2e-7 - 10 us < 0: LITTLE's negative
    # intercept makes it predict no time for so small a share -> not covered
    assert gemm_task_costs(plan, [BIG, LITTLE], [2, 2]) is None
    costs = gemm_task_costs(plan, [BIG, BIG], [2, 2])
    # big's share: par_flop = (128/64 * 1)/2 * 64*2*64 = 8192, 2 tasks -> 1 wave
    assert costs[0, 0] == pytest.approx(1e-9 * 8192 + 2e-7, rel=1e-12)
    # little's: par_flop = (64/32)/2 * 32*2*64 = 4096
    assert costs[3, 1] == pytest.approx(1e-9 * 4096 + 2e-7, rel=1e-12)
    # serial: the calling thread, alone (T = 1), the whole product with cluster 0's blocks
    plan = _plan(((0, 96), (96, 96)), ((16, 32, 64), (16, 32, 64)), serial=True)
    costs = gemm_task_costs(plan, [BIG, LITTLE], [2, 2])
    assert costs.shape == (1, 2)
    np.testing.assert_allclose(costs[0], [1e-9 * 96 * 32 * 64 + 1e-7 * 6,
                                          2e-9 * 96 * 32 * 64 + 1e-7 * 6 - 1e-5], rtol=1e-12)


def test_not_covered_falls_back():
    outer = _plan(((0, 64), (64, 96)), ((16, 32, 1), (16, 32, 1)), shape=(96, 1, 32),
                  kind="outer", chunks=(16, 16))
    assert gemm_task_costs(outer, [BIG, LITTLE], [2, 2]) is None
    # a fit that predicts no positive time for the setting (extrapolated) is not used
    negative = cm.CostPredictor(features="table2", coef=[-1e-9, 0, 0, 0, 0], intercept=1.0)
    plan = _plan(((0, 64), (64, 96)), ((16, 32, 64), (16, 32, 64)))
    assert gemm_task_costs(plan, [BIG, negative], [2, 2]) is None
    mc = ModelCosts([BIG, negative], TWO)
    assert mc.gemm_job(plan, TWO) is None
    assert (mc.jobs_model, mc.jobs_capabilities) == (0, 1)
    mc = ModelCosts([BIG, LITTLE], TWO)
    job = mc.gemm_job(plan, TWO, name="p")
    assert job.split == [4, 2] and job.costs.shape == (6, 2)
    assert (mc.jobs_model, mc.jobs_capabilities) == (1, 0)
    with pytest.raises(ValueError, match="2 clusters but 1 models"):
        gemm_task_costs(plan, [BIG], [2])


def test_sub_topologies_use_the_prefix_of_the_models():
    mc = ModelCosts([BIG, LITTLE], TWO)
    first3 = sim.first_cores(TWO, 3)
    assert mc.models_for(first3) == (BIG, LITTLE)
    assert mc.models_for(sim.first_cores(TWO, 1)) == (BIG,)
    with pytest.raises(ValueError, match="not part of"):
        mc.models_for(parse_spec("big:4-5@1.0"))
    with pytest.raises(ValueError, match="2 cost models for a topology of 1"):
        ModelCosts([BIG, LITTLE], parse_spec("a:0-1@1.0"))


# ---------------------------------------------------------------------------------------------
# profiles
# ---------------------------------------------------------------------------------------------
def _section(topology, models):
    return {
        "schema": 1, "dtype": "float32", "isa": gp.best_isa(), "tile": [6, 16],
        "load_source": "proc_stat", "topology": topology.to_spec(),
        "clusters": [{
            "name": c.name, "cpus": list(c.cpus), "threads": c.ncpus,
            "model": m.to_dict(), "model_name": "table2",
            "capability_gflops": {"mm": 10.0, "mv": 5.0},
            "cache": {"l1_bytes": 32768, "l2_bytes": 1 << 20, "l2_sharing": c.ncpus, "mr": 6,
                      "nr": 16, "itemsize": 4, "unit": 16}}
            for c, m in zip(topology.clusters, models)]}


def _write_profile(path, topology, models, **section_updates):
    sec = _section(topology, models)
    sec.update(section_updates)
    doc = {"format": "asymo-profile", "version": 1, "fingerprint": "0123456789abcdef",
           "cpu": {"model": "some phone"}, "sections": {"gemm": sec}}
    path.write_text(json.dumps(doc))
    return path


def test_profile_from_another_device_loads(tmp_path):
    p = _write_profile(tmp_path / "dev.json", TWO, [BIG, LITTLE])
    mc = load_model_costs(p, TWO)
    assert mc.models[0].to_dict() == BIG.to_dict() and mc.names == ("table2", "table2")
    assert mc.to_dict()["clusters"][1]["fixed_s"] == {"mm": -1e-5, "mv": -1e-5}


@pytest.mark.parametrize("target, match", [
    ("big:0-1@1.0", "2 clusters, the topology 1"),
    ("big:0-2@1.0,little:3@0.5", r"cluster 'big': the profile's cpus \[0, 1\] differ"),
])
def test_mismatched_profile_names_the_mismatch(tmp_path, target, match):
    p = _write_profile(tmp_path / "dev.json", TWO, [BIG, LITTLE])
    with pytest.raises(ValueError, match=match) as e:
        load_model_costs(p, parse_spec(target))
    # both topologies are named
    assert TWO.to_spec() in str(e.value) and parse_spec(target).to_spec() in str(e.value)


def test_corrupt_or_foreign_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model_costs(bad, TWO)
    pick = tmp_path / "p.pkl"
    pick.write_bytes(pickle.dumps({"format": "asymo-profile"}))
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model_costs(pick, TWO)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not an asymo calibration profile"):
        load_model_costs(other, TWO)
    nogemm = tmp_path / "nogemm.json"
    nogemm.write_text(json.dumps({"format": "asymo-profile", "version": 1, "sections": {}}))
    with pytest.raises(ValueError, match="no GEMM calibration"):
        load_model_costs(nogemm, TWO)
    broken = _write_profile(tmp_path / "broken.json", TWO, [BIG, LITTLE])
    doc = json.loads(broken.read_text())
    doc["sections"]["gemm"]["clusters"][1]["model"]["coef"] = [1.0]
    broken.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="cluster 'little'"):
        load_model_costs(broken, TWO)
    f64 = _write_profile(tmp_path / "f64.json", TWO, [BIG, LITTLE], dtype="float64")
    with pytest.raises(ValueError, match="float64"):
        load_model_costs(f64, TWO)
    with pytest.raises(ValueError, match="cannot read"):
        load_model_costs(tmp_path / "missing.json", TWO)


# ---------------------------------------------------------------------------------------------
# through simulate_scaling and the CLI
# ---------------------------------------------------------------------------------------------
# little is 4x slower than big by its model; the capabilities (10 x capacity) say 2x
SLOW_LITTLE = cm.CostPredictor(features="table2", coef=[8e-10, 0, 0, 0, 0], intercept=0)
FAST_BIG = cm.CostPredictor(features="table2", coef=[2e-10, 0, 0, 0, 0], intercept=0)


def _sweep(**kw):
    wls = [scaling.SpinWorkload(ntasks=32, iters=1000),
           scaling.MatmulWorkload(shapes=((256, 256, 256),))]
    return scaling.simulate_scaling(TWO, wls, policies=["asymo", "even"], **kw)


def test_simulate_scaling_with_cost_models():
    mc = ModelCosts([FAST_BIG, SLOW_LITTLE], TWO, source="synthetic")
    a, b = _sweep(cost_models=mc), _sweep(cost_models=mc)
    cap = _sweep()
    pts = lambda r: {(p.workload, p.policy, p.cores): p.throughput for p in r.points}
    assert pts(a) == pts(b)                                   # deterministic
    pa, pc = pts(a), pts(cap)
    for key in pa:
        if key[0] == "spin":                                  # not a GEMM: capabilities
            assert pa[key] == pc[key]
        elif key[2] <= 2:
            # big's model, 2e-10 s per multiply-add, is its capability (10 GFLOP/s per core)
            assert pa[key] == pytest.approx(pc[key], rel=1e-9)
        else:
            # with the little cores: the model says 4x slower, the capabilities 2x
            assert pa[key] < 0.85 * pc[key]
    # the even split waits for a little core 4x slower (the capabilities say 2x)
    assert pa[("matmul", "even", 4)] < 0.75 * pc[("matmul", "even", 4)]
    tc = a.meta["task_costs"]
    assert tc["source"] == "synthetic" and tc["jobs_from_model"] > 0
    assert "cost model from synthetic" in a.meta["model"]
    assert cap.meta["task_costs"] == "capabilities"
    assert "task costs: capabilities" in cap.table()


def test_simulate_scaling_rejects_a_profile_for_another_topology(tmp_path):
    p = _write_profile(tmp_path / "dev.json", parse_spec("a:0-3@1.0"), [BIG])
    with pytest.raises(ValueError, match="does not fit the simulated topology.*1 clusters"):
        _sweep(cost_models=str(p))


def _cli(capsys, *argv):
    rc = main(["bench", "scaling", "--no-progress", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_sim_profile(tmp_path, capsys):
    p = _write_profile(tmp_path / "dev.json", TWO, [FAST_BIG, SLOW_LITTLE])
    js = tmp_path / "s.json"
    rc, out, err = _cli(capsys, "--simulate", TWO.to_spec(), "--sim-profile", str(p),
                        "--workload", "matmul", "--policies", "asymo", "--json", str(js))
    assert rc == 0, err
    assert f"cost model from {p}" in out
    doc = json.loads(js.read_text())
    assert doc["meta"]["task_costs"]["jobs_from_model"] > 0
    rc, _, err = _cli(capsys, "--simulate", "kirin970", "--sim-profile", str(p),
                      "--workload", "matmul")
    assert rc == 2 and "does not fit the simulated topology" in err
    rc, _, err = _cli(capsys, "--sim-profile", str(p), "--workload", "matmul")
    assert rc == 2 and "use it with --simulate" in err
    bad = tmp_path / "bad.json"
    bad.write_text("\x00\x01")
    rc, _, err = _cli(capsys, "--simulate", TWO.to_spec(), "--sim-profile", str(bad))
    assert rc == 2 and "not valid JSON" in err


def test_model_costs_for_each_source(tmp_path):
    from asymo.plan.calibration import parse_section
    from asymo.lab.sim.costs import model_costs_for
    cal = parse_section(_section(TWO, [FAST_BIG, SLOW_LITTLE]), TWO, "dev.json")
    from_cal = model_costs_for(cal, TWO)
    assert from_cal.models[1].to_dict() == SLOW_LITTLE.to_dict() and from_cal.source == "dev.json"
    path = _write_profile(tmp_path / "dev.json", TWO, [FAST_BIG, SLOW_LITTLE])
    # the same models by every route give the same sweep
    a = _sweep(cost_models=cal)
    b = _sweep(cost_models=str(path))
    c = _sweep(cost_models=ModelCosts([FAST_BIG, SLOW_LITTLE], TWO))
    assert [p.throughput for p in a.points] == [p.throughput for p in b.points] \
        == [p.throughput for p in c.points]
    other = parse_spec("big:0-2@1.0,little:3@0.5")
    with pytest.raises(ValueError, match="do not match the simulated topology"):
        model_costs_for(cal, other)
    with pytest.raises(ValueError, match="not part of"):
        model_costs_for(from_cal, other)
    with pytest.raises(TypeError, match="cost_models must be"):
        model_costs_for(42, TWO)
    mc = ModelCosts([FAST_BIG, SLOW_LITTLE], TWO)
    mc.jobs_model = 7
    assert model_costs_for(mc, TWO).jobs_model == 0      # counters start at zero per sweep


@pytest.mark.parametrize("field, value", [
    ("cpus", 3), ("cpus", None), ("capability_gflops", [10.0]), ("capability_gflops", 1.5),
    ("model_name", None)])
def test_wrongly_typed_profile_fields_are_clear_errors(tmp_path, field, value):
    # a hand-edited or foreign profile: a ValueError naming the cluster, never an
    # AttributeError / TypeError from inside the parser (matmul's planner catches ValueError
    # only, to fall back to default plans with a warning)
    p = _write_profile(tmp_path / "dev.json", TWO, [BIG, LITTLE])
    doc = json.loads(p.read_text())
    doc["sections"]["gemm"]["clusters"][1][field] = value
    if field == "model_name":
        del doc["sections"]["gemm"]["clusters"][1][field]
    p.write_text(json.dumps(doc))
    if field == "model_name":       # optional: the model's own feature set names it
        assert load_model_costs(p, TWO).names == ("table2", "table2")
        return
    with pytest.raises(ValueError, match="cluster 'little'"):
        load_model_costs(p, TWO)


def test_a_model_params_that_is_not_an_object_is_a_clear_error(tmp_path):
    p = _write_profile(tmp_path / "dev.json", TWO, [BIG, LITTLE])
    doc = json.loads(p.read_text())
    del doc["sections"]["gemm"]["clusters"][0]["model_name"]
    doc["sections"]["gemm"]["clusters"][0]["model"]["params"] = []
    p.write_text(json.dumps(doc))
    try:
        mc = load_model_costs(p, TWO)
    except ValueError as exc:
        assert "cluster 'big'" in str(exc)
    else:
        assert mc.names[0] == mc.models[0].features
