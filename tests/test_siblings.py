"""Sibling convolutions as one pool job: asymo_multi_task's mapping of task ids to parts
(`asymo.runtime.tasks.merged_call`), the planner's groups (`_sibling_groups`) and their
arena, and models whose groups run merged giving the same outputs as node by node."""
import os
import warnings

import numpy as np
import pytest

import asymo
import asymo.models.graph_model as gm
from asymo.hw.topology import Cluster, Topology
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.pool import Pool, hold
from asymo.runtime.tasks import merged_call, tasks_call

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CPUS = sorted(os.sched_getaffinity(0))
needs2 = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable cpus")
COUNT = ffi.addressof(lib, "asymo_task_count")
RNG = np.random.default_rng(0)


def make_pool(topology):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # unpinned workers on small machines
        return Pool(topology)


def topologies():
    a, b = CPUS[0], CPUS[-1]
    return [Topology(clusters=(Cluster("c0", (a,)),)),
            Topology(clusters=(Cluster("c0", (a, b)),)),
            Topology(clusters=(Cluster("big", (a,)), Cluster("little", (b,), capacity=0.5))),
            # four workers (two unpinned on a 2-cpu machine), two per cluster
            Topology(clusters=(Cluster("big", (a, b)), Cluster("little", (a + 1000, b + 1000),
                                                                capacity=0.5)))]


def _count_calls(pool, sizes, flags=0):
    arrays = [np.zeros(n, np.int32) for n in sizes]
    calls = [tasks_call(pool, COUNT, ffi.from_buffer("int32_t[]", c), n, None, False)
             for c, n in zip(arrays, sizes)]
    calls = [(fn, args[:5] + (flags,)) for fn, args in calls]
    return arrays, calls


@pytest.mark.parametrize("topo", range(4))
@pytest.mark.parametrize("sizes", [(10, 3), (1, 1), (7, 0, 5), (64, 9, 2, 1), (3,) * 9])
def test_a_merged_job_runs_every_task_of_every_part_once(topo, sizes):
    with make_pool(topologies()[topo]) as pool:
        for limit in (None, 1):
            if limit:
                pool.limit = limit
            arrays, calls = _count_calls(pool, sizes)
            merged = merged_call(pool, calls)
            assert merged is not None
            (fn, args), keep = merged
            assert int(args[3]) == sum(sizes)
            if pool.nclusters > 1:  # explicit per-cluster counts summing to the tasks
                assert sum(args[4][c] for c in range(pool.nclusters)) == sum(sizes)
            else:
                assert args[4] == ffi.NULL
            assert fn(*args) == 0
            for a in arrays:
                np.testing.assert_array_equal(a, 1)


def test_each_worker_is_dealt_its_share_of_each_job_in_turn():
    # two workers, jobs of 4 and 6 tasks: worker 0's range is job 0's first half, then job
    # 1's; the multi-job's first[] says so
    with make_pool(Topology(clusters=(Cluster("c0", (CPUS[0], CPUS[-1])),))) as pool:
        _, calls = _count_calls(pool, (4, 6))
        (fn, args), keep = merged_call(pool, calls)
        m = args[2]
        assert m.nparts == 4
        assert [m.first[i] for i in range(4)] == [0, 2, 5, 7]
        assert [m.parts[i].lo for i in range(4)] == [0, 0, 2, 3]


def test_too_many_parts_go_per_cluster_then_refuse_and_inline_jobs_refuse():
    four = topologies()[3]
    with make_pool(four) as pool:
        # 9 jobs x 4 workers = 36 parts: one chunk per cluster instead (18)
        arrays, calls = _count_calls(pool, (5,) * 9)
        (fn, args), keep = merged_call(pool, calls)
        assert args[2].nparts == 18
        assert fn(*args) == 0
        assert all((a == 1).all() for a in arrays)
        # 17 jobs x 2 clusters = 34 parts: no single job
        _, calls = _count_calls(pool, (2,) * 17)
        assert merged_call(pool, calls) is None
        _, calls = _count_calls(pool, (4, 4), flags=lib.ASYMO_RUN_INLINE)
        assert merged_call(pool, calls) is None


def test_a_merged_job_backs_up_only_if_every_part_did():
    with make_pool(topologies()[2]) as pool:
        _, calls = _count_calls(pool, (4, 4), flags=lib.ASYMO_RUN_BACKUP)
        assert merged_call(pool, calls)[0][1][5] == lib.ASYMO_RUN_BACKUP
        calls[1] = (calls[1][0], calls[1][1][:5] + (0,))
        assert merged_call(pool, calls)[0][1][5] == 0


# ---- models -----------------------------------------------------------------------------

