"""The GEMM side of a convolution: run ``a @ b`` into an output view, and tell im2col which
columns each cluster's GEMM consumes.

INTERIM (until branch gemm lands on main): the product runs through numpy.matmul and the
column split is proportional to cluster size; both are replaced by asymo.matmul and the GEMM
plan's cluster ranges.
"""
from __future__ import annotations

import numpy as np

__all__ = ["gemm_into", "column_split"]


def gemm_into(a, b, out, pool):
    np.matmul(a, b, out=out)


def column_split(m, k, n, dtype_code, pool):
    counts = pool.split_counts(n)
    ranges, start = [], 0
    for c in counts:
        ranges.append((start, start + int(c)))
        start += int(c)
    return ranges
