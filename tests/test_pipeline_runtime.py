"""The pipeline runtime and its baselines: correctness, order, failure propagation, no hangs,
clean shutdown; online re-partitioning driven by the runtime's own measurements."""
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from asymo.pipeline.runtime import (KernelLevel, ParallelFrames, Pipeline, PipelineError,
                                    as_frames, sub_topology)
from asymo.pipeline.tuning import DynamicTwoStage
from asymo.hw.topology import parse_spec

ALLOWED = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 usable cpus")
TOP = parse_spec(f"big:{ALLOWED[0]}@1.0,little:{ALLOWED[-1]}@0.5") if len(ALLOWED) > 1 \
    else parse_spec(f"big:{ALLOWED[0]}@1.0")
C0, C1 = ALLOWED[0], ALLOWED[-1]


class SleepModel:
    """Layer ``i`` adds 1 to the activation and sleeps ``times[i]`` (x ``slow`` on the slow
    cpu): cheap, deterministic timing and a record of which layers ran."""

    def __init__(self, times, slow=None, fail_at=None, block=None):
        self.times = list(times)
        self.layers = [SimpleNamespace(name=f"l{i}", input_shape=(2, 2, 2),
                                       output_shape=(2, 2, 2)) for i in range(len(times))]
        self.input_shape = (2, 2, 2)
        self.slow = slow or {}
        self.fail_at = fail_at     # (frame value, layer) -> raise
        self.block = block         # threading.Event: block until set
        self.calls = []

    def run_layers(self, x, first, last, *, pool=None):
        cpus = pool.cpus if pool is not None else ()
        f = max([self.slow.get(c, 1.0) for c in cpus] or [1.0])
        self.calls.append((first, last, tuple(cpus)))
        if self.block is not None:
            self.block.wait(30)
        for i in range(first, last + 1):
            if self.fail_at is not None and self.fail_at == (int(x.flat[0]) // 1000, i):
                raise ValueError(f"injected failure in layer {i}")
            time.sleep(self.times[i] * f)
            x = x + 1
        return x


def frames(n):
    return np.stack([np.full((2, 2, 2), 1000 * k, np.float32) for k in range(n)])


def expect(n, W):
    return frames(n) + W


# --- structure and validation ---------------------------------------------------------------

def test_sub_topology_and_frames_validation():
    top = parse_spec("big:0-3@1.0,little:4-7@0.45")
    s = sub_topology(top, (2, 3, 5))
    assert [c.cpus for c in s.clusters] == [(2, 3), (5,)]
    assert s.clusters[1].capacity == pytest.approx(0.45)
    with pytest.raises(ValueError, match="not in the topology"):
        sub_topology(top, (9,))
    assert as_frames(np.zeros((3, 2, 2, 2)))[0].shape == (1, 2, 2, 2)
    with pytest.raises(ValueError, match="frame 1 has shape"):
        as_frames([np.zeros((2, 2, 2)), np.zeros((3, 2, 2))], (2, 2, 2))
    with pytest.raises(TypeError, match="dtype"):
        as_frames([np.zeros((2, 2, 2), dtype=object)])
    with pytest.raises(ValueError, match=r"\(F, C, H, W\)"):
        as_frames(np.zeros((2, 2)))


@two_cpus
def test_pipeline_rejects_bad_stages():
    m = SleepModel([0.0] * 4)
    with pytest.raises(ValueError, match="do not continue"):
        Pipeline(m, [((C0,), (0, 1)), ((C1,), (3, 3))], topology=TOP)
    with pytest.raises(ValueError, match="cover"):
        Pipeline(m, [((C0,), (0, 1)), ((C1,), (2, 2))], topology=TOP)
    with pytest.raises(ValueError, match="reuses"):
        Pipeline(m, [((C0,), (0, 1)), ((C0,), (2, 3))], topology=TOP)
    with pytest.raises(ValueError, match="not in the topology"):
        Pipeline(m, [((C0,), (0, 1)), ((999,), (2, 3))], topology=TOP)
    with pytest.raises(TypeError, match="run_layers"):
        Pipeline(object(), [((C0,), (0, 0))], topology=TOP)


# --- behaviour ------------------------------------------------------------------------------

@two_cpus
def test_pipeline_outputs_in_order_and_overlaps_frames():
    W = 4
    m = SleepModel([0.02] * W)
    with Pipeline(m, [((C0,), (0, 1)), ((C1,), (2, 3))], topology=TOP, timeout=30) as p:
        t0 = time.perf_counter()
        y, st = p.run(frames(10))
        wall = time.perf_counter() - t0
        assert threading.active_count() >= 3
    np.testing.assert_array_equal(y, expect(10, W))
    # stages of 40 ms each: serial would take the sum of the stages' busy time (0.8 s), a
    # pipeline about half of it (robust to sleep overshoot on a loaded machine)
    assert wall < 0.8 * sum(st.stage_busy)
    assert st.frames == 10 and st.throughput > 15
    assert len(st.stage_utilisation) == 2 and all(0.3 < u <= 1.01 for u in st.stage_utilisation)
    assert st.latency >= 0.07
    assert {c[2] for c in m.calls} == {(C0,), (C1,)}  # each stage on its own cores
    assert not any(t.name.startswith("asymo-pipeline") for t in threading.enumerate())


@two_cpus
def test_exception_in_a_stage_reaches_the_caller_and_shuts_down():
    m = SleepModel([0.001] * 4, fail_at=(3, 2))
    p = Pipeline(m, [((C0,), (0, 1)), ((C1,), (2, 3))], topology=TOP, timeout=30)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="injected failure") as ei:
        p.run(frames(8))
    assert time.perf_counter() - t0 < 10
    assert any("stage 1" in n and "frame 3" in n for n in getattr(ei.value, "__notes__", []))
    with pytest.raises(PipelineError, match="closed"):
        p.run(frames(2))
    p.close()
    assert not any(t.name.startswith("asymo-pipeline") for t in threading.enumerate())