def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def fire_model(c=16, s=8, e=16, hw=13, chained=False):
    """x -> squeeze (1x1) -> expand 1x1 and expand 3x3 -> concat -> 1x1 (a SqueezeNet fire
    module); ``chained``: the 3x3 reads the 1x1's output instead (no siblings)."""
    inits = {"ws": _w(s, c, 1, 1), "bs": _w(s), "w1": _w(e, s, 1, 1), "b1": _w(e),
             "w3": _w(e, s if not chained else e, 3, 3), "b3": _w(e), "wo": _w(8, 2 * e, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "ws", "bs"], ["s0"]),
             helper.make_node("Relu", ["s0"], ["s"]),
             helper.make_node("Conv", ["s", "w1", "b1"], ["e1"]),
             helper.make_node("Relu", ["e1"], ["r1"]),
             helper.make_node("Conv", ["r1" if chained else "s", "w3", "b3"], ["e3"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["r3"]),
             helper.make_node("Concat", ["r1", "r3"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "wo"], ["y"])]
    g = helper.make_graph(nodes, "fire", [_vi("x", [None, c, hw, hw])], [_vi("y", None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, x):
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_the_fire_modules_expands_are_one_group_longest_first_and_apart_in_the_arena():
    m = asymo.from_onnx(fire_model())
    g = m.graph
    plan = m.plan(1)
    assert len(plan.siblings) == 1
    (group,) = plan.siblings
    assert [g.nodes[i].op for i in group] == ["asymo.Conv", "asymo.Conv"]
    assert sorted(group) == list(range(min(group), max(group) + 1))  # adjacent
    # the 3x3 (9x the multiply-adds) first
    assert g.initializers[g.nodes[group[0]].inputs[1]].shape[2:] == (3, 3)
    # nothing one node reads or writes shares memory with what another writes
    consts = g.initializers

    def ivs(names):
        return [iv for t in names if t and t not in consts for iv in gm._byte_intervals(plan, t)]

    for a in group:
        for b in group:
            if a != b:
                na, nb = g.nodes[a], g.nodes[b]
                assert not any(x0 < y1 and y0 < x1 for x0, x1 in ivs(na.outputs)
                               for y0, y1 in ivs(list(nb.inputs) + list(nb.outputs)))
    assert plan.to_dict()["siblings"] == [list(group)]


def test_dependent_neighbours_and_one_node_limit_make_no_group(monkeypatch):
    assert asymo.from_onnx(fire_model(chained=True)).plan(1).siblings == []
    monkeypatch.setattr(gm, "SIBLING_MAX_NODES", 1)
    assert asymo.from_onnx(fire_model()).plan(1).siblings == []


@pytest.mark.parametrize("topo", [1, 2])
def test_merged_siblings_give_the_node_by_node_outputs(topo, monkeypatch):
    model = fire_model(hw=27)
    x = RNG.standard_normal((2, 16, 27, 27)).astype(np.float32)
    want = _ort(model, x)
    with make_pool(topologies()[topo]) as pool:
        m = asymo.from_onnx(model, cluster_choice="all")
        got = m(x, pool=pool)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        with hold(pool) as p:
            inst = m._acquire(2, p)
            merged = inst._merged_for(p)
            m._release(inst)
        (first, (last, call)), = merged.items()
        assert (first, last) == (min(m.plan(2).siblings[0]), max(m.plan(2).siblings[0]))
        monkeypatch.setattr(gm, "SIBLING_MAX_NODES", 1)
        alone = asymo.from_onnx(model, cluster_choice="all")
        np.testing.assert_array_equal(alone(x, pool=pool), got)


@needs2
def test_timed_and_partial_runs_take_the_nodes_one_by_one():
    m = asymo.from_onnx(fire_model(hw=27))
    x = RNG.standard_normal((1, 16, 27, 27)).astype(np.float32)
    want = m(x)
    (group,) = m.plan(1).siblings
    first, last = min(group), max(group)
    n = len(m.graph.nodes)
    pool = asymo.get_pool()
    inst = m._acquire(1, pool)
    try:
        out = m.graph.outputs[0]
        np.copyto(inst.views[m.graph.inputs[0].name], x)
        times = [0.0] * n
        inst.run(0, n - 1, pool, times=times)
        assert times[first] > 0 and times[last] > 0  # each timed on its own
        np.testing.assert_array_equal(inst.views[out], want)
        inst.views[out][...] = 0
        # a range ending inside the group runs its first node alone, then the rest (the
        # input's memory is reused after its last reader: copied in again)
        np.copyto(inst.views[m.graph.inputs[0].name], x)
        inst.run(0, first, pool)
        inst.run(first + 1, n - 1, pool)
        np.testing.assert_array_equal(inst.views[out], want)
    finally:
        m._release(inst)


def test_squeezenet_and_googlenet_from_the_zoo_merge_their_branches():
    for name, size in (("squeezenet", 64), ("googlenet", 96)):
        m = asymo.models.get_graph(name, image_size=size)
        groups = m.plan(1).siblings
        assert groups, name
        for grp in groups:
            assert all(m.graph.nodes[i].op == "asymo.Conv" for i in grp)
            assert 2 <= len(grp) <= gm.SIBLING_MAX_NODES
