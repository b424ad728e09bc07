"""Backup tasks (ASYMO_RUN_BACKUP): a job does not wait for a worker stopped in a task; the
submitter runs the task again, the late copy is fenced; a slower worker takes single tasks of
such jobs from a faster one's long queue; models on several-cluster pools use them.

The C core's own tests (every task counted once, the job and its context never touched after
the fence, under ThreadSanitizer and AddressSanitizer) are in test_pool_sanitized.py."""
import os
import threading
import time
import warnings

import numpy as np
import pytest

import asymo
import asymo.lab.emulate as E
from asymo.hw.topology import Cluster, Topology
from asymo.models.graph_model import BACKUP_OVERLAP_NODES, _Instance
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import Pool, hold

CPUS = sorted(os.sched_getaffinity(0))
needs2 = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable cpus")
STALL_S = 1.0  # long: the checks that a job did not wait for it stay true on a loaded machine


def big_little():
    return Topology(clusters=(Cluster("big", (CPUS[0],)),
                              Cluster("little", (CPUS[1],), capacity=0.5)))


def make_pool(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Pool(spec)


class Stalling:
    """Tasks writing out[t] = 2 t; the first task the little worker's own thread runs sleeps
    STALL_S first (a core taken away in the middle of a task). Not a task the submitting
    thread runs as that worker: a submitter cannot back up its own task."""

    def __init__(self, n, stall=True):
        self.out = np.zeros(n)
        self.runs = np.zeros(n, np.int64)
        self.by_worker = np.full(n, -1, np.int64)
        self.stall = stall
        self.late_done = threading.Event()
        self.lock = threading.Lock()

        @ffi.callback("void(int64_t, void *)")
        def task(t, ctx):
            w = lib.asymo_pool_current_worker()
            with self.lock:
                stall = (self.stall and w == 1
                         and threading.current_thread() is not threading.main_thread())
                self.stall = self.stall and not stall
            if stall:
                time.sleep(STALL_S)
            else:
                time.sleep(0.0005)  # a task of measurable length for the backup limit
            self.out[t] = 2.0 * t
            with self.lock:
                self.runs[t] += 1
                self.by_worker[t] = w
            if stall:
                self.late_done.set()

        self.task = task


def run(pool, job, n, counts, flags):
    """The job submitted from the big core (where a submitter moves anyway, unless an earlier
    test left this thread's mask without it)."""
    c = ffi.new("int64_t[2]", counts)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {CPUS[0]})
    try:
        rc = lib.asymo_pool_run(pool._handle, job.task, ffi.NULL, n, c, flags)
    finally:
        os.sched_setaffinity(0, mask)
    assert rc == lib.ASYMO_OK


@needs2
def test_a_backup_job_returns_without_waiting_for_a_stopped_worker():
    with make_pool(big_little()) as pool:
        n = 24
        job = Stalling(n)
        pool.reset_stats()
        t0 = time.perf_counter()
        run(pool, job, n, [16, 8], lib.ASYMO_RUN_BACKUP)
        took = time.perf_counter() - t0
        # every output is there, though the stopped worker's copy has not finished
        np.testing.assert_array_equal(job.out, 2.0 * np.arange(n))
        assert (job.runs >= 1).all()
        assert took < STALL_S / 2 and not job.late_done.is_set()
        st = pool.stats()
        assert st["workers"][0]["tasks_backup"] >= 1
        # the fence waits for the late copy; then it is counted as superseded
        pool.fence()
        assert job.late_done.is_set()
        st = pool.stats()
        assert st["workers"][1]["tasks_superseded"] == 1
        assert job.runs.sum() == n + 1  # the stopped task ran twice, every other once
        assert st["workers"][0]["tasks_run"] + st["workers"][1]["tasks_run"] == n


@needs2
def test_without_the_flag_the_job_waits_for_the_stopped_worker():
    with make_pool(big_little()) as pool:
        n = 24
        job = Stalling(n)
        t0 = time.perf_counter()
        run(pool, job, n, [16, 8], 0)
        assert time.perf_counter() - t0 >= STALL_S * 0.9
        assert (job.runs == 1).all()
        assert pool.stats()["workers"][0]["tasks_backup"] == 0


