"""A model's consecutive pool jobs from one call into C (`asymo_pool_run_jobs`,
`asymo.runtime.tasks.JobSequence`, the runner's `_program`): jobs run in order and each
completely before the next, a failing job stops the sequence with its code and index, and
models give the same outputs as node by node."""
import os
import warnings

import numba
import numpy as np
import pytest
from numba import types

import asymo
import asymo.models.graph_model as gm
from asymo.hw.topology import Cluster, Topology
from asymo.ops.conv import BoundConv2d, kernel_isa
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import Pool, hold
from asymo.runtime.tasks import BoundJobs, JobSequence, tasks_call

CPUS = sorted(os.sched_getaffinity(0))
COUNT = ffi.addressof(lib, "asymo_task_count")
N = 4096


@numba.cfunc(types.void(types.int64, types.voidptr))
def _double_plus_one(i, ctx):
    x = numba.carray(ctx, (N,), np.float64)
    x[i] = 2.0 * x[i] + 1.0


@numba.cfunc(types.void(types.int64, types.voidptr))
def _triple(i, ctx):
    x = numba.carray(ctx, (N,), np.float64)
    x[i] = 3.0 * x[i]


def pools():
    a, b = CPUS[0], CPUS[-1]
    tops = [Topology(clusters=(Cluster("c0", (a,)),)), Topology(clusters=(Cluster("c0", (a, b)),)),
            Topology(clusters=(Cluster("big", (a,)), Cluster("little", (b,), capacity=0.5)))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [Pool(t) for t in tops]


def fn_ptr(cf):
    return ffi.cast("asymo_task_fn", cf.address)


@pytest.mark.parametrize("which", range(3))
def test_jobs_run_in_order_each_whole(which):
    pool = pools()[which]
    with pool:
        x = np.zeros(N)
        ctx = ffi.from_buffer("double[]", x)
        a = tasks_call(pool, fn_ptr(_double_plus_one), ctx, N, None, False)
        b = tasks_call(pool, fn_ptr(_triple), ctx, N, None, False)
        with hold(pool):
            JobSequence(pool, [a, b, a])()
        np.testing.assert_array_equal(x, 7.0)  # ((0 * 2 + 1) * 3) * 2 + 1
        with hold(pool):
            JobSequence(pool, [b, a, b])()
        np.testing.assert_array_equal(x, 3.0 * (2.0 * 21.0 + 1.0))


def test_failing_job_stops_the_sequence():
    pool = pools()[2]  # two clusters: counts must add up to the tasks
    with pool:
        c0, c1, c2 = (np.zeros(64, np.int32) for _ in range(3))
        calls = [tasks_call(pool, COUNT, ffi.from_buffer("int32_t[]", c), 64, None, False)
                 for c in (c0, c1, c2)]
        fn, args = calls[1]
        calls[1] = (fn, args[:4] + (ffi.new("int64_t[]", [1, 1]),) + args[5:])  # 2 != 64
        seq = JobSequence(pool, calls)
        with hold(pool), pytest.raises(RuntimeError, match=r"code -?\d+ \(job 1 of 3"):
            seq()
        assert (c0 == 1).all() and (c1 == 0).all() and (c2 == 0).all()


def test_sequence_takes_only_jobs_on_its_pool():
    p1, p2 = pools()[:2]
    with p1, p2:
        c = np.zeros(8, np.int32)
        call = tasks_call(p1, COUNT, ffi.from_buffer("int32_t[]", c), 8, None, False)
        assert JobSequence.fits(p1, *call) and not JobSequence.fits(p2, *call)
        with pytest.raises(ValueError, match="not a job on this pool"):
            JobSequence(p2, [call])
        with pytest.raises(ValueError, match="not a job on this pool"):
            JobSequence(p1, [call, (lib.asymo_pool_fence, (p1._handle, 0))])
        with pytest.raises(ValueError, match="no calls"):
            JobSequence(p1, [])
        assert len(JobSequence(p1, [call, call])) == 2
    assert lib.asymo_pool_run_jobs(ffi.NULL, ffi.NULL, 0, ffi.NULL, 0, ffi.NULL) == lib.ASYMO_EINVAL


def test_bound_jobs_run_in_order_and_name_a_failure():
    pool = pools()[2]
    with pool:
        c = np.zeros(64, np.int32)
        ok = tasks_call(pool, COUNT, ffi.from_buffer("int32_t[]", c), 64, None, False)
        fn, args = ok
        bad = (fn, args[:4] + (ffi.new("int64_t[]", [1, 1]),) + args[5:])  # 2 != 64 tasks
        jobs = BoundJobs([ok, ok], c, "a test call")
        assert jobs.calls == [ok, ok]
        with hold(pool):
            jobs()
        assert (c == 2).all()
        with hold(pool), pytest.raises(RuntimeError, match=r"a test call: a native job failed"):
            BoundJobs([ok, bad, ok], c, "a test call")()
        assert (c == 3).all()
        # a call that is not a pool job: runnable, but not for a caller to run as jobs
        other = BoundJobs([ok, (lib.asymo_pool_fence, (pool._handle, 0))], c, "x")
        assert other.calls is None


onnx = pytest.importorskip("onnx")


def _model(name):
    """The torchvision-style network ``name`` from ONNX, and an input for it."""
    torch = pytest.importorskip("torch")
    from asymo.models import torchvision_defs as tv
    from asymo.models.torch_loader import export_onnx_bytes

    x = np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32)
    return asymo.from_onnx(export_onnx_bytes(tv.build(name), torch.from_numpy(x))), x


