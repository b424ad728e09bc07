"""GEMM plans: plain data, cached, split by capability, block sizes within the cache limits."""
import dataclasses
import json

import numpy as np
import pytest

from asymo.plan import gemm as P
from asymo.hw.topology import Cache, parse_spec

L1, L2 = 32 * 1024, 1024 * 1024


def topo(spec, l1=L1, l2=L2):
    t = parse_spec(spec)
    return t.replace(clusters=tuple(
        dataclasses.replace(c, l1d=Cache(1, l1, (c.cpus[0],)), l2=Cache(2, l2, (c.cpus[0],)))
        for c in t.clusters))


ASYM = topo("big:0-1@1.0,little:2-3@0.5")
SYM = topo("c0:0-1@1.0")


def test_plan_is_data_and_cached():
    p = P.plan_gemm(1000, 300, 200, "float32", topology=SYM)
    assert p is P.plan_gemm(1000, 300, 200, np.float32, topology=SYM)
    assert p.kind == "mm" and p.split_dim == "M" and p.cluster_ranges == ((0, 1000),)
    d = json.loads(json.dumps(p.to_dict()))
    assert P.GemmPlan.from_dict(d) == p
    assert sum(p.task_counts()) >= 2
    assert p.isa in P.supported_isas()


def test_split_follows_capacity_and_can_leave_a_cluster_idle():
    mr, _ = P.kernel_tile(P.best_isa(), "float32")
    p = P.plan_gemm(6000, 512, 256, "float32", topology=ASYM)
    (a0, b0), (a1, b1) = p.cluster_ranges
    assert a0 == 0 and b0 == a1 and b1 == 6000
    assert abs(b0 / 6000 - 2 / 3) < 0.01 and b0 % mr == 0       # 1.0 x 2 : 0.5 x 2
    # the bigger operand is divided: B bigger -> columns are split
    assert P.plan_gemm(256, 512, 6000, "float32", topology=ASYM).split_dim == "N"
    only_big = P.plan_gemm(6000, 512, 256, "float32", topology=ASYM, split=(1, 0))
    assert only_big.cluster_ranges == ((0, 6000), (6000, 6000))
    assert only_big.task_counts()[1] == 0
    with pytest.raises(ValueError, match="split"):
        P.plan_gemm(60, 50, 40, "float32", topology=ASYM, split=(1, 2, 3))
    with pytest.raises(ValueError, match="split"):
        P.plan_gemm(60, 50, 40, "float32", topology=ASYM, split=(0, 0))


@pytest.mark.parametrize("isa", P.supported_isas())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3136, 576, 64), (196, 4608, 512), (49, 1024, 1024),
                                   (50176, 27, 64), (1024, 1024, 1024)])
