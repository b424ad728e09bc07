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
    from asymo.lab import scaling
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
    from asymo.lab import scaling
    res = scaling.simulate_scaling("kirin970", scaling.make_workloads(["spin"]),
                                   policies=["asymo"], max_cores=5,
                                   interference=scaling.parse_interference("4:0:0:1,0:0.5"))
    thr = {p.cores: p.throughput for p in res.points}
    plain = scaling.simulate_scaling("kirin970", scaling.make_workloads(["spin"]),
                                     policies=["asymo"], max_cores=5)
    ref = {p.cores: p.throughput for p in plain.points}
    assert all(0 < thr[k] < ref[k] for k in thr)


def test_simulated_table_and_plot_say_what_was_assumed(capsys):
    from asymo.lab import scaling
    rc, out, err = _run(capsys, "--simulate", "big:0-1@1.0,little:2-3@0.5", "--workload",
                        "spin", "--policies", "asymo", "--interfere", "1:0.5,2:0.25:1:3",
                        "--sim-corun", "0.9")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("simulated with: "))
    assert "per-core GFLOP/s big 10, little 5 (assumed: 10 x capacity" in line
    assert "cpu 1 at 0.5 of its speed for the whole run" in line
    assert "cpu 2 at 0.25 of its speed from 1 to 3 ms" in line
    assert "co-running factor 0.9" in line
    res = scaling.simulate_scaling("kirin970", scaling.make_workloads(["spin"]),
                                   policies=["asymo"], max_cores=5)
    assert "per-core GFLOP/s a73 8.8, a53 5.1 (the preset's)" in res.sim_conditions()
    assert "no interference; no co-running slowdown" in res.sim_conditions()
    import matplotlib.pyplot as plt
    fig = res.figure()
    try:
        assert "no interference" in fig._suptitle.get_text()
        assert fig.axes[0].get_ylabel() == "GFLOP/s (simulated)"
    finally:
        plt.close(fig)


def test_plot_marks_simulated_points_in_the_legend_and_clusters_on_the_axis():
    import matplotlib.pyplot as plt
    from asymo.lab import scaling
    from asymo.hw.topology import parse_spec
    topo = parse_spec("big:0@1.0,little:1@0.5")
    pts = [scaling.Point(workload="spin", policy="asymo", cores=k, throughput=10.0 * k,
                         unit="GFLOP/s", time_s=1.0, cpus=list(range(k)),
                         sim_throughput=9.0 * k) for k in (1, 2)]
    long_desc = "spin: " + "x" * 100
    res = scaling.ScalingResult(points=pts, mode="measured", topology=topo,
                                workloads={"spin": long_desc})
    fig = res.figure()
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["asymo", "hollow: simulated"]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1\nbig", "2\nlittle"]
        assert ax.get_title().endswith("...") and len(ax.get_title()) == 70
        assert "MEASURED" in fig._suptitle.get_text()
        assert ax.get_ylabel() == "GFLOP/s"
    finally:
        plt.close(fig)


def test_help_fills_the_description_and_keeps_the_examples(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["bench", "scaling", "--help"])
    text = capsys.readouterr().out
    desc, _, rest = text.partition("options:")
    assert "Throughput of matmul" in desc
    assert max(len(ln) for ln in desc.splitlines()[1:]) <= 80   # below the usage lines
    examples = rest.partition("examples:")[2].splitlines()
    assert any(ln.startswith("  asymo bench scaling --simulate kirin970 --sim-profile")
               for ln in examples)                               # one command per line
    assert "default 0.0005, from 0.0001 to 0.1" in " ".join(rest.split())
