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

from asymo.ops.matmul import matmul as _matmul
from asymo.plan.gemm import kernel_tile as _kernel_tile
from asymo.plan.gemm import plan_gemm as _plan_gemm
from asymo.plan.gemm import supported_isas as _supported_isas
from asymo.plan.matmul import plan_matmul as _plan_matmul

__all__ = ["plan_conv_gemm", "column_split", "matmul_into"]


#: Packed convolution GEMMs run the AVX-512 kernels, even where the GEMM's own default is
#: AVX2+FMA (CPUs that execute 512-bit FMAs in two halves: Zen 4). Off: a convolution's GEMM
#: follows the GEMM default, which on Zen 4 pads less (AVX2's 6 x 16 tile and its 8-wide
#: half tile against AVX-512's 12 x 32: Cout = 64 computes 66 rows instead of 72, a 7x7
#: plane 56 columns instead of 64) and measured faster there (docs/tuning.md).
PREFER_AVX512 = False

#: A convolution whose GEMM packs B from the image (a 1x1 layer's image itself, or implicit
#: im2col's gather per element) is split between clusters along N (output pixels) rather than
#: M (output channels) when N is at least this fraction of M. Split along M, every cluster
#: packs all of B, the slower ones at their speed; split along N, each packs its own columns
#: and reads all of the (prepacked) weights, a plain stream. docs/tuning.md has the
#: measurements.
IMAGE_N_SPLIT_MIN = 0.25


def plan_conv_gemm(m, k, n, dtype, pool, *, packs_b=False):
    """The (cached) GEMM plan for ``(m x k) @ (k x n)`` on ``pool``: calibrated when
    ``asymo calibrate`` made a profile for this CPU (`asymo.plan_matmul`), else the default
    (the AVX-512 kernels for packed products when `PREFER_AVX512` is set). ``packs_b``: the
    product packs B from the image (a 1x1 layer, or implicit im2col; see
    `IMAGE_N_SPLIT_MIN`)."""
    dname = np.dtype(dtype).name
    # (a small GEMM's plan already runs on the fastest cluster alone: asymo.plan.split_cost, the
    # rule matmul uses, decides inside the planners)
    plan = _plan_matmul(m, k, n, dname, pool=pool)
    if packs_b and _split_columns(plan, m, n):
        ratio = getattr(plan, "ratio", None)
        plan = _plan_gemm(m, k, n, dname, pool, isa=plan.isa, split_dim="N",
                          split=[float(r) for r in ratio] if ratio else None)
    if (PREFER_AVX512 and plan.kind == "mm" and plan.isa != "avx512"
            and getattr(plan, "source", "default") == "default"
            and plan.split_dim in ("M", "N") and "avx512" in _supported_isas()):
        ratio = getattr(plan, "ratio", None)
        split = None if not ratio else [float(r) for r in ratio]
        if len(plan.cluster_ranges) > 1 and all(b == a for a, b in plan.cluster_ranges[1:]):
            split = [1.0] + [0.0] * (len(plan.cluster_ranges) - 1)   # kept on the fastest
        plan = _plan_gemm(m, k, n, dname, pool, isa="avx512", split=split)
    return plan


def _split_columns(plan, m, n):
    """Whether a product packing B from the image, split along M between clusters, should be
    split along N instead: a slower cluster has a share, and N is wide enough for every cluster
    to get whole micro-tiles of columns."""
    if plan.kind != "mm" or plan.split_dim != "M" or plan.nbatch != 1:
        return False
    shared = [b - a for a, b in plan.cluster_ranges]
    if len(shared) < 2 or not any(shared[1:]):
        return False
    nr = _kernel_tile(plan.isa, plan.dtype)[1]
    return n >= IMAGE_N_SPLIT_MIN * m and n >= 2 * nr * sum(1 for x in shared if x)


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


def matmul_into(a, b, out, pool):
    """``out[...] = a @ b`` with NumPy matmul semantics (the fully-connected layers)."""
    _matmul(a, b, out=out, pool=pool)
