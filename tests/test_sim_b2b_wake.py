"""Issue 9: back-to-back samples (duty-cycle phase carried over between calls) and the
submitter's wake-up past its spin, against hand-computed schedules."""
import math
import re
from pathlib import Path

import numpy as np
import pytest

from asymo.lab import scaling
from asymo.lab.machine import asymo_attr
from asymo.lab.sim import CoRunning, DutyCycle, Job, Overheads, simulate
from asymo.lab.sim import calibrate as simcal
from asymo.lab.sim.engine import SUBMIT_SPIN_S
from asymo.hw.topology import parse_spec

US = 1e-6
MS = 1e-3


def two_cores():
    return parse_spec("a:0-1@1.0")


def test_spin_matches_pool_c():
    # the C pool's constant, as its header defines it (the simulator reads it through cffi)
    root = Path(__file__).resolve().parent.parent / "csrc"
    src = "".join(h.read_text() for h in sorted(root.rglob("*.h")))
    ns = int(re.search(r"ASYMO_POOL_SUBMIT_SPIN_NS = (\d+)", src).group(1))
    assert SUBMIT_SPIN_S == pytest.approx(ns * 1e-9)
    assert Overheads().spin == SUBMIT_SPIN_S


@pytest.mark.parametrize("piecewise", [False, True])
@pytest.mark.parametrize("costs,expected_us", [
    # a 10 us spin (the pool's submit_spin_us = 10)
    # worker 0 (the submitter) idle at 1 us, last task ends at 100 us: waited 99 us > spin
    ((1, 100), 100 + 50),
    # the job ends on the submitter's core: no wait
    ((100, 95), 100),
    # the submitter waits 5 us, within its 10 us spin: no wake-up
    ((100, 105), 105),
    # 11 us > spin
    ((100, 111), 111 + 50),
])
def test_wake_only_past_the_spin(costs, expected_us, piecewise):
    job = Job(costs=np.array(costs) * US)
    itf = [CoRunning(factor=1.0)] if piecewise else []   # CoRunning: the piecewise loop
    res = simulate(two_cores(), [job], policy="even",
                   overheads=Overheads(wake=50 * US, spin=10 * US), interference=itf)
    assert res.makespan == pytest.approx(expected_us * US, rel=1e-9)
    # no wake cost configured: plain makespan
    res0 = simulate(two_cores(), [job], policy="even", interference=itf)
    assert res0.makespan == pytest.approx(max(costs) * US, rel=1e-9)


@pytest.mark.parametrize("piecewise", [False, True])
def test_default_spin_covers_a_tail(piecewise):
    # the pool's default poll (ASYMO_POOL_SUBMIT_SPIN_NS, 1 ms) outlasts a 99 us tail: no
    # wake-up; a tail past it pays one
    itf = [CoRunning(factor=1.0)] if piecewise else []
    for costs, expected_us in (((1, 100), 100), ((1, 1200), 1200 + 50)):
        res = simulate(two_cores(), [Job(costs=np.array(costs) * US)], policy="even",
                       overheads=Overheads(wake=50 * US), interference=itf)
        assert res.makespan == pytest.approx(expected_us * US, rel=1e-9)


def test_wake_delays_the_next_job():
    jobs = [Job(costs=np.array([1, 100]) * US), Job(costs=np.array([100, 1]) * US, delay=2 * US)]
    res = simulate(two_cores(), jobs, policy="even",
                   overheads=Overheads(wake=30 * US, spin=10 * US))
    # job 1: 100 + 30 wake; job 2: delay 2 + 100, ends on the submitter's core
    assert res.job_makespans == pytest.approx([130 * US, 102 * US], rel=1e-9)


def test_wake_and_spin_validated():
    with pytest.raises(ValueError, match="wake"):
        Overheads(wake=-1.0)
    with pytest.raises(ValueError, match="spin"):
        Overheads(spin=math.nan)
    assert Overheads(wake=1e-6).to_dict()["wake"] == 1e-6
    assert "wake" not in Overheads().to_dict()


