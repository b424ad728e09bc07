"""GEMM calibration (asymo.calibrate.gemm, asymo calibrate), /proc/stat load adjustment
(asymo.hw.cpuload) and calibrated plans (asymo.plan_matmul)."""
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from asymo.calibrate import gemm as calib
from asymo.plan import calibration as plan_calib
from asymo.calibrate import gemm_set as cset
from asymo.plan import costmodel as cm
from asymo.hw import cpuload
from asymo import profile as prof
from asymo.hw.topology import parse_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO = "big:0@1.0,little:1@0.5"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    """A profile path of the test's own; no cached profile or plan leaks between tests."""
    monkeypatch.setenv("ASYMO_PROFILE", str(tmp_path / "profile.json"))
    monkeypatch.delenv("ASYMO_CALIBRATION_SET", raising=False)
    monkeypatch.setenv("ASYMO_LOAD_ADJUST", "0")
    prof.reset_active_profile()
    _clear_plans()
    yield
    prof.reset_active_profile()
    _clear_plans()


def _clear_plans():
    mod = sys.modules.get("asymo.plan.matmul")
    if mod is not None:
        mod.clear_cache()


# ---------------------------------------------------------------------------------------------
# /proc/stat load
# ---------------------------------------------------------------------------------------------
STAT = """cpu  300 0 100 1000 0 0 0 0 0 0
cpu0 100 5 50 400 20 3 2 0 7 0
cpu1 200 0 50 600 0 0 0 10 0 0
intr 12345 0 0
ctxt 999
"""


def test_parse_proc_stat():
    s = cpuload.parse_proc_stat(STAT)
    assert set(s) == {0, 1}                       # the aggregate line is skipped
    # busy = user + nice + system + irq + softirq + steal; guest is inside user already
    assert s[0] == cpuload.CpuTimes(busy=100 + 5 + 50 + 3 + 2, total=160 + 400 + 20)
    assert s[1] == cpuload.CpuTimes(busy=260, total=860)
    old = cpuload.parse_proc_stat("cpu3 10 0 5 85\n")   # 2.4-era kernels: 4 columns
    assert old == {3: cpuload.CpuTimes(busy=15, total=100)}
    for bad in ("", "intr 1 2\n", "cpu0 1 x 3 4\n", "cpu0 1 2\n"):
        with pytest.raises(ValueError, match="/proc/stat"):
            cpuload.parse_proc_stat(bad)


def test_parse_task_stat_with_a_nasty_command_name():
    fields = ["S"] + [str(i) for i in range(4, 53)]   # field n holds str(n) from field 4 on
    fields[11], fields[12], fields[36] = "70", "30", "5"  # utime (14), stime (15), cpu (39)
    text = "1234 (my (odd) name) " + " ".join(fields) + "\n"
    assert cpuload.parse_task_stat(text) == (5, 100)
    with pytest.raises(ValueError, match="task stat"):
        cpuload.parse_task_stat("1234 no parenthesis")


def test_external_loads_subtract_our_own_threads():
    before = {0: cpuload.CpuTimes(100, 1000), 1: cpuload.CpuTimes(100, 1000)}
    after = {0: cpuload.CpuTimes(180, 1100), 1: cpuload.CpuTimes(150, 1100),
             2: cpuload.CpuTimes(5, 10)}
    loads = cpuload.external_loads(before, after, {0: 10}, {0: 70})
    assert loads == {0: pytest.approx(0.2), 1: pytest.approx(0.5)}   # cpu0: (80 - 60) / 100
    assert cpuload.external_loads(before, before)[0] is None         # no time passed


