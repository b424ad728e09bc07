"""A model on a pool of several clusters runs each node on all of them or on the fastest
alone (GraphModel.cluster_choice): the choice, its measurement and the pools it uses."""
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


def _call_until_decided(m, x, ref):
    """Call ``m`` until "auto" has decided, each answer right, within CHOICE_MAX_CALLS."""
    calls = 0
    while m.chosen_clusters()["choice"] == "measuring":
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        calls += 1
        assert calls <= gm.CHOICE_MAX_CALLS


def _tasks(pool):
    return sum(w["tasks_run"] for w in pool.stats()["workers"])


@needs_two_cpus
def test_auto_times_both_then_keeps_the_fastest_of_all_fastest_and_per_node(net_and_input):
    net, x, ref = net_and_input
    with _two_cluster_pool() as pool:
        m = asymo.from_torch(net, x, pool=pool)
        assert m.cluster_choice == "auto"
        assert m.chosen_clusters()["choice"] == "measuring"
        _call_until_decided(m, x, ref)
        choice = m._choices[pool][(1, pool.limit, gm.emulated_period())]
        ma, mf = choice.medians
        assert ma.shape == mf.shape == (len(m.graph.nodes),)
        sel = mf < (1 - gm.CHOICE_MARGIN) * ma
        mixed = sel.any() and not sel[(ma > 0) | (mf > 0)].all()
        assert (choice.per_node is not None) == mixed
        if mixed:
            assert choice.per_node == tuple(sel)
        rep = m.chosen_clusters()
        timed = {"all": rep["all_s"], "fastest": rep["fastest_s"],
                 "per node": rep["per_node_s"]}
        assert (timed["per node"] is not None) == mixed
        assert rep["choice"] == min((k for k in timed if timed[k]), key=timed.get)
        assert rep["nodes_on_fastest"] == sum(choice.on_fastest)
        # the kept placement is what runs now, with the right answer
        sub = pool.fastest_cluster_pool()
        pool.reset_stats()
        sub.reset_stats()
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        assert (_tasks(sub) > 0) == (rep["nodes_on_fastest"] > 0)
        # another batch size is measured on its own
        assert m.chosen_clusters(batch=2)["choice"] == "measuring"


@needs_two_cpus
def test_mixed_placement_gives_the_same_answer(net_and_input):
    net, x, ref = net_and_input
    with _two_cluster_pool() as pool:
        m = asymo.from_torch(net, x, pool=pool)
        key = (1, pool.limit, gm.emulated_period())
        choice = m._choices.setdefault(pool, {}).setdefault(key, gm._Choice())
        n = len(m.graph.nodes)
        choice.medians = (np.ones(n), np.ones(n))
        choice.choice = "per node"
        choice.on_fastest = tuple(i % 2 == 0 for i in range(n))  # every other node
        sub = pool.fastest_cluster_pool()
        pool.reset_stats()
        sub.reset_stats()
        for _ in range(2):
            np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        assert _tasks(pool) > 0 and _tasks(sub) > 0
        assert m.chosen_clusters()["choice"] == "per node"


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


def _feed(c, per_cand, order=None):
    """Record calls as dispatched: per_cand maps a candidate to its (node seconds, call
    seconds) samples, taken in order; ``order`` collects the candidates dispatched."""
    used = dict.fromkeys(per_cand, 0)
    while not c.decided:
        cand = c.next_candidate()
        if order is not None:
            order.append(cand)
        if used[cand] >= len(per_cand[cand]):
            return c
        nodes, whole = per_cand[cand][used[cand]]
        used[cand] += 1
        c.record(cand, nodes, whole)
    return c


