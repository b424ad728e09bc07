"""The GEMM calibration data set (AsyMo, paper 003, section 5).

* 15 MM sizes: convolution layers of VGG-16 (7) and MobileNet V1 (8) as the products asymo's
  ``conv2d`` runs, ``weight (Cout x Cin*kh*kw) @ columns (Cin*kh*kw x Hout*Wout)``, i.e.
  numpy-matmul ``(M, K, N) = (Cout, Cin*kh*kw, Hout*Wout)`` for a 224 x 224 image.
* 20 MV sizes: ``(M, K) @ (K, 1)`` with M and K powers of two, M in 256..2048 and K in
  128..2048 (the paper's ranges).
* Each size is measured over a range of block sizes: the candidates of AsyMo's constraints
  (`asymo.plan.costmodel.block_candidates`) spread from fewest to most tasks, plus kc variants
  (half and double the L1-constrained kc) that make the data terms of the model
  identifiable. The full set has 10 settings per MM size and 6 per MV size: 270 settings
  per cluster, as in the paper.
* Held-out sizes (not in the training set: ResNet-50, AlexNet and GoogLeNet convolutions,
  MV sizes that are not powers of two, FC layers in the ``x @ W`` orientation) measure how
  close the cost model's choice comes to the best candidate found by exhaustive search over
  the candidates the planner considers (at least
  `asymo.plan.costmodel.MIN_TASKS_PER_THREAD` tasks per thread).

Sets: ``"full"`` (the paper's), ``"quick"`` (the same sizes, fewer settings and held-out
shapes), ``"tiny"`` (small shapes for tests; select with env ``ASYMO_CALIBRATION_SET=tiny``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from asymo.plan.costmodel import MIN_TASKS_PER_THREAD, block_candidates, kc_for_l1

__all__ = ["Size", "MM_SIZES", "MV_SIZES", "HELD_OUT_SIZES", "SETS", "SET_ENV_VAR",
           "SetSpec", "get_set", "training_blocks", "candidate_blocks", "CacheInfo"]

SET_ENV_VAR = "ASYMO_CALIBRATION_SET"


@dataclass(frozen=True)
class Size:
    """One product of the data set: numpy-matmul ``(M, K) @ (K, N)``."""

    name: str
    M: int
    K: int
    N: int
    kind: str  # "mm" or "mv"

    @property
    def flops(self):
        return 2.0 * self.M * self.K * self.N

    @property
    def key(self):
        return f"{self.kind}:{self.M}x{self.K}x{self.N}"


def _conv(name, cout, cin, k, hw):
    return Size(name, cout, cin * k * k, hw * hw, "mm")


MM_SIZES = (
    # VGG-16 (224 x 224): conv1_1, conv1_2, conv2_2, conv3_1, conv3_2, conv4_2, conv5_1
    _conv("vgg16.conv1_1", 64, 3, 3, 224),
    _conv("vgg16.conv1_2", 64, 64, 3, 224),
    _conv("vgg16.conv2_2", 128, 128, 3, 112),
    _conv("vgg16.conv3_1", 256, 128, 3, 56),
    _conv("vgg16.conv3_2", 256, 256, 3, 56),
    _conv("vgg16.conv4_2", 512, 512, 3, 28),
    _conv("vgg16.conv5_1", 512, 512, 3, 14),
    # MobileNet V1 (224 x 224): the first (3 x 3, stride 2) and the pointwise convolutions
    _conv("mobilenet_v1.conv1", 32, 3, 3, 112),
    _conv("mobilenet_v1.pw1", 64, 32, 1, 112),
    _conv("mobilenet_v1.pw2", 128, 64, 1, 56),
    _conv("mobilenet_v1.pw3", 128, 128, 1, 56),
    _conv("mobilenet_v1.pw4", 256, 128, 1, 28),
    _conv("mobilenet_v1.pw5", 256, 256, 1, 28),
    _conv("mobilenet_v1.pw7", 512, 512, 1, 14),
    _conv("mobilenet_v1.pw13", 1024, 1024, 1, 7),
)

MV_SIZES = tuple(Size(f"mv.{m}x{k}", m, k, 1, "mv")
                 for m in (256, 512, 1024, 2048) for k in (128, 256, 512, 1024, 2048))

HELD_OUT_SIZES = (
    _conv("resnet50.layer1.conv1", 64, 64, 1, 56),
    _conv("resnet50.layer1.conv2", 64, 64, 3, 56),
    _conv("resnet50.layer1.conv3", 256, 64, 1, 56),
    _conv("resnet50.layer2.conv2", 128, 128, 3, 28),
    _conv("resnet50.layer2.conv3", 512, 128, 1, 28),
    _conv("resnet50.layer3.conv2", 256, 256, 3, 14),
    _conv("resnet50.layer3.conv3", 1024, 256, 1, 14),
    _conv("resnet50.layer4.conv2", 512, 512, 3, 7),
    _conv("resnet50.layer4.conv3", 2048, 512, 1, 7),
    Size("alexnet.conv1", 64, 363, 3025, "mm"),
    Size("alexnet.conv3", 384, 1728, 169, "mm"),
    _conv("googlenet.conv2", 192, 64, 3, 56),
    Size("mv.768x768", 768, 768, 1, "mv"),
    Size("mv.1536x640", 1536, 640, 1, "mv"),
    Size("mv.3072x1024", 3072, 1024, 1, "mv"),
    Size("fc.mobilenet_v1", 1, 1024, 1000, "mv"),
    Size("fc.resnet50", 1, 2048, 1000, "mv"),
    Size("fc.alexnet.fc7", 1, 4096, 4096, "mv"),
)


@dataclass(frozen=True)
class SetSpec:
    """What one calibration mode measures."""

    name: str
    mm: tuple
    mv: tuple
    held_out: tuple
    mm_settings: int       # block settings per MM size
    mv_settings: int       # block settings per MV size
    repeats: int           # timed samples per setting, at least (minimum kept)
    min_sample_s: float    # a sample repeats the call until it lasts this long
    max_candidates: int    # held-out: candidates measured per shape (exhaustive if enough)
    max_repeats: int = 0   # more samples while the minimum still improves (0: repeats)
    budget_s: float = 0.0  # ... but no longer than this per size (0: no limit)

    @property
    def digest(self):
        """Identifies the set's content (a resumed run must measure the same set)."""
        d = {"name": self.name, "mm": [s.key for s in self.mm], "mv": [s.key for s in self.mv],
             "held_out": [s.key for s in self.held_out], "mm_settings": self.mm_settings,
             "mv_settings": self.mv_settings, "repeats": self.repeats,
             "min_sample_s": self.min_sample_s, "max_candidates": self.max_candidates,
             "max_repeats": self.max_repeats, "budget_s": self.budget_s}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _pick(names, sizes):
    by = {s.name: s for s in sizes}
    return tuple(by[n] for n in names)


