"""Online tuning driven by measured stage times.

- Pipe-search (paper 002, Soomro et al.): layer weights (computational hints, Eq. 1-2 of that
  paper: FLOPs) rank every layer distribution of each stage count by the coefficient of
  variation of the per-stage weights (Eq. 3, Algorithm 1 "Generate Configurations"); the online
  search (Algorithm 2) executes configurations in that order, first around the seed of every
  stage count, then in the stage count of the best configuration, and stops after ``alpha``
  consecutive trials without a new minimum of the slowest-stage time.
- Dynamic two-stage re-partitioning under load (paper 004, Algorithm 2): from the current split
  ``n``, move the split point up (then down) while the measured pipeline period stays at or
  below the reference, smoothing each split point's measurements with a recursive moving
  average.

Both take a ``measure``/``execute`` callable, so they run against the real pipeline runtime
(``Pipeline.measure``) or against simulated measurements in tests.
"""
from __future__ import annotations

import itertools
from math import comb
from typing import NamedTuple

import numpy as np

__all__ = ["layer_distributions", "coefficient_of_variation", "generate_configurations",
           "pipe_search", "PipeSearchResult", "DynamicTwoStage", "dynamic_two_stage",
           "compositions_to_ranges"]


# --- Pipe-search: Algorithm 1 -----------------------------------------------------------------

def layer_distributions(M, p):
    """All ways to give ``M`` layers (in order) to ``p`` non-empty stages, as layer counts.

    These are the compositions of ``M`` into ``p`` parts (Eq. 4: the combinations of ``p``
    stage sizes summing to ``M``, then their permutations); there are ``C(M-1, p-1)``.
    """
    for cuts in itertools.combinations(range(1, M), p - 1):
        bounds = (0,) + cuts + (M,)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(p))


def coefficient_of_variation(stage_weights):
    """Eq. 3: ``sigma(W) / mu(W)`` of the per-stage weights (population standard deviation)."""
    w = np.asarray(stage_weights, dtype=np.float64)
    mu = w.mean()
    if mu == 0:
        return 0.0
    return float(w.std() / mu)


def compositions_to_ranges(counts):
    """``[7, 4, 10]`` -> ``[(0, 7), (7, 11), (11, 21)]``."""
    out, a = [], 0
    for c in counts:
        out.append((a, a + int(c)))
        a += int(c)
    return out


def _stage_weights(prefix, counts):
    out, a = [], 0
    for c in counts:
        out.append(prefix[a + c] - prefix[a])
        a += c
    return out


def _near_balanced(prefix, M, p, budget):
    """Distributions whose cuts lie near the weight quantiles: used instead of the full
    enumeration when ``C(M-1, p-1)`` exceeds ``budget`` (the low-CV end of the ranking is all
    Pipe-search ever visits)."""
    total = prefix[-1]
    ideal = [int(np.searchsorted(prefix, total * j / p)) for j in range(1, p)]
    r = 1
    while (2 * r + 3) ** (p - 1) <= budget and r < M:
        r += 1
    windows = [range(max(1, c - r), min(M - 1, c + r) + 1) for c in ideal]
    for cuts in itertools.product(*windows):
        if all(cuts[i] < cuts[i + 1] for i in range(len(cuts) - 1)):
            bounds = (0,) + cuts + (M,)
            yield tuple(bounds[i + 1] - bounds[i] for i in range(p))


def generate_configurations(weights, C, *, k=None, budget=200_000):
    """Algorithm 1 of paper 002: the search space ``S``, ranked by CV per stage count.

    Parameters
    ----------
    weights : sequence of float
        Per-layer weights ``L = {LW_1..LW_M}`` (computational hints, e.g. FLOPs).
    C : int
        Maximum number of stages (usually the number of cores).
    k : int, optional
        Keep the first ``k`` configurations of each stage count ("add first k samples").
    budget : int
        Above this many distributions for one stage count, only those near the balanced cut
        points are generated and ranked.

    Returns
    -------
    dict ``p -> list of (counts, cv)``, sorted by increasing CV (ties: lexicographic), for
    ``p`` in ``2..min(C, M)``. ``S[p][0]`` is the seed of stage count ``p``.
    """
    w = np.asarray(weights, dtype=np.float64)
    M = w.shape[0]
    if w.ndim != 1 or M < 2:
        raise ValueError("weights must be a 1-D sequence of at least 2 layer weights")
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("layer weights must be finite and non-negative")
    if int(C) < 2:
        raise ValueError(f"C (maximum stage count) must be >= 2, got {C}")
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    S = {}
    for p in range(2, min(int(C), M) + 1):
        gen = (layer_distributions(M, p) if comb(M - 1, p - 1) <= budget
               else _near_balanced(prefix, M, p, budget))
        ranked = sorted(((c, coefficient_of_variation(_stage_weights(prefix, c))) for c in gen),
                        key=lambda x: (round(x[1], 12), x[0]))
        S[p] = ranked[:k] if k else ranked
    return S