@pytest.mark.parametrize("piecewise", [False, True])
def test_back_to_back_phase_carries_over(piecewise):
    # cpu 1 stopped in [k ms, k ms + 0.5 ms); two 0.2 ms tasks per call, even policy.
    # call 1: cpu 1 waits out the stop, runs 0.5-0.7 -> 0.7 ms
    # call 2: starts 0.7, runs 0.7-0.9 within the running half -> 0.2 ms
    # call 3: starts 0.9, runs 0.1 ms, stopped 1.0-1.5, 0.1 ms more -> ends 1.6: 0.7 ms
    job = Job(costs=np.array([0.2, 0.2]) * MS)
    itf = [DutyCycle(cpu=1, busy=0.5, period=1 * MS)]
    if piecewise:
        itf.append(CoRunning(factor=1.0))
    res = simulate(two_cores(), [job] * 3, policy="even", interference=itf)
    assert res.job_makespans == pytest.approx([0.7 * MS, 0.2 * MS, 0.7 * MS], rel=1e-6)
    # a gap between calls (the submitter's own work) moves the next call's phase:
    # 0.3 ms gap after 0.7 -> call 2 starts at 1.0, inside a stop -> ends 1.7 (0.3 + 0.7)
    gapped = Job(costs=np.array([0.2, 0.2]) * MS, delay=0.3 * MS)
    res = simulate(two_cores(), [job, gapped], policy="even", interference=itf)
    assert res.job_makespans == pytest.approx([0.7 * MS, 1.0 * MS], rel=1e-6)


def test_back_to_back_calls_count():
    assert scaling.back_to_back_calls(10 * MS, 1 * MS) == 4
    assert scaling.back_to_back_calls(0.1, 1 * MS) == 1
    assert scaling.back_to_back_calls(1 * US, 1 * MS) == scaling.SIM_BACK_TO_BACK_MAX
    assert scaling.back_to_back_calls(0.0, 1 * MS) == 1


def test_sim_mean_back_to_back_hand_computed():
    # one 0.2 ms call per sample (two tasks, even); R = 32 calls (40 periods / 0.2+ ms)
    # phase 0 (stops at [k, k + 0.5) ms): the first three calls end at 1.6 ms (as in
    # test_back_to_back_phase_carries_over); from there a 2 ms cycle of 5 calls
    # (1.6-1.8-2.0 | stop | 2.5-2.7-2.9 | stop to 3.5 | -3.6): 0.2, 0.2, 0.7, 0.2, 0.7 ms.
    # 29 calls after the third = 5 cycles (ends 11.6 ms) + 0.2, 0.2, 0.7, 0.2 -> 12.9 ms.
    job = Job(costs=np.array([0.2, 0.2]) * MS)
    duty = [DutyCycle(cpu=1, busy=0.5, period=1 * MS)]
    res = scaling.sim_mean(two_cores(), [job], "even", Overheads(), duty, back_to_back=True)
    assert res.calls == 32
    runs = [simulate(two_cores(), [job] * 32, policy="even",
                     interference=scaling.phased(duty, i, scaling.SIM_PHASES)).makespan / 32
            for i in range(scaling.SIM_PHASES)]
    assert runs[0] == pytest.approx(12.9 * MS / 32, rel=1e-6)
    assert res.makespan == pytest.approx(np.mean(runs), rel=1e-12)
    # a single call averaged over phases is not the same figure: phase 0 gives 0.7 ms,
    # phase 0.25 ms (stops at [0.75, 1.25)) gives 0.2 ms ...
    one = scaling.sim_mean(two_cores(), [job], "even", Overheads(), duty)
    assert one.calls == 1
    assert one.makespan != pytest.approx(res.makespan, rel=1e-3)
    # no duty cycle: one call, back to back or not
    plain = scaling.sim_mean(two_cores(), [job], "even", Overheads(), [], back_to_back=True)
    assert plain.calls == 1 and plain.makespan == pytest.approx(0.2 * MS)


def test_old_calibration_has_no_wake(capsys):
    assert simcal.submitter_wake({"schema": simcal.SCHEMA}) == 0.0
    assert "no submitter wake-up" in capsys.readouterr().out
    assert simcal.submitter_wake({"submitter_wake_s": 5e-5}) == 5e-5


def test_check_calibration_rejects_bad_wake():
    cal = {"schema": simcal.SCHEMA, "workloads": {}, "submitter_wake_s": -1.0}
    with pytest.raises(ValueError, match="submitter_wake_s"):
        simcal.check_calibration(cal)
    cal["submitter_wake_s"] = 4e-5
    simcal.check_calibration(cal)
    assert any("wake-up" in line for line in simcal.format_calibration(
        {**cal, "workloads": {}}))


def test_measure_wake_one_core():
    wake, info = simcal.measure_submitter_wake(parse_spec("a:0@1.0"))
    assert wake == 0.0 and "one core" in info["note"]


def test_measure_wake_on_this_machine():
    import os
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores")
    pytest.importorskip("numba")
    if asymo_attr("Pool") is None:
        pytest.skip("native pool not built")
    wake, info = simcal.measure_submitter_wake(two_cores(), jobs=30, task_s=200e-6)
    # a futex wake-up: positive, far below the 200 us the submitter slept
    assert 0.0 <= wake < 200e-6
    assert info["over_longest_s"]["worker_short"] >= 0.0
    assert info["task_s"] == pytest.approx(200e-6, rel=0.5)
