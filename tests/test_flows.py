"""Flows: dependent jobs run as one pool job (asymo_flow_task, `asymo.runtime.tasks.flow_call`)
-- every task after the tasks it reads, each once unless a slower core held it, a stopped
worker's task run again so the flow does not wait for it -- and the models whose blocked
layers run so (`_flow_groups`, their arena, their outputs)."""
import os
import threading
import time

import numpy as np
import pytest

import asymo
import asymo.lab.emulate as E
import asymo.models.graph_model as gm
from asymo.ops import blocked
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import EVERY_JOB, hold
from asymo.runtime.tasks import flow_call, tasks_call
from _pools import CPUS, make_pool, topologies

needs2 = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable cpus")
STALL_S = 1.0


class Recorder:
    """Layers of `ntasks` tasks: task t of layer l writes [10 t, 10 t + 10) of key l and reads
    [10 (t - 1), 10 (t + 2)) of key l - 1 (its neighbours' rows, as a 3x3 layer's task does).
    Each run records its start and end in one sequence; the first task the little worker's
    own thread runs sleeps STALL_S when `stall` (a core taken away in the middle of a task)."""

    def __init__(self, nlayers, ntasks, stall=False):
        self.nlayers, self.ntasks, self.stall = nlayers, ntasks, stall
        self.lock = threading.Lock()
        self.seq = 0
        self.starts = [[[] for _ in range(ntasks)] for _ in range(nlayers)]
        self.ends = [[[] for _ in range(ntasks)] for _ in range(nlayers)]
        self.stalled = None
        self.ctx = [ffi.new("int64_t *", layer) for layer in range(nlayers)]

        @ffi.callback("void(int64_t, void *)")
        def task(t, ctx):
            layer = ffi.cast("int64_t *", ctx)[0]
            with self.lock:
                stall = (self.stall and self.stalled is None
                         and lib.asymo_pool_current_cluster() == 1
                         and threading.current_thread() is not threading.main_thread())
                if stall:
                    self.stalled = (layer, t)
                self.starts[layer][t].append(self.seq)
                self.seq += 1
            time.sleep(STALL_S if stall else 0.0005)
            with self.lock:
                self.ends[layer][t].append(self.seq)
                self.seq += 1

        self.task = task

    def layers(self, pool, counts=None):
        out = []
        n = self.ntasks
        writes = [(10 * t, 10 * t + 10) for t in range(n)]
        reads = [(10 * (t - 1), 10 * (t + 2)) for t in range(n)]
        for layer in range(self.nlayers):
            fn, args = tasks_call(pool, self.task, self.ctx[layer], n, counts, False, True)
            out.append(((fn, args), (layer, writes),
                        [(layer - 1, reads)] if layer else []))
        return out

    def deps(self, layer, t):
        if layer == 0:
            return []
        return [(layer - 1, u) for u in range(max(0, t - 1), min(self.ntasks, t + 2))]


def submit(pool, calls):
    """Run the flow's calls from the fastest core (where a submitter moves anyway)."""
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {CPUS[0]})
    try:
        with hold(pool):
            for fn, args in calls:
                assert fn(*args) == 0
    finally:
        os.sched_setaffinity(0, mask)


@pytest.mark.parametrize("topo", range(4))
@pytest.mark.parametrize("shape", [(2, 1), (3, 6), (5, 13)])
def test_every_task_runs_once_after_the_tasks_it_reads(topo, shape):
    with make_pool(topologies()[topo]) as pool:
        rec = Recorder(*shape)
        calls, keep = flow_call(pool, rec.layers(pool), redo_us=10e6)
        for _ in range(3):  # (the reset job starts each run afresh)
            rec.starts = [[[] for _ in range(rec.ntasks)] for _ in range(rec.nlayers)]
            rec.ends = [[[] for _ in range(rec.ntasks)] for _ in range(rec.nlayers)]
            submit(pool, calls)
            lib.asymo_pool_fence(pool._handle, EVERY_JOB)
            for layer in range(rec.nlayers):
                for t in range(rec.ntasks):
                    assert len(rec.starts[layer][t]) == 1, (layer, t)
                    for dl, du in rec.deps(layer, t):
                        assert rec.ends[dl][du][0] < rec.starts[layer][t][0], \
                            (layer, t, dl, du)
        assert keep[0].runs_again == 0 and keep[0].late_copies == 0