# --- Pipe-search: Algorithm 2 -----------------------------------------------------------------

class PipeSearchResult(NamedTuple):
    best: tuple          # layer counts per stage of S_min
    best_time: float     # T_s of S_min (slowest stage, s)
    trials: list         # (counts, T_s) in the order executed (each configuration once)
    rank: int            # position of S_min in its stage count's CV ranking (1-based)


def pipe_search(S, C, alpha, execute):
    """Algorithm 2 of paper 002 (Pipe-search).

    Parameters
    ----------
    S : dict from ``generate_configurations``
    C : int
        Maximum stage count.
    alpha : int
        Patience: consecutive configurations without a new minimum before moving on.
    execute : callable
        ``execute(counts) -> sequence of stage times`` (seconds): runs the network with that
        layer distribution and returns the measured time of every stage. A configuration is
        executed once; repeated visits reuse its measurement.

    Returns
    -------
    PipeSearchResult
    """
    alpha = int(alpha)
    if alpha < 1:
        raise ValueError(f"alpha must be >= 1, got {alpha}")
    counts_range = [p for p in range(2, int(C) + 1) if S.get(p)]
    if not counts_range:
        raise ValueError("S holds no configurations for stage counts 2..C")
    cache, trials = {}, []

    def Ts(cfg):
        if cfg not in cache:
            t = execute(cfg)
            t = float(np.max(np.asarray(t, dtype=np.float64)))
            if not np.isfinite(t) or t < 0:
                raise ValueError(f"execute({cfg}) returned an invalid stage time {t}")
            cache[cfg] = t
            trials.append((cfg, t))
        return cache[cfg]

    # line 1: S_min = the seed that yields the minimum slowest-stage time among all seeds
    smin = min((S[p][0][0] for p in counts_range), key=lambda c: (Ts(c), len(c)))
    visited = {}
    for p in counts_range:                     # lines 2-16: around every seed
        c, gamma = 0, 0
        while gamma < alpha and c < len(S[p]):
            cfg = S[p][c][0]
            if Ts(cfg) > Ts(smin):
                gamma += 1
            else:
                smin, gamma = cfg, 0           # found a new minimum
            visited[p] = c
            c += 1
    p = len(smin)                              # lines 17-30: in S_min's stage count
    c = visited.get(p, 0)
    gamma = 0
    while gamma < alpha and c < len(S[p]):
        cfg = S[p][c][0]
        if Ts(cfg) > Ts(smin):
            gamma += 1
        else:
            smin, gamma = cfg, 0
        c += 1
    rank = next(i for i, (cfg, _) in enumerate(S[len(smin)]) if cfg == smin) + 1
    return PipeSearchResult(smin, cache[smin], trials, rank)


# --- paper 004 Algorithm 2 --------------------------------------------------------------------