def _reference_and_binding(m, x, pool, monkeypatch):
    """``m``'s output on ``pool`` node by node, an instance of it and its binding to the pool
    (`_Instance._binding`: the steps, the sibling groups, the programs)."""
    monkeypatch.setattr(gm, "SEQUENCE_JOBS", False)
    ref = m(x, pool=pool)
    monkeypatch.setattr(gm, "SEQUENCE_JOBS", True)
    inst = m._acquire(1, pool)
    with hold(pool) as p:
        bound = inst._binding(p)
    m._release(inst)
    return ref, inst, bound


@pytest.mark.parametrize("name", ["squeezenet1_1", "mobilenet_v2"])
def test_models_equal_node_by_node(name, monkeypatch):
    m, x = _model(name)
    for pool in pools()[:2]:
        with pool:
            ref, _inst, bound = _reference_and_binding(m, x, pool, monkeypatch)
            program = bound[4]
            # every step is pool jobs (convolutions, pooling, the classifier's product) but
            # convolutions planned as GEMMs (asymo_gemm runs its own jobs: where the kernels
            # run AVX2, SqueezeNet's wide 1x1 layers, `conv._rows_on_avx2`): the steps between
            # them are one sequence each
            gemms = [s for s in program if not isinstance(s, JobSequence)]
            assert all(isinstance(s, BoundConv2d) and s.calls is None and s._fallback is None
                       for s in gemms)
            assert not any(isinstance(a, JobSequence) and isinstance(b, JobSequence)
                           for a, b in zip(program, program[1:]))
            assert sum(len(s) for s in program if isinstance(s, JobSequence)) >= 10
            if kernel_isa() == "avx512" or name == "mobilenet_v2":
                assert len(program) == 1 and isinstance(program[0], JobSequence)
            np.testing.assert_array_equal(m(x, pool=pool), ref)


@pytest.mark.parametrize("name", ["squeezenet1_1", "googlenet"])
def test_models_on_two_clusters_fence_in_the_sequence_as_node_by_node(name, monkeypatch):
    # On a pool of two clusters a convolution's tasks may be backed up and its late copy run
    # into the next nodes: the whole call's program fences in C (asymo_run_job.wait / .mark)
    # where the node-by-node runner fences from Python.
    m, x = _model(name)
    m.cluster_choice = "all"
    with pools()[2] as pool:
        ref, inst, bound = _reference_and_binding(m, x, pool, monkeypatch)
        fenced, merged, after = bound[5], bound[3], inst.fence_until
        seqs = [e for e in fenced if isinstance(e, JobSequence)]
        assert seqs and sum(len(s) for s in seqs) >= 10
        # each node's (or sibling group's) first job waits as fence_until says and marks
        firsts = {}
        for s in seqs:
            for k in range(len(s)):
                j = s._jobs[k]
                if j.mark >= 0:
                    firsts[j.mark] = j.wait
        assert firsts
        groups = {k: i for i, (last, _) in merged.items() for k in range(i, last + 1)}
        for i, wait in firsts.items():
            nodes = [k for k, g in groups.items() if g == i] or [i]
            waits = [after[k] for k in nodes if after[k] >= 0]
            want = (JobSequence.WAIT_NONE if not waits else JobSequence.WAIT_ALL
                    if max(waits) >= i else groups.get(max(waits), max(waits)))
            assert wait == want, (i, wait, want)
        assert any(w >= 0 for w in firsts.values())
        for _ in range(3):
            np.testing.assert_array_equal(m(x, pool=pool), ref)