def test_choice_rule():
    S = gm.CHOICE_SAMPLES
    n = S + 1
    # node 0 gains 10% alone, node 1 1% (under the margin), node 2 loses: a mix, then the mix,
    # all and fastest in turn; the first call of each candidate (plans) is not counted
    all_s = [([9.0, 9.0, 9.0], 27.0)] + [([1.0, 1.0, 1.0], 3.0)] * (n - 1 + S)
    fast_s = [([0.9, 0.99, 1.5], 3.39)] * (n + S)
    order = []
    c = _feed(gm._Choice(), {"all": all_s, "fastest": fast_s,
                             "per node": [(None, 2.95)] * n}, order)
    assert c.per_node == (True, False, False)
    assert c.decided and c.choice == "per node" and c.on_fastest == (True, False, False)
    assert not c.wants_node_times and gm._Choice().wants_node_times  # step 1 only
    # step 1 alternates; step 2 runs the mix (first call uncounted) and then the three in turn
    assert order[:2 * n] == ["all", "fastest"] * n
    assert order[2 * n:] == ["per node"] + ["per node", "all", "fastest"] * S
    assert len(order) == gm.CHOICE_MAX_CALLS
    rep = c.report()
    assert rep == {"choice": "per node", "all_s": 3.0, "fastest_s": 3.39, "per_node_s": 2.95,
                   "nodes_on_fastest": 1, "rechecks": 0, "refreshes": 0}
    # the mix measured slower as a whole than all clusters: all clusters kept
    c = _feed(gm._Choice(), {"all": all_s, "fastest": fast_s,
                             "per node": [(None, 3.2)] * n})
    assert c.choice == "all" and c.on_fastest == (False, False, False)
    # the machine slowed between the steps: step 2's calls, taken together, decide
    c = _feed(gm._Choice(), {"all": all_s[:n] + [(None, 4.0)] * S,
                             "fastest": fast_s[:n] + [(None, 3.5)] * S,
                             "per node": [(None, 3.6)] * n})
    assert c.choice == "fastest" and c.on_fastest == (True, True, True)
    assert c.report()["all_s"] == 4.0 and c.report()["per_node_s"] == 3.6
    # every node faster alone: no mixed phase, the faster whole call wins
    c = _feed(gm._Choice(), {"all": [([1.0, 1.0], 2.0)] * n,
                             "fastest": [([0.5, 0.5], 1.1)] * n})
    assert c.per_node is None and c.choice == "fastest" and c.on_fastest == (True, True)
    # medians: one slow sample (a stall) does not decide
    stall = [([0.9, 2.0], 2.9)] * n
    stall[2] = ([5.0, 2.0], 7.0)
    c = _feed(gm._Choice(), {"all": [([1.0, 1.0], 2.0)] * (n + S),
                             "fastest": stall + [(None, 2.9)] * S,
                             "per node": [(None, 1.9)] * n})
    assert c.per_node == (True, False) and c.choice == "per node"
    # not enough calls yet
    c = _feed(gm._Choice(), {"all": [([1.0], 1.0)] * (n - 1), "fastest": [([0.5], 0.5)] * n})
    assert not c.decided and c.report()["choice"] == "measuring"


def _probe(c, kept_s, other_s):
    """Run a started probe to its end: the kept candidate's calls take ``kept_s``, the
    other's ``other_s``; returns the candidates dispatched."""
    order = []
    while c.probe is not None:
        cand = c.next_probe()
        order.append(cand)
        c.record(cand, None, kept_s if cand == c.choice else other_s)
    return order


def test_a_decided_choice_is_probed_when_its_calls_slow_down():
    n = gm.CHOICE_SAMPLES + 1
    w = gm.CHOICE_RECHECK_CALLS
    P = gm.CHOICE_PROBE_CALLS
    c = _feed(gm._Choice(), {"all": [([1.0, 1.0], 2.0)] * n,
                             "fastest": [([0.5, 0.5], 1.1)] * n})
    assert c.choice == "fastest" and c.rechecks == 0 and c.next_probe() is None
    # as fast as when chosen, or slower but within the margin of all clusters' 2.0: kept
    assert not any(c.observe(1.1) for _ in range(3 * w))
    assert not any(c.observe(2.0 * (1 + gm.CHOICE_RECHECK_MARGIN) - 0.01) for _ in range(w))
    # one stall per window does not count (medians)
    assert not any(c.observe(100.0 if i == 0 else 1.1) for i in range(w))
    # slower than all clusters were by more than the margin: a probe at the check
    seen = [c.observe(2.5) for _ in range(w)]
    assert seen[-1] and not any(seen[:-1])
    assert c.decided and c.probe is not None and not c.observe(9.0)
    # the whole host slowed: all clusters are as much slower, the choice stays, and the
    # probe's medians are the yardstick now (the other's, and the kept one's)
    order = _probe(c, 2.5, 4.6)
    assert order == ["all", "fastest"] * P
    assert c.decided and c.choice == "fastest" and c.rechecks == 0 and c.probes == 1
    assert c.choice_medians == {"all": 4.6, "fastest": 2.5}
    assert c.report()["choice"] == "fastest" and c.report()["all_s"] == 4.6
    # the next check needs twice the calls; now all clusters win the probe: measured again
    seen = [c.observe(6.0) for _ in range(2 * w)]
    assert seen[-1] and not any(seen[:-1])
    _probe(c, 6.0, 4.6)
    assert not c.decided and c.rechecks == 1 and c.report()["choice"] == "measuring"
    assert not c.observe(9.0)  # (calls while measuring are not checked)
    # a call dispatched before the restart (step 2: no node times) is not a step-1 sample
    c.record("per node", None, 1.0)
    c.record("all", None, 1.0)
    assert c.call_samples == {"all": [], "fastest": [], "per node": []}
    # decided again, from the new measurements; the next check needs four times the calls
    c = _feed(c, {"all": [([1.0, 1.0], 2.0)] * n, "fastest": [([1.5, 1.5], 3.0)] * n})
    assert c.choice == "all" and c.rechecks == 1 and c.report()["rechecks"] == 1
    seen = [c.observe(5.0) for _ in range(4 * w)]
    assert seen[-1] and not any(seen[:-1])
    # a probe the other wins by less than CHOICE_MARGIN keeps the choice
    _probe(c, 5.0, 5.0 * (1 - gm.CHOICE_MARGIN) + 0.01)
    assert c.decided and c.choice == "all" and c.probes == 2 and c.rechecks == 1


