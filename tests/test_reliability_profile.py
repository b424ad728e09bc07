"""Issue 17, items 5 and 7: profile and calibration files that are not regular files, too big or
too deep, and sections whose values are of the wrong type or out of range."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from asymo import profile as prof
from asymo.plan import calibration as calib
from asymo.hw.topology import detect, parse_spec
from asymo.lab.sim.calibrate import CalibrationWarning, load_calibration
from asymo.lab.sim.costs import load_model_costs
from asymo.pipeline import timemodel as tm
from asymo.plan import costmodel as cm
from asymo.plan import gemm as gp
from asymo.profile.files import NotRegularFileError, read_json_file, read_regular_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO = parse_spec("big:0@1.0,little:1@0.5")
MODEL = cm.CostPredictor(features="table2", coef=[1e-9, 0, 0, 0, 1e-7], intercept=2e-5)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def zero_link(tmp_path):
    link = tmp_path / "profile.json"
    link.symlink_to("/dev/zero")
    return link


# -- item 5: only regular files, size-limited, never blocking --------------------------------------
def test_reader_refuses_what_is_not_a_regular_file(tmp_path, fifo, zero_link):
    with pytest.raises(NotRegularFileError, match="character device"):
        read_regular_file(zero_link)  # a user symlink is followed, to what it leads to
    with pytest.raises(NotRegularFileError, match="FIFO"):
        read_regular_file(fifo)  # and opening the FIFO did not wait for a writer
    with pytest.raises(NotRegularFileError, match="character device"):
        read_regular_file("/dev/urandom")
    with pytest.raises(NotRegularFileError, match="directory"):
        read_regular_file(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(ValueError, match="more than the 1024"):
        read_regular_file(big, max_bytes=1024)
    link = tmp_path / "link.json"
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2]}')
    link.symlink_to(good)
    assert read_json_file(link) == {"a": [1, 2]}
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match="nested deeper"):
        read_json_file(deep)
    deep.write_text("[" * 100 + "]" * 100)
    with pytest.raises(ValueError, match="nested deeper than 64"):
        read_json_file(deep)


@pytest.mark.parametrize("target", ["zero", "fifo", "/dev/urandom"])
def test_asymo_profile_env_that_is_not_a_file(tmp_path, target):
    if target == "zero":
        path = tmp_path / "p.json"
        path.symlink_to("/dev/zero")
    elif target == "fifo":
        path = tmp_path / "p.json"
        os.mkfifo(path)
    else:
        path = target
    # a child process with its address space capped: reading /dev/zero whole fails fast
    code = textwrap.dedent("""
        import resource, warnings
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        import numpy as np
        import asymo
        from asymo.cli import main
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = asymo.matmul(np.ones((64, 64)), np.ones((64, 64)))
        assert (r == 64).all()
        assert any("not a regular file" in str(w.message) for w in caught), caught
        main(["info"])
        print("OK")
    """)
    env = dict(os.environ, ASYMO_PROFILE=str(path), PYTHONPATH=REPO)
    env.pop("ASYMO_TOPOLOGY", None)
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading ASYMO_PROFILE={target} hung")
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr
    assert "unusable" in p.stdout


def test_sim_profile_and_simulator_calibration_loaders(tmp_path, fifo):
    with pytest.raises(ValueError, match="not a regular file"):
        load_model_costs(fifo, TWO)  # asymo bench scaling --sim-profile
    with pytest.warns(CalibrationWarning, match="not a regular file"):
        assert load_calibration(str(fifo)) is None
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.warns(CalibrationWarning, match="nested deeper"):
        assert load_calibration(str(deep)) is None  # not a RecursionError
    with pytest.raises(ValueError, match="nested deeper"):
        load_model_costs(deep, TWO)


# -- item 7: section values of the wrong type or out of range ---------------------------------------
def _gemm_section(topology, **cluster_updates):
    return {
        "schema": 1, "dtype": "float32", "isa": gp.best_isa(), "tile": [6, 16],
        "load_source": "proc_stat", "topology": topology.to_spec(),
        "clusters": [dict({
            "name": c.name, "cpus": list(c.cpus), "threads": c.ncpus,
            "model": MODEL.to_dict(), "model_name": "table2",
            "capability_gflops": {"mm": 10.0, "mv": 5.0},
            "cache": {"l1_bytes": 32768, "l2_bytes": 1 << 20, "l2_sharing": c.ncpus, "mr": 6,
                      "nr": 16, "itemsize": 4, "unit": 16}}, **cluster_updates)
            for c in topology.clusters]}


@pytest.mark.parametrize("update, match", [
    ({"capability_gflops": {"mm": 1e308, "mv": 5.0}}, "capability"),
    ({"capability_gflops": {"mm": True, "mv": 5.0}}, "capability"),
    ({"threads": 10 ** 9}, "threads"),
    ({"threads": True}, "threads"),
    ({"cache": {"l1_bytes": 1 << 50, "l2_bytes": 1 << 20, "l2_sharing": 1, "mr": 6,
                "nr": 16, "itemsize": 4, "unit": 16}}, "cache"),
    ({"model": "garbage"}, None),
    ({"model": {"features": ["x"]}}, None),
])
def test_gemm_section_ranges_and_types(update, match):
    assert calib.parse_section(_gemm_section(TWO), TWO).clusters[0].capability["mm"] == 10.0
    with pytest.raises(ValueError, match=match):
        calib.parse_section(_gemm_section(TWO, **update), TWO)


def test_a_huge_capability_warns_and_matmul_still_works(tmp_path, monkeypatch):
    from asymo.plan import matmul as mplan
    monkeypatch.setenv("ASYMO_TOPOLOGY", TWO.to_spec())
    topo = detect()
    p = prof.Profile.new(topo, path=str(tmp_path / "p.json"))
    p.sections[calib.SECTION] = _gemm_section(
        topo, capability_gflops={"mm": 1e308, "mv": 1e308})
    monkeypatch.setenv("ASYMO_PROFILE", prof.save_profile(p))
    mplan.clear_cache()
    prof.reset_active_profile()
    try:
        a = np.random.default_rng(0).standard_normal((300, 200))
        with pytest.warns(UserWarning, match="capability"):
            r = __import__("asymo").matmul(a, a.T)
        np.testing.assert_allclose(r, a @ a.T, rtol=1e-10, atol=1e-9)
    finally:
        monkeypatch.delenv("ASYMO_PROFILE")
        monkeypatch.delenv("ASYMO_TOPOLOGY")
        mplan.clear_cache()
        prof.reset_active_profile()


class _FakeProfile:
    def __init__(self, section):
        self.sections = {tm.SECTION: section}


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(models=[]),
    lambda d: d.update(models={}),
    lambda d: d.update(models="squeezenet"),
    lambda d: d.update(multicore=[1, 2]),
    lambda d: d.update(multicore="x"),
    lambda d: d.update(kernel_level_cores=-5),
    lambda d: d.update(kernel_level_cores=1e9),
    lambda d: d.update(capacities=[-1.0]),
    lambda d: d["models"].update({next(iter(d["models"])): []}),
])
def test_pipeline_section_types_and_ranges(mutate):
    topo = detect()
    good = tm.LayerTimeModel.reference().to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tm.TimeModelWarning)
        tm.LayerTimeModel.load(topo, _FakeProfile(good))
    bad = json.loads(json.dumps(good))
    mutate(bad)
    with pytest.warns(tm.TimeModelWarning, match="unusable"):
        m = tm.LayerTimeModel.load(topo, _FakeProfile(bad))
    assert m.kernel_level_cores is None or m.kernel_level_cores >= 1
    m.reference_config  # noqa: B018 - the default model is usable
