"""asymo.hw.topology: detection from fake sysfs trees, overrides, affinity, emulation, bad input."""
import importlib.util
import json
import os
import shutil
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asymo.hw import sysfs as _sysfs
from asymo.hw import topology as topo

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "sysfs")
CPU = "devices/system/cpu"
with open(os.path.join(HERE, "fixtures", "sysfs_expected.json")) as _f:
    EXPECTED = {k: v for k, v in json.load(_f).items() if not k.startswith("_")}


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "make_sysfs", os.path.join(HERE, "fixtures", "make_sysfs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_sysfs = _load_generator()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    # The suite may itself run under `asymo emulate`; these tests set the variables they need.
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    monkeypatch.delenv(topo.EMULATED_ENV_VAR, raising=False)


def fixture(name):
    return os.path.join(FIXTURES, name)


def copy_fixture(name, tmp_path):
    dst = os.path.join(str(tmp_path), name)
    shutil.copytree(fixture(name), dst)
    return dst


def put(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(path, mode) as f:
        f.write(text)


def rm(root, rel):
    path = os.path.join(root, rel)
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def clusters_of(t):
    return [(c.cpus, round(c.capacity, 3)) for c in t.clusters]


def detect_quiet(*args, **kwargs):
    """detect() that must not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", topo.TopologyWarning)
        return topo.detect(*args, **kwargs)


def detect_warns(match, *args, **kwargs):
    with pytest.warns(topo.TopologyWarning, match=match):
        return topo.detect(*args, **kwargs)


# ------------------------------------------------------------------------------ fixtures

@pytest.mark.parametrize("name", sorted(make_sysfs.MACHINES))
def test_committed_fixture_matches_generator(name):
    assert make_sysfs.stale(name) == []


def test_every_fixture_has_an_expectation():
    assert set(EXPECTED) == set(make_sysfs.MACHINES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_clusters(name):
    t = detect_quiet(fixture(name))
    want = EXPECTED[name]
    assert t.source == want["source"]
    assert [c.name for c in t.clusters] == [c["name"] for c in want["clusters"]]
    assert [list(c.cpus) for c in t.clusters] == [c["cpus"] for c in want["clusters"]]
    assert [c.capacity for c in t.clusters] == pytest.approx(
        [c["capacity"] for c in want["clusters"]], abs=1e-3)
    assert t.clusters[0].capacity == 1.0
    assert t.emulated == {}


def test_kirin970_caches_and_frequencies():
    big, little = detect_quiet(fixture("kirin970")).clusters
    assert (big.l1d.size, big.l1d.shared_cpus) == (64 << 10, (4,))
    assert (big.l2.size, big.l2.shared_cpus) == (2 << 20, (4, 5, 6, 7))
    assert (little.l1d.size, little.l2.size, little.l2.shared_cpus) == (
        32 << 10, 1 << 20, (0, 1, 2, 3))
    assert big.l3 is None and little.l3 is None
    assert (big.min_freq_khz, big.max_freq_khz) == (682000, 2362000)
    assert big.available_freqs_khz == (682000, 1018000, 1210000, 1364000, 1498000, 1652000,
                                       1863000, 2093000, 2362000)
    assert (little.min_freq_khz, little.max_freq_khz) == (509000, 1844000)
    assert len(little.available_freqs_khz) == 7
    assert big.cpufreq_policy == os.path.join(fixture("kirin970"), CPU, "cpufreq", "policy4")
    assert little.cpufreq_policy.endswith("policy0")
    assert big.cpufreq_policies == (big.cpufreq_policy,)


def test_sdm845_dynamiq_private_l2_shared_l3():
    big, little = detect_quiet(fixture("sdm845")).clusters
    assert (big.l2.size, big.l2.shared_cpus) == (256 << 10, (4,))
    assert (little.l2.size, little.l2.shared_cpus) == (128 << 10, (0,))
    assert big.l3 == little.l3
    assert (big.l3.size, big.l3.shared_cpus) == (2 << 20, tuple(range(8)))
    assert big.max_freq_khz == 2803200 and little.max_freq_khz == 1766400


def test_rk3588_one_cluster_per_frequency_domain():
    big0, big1, little = detect_quiet(fixture("rk3588")).clusters
    assert big0.cpufreq_policy.endswith("policy4")
    assert big1.cpufreq_policy.endswith("policy6")
    assert little.cpufreq_policy.endswith("policy0")
    assert big0.l2.size == 512 << 10 and little.l2.size == 128 << 10
    assert big0.l3.size == 3 << 20 and big0.l3.shared_cpus == tuple(range(8))
    assert (little.max_freq_khz, big0.max_freq_khz) == (1800000, 2400000)


def test_pixel6_three_clusters():
    t = detect_quiet(fixture("pixel6"))
    assert t.nclusters == 3 and t.is_asymmetric
    assert [c.max_freq_khz for c in t.clusters] == [2802000, 2253000, 1803000]
    assert [c.l2.size >> 10 for c in t.clusters] == [512, 256, 64]
    assert t.cluster_of(5) == 1 and t.cluster_of(0) == 2


def test_i7_12700h_hybrid():
    t = detect_quiet(fixture("i7_12700h"))
    p, e = t.clusters
    assert t.capacity_basis == "base_frequency"
    assert e.capacity == pytest.approx(1700 / 2300)
    # SMT siblings stay with their P-core; L1d/L2 are per core (shared by the pair).
    assert (p.l1d.size, p.l1d.shared_cpus) == (48 << 10, (0, 1))
    assert (p.l2.size, p.l2.shared_cpus) == (1280 << 10, (0, 1))
    assert (e.l2.size, e.l2.shared_cpus) == (2 << 20, (12, 13, 14, 15))
    assert p.l3.size == 24 << 20 and p.l3.shared_cpus == tuple(range(20))
    # Turbo Boost Max: the favoured cores reach 4.7 GHz, the P cluster's maximum.
    assert (p.min_freq_khz, p.max_freq_khz, e.max_freq_khz) == (400000, 4700000, 3500000)
    # intel_pstate: one policy per cpu, so no single policy directory for the cluster.
    assert p.cpufreq_policy is None and len(p.cpufreq_policies) == 12
    assert p.available_freqs_khz == ()


def test_i7_12700h_turbo_boost_max_correction(tmp_path):
    root = copy_fixture("i7_12700h", tmp_path)
    rm(root, "devices/cpu_core")
    rm(root, "devices/cpu_atom")
    t = detect_quiet(root)  # cpu_capacity all 1024 -> cpufreq grouped by base_frequency
    assert (t.source, t.capacity_basis) == ("cpufreq", "base_frequency")
    assert clusters_of(t) == [(tuple(range(12)), 1.0), (tuple(range(12, 20)), 0.739)]
    for cpu in range(20):
        rm(root, f"{CPU}/cpufreq/policy{cpu}/base_frequency")
    t = detect_quiet(root)
    assert t.capacity_basis == "nominal_freq"
    assert clusters_of(t) == [(tuple(range(12)), 1.0), (tuple(range(12, 20)), 0.739)]
    for cpu in range(20):
        rm(root, f"{CPU}/cpu{cpu}/acpi_cppc")
    # Without a non-turbo frequency the favoured cores look like a faster core type.
    t = detect_quiet(root)
    assert t.capacity_basis == "max_frequency"
    assert clusters_of(t) == [((4, 5, 6, 7), 1.0), ((0, 1, 2, 3, 8, 9, 10, 11), 0.979),
                              (tuple(range(12, 20)), 0.745)]


def test_hybrid_capacity_from_cpu_capacity_when_kernel_tells(tmp_path):
    root = copy_fixture("i7_12700h", tmp_path)
    for cpu in range(12, 20):
        put(root, f"{CPU}/cpu{cpu}/cpu_capacity", "640\n")
    for cpu in (4, 5, 6, 7):  # the kernel gives favoured cores a bit more
        put(root, f"{CPU}/cpu{cpu}/cpu_capacity", "1024\n")
    for cpu in (0, 1, 2, 3, 8, 9, 10, 11):
        put(root, f"{CPU}/cpu{cpu}/cpu_capacity", "1000\n")
    t = detect_quiet(root)
    assert (t.source, t.capacity_basis) == ("intel_hybrid", "cpu_capacity")
    mean_p = (4 * 1024 + 8 * 1000) / 12
    assert clusters_of(t) == [(tuple(range(12)), 1.0),
                              (tuple(range(12, 20)), round(640 / mean_p, 3))]


def test_hybrid_without_speed_information_keeps_core_type_order(tmp_path):
    root = copy_fixture("i7_12700h", tmp_path)
    rm(root, f"{CPU}/cpufreq")
    put(root, "devices/cpu_lowpower/cpus", "20-21\n")
    put(root, f"{CPU}/online", "0-21\n")
    for cpu in (20, 21):
        put(root, f"{CPU}/cpu{cpu}/cpu_capacity", "1024\n")
    t = detect_warns("how fast each core type is", root)
    assert [c.name for c in t.clusters] == ["P", "E", "LP-E"]
    assert [c.capacity for c in t.clusters] == [1.0, 1.0, 1.0]
    assert t.capacity_basis == "unknown"


def test_live_machine_symmetric_here():
    t = detect_quiet()
    assert sorted(t.cpus) == sorted(os.sched_getaffinity(0))
    here = _sysfs.SysfsReader("/sys")
    looks_like_dev_machine = (not here.hybrid_pmus() and not here.cpufreq_policies()
                              and len(set((here.cpu_capacities(t.cpus) or {0: 0}).values()))
                              == 1)
    if not looks_like_dev_machine:
        pytest.skip("not the symmetric development machine")
    assert t.nclusters == 1 and t.source == "single"
    assert t.clusters[0].l1d is not None and t.clusters[0].l1d.size > 0


# ------------------------------------------------------------------------------ override

@pytest.mark.parametrize("spec, want", [
    ("big:0-3@1.0,little:4-7@0.45", [("big", (0, 1, 2, 3), 1.0), ("little", (4, 5, 6, 7), 0.45)]),
    ("little:4-7@0.5,big:0-3@2", [("big", (0, 1, 2, 3), 1.0), ("little", (4, 5, 6, 7), 0.25)]),
    ("0-1+4-5,2-3@0.6", [("c0", (0, 1, 4, 5), 1.0), ("c1", (2, 3), 0.6)]),
    ("p:0;2, e:1;3@0.5", [("p", (0, 2), 1.0), ("e", (1, 3), 0.5)]),
    ("7", [("c0", (7,), 1.0)]),
    ("a:0@1,b:1@1,c:2@0.1", [("a", (0,), 1.0), ("b", (1,), 1.0), ("c", (2,), 0.1)]),
])
def test_parse_spec(spec, want):
    t = topo.parse_spec(spec)
    assert [(c.name, c.cpus, round(c.capacity, 6)) for c in t.clusters] == want
    assert (t.source, t.capacity_basis) == ("override", "override")
    assert topo.parse_spec(t.to_spec()).clusters == t.clusters


@pytest.mark.parametrize("spec, match", [
    ("", "empty topology spec"),
    ("   ", "empty topology spec"),
    ("big:0-3@fast", "is not a number"),
    ("big:0-3@0", "must be > 0"),
    ("big:0-3@-1", "must be > 0"),
    ("big:0-3@nan", "must be > 0"),
    ("big:0-3@inf", "must be > 0"),
    ("big:@1", "has no cpus"),
    ("big:3-1@1", "bad cpu range"),
    ("big:0-3,little:3-5@0.5", "appears in two clusters"),
    ("big:0-1,big:2-3@0.5", "used twice"),
    ("big:0,1@0.5", None),  # ',' separates clusters: '1@0.5' is a second, unnamed cluster
    ("big:x@1", "bad cpu list item"),
    ("big:0-3@", "is not a number"),
])
def test_parse_spec_errors(spec, match):
    if match is None:
        t = topo.parse_spec(spec)
        assert [c.cpus for c in t.clusters] == [(0,), (1,)]
        return
    with pytest.raises(topo.TopologyError, match=match):
        topo.parse_spec(spec)


def test_parse_spec_rejects_non_strings():
    with pytest.raises(topo.TopologyError):
        topo.parse_spec(None)
    with pytest.raises(TypeError, match="override must be"):
        topo.detect(fixture("kirin970"), override=42)


def test_override_gets_caches_and_frequencies_from_sysfs():
    t = detect_quiet(fixture("kirin970"), override="fast:4-5@1,slow:0-3+6-7@0.5")
    fast, slow = t.clusters
    assert fast.l2.size == 2 << 20 and fast.cpufreq_policy.endswith("policy4")
    assert (fast.min_freq_khz, fast.max_freq_khz) == (682000, 2362000)
    # A cluster spanning two frequency domains has no single policy directory.
    assert slow.cpufreq_policy is None and len(slow.cpufreq_policies) == 2
    assert (slow.min_freq_khz, slow.max_freq_khz) == (509000, 2362000)
    assert t.source == "override" and t.emulated == {}


def test_override_topology_object_is_returned_as_is():
    t = topo.parse_spec("a:0@1")
    assert topo.detect(fixture("kirin970"), override=t) is t


def test_env_override_applies_to_live_system_only(monkeypatch):
    n = len(os.sched_getaffinity(0))
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv(topo.ENV_VAR, f"only:{cpus[0]}@1")
    t = detect_quiet()
    assert t.source == "override" and t.cpus == (cpus[0],)
    assert t.clusters[0].l1d is not None  # filled from the live sysfs
    # Another machine's tree: the variable describes this machine, not that one.
    assert detect_quiet(fixture("kirin970")).source == "cpu_capacity"
    monkeypatch.setenv(topo.ENV_VAR, "big:0-3@oops")
    with pytest.raises(topo.TopologyError, match="ASYMO_TOPOLOGY"):
        topo.detect()
    assert n >= 1


# ------------------------------------------------------------------------------ affinity

def test_affinity_filters_live_system(monkeypatch):
    monkeypatch.setattr(topo, "LIVE_SYSFS", fixture("kirin970"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5, 6})
    t = detect_quiet(fixture("kirin970"))
    assert clusters_of(t) == [((5, 6), 1.0), ((0, 1), 0.451)]
    assert t.clusters[0].l2.shared_cpus == (4, 5, 6, 7)  # hardware fact, not filtered


def test_affinity_to_little_cores_only(monkeypatch):
    monkeypatch.setattr(topo, "LIVE_SYSFS", fixture("rk3588"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    t = detect_quiet(fixture("rk3588"))
    # Capacity differs no more among the usable cpus: one cluster, the fastest, 1.0.
    assert clusters_of(t) == [((0, 1, 2, 3), 1.0)]
    assert t.source == "single"


def test_affinity_on_real_sys(monkeypatch):
    cpu = max(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {cpu})
    assert detect_quiet().cpus == (cpu,)


def test_no_affinity_filtering_for_other_roots(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert detect_quiet(fixture("kirin970")).ncpus == 8


def test_override_outside_affinity(monkeypatch):
    monkeypatch.setattr(topo, "LIVE_SYSFS", fixture("kirin970"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    t = detect_warns("outside this process's affinity mask",
                     fixture("kirin970"), override="big:4-7@1,little:0-3@0.5")
    assert clusters_of(t) == [((0, 1, 2), 1.0)]
    with pytest.raises(topo.TopologyError, match="names no cpu"):
        topo.detect(fixture("kirin970"), override="big:4-7")


# ----------------------------------------------------------------------------- emulation

def test_emulated_from_env(monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv(topo.ENV_VAR, "fast:0@1,slow:1@0.5")
    monkeypatch.setenv(topo.EMULATED_ENV_VAR, "1:0.5")
    t = detect_quiet()
    assert clusters_of(t) == [((0,), 1.0), ((1,), 0.5)]
    assert t.emulated == {1: 0.5}
    assert t.to_dict()["emulated"] == {"1": 0.5}
    # Another machine's tree is not emulated.
    assert detect_quiet(fixture("kirin970")).emulated == {}
    assert cpus


@pytest.mark.parametrize("value, want, match", [
    ("1:0.5", {1: 0.5}, None),
    (" 1:0.5 , ", {1: 0.5}, None),
    ("1:abc", {}, "not cpu:speed"),
    ("garbage", {}, "not cpu:speed"),
    ("1:1.5", {}, r"speed in \(0, 1\]"),
    ("1:0", {}, r"speed in \(0, 1\]"),
    ("-1:0.5", {}, "cpu id >= 0"),
    ("1:0.5,9:0.5", {1: 0.5}, "cpu 9 is not in the topology"),
    ("1:0.5,1:0.25", {1: 0.25}, "listed twice"),
])
def test_emulated_garbage_is_tolerated(monkeypatch, value, want, match):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv(topo.ENV_VAR, "fast:0@1,slow:1@0.5")
    monkeypatch.setenv(topo.EMULATED_ENV_VAR, value)
    t = detect_quiet() if match is None else detect_warns(match)
    assert t.emulated == want


# ----------------------------------------------------------------- malformed / partial sysfs

def test_garbage_capacity_falls_back_to_cpufreq(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    put(root, f"{CPU}/cpu3/cpu_capacity", "lots\n")
    t = detect_warns(r"cpu_capacity: .*cpu3/cpu_capacity: expected an integer.*next source",
                     root)
    assert (t.source, t.capacity_basis) == ("cpufreq", "max_frequency")
    assert clusters_of(t) == [((4, 5, 6, 7), 1.0), ((0, 1, 2, 3), round(1844 / 2362, 3))]


def test_missing_capacity_file_falls_back(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    rm(root, f"{CPU}/cpu5/cpu_capacity")
    t = detect_warns("cpu5/cpu_capacity: missing", root)
    assert t.source == "cpufreq" and t.nclusters == 2


@pytest.mark.parametrize("bad", ["0\n", "-3\n", "\n", b"\xff\xfe\x00\n"])
def test_bad_capacity_values(tmp_path, bad):
    root = copy_fixture("pixel6", tmp_path)
    put(root, f"{CPU}/cpu6/cpu_capacity", bad)
    t = detect_warns("cpu_capacity", root)
    assert t.source == "cpufreq"
    assert [c.cpus for c in t.clusters] == [(6, 7), (4, 5), (0, 1, 2, 3)]


def test_capacity_and_cpufreq_both_broken_give_one_cluster(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    put(root, f"{CPU}/cpu0/cpu_capacity", "x\n")
    put(root, f"{CPU}/cpufreq/policy4/related_cpus", "\n")
    with pytest.warns(topo.TopologyWarning) as record:
        t = topo.detect(root)
    text = " | ".join(str(w.message) for w in record)
    assert "cpu_capacity" in text and "policy4/related_cpus: empty cpu list" in text
    assert clusters_of(t) == [(tuple(range(8)), 1.0)] and t.source == "single"
    assert t.clusters[0].max_freq_khz is None  # frequencies unknown, not invented
    assert t.clusters[0].l2.size == 1 << 20  # caches still read


def test_affected_cpus_stand_in_for_related_cpus(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    rm(root, f"{CPU}/cpufreq/policy0/related_cpus")
    put(root, f"{CPU}/cpu0/cpu_capacity", "x\n")
    t = detect_warns("cpu_capacity", root)
    assert t.source == "cpufreq" and t.clusters[1].cpufreq_policy.endswith("policy0")


@pytest.mark.parametrize("rel, text, match", [
    ("policy0/cpuinfo_max_freq", "fast\n", "expected an integer"),
    ("policy0/cpuinfo_max_freq", None, "cpuinfo_max_freq: missing"),
    ("policy4/cpuinfo_min_freq", "9999999\n", "cpuinfo_min_freq 9999999 >"),
    ("policy4/related_cpus", "0-4\n", "cpu0 is also in policy0"),
    ("policy4/related_cpus", "7-4\n", "bad cpu range"),
    ("policy0/scaling_available_frequencies", "1 2 x\n", "expected integers"),
    ("policy0/base_frequency", "-1\n", "positive integer"),
])
def test_malformed_cpufreq(tmp_path, rel, text, match):
    root = copy_fixture("kirin970", tmp_path)
    path = f"{CPU}/cpufreq/{rel}"
    rm(root, path) if text is None else put(root, path, text)
    # cpu_capacity still groups the cores; the frequencies are left unknown.
    t = detect_warns(match, root)
    assert t.source == "cpu_capacity" and t.nclusters == 2
    assert all(c.max_freq_khz is None and c.cpufreq_policy is None for c in t.clusters)


def test_cpufreq_not_covering_every_cpu_is_partial(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    rm(root, f"{CPU}/cpufreq/policy4")
    for cpu in range(8):
        rm(root, f"{CPU}/cpu{cpu}/cpu_capacity")
    t = detect_warns("cpu4 belongs to no cpufreq policy", root)
    assert t.source == "single" and t.ncpus == 8
    assert t.clusters[0].cpufreq_policy.endswith("policy0")  # the part that exists


@pytest.mark.parametrize("mutate, match", [
    (lambda r: put(r, "devices/cpu_core/cpus", "zero-eleven\n"), "bad cpu list item"),
    (lambda r: put(r, "devices/cpu_atom/cpus", "\n"), "empty cpu list"),
    (lambda r: rm(r, "devices/cpu_core/cpus"), "cpu_core/cpus: missing"),
    (lambda r: put(r, "devices/cpu_atom/cpus", "11-19\n"), "cpu11 is also in cpu_core"),
    (lambda r: put(r, "devices/cpu_atom/cpus", "12-18\n"), "cpu19 belongs to no core type"),
])
def test_malformed_hybrid_pmus_fall_back_to_cpufreq(tmp_path, mutate, match):
    root = copy_fixture("i7_12700h", tmp_path)
    mutate(root)
    t = detect_warns(match, root)
    assert (t.source, t.capacity_basis) == ("cpufreq", "base_frequency")
    assert clusters_of(t) == [(tuple(range(12)), 1.0), (tuple(range(12, 20)), 0.739)]


@pytest.mark.parametrize("rel, text, match", [
    ("cpu4/cache/index2/size", "big\n", "bad size"),
    ("cpu4/cache/index2/level", "two\n", "expected an integer"),
    ("cpu4/cache/index2/type", "Victim\n", "unknown cache type"),
    ("cpu4/cache/index2/shared_cpu_list", "0-3\n", "does not contain cpu4"),
])
def test_malformed_caches_leave_caches_unknown(tmp_path, rel, text, match):
    root = copy_fixture("kirin970", tmp_path)
    put(root, f"{CPU}/{rel}", text)
    t = detect_warns(match, root)
    big, little = t.clusters
    assert clusters_of(t) == [((4, 5, 6, 7), 1.0), ((0, 1, 2, 3), 0.451)]
    assert big.l1d is None and big.l2 is None
    assert little.l2.size == 1 << 20


def test_cache_without_size_is_skipped_quietly(tmp_path):
    # ARM firmware often describes levels without sizes.
    root = copy_fixture("kirin970", tmp_path)
    rm(root, f"{CPU}/cpu4/cache/index2/size")
    big = detect_quiet(root).clusters[0]
    assert big.l2 is None and big.l1d.size == 64 << 10


def test_bad_online_list_uses_cpu_directories(tmp_path):
    root = copy_fixture("rk3588", tmp_path)
    put(root, f"{CPU}/online", "0-\n")
    t = detect_warns("online", root)
    assert [c.cpus for c in t.clusters] == [(4, 5), (6, 7), (0, 1, 2, 3)]


def test_offline_cpus_are_left_out(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    put(root, f"{CPU}/online", "0-5\n")
    assert clusters_of(detect_quiet(root)) == [((4, 5), 1.0), ((0, 1, 2, 3), 0.451)]


def test_unreadable_file_kinds(tmp_path):
    root = copy_fixture("kirin970", tmp_path)
    rm(root, f"{CPU}/cpu2/cpu_capacity")
    os.makedirs(os.path.join(root, CPU, "cpu2", "cpu_capacity"))  # a directory, not a file
    t = detect_warns("cpu2/cpu_capacity: cannot read", root)
    assert t.source == "cpufreq"


def test_not_a_sysfs_tree(tmp_path):
    with pytest.raises(topo.TopologyError, match="not a directory"):
        topo.detect(str(tmp_path / "missing"))
    with pytest.raises(topo.TopologyError, match="describes no cpu"):
        topo.detect(str(tmp_path))


_GARBAGE = st.sampled_from(["", "\n", "garbage\n", "-7\n", "3-1\n", "1,,2\n", "0x10\n",
                            b"\xff\xfe\xfd", "nan\n", "999999999999999999999999 x\n", None])


@pytest.fixture(scope="module")
def fuzz_trees(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    return {name: copy_fixture(name, base) for name in ("kirin970", "rk3588", "i7_12700h")}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_never_crashes(fuzz_trees, data):
    name = data.draw(st.sampled_from(sorted(fuzz_trees)))
    root = fuzz_trees[name]
    files = sorted(os.path.relpath(os.path.join(d, f), root)
                   for d, _, fs in os.walk(root) for f in fs)
    ncpus = len(_sysfs.parse_cpulist(open(os.path.join(root, CPU, "online")).read()))
    chosen = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=6, unique=True))
    saved = {}
    for rel in chosen:
        with open(os.path.join(root, rel), "rb") as f:
            saved[rel] = f.read()
    try:
        for rel in chosen:
            bad = data.draw(_GARBAGE)
            rm(root, rel) if bad is None else put(root, rel, bad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", topo.TopologyWarning)
            t = topo.detect(root)
    finally:
        for rel, content in saved.items():
            put(root, rel, content)
    assert sorted(t.cpus) == list(range(ncpus))
    assert t.clusters[0].capacity == 1.0
    assert all(0 < c.capacity <= 1 for c in t.clusters)
    assert topo.Topology.from_dict(json.loads(json.dumps(t.to_dict()))) == t


# --------------------------------------------------------------------- readers, data model

@pytest.mark.parametrize("text, size", [("32K", 32 << 10), ("2048K", 2 << 20), ("2M", 2 << 20),
                                        ("1G", 1 << 30), ("512", 512), (" 64k ", 64 << 10)])
def test_parse_size(text, size):
    assert _sysfs.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "K", "1.5M", "32KB", "-1K"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        _sysfs.parse_size(text)


@given(st.sets(st.integers(0, 300), max_size=40))
@settings(max_examples=60)
def test_cpulist_round_trip(cpus):
    assert topo.parse_cpulist(topo.format_cpulist(cpus)) == tuple(sorted(cpus))


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "0-99999999"])
def test_parse_cpulist_rejects(text):
    with pytest.raises(ValueError):
        topo.parse_cpulist(text)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dict_round_trip(name):
    t = detect_quiet(fixture(name))
    assert topo.Topology.from_dict(json.loads(json.dumps(t.to_dict()))) == t


@pytest.mark.parametrize("cpus, message", [((0, 0), "lists a cpu twice"),
                                           ((-1,), "not a cpu number"),
                                           ((1 << 31,), "not a cpu number"),
                                           ((True,), "not a cpu number")])
def test_topologies_built_directly_are_checked(cpus, message):
    # a pool of two workers pinned to cpu 0, a worker on cpu -1, cffi's OverflowError before
    with pytest.raises(topo.TopologyError, match=message):
        topo.Topology(clusters=(topo.Cluster(name="a", cpus=cpus, capacity=1.0),))
    with pytest.raises(topo.TopologyError, match="beyond the 32768 cpus"):
        topo.parse_spec("x:0@1,y:2147483648@0.5")