@two_cpus
def test_a_stuck_stage_times_out_instead_of_hanging():
    ev = threading.Event()
    m = SleepModel([0.0] * 2, block=ev)
    p = Pipeline(m, [((C0,), (0, 0)), ((C1,), (1, 1))], topology=TOP)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        p.run(frames(3), timeout=0.5)
    assert time.perf_counter() - t0 < 5
    p.close()
    ev.set()  # the stuck call returns; its thread then closes its own pool
    for t in threading.enumerate():
        if t.name.startswith("asymo-pipeline"):
            t.join(10)
    assert not any(t.name.startswith("asymo-pipeline") for t in threading.enumerate())
    assert all(pl.closed for pl in p.pools)


@two_cpus
@pytest.mark.parametrize("end", ["timeout", "abandon"])
def test_a_run_ended_early_after_every_frame_was_fed_closes_the_pipeline(end):
    """Frames still in flight when a run times out or its stream is abandoned (after the
    feeder had put all of them in) must not come out of the next run as its outputs."""
    ev = threading.Event()
    m = SleepModel([0.0] * 2, block=ev)
    p = Pipeline(m, [((C0,), (0, 0)), ((C1,), (1, 1))], topology=TOP, queue_depth=2)
    if end == "timeout":
        with pytest.raises(TimeoutError):
            p.run(frames(2), timeout=0.3)
    else:
        ev.set()
        g = p.stream(frames(2))
        next(g)
        time.sleep(0.2)  # the feeder has put both frames in
        g.close()
    ev.set()
    with pytest.raises(PipelineError, match="closed itself when a run " +
                       ("timed out" if end == "timeout" else "was abandoned")):
        p.run(frames(2))
    p.close()


@two_cpus
def test_kernel_level_times_out_on_a_stuck_frame():
    ev = threading.Event()
    m = SleepModel([0.0] * 2, block=ev)
    k = KernelLevel(m, topology=TOP)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        k.run(frames(2), timeout=0.4)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(PipelineError, match="timed out"):
        k.run(frames(1))
    ev.set()  # the stuck call returns; its thread then closes the pool
    for t in threading.enumerate():
        if t.name == "asymo-kernel-level":
            t.join(10)
    assert k.pool.closed
    m = SleepModel([0.001] * 2)
    with KernelLevel(m, topology=TOP, timeout=5) as k:
        y, st = k.run(frames(3))
        np.testing.assert_array_equal(y, expect(3, 2))
        y, st = k.run(frames(2))  # runs again
        np.testing.assert_array_equal(y, expect(2, 2))
        assert st.frames == 2
    assert k.pool.closed


