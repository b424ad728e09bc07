"""Splitting a count over clusters in proportion to weights: the largest-remainder rule.

The pool (:meth:`asymo.Pool.split_counts`), the GEMM planner (:mod:`asymo.plan.gemm`) and the
simulator of the pool (``asymo.lab.sim``) all split tasks or blocks this one way, so that a
plan, the pool's default split and the simulated split agree to the task.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

__all__ = ["largest_remainder"]


def largest_remainder(n, weights):
    """Integer counts summing to ``n``, proportional to ``weights`` (ties: earlier first).

    Each entry gets the floor of its exact share ``n * w / sum(weights)``; the units left over
    go to the largest remainders, the earlier (faster) cluster first on a tie. Exact rational
    arithmetic: the counts never depend on float rounding.

    Parameters
    ----------
    n : int
        The count to split (>= 0).
    weights : sequence of float
        One finite weight >= 0 per part, at least one of them positive.

    Returns
    -------
    list of int
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an integer, got {type(n).__name__}")
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    weights = list(weights)
    if not weights or any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"split ratio {weights} must be finite numbers >= 0, at least one")
    exact_w = [Fraction(w) for w in weights]
    total = sum(exact_w)
    if total <= 0:
        raise ValueError(f"split ratio {weights} has no positive entry")
    exact = [n * w / total for w in exact_w]
    counts = [math.floor(x) for x in exact]
    short = n - sum(counts)  # 0 <= short < len(weights)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:short]:
        counts[i] += 1
    return counts
