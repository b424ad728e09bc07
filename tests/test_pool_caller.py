"""The submitting thread helps while it waits: it runs queued work as the worker pinned to
the core it is on, under that worker's identity, by that worker's policy rules."""
import os
import threading
import time
import warnings

import numpy as np
import pytest

from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import Pool
from asymo.hw.topology import Cluster, Topology

CPUS = sorted(os.sched_getaffinity(0))
needs2 = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable cpus")


def big_little():
    """Two one-core clusters: CPUS[0] (big), CPUS[1] at half its capacity (little)."""
    return Topology(clusters=(Cluster("big", (CPUS[0],)),
                              Cluster("little", (CPUS[1],), capacity=0.5)))


def make_pool(spec, policy="asymo"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Pool(spec, policy=policy)


class pinned_to:
    """Keep the calling thread on one cpu (so it knows which worker it may help)."""

    def __init__(self, cpu):
        self.cpu = cpu

    def __enter__(self):
        self.saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})

    def __exit__(self, *exc):
        os.sched_setaffinity(0, self.saved)


def recorder(n):
    """A task recording, per task, the worker identity it ran under and whether the
    submitting (main) thread ran it."""
    worker = np.full(n, -9, np.int64)
    cluster = np.full(n, -9, np.int64)
    by_main = np.zeros(n, np.int64)
    runs = np.zeros(n, np.int64)
    main = threading.get_ident()

    @ffi.callback("void(int64_t, void *)")
    def task(t, ctx):
        worker[t] = lib.asymo_pool_current_worker()
        cluster[t] = lib.asymo_pool_current_cluster()
        by_main[t] = threading.get_ident() == main
        runs[t] += 1

    return task, worker, cluster, by_main, runs


@needs2
@pytest.mark.parametrize("policy", ["asymo", "even", "shared", "steal"])
def test_caller_runs_tasks_as_the_worker_of_its_core(policy):
    spec = Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))
    with make_pool(spec, policy) as pool, pinned_to(CPUS[1]):
        assert pool.caller_helps is True
        me = pool.cpus.index(CPUS[1])
        n = 400
        task, worker, cluster, by_main, runs = recorder(n)
        pool.reset_stats()
        for _ in range(20):
            runs[:] = 0
            pool.parallel_for(task, n)
            assert (runs == 1).all()
            if by_main.any():
                break
        assert by_main.any(), "the submitter never helped"
        # whatever the main thread ran, it ran as the worker of its core
        assert set(worker[by_main == 1].tolist()) == {me}
        assert (cluster[by_main == 1] == 0).all()
        # outside tasks, the submitter is no worker
        assert lib.asymo_pool_current_worker() == -1
        assert lib.asymo_pool_current_cluster() == -1
        st = pool.stats()
        assert st["workers"][me]["tasks_caller"] > 0
        assert st["workers"][1 - me]["tasks_caller"] == 0
        assert st["workers"][me]["tasks_caller"] <= st["workers"][me]["tasks_run"]
        assert st["clusters"][0]["tasks_caller"] == st["workers"][me]["tasks_caller"]


@needs2
def test_caller_keeps_the_policy_even_split_no_stealing():
    # policy "even": task t belongs to worker t * nworkers // n, nobody steals; the helping
    # submitter may only run the tasks of the worker it acts as
    spec = Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))
    with make_pool(spec, "even") as pool, pinned_to(CPUS[0]):
        n = 300
        task, worker, _, by_main, runs = recorder(n)
        for _ in range(3):
            pool.parallel_for(task, n)
        owner = np.arange(n) * 2 // n
        assert (worker == owner).all()
        assert set(worker[by_main == 1].tolist()) <= {pool.cpus.index(CPUS[0])}


@needs2
def test_caller_respects_big_to_little_only_stealing():
    # the submitter on the little core acts as the little worker: it must never take the big
    # cluster's tasks (a slower cluster never steals from a faster one)
    spec = big_little()
    with make_pool(spec) as pool, pinned_to(CPUS[1]):
        n = 200
        task, worker, cluster, by_main, runs = recorder(n)
        for _ in range(5):
            pool.parallel_for(task, n, split=[0.5, 0.5])
            assert (runs[:n] >= 1).all()
            runs[:] = 0
            big_tasks = np.arange(n) < n // 2
            assert (cluster[big_tasks] == 0).all()


