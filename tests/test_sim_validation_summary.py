"""bench/sim_validation_summary.py: pooling several --validate-sim sweeps, on edge input."""
import gzip
import importlib.util
import json
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "bench" / "sim_validation_summary.py"


@pytest.fixture(scope="module")
def summary():
    spec = importlib.util.spec_from_file_location("sim_validation_summary", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sweep(path, workloads, period=5e-4):
    """A validation JSON: ``workloads`` = {name: (measured, simulated) at 2 cores}."""
    val = {"model": {"emulator_period_s": period}, "workloads": {}}
    for name, (meas, sim) in workloads.items():
        pts = []
        for pol in ("asymo", "even", "shared", "steal"):
            pts.append({"policy": pol, "cores": 1, "measured": 1.0, "simulated": 1.0,
                        "error_speedup": 0.0})
            pts.append({"policy": pol, "cores": 2, "measured": meas, "simulated": sim,
                        "error_speedup": sim / meas - 1})
        val["workloads"][name] = {"points": pts}
    path.write_text(json.dumps({"meta": {"loadavg_before": 1.0, "loadavg_after": 1.5},
                                "points": [], "validation": val}))
    return str(path)


def test_a_sweep_without_a_workload_does_not_shift_the_others(summary, tmp_path):
    a = _sweep(tmp_path / "a.json", {"matmul": (10.0, 10.5)})                   # +5%
    b = _sweep(tmp_path / "b.json", {"spin": (10.0, 13.0), "matmul": (10.0, 13.0)})  # +30%
    rows, _ = summary.summarize([summary.load(a), summary.load(b)], 0.10)
    spin = next(r for r in rows if r["workload"] == "spin" and r["policy"] == "asymo")
    # spin's only error is sweep b's (+30%), not sweep a's
    assert spin["errors"][0] is None and spin["errors"][1] == pytest.approx(0.30)
    assert spin["mean"] == pytest.approx(0.30) and spin["within"] == 0


def test_per_sweep_counts_follow_the_sweeps(summary, tmp_path, capsys):
    a = _sweep(tmp_path / "a.json", {"matmul": (10.0, 10.5)})
    b = _sweep(tmp_path / "b.json", {"spin": (10.0, 13.0), "matmul": (10.0, 13.0)})
    assert summary.main([a, b]) == 0
    out = capsys.readouterr().out
    # sweep a: its 4 matmul cells within 10%; sweep b: none of its 8 cells
    assert "per sweep 4/4, 0/8" in out


def test_mixed_periods_are_grouped(summary, tmp_path, capsys):
    a = _sweep(tmp_path / "a.json", {"matmul": (10.0, 10.5)}, period=5e-4)
    b = _sweep(tmp_path / "b.json", {"matmul": (10.0, 13.0)}, period=1e-3)
    c = _sweep(tmp_path / "c.json", {"matmul": (10.0, 10.0)}, period=None)
    assert summary.main([a, b, c]) == 0
    out = capsys.readouterr().out
    assert "no emulator: 1 sweeps" in out and "period 0.5 ms: 1 sweeps" in out
    assert "period 1 ms: 1 sweeps" in out


@pytest.mark.parametrize("content, match", [
    (json.dumps({"points": []}), "no validation"),
    (json.dumps([1, 2]), "no validation"),
    ("{not json", "not a JSON"),
])
def test_bad_files_are_named(summary, tmp_path, content, match):
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(SystemExit, match=match) as e:
        summary.load(str(p))
    assert str(p) in str(e.value)


def test_corrupt_gzip_is_named(summary, tmp_path):
    p = tmp_path / "x.json.gz"
    p.write_bytes(gzip.compress(b'{"validation": {}}')[:-6])
    with pytest.raises(SystemExit, match="not a JSON"):
        summary.load(str(p))
