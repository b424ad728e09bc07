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
