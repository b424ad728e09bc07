"""A model on a pool of several clusters runs on all of them or on the fastest alone
(GraphModel.cluster_choice): the choice, its measurement and the pool it uses."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import asymo  # noqa: E402
from asymo.hw.topology import Cluster, Topology  # noqa: E402
from asymo.models import graph_model as gm  # noqa: E402
from asymo.models import torchvision_defs as tv  # noqa: E402

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                    reason="needs two cpus in the affinity mask")


def _two_cluster_pool():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    return asymo.Pool(topology=Topology(clusters=(
        Cluster("big", (cpus[0],), capacity=1.0), Cluster("little", (cpus[1],), capacity=0.5))))


@pytest.fixture(scope="module")
def net_and_input():
    net = tv.build("squeezenet1_1", num_classes=10, seed=4)
    x = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = net(x).numpy()
    return net, x, ref


def _tasks(pool):
    return sum(w["tasks_run"] for w in pool.stats()["workers"])


@needs_two_cpus
def test_auto_measures_both_then_keeps_the_faster(net_and_input):
    net, x, ref = net_and_input
    with _two_cluster_pool() as pool:
        m = asymo.from_torch(net, x, pool=pool)
        assert m.cluster_choice == "auto"
        assert m.chosen_clusters() == {"choice": "measuring", "all_s": None,
                                       "fastest_s": None}
        for _ in range(2 * (1 + gm.CHOICE_SAMPLES)):
            np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        rep = m.chosen_clusters()
        assert rep["choice"] in ("all", "fastest")
        assert rep["all_s"] > 0 and rep["fastest_s"] > 0
        faster = rep["fastest_s"] < (1 - gm.CHOICE_MARGIN) * rep["all_s"]
        assert (rep["choice"] == "fastest") == faster
        # the kept choice is where calls run now
        sub = pool.fastest_cluster_pool()
        pool.reset_stats()
        sub.reset_stats()
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        ran = sub if rep["choice"] == "fastest" else pool
        idle = pool if rep["choice"] == "fastest" else sub
        assert _tasks(ran) > 0 and _tasks(idle) == 0
        # another batch size is measured on its own
        assert m.chosen_clusters(batch=2)["choice"] == "measuring"


@needs_two_cpus
def test_fixed_choices_run_where_they_say(net_and_input):
    net, x, ref = net_and_input
    with _two_cluster_pool() as pool:
        m = asymo.from_torch(net, x, pool=pool, cluster_choice="all")
        m(x.numpy())
        assert pool._fastest is None  # never made
        assert m.chosen_clusters()["choice"] == "all"
        m.cluster_choice = "fastest"
        sub = pool.fastest_cluster_pool()
        m(x.numpy())
        pool.reset_stats()
        sub.reset_stats()
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        assert _tasks(pool) == 0 and _tasks(sub) > 0
        assert m.chosen_clusters()["choice"] == "fastest"
    assert sub.closed  # closed with its pool


def test_one_cluster_pools_and_bad_values(net_and_input):
    net, x, _ = net_and_input
    with asymo.Pool(topology=Topology(clusters=(Cluster("c", (0,), capacity=1.0),))) as pool:
        assert pool.fastest_cluster_pool() is pool
        m = asymo.from_torch(net, x, pool=pool)
        m(x.numpy())
        assert m.chosen_clusters()["choice"] == "all"
        with pytest.raises(ValueError, match="cluster_choice"):
            m.cluster_choice = "big"
    with pytest.raises(ValueError, match="cluster_choice"):
        asymo.from_torch(net, x, cluster_choice=None)


def test_fastest_cluster_pool_keeps_the_fastest_cluster_and_its_emulation():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cpus in the affinity mask")
    top = Topology(clusters=(Cluster("big", (cpus[0],), capacity=1.0),
                             Cluster("little", (cpus[1],), capacity=0.4)),
                   emulated={cpus[0]: 0.9, cpus[1]: 0.4})
    with asymo.Pool(topology=top, policy="steal") as pool:
        sub = pool.fastest_cluster_pool()
        assert sub is pool.fastest_cluster_pool()
        assert sub.cpus == (cpus[0],) and sub.nclusters == 1 and sub.policy == "steal"
        assert sub.topology.emulated == {cpus[0]: 0.9}
    assert sub.closed
    with pytest.raises(ValueError, match="closed"):
        pool.fastest_cluster_pool()


def test_choice_rule():
    def run(all_s, fast_s):
        c = gm._Choice()
        for a, f in zip(all_s, fast_s):
            c.record(c.next_candidate(), a)
            c.record(c.next_candidate(), f)
        return c
    n = gm.CHOICE_SAMPLES + 1
    # the first call of each (plans) is not counted: a slow first "all" call changes nothing
    c = run([9.0] + [1.0] * (n - 1), [1.0] + [0.99] * (n - 1))
    assert c.decided == "all" and c.report()["all_s"] == 1.0
    assert run([1.0] * n, [0.9] * n).decided == "fastest"
    c = run([1.0] * (n - 1), [0.5] * (n - 1))
    assert c.decided is None and c.report()["choice"] == "measuring"
    assert c.next_candidate() == "all"  # alternates until both have their samples
