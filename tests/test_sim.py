"""asymo.lab.sim: the pool simulator against hand-computed schedules, and its presets."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asymo.lab import sim
from asymo.hw.topology import Topology, parse_spec

FAST_SLOW = parse_spec("fast:0@1.0,slow:1@0.5")


def test_even_split_waits_for_the_slow_core():
    # 60 tasks of 1 ms: each core gets 30; the slow core needs 30 * 2 ms.
    r = sim.simulate(FAST_SLOW, sim.Job.uniform(60, 1e-3), policy="even")
    assert r.makespan == pytest.approx(60e-3)
    assert list(r.tasks_run) == [30, 30]
    assert r.busy[0] == pytest.approx(30e-3)
    assert r.busy[1] == pytest.approx(60e-3)
    assert r.steals.sum() == 0


def test_asymo_split_is_ideal_on_fast_plus_slow():
    # capacity split 2:1 -> 40 tasks at 1 ms and 20 at 2 ms: both finish at 40 ms = ideal.
    r = sim.simulate(FAST_SLOW, sim.Job.uniform(60, 1e-3), policy="asymo")
    assert r.makespan == pytest.approx(40e-3)
    assert r.ideal_makespan == pytest.approx(60e-3 / 1.5)
    assert r.efficiency == pytest.approx(1.0)
    assert list(r.tasks_run) == [40, 20]


@pytest.mark.parametrize("policy", sim.POLICIES)
def test_symmetric_machine_all_policies_ideal(policy):
    t = parse_spec("a:0-3@1.0")
    r = sim.simulate(t, sim.Job.uniform(64, 1e-3), policy=policy)
    assert r.makespan == pytest.approx(16e-3)


def test_steal_policy_takes_back_half_of_last_range():
    # Two equal cores, 8 tasks of 1 s: worker 1 takes task 4 and then its core stops for
    # 100 s. Worker 0 runs 0-3 (t=4), steals half of [5, 8) -> [6, 8) (t=6), then [5, 6).
    t = parse_spec("a:0-1@1.0")
    stall = sim.Interference(cpu=1, speed=0.0, start=0.0, stop=100.0)
    r = sim.simulate(t, sim.Job.uniform(8, 1.0), policy="steal", interference=[stall])
    assert r.makespan == pytest.approx(101.0)
    assert list(r.tasks_run) == [7, 1]
    assert list(r.steal_ops) == [2, 0]
    assert list(r.tasks_stolen) == [3, 0]
    assert r.job_makespans == [pytest.approx(101.0)]


def test_slower_never_steals_from_faster_under_asymo_but_does_under_steal():
    # The fast core is nearly stopped for a while: under 'steal' the slow core takes its
    # work; under 'asymo' it may not, and the fast core finishes its own tasks later.
    itf = [sim.Interference(cpu=0, speed=0.05, start=0.0, stop=0.05)]
    job = sim.Job.uniform(60, 1e-3)
    r_steal = sim.simulate(FAST_SLOW, job, policy="steal", interference=itf)
    r_asymo = sim.simulate(FAST_SLOW, job, policy="asymo", interference=itf)
    assert r_steal.steals_by_direction["slower_from_faster"] > 0
    assert r_asymo.steals_by_direction["slower_from_faster"] == 0
    assert r_asymo.tasks_run[1] == 20


def test_faster_cluster_steals_from_slower_under_asymo():
    # The slow core is stopped for 1 s: the fast core takes over its queue.
    itf = [sim.Interference(cpu=1, speed=0.0, start=0.0, stop=1.0)]
    r = sim.simulate(FAST_SLOW, sim.Job.uniform(60, 1e-3), policy="asymo", interference=itf)
    assert r.steals_by_direction["faster_from_slower"] == 19  # all but the task in hand
    assert r.tasks_run[1] == 1
    assert r.makespan == pytest.approx(1.002)


def test_interference_window_stretches_a_task():
    one = parse_spec("a:0@1.0")
    # 1 s of work; half speed during [0, 1): 0.5 done by t=1, the rest by t=1.5
    r = sim.simulate(one, sim.Job.uniform(1, 1.0),
                     interference=[sim.Interference(cpu=0, speed=0.5, start=0, stop=1)])
    assert r.makespan == pytest.approx(1.5)
    # overlapping windows multiply; a window that never ends at speed 0 never finishes
    r = sim.simulate(one, sim.Job.uniform(1, 1.0),
                     interference=[sim.Interference(cpu=0, speed=0.5, start=0, stop=2),
                                   sim.Interference(cpu=0, speed=0.5, start=0, stop=2)])
    assert r.makespan == pytest.approx(2.5)
    r = sim.simulate(one, sim.Job.uniform(1, 1.0),
                     interference=[sim.Interference(cpu=0, speed=0.0, start=0.5)])
    assert math.isinf(r.makespan)


def test_overheads_per_job_and_take_and_chunking():
    one = parse_spec("a:0@1.0")
    ov = sim.Overheads(job=1e-4, task=1e-5, steal=0.0)
    # long tasks: the chunk stays one task, one take each
    r = sim.simulate(one, sim.Job.uniform(10, 1e-3), policy="even", overheads=ov)
    assert r.makespan == pytest.approx(1e-4 + 10 * (1e-3 + 1e-5))
    # tiny tasks: chunks grow (1, 2, 4, ...), so far fewer takes than tasks
    r = sim.simulate(one, sim.Job.uniform(1000, 1e-6), policy="even", overheads=ov)
    takes = (r.makespan - 1e-4 - 1000e-6) / 1e-5
    assert 5 < round(takes) < 100
    # the shared counter is one atomic increment per task
    r = sim.simulate(one, sim.Job.uniform(1000, 1e-6), policy="shared", overheads=ov)
    assert r.makespan == pytest.approx(1e-4 + 1000 * (1e-6 + 1e-5))


def test_jobs_run_one_after_another():
    jobs = [sim.Job.uniform(6, 1e-3), sim.Job.uniform(3, 2e-3)]
    r = sim.simulate(FAST_SLOW, jobs, policy="asymo", overheads=sim.Overheads(job=1e-4))
    assert r.job_makespans == [pytest.approx(4e-3 + 1e-4), pytest.approx(4e-3 + 1e-4)]
    assert r.makespan == pytest.approx(sum(r.job_makespans))


def test_per_cluster_costs_and_true_speeds():
    # 2-D costs: tasks take 1 ms on the fast cluster and 4 ms on the slow one, although the
    # pool believes the slow core has half the speed: asymo's 2:1 split now leaves the slow
    # core last unless the fast one steals.
    costs = np.tile([1e-3, 4e-3], (30, 1))
    r = sim.simulate(FAST_SLOW, sim.Job(costs=costs), policy="asymo")
    assert r.steals_by_direction["faster_from_slower"] > 0
    assert r.makespan < 10 * 4e-3
    # given true speeds, 1-D costs are scaled by them
    r = sim.simulate(FAST_SLOW, sim.Job.uniform(30, 1e-3), policy="even", speeds=[1.0, 0.25])
    assert r.makespan == pytest.approx(15 * 4e-3)


def test_split_counts_matches_the_pools_rule():
    assert sim.split_counts(60, [1.0, 0.5]) == [40, 20]
    assert sim.split_counts(10, [1, 1, 1]) == [4, 3, 3]
    assert sim.split_counts(0, [1, 2]) == [0, 0]
    pool = pytest.importorskip("asymo.runtime.pool")
    rng = np.random.default_rng(1)
    for _ in range(50):
        w = list(rng.uniform(0.1, 1.0, rng.integers(1, 5)))
        n = int(rng.integers(0, 500))
        assert sim.split_counts(n, w) == list(pool._largest_remainder(n, w))


def test_explicit_split_counts_and_ratio():
    r = sim.simulate(FAST_SLOW, sim.Job.uniform(60, 1e-3, split=[30, 30]), policy="asymo")
    # an even split leaves the slow core 15 tasks behind at 30 ms; the fast core steals
    # halves of its queue and the job still ends near the ideal 40 ms (even alone: 60 ms)
    assert r.steals_by_direction["faster_from_slower"] > 0
    assert r.makespan == pytest.approx(40e-3, rel=0.05)
    r = sim.simulate(FAST_SLOW, sim.Job.uniform(60, 1e-3, split=[2.0, 1.0]), policy="asymo")
    assert r.makespan == pytest.approx(40e-3)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="policy"):
        sim.simulate(FAST_SLOW, sim.Job.uniform(4, 1.0), policy="fifo")
    with pytest.raises(ValueError, match="split"):
        sim.simulate(FAST_SLOW, sim.Job.uniform(4, 1.0, split=[4]), policy="asymo")
    with pytest.raises(ValueError, match="sum"):
        sim.simulate(FAST_SLOW, sim.Job.uniform(4, 1.0, split=[1, 1]), policy="asymo")
    with pytest.raises(ValueError, match="costs"):
        sim.Job(costs=[1.0, -1.0])
    with pytest.raises(ValueError, match="costs"):
        sim.Job(costs=np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="columns"):
        sim.simulate(FAST_SLOW, sim.Job(costs=np.ones((4, 3))))
    with pytest.raises(ValueError, match="cpu 7"):
        sim.simulate(FAST_SLOW, sim.Job.uniform(4, 1.0),
                     interference=[sim.Interference(cpu=7, speed=0.5)])
    with pytest.raises(ValueError, match="speed"):
        sim.Interference(cpu=0, speed=1.5)
    with pytest.raises(ValueError, match="Overheads.task"):
        sim.Overheads(task=-1)
    with pytest.raises(ValueError, match="speeds"):
        sim.simulate(FAST_SLOW, sim.Job.uniform(4, 1.0), speeds=[1.0])
    with pytest.raises(ValueError, match="unknown CPU preset"):
        sim.get_preset("m1-max")
    with pytest.raises(TypeError):
        sim.simulate(42, sim.Job.uniform(4, 1.0))


topologies = st.sampled_from([
    "a:0@1.0,b:1@0.5",
    "a:0-1@1.0,b:2-5@0.4",
    "x:0@1.0,y:1-2@0.5,z:3-6@0.2",
    "p:0-2@1.0,e:3-6@0.37",
])


@settings(max_examples=40, deadline=None)
@given(spec=topologies, policy=st.sampled_from(sim.POLICIES),
       costs=st.lists(st.floats(1e-6, 1e-2), min_size=1, max_size=120),
       itf=st.lists(st.tuples(st.integers(0, 6), st.floats(0.0, 1.0), st.floats(0, 0.05),
                              st.floats(1e-4, 0.05)), max_size=3),
       overhead=st.floats(0, 1e-5))
def test_every_task_runs_once_and_asymo_never_steals_upward(spec, policy, costs, itf,
                                                             overhead):
    t = parse_spec(spec)
    windows = [sim.Interference(cpu=c % t.ncpus, speed=s, start=a, stop=a + d)
               for c, s, a, d in itf]
    r = sim.simulate(t, sim.Job(costs=costs), policy=policy, interference=windows,
                     overheads=sim.Overheads(job=overhead, task=overhead, steal=overhead))
    assert int(r.tasks_run.sum()) == len(costs)
    assert int(r.steals.sum()) == int(r.tasks_stolen.sum())
    assert r.makespan >= r.ideal_makespan * (1 - 1e-9)
    assert np.all(r.busy <= r.makespan * (1 + 1e-9))
    if policy == "asymo":
        assert r.steals_by_direction["slower_from_faster"] == 0
    if policy in ("even", "shared"):
        assert r.steal_ops.sum() == 0


@pytest.mark.parametrize("name", sim.preset_names())
def test_presets_load_and_are_consistent(name):
    p = sim.get_preset(name)
    t = p.topology
    assert isinstance(t, Topology) and t.source == "preset"
    caps = [c.capacity for c in t.clusters]
    assert caps[0] == 1.0 and caps == sorted(caps, reverse=True) and t.is_asymmetric
    assert len(p.gflops_per_core) == t.nclusters
    assert all(g > 0 for g in p.gflops_per_core)
    for c in t.clusters:
        assert c.l1d.size >= 32 * 1024 and c.l2.size >= 64 * 1024 and c.max_freq_khz > 0
    assert {"capacity", "caches"} <= set(p.sources)
    assert Topology.from_dict(t.to_dict()) == t
    r = sim.simulate(name, sim.Job.uniform(40 * t.ncpus, 1e-4), policy="asymo")
    assert r.efficiency > 0.85
    r_even = sim.simulate(name, sim.Job.uniform(40 * t.ncpus, 1e-4), policy="even")
    assert r_even.makespan > r.makespan


def test_preset_numbers_documented():
    k = sim.get_preset("Kirin970")
    assert [c.ncpus for c in k.topology.clusters] == [4, 4]
    assert k.topology.clusters[1].capacity == pytest.approx(5.1 / 8.8)
    p6 = sim.get_preset("pixel6")
    assert [c.ncpus for c in p6.topology.clusters] == [2, 2, 4]
    assert p6.topology.clusters[1].capacity == pytest.approx(620 * 2253 / (1024 * 2802))
    intel = sim.get_preset("intel-6p8e")
    assert [c.ncpus for c in intel.topology.clusters] == [6, 8]
    assert sim.get_preset("rk3588").topology.clusters[1].capacity == pytest.approx(
        530 * 1.8 / (1024 * 2.4))
    assert sim.get_preset("sd845").topology.ncpus == 8


def test_first_cores_adds_fastest_cluster_first():
    t = sim.get_preset("pixel6").topology
    assert sim.first_cores(t, 1).cpus == (6,)
    sub = sim.first_cores(t, 3)
    assert sub.cpus == (6, 7, 4) and [c.name for c in sub.clusters] == ["x1", "a76"]
    assert sub.clusters[1].capacity == t.clusters[1].capacity
    assert sim.first_cores(t, 8) == t.replace(emulated={})
    with pytest.raises(ValueError):
        sim.first_cores(t, 0)


def test_result_to_dict_is_plain_data():
    import json
    r = sim.simulate("sd845", sim.Job.uniform(100, 1e-4), policy="steal")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["policy"] == "steal" and len(d["workers"]) == 8
    assert set(d["steals_by_direction"]) == {"same_cluster", "faster_from_slower",
                                             "slower_from_faster"}


# --- the emulator's duty cycle, the submitting thread's work, traced task costs ---------------

def test_duty_cycle_finish_by_hand():
    d = sim.DutyCycle(cpu=1, busy=0.5, period=1e-3)     # stopped in [0, 0.5) ms of each ms
    assert d.finish(0.0, 0.1e-3) == pytest.approx(0.6e-3)    # waits out the first stop
    assert d.finish(0.0, 0.5e-3) == pytest.approx(1.0e-3)
    assert d.finish(0.0, 0.6e-3) == pytest.approx(1.6e-3)    # 0.5 ms, stop, 0.1 ms
    assert d.finish(0.7e-3, 0.5e-3) == pytest.approx(1.7e-3)
    assert d.finish(0.0, 1.0e-3) == pytest.approx(2.0e-3)
    assert d.finish(0.2e-3, 0.0) == pytest.approx(0.2e-3)
    shifted = sim.DutyCycle(cpu=1, busy=0.5, period=1e-3, phase=0.5e-3)
    assert shifted.finish(0.0, 0.1e-3) == pytest.approx(0.1e-3)  # starts in a running half
    assert shifted.finish(0.0, 0.6e-3) == pytest.approx(1.1e-3)
    with pytest.raises(ValueError, match="busy"):
        sim.DutyCycle(cpu=1, busy=1.0)
    with pytest.raises(ValueError, match="period"):
        sim.DutyCycle(cpu=1, busy=0.5, period=0)


def test_duty_cycle_is_stop_and_go_not_uniformly_slow():
    # one 0.1 ms task per worker under 'even': the stopped core finishes at 0.6 ms, while a
    # uniformly half-speed core would take 0.2 ms
    same = parse_spec("a:0,1@1.0")
    job = sim.Job.uniform(2, 1e-4)
    r = sim.simulate(same, job, policy="even", interference=[sim.DutyCycle(1, 0.5, 1e-3)])
    assert r.makespan == pytest.approx(0.6e-3)
    r = sim.simulate(same, job, policy="even", interference=[sim.Interference(1, 0.5)])
    assert r.makespan == pytest.approx(0.2e-3)
    # over many periods the average speed is 1 - busy: 40 tasks of 0.1 ms take 8 ms
    r = sim.simulate(same, sim.Job.uniform(80, 1e-4), policy="even",
                     interference=[sim.DutyCycle(1, 0.5, 1e-3)])
    assert r.makespan == pytest.approx(8e-3)
    with pytest.raises(ValueError, match="both"):
        sim.simulate(same, job, interference=[sim.DutyCycle(1, 0.5), sim.Interference(1, 0.5)])


def test_job_delay_is_the_submitters_serial_work():
    jobs = [sim.Job.uniform(2, 1e-3, delay=0.5e-3), sim.Job(costs=np.zeros(0), delay=2e-3)]
    r = sim.simulate(parse_spec("a:0,1@1.0"), jobs, policy="asymo",
                     overheads=sim.Overheads(job=1e-4))
    # 0.5 ms + 0.1 ms job overhead + 1 ms of tasks, then 2 ms + 0.1 ms
    assert r.makespan == pytest.approx(3.7e-3)
    assert r.job_makespans == pytest.approx([1.6e-3, 2.1e-3])
    with pytest.raises(ValueError, match="delay"):
        sim.Job.uniform(1, 1e-3, delay=-1.0)


def test_trace_records_each_job_and_task():
    pool_mod = pytest.importorskip("asymo.runtime.pool")
    from asymo.runtime.ffi import lib
    from asymo.lab.sim.trace import trace_jobs
    topo2 = parse_spec("fast:0@1.0,slow:1@0.5")
    pool = pool_mod.Pool(topology=topo2, policy="asymo")
    try:
        fn = lib.asymo_task_noop

        def run():
            pool.parallel_for(fn, 6, split=[4, 2])
            pool.parallel_for(fn, 3, split=[3, 0])

        jobs, tail = trace_jobs(run, pool, 1)
        assert [(j.ntasks, j.counts) for j in jobs] == [(6, (4, 2)), (3, (3, 0))]
        assert all(j.task_s.shape == (j.ntasks,) and np.all(j.task_s >= 0) for j in jobs)
        assert jobs[0].fn == jobs[1].fn != 0
        assert tail >= 0 and all(j.gap_s >= 0 for j in jobs)
        # the pool works normally once the trace is off, and its workers ran nothing traced
        pool.reset_stats()
        pool.parallel_for(fn, 4)
        assert sum(w["tasks_run"] for w in pool.stats()["workers"]) == 4
        with pytest.raises(ValueError, match="cluster"):
            trace_jobs(run, pool, 2)
    finally:
        pool.close()