def _fake_proc(root, stat, own=None):
    os.makedirs(root / "self" / "task" / "7", exist_ok=True)
    os.makedirs(root / "self" / "task" / "8", exist_ok=True)
    (root / "stat").write_text(stat)
    (root / "self" / "task" / "7" / "status").write_text("Name:\tw\nCpus_allowed_list:\t0\n")
    # an unpinned thread (the caller) is not counted in the wait share
    (root / "self" / "task" / "8" / "status").write_text("Cpus_allowed_list:\t0-1\n")
    (root / "self" / "task" / "8" / "schedstat").write_text("0 999999999999 1\n")
    own = own or {}
    fields = ["S"] + ["0"] * 49
    fields[11] = str(own.get("ticks", 0))
    fields[36] = str(own.get("cpu", 0))
    (root / "self" / "task" / "7" / "stat").write_text("7 (worker) " + " ".join(fields))


def test_wait_share_of_our_threads():
    assert cpuload.parse_schedstat("123 456 7\n") == (123, 456)
    assert cpuload.pinned_cpu("Name:\tx\nCpus_allowed_list:\t3\n") == 3
    assert cpuload.pinned_cpu("Cpus_allowed_list:\t0-3\n") is None
    assert cpuload.pinned_cpu("Name: x\n") is None
    with pytest.raises(ValueError, match="schedstat"):
        cpuload.parse_schedstat("x")
    ms = 1_000_000
    before = {"1": (0, 10 * ms, 0), "2": (1, 0, 0)}
    after = {"1": (0, 20 * ms, 10 * ms), "2": (1, ms, 0), "3": (1, 5 * ms, 15 * ms)}
    # cpu0: 10 ms run, 10 ms waiting; cpu1: 6 ms run, 15 ms waiting (thread 3 is new)
    assert cpuload.wait_loads(before, after) == {0: pytest.approx(0.5),
                                                 1: pytest.approx(15 / 21)}
    assert cpuload.wait_loads(before, {"2": (1, ms, 0)}) == {1: None}   # too little to tell


def test_load_monitor_sources(tmp_path):
    _fake_proc(tmp_path, "cpu0 0 0 0 100\n")
    assert cpuload.LoadMonitor(tmp_path).source == "proc_stat"      # no schedstat
    (tmp_path / "self" / "schedstat").write_text("0 0 0\n")
    clock = [0.0]
    mon = cpuload.LoadMonitor(tmp_path, min_interval=0.0, clock=lambda: clock[0])
    assert mon.source == "wait"
    task = tmp_path / "self" / "task" / "7"
    (task / "schedstat").write_text("0 0 0\n")
    assert mon.loads() is None
    (task / "schedstat").write_text(f"{30_000_000} {10_000_000} 5\n")
    clock[0] = 1.0
    assert mon.loads() == {0: pytest.approx(0.25)}   # the worker waited a quarter of its time
    (task / "schedstat").write_text(f"{30_000_000} {10_000_000} 5\n")
    clock[0] = 2.0
    assert mon.loads() == {0: pytest.approx(0.25)}   # idle: no news, the last value stays
    with pytest.raises(ValueError, match="source"):
        cpuload.LoadMonitor(tmp_path, source="psi")