SETS = {
    "full": SetSpec("full", MM_SIZES, MV_SIZES, HELD_OUT_SIZES, mm_settings=10, mv_settings=6,
                    repeats=5, min_sample_s=0.005, max_candidates=64, max_repeats=30,
                    budget_s=8.0),
    "quick": SetSpec("quick", MM_SIZES, MV_SIZES,
                     _pick(("resnet50.layer1.conv2", "resnet50.layer2.conv3",
                            "resnet50.layer3.conv2", "resnet50.layer4.conv3", "alexnet.conv3",
                            "googlenet.conv2", "mv.1536x640", "fc.resnet50"), HELD_OUT_SIZES),
                     mm_settings=8, mv_settings=4, repeats=4, min_sample_s=0.005,
                     max_candidates=16, max_repeats=12, budget_s=2.5),
    "tiny": SetSpec("tiny",
                    (Size("tiny.mm1", 64, 64, 256, "mm"), Size("tiny.mm2", 32, 128, 192, "mm")),
                    (Size("tiny.mv1", 256, 128, 1, "mv"), Size("tiny.mv2", 512, 64, 1, "mv")),
                    (Size("tiny.held_mm", 48, 96, 160, "mm"),
                     Size("tiny.held_mv", 384, 96, 1, "mv")),
                    mm_settings=3, mv_settings=2, repeats=2, min_sample_s=0.0002,
                    max_candidates=4, max_repeats=3, budget_s=0.2),
}