@two_cpus
def test_one_run_at_a_time_for_the_baselines():
    """Two runs at once of one runtime would share its queues: the second is refused, as
    Pipeline refuses a second stream (ParallelFrames' stalled until their timeouts)."""
    ev = threading.Event()
    for make in (lambda m: ParallelFrames(m, topology=TOP, timeout=30),
                 lambda m: KernelLevel(m, topology=TOP, timeout=30)):
        ev.clear()
        r = make(SleepModel([0.0] * 2, block=ev))
        first = threading.Thread(target=r.run, args=(frames(2),))
        first.start()
        time.sleep(0.2)
        with pytest.raises(PipelineError, match="already running"):
            r.run(frames(2))
        ev.set()
        first.join(10)
        y, _ = r.run(frames(2))  # and runs again after
        np.testing.assert_array_equal(y, expect(2, 2))
        r.close()


@two_cpus
def test_close_on_exit_paths_and_reuse():
    m = SleepModel([0.0] * 3)
    with pytest.raises(RuntimeError, match="boom"):
        with Pipeline(m, [((C0,), (0, 0)), ((C1,), (1, 2))], topology=TOP) as p:
            y, _ = p.run(frames(3))
            y2, _ = p.run(frames(4))  # a pipeline runs many streams
            np.testing.assert_array_equal(y2, expect(4, 3))
            raise RuntimeError("boom")
    assert all(pl.closed for pl in p.pools)
    p.close()  # idempotent


@two_cpus
def test_repartition_with_frames_in_flight_keeps_every_layer_once():
    W = 6
    m = SleepModel([0.003] * W)
    with Pipeline(m, [((C0,), (0, 2)), ((C1,), (3, 5))], topology=TOP, timeout=30) as p:
        out = []
        for k, (seq, y) in enumerate(p.stream(frames(12))):
            out.append(y)
            if k == 2:
                p.repartition([(0, 4), (5, 5)])
            if k == 6:
                p.repartition([(0, 0), (1, 5)])
        assert p.layers == [(0, 0), (1, 5)]
        with pytest.raises(ValueError, match="does not continue"):
            p.repartition([(0, 1), (3, 5)])
    np.testing.assert_array_equal(np.concatenate(out), expect(12, W))


@two_cpus
def test_baselines_same_results_and_failure_propagation():
    W = 3
    m = SleepModel([0.005] * W)
    with KernelLevel(m, topology=TOP) as k:
        y, st = k.run(frames(4))
        np.testing.assert_array_equal(y, expect(4, W))
        assert {c[2] for c in m.calls} == {tuple(TOP.cpus)}
    m = SleepModel([0.01] * W, slow={C1: 3.0})
    with ParallelFrames(m, topology=TOP, timeout=30) as pf:
        y, st = pf.run(frames(9))
        np.testing.assert_array_equal(y, expect(9, W))  # reordered to input order
        assert len(st.stage_busy) == 2 and st.stage_busy[0] > 0 and st.stage_busy[1] > 0
    m = SleepModel([0.001] * W, fail_at=(2, 1))
    with ParallelFrames(m, topology=TOP, timeout=30) as pf:
        with pytest.raises(ValueError, match="injected"):
            pf.run(frames(6))
        with pytest.raises(PipelineError, match="closed"):
            pf.run(frames(2))


@two_cpus
def test_parallel_frames_leave_the_tail_to_the_fast_group():
    """With frame times, a group 3x slower takes a frame only while more than 3 are queued
    (the fast group would need longer than it to clear them); equal groups never wait on
    each other for the last frame."""
    W = 2
    m = SleepModel([0.004] * W, slow={C1: 3.0})
    with ParallelFrames(m, topology=TOP, timeout=30, frame_times=[0.008, 0.024]) as pf:
        y, st = pf.run(frames(3))
        np.testing.assert_array_equal(y, expect(3, W))
        assert {c[2] for c in m.calls} == {(C0,)}          # 3 queued: the slow group waits
        m.calls.clear()
        y, st = pf.run(frames(12))
        np.testing.assert_array_equal(y, expect(12, W))
        slow = sum(c[2] == (C1,) for c in m.calls)
        assert 1 <= slow <= 3                               # it helps, but not at the end
        assert st.stage_time[1] > 2 * st.stage_time[0]      # per frame each group ran
    m = SleepModel([0.002] * W)
    with ParallelFrames(m, topology=TOP, timeout=30, frame_times=[0.004, 0.004]) as pf:
        y, _ = pf.run(frames(1))                            # no deadlock between equals
        np.testing.assert_array_equal(y, expect(1, W))
    for bad in ([0.01], [0.01, 0.0], [0.01, float("nan")]):
        with pytest.raises(ValueError, match="frame_times"):
            ParallelFrames(m, topology=TOP, frame_times=bad)


