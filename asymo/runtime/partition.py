"""Splitting work: a count over clusters in proportion to weights (the largest-remainder
rule), and units of work into blocks that share out evenly over workers.

The pool (:meth:`asymo.Pool.split_counts`), the GEMM planner (:mod:`asymo.plan.gemm`) and the
simulator of the pool (``asymo.lab.sim``) all split tasks or blocks by the largest-remainder
rule, so that a plan, the pool's default split and the simulated split agree to the task.
The operators' planners size their tasks with `even_block_size`.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

__all__ = ["largest_remainder", "even_block_size", "split_blocks"]


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


def even_block_size(units, blocks, workers, *, fixed=1, tolerance=0.1):
    """Units per block when cutting ``units`` into at least ``blocks`` blocks, so that the
    job's tasks share out evenly over ``workers``.

    A job ends with its last task. Nine equal tasks on two workers keep one worker busy for
    five of them while the other idles for one: the workers idle a ninth as long as they
    work. The job's tasks are ``fixed`` x (number of blocks); from ``blocks`` blocks up to
    twice as many, this takes the fewest whose tasks leave the workers idle for at most
    ``tolerance`` of the time they work, counting tasks as equal
    (``workers * ceil(tasks / workers) / tasks - 1``), else the most even of them (the fewest
    blocks among equals).

    Parameters
    ----------
    units : int
        Units of work to cut (rows, tiles, channel blocks), >= 1.
    blocks : int
        The fewest blocks wanted (clipped to ``[1, units]``).
    workers : int
        Workers the tasks are shared over (>= 1).
    fixed : int
        Tasks per block: the job's other, already chosen, dimension (>= 1).
    tolerance : float
        Idle time accepted, as a fraction of the work (>= 0).

    Returns
    -------
    int
        Units per block, between 1 and ``ceil(units / blocks)``.
    """
    for name, v in (("units", units), ("blocks", blocks), ("workers", workers),
                    ("fixed", fixed)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
    blocks = min(int(blocks), int(units))
    best = None
    for want in range(blocks, min(2 * blocks, units) + 1):
        per = -(-units // want)
        tasks = fixed * -(-units // per)
        idle = workers * -(-tasks // workers) / tasks - 1
        if best is None or idle < best[0] - 1e-12:
            best = (idle, per)
        if idle <= tolerance:
            break
    return best[1]


def split_blocks(split, other, want, workers, *, tolerance=0.1):
    """Units per block of a job cut along two dimensions: ``split``, the one whose data each
    worker should read only its share of (a layer's weights when they outweigh its image),
    into about ``want`` blocks; ``other`` only as far as the tasks wanted need, and into as
    few blocks as share the tasks out evenly (`even_block_size`).

    Parameters
    ----------
    split, other : int
        Units of the two dimensions (weight panels or groups, image rows or pixels), >= 1.
    want : int
        The tasks the job aims for (>= 1).
    workers : int
        Workers the tasks are shared over (>= 1).
    tolerance : float
        Idle time accepted, as a fraction of the work (`even_block_size`).

    Returns
    -------
    (int, int)
        Units of ``split`` and of ``other`` per block; the job's tasks are
        ``ceil(split / first) * ceil(other / second)``.
    """
    for name, v in (("split", split), ("other", other), ("want", want)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    per = max(1, split // want)
    if other == 1:  # nothing to even the split out with but the split itself
        per = even_block_size(split, -(-split // per), workers, tolerance=tolerance)
    blocks = -(-split // per)
    return per, even_block_size(other, -(-want // blocks), workers, fixed=blocks,
                                tolerance=tolerance)
