"""caller_on_fastest: the caller runs on the pool's fastest cluster during a block (a model's
inference), its affinity restored on every exit path."""
import os

import numpy as np
import pytest

import asymo
from asymo.runtime.pool import caller_on_fastest

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two cpus")


@pytest.fixture
def two_clusters():
    pool = asymo.Pool(topology=f"c0:{CPUS[0]}@1,c1:{CPUS[1]}@0.5")
    yield pool
    pool.close()


def test_pins_to_the_fastest_cluster_and_restores(two_clusters):
    before = os.sched_getaffinity(0)
    with caller_on_fastest(two_clusters):
        assert os.sched_getaffinity(0) == {CPUS[0]}
    assert os.sched_getaffinity(0) == before
    with pytest.raises(KeyError):
        with caller_on_fastest(two_clusters):
            raise KeyError("inside")
    assert os.sched_getaffinity(0) == before


def test_leaves_a_thread_that_may_not_run_there_alone(two_clusters):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {CPUS[1]})
    try:
        with caller_on_fastest(two_clusters):
            assert os.sched_getaffinity(0) == {CPUS[1]}
    finally:
        os.sched_setaffinity(0, before)


def test_one_cluster_pool_changes_nothing():
    pool = asymo.Pool(topology=f"c0:{CPUS[0]}-{CPUS[1]}@1" if CPUS[1] == CPUS[0] + 1
                      else f"c0:{CPUS[0]},{CPUS[1]}@1")
    try:
        before = os.sched_getaffinity(0)
        with caller_on_fastest(pool):
            assert os.sched_getaffinity(0) == before
    finally:
        pool.close()


def test_model_inference_restores_the_callers_affinity(two_clusters):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(8, 4)).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    model = asymo.from_torch(net, torch.from_numpy(x))
    before = os.sched_getaffinity(0)
    y = model(x, pool=two_clusters)
    assert os.sched_getaffinity(0) == before
    with torch.no_grad():
        np.testing.assert_allclose(y, net(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)