@needs2
def test_caller_helps_off():
    spec = Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))
    with make_pool(spec) as pool, pinned_to(CPUS[0]):
        pool.caller_helps = False
        assert pool.caller_helps is False
        n = 300
        task, worker, _, by_main, runs = recorder(n)
        pool.reset_stats()
        for _ in range(3):
            pool.parallel_for(task, n)
        assert not by_main.any()
        assert sum(w["tasks_caller"] for w in pool.stats()["workers"]) == 0
        pool.caller_helps = True
        assert pool.caller_helps is True


def test_caller_helps_env_default(monkeypatch):
    monkeypatch.setenv("ASYMO_POOL_CALLER_HELPS", "0")
    with make_pool(f"c0:{CPUS[0]}@1.0") as pool:
        assert pool.caller_helps is False
    monkeypatch.setenv("ASYMO_POOL_CALLER_HELPS", "1")
    with make_pool(f"c0:{CPUS[0]}@1.0") as pool:
        assert pool.caller_helps is True


@pytest.mark.parametrize("flag", ["caller_helps", "caller_to_fastest"])
def test_caller_flags_bad_values(flag):
    with make_pool(f"c0:{CPUS[0]}@1.0") as pool:
        for bad in ("yes", 2, None, -1):
            with pytest.raises(ValueError, match=flag):
                setattr(pool, flag, bad)
    with pytest.raises(ValueError, match="closed"):
        setattr(pool, flag, True)
    with pytest.raises(ValueError, match="closed"):
        getattr(pool, flag)
    assert getattr(lib, f"asymo_pool_set_{flag}")(ffi.NULL, 1) == lib.ASYMO_EINVAL
    assert getattr(lib, f"asymo_pool_get_{flag}")(ffi.NULL) == lib.ASYMO_EINVAL


