"""``asymo bench scaling`` as a first-time user meets it: every mistake on the command line
gets a one-line error naming the problem (no traceback, nothing measured first), and what a
simulated run assumed is printed beside its figures."""
import pytest

from asymo.cli import main


def _run(capsys, *argv):
    rc = main(["bench", "scaling", "--no-progress", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv, match", [
    (("--simulate", "kirin970", "--policies", "asymo,nosuch"),
     "unknown policy 'nosuch'"),
    (("--simulate", "kirin970", "--policies", "torch"),
     "torch is not simulated"),
    (("--simulate", "kirin970", "--policies", ","), "--policies is empty"),
    (("--policies", "asym"), "unknown policy 'asym'"),
])
def test_bad_policies_are_clear_errors(capsys, argv, match):
    rc, out, err = _run(capsys, *argv, "--workload", "spin")
    assert rc == 2
    assert match in err and "Traceback" not in err
    assert "asymo, even, shared, steal" in err   # says what the choices are
    assert out == ""                              # nothing ran


def test_measure_scaling_rejects_an_unknown_policy_before_measuring():
    from asymo import scaling
    with pytest.raises(ValueError, match="unknown policy 'asym'"):
        scaling.measure_scaling([scaling.SpinWorkload(ntasks=2, iters=10)], policies=["asym"],
                                repeats=1, min_time=0.0, progress=False)


@pytest.mark.parametrize("option", ["--json", "--plot", "--calibrate-sim"])
def test_unwritable_output_is_reported_before_the_run(tmp_path, capsys, option):
    missing = tmp_path / "no" / "such" / "out.file"
    argv = ["--workload", "spin"] + (["--simulate", "kirin970"]
                                     if option != "--calibrate-sim" else [])
    rc, out, err = _run(capsys, *argv, option, str(missing))
    assert rc == 2 and out == ""
    assert f"{option} {missing}: directory {missing.parent} does not exist" in err
    rc, out, err = _run(capsys, *argv, option, str(tmp_path))
    assert rc == 2 and out == "" and "is a directory" in err


def test_a_write_that_fails_after_the_run_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import builtins
    real_open = builtins.open
    target = str(tmp_path / "k.json")

    def failing_open(path, *a, **kw):
        if str(path) == target:
            raise OSError(28, "No space left on device", target)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", failing_open)
    rc, out, err = _run(capsys, "--simulate", "kirin970", "--workload", "spin",
                        "--max-cores", "2", "--json", target)
    assert rc == 1 and "SIMULATED: kirin970" in out
    assert f"cannot write {target}: No space left on device" in err


@pytest.mark.parametrize("argv, match", [
    (("--emulate", "4095:0.5"), "--emulate 4095:0.5: cpu 4095 is not in this process's "
                                "affinity mask"),
    (("--emulate", "0:0.5", "--emulator-period", "100"), "period must be in"),
    (("--emulate", ""), "emulation spec is empty"),
])
def test_emulator_refusals_are_clear_errors(capsys, argv, match):
    import os
    rc, out, err = _run(capsys, "--workload", "spin", "--repeats", "1", *argv)
    assert rc == 2 and out == ""
    assert match in err and "Traceback" not in err
    assert "ASYMO_EMULATED" not in os.environ     # nothing left running


@pytest.mark.parametrize("spec, match", [
    ("9:0.5", "interference on cpu 9, which the simulated topology (a73:4-7@1,"),
    ("4:0", "interference stops cpu 4 for the whole run"),
])
def test_interference_the_simulation_cannot_apply_is_an_error(capsys, spec, match):
    rc, out, err = _run(capsys, "--simulate", "kirin970", "--workload", "spin",
                        "--interfere", spec)
    assert rc == 2 and out == "" and match in err


def test_a_stop_window_and_a_slow_core_still_simulate(capsys):
    from asymo import scaling
    res = scaling.simulate_scaling("kirin970", scaling.make_workloads(["spin"]),
                                   policies=["asymo"], max_cores=5,
                                   interference=scaling.parse_interference("4:0:0:1,0:0.5"))
    thr = {p.cores: p.throughput for p in res.points}
    plain = scaling.simulate_scaling("kirin970", scaling.make_workloads(["spin"]),
                                     policies=["asymo"], max_cores=5)
    ref = {p.cores: p.throughput for p in plain.points}
    assert all(0 < thr[k] < ref[k] for k in thr)