def test_a_decided_choice_is_probed_on_schedule():
    # the blind spot of the check above: the fastest cluster alone, chosen while all clusters
    # were slow, never slows down itself when they become fast again
    n = gm.CHOICE_SAMPLES + 1
    T = gm.CHOICE_REFRESH_S
    c = _feed(gm._Choice(), {"all": [([1.0, 1.0], 2.0)] * n,
                             "fastest": [([0.5, 0.5], 1.1)] * n})
    assert c.choice == "fastest"
    # the clock starts at the kept candidate's first observed call, not at the decision
    assert not c.observe(1.1, now=1000.0)
    assert not any(c.observe(1.1, now=1000.0 + T * i / 100) for i in range(1, 100))
    assert c.observe(1.1, now=1000.0 + T)
    assert c.decided and c.probe is not None
    # all clusters are now faster: measured again, and kept; the check's window is unchanged
    _probe(c, 1.1, 0.8)
    assert not c.decided and c.refreshes == 1 and c.rechecks == 0
    assert c.report()["choice"] == "measuring" and c.report()["refreshes"] == 1
    c = _feed(c, {"all": [([0.4, 0.4], 0.8)] * n, "fastest": [([0.5, 0.5], 1.1)] * n})
    assert c.choice == "all" and c.report()["refreshes"] == 1
    seen = [c.observe(5.0, now=5000.0 + i) for i in range(gm.CHOICE_RECHECK_CALLS)]
    assert seen[-1] and not any(seen[:-1])
    _probe(c, 5.0, 1.1)
    assert not c.decided and c.rechecks == 1 and c.refreshes == 1
    # a refresh is due however the calls run, slower or faster than when chosen; a probe the
    # kept candidate wins keeps it, and the clock starts again
    c = _feed(c, {"all": [([0.4, 0.4], 0.8)] * n, "fastest": [([0.5, 0.5], 1.1)] * n})
    assert not c.observe(0.1, now=0.0) and c.observe(0.1, now=T)
    _probe(c, 0.1, 1.1)
    assert c.decided and c.choice == "all" and c.refreshes == 1 and c.probes == 1
    assert not c.observe(0.1, now=2 * T) and not c.observe(0.1, now=3 * T - 0.1)
    assert c.observe(0.1, now=3 * T)


@needs_two_cpus
def test_a_model_measures_its_choice_again_and_keeps_answering(net_and_input):
    net, x, ref = net_and_input
    with _two_cluster_pool() as pool:
        m = asymo.from_torch(net, x, pool=pool)
        for _ in range(gm.CHOICE_MAX_CALLS):
            m(x.numpy())
        rep = m.chosen_clusters()
        assert rep["choice"] != "measuring" and rep["rechecks"] == 0
        choice = m._choices[pool][(1, pool.limit, gm.emulated_period())]
        # the kept candidate's calls are timed: a slow window (as if a core got busy) re-opens
        before = len(choice.recent)
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        assert len(choice.recent) == before + 1
        slow = 10 * max(v for v in choice.choice_medians.values())
        while choice.probe is None:
            choice.observe(slow)
        # the probe's calls run on the model (the other candidate first), answers right
        rival = choice.next_probe()
        assert rival != choice.choice
        np.testing.assert_allclose(m(x.numpy()), ref, rtol=1e-4, atol=1e-4)
        assert len(choice.probe[rival]) == 1
        # the other wins the probe: measured again
        while choice.probe is not None:
            cand = choice.next_probe()
            choice.record(cand, None, slow if cand == choice.choice else slow / 10)
        assert m.chosen_clusters()["choice"] == "measuring"
        _call_until_decided(m, x, ref)
        assert m.chosen_clusters()["rechecks"] == 1


def test_bench_table_says_when_the_choice_was_measured_again():
    from asymo.cli.bench_model import format_table

    r = {"model": "m", "gflop": 1.0, "seconds": {"asymo": 1.0, "ort": 1.0},
         "ratio": {"ort": 1.0}, "best_other": "ort", "vs_best_other": 1.0,
         "machine": {"cpu": "x", "cpus": 2, "affinity": [0, 1], "pool_workers": 2,
                     "topology": "c0:0-1", "emulation": "none"}, "method": "m"}
    end = {"choice": "all", "all_s": 1.0, "fastest_s": 2.0, "per_node_s": None,
           "nodes_on_fastest": 0, "rechecks": 0, "refreshes": 0}
    assert "measured again" not in format_table({**r, "asymo_clusters_end": end})
    text = format_table({**r, "asymo_clusters_end": {**end, "refreshes": 2}})
    assert (f"the choice was measured again on schedule 2 time(s) (every "
            f"{gm.CHOICE_REFRESH_S:g} s); at the end: all") in text
    text = format_table({**r, "asymo_clusters_end": {**end, "rechecks": 1, "refreshes": 1}})
    assert ("the choice was found slower than another and measured again 1 time(s) and "
            "measured again on schedule 1 time(s)") in text
