"""Planning (objectives, kernel-level, Pareto set) and the `asymo plan` / `asymo pipeline`
command lines."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from asymo.pipeline.configs import CoreConfig, core_configs
from asymo.pipeline.plan import default_power, plan_pipeline
from asymo.pipeline.table import LayerTimes
from asymo.hw.topology import parse_spec

TOP = parse_spec("big:0-3@1.0,little:4-7@0.45")


def fake(W, seed=0):
    rng = np.random.default_rng(seed)
    work = np.sort(rng.uniform(0.5, 4.0, W))[::-1] * 1e-3
    par = rng.uniform(0.5, 0.95, W)
    cfgs = core_configs(TOP)
    cols = [work / TOP.clusters[c.cluster].capacity * ((1 - par) + par / c.count)
            for c in cfgs]
    kl = work / (4 + 4 * 0.45) * 1.6  # kernel-level: collapses across clusters
    table = LayerTimes(cfgs, np.stack(cols, 1), out_bytes=rng.integers(1e3, 1e6, W),
                       kernel_level=kl, source="synthetic")
    model = SimpleNamespace(name="fake", layers=[None] * W)
    return model, table


def check_contiguous(plan, W):
    nxt = 0
    for s in plan.stages:
        assert s.layers[0] == nxt and s.layers[1] >= s.layers[0]
        nxt = s.layers[1] + 1
    assert nxt == W
    cpus = [c for s in plan.stages for c in s.cpus]
    assert len(cpus) == len(set(cpus))


def test_throughput_plan_beats_heuristics_and_kernel_level():
    model, table = fake(30)
    plan = plan_pipeline(model, TOP, table=table)
    check_contiguous(plan, 30)
    assert plan.method == "optimal" and len(plan.stages) >= 2
    assert plan.predicted_throughput == pytest.approx(
        1 / max(s.predicted_time for s in plan.stages))
    for name in ("pipe-it", "two-stage", "kernel-level"):
        assert plan.predicted_throughput >= \
            plan.alternatives[name]["predicted_throughput"] * (1 - 1e-12)
    assert plan.kernel_level_predicted_throughput == pytest.approx(1 / table.kernel_level.sum())
    d = json.loads(json.dumps(plan.to_dict()))
    assert {"stages", "predicted_throughput", "kernel_level_predicted_throughput"} <= set(d)
    assert all({"cpus", "layers"} <= set(s) for s in d["stages"])
    # Pareto set: contains the best throughput, nothing in it dominates another member
    top = max(p["predicted_throughput"] for p in plan.pareto)
    assert top == pytest.approx(plan.predicted_throughput)
    for a in plan.pareto:
        for b in plan.pareto:
            assert not (a is not b and a["predicted_throughput"] > b["predicted_throughput"]
                        and a["predicted_latency_s"] < b["predicted_latency_s"]
                        and a["predicted_energy_per_image"] < b["predicted_energy_per_image"])


def test_pipeit_and_two_stage_methods():
    model, table = fake(20, seed=1)
    p1 = plan_pipeline(model, TOP, table=table, method="pipe-it", allow_kernel_level=False)
    p2 = plan_pipeline(model, TOP, table=table, method="two-stage", allow_kernel_level=False)
    check_contiguous(p1, 20)
    check_contiguous(p2, 20)
    assert p1.method == "pipe-it" and p2.method == "two-stage" and len(p2.stages) <= 2
    assert p1.describe() == p1.alternatives["pipe-it"]["pipeline"]


def test_latency_and_energy_objectives():
    model, table = fake(25, seed=2)
    lat = plan_pipeline(model, TOP, table=table, objective="latency")
    en = plan_pipeline(model, TOP, table=table, objective="energy")
    thr = plan_pipeline(model, TOP, table=table)
    for p in (lat, en):
        check_contiguous(p, 25)
    assert lat.predicted_latency <= thr.predicted_latency + 1e-12
    assert lat.predicted_latency <= min(a["predicted_latency_s"]
                                        for a in lat.alternatives.values()) + 1e-12
    assert en.predicted_energy <= thr.predicted_energy + 1e-12
    # energy favours the low-power cluster
    assert any(s.config != "all" and s.config.cluster == 1 for s in en.stages)
    assert "estimate" in en.energy_source


def test_kernel_level_wins_when_it_is_better():
    model, table = fake(10, seed=3)
    table.kernel_level = table.T(CoreConfig(0, 4)) / 10
    plan = plan_pipeline(model, TOP, table=table)
    assert plan.method == "kernel-level" and plan.stages[0].cpus == TOP.cpus


def test_transfer_cost_is_charged_at_stage_boundaries():
    model, table = fake(16, seed=4)
    free = plan_pipeline(model, TOP, table=table, allow_kernel_level=False)
    costly = plan_pipeline(model, TOP, table=table, allow_kernel_level=False, transfer_k=1e-7)
    assert costly.predicted_throughput < free.predicted_throughput


def test_bad_arguments():
    model, table = fake(5)
    with pytest.raises(ValueError, match="objective"):
        plan_pipeline(model, TOP, table=table, objective="speed")
    with pytest.raises(ValueError, match="method"):
        plan_pipeline(model, TOP, table=table, method="magic")
    with pytest.raises(ValueError, match="layers"):
        plan_pipeline(SimpleNamespace(name="x", layers=[None] * 4), TOP, table=table)
    pw = default_power(TOP)
    assert pw["all"] == pytest.approx(sum(pw[CoreConfig(c, 4)] for c in (0, 1)))
    assert pw[CoreConfig(1, 1)] < pw[CoreConfig(0, 1)]


# --- command line ----------------------------------------------------------------------------

def cli(*args, env=None, timeout=240):
    e = dict(os.environ)
    e.pop("ASYMO_TOPOLOGY", None)
    e["XDG_CACHE_HOME"] = e.get("PYTEST_TMP_CACHE", "/nonexistent-asymo-cache")
    e.update(env or {})
    r = subprocess.run([sys.executable, "-m", "asymo", *args], capture_output=True, text=True,
                       timeout=timeout, env=e, cwd=os.path.dirname(os.path.dirname(
                           os.path.abspath(__file__))))
    return r


def test_cli_plan_for_another_machine_json():
    pytest.importorskip("asymo.models")
    r = cli("plan", "resnet50", "--topology", "big:0-3@1.0,little:4-7@0.45", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["predicted_throughput"] > 0 and d["kernel_level_predicted_throughput"] > 0
    assert "default model" in d["prediction_source"]
    covered = []
    for s in d["stages"]:
        assert set(s["cpus"]) <= set(range(8))
        covered.extend(range(s["layers"][0], s["layers"][1] + 1))
    import asymo.models
    assert covered == list(range(len(asymo.models.get("resnet50").layers)))
    r = cli("plan", "mobilenet_v1", "--topology", "big:0-3@1.0,little:4-7@0.45",
            "--objective", "latency")
    assert r.returncode == 0 and "predicted throughput" in r.stdout and "kernel-level" in r.stdout


def test_cli_plan_errors_and_help():
    r = cli("plan", "--help")
    assert r.returncode == 0 and "--objective" in r.stdout and "--topology" in r.stdout
    pytest.importorskip("asymo.models")
    r = cli("plan", "lenet")
    assert r.returncode != 0 and "unknown model" in r.stderr
    r = cli("plan", "alexnet", "--topology", "big:0-x@1")
    assert r.returncode != 0 and "topology" in r.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cpus")
def test_cli_pipeline_compare_json():
    pytest.importorskip("asymo.models")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    r = cli("pipeline", "squeezenet", "--frames", "3", "--warmup", "1", "--compare", "--json",
            "--image-size", "64", "--topology", f"big:{cpus[0]}@1.0,little:{cpus[1]}@0.5")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["throughput"] > 0 and d["latency_s"] > 0
    assert d["kernel_level"]["throughput"] > 0 and d["parallel"]["throughput"] > 0
    assert len(d["stage_utilisation"]) == len(d["plan"]["stages"])
