"""``asymo bench scaling``: JSON schema, plot, errors; measured runs kept tiny."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from asymo.lab import scaling
from asymo.lab.machine import thread_ids
from asymo.cli import main

POINT_KEYS = {"workload", "policy", "cores", "throughput", "unit", "time_s", "cpus", "speedup"}


def _run(capsys, *argv):
    rc = main(["bench", "scaling", "--no-progress", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _check_schema(doc, mode):
    assert doc["schema"] == "asymo.bench.scaling/1"
    assert doc["mode"] == mode
    assert doc["points"]
    for p in doc["points"]:
        assert POINT_KEYS <= set(p)
        assert p["throughput"] > 0 and p["time_s"] > 0
        assert len(p["cpus"]) == p["cores"]
    assert doc["label"].startswith("SIMULATED" if mode == "simulated" else "MEASURED")


def test_simulate_preset_json_and_plot(tmp_path, capsys):
    js, png = tmp_path / "k.json", tmp_path / "k.png"
    rc, out, _ = _run(capsys, "--simulate", "kirin970", "--workload", "spin,matmul",
                      "--json", str(js), "--plot", str(png))
    assert rc == 0
    assert "SIMULATED: kirin970" in out and "asymo" in out
    doc = json.loads(js.read_text())
    _check_schema(doc, "simulated")
    pts = {(p["workload"], p["policy"], p["cores"]): p["throughput"] for p in doc["points"]}
    assert {w for w, _, _ in pts} == {"spin", "matmul"}
    assert {c for _, _, c in pts} == set(range(1, 9))
    for wl in ("spin", "matmul"):
        # the collapse paradox: adding the first little core slows an even split (OpenBLAS's
        # static split, modelled as 'numpy') down ...
        assert pts[(wl, "numpy", 5)] < pts[(wl, "numpy", 4)]
        # ... while asymo's split keeps scaling and leads on the whole machine (for matmul, one
        # little core next to four big ones gains nothing yet: the plan's task granularity
        # leaves it ~1% behind the big cluster alone, so it may only not lose much)
        assert pts[(wl, "asymo", 5)] > (0.98 if wl == "matmul" else 1.0) * pts[(wl, "asymo", 4)]
        assert pts[(wl, "asymo", 8)] > 1.3 * pts[(wl, "asymo", 4)]
        assert pts[(wl, "asymo", 8)] > 1.25 * pts[(wl, "numpy", 8)]
    # equal spin tasks: the pool's even policy collapses too
    assert pts[("spin", "even", 5)] < pts[("spin", "even", 4)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_three_clusters_with_overheads(tmp_path, capsys):
    js = tmp_path / "p6.json"
    rc, out, _ = _run(capsys, "--simulate", "pixel6", "--workload", "spin",
                      "--policies", "asymo,even", "--sim-overheads", "20,1,2",
                      "--json", str(js))
    assert rc == 0
    doc = json.loads(js.read_text())
    assert doc["meta"]["overheads_s"] == {"job": 20e-6, "task": 1e-6, "steal": 2e-6}
    assert {p["policy"] for p in doc["points"]} == {"asymo", "even"}
    assert "x1" in out and "a55" in out


@pytest.mark.parametrize("argv, msg", [
    (["--simulate", "m1-max"], "unknown CPU preset"),
    (["--emulate", "1:1.5"], "speed"),
    (["--emulate", "one"], "CPU:SPEED"),
    (["--workload", "bert"], "unknown workload"),
    (["--simulate", "sd845", "--validate-sim"], "cannot be combined"),
    (["--repeats", "0"], "--repeats"),
    (["--simulate", "sd845", "--sim-overheads", "1,2"], "three numbers"),
    (["--emulator-period", "0.00025"], "needs --emulate"),
    (["--sim-corun", "0.9"], "use it with --simulate"),
    (["--simulate", "sd845", "--sim-corun", "1.5"], "(0, 1]"),
    (["--sim-calibration", "c.json"], "read by --validate-sim"),
    (["--simulate", "sd845", "--calibrate-sim", "c.json"], "cannot be combined"),
    (["--simulate", "sd845", "--plot", "k.xyz"], "unknown image format 'xyz'"),
])
def test_bad_arguments_exit_2_with_a_message(capsys, argv, msg):
    rc, _, err = _run(capsys, *argv)
    assert rc == 2
    assert msg in err


def test_parse_emulate():
    assert scaling.parse_emulate("1:0.5") == {1: 0.5}
    assert scaling.parse_emulate("1:0.5, 3:0.25") == {1: 0.5, 3: 0.25}
    with pytest.raises(ValueError, match="twice"):
        scaling.parse_emulate("1:0.5,1:0.4")
    with pytest.raises(ValueError):
        scaling.parse_emulate("")


def test_process_affinity_restores_every_thread():
    import threading
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        before = {tid: os.sched_getaffinity(tid) for tid in thread_ids()}
        first = min(os.sched_getaffinity(0))
        with scaling.process_affinity([first]):
            for tid in before:
                assert os.sched_getaffinity(tid) == {first}
        assert {tid: os.sched_getaffinity(tid) for tid in before} == before
    finally:
        stop.set()
        t.join()


def test_numpy_im2col_baseline_matches_reference():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    got = scaling.im2col_conv(x, w, stride=2, padding=1)
    # direct reference: sum over channels and the window
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    oh, ow = (9 + 2 - 3) // 2 + 1, (8 + 2 - 3) // 2 + 1
    ref = np.zeros((2, 4, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
            ref[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_measured_numpy_baseline_tiny(tmp_path, capsys):
    js = tmp_path / "np.json"
    rc, out, _ = _run(capsys, "--workload", "matmul", "--policies", "numpy", "--repeats", "1",
                      "--min-time", "0", "--max-cores", "2", "--max-external-load", "1",
                      "--json", str(js))
    assert rc == 0
    doc = json.loads(js.read_text())
    _check_schema(doc, "measured")
    assert {p["policy"] for p in doc["points"]} == {"numpy"}
    assert "MEASURED" in out


def test_measured_spin_with_validation_tiny(tmp_path, capsys):
    pytest.importorskip("asymo.runtime.pool")
    js, png = tmp_path / "m.json", tmp_path / "m.png"
    rc, out, _ = _run(capsys, "--workload", "spin", "--repeats", "1", "--min-time", "0",
                      "--max-external-load", "1", "--validate-sim", "--json", str(js),
                      "--plot", str(png))
    assert rc == 0
    doc = json.loads(js.read_text())
    _check_schema(doc, "measured")
    ncores = doc["topology"]["clusters"] and sum(len(c["cpus"]) for c in
                                                 doc["topology"]["clusters"])
    assert {p["policy"] for p in doc["points"]} == set(scaling.POOL_POLICIES)
    assert {p["cores"] for p in doc["points"]} == set(range(1, ncores + 1))
    assert set(doc["sim_error"]) == set(scaling.POOL_POLICIES)
    assert all(np.isfinite(v) for v in doc["sim_error"].values())
    val = doc["validation"]
    assert val["calibration"]["workloads"]["spin"]["task_s_fast"] > 0
    assert "traces" in val["calibration"]["workloads"]["spin"]
    assert val["primary"] == "spin"
    assert all("sim_throughput" in p for p in doc["points"])
    assert all(p["samples_total"] == p["samples_clean"] == 1 for p in doc["points"])
    assert all(0.0 <= p["external_load"] <= 1.0 for p in doc["points"])
    assert "simulator vs measurement" in out
    assert "tr/un" in out and "bench/sim_validation_summary.py" in out
    assert "traced_over_untraced_1core" in val["model"]
    assert png.exists()
    # the stored sweep validates again to the same figures (bench/sim_revalidate.py)
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "sim_revalidate", Path(__file__).resolve().parent.parent / "bench" / "sim_revalidate.py")
    reval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reval)
    again = reval.revalidate(reval.load(str(js)))
    assert again.keys() == {("spin", p) for p in doc["sim_error"]}
    for (_, pol), err in again.items():
        assert err == pytest.approx(doc["sim_error"][pol], rel=1e-9, abs=1e-12)


def test_simulate_with_interference(tmp_path, capsys):
    js = tmp_path / "i.json"
    rc, _, _ = _run(capsys, "--simulate", "kirin970", "--workload", "spin",
                    "--policies", "asymo,steal", "--interfere", "5:0.3", "--json", str(js))
    assert rc == 0
    doc = json.loads(js.read_text())
    assert doc["meta"]["interference"] == [{"cpu": 5, "speed": 0.3, "start_s": 0.0,
                                            "stop_s": None}]
    tp = {(p["policy"], p["cores"]): p["throughput"] for p in doc["points"]}
    # cpu 5 (the second A73) joins at 2 cores: two cores then give less than 2x one core
    assert tp[("asymo", 2)] < 1.5 * tp[("asymo", 1)]
    # 'steal' may move the slowed big core's work to the little cores; asymo may not
    assert tp[("steal", 8)] > tp[("asymo", 8)]


def test_parse_interference():
    w = scaling.parse_interference("4:0.5,5:0:2:10")
    assert (w[0].cpu, w[0].speed, w[0].start) == (4, 0.5, 0.0)
    assert (w[1].cpu, w[1].speed, w[1].start, w[1].stop) == (5, 0.0, 0.002, 0.01)
    with pytest.raises(ValueError, match="bad interference"):
        scaling.parse_interference("4:0.5:1")
    with pytest.raises(ValueError, match="bad interference"):
        scaling.parse_interference("4:2")


def test_other_load_counts_foreign_processes_not_our_children():
    import subprocess
    import sys
    import time

    from asymo.lab.loadmon import OtherLoad
    mon = OtherLoad()
    if not mon.available:
        pytest.skip("no /proc/<pid>/schedstat here")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert child.pid in mon._ours([child.pid, os.getpid()])
    finally:
        child.kill()
        child.wait()
    # an orphan (its parent exits at once) is not ours: its busy loop must show up
    subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time\n"
                    "t = time.time() + 0.8\nwhile time.time() < t: pass' &"], check=True)
    time.sleep(0.1)
    snap = mon.snapshot()
    time.sleep(0.5)
    assert mon.share_since(snap) >= 0.1


def test_calibrate_sim_file_then_validation_reads_it(tmp_path, capsys):
    pytest.importorskip("asymo.runtime.pool")
    cal = tmp_path / "cal.json"
    rc, out, _ = _run(capsys, "--workload", "spin", "--repeats", "1", "--min-time", "0",
                      "--max-external-load", "1", "--max-cores", "1",
                      "--calibrate-sim", str(cal))
    assert rc == 0 and "simulator calibration" in out and "MEASURED" not in out
    doc = json.loads(cal.read_text())
    assert doc["schema"] == "asymo.sim.calibration/1" and "spin" in doc["workloads"]
    # a broken file is reported and replaced by a fresh measurement
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    js = tmp_path / "v.json"
    with pytest.warns(UserWarning, match="ignoring simulator calibration"):
        rc, out, err = _run(capsys, "--workload", "spin", "--repeats", "1", "--min-time", "0",
                            "--max-external-load", "1", "--validate-sim",
                            "--sim-calibration", str(bad), "--json", str(js))
    assert rc == 0 and "measuring the simulator's inputs instead" in err
    assert set(json.loads(js.read_text())["sim_error"]) == set(scaling.POOL_POLICIES)


def test_simulate_with_corunning(tmp_path, capsys):
    js = tmp_path / "c.json"
    rc, _, _ = _run(capsys, "--simulate", "rk3588", "--workload", "spin", "--policies",
                    "asymo", "--sim-corun", "0.8", "--json", str(js))
    assert rc == 0
    doc = json.loads(js.read_text())
    assert doc["meta"]["corun_factor"] == 0.8
    tp = {p["cores"]: p["throughput"] for p in doc["points"]}
    free = scaling.simulate_scaling("rk3588", scaling.make_workloads(["spin"]),
                                    policies=["asymo"])
    tp0 = {p.cores: p.throughput for p in free.points}
    assert tp[1] == pytest.approx(tp0[1])
    # two big cores slowing each other to 0.8: 2 x 0.8 of one core
    assert tp[2] == pytest.approx(0.8 * tp0[2], rel=0.02)
