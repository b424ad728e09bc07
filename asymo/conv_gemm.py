"""The GEMM side of a convolution: plan ``weight @ col``, tell im2col which columns each
cluster's GEMM consumes, and run the product into an output view.

A convolution's GEMM is ``weight[M x K] @ col[K x N]`` with M output channels (per group), K =
Cin/groups * kh * kw and N output pixels (of one chunk). When the plan splits the product
between clusters along N, cluster c's tasks read only columns ``plan.cluster_ranges[c]`` of
col, so im2col gives exactly those columns to cluster c: they are written into the caches that
will read them. When it splits along M, every cluster reads all of col; im2col is then split by
the pool's capacity ratio.
"""
from __future__ import annotations

import numpy as np

from asymo.gemm import gemm as _gemm
from asymo.gemm import matmul as _matmul
from asymo.matmul_plan import plan_matmul as _plan_matmul

__all__ = ["plan_conv_gemm", "column_split", "gemm_into", "matmul_into"]


def plan_conv_gemm(m, k, n, dtype, pool):
    """The (cached) GEMM plan for ``(m x k) @ (k x n)`` on ``pool``: calibrated when
    ``asymo calibrate`` made a profile for this CPU (`asymo.plan_matmul`), else the default."""
    return _plan_matmul(m, k, n, np.dtype(dtype).name, pool=pool)


def column_split(plan, n, pool):
    """Per-cluster ``(start, stop)`` ranges of the ``n`` columns, fastest cluster first: the
    plan's own ranges when it splits along N, else proportional to cluster capacity."""
    if plan is not None and plan.split_dim == "N" and len(plan.cluster_ranges) == pool.nclusters:
        return plan.cluster_ranges
    ranges, start = [], 0
    for c in pool.split_counts(n):
        ranges.append((start, start + int(c)))
        start += int(c)
    return ranges


def gemm_into(a, b, out, pool, plan=None):
    """``out[...] = a @ b`` on ``pool`` (``out`` may be a strided view)."""
    _gemm(a, b, out, plan=plan, pool=pool)


def matmul_into(a, b, out, pool):
    """``out[...] = a @ b`` with NumPy matmul semantics (the fully-connected layers)."""
    _matmul(a, b, out=out, pool=pool)