def test_load_monitor_windows(tmp_path):
    clock = [0.0]
    _fake_proc(tmp_path, "cpu0 0 0 0 100\ncpu1 0 0 0 100\n", {"cpu": 1, "ticks": 0})
    mon = cpuload.LoadMonitor(tmp_path, source="proc_stat", min_interval=0.5,
                              clock=lambda: clock[0])
    assert mon.loads() is None                     # no window yet
    # 100 ticks later: cpu0 busy 30 (others), cpu1 busy 80 of which 60 are ours
    _fake_proc(tmp_path, "cpu0 30 0 0 170\ncpu1 80 0 0 120\n", {"cpu": 1, "ticks": 60})
    clock[0] = 0.2
    assert mon.loads() is None                     # too short a window: nothing measured
    clock[0] = 1.0
    loads = mon.loads()
    assert loads == {0: pytest.approx(0.3), 1: pytest.approx(0.2)}
    _fake_proc(tmp_path, "cpu0 130 0 0 170\ncpu1 180 0 0 120\n", {"cpu": 1, "ticks": 60})
    clock[0] = 1.1
    assert mon.loads() is loads                    # within min_interval: the last window
    topo = parse_spec(TWO)
    assert cpuload.cluster_loads(topo, loads) == (pytest.approx(0.3), pytest.approx(0.2))
    assert cpuload.cluster_loads(topo, {0: None}) == (None, None)
    # exponential smoothing over windows
    sm = cpuload.LoadMonitor(tmp_path, source="proc_stat", min_interval=0.0, smoothing=1.0,
                             clock=lambda: clock[0])
    _fake_proc(tmp_path, "cpu0 0 0 0 100\ncpu1 0 0 0 100\n")
    sm.loads()
    _fake_proc(tmp_path, "cpu0 100 0 0 100\ncpu1 0 0 0 200\n")
    clock[0] += 1.0
    assert sm.loads()[0] == pytest.approx(1.0)     # the first window as it is
    _fake_proc(tmp_path, "cpu0 100 0 0 200\ncpu1 0 0 0 300\n")
    clock[0] += 1.0
    assert sm.loads()[0] == pytest.approx(1.0 + (1 - np.exp(-1.0)) * (0.0 - 1.0))
    (tmp_path / "stat").write_text("garbage")
    clock[0] = 5.0
    assert mon.loads() is loads                    # unreadable: keep the last answer


def test_adjust_split():
    assert cpuload.adjust_split([2.0, 1.0]) == pytest.approx((2 / 3, 1 / 3))
    # the big cluster is half busy with other work: it gets half its share
    assert cpuload.adjust_split([2.0, 1.0], [0.5, 0.0]) == pytest.approx((0.5, 0.5))
    # the load present at calibration (e.g. the emulator's occupier) was already measured
    assert cpuload.adjust_split([2.0, 1.0], [0.0, 0.5], [0.0, 0.5]) == pytest.approx((2 / 3,
                                                                                    1 / 3))
    # ... and when it is gone, the cluster is faster than measured
    assert cpuload.adjust_split([2.0, 1.0], [0.0, 0.0], [0.0, 0.5]) == pytest.approx((0.5, 0.5))
    # a saturated cluster keeps a floor; factors are bounded
    r = cpuload.adjust_split([1.0, 1.0], [1.0, 0.0], floor=0.1, max_factor=100)
    assert r == pytest.approx((0.1 / 1.1, 1 / 1.1))
    r = cpuload.adjust_split([1.0, 1.0], [1.0, 0.0])
    assert r == pytest.approx((0.25 / 1.25, 1 / 1.25))
    # small changes (coarse tick counts) are ignored
    assert cpuload.adjust_split([2.0, 1.0], [0.08, 0.0]) == pytest.approx((2 / 3, 1 / 3))
    assert cpuload.adjust_split([1.0, 1.0], [None, 0.5]) == pytest.approx((2 / 3, 1 / 3))
    with pytest.raises(ValueError, match="capability"):
        cpuload.adjust_split([0.0, 0.0])
    with pytest.raises(ValueError, match="loads"):
        cpuload.adjust_split([1.0, 1.0], [0.1])


@pytest.mark.parametrize("source", ["proc_stat", "auto"])
def test_load_monitor_reads_the_live_proc(source):
    loads = cpuload.LoadMonitor(source=source).measure(0.05)
    assert isinstance(loads, dict)
    assert all(v is None or 0.0 <= v <= 1.0 for v in loads.values())


# ---------------------------------------------------------------------------------------------
# Calibration with synthetic timings (no GEMM involved: exact, fast, deterministic)
# ---------------------------------------------------------------------------------------------
COEF = np.array([2e-11, 3e-9, 8e-12, 1e-9, 2e-6])
T_FRAM = 5e-5


