"""Co-running interference in the simulator (against hand-computed schedules), and the
simulator's calibration: its file format, how it becomes simulator inputs, and a tiny real
calibration run."""
import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asymo.lab import sim
from asymo.lab.sim import calibrate as simcal
from asymo.lab.sim.trace import TracedJob, trace_from_dict, trace_to_dict
from asymo.hw.topology import parse_spec

TWO = parse_spec("a:0,1@1.0")
FAST_SLOW = parse_spec("fast:0@1.0,slow:1@0.5")


# --- CoRunning: hand-computed schedules ------------------------------------------------------

def test_corunning_equal_tasks_both_slowed():
    # two 1 s tasks side by side at factor 0.8: each runs at 0.8 -> 1.25 s
    r = sim.simulate(TWO, sim.Job.uniform(2, 1.0), policy="even",
                     interference=[sim.CoRunning(0.8)])
    assert r.makespan == pytest.approx(1.25)
    assert r.busy == pytest.approx([1.25, 1.25])


def test_corunning_ends_when_the_other_core_goes_idle():
    # tasks of 1 s (core 0) and 2 s (core 1) at factor 0.5: both at half speed until core 0
    # finishes at t=2 (1 s of work done on core 1), then core 1 alone at full speed: t=3
    r = sim.simulate(TWO, sim.Job(costs=[1.0, 2.0]), policy="even",
                     interference=[sim.CoRunning(0.5)])
    assert r.makespan == pytest.approx(3.0)
    assert r.busy == pytest.approx([2.0, 3.0])


def test_corunning_counts_only_running_cores_under_a_duty_cycle():
    # core 1 is stopped in [0, 0.5) ms of every ms. Core 0: 1 ms of work; core 1: 0.3 ms.
    # [0, 0.5): core 0 alone, 0.5 done. [0.5, 1): both run at 0.5 -> core 0 0.75 done,
    # core 1 0.25 done. [1, 1.25): core 1 stopped, core 0 alone finishes at 1.25 ms.
    # [1.5, 1.55): core 1 alone does its last 0.05 ms.
    r = sim.simulate(TWO, sim.Job(costs=[1e-3, 0.3e-3]), policy="even",
                     interference=[sim.CoRunning(0.5), sim.DutyCycle(1, 0.5, 1e-3)])
    assert r.busy[0] == pytest.approx(1.25e-3)
    assert r.makespan == pytest.approx(1.55e-3)


def test_corunning_grows_with_the_number_of_co_runners_and_respects_its_group():
    three = parse_spec("a:0-2@1.0")
    # factor 0.8: with two others busy, 1 / (1 + 2 * 0.25) = 2/3 speed -> 1.5 s
    r = sim.simulate(three, sim.Job.uniform(3, 1.0), policy="even",
                     interference=[sim.CoRunning(0.8)])
    assert r.makespan == pytest.approx(1.5)
    assert sim.CoRunning(0.8).speed(0) == 1.0
    assert sim.CoRunning(0.8).speed(1) == pytest.approx(0.8)
    # only cores 0 and 1 share the resource: core 2 runs at full speed
    r = sim.simulate(three, sim.Job.uniform(3, 1.0), policy="even",
                     interference=[sim.CoRunning(0.8, cpus=(0, 1))])
    assert r.busy == pytest.approx([1.25, 1.25, 1.0])


def test_corunning_overheads_are_not_slowed():
    # one take overhead of 0.5 s before each 1 s task: the overheads run side by side at
    # full speed, then the tasks co-run at 0.5 -> 0.5 + 2.0
    r = sim.simulate(TWO, sim.Job.uniform(2, 1.0), policy="even",
                     overheads=sim.Overheads(task=0.5), interference=[sim.CoRunning(0.5)])
    assert r.makespan == pytest.approx(2.5)
    assert r.busy == pytest.approx([2.0, 2.0])


def test_corunning_bad_arguments():
    with pytest.raises(ValueError, match="factor"):
        sim.CoRunning(0.0)
    with pytest.raises(ValueError, match="factor"):
        sim.CoRunning(1.5)
    with pytest.raises(ValueError, match="cpus"):
        sim.CoRunning(0.9, cpus=(0, 0))
    with pytest.raises(ValueError, match="not in the topology"):
        sim.simulate(TWO, sim.Job.uniform(2, 1.0), interference=[sim.CoRunning(0.9, cpus=(5,))])