def test_default_blocks_respect_asymo_cache_constraints(isa, dtype, shape):
    M, K, N = shape
    mr, nr = P.kernel_tile(isa, dtype)
    es = np.dtype(dtype).itemsize
    mc, nc, kc = P.default_blocks(M, N, K, SYM.clusters[0], 2, mr, nr, es)
    assert kc <= K and (kc == K or (mr * kc + nr * kc + mr * nr) * es <= L1)   # constraint (1)
    assert (mc * kc + nc * kc + mc * nc) * es <= L2                              # L2 (per core)
    assert mc % mr == 0 and nc % nr == 0 and mc >= 1 and nc >= 1
    assert nc <= -(-N // nr) * nr and mc <= -(-M // mr) * mr


def test_unknown_caches_fall_back():
    bare = parse_spec("c0:0-1@1.0")
    assert bare.clusters[0].l1d is None
    p = P.plan_gemm(2000, 2000, 2000, "float32", topology=bare)
    mr, nr = P.kernel_tile(p.isa, "float32")
    mc, nc, kc = p.blocks[0]
    assert (mr * kc + nr * kc + mr * nr) * 4 <= 32 * 1024
    assert (mc * kc + nc * kc + mc * nc) * 4 <= 512 * 1024


def test_block_candidates_follow_constraint_two():
    cl = SYM.clusters[0]
    cands = P.block_candidates(1024, 1024, 1024, cl, 2, 6, 16, 4)
    assert cands
    for mc, nc, kc in cands:
        assert abs(mc - nc) <= 16 and (mc * kc + nc * kc + mc * nc) * 4 <= L2
    # M << N: the block would exceed M, so M is not partitioned (only N is)
    short = P.block_candidates(49, 1024, 1024, cl, 2, 6, 16, 4)
    assert short[0][0] == 54 and short[0][1] < 1024 and all(mc <= 54 for mc, _, _ in short)


def test_kinds_and_small_products():
    assert P.plan_gemm(4096, 4096, 1, "float32", topology=SYM).kind == "mv"
    assert P.plan_gemm(1, 4096, 4096, "float32", topology=SYM).split_dim == "N"
    assert P.plan_gemm(300, 1, 200, "float32", topology=SYM).kind == "outer"
    assert P.plan_gemm(8, 8, 8, "float32", topology=SYM).serial
    assert not P.plan_gemm(1000, 1000, 1000, "float32", topology=SYM).serial
    tiny = P.plan_gemm(8, 8, 8, "float32", topology=ASYM)   # asymmetric: fastest cluster
    assert not tiny.serial and tiny.cluster_ranges[1][0] == tiny.cluster_ranges[1][1]
    assert tiny.serial_cpus == (0, 1)          # in the calling thread when it is on "big"
    batch = P.plan_gemm(7, 9, 5, "float32", topology=SYM, nbatch=100)
    assert batch.split_dim == "batch" and sum(batch.task_counts()) > 2


def test_block_chooser_and_forced_isa():
    calls = []

    def chooser(M, N, K, cluster, threads, mr, nr, itemsize):
        calls.append((M, N, K, cluster.name, threads))
        return (mr, nr, 64)
    P.set_block_chooser(chooser)
    try:
        p = P.plan_gemm(500, 400, 300, "float32", topology=ASYM)
        mr, nr = P.kernel_tile(p.isa, "float32")
        assert p.blocks == ((mr, nr, 64), (mr, nr, 64))
        assert {c[3] for c in calls} == {"big", "little"} and all(c[4] == 2 for c in calls)
    finally:
        P.set_block_chooser(None)
    assert P.plan_gemm(500, 400, 300, "float32", topology=ASYM).blocks != p.blocks
    with P.force_isa("portable"):
        assert P.plan_gemm(50, 40, 30, "float32", topology=SYM).isa == "portable"
        assert P.kernel_tile("portable", "float64") == (4, 4)
    with pytest.raises(ValueError, match="kernel family"):
        P.plan_gemm(5, 5, 5, "float32", topology=SYM, isa="sse9")


def test_on_plans_cleared_hooks_run_when_plans_go_stale():
    calls = []
    hook = lambda: calls.append(1)  # noqa: E731
    P.on_plans_cleared(hook)
    try:
        P.clear_plan_cache()
        assert calls == [1]
        with P.force_isa("portable"):
            assert calls == [1, 1]
        assert calls == [1, 1, 1]
    finally:
        P._clear_hooks.remove(hook)
    with pytest.raises(TypeError, match="callable"):
        P.on_plans_cleared("not a function")


def test_a_new_block_chooser_reaches_convolutions_planned_before(monkeypatch):
    """set_block_chooser clears the plan caches, conv2d's too: a layer planned before the
    chooser is planned again with it (and still answers right)."""
    import asymo
    from asymo.ops.conv import conv_path
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 20, 20)).astype(np.float32)
    w = rng.standard_normal((256, 64, 1, 1)).astype(np.float32)
    pool = asymo.Pool("c:0@1.0")
    from asymo.ops import conv as conv_mod
    for path in ("POINTWISE", "ROWS", "NCHWC"):  # (the layer as a GEMM on any ISA)
        monkeypatch.setattr(conv_mod, path, "off")
    assert conv_path(x.shape, w.shape, 1, 0) == "gemm"
    want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x)
    np.testing.assert_allclose(asymo.conv2d(x, w, pool=pool), want, rtol=1e-4, atol=1e-4)
    calls = []

    def chooser(M, N, K, cluster, threads, mr, nr, itemsize):
        calls.append((M, N, K))
        return (mr, nr, 16)
    P.set_block_chooser(chooser)
    try:
        np.testing.assert_allclose(asymo.conv2d(x, w, pool=pool), want, rtol=1e-4, atol=1e-4)
        assert (256, 400, 64) in calls
    finally:
        P.set_block_chooser(None)
    calls.clear()
    np.testing.assert_allclose(asymo.conv2d(x, w, pool=pool), want, rtol=1e-4, atol=1e-4)
    assert not calls