@needs2
def test_fence_of_an_earlier_job_does_not_wait_for_a_later_ones_late_copy():
    with make_pool(big_little()) as pool:
        before = pool.fence()  # the last job number so far
        job = Stalling(24)
        run(pool, job, 24, [16, 8], lib.ASYMO_RUN_BACKUP)
        t0 = time.perf_counter()
        assert pool.fence(before) >= before + 1
        assert time.perf_counter() - t0 < STALL_S / 2 and not job.late_done.is_set()
        pool.fence()
        assert job.late_done.is_set()


def _sequence_after_a_late_copy(pool, fences, marks):
    """A backup job left with a late copy (the little worker stopped in a task), then a
    JobSequence of a stalling-free job and a counting one with ``fences``: (seconds the
    sequence took, whether the late copy had ended when the sequence's jobs ran)."""
    from asymo.runtime.tasks import JobSequence, tasks_call

    job = Stalling(24)
    run(pool, job, 24, [16, 8], lib.ASYMO_RUN_BACKUP)
    assert not job.late_done.is_set()
    seen = []

    @ffi.callback("void(int64_t, void *)")
    def probe(t, ctx):
        seen.append(job.late_done.is_set())

    calls = [tasks_call(pool, probe, ffi.NULL, 2, ffi.new("int64_t[2]", [2, 0]), False)] * 2
    seq = JobSequence(pool, calls, fences, marks)
    t0 = time.perf_counter()
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {CPUS[0]})
    try:
        with hold(pool):
            seq()
    finally:
        os.sched_setaffinity(0, mask)
    took = time.perf_counter() - t0
    pool.fence()
    return took, seen


@needs2
def test_a_sequence_waits_for_late_copies_where_its_fences_say():
    from asymo.runtime.tasks import JobSequence

    with make_pool(big_little()) as pool:
        marks = ffi.new("uint64_t[]", 3)
        # no fence: the jobs run beside the late copy; the marks record the job before each
        took, seen = _sequence_after_a_late_copy(
            pool, [(JobSequence.WAIT_NONE, 0), (JobSequence.WAIT_NONE, 1)], marks)
        assert took < STALL_S / 2 and not any(seen)
        assert marks[1] == marks[0] + 1 and marks[0] == pool.fence() - 2
        # a fence on every job: the first job waits for the late copy
        took, seen = _sequence_after_a_late_copy(
            pool, [(JobSequence.WAIT_ALL, -1), (JobSequence.WAIT_NONE, -1)], marks)
        assert took >= STALL_S * 0.3 and all(seen) and len(seen) == 4
        # a fence on a mark from before the backup job: no wait (an earlier job's fence)
        marks[2] = pool.fence()
        took, seen = _sequence_after_a_late_copy(
            pool, [(2, -1), (JobSequence.WAIT_NONE, -1)], marks)
        assert took < STALL_S / 2 and not any(seen)
        # the second job waits on the mark the first recorded: after the backup job, so the
        # late copy must end first
        took, seen = _sequence_after_a_late_copy(
            pool, [(JobSequence.WAIT_NONE, 0), (0, -1)], marks)
        assert took >= STALL_S * 0.3 and seen == [False, False, True, True]


def test_sequence_fences_are_checked():
    from asymo.runtime.tasks import JobSequence, tasks_call

    with make_pool(Topology(clusters=(Cluster("c0", (CPUS[0],)),))) as pool:
        c = np.zeros(8, np.int32)
        call = tasks_call(pool, ffi.addressof(lib, "asymo_task_count"),
                          ffi.from_buffer("int32_t[]", c), 8, None, False)
        marks = ffi.new("uint64_t[]", 2)
        for bad in [(2, -1), (-3, -1), (-1, 2), (-1, -2)]:
            with pytest.raises(ValueError, match="outside the 2 marks"):
                JobSequence(pool, [call], [bad], marks)
        with pytest.raises(ValueError, match="need a marks array"):
            JobSequence(pool, [call], [(0, -1)])
        with pytest.raises(ValueError, match="1 fences for 2 calls"):
            JobSequence(pool, [call, call], [(-1, -1)], marks)
        # the C entry refuses a bad program before running any of it
        jobs = ffi.new("asymo_run_job[2]")
        for j in jobs:
            j.fn, j.ctx, j.ntasks = call[1][1], call[1][2], 8
            j.wait, j.mark = lib.ASYMO_WAIT_NONE, -1
        jobs[1].wait = 5
        failed = ffi.new("int64_t *")
        with hold(pool) as p:
            assert lib.asymo_pool_run_jobs(p._handle, jobs, 2, marks, 2,
                                           failed) == lib.ASYMO_EINVAL
            assert failed[0] == 1 and (c == 0).all()
            assert lib.asymo_pool_run_jobs(p._handle, jobs, 2, ffi.NULL, 2,
                                           failed) == lib.ASYMO_EINVAL
            jobs[1].wait = 1
            assert lib.asymo_pool_run_jobs(p._handle, jobs, 2, marks, 2, failed) == lib.ASYMO_OK
        assert (c == 2).all()