def test_duty_cycle_state_by_hand():
    d = sim.DutyCycle(cpu=1, busy=0.25, period=1e-3)
    assert d.state(0.0) == (0.0, pytest.approx(0.25e-3))
    assert d.state(0.3e-3) == (1.0, pytest.approx(1e-3))
    assert d.state(1e-3) == (0.0, pytest.approx(1.25e-3))
    assert d.state(0.25e-3) == (1.0, pytest.approx(1e-3))   # a boundary belongs to the next
    shifted = sim.DutyCycle(cpu=1, busy=0.5, period=1e-3, phase=0.5e-3)
    assert shifted.state(0.0) == (1.0, pytest.approx(0.5e-3))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(spec=st.sampled_from(["fast:0@1.0,slow:1@0.5", "a:0-3@1.0,b:4-5@0.4",
                             "a:0-1@1.0,b:2@0.6,c:3-4@0.2"]),
       policy=st.sampled_from(sim.POLICIES),
       n=st.integers(1, 60), seed=st.integers(0, 10 ** 6),
       kind=st.sampled_from(["none", "duty", "window"]))
def test_piecewise_engine_without_slowdown_matches_the_event_engine(spec, policy, n, seed,
                                                                    kind):
    # CoRunning(1.0) switches the simulator to its piecewise engine without changing any
    # rate: every schedule must come out as from the completion-event engine
    t = parse_spec(spec)
    rng = np.random.default_rng(seed)
    costs = rng.uniform(1e-6, 2e-4, (n, t.nclusters)) if seed % 2 else rng.uniform(1e-6, 2e-4, n)
    jobs = [sim.Job(costs=costs, delay=float(rng.uniform(0, 1e-4))),
            sim.Job.uniform(int(rng.integers(0, 20)), 3e-5)]
    ov = sim.Overheads(job=1e-6, task=float(rng.choice([0.0, 1e-7])),
                       steal=float(rng.choice([0.0, 5e-7])))
    itf = {"none": [],
           "duty": [sim.DutyCycle(cpu=t.cpus[-1], busy=0.5, period=1e-4,
                                  phase=float(rng.uniform(0, 1e-4)))],
           "window": [sim.Interference(cpu=t.cpus[0], speed=0.3, start=1e-4, stop=5e-4)]}[kind]
    a = sim.simulate(t, jobs, policy=policy, overheads=ov, interference=itf)
    b = sim.simulate(t, jobs, policy=policy, overheads=ov,
                     interference=itf + [sim.CoRunning(1.0)])
    assert b.tasks_run.sum() == a.tasks_run.sum() == sum(j.ntasks for j in jobs)
    if kind == "duty":
        # closed-form vs piecewise stop arithmetic may order an exact tie differently (about
        # 1 case in 1000): then the schedules differ, by less than a period
        assert b.makespan == pytest.approx(a.makespan, abs=1e-4)
        return
    assert b.makespan == pytest.approx(a.makespan, rel=1e-9)
    assert list(b.tasks_run) == list(a.tasks_run)
    assert b.steals.tolist() == a.steals.tolist()
    assert b.busy == pytest.approx(a.busy, rel=1e-9, abs=1e-15)


def test_corunning_slows_the_scaling_of_a_memory_bound_job():
    # the same job with and without co-running interference: only the multi-core run slows
    job = sim.Job.uniform(64, 1e-4)
    one = parse_spec("a:0@1.0")
    assert sim.simulate(one, job, interference=[sim.CoRunning(0.7)]).makespan == \
        pytest.approx(6.4e-3)
    free = sim.simulate(TWO, job, policy="asymo").makespan
    slowed = sim.simulate(TWO, job, policy="asymo", interference=[sim.CoRunning(0.7)]).makespan
    assert slowed == pytest.approx(free / 0.7)


# --- calibration data -> simulator inputs ----------------------------------------------------

def _trace(costs, gap=1e-4, counts=None):
    jobs = [TracedJob(fn=1, ntasks=len(costs), counts=counts, task_s=np.asarray(costs),
                      gap_s=gap)]
    return trace_to_dict((jobs, 2e-5))


def _cal(avail=0.45, factor=0.9, period=1e-3):
    top = parse_spec("c0:0@1,c0-emu0.5:1@0.5")
    top = type(top)(clusters=top.clusters, source=top.source, emulated={1: 0.5})
    return top, {
        "schema": simcal.SCHEMA, "topology": top.to_spec(), "emulated": {"1": 0.5},
        "emulator_period_s": period, "repeats": 1,
        "overheads": {"asymo": {"job": 1e-6, "task": 1e-8, "steal": 1e-8}},
        "workloads": {"w": {
            "description": "test", "task_s_fast": 4e-4,
            "traces": {"1": [_trace([1e-4] * 4, counts=[4])],
                       "2": [_trace([1e-4] * 4, counts=[3, 1]),
                             _trace([1e-4] * 4, counts=[3, 1])]},
            "emulated": {"1": {"availability": avail, "nominal": 0.5,
                               "lost_per_period_s": (0.5 - avail) * period}},
            "corun": {"factor": factor, "observed": factor, "corunner_busy_share": 1.0}}}}