def test_groups_rate_sums_each_groups_spacing():
    from asymo.pipeline.runtime import _groups_rate
    # group 0 finished frames every 10 ms, group 1 every 30 ms; group 2 ran one frame in 50
    done = [[1.00, 1.01, 1.02, 1.03], [1.00, 1.03], [1.05]]
    busy = [0.04, 0.06, 0.05]
    assert _groups_rate(done, busy) == pytest.approx(100 + 1 / 0.03 + 20)
    assert _groups_rate([[], []], [0.0, 0.0]) is None


@two_cpus
def test_parallel_frames_throughput_is_the_steady_rate_of_both_groups():
    """Two equal groups of 8 ms frames: the steady rate is 2 / 8 ms whatever the run's end
    (an odd number of frames leaves one group idle for the last one)."""
    W = 2
    m = SleepModel([0.004] * W)
    with ParallelFrames(m, topology=TOP, timeout=30) as pf:
        y, st = pf.run(frames(9))
        np.testing.assert_array_equal(y, expect(9, W))
        assert st.stage_busy[0] > 0 and st.stage_busy[1] > 0
        assert st.wall_throughput < st.throughput               # the tail is not counted
        assert 0.6 * 250 < st.throughput < 1.05 * 250           # sleeps only overrun


@two_cpus
def test_dynamic_repartition_driven_by_runtime_measurements():
    """Paper 004 Algorithm 2 on the runtime: the second stage's core is 3x slower, so the
    best split puts most layers on the first stage."""
    W = 8
    t = [0.015] * W
    m = SleepModel(t, slow={C1: 3.0})
    with Pipeline(m, [((C0,), (0, 3)), ((C1,), (4, 7))], topology=TOP, timeout=30) as p:
        def measure(n):  # layers [0, n) on stage 0, [n, W) on stage 1 (either may be empty)
            return max(p.measure(frames(2), [(0, n - 1), (n, W - 1)]))
        d = DynamicTwoStage(W, alpha=1.0)
        # the load just rose: the reference is the period before (taken as 1.5x lower)
        n, tt = 4, 1.5 * measure(4)
        for _ in range(3):
            n, tt = d.step(n, tt, measure)
        assert p.layers == [(0, max(m_n for m_n, _ in d.history[-1:]) - 1),
                            (d.history[-1][0], W - 1)]
    # period max(15 n, 45 (W - n)) ms: n = 6 is best (90 ms), then 7 (105), 8 (120); the
    # start n = 4 costs 180 ms. Sleeps on a loaded shared machine blur 6-8, so we only require
    # that the measured search left the start for the region of the optimum.
    assert n in (6, 7, 8)


def test_stage_groups_spread_over_clusters():
    from asymo.pipeline.tuning import stage_groups
    top = parse_spec("big:0-3@1.0,little:4-7@0.45")
    assert stage_groups(top, 2) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert stage_groups(top, 3) == [(0, 1), (2, 3), (4, 5, 6, 7)]
    g8 = stage_groups(top, 8)
    assert sorted(c for g in g8 for c in g) == list(range(8)) and len(g8) == 8
    with pytest.raises(ValueError):
        stage_groups(top, 9)


@two_cpus
def test_pipe_search_on_the_runtime_finds_the_balanced_split():
    from asymo.pipeline.tuning import pipe_search_runtime
    W = 6
    m = SleepModel([0.01] * W, slow={C1: 2.0})
    # weights say "balanced at 3-3", but the second core is 2x slower: best is 4-2
    res, groups = pipe_search_runtime(m, frames(2), topology=TOP, weights=[1.0] * W,
                                      alpha=3, timeout=30)
    assert groups == [(C0,), (C1,)]
    assert res.best in ((4, 2), (5, 1)) and res.rank > 1
    assert len(res.trials) <= W - 1