class FakeTimer:
    """Latencies from Table 2 with known costs, divided by each cluster's speed."""

    def __init__(self, speeds, *, isa="portable", tile=(8, 8), interrupt_after=None):
        self.speeds, self.isa, self.tile = speeds, isa, tuple(tile)
        self.interrupt_after = interrupt_after
        self.calls = self.settings = 0

    def measure(self, cluster, size, blocks_list, *, repeats, min_sample_s, max_repeats=None,
                budget_s=None):
        if self.interrupt_after is not None and self.calls >= self.interrupt_after:
            raise KeyboardInterrupt
        self.calls += 1
        self.settings += len(blocks_list)
        X = [[size.M, size.K, size.N, *b, cluster.ncpus, cm.KIND_CODES[size.kind]]
             for b in blocks_list]
        y = cm.table2_features(X) @ COEF + T_FRAM
        return list(y / self.speeds[cluster.name])


def _calibrate(timer, topo=None, **kw):
    topo = topo or parse_spec(TWO)
    return calib.calibrate_gemm(topo, set_name="tiny", progress=False, timer=timer, **kw)


def test_calibration_on_synthetic_timings(tmp_path):
    path = os.environ["ASYMO_PROFILE"]
    topo = parse_spec(TWO)
    # another section in the profile survives the calibration
    p = prof.Profile.new(topo, path)
    p.sections["energy"] = {"kept": True}
    prof.save_profile(p, path)
    timer = FakeTimer({"big": 1.0, "little": 0.5})
    section = _calibrate(timer, topo)
    spec = cset.get_set("tiny")
    per_cluster = sum(len(cset.training_blocks(s, 1, cset.CacheInfo.for_cluster(
        topo.clusters[0], 8, 8), spec.mm_settings if s.kind == "mm" else spec.mv_settings))
        for s in spec.mm + spec.mv)
    assert section["settings_per_cluster"] == per_cluster
    # the little cluster measured at half speed: it gets a third of the work, MM and MV
    for kind in ("mm", "mv"):
        assert section["split"][kind] == pytest.approx([2 / 3, 1 / 3])
    for c in section["clusters"]:
        table2 = c["models"]["table2"]
        assert table2["cv"]["r2"] > 0.999                  # the data is Table 2 exactly
        assert table2["regret"]["max"] == pytest.approx(0, abs=1e-9)
        assert table2["gap"]["median"] == pytest.approx(0, abs=1e-9)
        assert len(table2["gap"]["shapes"]) == len(spec.held_out)
        assert set(c["models"]) == set(calib.MODEL_CHOICES)
        assert c["data"]["columns"][:8] == list(cm.SETTING_COLUMNS)
    # stored, versioned, keyed by this topology's fingerprint; read back usable
    loaded = prof.load_profile(path, topo)
    assert loaded.sections["energy"] == {"kept": True}
    assert loaded.sections["gemm"]["split"] == section["split"]
    cal = plan_calib.parse_section(loaded.sections["gemm"], topo, path)
    assert [c.name for c in cal.clusters] == ["big", "little"]
    assert cal.capability("mm")[0] == pytest.approx(2 * cal.capability("mm")[1])
    assert not os.path.exists(calib.partial_path(path))
    text = calib.format_report(section)
    assert "cluster big" in text and "cluster little" in text and "R^2" in text
    # another topology (the symmetric machine) cannot use this profile
    with pytest.warns(prof.ProfileWarning, match="another CPU"):
        assert prof.load_profile(path, parse_spec("c0:0-1")) is None