def test_sim_inputs_from_a_calibration():
    top, cal = _cal()
    simcal.check_calibration(cal, top)
    jobs, itf = simcal.sim_inputs(cal, "w", 2, top, emulator_period=1e-3)
    assert [j.ntasks for j in jobs] == [4, 0]
    assert jobs[0].costs.shape == (4, 2) and list(jobs[0].split) == [3, 1]
    assert jobs[0].delay == pytest.approx(1e-4) and jobs[1].delay == pytest.approx(2e-5)
    duty = [i for i in itf if isinstance(i, sim.DutyCycle)]
    corun = [i for i in itf if isinstance(i, sim.CoRunning)]
    # availability 0.45 of a nominal 0.5: stopped 55% of each period
    assert len(duty) == 1 and duty[0].cpu == 1 and duty[0].busy == pytest.approx(0.55)
    assert len(corun) == 1 and corun[0].factor == pytest.approx(0.9)
    # the time lost per period (50 us) carries over to a shorter period: 0.5 + 50/250
    _, itf = simcal.sim_inputs(cal, "w", 2, top, emulator_period=0.25e-3)
    assert [i.busy for i in itf if isinstance(i, sim.DutyCycle)] == [pytest.approx(0.7)]
    # the model without the measured inputs: nominal stop, no co-running
    _, itf = simcal.sim_inputs(cal, "w", 2, top, corun=False, availability=False)
    assert len(itf) == 1 and itf[0].busy == pytest.approx(0.5)
    # one core: neither the emulated core nor co-running is there
    jobs, itf = simcal.sim_inputs(cal, "w", 1, top)
    assert itf == [] and jobs[0].costs.shape == (4, 1)
    with pytest.raises(ValueError, match="no workload"):
        simcal.sim_inputs(cal, "nope", 2, top)
    with pytest.raises(ValueError, match="on 3 cores"):
        simcal.sim_inputs(cal, "w", 3, top)


def test_traced_ratio_checks_traces_against_untraced_calls_without_changing_costs():
    top, cal = _cal()
    # no untraced calls measured (an older calibration): nothing to check
    assert simcal.traced_ratio(cal, "w") is None
    before, _ = simcal.sim_inputs(cal, "w", 2, top)
    # 1-core trace: 4 tasks of 100 us, 100 us of the submitter's work, 20 us tail, one job
    # of 1 us overhead; an untraced call of 341 us leaves 220 us for 400 us of traced tasks
    cal["workloads"]["w"]["untraced_1core_s"] = 341e-6
    simcal.check_calibration(cal, top)
    assert simcal.traced_ratio(cal, "w") == pytest.approx(400 / 220)
    after, _ = simcal.sim_inputs(cal, "w", 2, top)
    assert np.array_equal(after[0].costs, before[0].costs)     # a check, not a correction
    text = "\n".join(simcal.format_calibration(cal))
    assert "1.82" in text and "WARNING" in text and "w (1.82)" in text
    cal["workloads"]["w"]["untraced_1core_s"] = 521e-6          # 400 us left: consistent
    assert simcal.traced_ratio(cal, "w") == pytest.approx(1.0)
    assert "WARNING" not in "\n".join(simcal.format_calibration(cal))
    cal["workloads"]["w"]["untraced_1core_s"] = 100e-6          # less than the serial work
    assert simcal.traced_ratio(cal, "w") is None
    cal["workloads"]["w"]["untraced_1core_s"] = -1.0
    with pytest.raises(ValueError, match="untraced_1core_s"):
        simcal.check_calibration(cal, top)


def test_lower_availability_and_corunning_lower_the_simulated_throughput():
    top, cal = _cal(avail=0.4, factor=0.8)
    jobs, itf = simcal.sim_inputs(cal, "w", 2, top)
    _, itf0 = simcal.sim_inputs(cal, "w", 2, top, corun=False, availability=False)
    for pol in ("asymo", "even"):
        assert sim.simulate(top, jobs, policy=pol, interference=itf).makespan > \
            sim.simulate(top, jobs, policy=pol, interference=itf0).makespan


