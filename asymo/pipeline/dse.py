"""Pipe-it's design-space exploration (paper 000, Sections IV and VI).

- ``pipeline_count`` / ``design_points``: Eq. 1 and Eq. 2, the size of the layer-level design
  space, generalised from two clusters to any number (each cluster contributes at least one
  stage; with two clusters the sum is exactly Eq. 1).
- ``find_split`` (Algorithm 1), ``work_flow`` (Algorithm 2), ``merge_stage`` (Algorithm 3),
  implemented as published. Layer sets are contiguous, kept as half-open ranges
  ``(start, stop)`` of layer indices (``start == stop`` is the empty set).

Two points the pseudo-code leaves open are settled here and documented:

1. Algorithm 1 walks ``L_wl`` from its *last* layer (the text: "starting with the last layer
   allocated to P_i (layer l_b)").
2. Algorithm 3 "for (P_i, P_{i+1}) in P": after a successful merge the merged stage is tried
   again with its new neighbour (the worked example: "goes on merging P1 and P2 to create (B,3)
   and beyond"); when Eq. 12 fails, ``on_reject="advance"`` (default) stops growing *that*
   stage and moves on to the next pair of the cluster -- the text's reading ("no further
   merging of the involved stages ... will be helpful") and the only one that can produce the
   paper's own results B2-B2-s3-s1 and B4-s2-s2 (Tables V, VI). ``on_reject="break"`` is the
   literal ``break`` that ends the cluster's loop.
3. Algorithm 2 loops "while L != L_old". A cycle of allocations would loop forever; if a state
   repeats, the loop stops at the best (highest throughput) state of the cycle.
"""
from __future__ import annotations

from math import comb
from typing import NamedTuple

import numpy as np

from asymo.pipeline.configs import CoreConfig

__all__ = ["pipeline_count", "design_points", "find_split", "work_flow", "merge_stage",
           "bottleneck", "throughput", "DSEResult"]


# --- Eq. 1 and Eq. 2 ------------------------------------------------------------------------

def _compositions_count(cores, p):
    """Ways to cut ``cores`` ordered cores into ``p`` non-empty stages: C(H-1, p-1)."""
    if p < 1 or p > cores:
        return 0
    return comb(cores - 1, p - 1)


def pipeline_count(p, cluster_sizes):
    """Eq. 1: number of pipeline configurations ``C_p`` with ``p`` stages.

    Parameters
    ----------
    p : int
        Number of stages.
    cluster_sizes : sequence of int
        Cores per cluster, fastest first (``(H_B, H_s)`` in the paper). Every cluster holds at
        least one stage and stages are ordered cluster by cluster, as in Pipe-it.

    With two clusters this is ``sum_{p_B=max(1,p-H_s)}^{min(H_B,p-1)} C(H_B-1,p_B-1) *
    C(H_s-1,p-p_B-1)``.
    """
    sizes = [int(h) for h in cluster_sizes]
    if not sizes or any(h < 1 for h in sizes):
        raise ValueError(f"cluster sizes must be positive, got {cluster_sizes!r}")
    # ways[q] = configurations of the clusters seen so far with q stages in total
    ways = {0: 1}
    for h in sizes:
        nxt = {}
        for q, w in ways.items():
            for pc in range(1, h + 1):
                nxt[q + pc] = nxt.get(q + pc, 0) + w * _compositions_count(h, pc)
        ways = nxt
    return ways.get(int(p), 0)


def design_points(W, cluster_sizes):
    """Eq. 2: number of layer-level design points ``D_W`` for ``W`` major layers.

    ``D_W = sum_{p=2}^{H} C(W-1, p-1) * C_p`` (every stage gets at least one layer), as
    printed. Note: the paper quotes 5,379,616 points for MobileNet (W = 28) on 4+4 cores; Eq. 2
    as printed gives 4,272,048 for W = 28 and 5,379,616 for W = 29, i.e. the quoted figure
    counts ``C(W, p-1)`` placements (one more split position than layers minus one).
    """
    W = int(W)
    if W < 1:
        raise ValueError(f"W must be >= 1, got {W}")
    H = sum(int(h) for h in cluster_sizes)
    return sum(comb(W - 1, p - 1) * pipeline_count(p, cluster_sizes) for p in range(2, H + 1))


# --- objective ------------------------------------------------------------------------------

def _stage_times(P, L, table):
    return [table.stage_time(P[i], *L[i]) for i in range(len(P))]


def bottleneck(P, L, table):
    """Slowest stage time, max_i T^{P_i}_{L_i} (the denominator of Eq. 11)."""
    return max(_stage_times(P, L, table))


def throughput(P, L, table):
    """Eq. 11: images per second of pipeline ``P`` with allocation ``L``."""
    b = bottleneck(P, L, table)
    return float("inf") if b == 0 else 1.0 / b


# --- Algorithm 1 ----------------------------------------------------------------------------