@needs2
def test_a_task_a_stopped_slower_worker_holds_is_run_again():
    # The little worker stops in its first task for a second: the big one runs that task
    # again once it needs it (or as the pool's backup at the end) and the flow returns; the
    # late copy ends behind the fence, and every task still ran after what it reads.
    with make_pool(topologies()[2]) as pool:
        rec = Recorder(4, 8, stall=True)
        calls, keep = flow_call(pool, rec.layers(pool), redo_us=50)
        t0 = time.perf_counter()
        submit(pool, calls)
        took = time.perf_counter() - t0
        assert rec.stalled is not None and took < STALL_S / 2, (rec.stalled, took)
        lib.asymo_pool_fence(pool._handle, EVERY_JOB)
        layer, t = rec.stalled
        assert len(rec.starts[layer][t]) >= 2  # the stopped copy and the one(s) run again
        # every copy beyond the first ends after another: as many late copies as runs again
        assert keep[0].runs_again >= 1 and keep[0].late_copies == keep[0].runs_again
        for lay in range(rec.nlayers):
            for u in range(rec.ntasks):
                assert rec.ends[lay][u], (lay, u)
                for dl, du in rec.deps(lay, u):
                    assert min(rec.ends[dl][du]) < min(rec.starts[lay][u])


@needs2
def test_a_pool_with_backups_off_runs_no_task_twice():
    # asymo_pool_set_backup(factor 0): the flow waits for the stopped worker, as any job does
    with make_pool(topologies()[2]) as pool:
        assert lib.asymo_pool_set_backup(pool._handle, 0, 0) == lib.ASYMO_OK
        rec = Recorder(4, 8, stall=True)
        calls, keep = flow_call(pool, rec.layers(pool), redo_us=50)
        t0 = time.perf_counter()
        submit(pool, calls)
        assert rec.stalled is not None and time.perf_counter() - t0 >= STALL_S * 0.9
        lib.asymo_pool_fence(pool._handle, EVERY_JOB)
        assert all(len(runs) == 1 for layer in rec.starts for runs in layer)
        assert keep[0].runs_again == 0 and keep[0].late_copies == 0


def test_flow_call_refuses_what_does_not_fit():
    with make_pool(topologies()[0]) as pool:
        rec = Recorder(3, 4)
        layers = rec.layers(pool)
        assert flow_call(pool, layers[:1]) is None  # one job is no flow
        (fn, args), w, r = layers[1]
        inline = ((fn, args[:5] + (lib.ASYMO_RUN_INLINE,)), w, r)
        assert flow_call(pool, [layers[0], inline]) is None
        short = ((fn, args), (w[0], w[1][:-1]), r)  # an interval list of the wrong length
        assert flow_call(pool, [layers[0], short]) is None
        with make_pool(topologies()[0]) as other:
            assert flow_call(other, layers) is None  # jobs of another pool
    if len(CPUS) >= 2:
        with make_pool(topologies()[2]) as two:
            rec = Recorder(2, 4)
            layers = rec.layers(two)
            (fn, args), w, r = layers[1]
            uncounted = ((fn, args[:4] + (ffi.NULL,) + args[5:]), w, r)
            assert flow_call(two, [layers[0], uncounted]) is None


def _blocked_layer(kind, c, hw, stride=1):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    if kind == "pointwise":
        w = rng.standard_normal((2 * c, c, 1, 1)).astype(np.float32)
        oh = hw
        out_c = 2 * c
    else:
        w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
        oh = (hw + 2 - 3) // stride + 1
        out_c = c
    y = np.empty((1, out_c, oh, oh), np.float32)
    return x, blocked.PackedBlockedWeight(kind, w), y, oh


@pytest.mark.skipif(not lib.asymo_blocked_supported(), reason="no blocked kernels here")
@pytest.mark.parametrize("kind,stride", [("pointwise", 1), ("depthwise", 1),
                                         ("depthwise", 2)])
def test_blocked_task_footprints_cover_the_output_and_read_the_window(kind, stride):
    with make_pool(topologies()[-1 if len(CPUS) >= 2 else 0]) as pool:
        x, packed, y, oh = _blocked_layer(kind, 16, 13, stride)
        calls, keep = blocked.bind_blocked_conv(x, packed, None, None, y, stride=(stride,) * 2,
                                                pads=(0, 0) if kind == "pointwise" else (1, 1),
                                                activation=None, pool=pool)
        writes, reads_x, reads_r = blocked.task_footprint(calls[0])
        covered = np.zeros(oh * oh, np.int32)
        for lo, hi in writes:
            covered[lo:hi] += 1
        # every output pixel written, by as many tasks as there are channel splits
        assert covered.min() >= 1 and len(set(covered.tolist())) == 1
        assert reads_r == writes
        for (wlo, whi), (rlo, rhi) in zip(writes, reads_x):
            if kind == "pointwise":
                assert (rlo, rhi) == (wlo, whi)
                continue
            oy0, oy1 = wlo // oh, -(-whi // oh)
            assert rlo == max(0, oy0 * stride - 1) * 13
            assert rhi == min(13, (oy1 - 1) * stride - 1 + 3) * 13
        assert blocked.task_footprint((calls[0][0], (None, None, None, 1, None, 0))) is None