class DynamicTwoStage:
    """Dynamic two-stage re-partitioning (paper 004, Algorithm 2).

    Parameters
    ----------
    N : int
        Number of layers; the split ``n`` puts layers ``[0, n)`` on ``h0`` and ``[n, N)`` on
        ``h1`` (``0 <= n <= N``).
    alpha : float in (0, 1]
        Weight of a new measurement in the recursive moving average
        ``m[i] <- (1 - alpha) m[i] + alpha * measure`` that smooths transients (the text's
        "recursive moving averaging filter ... depending on parameter alpha"; the printed
        ``m[i] + alpha * measure`` is that filter's update written without the decay). A split
        point never measured before takes its first measurement as is. ``alpha = 1`` is the
        unfiltered rule.

    ``m`` (the smoothed period per split point) persists across calls of ``step``.
    """

    def __init__(self, N, alpha=0.5):
        if int(N) < 1:
            raise ValueError(f"N must be >= 1, got {N}")
        if not (0 < float(alpha) <= 1):
            raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
        self.N = int(N)
        self.alpha = float(alpha)
        self.m = {}
        self.history = []

    def _update(self, i, value):
        value = float(value)
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"measure({i}) returned an invalid period {value}")
        self.history.append((i, value))
        old = self.m.get(i)
        self.m[i] = value if old is None else (1 - self.alpha) * old + self.alpha * value
        return self.m[i]

    def step(self, n, t, measure):
        """One run of Algorithm 2 from split ``n`` with reference period ``t``.

        ``measure(i)`` runs the pipeline with split ``i`` and returns its period (s/image).
        Returns ``(n_hat, t_hat)``.
        """
        n = int(n)
        if not 0 <= n <= self.N:
            raise ValueError(f"split n={n} outside [0, {self.N}]")
        t_hat = float(t)
        n_hat = n
        for i in range(n, self.N + 1):        # increase n until finding the minimum
            if self._update(i, measure(i)) <= t_hat:
                n_hat = i                     # new optimal found
            else:
                break
        if n_hat == n:                        # no better solution: decrease n
            for i in range(n - 1, -1, -1):
                if self._update(i, measure(i)) <= t_hat:
                    n_hat = i
                else:
                    break
        t_hat = self.m[n_hat]
        return n_hat, t_hat


def dynamic_two_stage(n, t, N, measure, *, alpha=0.5, m=None):
    """Functional form of paper 004 Algorithm 2: returns ``(n_hat, t_hat, m)``."""
    d = DynamicTwoStage(N, alpha)
    if m:
        d.m.update(m)
    n_hat, t_hat = d.step(n, t, measure)
    return n_hat, t_hat, dict(d.m)


# --- on the runtime ---------------------------------------------------------------------------

def stage_groups(topology, p):
    """Cores for a ``p``-stage pipeline: stages spread over the clusters in proportion to each
    cluster's compute (capacity x cores), at least one per cluster while ``p`` allows, each
    cluster's cores split as evenly as possible; stages ordered fastest cluster first."""
    clusters = topology.clusters
    if not 1 <= p <= topology.ncpus:
        raise ValueError(f"p must lie in [1, {topology.ncpus}], got {p}")
    power = np.array([c.capacity * c.ncpus for c in clusters])
    alloc = [0] * len(clusters)
    for _ in range(p):  # give the next stage to the cluster with the most compute per stage
        room = [i for i, c in enumerate(clusters) if alloc[i] < c.ncpus]
        i = max(room, key=lambda k: (power[k] / (alloc[k] + 1), -k) if alloc[k] else
                (float("inf"), -k))
        alloc[i] += 1
    groups = []
    for c, n in zip(clusters, alloc):
        if n == 0:
            continue
        sizes = [c.ncpus // n + (1 if j < c.ncpus % n else 0) for j in range(n)]
        a = 0
        for s in sizes:
            groups.append(tuple(c.cpus[a:a + s]))
            a += s
    return groups


def pipe_search_runtime(model, frames, *, topology=None, weights=None, alpha=3, C=None,
                        timeout=60.0, **pipeline_kw):
    """Pipe-search on the real runtime: every configuration is executed on a ``Pipeline``
    (one per stage count, cores from ``stage_groups``) and ranked by its measured slowest
    stage. ``weights`` default to the layers' FLOPs (the paper's computational hints).

    Returns ``(PipeSearchResult, stage cpus of the best configuration)``.
    """
    from asymo.pipeline.runtime import Pipeline
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    W = len(model.layers)
    if weights is None:
        weights = [max(float(getattr(l, "flops", 1.0)), 1.0) for l in model.layers]
    C = min(int(C or topology.ncpus), topology.ncpus, W)
    S = generate_configurations(weights, C)
    pipes = {}

    def execute(counts):
        p = len(counts)
        if p not in pipes:
            groups = stage_groups(topology, p)
            ranges = [(a, b - 1) for a, b in compositions_to_ranges(counts)]
            pipes[p] = Pipeline(model, list(zip(groups, ranges)), topology=topology,
                                timeout=timeout, **pipeline_kw)
        ranges = [(a, b - 1) for a, b in compositions_to_ranges(counts)]
        return pipes[p].measure(frames, ranges)

    try:
        res = pipe_search(S, C, alpha, execute)
    finally:
        for pl in pipes.values():
            pl.close()
    return res, stage_groups(topology, len(res.best))