def find_split(lwl, t_i, t_next):
    """Algorithm 1: split the layers ``lwl = (a, b)`` between adjacent stages P_i, P_{i+1}.

    Parameters
    ----------
    lwl : (int, int)
        Half-open layer range ``[a, b)``.
    t_i, t_next : array_like
        ``T^{P_i}`` and ``T^{P_{i+1}}``, per-layer times of the whole chain.

    Returns
    -------
    (L_i, L_{i+1}) : two half-open ranges; all of ``lwl`` starts in ``L_i`` and layers move to
    ``L_{i+1}`` from the end while the move leaves ``P_i`` slower than ``P_{i+1}``.
    """
    a, b = lwl
    t_i = np.asarray(t_i, dtype=np.float64)
    t_next = np.asarray(t_next, dtype=np.float64)
    T_i = float(t_i[a:b].sum())   # T^{P_i}_{L_i}, L_i = L_wl
    T_n = 0.0                     # T^{P_{i+1}}_{L_{i+1}}, L_{i+1} = {}
    split = b                     # L_i = [a, split), L_{i+1} = [split, b)
    for j in range(b - 1, a - 1, -1):
        new_i = T_i - t_i[j]
        new_n = T_n + t_next[j]
        if new_i > new_n:         # move of l_j is helpful
            T_i, T_n, split = new_i, new_n, j
        else:                     # further flow of workload will not be helpful
            break
    return (a, split), (split, b)


# --- Algorithm 2 ----------------------------------------------------------------------------

def work_flow(P, lwl, table, *, max_rounds=10_000):
    """Algorithm 2: allocate layers ``lwl`` over the stages ``P`` (fastest first).

    Parameters
    ----------
    P : sequence of CoreConfig
    lwl : (int, int)
        Half-open range of the layers to allocate (normally ``(0, W)``).
    table : LayerTimes

    Returns
    -------
    list of (start, stop): ``L``, one range per stage; all layers start on P_1 and flow like
    water towards deeper stages until no call of ``find_split`` changes the allocation.
    """
    P = list(P)
    p = len(P)
    a, b = lwl
    L = [(a, b)] + [(b, b)] * (p - 1)
    T = [table.T(c) for c in P]
    seen = {}
    history = []
    L_old = None
    rounds = 0
    while L != L_old:
        key = tuple(L)
        if key in seen:  # a cycle: stop at the best state in it
            cycle = history[seen[key]:]
            return list(min(cycle, key=lambda s: (bottleneck(P, s, table), s)))
        seen[key] = len(history)
        history.append(key)
        L_old = list(L)
        for i in range(p - 1):
            ltemp = (L[i][0], L[i + 1][1])  # L_i U L_{i+1} (adjacent ranges)
            L[i], L[i + 1] = find_split(ltemp, T[i], T[i + 1])
        rounds += 1
        if rounds > max_rounds:  # pragma: no cover - defensive
            break
    return L


# --- Algorithm 3 ----------------------------------------------------------------------------

class DSEResult(NamedTuple):
    """Pipeline configuration ``P`` and allocation ``L`` (half-open ranges), with the trace
    of merge decisions ``(cluster, i, merged_config, accepted)``."""

    P: list
    L: list
    trace: list


def merge_stage(lwl, cluster_sizes, table, *, on_reject="advance"):
    """Algorithm 3: determine the stage configuration and its workload allocation.

    Parameters
    ----------
    lwl : (int, int)
        Layers to allocate, half-open.
    cluster_sizes : sequence of int
        Cores per cluster, fastest first (``H_B, H_s`` and further clusters if any).
    table : LayerTimes
        Must hold ``CoreConfig(c, n)`` for every cluster ``c`` and ``1 <= n <= H_c``.
    on_reject : {"advance", "break"}
        What a failed Eq. 12 test does (see module docstring).

    Returns
    -------
    DSEResult(P, L, trace). Stages with an empty allocation are kept (Pipe-it's ``L_i = {}``);
    the planner drops them.
    """
    if on_reject not in ("advance", "break"):
        raise ValueError(f"on_reject must be 'advance' or 'break', got {on_reject!r}")
    sizes = [int(h) for h in cluster_sizes]
    for c, h in enumerate(sizes):
        for n in range(1, h + 1):
            if not table.has(CoreConfig(c, n)):
                raise KeyError(f"the time table lacks core configuration {CoreConfig(c, n)}")
    P = [CoreConfig(c, 1) for c, h in enumerate(sizes) for _ in range(h)]
    L = work_flow(P, lwl, table)
    trace = []
    for cluster in range(len(sizes)):  # LOOP: Big cluster, then Small, then any further
        i = next(k for k, s in enumerate(P) if s.cluster == cluster)
        while i + 1 < len(P) and P[i + 1].cluster == cluster:
            merged = CoreConfig(cluster, P[i].count + P[i + 1].count)
            # Eq. 12: T^{P'}_{L_i} + T^{P'}_{L_{i+1}} < max(T^{P_i}_{L_i}, T^{P_{i+1}}_{L_{i+1}})
            lhs = table.stage_time(merged, *L[i]) + table.stage_time(merged, *L[i + 1])
            rhs = max(table.stage_time(P[i], *L[i]), table.stage_time(P[i + 1], *L[i + 1]))
            ok = lhs < rhs
            trace.append((cluster, i, merged, ok))
            if ok:
                P = P[:i] + [merged] + P[i + 2:]
                L = work_flow(P, lwl, table)
            elif on_reject == "break":
                break
            else:
                i += 1
    return DSEResult(P, L, trace)
