"""Core configurations: the (cluster, core count) a pipeline stage runs on.

Pipe-it (paper 000, Table II) writes a stage as ``P_i = (type, count)``, e.g. ``(B, 3)`` or
``B3``: ``count`` cores of one cluster, never cores of two clusters (kernel-level splitting
across clusters is what the pipeline avoids). Clusters are indexed as in
``asymo.hw.topology.Topology`` (fastest first), so any number of clusters is supported, not just
big and little.

A *stage configuration* of a whole pipeline is a tuple of ``CoreConfig`` whose core counts per
cluster do not exceed the cluster's size; ``stage_cpus`` turns it into concrete cpu ids
(consecutive cpus of each cluster, in stage order).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CoreConfig", "core_configs", "stage_cpus", "validate_stages", "format_stages",
           "cluster_label"]


@dataclass(frozen=True, order=True)
class CoreConfig:
    """``count`` cores of cluster ``cluster`` (0 = fastest)."""

    cluster: int
    count: int

    def __post_init__(self):
        if not isinstance(self.cluster, int) or self.cluster < 0:
            raise ValueError(f"cluster must be a non-negative int, got {self.cluster!r}")
        if not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"core count must be a positive int, got {self.count!r}")

    def label(self, topology=None):
        """Pipe-it's notation: ``B3`` style, with the cluster's name when a topology is given
        (``name x count`` when the name ends in a digit)."""
        name = cluster_label(self.cluster, topology)
        return f"{name}x{self.count}" if name[-1:].isdigit() else f"{name}{self.count}"

    def to_list(self):
        return [self.cluster, self.count]

    @classmethod
    def from_list(cls, item):
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise ValueError(f"a core configuration is [cluster, count], got {item!r}")
        return cls(int(item[0]), int(item[1]))


def cluster_label(cluster, topology=None):
    if topology is not None and cluster < topology.nclusters:
        return topology.clusters[cluster].name
    return f"c{cluster}"


def core_configs(topology):
    """All homogeneous core configurations of a topology: ``sum_c H_c`` of them.

    Ordered cluster by cluster (fastest first), larger counts first within a cluster, which is
    Pipe-it's Eq. 10 order of decreasing compute capability inside a cluster.
    """
    out = []
    for ci, cl in enumerate(topology.clusters):
        for n in range(cl.ncpus, 0, -1):
            out.append(CoreConfig(ci, n))
    return out


def validate_stages(stages, topology):
    """Raise ValueError unless ``stages`` fit on ``topology`` (no core used twice)."""
    stages = tuple(stages)
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    used = [0] * topology.nclusters
    for s in stages:
        if not isinstance(s, CoreConfig):
            raise TypeError(f"stages must be CoreConfig, got {type(s).__name__}")
        if s.cluster >= topology.nclusters:
            raise ValueError(f"stage {s} names cluster {s.cluster}, but the topology has "
                             f"{topology.nclusters} cluster(s)")
        used[s.cluster] += s.count
    for ci, n in enumerate(used):
        if n > topology.clusters[ci].ncpus:
            raise ValueError(f"stages use {n} cores of cluster "
                             f"{topology.clusters[ci].name!r}, which has "
                             f"{topology.clusters[ci].ncpus}")
    return stages


def stage_cpus(stages, topology):
    """Concrete cpu ids per stage: each stage takes the next unused cpus of its cluster."""
    stages = validate_stages(stages, topology)
    nxt = [0] * topology.nclusters
    out = []
    for s in stages:
        cpus = topology.clusters[s.cluster].cpus[nxt[s.cluster]:nxt[s.cluster] + s.count]
        nxt[s.cluster] += s.count
        out.append(tuple(cpus))
    return out


def format_stages(stages, topology=None):
    """``B4-s2-s2`` style string (cluster names from the topology when given)."""
    return "-".join(s.label(topology) for s in stages)
