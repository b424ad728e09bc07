"""Paper 004 (Velasco-Montero et al.): two-stage partitioning with a transfer cost, the three
objectives, and the Pareto set.

``two_stage_partition`` is Algorithm 1 as published: for each order of the two devices it
sweeps the partition point ``i`` once, keeping running sums (O(N)), and evaluates
``m[i] = max(t_M0 + t_transfer,i^{h0}, t_M1 + t_transfer,i^{h1})`` with partition 0 = layers
``[0, i]`` and partition 1 = ``[i+1, N-1]`` (``i = N-1`` puts everything on the first device).
The transfer cost is ``t_transfer = k * B`` (Sect. III-C), ``B`` the bytes of the activation at
the cut.

Here a "device" is a core configuration (cores of one cluster); any two disjoint core
configurations of any number of clusters can be paired (``best_two_stage``).

Objectives (Eq. 3-5) for a pipeline ``(P, L)``: the bottleneck stage time (throughput is its
inverse), the latency (sum of stage times, Eq. 5/9) and the energy per image (sum of stage
energies, Eq. 4, stage energy = active power x stage time). ``pareto_set`` keeps the candidates
no other candidate beats on all three.
"""
from __future__ import annotations

from itertools import permutations
from typing import NamedTuple

import numpy as np

from asymo.pipeline.optimal import StageCost

__all__ = ["two_stage_partition", "TwoStage", "transfer_costs", "best_two_stage", "Metrics",
           "evaluate", "pareto_set", "candidates", "OBJECTIVES"]

OBJECTIVES = ("throughput", "latency", "energy")


class TwoStage(NamedTuple):
    """Result of Algorithm 1: layers ``[0, n]`` on ``h0``, ``[n+1, N-1]`` on ``h1``."""

    n: int
    t: float
    h0: object
    h1: object


def two_stage_partition(t_h0, t_h1, transfer_h0=None, transfer_h1=None, devices=(0, 1)):
    """Algorithm 1 of paper 004: optimal two-stage split, both device orders, O(N).

    Parameters
    ----------
    t_h0, t_h1 : array_like, shape (N,)
        Per-layer runtimes ``{t_l}^{h0}``, ``{t_l}^{h1}``.
    transfer_h0, transfer_h1 : array_like, shape (N,), optional
        ``{t_transfer,l}^{h}``: the transfer cost device ``h`` pays when the cut is after layer
        ``l`` (zeros when omitted).
    devices : pair
        Labels of the two devices, returned as ``h0``/``h1`` in the optimal order.

    Returns
    -------
    TwoStage(n, t, h0, h1): ``n`` is the last layer index of partition 0, ``t`` the pipeline
    period ``max(t_M0, t_M1)`` of the optimum.
    """
    t = {devices[0]: np.asarray(t_h0, dtype=np.float64),
         devices[1]: np.asarray(t_h1, dtype=np.float64)}
    N = t[devices[0]].shape[0]
    if t[devices[0]].shape != (N,) or t[devices[1]].shape != (N,) or N == 0:
        raise ValueError("t_h0 and t_h1 must be 1-D arrays of the same non-zero length")
    z = np.zeros(N)
    tr = {devices[0]: z if transfer_h0 is None else np.asarray(transfer_h0, dtype=np.float64),
          devices[1]: z if transfer_h1 is None else np.asarray(transfer_h1, dtype=np.float64)}
    for d in devices:
        if tr[d].shape != (N,):
            raise ValueError(f"transfer costs must have shape ({N},)")
    t_hat, n_hat, h0_hat, h1_hat = float("inf"), None, None, None
    for h0, h1 in permutations(devices, 2):
        tM0 = 0.0
        tM1 = float(t[h1].sum())
        m = np.empty(N)
        for i in range(N):
            tM0 += t[h0][i]          # partition 0: [0, i]
            tM1 -= t[h1][i]          # partition 1: [i+1, N-1]
            m[i] = max(tM0 + tr[h0][i], tM1 + tr[h1][i])
        if m.min() < t_hat:
            t_hat = float(m.min())
            n_hat = int(np.argmin(m))
            h0_hat, h1_hat = h0, h1
    return TwoStage(n_hat, t_hat, h0_hat, h1_hat)