@needs2
def test_the_slower_worker_takes_single_tasks_of_backup_jobs_from_a_long_faster_queue():
    # The little worker gets 1 task of 40 and finishes it early (it is as fast as the big
    # one here): it may take tasks of a backup job from the big worker's queue, one at a time,
    # never of a plain job.
    stolen = {0: 0, lib.ASYMO_RUN_BACKUP: 0}
    with make_pool(big_little()) as pool:
        for attempt in range(5):  # (a loaded machine may keep the little worker from waking)
            for flags in stolen:
                job = Stalling(40, stall=False)
                pool.reset_stats()
                run(pool, job, 40, [39, 1], flags)
                assert (job.runs == 1).all()
                stolen[flags] += pool.stats()["workers"][1]["stolen_from"].get("big", 0)
            if stolen[lib.ASYMO_RUN_BACKUP]:
                break
    assert stolen[0] == 0
    assert stolen[lib.ASYMO_RUN_BACKUP] > 0


@needs2
def test_backup_is_ignored_by_other_policies_and_cluster_local_jobs():
    for policy in ("even", "shared", "steal"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pool = Pool(big_little(), policy=policy)
        with pool:
            job = Stalling(8)
            t0 = time.perf_counter()
            run(pool, job, 8, [4, 4], lib.ASYMO_RUN_BACKUP)
            assert time.perf_counter() - t0 >= STALL_S * 0.9, policy
            assert (job.runs == 1).all()
    with make_pool(big_little()) as pool:
        job = Stalling(8)
        t0 = time.perf_counter()
        run(pool, job, 8, [4, 4], lib.ASYMO_RUN_BACKUP | lib.ASYMO_RUN_CLUSTER_LOCAL)
        assert time.perf_counter() - t0 >= STALL_S * 0.9
        assert (job.runs == 1).all()


# ---- models ---------------------------------------------------------------------------------

def _bytes(plan, t):
    """Byte intervals of tensor t (a concat's channel slice: one per image), computed here
    apart from the runtime's own."""
    if t in plan.slices:
        y, c0, c1 = plan.slices[t]
        off = plan.storage[y][0]
        n, c = plan.shapes[y][:2]
        per = 4 * int(np.prod(plan.shapes[y][2:]))
        return [(off + (i * c + c0) * per, off + (i * c + c1) * per) for i in range(n)]
    off, nbytes = plan.storage[t]
    return [(off, off + nbytes)]


def _clash(plan, graph, k, j):
    """Whether node k writes memory node j reads or writes."""
    consts = graph.initializers
    w = [iv for t in graph.nodes[k].outputs if t for iv in _bytes(plan, t)]
    u = [iv for t in list(graph.nodes[j].inputs) + list(graph.nodes[j].outputs)
         if t and t not in consts for iv in _bytes(plan, t)]
    return any(a < d and c < b for a, b in w for c, d in u)


@pytest.mark.parametrize("name", ["mobilenet_v1", "squeezenet", "googlenet"])
def test_late_copies_never_meet_memory_a_later_node_writes(name):
    m = asymo.models.get_graph(name, image_size=64 if name != "googlenet" else 96)
    g = m.graph
    tight, roomy = m.plan(1), m.plan(1, backups=True)
    assert tight.overlap == 0 and roomy.overlap == BACKUP_OVERLAP_NODES
    assert roomy.arena_bytes >= tight.arena_bytes and m.plan(1, backups=True) is roomy
    inst = _Instance(g, roomy, m._conv_weights, m._matvec, m._blocked_weight)
    convs = [j for j, n in enumerate(g.nodes) if n.op == "asymo.Conv"]
    waits = 0
    for k, step in enumerate(inst.steps):
        if step is None:
            continue
        until = inst.fence_until[k]
        # the convolutions whose late copies may still run while node k does
        running = [j for j in convs if j < k and (until < 0 or j >= until)]
        assert not [j for j in running if _clash(roomy, g, k, j)], k
        waits += until >= 0
        # the roomy arena keeps such clashes BACKUP_OVERLAP_NODES back, but for a node that
        # writes over its input
        root = roomy.aliases.get
        writes_input = any(root(o, o) == root(i, i) for o in g.nodes[k].outputs if o
                           for i in g.nodes[k].inputs if i)
        if not writes_input:
            assert all(not _clash(roomy, g, k, j) for j in convs
                       if k - BACKUP_OVERLAP_NODES <= j < k), k
    assert waits > 0  # some node must wait for earlier late copies
    # in the tight arena the very next nodes reuse a convolution's memory
    assert any(_clash(tight, g, k, j) for j in convs for k in range(j + 1, j + 3)
               if k < len(g.nodes) and inst.steps[k] is not None)


def _siblings_then_in_place_sigmoid():
    """A model whose two sibling convolutions (one job) are followed by a Sigmoid written in
    place over the first sibling's output."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = {k: numpy_helper.from_array((rng.standard_normal((16, 16, 1, 1)) * 0.2)
                                    .astype(np.float32), k) for k in ("w0", "w1", "w2")}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["t"]),
             helper.make_node("Conv", ["t", "w1"], ["a"]),
             helper.make_node("Conv", ["t", "w2"], ["b"]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 16, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          list(w.values()))
    return asymo.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("name", ["siblings", "squeezenet", "googlenet"])
def test_fences_cover_late_copies_of_every_sibling_in_a_group(name):
    # A sibling group runs as one job begun at its first node, and its nodes share that
    # node's mark (the last job number before it): a node writing memory of a sibling that is
    # not the group's last must wait past the whole group. It waited only for the jobs before
    # the group, so a late copy of the first sibling could write over an in-place result
    # (found by a differential run under the emulator; batch 3: the last image wrong).
    from asymo.models.graph_model import _fence_wait
    from asymo.runtime.tasks import JobSequence

    m = (_siblings_then_in_place_sigmoid() if name == "siblings" else
         asymo.models.get_graph(name, image_size=64 if name != "googlenet" else 96))
    g = m.graph
    for batch in (1, 3):
        plan = m.plan(batch, backups=True)
        assert plan.siblings
        inst = _Instance(g, plan, m._conv_weights, m._matvec, m._blocked_weight)
        slot = list(range(len(g.nodes)))
        for group in plan.siblings:
            slot[min(group):max(group) + 1] = [min(group)] * len(group)
        convs = [j for j, n in enumerate(g.nodes) if n.op == "asymo.Conv"]
        clashes = 0
        for k, step in enumerate(inst.steps):
            if step is None:
                continue
            wait = _fence_wait(inst.fence_until, (k,), 0)
            for j in convs:
                if j < k and slot[j] != slot[k] and _clash(plan, g, k, j):
                    clashes += 1
                    # every job of node j began before the mark node k waits for
                    assert wait == JobSequence.WAIT_ALL or (
                        wait != JobSequence.WAIT_NONE and max(
                            i for i in range(len(g.nodes)) if slot[i] == slot[j]) < wait), \
                        (batch, k, j, wait)
        assert clashes > 0
    if name == "siblings":  # (the Sigmoid writes over its input: the first sibling's output)
        assert plan.storage["s"] == plan.storage["a"]


@needs2
def test_models_on_a_two_cluster_pool_use_the_roomy_arena_and_backups():
    m = asymo.models.get_graph("mobilenet_v1", image_size=64)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    with make_pool(Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))) as one:
        want = m(x, pool=one)
        with hold(one) as p:
            inst = m._acquire(1, p)
            assert inst.overlap == 0
            m._release(inst)
    with make_pool(big_little()) as two:
        m.cluster_choice = "all"
        np.testing.assert_allclose(m(x, pool=two), want, rtol=1e-5, atol=1e-6)
        with hold(two) as p:
            inst = m._acquire(1, p)
            assert inst.overlap == BACKUP_OVERLAP_NODES
            flags = {args[-1] for step in inst._steps_for(p) if step is not None
                     and hasattr(step, "_calls") for fn, args in step._calls
                     if fn is lib.asymo_pool_run}
            m._release(inst)
        assert lib.ASYMO_RUN_BACKUP in flags
        # the fastest cluster alone backs nothing up: its calls take the tight arena, and the
        # roomy one goes back to calls on all clusters
        m.cluster_choice = "fastest"
        m._free.pop((1, False), None)  # (the one-cluster pool's instance, above)
        np.testing.assert_allclose(m(x, pool=two), want, rtol=1e-5, atol=1e-6)
        assert [i.overlap for i in m._free.get((1, False), [])] == [0]
        assert [i.overlap for i in m._free[(1, True)]] == [BACKUP_OVERLAP_NODES]
        m.cluster_choice = "all"
        np.testing.assert_allclose(m(x, pool=two), want, rtol=1e-5, atol=1e-6)
        assert len(m._free[(1, True)]) == 1 and len(m._free[(1, False)]) == 1


@needs2
@pytest.mark.emulator
@pytest.mark.skipif(not E.realtime_available(), reason="SCHED_FIFO refused")
@pytest.mark.parametrize("name", ["mobilenet_v1", "squeezenet"])
def test_models_under_the_emulator_back_tasks_up_and_stay_exact(name):
    # The emulator stops the little core 0.25 ms of every 0.5: tasks it holds are backed up,
    # their late copies run into the next nodes; every output must still be the right one.
    m = asymo.models.get_graph(name, image_size=96)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 3, 96, 96), dtype=np.float32) for _ in range(4)]
    with make_pool(Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))) as one:
        want = [m(x, pool=one) for x in xs]
    m.cluster_choice = "all"
    with E.slow_cores({CPUS[1]: 0.5}):
        with make_pool(big_little()) as two:
            two.reset_stats()
            deadline = time.perf_counter() + 4.0
            calls = 0
            while True:
                for x, w in zip(xs, want):
                    np.testing.assert_allclose(m(x, pool=two), w, rtol=1e-5, atol=1e-6)
                    calls += 1
                st = two.stats()
                if st["workers"][0]["tasks_backup"] >= 5 or time.perf_counter() > deadline:
                    break
            assert st["workers"][0]["tasks_backup"] > 0, f"no backup in {calls} calls"


@needs2
def test_backup_settings_per_pool():
    with make_pool(big_little()) as pool:
        h = pool._handle
        assert lib.asymo_pool_get_backup_factor(h) == lib.ASYMO_POOL_BACKUP_FACTOR
        assert lib.asymo_pool_get_backup_min_ns(h) == lib.ASYMO_POOL_BACKUP_MIN_NS
        for bad in ((-1, 0), (1001, 0), (4, -1)):
            assert lib.asymo_pool_set_backup(h, *bad) == lib.ASYMO_EINVAL
        assert lib.asymo_pool_get_backup_factor(h) == lib.ASYMO_POOL_BACKUP_FACTOR
        # factor 0: a backup job waits for its stopped worker like any other
        assert lib.asymo_pool_set_backup(h, 0, 0) == lib.ASYMO_OK
        job = Stalling(24)
        t0 = time.perf_counter()
        run(pool, job, 24, [16, 8], lib.ASYMO_RUN_BACKUP)
        assert time.perf_counter() - t0 >= STALL_S * 0.9
        assert (job.runs == 1).all() and pool.stats()["workers"][0]["tasks_backup"] == 0
        # a long limit: no backup within it either
        assert lib.asymo_pool_set_backup(h, 4, 10 * 10**9) == lib.ASYMO_OK
        job = Stalling(24)
        t0 = time.perf_counter()
        run(pool, job, 24, [16, 8], lib.ASYMO_RUN_BACKUP)
        assert time.perf_counter() - t0 >= STALL_S * 0.9
        assert lib.asymo_pool_get_backup_min_ns(h) == 10 * 10**9