def _on_cpu(cpu, mask):
    """Put the calling thread on ``cpu``, then widen its mask to ``mask`` (it stays on
    ``cpu`` until the scheduler has a reason to move it)."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setaffinity(0, mask)


def affinity_recorder(n):
    """A task recording, for tasks the submitting thread ran, its affinity mask then."""
    masks = []
    worker = np.full(n, -9, np.int64)
    main = threading.get_ident()

    @ffi.callback("void(int64_t, void *)")
    def task(t, ctx):
        worker[t] = lib.asymo_pool_current_worker()
        if threading.get_ident() == main:
            masks.append(frozenset(os.sched_getaffinity(0)))

    return task, worker, masks


@needs2
def test_submitter_on_a_slower_core_moves_to_the_fastest_cluster_for_the_job():
    spec = big_little()
    both = {CPUS[0], CPUS[1]}
    saved = os.sched_getaffinity(0)
    try:
        with make_pool(spec) as pool:
            assert pool.caller_to_fastest is True
            big = pool.cpus.index(CPUS[0])
            n = 400
            task, worker, masks = affinity_recorder(n)
            seen = set()
            for _ in range(50):
                _on_cpu(CPUS[1], both)
                masks.clear()
                pool.parallel_for(task, n, split=[1.0, 0.0])
                # the mask is restored whatever happened
                assert os.sched_getaffinity(0) == both
                assert (worker == big).all()
                seen.update(masks)
                if frozenset({CPUS[0]}) in seen:
                    break
            # it helped on the big core, as the big core's worker, with a narrowed mask (or,
            # where the scheduler had moved it before the call, with its own)
            assert frozenset({CPUS[0]}) in seen, "the submitter was never moved"
            assert seen <= {frozenset({CPUS[0]}), frozenset(both)}
            # not moved when the pool may not: its mask stays as it was during the job
            pool.caller_to_fastest = False
            assert pool.caller_to_fastest is False
            masks.clear()
            for _ in range(50):
                _on_cpu(CPUS[1], both)
                pool.parallel_for(task, n, split=[0.5, 0.5])
                if masks:
                    break
            assert set(masks) <= {frozenset(both)}
    finally:
        os.sched_setaffinity(0, saved)


@needs2
def test_submitter_pinned_to_a_slower_core_stays_there():
    # a thread that may not run on the fastest cluster (a pipeline stage) is not moved
    spec = big_little()
    with make_pool(spec) as pool, pinned_to(CPUS[1]):
        n = 400
        task, worker, masks = affinity_recorder(n)
        for _ in range(20):
            pool.parallel_for(task, n, split=[0.5, 0.5])
            assert os.sched_getaffinity(0) == {CPUS[1]}
            if masks:
                break
        assert set(masks) <= {frozenset({CPUS[1]})}


@needs2
def test_job_of_one_cluster_with_only_the_callers_worker_runs_in_the_caller():
    # every task belongs to the big cluster, whose only worker is pinned to the caller's
    # core: the caller runs them all as that worker (nobody is woken to share its core)
    spec = big_little()
    with make_pool(spec) as pool, pinned_to(CPUS[0]):
        big = pool.cpus.index(CPUS[0])
        n = 300
        task, worker, cluster, by_main, runs = recorder(n)
        pool.reset_stats()
        for _ in range(5):
            runs[:] = 0
            pool.parallel_for(task, n, split=[1.0, 0.0])
            assert (runs == 1).all()
            assert by_main.all() and (worker == big).all() and (cluster == 0).all()
        st = pool.stats()["workers"]
        assert st[big]["tasks_caller"] == st[big]["tasks_run"] == 5 * n
        assert st[1 - big]["tasks_run"] == 0
        # a split job still runs every task once
        runs[:] = 0
        pool.parallel_for(task, n, split=[0.5, 0.5])
        assert (runs == 1).all()
        # ... and with helping off the caller runs nothing
        pool.caller_helps = False
        by_main[:] = 0
        pool.parallel_for(task, n, split=[1.0, 0.0])
        assert not by_main.any()
    # a cluster-local job of the little cluster, submitted from its only core: the big worker
    # may not steal it, so the caller runs it all
    with make_pool(big_little()) as pool, pinned_to(CPUS[1]):
        n = 100
        task, worker, cluster, by_main, runs = recorder(n)
        counts = ffi.new("int64_t[]", [0, n])
        assert lib.asymo_pool_run(pool._handle, task, ffi.NULL, n, counts,
                                  lib.ASYMO_RUN_CLUSTER_LOCAL) == lib.ASYMO_OK
        assert (runs == 1).all() and by_main.all() and (cluster == 1).all()
    # ... but without the flag the big worker may steal the little cluster's tasks: the job is
    # queued, not run in the caller, and the big worker takes some of 20 slow tasks
    with make_pool(big_little()) as pool, pinned_to(CPUS[1]):
        n = 20
        ran_by = np.full(n, -9, np.int64)

        @ffi.callback("void(int64_t, void *)")
        def slow(t, ctx):
            ran_by[t] = lib.asymo_pool_current_cluster()
            time.sleep(0.002)

        counts = ffi.new("int64_t[]", [0, n])
        assert lib.asymo_pool_run(pool._handle, slow, ffi.NULL, n, counts, 0) == lib.ASYMO_OK
        assert (ran_by >= 0).all() and (ran_by == 0).any()
    # a one-worker pool on the caller's core: every job runs in the caller
    with make_pool(f"c0:{CPUS[0]}@1.0") as pool, pinned_to(CPUS[0]):
        n = 100
        task, worker, cluster, by_main, runs = recorder(n)
        pool.reset_stats()
        pool.parallel_for(task, n)
        assert (runs == 1).all() and by_main.all() and (worker == 0).all()
        assert pool.stats()["workers"][0]["tasks_caller"] == n


@needs2
def test_concurrent_submitters_helping_run_every_task_once():
    spec = Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))
    with make_pool(spec) as pool:
        errors = []

        def submit(seed):
            rng = np.random.default_rng(seed)
            try:
                with pinned_to(CPUS[seed % 2]):
                    for _ in range(40):
                        n = int(rng.integers(1, 3000))
                        counts = np.zeros(n, np.int32)
                        pool.parallel_for(ffi.addressof(lib, "asymo_task_count"), n,
                                          ctx=ffi.from_buffer(counts))
                        if not (counts == 1).all():
                            errors.append((seed, n, np.bincount(counts)))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []


@needs2
def test_matmul_correct_with_helping_submitters():
    import asymo
    spec = Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[1])),))
    with make_pool(spec) as pool:
        results = {}

        def work(i):
            rng = np.random.default_rng(i)
            a = rng.standard_normal((300 + i, 257)).astype(np.float32)
            b = rng.standard_normal((257, 129 if i % 2 else 1)).astype(np.float32)
            b = b if i % 2 else b[:, 0]
            for _ in range(10):
                c = asymo.matmul(a, b, pool=pool)
            results[i] = np.abs(c - a.astype(np.float64) @ b).max()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 4
        assert max(results.values()) < 1e-3