def test_invalid_plans_are_rejected():
    good = P.plan_gemm(100, 50, 60, "float32", topology=SYM).to_dict()
    for change, match in [({"cluster_ranges": [[0, 50]]}, "end at 50"),
                          ({"cluster_ranges": [[10, 100]]}, "contiguous"),
                          ({"blocks": [[0, 16, 8]]}, "blocks"),
                          ({"kind": "conv"}, "kind"),
                          ({"kind": "outer"}, "K == 1"),
                          ({"split_dim": "K"}, "split_dim"),
                          ({"chunks": [1, 2]}, "chunks")]:
        with pytest.raises(ValueError, match=match):
            P.GemmPlan.from_dict({**good, **change})
    with pytest.raises(ValueError, match="not a GemmPlan"):
        P.GemmPlan.from_dict({"shape": [1, 2, 3]})
    with pytest.raises(TypeError, match="float32 and float64"):
        P.plan_gemm(5, 5, 5, "int32", topology=SYM)


def test_task_counts_are_a_multiple_of_the_threads():
    """AsyMo's constraint (2): tasks a multiple of the thread count, so no worker runs one
    more task than the others."""
    quad = topo("big:0-3@1.0")
    for shape in [(784, 1152, 128), (3136, 576, 64), (1024, 1024, 1024), (684, 1152, 128),
                  (12544, 27, 32)]:
        counts = P.plan_gemm(*shape, "float32", topology=quad).task_counts()
        assert counts[0] % 4 == 0, (shape, counts)


# --- a cluster's tasks stay a multiple of its threads when the block floors cap them -------
# The simulated Kirin 970 (4x A73 + 4x A53) ran conv2d 64x56x56 3x3 (the GEMM 64 x 576 x
# 3136, weights @ columns) slower on 8 cores than on 7: M = 64 cannot be cut, the columns
# stopped at 8 micro-tiles, and the A53s got 9 tasks for 4 cores.

def kirin(k):
    from asymo.lab.sim import first_cores
    from asymo.lab.sim.presets import get_preset
    return first_cores(get_preset("kirin970").topology, k)


def _l2_per_thread(cl):
    return cl.l2.size // len(set(cl.l2.shared_cpus) & set(cl.cpus))


