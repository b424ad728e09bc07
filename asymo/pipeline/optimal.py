"""Exact optimal contiguous partition of a layer chain over a given stage configuration.

For stages ``P_1..P_p`` (in pipeline order) and the time matrix, dynamic programming over
``F[i][j]`` = best objective of the first ``i`` stages holding layers ``[0, j)`` gives the
partition that minimises the bottleneck (throughput, ``combine="max"``) or the sum of stage
times or energies (latency / energy, ``combine="sum"``) in O(p W^2). It is the yardstick the
heuristics (Pipe-it's Algorithms 1-3) are measured against, and ``optimal_pipeline`` applies it
to every stage configuration of Pipe-it's design space (Eq. 1) to find the global optimum of
that space.

Stage cost of layers ``[a, b)`` on ``P_i``: the sum of the layer times, plus the transfer cost
of paper 004 (``k_i * B``) for the activation it receives (``B = out_bytes[a-1]``, if ``a > 0``)
and the one it sends (``out_bytes[b-1]``, if ``b < W``). An empty stage costs nothing (its
cores stay idle) unless ``allow_empty=False``.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from asymo.pipeline.configs import CoreConfig

__all__ = ["StageCost", "optimal_partition", "stage_configurations", "optimal_pipeline",
           "OptimalResult"]


class StageCost:
    """Cost of a contiguous layer range on a core configuration, O(1) by prefix sums.

    Parameters
    ----------
    table : LayerTimes
    transfer_k : mapping CoreConfig -> seconds per byte, or float, optional
        ``k`` of paper 004's ``t_transfer = k * B`` (default 0: no transfer cost).
    weight : mapping CoreConfig -> float, optional
        Multiplies the stage time, e.g. active power in W to get energy per image in J.
    """

    def __init__(self, table, transfer_k=None, weight=None):
        self.table = table
        self.W = table.nlayers
        self._prefix = {}
        self.transfer_k = transfer_k
        self.weight = weight
        self.B = table.out_bytes

    def _k(self, config):
        k = self.transfer_k
        if k is None:
            return 0.0
        if isinstance(k, (int, float)):
            return float(k)
        return float(k.get(config, 0.0))

    def _w(self, config):
        if self.weight is None:
            return 1.0
        return float(self.weight[config])

    def prefix(self, config):
        p = self._prefix.get(config)
        if p is None:
            p = np.concatenate(([0.0], np.cumsum(self.table.T(config))))
            self._prefix[config] = p
        return p

    def __call__(self, config, a, b):
        if b <= a:
            return 0.0
        p = self.prefix(config)
        t = p[b] - p[a]
        k = self._k(config)
        if k:
            if a > 0:
                t += k * self.B[a - 1]
            if b < self.W:
                t += k * self.B[b - 1]
        return float(t) * self._w(config)


def optimal_partition(stages, table, *, combine="max", allow_empty=True, cost=None):
    """Best contiguous allocation of all layers to ``stages`` (in order).

    Parameters
    ----------
    stages : sequence of CoreConfig
    table : LayerTimes
    combine : {"max", "sum"}
        ``"max"``: minimise the slowest stage (maximum throughput, Pipe-it Eq. 11, paper 004
        Eq. 3); ``"sum"``: minimise the total (latency Eq. 5, or energy Eq. 4 with a power
        weight in ``cost``).
    allow_empty : bool
        Whether a stage may receive no layers.
    cost : StageCost, optional
        Defaults to ``StageCost(table)`` (no transfer cost).

    Returns
    -------
    (value, L): the optimal objective and one range ``(start, stop)`` per stage; ties are
    broken towards giving earlier stages more layers, deterministically.
    """
    stages = list(stages)
    if not stages:
        raise ValueError("stages is empty")
    if combine not in ("max", "sum"):
        raise ValueError(f"combine must be 'max' or 'sum', got {combine!r}")
    W = table.nlayers
    p = len(stages)
    if not allow_empty and p > W:
        raise ValueError(f"{p} non-empty stages cannot hold {W} layers")
    cost = cost or StageCost(table)
    op = max if combine == "max" else (lambda x, y: x + y)
    inf = float("inf")
    F = [[inf] * (W + 1) for _ in range(p + 1)]
    arg = [[-1] * (W + 1) for _ in range(p + 1)]
    F[0][0] = 0.0
    for i in range(1, p + 1):
        cfg = stages[i - 1]
        for j in range(W + 1):
            best, best_k = inf, -1
            kmax = j if allow_empty else j - 1
            # scan k downwards so that, on ties, the earlier stage keeps more layers
            for k in range(kmax, -1, -1):
                prev = F[i - 1][k]
                if prev == inf:
                    continue
                v = op(prev, cost(cfg, k, j))
                if v < best - 1e-15 * max(1.0, abs(best)) or best_k < 0:
                    best, best_k = v, k
            F[i][j], arg[i][j] = best, best_k
    if F[p][W] == inf:
        raise ValueError("no feasible partition")
    L = [None] * p
    j = W
    for i in range(p, 0, -1):
        k = arg[i][j]
        L[i - 1] = (k, j)
        j = k
    return F[p][W], L


def _compositions(n):
    """All ordered ways to write n as a sum of positive ints."""
    if n == 0:
        yield ()
        return
    for first in range(n, 0, -1):
        for rest in _compositions(n - first):
            yield (first,) + rest


def stage_configurations(cluster_sizes, *, orders="fastest-first", use_all_cores=True):
    """Every stage configuration of Pipe-it's design space (Eq. 1 counts them).

    Each cluster's cores are cut into consecutive stages (a composition of ``H_c``), clusters
    in pipeline order fastest first (``orders="all"``: every order of the clusters). With
    ``use_all_cores=False`` a cluster may also use fewer cores or be left out.
    """
    sizes = [int(h) for h in cluster_sizes]
    if orders not in ("fastest-first", "all"):
        raise ValueError(f"orders must be 'fastest-first' or 'all', got {orders!r}")
    per_cluster = []
    for c, h in enumerate(sizes):
        totals = [h] if use_all_cores else range(h, -1, -1)
        opts = [tuple(CoreConfig(c, n) for n in comp)
                for tot in totals for comp in _compositions(tot)]
        per_cluster.append(opts)
    cluster_orders = ([tuple(range(len(sizes)))] if orders == "fastest-first"
                      else list(itertools.permutations(range(len(sizes)))))
    seen = set()
    for order in cluster_orders:
        for combo in itertools.product(*(per_cluster[c] for c in order)):
            stages = tuple(s for part in combo for s in part)
            if stages and stages not in seen:
                seen.add(stages)
                yield stages


class OptimalResult(NamedTuple):
    value: float
    P: tuple
    L: list
    evaluated: int


def optimal_pipeline(table, cluster_sizes, *, combine="max", cost=None,
                     orders="fastest-first", max_configurations=200_000):
    """Global optimum over all stage configurations (each solved exactly by DP).

    Empty stages are allowed, so configurations that leave cores idle are covered too.
    Raises ValueError if the space holds more than ``max_configurations`` configurations
    (use ``merge_stage`` there).
    """
    best = None
    n = 0
    cost = cost or StageCost(table)
    for stages in stage_configurations(cluster_sizes, orders=orders):
        n += 1
        if n > max_configurations:
            raise ValueError(f"more than {max_configurations} stage configurations; use the "
                             "Pipe-it heuristic (merge_stage) on a machine this large")
        v, L = optimal_partition(stages, table, combine=combine, cost=cost)
        if best is None or v < best[0] - 1e-15 * max(1.0, abs(best[0])):
            best = (v, stages, L)
    return OptimalResult(best[0], best[1], best[2], n)