def test_interrupted_run_resumes(tmp_path):
    path = os.environ["ASYMO_PROFILE"]
    full = _calibrate(FakeTimer({"big": 1.0, "little": 0.5}), save=False)
    first = FakeTimer({"big": 1.0, "little": 0.5}, interrupt_after=5)
    with pytest.raises(KeyboardInterrupt):
        _calibrate(first)
    partial = calib.partial_path(path)
    assert os.path.exists(partial) and not os.path.exists(path)
    second = FakeTimer({"big": 1.0, "little": 0.5})
    section = _calibrate(second)
    total = full["settings_per_cluster"]  # train; plus held-out candidates and confirmations
    assert first.settings > 0 and second.settings > 0
    fresh = FakeTimer({"big": 1.0, "little": 0.5})
    _calibrate(fresh, save=False, resume=False)
    assert first.settings + second.settings == fresh.settings   # nothing measured twice
    assert section["resumed_measurements"] == first.settings
    assert total > 0 and not os.path.exists(partial)
    for a, b in zip(section["clusters"], full["clusters"]):
        assert a["data"]["rows"] == b["data"]["rows"]
        assert a["model"] == b["model"]


def test_partial_of_another_run_is_not_resumed(tmp_path):
    path = os.environ["ASYMO_PROFILE"]
    with pytest.raises(KeyboardInterrupt):
        _calibrate(FakeTimer({"big": 1.0, "little": 0.5}, interrupt_after=3))
    data = json.load(open(calib.partial_path(path)))
    data["ident"]["set"] = "0" * 16           # another data set
    json.dump(data, open(calib.partial_path(path), "w"))
    again = FakeTimer({"big": 1.0, "little": 0.5})
    section = _calibrate(again)
    assert section["resumed_measurements"] == 0
    # a corrupt partial file is ignored too
    open(calib.partial_path(path), "w").write("{not json")
    assert _calibrate(FakeTimer({"big": 1.0, "little": 0.5}))["resumed_measurements"] == 0


@pytest.fixture(scope="module")
def synthetic_section(tmp_path_factory):
    path = tmp_path_factory.mktemp("section") / "profile.json"
    return calib.calibrate_gemm(parse_spec(TWO), set_name="tiny", progress=False, save=False,
                                timer=FakeTimer({"big": 1.0, "little": 0.5}), path=str(path))


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s.update(schema=0), "schema"),
    (lambda s: s["clusters"].pop(), "clusters"),
    (lambda s: s["clusters"][0].update(cpus=[5]), "cpus"),
    (lambda s: s["clusters"][0].update(cpus=5), "cpus"),
    (lambda s: s["clusters"][0].update(capability_gflops=[10.0]), "capability"),
    (lambda s: s["clusters"][1]["model"].update(coef=[1.0]), "BlockCostModel"),
    (lambda s: s["clusters"][0]["capability_gflops"].update(mv=-1), "capability"),
    (lambda s: s["clusters"][0].update(cache="big"), "cache"),
    (lambda s: s.update(tile=[0, 8]), "tile"),
])
def test_unusable_gemm_sections_are_rejected(synthetic_section, mutate, match):
    topo = parse_spec(TWO)
    section = json.loads(json.dumps(synthetic_section))
    mutate(section)
    with pytest.raises(ValueError, match=match):
        plan_calib.parse_section(section, topo)


