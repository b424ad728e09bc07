"""``asymo info``: JSON and table output for fixtures, the live machine, overrides, errors."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from asymo.hw import topology as topo
from asymo.cli import info as info_cli
from asymo.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(HERE, "fixtures", "sysfs")
with open(os.path.join(HERE, "fixtures", "sysfs_expected.json")) as _f:
    EXPECTED = {k: v for k, v in json.load(_f).items() if not k.startswith("_")}


def run_cli(*args, env=None):
    """``python -m asymo ARGS`` in a fresh process with the ASYMO_* variables cleared."""
    base = {k: v for k, v in os.environ.items()
            if k not in (topo.ENV_VAR, topo.EMULATED_ENV_VAR)}
    base["PYTHONPATH"] = ROOT + os.pathsep + base.get("PYTHONPATH", "")
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "asymo", *args], capture_output=True,
                          text=True, env=base, cwd=ROOT, timeout=60)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    monkeypatch.delenv(topo.EMULATED_ENV_VAR, raising=False)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_json_for_every_fixture(name):
    r = run_cli("info", "--json", "--sysfs-root", os.path.join(FIXTURES, name))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    t = json.loads(r.stdout)["topology"]
    want = EXPECTED[name]
    assert t["source"] == want["source"]
    assert [c["cpus"] for c in t["clusters"]] == [c["cpus"] for c in want["clusters"]]
    assert [c["capacity"] for c in t["clusters"]] == pytest.approx(
        [c["capacity"] for c in want["clusters"]], abs=1e-3)
    assert [c["name"] for c in t["clusters"]] == [c["name"] for c in want["clusters"]]
    for c in t["clusters"]:
        assert {"l1d", "l2", "l3", "min_freq_khz", "max_freq_khz", "available_freqs_khz",
                "cpufreq_policy", "cpufreq_policies"} <= set(c)


def test_json_details_kirin970():
    r = run_cli("info", "--json", "--sysfs-root", os.path.join(FIXTURES, "kirin970"))
    big, little = json.loads(r.stdout)["topology"]["clusters"]
    assert big["l2"] == {"level": 2, "size": 2 << 20, "shared_cpus": [4, 5, 6, 7],
                         "line_size": 64}
    assert (little["min_freq_khz"], little["max_freq_khz"]) == (509000, 1844000)
    assert big["available_freqs_khz"][-1] == 2362000
    assert big["cpufreq_policy"].endswith(os.path.join("cpufreq", "policy4"))


def test_json_here_one_cluster():
    r = run_cli("info", "--json")
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["topology"]
    usable = sorted(os.sched_getaffinity(0))
    if t["source"] != "single":
        pytest.skip(f"not the symmetric development machine (source {t['source']})")
    assert [c["cpus"] for c in t["clusters"]] == [usable]
    if usable == [0, 1]:
        assert t["clusters"][0]["cpus"] == [0, 1] and t["clusters"][0]["capacity"] == 1.0


def test_emulated_topology_from_environment():
    r = run_cli("info", "--json", env={topo.ENV_VAR: "fast:0@1,slow:1@0.5",
                                       topo.EMULATED_ENV_VAR: "1:0.5"})
    if 1 not in os.sched_getaffinity(0) or 0 not in os.sched_getaffinity(0):
        pytest.skip("needs cpus 0 and 1")
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["topology"]
    assert [(c["cpus"], c["capacity"]) for c in t["clusters"]] == [([0], 1.0), ([1], 0.5)]
    assert t["emulated"] == {"1": 0.5}
    r = run_cli("info", env={topo.ENV_VAR: "fast:0@1,slow:1@0.5",
                             topo.EMULATED_ENV_VAR: "1:0.5"})
    lines = r.stdout.splitlines()
    slow = next(line for line in lines if line.startswith("slow"))
    assert slow.split()[1] == "1*"
    assert any("emulated slow cores: cpu1 at 0.5" in line for line in lines)


def test_table_for_fixture():
    r = run_cli("info", "--sysfs-root", os.path.join(FIXTURES, "pixel6"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("CPU topology: 3 clusters, 8 cpus (source: cpu_capacity")
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert rows["big"][1:5] == ["6-7", "1.000", "64K/1", "512K/1"]
    assert rows["mid"][1:3] == ["4-5", "0.487"]
    assert rows["little"][1:3] == ["0-3", "0.157"]
    assert "300-1803" in lines[4] and lines[4].rstrip().endswith("policy0")


def test_table_hybrid_marks_estimate():
    r = run_cli("info", "--sysfs-root", os.path.join(FIXTURES, "i7_12700h"))
    assert "ratio of base frequencies, an estimate" in r.stdout
    assert "12 policies in" in r.stdout and "1.25M/2" in r.stdout


def test_topology_option(tmp_path):
    r = run_cli("info", "--json", "--sysfs-root", os.path.join(FIXTURES, "rk3588"),
                "--topology", "x:4-7@1,y:0-3@0.4")
    t = json.loads(r.stdout)["topology"]
    assert t["source"] == "override"
    assert [c["name"] for c in t["clusters"]] == ["x", "y"]
    assert len(t["clusters"][0]["cpufreq_policies"]) == 2


@pytest.mark.parametrize("args, match", [
    (["--topology", "big:0-3@fast"], "capacity 'fast' of 'big' is not a number"),
    (["--sysfs-root", "/nonexistent/sysfs"], "is not a directory"),
])
def test_errors_exit_2_with_message(args, match):
    r = run_cli("info", *args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert "asymo info: error:" in r.stderr and match in r.stderr


def test_malformed_tree_warns_on_stderr(tmp_path):
    root = os.path.join(str(tmp_path), "kirin")
    shutil.copytree(os.path.join(FIXTURES, "kirin970"), root)
    with open(os.path.join(root, "devices/system/cpu/cpu3/cpu_capacity"), "w") as f:
        f.write("???\n")
    r = run_cli("info", "--json", "--sysfs-root", root)
    assert r.returncode == 0
    assert r.stderr.startswith("asymo info: warning: cpu_capacity:")
    assert json.loads(r.stdout)["topology"]["source"] == "cpufreq"


def test_help_explains_the_format():
    r = run_cli("info", "--help")
    assert r.returncode == 0
    assert "big:0-3@1.0,little:4-7@0.45" in r.stdout and "--sysfs-root" in r.stdout


def test_in_process_main_and_info_hook(capsys):
    assert main(["info", "--json", "--sysfs-root", os.path.join(FIXTURES, "sdm845")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"sysfs_root", "topology", "profile", "matmul_fast"}
    t = topo.Topology.from_dict(out["topology"])
    assert [c.cpus for c in t.clusters] == [(4, 5, 6, 7), (0, 1, 2, 3)]
    # The hook: extra sections appear in JSON, and in the table once they have a renderer.
    info = info_cli.build_info(t)
    info["extra"] = {"answer": 42}
    assert "extra" not in info_cli.render_text(info)
    assert info_cli.render_text(info).startswith("CPU topology: 2 clusters")
