"""asymo.runtime.partition.even_block_size: blocks whose tasks share out evenly over workers,
and the planners' task counts that use it."""
import numpy as np
import pytest

import asymo
import asymo.ops.conv as conv
from asymo.runtime.partition import even_block_size, split_blocks


def _tasks(units, per, fixed=1):
    return fixed * -(-units // per)


def _idle(tasks, workers):
    return workers * -(-tasks // workers) / tasks - 1


@pytest.mark.parametrize("units,blocks,workers,fixed", [
    (33, 1, 2, 9), (56, 1, 2, 9), (9, 8, 2, 1), (16, 8, 2, 1), (784, 8, 2, 1), (5, 4, 2, 1),
    (1, 1, 2, 1), (100, 3, 3, 1), (12, 12, 8, 1), (7, 2, 4, 3), (1000, 999, 2, 1),
])
def test_even_block_size_is_the_fewest_even_blocks(units, blocks, workers, fixed):
    per = even_block_size(units, blocks, workers, fixed=fixed)
    b = min(blocks, units)
    assert 1 <= per <= -(-units // b)
    # brute force over the same candidates: the fewest blocks within 10% idle, else the
    # most even (fewest among equals)
    cands = []
    for want in range(b, min(2 * b, units) + 1):
        p = -(-units // want)
        cands.append((_idle(_tasks(units, p, fixed), workers), want, p))
    ok = [c for c in cands if c[0] <= 0.1]
    expect = ok[0][2] if ok else min(cands)[2]
    assert per == expect
    idle = _idle(_tasks(units, per, fixed), workers)
    assert idle <= 0.1 or idle == min(c[0] for c in cands)


@pytest.mark.parametrize("split,other,want,workers", [
    (7, 49, 8, 2), (14, 49, 8, 2), (54, 49, 8, 2), (7, 49, 1, 1), (20, 1, 8, 2),
    (3, 28, 8, 2), (160, 196, 8, 3), (1, 1, 8, 2),
])
def test_split_blocks_cuts_the_split_dimension_first_and_shares_out_evenly(split, other, want,
                                                                           workers):
    per, per_other = split_blocks(split, other, want, workers)
    blocks, other_blocks = -(-split // per), -(-other // per_other)
    tasks = blocks * other_blocks
    # the split dimension in about `want` blocks (never more than it has units), the other
    # only as far as the tasks wanted need, then evened out
    assert 1 <= per <= split and 1 <= per_other <= other
    assert blocks <= max(want, 1) * 2 and blocks <= split
    assert other_blocks <= max(1, 2 * -(-want // blocks))
    # within 10% idle, else the most even of the chunkings even_block_size weighs (from the
    # blocks the tasks wanted need up to twice as many)
    idle = _idle(tasks, workers)
    first = min(-(-want // blocks), other)
    alternatives = [_idle(blocks * -(-other // -(-other // n)), workers)
                    for n in range(first, min(2 * first, other) + 1)]
    assert idle <= 0.1 or idle == min(alternatives) or other == 1


def test_split_blocks_cases_by_hand():
    # seven weight groups of a 7 x 7 layer on two workers: each group's pixels in two chunks
    assert split_blocks(7, 49, 8, 2) == (1, 25)
    # ... on one worker, one task
    assert split_blocks(7, 49, 1, 1) == (7, 49)
    # fourteen groups share out as they are
    assert split_blocks(14, 49, 8, 2) == (1, 49)
    # nothing to cut but the split: its blocks evened out (20 groups, 8 wanted -> 2 each)
    assert split_blocks(20, 1, 8, 2) == (2, 1)
    with pytest.raises(ValueError, match="want"):
        split_blocks(7, 49, 0, 2)


def test_even_block_size_cases_by_hand():
    # nine panels of a pointwise layer on two workers: two tile groups, 18 tasks, none idle
    assert even_block_size(33, 1, 2, fixed=9) == 17
    # nine depthwise channel blocks of 56 rows: two row blocks of 28
    assert even_block_size(56, 1, 2, fixed=9) == 28
    # nothing finer than one unit: nine tasks of one unit stay nine
    assert even_block_size(9, 8, 2) == 1
    # already even: unchanged
    assert even_block_size(64, 8, 2) == 8
    # tolerance 0: exactly even if the candidates allow it
    assert _tasks(30, even_block_size(30, 7, 2, tolerance=0.0)) % 2 == 0
    # a huge tolerance keeps the first candidate
    assert even_block_size(33, 1, 2, fixed=9, tolerance=9.0) == 33


@pytest.mark.parametrize("bad", [
    dict(units=0, blocks=1, workers=1), dict(units=3, blocks=0, workers=1),
    dict(units=3, blocks=1, workers=0), dict(units=3, blocks=1, workers=1, fixed=0),
    dict(units=2.5, blocks=1, workers=1), dict(units=True, blocks=1, workers=1),
    dict(units=3, blocks=1, workers=1, tolerance=-0.1),
    dict(units=3, blocks=1, workers=1, tolerance=float("nan")),
])
def test_even_block_size_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        even_block_size(**bad)


def test_planned_tasks_share_out_evenly_and_results_hold():
    """Layers whose first cut gives nine tasks on two workers (a ninth of the job idle): the
    plan's task count is even, and the output still matches float64."""
    from asymo.models.reference import conv2d as reference

    pool = asymo.Pool("c0:0-1")
    try:
        rng = np.random.default_rng(3)
        cases = [((1, 96, 14, 14), (576, 96, 1, 1), 1, conv._PointwisePlan),  # 9 panels
                 ((1, 144, 56, 56), (144, 1, 3, 3), 144, conv._DepthwisePlan)]  # 9 blocks
        for xs, ws, groups, kind in cases:
            x = rng.standard_normal(xs, dtype=np.float32)
            w = rng.standard_normal(ws, dtype=np.float32) * 0.1
            pad = ws[2] // 2
            plan, _ = conv._conv_plan(pool, xs, ws, np.dtype(np.float32), (1, 1),
                                      ((pad, pad), (pad, pad)), (1, 1), groups, None, False,
                                      False)
            if isinstance(plan, kind):  # (the pointwise path needs AVX-512)
                assert plan.ntasks % 2 == 0, plan.ntasks
            y = asymo.conv2d(x, w, groups=groups, padding=pad, pool=pool)
            r = reference(x.astype(np.float64), w.astype(np.float64), padding=pad,
                          groups=groups)
            np.testing.assert_allclose(y, r, rtol=1e-4, atol=1e-5 * np.sqrt(ws[1] * 9))
    finally:
        pool.close()