@pytest.mark.parametrize("isa", P.supported_isas())
@pytest.mark.parametrize("k", range(1, 9))
def test_kirin_conv_gemm_tasks_are_a_multiple_of_each_clusters_threads(isa, k):
    t = kirin(k)
    M, K, N = 64, 576, 3136
    p = P.plan_gemm(M, K, N, "float32", topology=t, isa=isa)
    mr, nr = P.kernel_tile(isa, "float32")
    for cl, n, (a, b), (mc, nc, kc) in zip(t.clusters, p.task_counts(), p.cluster_ranges,
                                          p.blocks):
        assert n % cl.ncpus == 0, (k, cl.name, n, p.blocks)
        # the floors and the cache constraints still hold
        cols = b - a if p.split_dim == "N" else N
        # columns: no more blocks than blocks of 8 micro-tiles give; rows: at most twice the
        # blocks of 8 micro-tiles (a short M is cut in two at most)
        assert nc % nr == 0 and -(-cols // nc) <= -(-cols // (8 * nr)), (k, p.blocks)
        assert mc % mr == 0 and -(-M // mc) <= max(2, 2 * (M // (8 * mr))), (k, p.blocks)
        assert (mr * kc + nr * kc + mr * nr) * 4 <= cl.l1d.size or kc == K
        assert (mc * kc + nc * kc + mc * nc) * 4 <= _l2_per_thread(cl)


def test_column_blocks_are_regrouped_when_rows_cannot_be():
    a53 = kirin(8).clusters[1]
    # the A53s' share at 8 cores: 64 x 1152 columns, K = 576; was (66, 128, 288): 9 tasks
    mc, nc, kc = P.default_blocks(64, 1152, 576, a53, 4, 6, 16, 4)
    tasks = -(-64 // mc) * -(-1152 // nc)
    assert tasks % 4 == 0 and tasks >= 8 and nc >= 8 * 16
    assert (mc * kc + nc * kc + mc * nc) * 4 <= _l2_per_thread(a53)
    # mc alone already balanced the count (7 cores, A73s): unchanged
    assert P.default_blocks(64, 2192, 576, kirin(7).clusters[0], 4, 6, 16, 4) == (36, 128, 576)
    # thousands of tasks (not capped by the floors): one extra is noise, plan unchanged
    assert P.default_blocks(3136, 50176, 27, SYM.clusters[0], 2, 6, 16, 4) == (6, 7168, 27)
    # no width between the floor and the cache limit gives a multiple of 3: left as it was
    assert P.default_blocks(64, 164, 576, kirin(3).clusters[0], 3, 6, 16, 4) == (66, 96, 576)


@pytest.mark.parametrize("isa", P.supported_isas())
def test_simulated_kirin_conv2d_scales_to_all_eight_cores(isa):
    from asymo.lab.scaling import make_workloads, simulate_scaling
    from asymo.lab.sim.presets import get_preset
    rates = get_preset("kirin970").gflops_per_core
    with P.force_isa(isa):
        r = simulate_scaling("kirin970", make_workloads(["conv2d"]), policies=["asymo"])
    tput = [p.throughput for p in sorted(r.points, key=lambda p: p.cores)]
    assert len(tput) == 8
    assert all(b > a for a, b in zip(tput, tput[1:])), tput       # was 45.1 -> 41.6 at 7 -> 8
    for k, g in enumerate(tput, 1):
        ideal = rates[0] * min(k, 4) + rates[1] * max(k - 4, 0)
        assert g >= 0.95 * ideal, (k, g, ideal)


@pytest.mark.parametrize("M, N, K, threads, l2, mr, nr, itemsize", [
    (7, 3136, 27, 4, 16384, 8, 8, 4),       # was (8, 112, 27): 4136 > 4096 elements
    (1, 3136, 3, 12, 16384, 6, 16, 8),      # was (6, 272, 3): 2466 > 2048 elements
])
def test_wider_columns_keep_the_l2_constraint(M, N, K, threads, l2, mr, nr, itemsize):
    # the column widths tried to balance the task count must leave room in L2 for an mr-row
    # A block and its C block, not only for the B panel
    from asymo.hw.topology import Cache, Cluster
    cl = Cluster("x", tuple(range(threads)), 1.0, l1d=Cache(1, 16384, (0,)),
                 l2=Cache(2, l2, (0,)))
    mc, nc, kc = P.default_blocks(M, N, K, cl, threads, mr, nr, itemsize)
    assert (mc * kc + nc * kc + mc * nc) * itemsize <= l2, (mc, nc, kc)
    assert mc % mr == 0 and nc % nr == 0