def test_profile_summary_for_info(tmp_path):
    topo = parse_spec(TWO)
    path = os.environ["ASYMO_PROFILE"]
    s = plan_calib.profile_summary(topo)
    assert s["status"] == "missing" and "asymo calibrate" in plan_calib.render_profile_summary(s)
    _calibrate(FakeTimer({"big": 1.0, "little": 0.5}), topo)
    s = plan_calib.profile_summary(topo)
    assert s["status"] == "ok" and s["gemm"]["usable"]
    assert [c["name"] for c in s["gemm"]["clusters"]] == ["big", "little"]
    assert s["gemm"]["clusters"][0]["r2_table2"] > 0.999
    text = plan_calib.render_profile_summary(s)
    assert path in text and "big" in text and "R^2" in text
    open(path, "w").write("{corrupt")
    s = plan_calib.profile_summary(topo)
    assert s["status"] == "unusable" and "corrupt" in s["reason"]


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def _cli(args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "asymo", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_calibrate_help():
    r = _cli(["calibrate", "--help"], dict(os.environ))
    assert r.returncode == 0
    for word in ("--quick", "--profile", "ASYMO_PROFILE", "resume", "--restart", "--energy"):
        assert word in r.stdout


def test_calibrate_quick_on_the_tiny_set(tmp_path):
    pytest.importorskip("asymo.plan.gemm")
    path = tmp_path / "cli-profile.json"
    env = dict(os.environ, ASYMO_CALIBRATION_SET="tiny", ASYMO_PROFILE=str(path))
    t0 = time.monotonic()
    r = _cli(["calibrate", "--quick", "--no-progress"], env)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    assert "GEMM calibration: tiny set" in r.stdout and "R^2" in r.stdout
    data = json.loads(path.read_text())
    assert data["format"] == "asymo-profile" and "gemm" in data["sections"]
    info = _cli(["info"], env)
    assert info.returncode == 0 and f"calibration profile: {path}" in info.stdout
    assert "GEMM: tiny set" in info.stdout


# ---------------------------------------------------------------------------------------------
# Calibrated plans
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def gemm():
    gp = pytest.importorskip("asymo.plan.gemm")
    from asymo.plan import matmul as matmul_plan
    return gp, matmul_plan


def _real_tile_timer(gp, speeds):
    isa = gp.best_isa()
    return FakeTimer(speeds, isa=isa, tile=gp.kernel_tile(isa, "float32"))


def test_plan_without_profile_is_the_default(gemm):
    gp, mp = gemm
    topo = parse_spec(TWO)
    plan = mp.plan_matmul(256, 128, 512, topology=topo)
    base = gp.plan_gemm(256, 128, 512, "float32", topology=topo)
    assert plan.source == "default" and plan.predicted_s is None
    assert plan.blocks == base.blocks and plan.cluster_ranges == base.cluster_ranges
    assert plan.ratio == pytest.approx((2 / 3, 1 / 3))          # capacity x cpus
    assert plan.tasks == plan.task_counts()


@pytest.mark.parametrize("content", ["{corrupt", json.dumps({"format": "asymo-profile",
                                                             "version": 0, "sections": {}})])
def test_unusable_profile_warns_and_plans_default(gemm, content):
    gp, mp = gemm
    open(os.environ["ASYMO_PROFILE"], "w").write(content)
    with pytest.warns(prof.ProfileWarning):
        plan = mp.plan_matmul(64, 64, 64, topology=parse_spec(TWO))
    assert plan.source == "default"


def test_foreign_and_bad_section_warn_and_plan_default(gemm):
    gp, mp = gemm
    _calibrate(_real_tile_timer(gp, {"big": 1.0, "little": 0.5}))
    with pytest.warns(prof.ProfileWarning, match="another CPU"):
        plan = mp.plan_matmul(64, 64, 64, topology=parse_spec("a:0@1.0,b:1@0.9"))
    assert plan.source == "default"
    path = os.environ["ASYMO_PROFILE"]
    data = json.load(open(path))
    data["sections"]["gemm"]["schema"] = 0
    json.dump(data, open(path, "w"))
    prof.reset_active_profile()
    mp.clear_cache()
    with pytest.warns(prof.ProfileWarning, match="schema"):
        plan = mp.plan_matmul(64, 64, 64, topology=parse_spec(TWO))
    assert plan.source == "default"


def test_calibrated_plan(gemm):
    gp, mp = gemm
    topo = parse_spec(TWO)
    _calibrate(_real_tile_timer(gp, {"big": 1.0, "little": 0.5}), topo)
    with warnings.catch_warnings():
        warnings.simplefilter("error", prof.ProfileWarning)
        plan = mp.plan_matmul(784, 1152, 128, topology=topo)
    assert isinstance(plan, gp.GemmPlan) and plan.source == "profile"
    assert plan.ratio == pytest.approx((2 / 3, 1 / 3), abs=1 / 64)
    assert plan.tasks == plan.task_counts() and all(t > 0 for t in plan.tasks)
    cal = mp.calibration_for(topo)
    preds = []
    for c, ((a, b), cc) in enumerate(zip(plan.cluster_ranges, cal.clusters)):
        part = (b - a, 128) if plan.split_dim == "M" else (784, b - a)
        blocks, t = cm.choose_blocks(cc.model, part[0], 1152, part[1], threads=1,
                                     min_i=cm.MIN_TASKS_PER_THREAD,
                                     **cc.cache)
        assert plan.blocks[c] == blocks
        preds.append(t)
    assert plan.predicted_s == pytest.approx(max(preds))
    assert plan.cluster_predicted_s == pytest.approx(tuple(preds))
    # the split follows the cluster's measured speed (the big one gets twice the rows)
    sizes = [b - a for a, b in plan.cluster_ranges]
    assert sizes[0] == pytest.approx(2 * sizes[1], rel=0.1)
    assert mp.plan_matmul(784, 1152, 128, topology=topo) is plan          # cached
    d = json.loads(json.dumps(plan.to_dict()))
    assert mp.PartitionPlan.from_dict(d) == plan
    # the skinny path gets its chunk from the model, float64 only the split
    mv = mp.plan_matmul(4096, 512, 1, topology=topo)
    assert mv.kind == "mv" and mv.source == "profile" and mv.predicted_s > 0
    f64 = mp.plan_matmul(784, 1152, 128, dtype="float64", topology=topo)
    assert f64.source == "profile-split" and f64.predicted_s is None


def test_calibrated_plan_computes_the_product(gemm):
    gp, mp = gemm
    from asymo.ops.matmul import gemm as run_gemm
    from asymo.runtime.pool import Pool
    topo = parse_spec(TWO)
    _calibrate(_real_tile_timer(gp, {"big": 1.0, "little": 0.5}), topo)
    rng = np.random.default_rng(0)
    with Pool(topo) as pool:
        for M, K, N in [(200, 300, 100), (1000, 64, 1), (1, 256, 700), (37, 1, 50)]:
            a = rng.standard_normal((M, K)).astype(np.float32)
            b = rng.standard_normal((K, N)).astype(np.float32)
            plan = mp.plan_matmul(M, K, N, pool=pool)
            out = run_gemm(a, b, plan=plan, pool=pool)
            np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(K))


