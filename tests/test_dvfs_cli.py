"""``asymo dvfs status`` / ``asymo dvfs plan`` on a fake Kirin 970 tree."""
import json

from asymo.cli import main

from _dvfs_fakes import make_kirin970

SPEC = "big:4-7@1.0,little:0-3@0.58"


def test_status_reports_control_meters_and_estimates(tmp_path, capsys):
    make_kirin970(tmp_path, opp="devicetree", dpc={0: 140, 4: 530})
    assert main(["dvfs", "status", "--sysfs-root", str(tmp_path), "--topology", SPEC]) == 0
    out = capsys.readouterr().out
    assert "big (cpus 4-7): driver cpufreq-dt, governor schedutil, 9 frequencies 682-2362 MHz;"\
        " settable via userspace" in out
    assert "no power meter: energy is ESTIMATED" in out
    assert "dynamic-power-coefficient=530" in out
    assert main(["dvfs", "status", "--json", "--sysfs-root", str(tmp_path), "--topology",
                 SPEC]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["clusters"]["little"]["method"] == "userspace"
    assert d["power_model"]["measured"] is False


def test_plan_prints_both_modes_and_changes_nothing(tmp_path, capsys):
    paths = make_kirin970(tmp_path)
    args = ["dvfs", "plan", "--sysfs-root", str(tmp_path), "--topology", SPEC,
            "--shapes", "3136,576,64;1,4096,4096"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "latency-first" in out and "energy-first" in out and "ESTIMATED" in out
    assert main(args + ["--json", "--scale-all"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["estimated"] and not d["applied"]
    assert not any(c["fixed_at_max"] for c in d["clusters"])
    with open(f"{paths['big']}/scaling_governor") as f:
        assert f.read().strip() == "schedutil"