def transfer_costs(table, k):
    """``t_transfer,l = k * B_l`` for a cut after layer ``l``; no cut after the last layer."""
    c = float(k) * table.out_bytes.copy()
    c[-1] = 0.0
    return c


def _disjoint(a, b, cluster_sizes):
    if a.cluster != b.cluster:
        return True
    return a.count + b.count <= cluster_sizes[a.cluster]


def best_two_stage(table, cluster_sizes, *, transfer_k=None):
    """Algorithm 1 over every pair of disjoint core configurations in ``table``.

    Returns ``(TwoStage, P, L)`` with ``P`` the two configurations in order and ``L`` their
    half-open ranges.
    """
    best = None
    cfgs = list(table.configs)
    kk = transfer_k or {}
    for x in range(len(cfgs)):
        for y in range(x + 1, len(cfgs)):
            a, b = cfgs[x], cfgs[y]
            if not _disjoint(a, b, cluster_sizes):
                continue
            ka = kk if isinstance(kk, (int, float)) else kk.get(a, 0.0)
            kb = kk if isinstance(kk, (int, float)) else kk.get(b, 0.0)
            r = two_stage_partition(table.T(a), table.T(b), transfer_costs(table, ka),
                                    transfer_costs(table, kb), devices=(a, b))
            if best is None or r.t < best.t:
                best = r
    if best is None:
        raise ValueError("no two disjoint core configurations in the table")
    W = table.nlayers
    return best, (best.h0, best.h1), [(0, best.n + 1), (best.n + 1, W)]


class Metrics(NamedTuple):
    period: float      # slowest stage, s (throughput = 1 / period)
    latency: float     # s per image through all stages
    energy: float      # J per image (or relative units with an estimated power model)

    @property
    def throughput(self):
        return float("inf") if self.period == 0 else 1.0 / self.period


def evaluate(P, L, table, *, power=None, transfer_k=None):
    """Objectives (paper 004 Eq. 3-5) of pipeline ``P`` with allocation ``L``.

    ``power``: mapping CoreConfig -> active power (W) of the stage's cores; energy per image is
    ``sum_i power(P_i) * t_i``. Without it energy is reported as NaN.
    """
    cost = StageCost(table, transfer_k=transfer_k)
    times = [cost(c, a, b) for c, (a, b) in zip(P, L)]
    energy = (float("nan") if power is None
              else float(sum(power[c] * t for c, t in zip(P, times))))
    return Metrics(max(times), float(sum(times)), energy)


def candidates(table, cluster_sizes, *, transfer_k=None):
    """Single-configuration runs and every two-stage split of every disjoint pair, both orders:
    the candidate set paper 004 explores (Sect. IV-B, Fig. 9)."""
    W = table.nlayers
    out = []
    for c in table.configs:
        out.append(((c,), [(0, W)]))
    cfgs = list(table.configs)
    for a in cfgs:
        for b in cfgs:
            if a == b or not _disjoint(a, b, cluster_sizes):
                continue
            for n in range(1, W):
                out.append(((a, b), [(0, n), (n, W)]))
    return out


def pareto_set(points, *, power=None, table=None, transfer_k=None):
    """Non-dominated pipelines on (period, latency, energy), all minimised.

    Parameters
    ----------
    points : list of (P, L) or list of (P, L, Metrics)
        When Metrics are absent they are computed with ``evaluate`` (then ``table`` is needed).

    Returns
    -------
    list of (P, L, Metrics), sorted by period. Energy is ignored when it is NaN.
    """
    evald = []
    for item in points:
        if len(item) == 3:
            evald.append(tuple(item))
        else:
            P, L = item
            evald.append((tuple(P), list(L),
                          evaluate(P, L, table, power=power, transfer_k=transfer_k)))

    def key(m):
        return (m.period, m.latency, 0.0 if np.isnan(m.energy) else m.energy)

    evald.sort(key=lambda x: key(x[2]))
    front = []
    for cand in evald:
        kc = key(cand[2])
        dominated = False
        for f in front:
            kf = key(f[2])
            if all(x <= y for x, y in zip(kf, kc)) and kf != kc:
                dominated = True
                break
            if kf == kc:  # identical objectives: keep the first (fewer stages sort first)
                dominated = True
                break
        if not dominated:
            front.append(cand)
    return front