def test_matmul_uses_the_active_profile(gemm):
    gp, mp = gemm
    import asymo
    from asymo.runtime.pool import Pool
    from asymo.hw.topology import detect
    topo = detect()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 500)).astype(np.float32)
    with Pool(topo) as pool:
        assert mp.plan_for_matmul(300, 200, 500, np.dtype(np.float32), pool).source == "default"
        _calibrate(_real_tile_timer(gp, {c.name: 1.0 for c in topo.clusters}), topo)
        plan = mp.plan_for_matmul(300, 200, 500, np.dtype(np.float32), pool)
        assert plan.source == "profile" and plan.predicted_s > 0
        assert mp.plan_for_matmul(300, 200, 500, np.dtype(np.float32), pool) is plan  # cached
        np.testing.assert_allclose(asymo.matmul(a, b, pool=pool), a @ b, rtol=1e-4,
                                   atol=1e-3)
        # a batch of products: calibrated split, default blocks
        x = rng.standard_normal((3, 40, 200)).astype(np.float32)
        np.testing.assert_allclose(asymo.matmul(x, b, pool=pool), x @ b, rtol=1e-4, atol=1e-3)


def test_plan_matmul_arguments(gemm):
    gp, mp = gemm
    topo = parse_spec(TWO)
    with pytest.raises(ValueError, match="bad shape"):
        mp.plan_matmul(-1, 2, 3, topology=topo)
    with pytest.raises(TypeError, match="integers"):
        mp.plan_matmul(2.5, 2, 3, topology=topo)
    with pytest.raises(TypeError, match="float32 and float64"):
        mp.plan_matmul(2, 2, 3, dtype="int32", topology=topo)