def _touched(graph, nodes):
    return {t for i in nodes for t in list(graph.nodes[i].inputs) + list(graph.nodes[i].outputs)
            if t and t not in graph.initializers}


@pytest.mark.skipif(not lib.asymo_blocked_supported(), reason="no blocked kernels here")
def test_plans_for_several_clusters_run_blocked_chains_as_flows_apart_in_the_arena(
        monkeypatch):
    m = asymo.models.get_graph("mobilenet_v1", image_size=64)
    g = m.graph
    plan = m.plan(1, backups=True)
    assert plan.flows and not m.plan(1).flows and not m.plan(2, backups=True).flows
    assert plan.to_dict()["flows"] == [list(f) for f in plan.flows]
    for f in plan.flows:
        assert 2 <= len(f) <= gm.FLOW_MAX_LAYERS and list(f) == list(range(f[0], f[-1] + 1))
        assert all(plan.kernels[g.nodes[i].name].startswith("conv2d:blocked") for i in f)
        # no two tensors a flow touches share memory
        ivs = sorted(iv for t in _touched(g, f) for iv in gm._byte_intervals(plan, t))
        assert all(a[1] <= b[0] for a, b in zip(ivs, ivs[1:])), f
    monkeypatch.setattr(gm, "FLOW_MAX_LAYERS", 0)
    m2 = asymo.models.get_graph("mobilenet_v1", image_size=64)
    assert not m2.plan(1, backups=True).flows
    assert m2.plan(1, backups=True).arena_bytes < plan.arena_bytes


@needs2
@pytest.mark.skipif(not lib.asymo_blocked_supported(), reason="no blocked kernels here")
def test_models_with_flows_give_the_outputs_without(monkeypatch):
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    with make_pool(topologies()[2]) as two:
        models = {}
        for limit in (gm.FLOW_MAX_LAYERS, 0):
            monkeypatch.setattr(gm, "FLOW_MAX_LAYERS", limit)
            models[limit] = m = asymo.models.get_graph("mobilenet_v1", image_size=64)
            m.cluster_choice = "all"
        with_flows, without = models.values()
        want = without(x, pool=two)
        for _ in range(5):
            np.testing.assert_array_equal(with_flows(x, pool=two), want)
        with hold(two) as p:
            inst = with_flows._acquire(1, p)
            merged = inst._merged_for(p)
            with_flows._release(inst)
        flows = with_flows.plan(1, backups=True).flows
        assert {f[0]: f[-1] for f in flows} == {k: v[0] for k, v in merged.items()}
        # timed runs take the nodes one by one: the same outputs
        with hold(two) as p:
            inst = with_flows._acquire(1, p)
            np.copyto(inst.views[with_flows.graph.inputs[0].name], x)
            times = [0.0] * len(with_flows.graph.nodes)
            inst.run(0, len(times) - 1, p, times=times)
            np.testing.assert_array_equal(inst.views[with_flows.graph.outputs[0]], want)
            with_flows._release(inst)


@needs2
@pytest.mark.emulator
@pytest.mark.skipif(not E.realtime_available(), reason="SCHED_FIFO refused")
@pytest.mark.skipif(not lib.asymo_blocked_supported(), reason="no blocked kernels here")
def test_flows_under_the_emulator_stay_exact():
    # The emulator stops the little core 0.25 ms of every 0.5: tasks it holds run again on the
    # big core, their late copies behind the fences; every output must still be the right one.
    m = asymo.models.get_graph("mobilenet_v1", image_size=96)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 3, 96, 96), dtype=np.float32) for _ in range(4)]
    with make_pool(topologies()[1]) as one:
        want = [m(x, pool=one) for x in xs]
    m.cluster_choice = "all"
    with E.slow_cores({CPUS[1]: 0.5}):
        with make_pool(topologies()[2]) as two:
            assert m.plan(1, backups=True).flows
            deadline = time.perf_counter() + 3.0
            while time.perf_counter() < deadline:
                for x, w in zip(xs, want):
                    np.testing.assert_allclose(m(x, pool=two), w, rtol=1e-5, atol=1e-6)
