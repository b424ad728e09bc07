"""Pools for the tests of jobs built from other jobs (test_siblings.py, test_flows.py)."""
import os
import warnings

from asymo.hw.topology import Cluster, Topology
from asymo.runtime.pool import Pool

CPUS = sorted(os.sched_getaffinity(0))


def make_pool(topology):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # unpinned workers on small machines
        return Pool(topology)


def topologies():
    """One worker; two in one cluster; big and little; two per cluster (four workers, two
    unpinned on a 2-cpu machine)."""
    a, b = CPUS[0], CPUS[-1]
    return [Topology(clusters=(Cluster("c0", (a,)),)),
            Topology(clusters=(Cluster("c0", (a, b)),)),
            Topology(clusters=(Cluster("big", (a,)), Cluster("little", (b,), capacity=0.5))),
            Topology(clusters=(Cluster("big", (a, b)), Cluster("little", (a + 1000, b + 1000),
                                                                capacity=0.5)))]