def get_set(name=None):
    """The set called ``name`` (default: env ``ASYMO_CALIBRATION_SET``, else "full")."""
    name = name or os.environ.get(SET_ENV_VAR) or "full"
    try:
        return SETS[name]
    except KeyError:
        raise ValueError(f"calibration set {name!r} is not one of {sorted(SETS)}") from None


@dataclass(frozen=True)
class CacheInfo:
    """What the constraints need to know about a cluster and the micro-kernel."""

    l1_bytes: int
    l2_bytes: int
    l2_sharing: int
    mr: int
    nr: int
    itemsize: int = 4
    unit: int = 16  # split unit of the skinny path

    def kwargs(self):
        return {"l1_bytes": self.l1_bytes, "l2_bytes": self.l2_bytes,
                "l2_sharing": self.l2_sharing, "mr": self.mr, "nr": self.nr,
                "itemsize": self.itemsize, "unit": self.unit}

    @classmethod
    def for_cluster(cls, cluster, mr, nr, itemsize=4):
        """From a topology `Cluster` (fallbacks 32 KiB L1, 512 KiB L2 when unknown)."""
        l1 = cluster.l1d.size if cluster.l1d else 32 * 1024
        if cluster.l2:
            sharing = len(set(cluster.l2.shared_cpus) & set(cluster.cpus)) or 1
            l2 = cluster.l2.size
        else:
            sharing, l2 = 1, 512 * 1024
        return cls(l1_bytes=int(l1), l2_bytes=int(l2), l2_sharing=int(sharing), mr=int(mr),
                   nr=int(nr), itemsize=int(itemsize))


def _spread(items, n):
    """n items spread evenly over the list (first and last included)."""
    if len(items) <= n:
        return list(items)
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, n)).astype(int))
    return [items[i] for i in idx]


def candidate_blocks(size, threads, cache, max_candidates=64, min_i=1):
    """AsyMo's candidates for ``size`` on a cluster (at most ``max_candidates``, spread)."""
    cands = block_candidates(size.M, size.K, size.N, threads=threads, kind=size.kind,
                             min_i=min_i, **cache.kwargs())
    return _spread(cands, max_candidates)


def training_blocks(size, threads, cache, n):
    """``n`` block settings for ``size``: candidates spread from fewest to most tasks, then
    (MM) kc variants of them, half and double the L1-constrained kc."""
    cands = candidate_blocks(size, threads, cache)
    if size.kind == "mv":
        return _spread(cands, n)
    n_main = max(1, n - 2 * max(1, n // 5)) if size.K > 16 else n
    chosen = _spread(cands, n_main)
    kc = kc_for_l1(size.K, cache.l1_bytes, cache.mr, cache.nr, cache.itemsize)
    variants = []
    for kc2 in (max(8, (kc // 2) // 8 * 8), min(size.K, 2 * kc)):
        if kc2 != kc:
            variants.append(kc2)
    order = [chosen[len(chosen) // 2]] + [c for c in chosen if c != chosen[len(chosen) // 2]]
    out = list(chosen)
    for base in order:
        for kc2 in variants:
            if len(out) >= n:
                return out
            cand = (base[0], base[1], kc2)
            if cand not in out:
                out.append(cand)
    # small products: few candidates; add the remaining ones
    for c in cands:
        if len(out) >= n:
            break
        if c not in out:
            out.append(c)
    return out