def test_calibration_file_round_trip_and_bad_files(tmp_path):
    top, cal = _cal()
    path = tmp_path / "cal.json"
    simcal.save_calibration(cal, path)
    assert simcal.load_calibration(path, top) == json.loads(path.read_text())
    # another machine's topology, another format, garbage, a missing file: a warning, None
    with pytest.warns(simcal.CalibrationWarning, match="topology"):
        assert simcal.load_calibration(path, parse_spec("a:0-3@1.0")) is None
    path.write_text(json.dumps({"schema": "something/else"}))
    with pytest.warns(simcal.CalibrationWarning, match="schema"):
        assert simcal.load_calibration(path) is None
    path.write_text("{not json")
    with pytest.warns(simcal.CalibrationWarning):
        assert simcal.load_calibration(path) is None
    with pytest.warns(simcal.CalibrationWarning):
        assert simcal.load_calibration(tmp_path / "missing.json") is None
    bad = json.loads(json.dumps(cal))
    bad["workloads"]["w"]["corun"]["factor"] = 3.0
    with pytest.raises(ValueError, match="co-running factor"):
        simcal.check_calibration(bad)
    bad = json.loads(json.dumps(cal))
    bad["workloads"]["w"]["traces"]["2"][0]["jobs"][0]["task_s"] = [1e-4, -1.0, 0, 0]
    with pytest.raises(ValueError, match="task times"):
        simcal.check_calibration(bad)
    text = "\n".join(simcal.format_calibration(cal))
    assert "0.450" in text and "0.900" in text and "50.0" in text


def test_trace_dict_round_trip_and_errors():
    d = _trace([1e-4, 2e-4, 3e-4], counts=[2, 1])
    jobs, tail = trace_from_dict(json.loads(json.dumps(d)))
    assert tail == pytest.approx(2e-5)
    assert jobs[0].counts == (2, 1) and jobs[0].task_s == pytest.approx([1e-4, 2e-4, 3e-4])
    for broken in ({"jobs": [dict(d["jobs"][0], counts=[1, 1])], "tail_s": 0.0},
                   {"jobs": [dict(d["jobs"][0], ntasks=5)], "tail_s": 0.0},
                   {"jobs": d["jobs"], "tail_s": -1.0},
                   {"jobs": [{"fn": 1}], "tail_s": 0.0}):
        with pytest.raises(ValueError):
            trace_from_dict(broken)


def test_interquartile_mean():
    assert simcal.interquartile_mean([1.0, 2.0, 3.0]) == pytest.approx(2.0)
    # a burst of outside interference (the 100) does not count
    assert simcal.interquartile_mean([1, 2, 3, 100, 2, 2, 3, 1]) == pytest.approx(2.25)


# --- a real (tiny) calibration ------------------------------------------------------------

def test_calibrate_sim_tiny_run_on_this_machine():
    pytest.importorskip("asymo.runtime.pool")
    import os

    from asymo.lab import scaling
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores")
    top = parse_spec(f"a:{cpus[0]},{cpus[1]}@1.0")
    wl = scaling.SpinWorkload(ntasks=16, iters=2000)
    cal = simcal.calibrate_sim(top, [wl], repeats=1, min_time=0.0, max_external=1.0,
                               rounds=1, sample_s=0.001)
    simcal.check_calibration(json.loads(json.dumps(cal)), top)
    e = cal["workloads"]["spin"]
    assert set(e["traces"]) == {"1", "2"}
    assert sum(j["ntasks"] for j in e["traces"]["2"][0]["jobs"]) == 16
    assert e["task_s_fast"] > 0
    assert 0 < e["corun"]["factor"] <= 1 and 0 < e["corun"]["corunner_busy_share"] <= 1
    assert e["emulated"] == {}
    assert e["untraced_1core_s"] > 0 and e["untraced_samples"] >= 3
    # None when this tiny call is too short to tell its tasks from its serial work. A 1 ms
    # run has no dependable upper bound (the untraced call can leave a sliver of time for the
    # tasks and the ratio read 104 once); the arithmetic is checked exactly above.
    ratio = simcal.traced_ratio(cal, "spin")
    assert ratio is None or (ratio > 0 and math.isfinite(ratio))
    jobs, itf = simcal.sim_inputs(cal, "spin", 2, top)
    assert math.isfinite(sim.simulate(top, jobs, policy="asymo", interference=itf).makespan)


def test_emulator_period_comes_from_the_running_emulator(monkeypatch):
    monkeypatch.setenv("ASYMO_EMULATED_PERIOD", "0.00025")
    assert simcal.default_period() == pytest.approx(0.25e-3)
    monkeypatch.setenv("ASYMO_EMULATED_PERIOD", "soon")
    with pytest.warns(simcal.CalibrationWarning, match="ASYMO_EMULATED_PERIOD"):
        period = simcal.default_period()
    from asymo.lab.emulate import DEFAULT_PERIOD
    assert period == DEFAULT_PERIOD
    monkeypatch.delenv("ASYMO_EMULATED_PERIOD")
    assert simcal.default_period() == DEFAULT_PERIOD
