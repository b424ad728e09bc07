"""How a GEMM is cut up: the partition plan (plain data) and the default planner.

A `GemmPlan` says, for one product ``C (M x N) = A (M x K) @ B (K x N)`` (or a batch of them):

* ``kind``: ``"mm"`` (the packed five-loop GEMM), ``"mv"`` (matrix-vector and small M or N:
  no packing, the long dimension is split) or ``"outer"`` (K = 1);
* ``split_dim`` and ``cluster_ranges``: the processor-level split of AsyMo (section 4.2).
  Cluster *c* (fastest first, as in the pool's topology) computes ``[start, stop)`` along
  ``split_dim`` (``"M"``: rows of C, ``"N"``: columns of C, ``"batch"``: whole products of a
  batch);
* ``blocks[c] = (mc, nc, kc)``: the cluster's block sizes. Inside a cluster every task is one
  ``mc x nc`` block of C (the core-level partition) over the whole K loop, packing B in
  ``kc x nc`` panels shared by the cluster's tasks and A in ``mc x kc`` blocks;
* ``chunks[c]``: elements of ``split_dim`` per task for ``"mv"`` and ``"outer"``, products per
  task for a ``"batch"`` split;
* ``isa``: the micro-kernel family (``"avx512"``, ``"avx2_fma"``, ``"neon"``, ``"portable"``).

Plans are data: a caller (the calibration, conv2d co-locating its im2col tasks) may build
one directly or with `plan_gemm` overrides (``split=``, ``blocks=``, ``isa=``, ``kind=``), e.g.
a plan that runs on one cluster only: ``plan_gemm(M, K, N, "float32", pool, split=(1, 0))``.

Default block sizes come from the cluster's caches in the topology: kc from AsyMo's L1
constraint ``mr*kc + nr*kc + mr*nr <= L1``; mc and nc from its cache constraint
``(mc*kc + nc*kc + mc*nc) * threads <= L2`` (threads sharing that cache) with enough tasks per
worker for balance. The calibration replaces the choice with its cost model through
`set_block_chooser`. Plans are cached per shape (`plan_gemm` is deterministic).
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from asymo.plan import costmodel as _costmodel
from asymo.plan import split_cost as _split_cost
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.partition import largest_remainder

__all__ = [
    "GemmPlan", "plan_gemm", "default_blocks", "block_candidates", "set_block_chooser",
    "isa_names", "supported_isas", "best_isa", "force_isa", "kernel_tile", "clear_plan_cache",
    "on_plans_cleared", "SKINNY_MAX", "ISA_ENV_VAR",
]

#: env var forcing the micro-kernel family (for tests and comparisons)
ISA_ENV_VAR = "ASYMO_GEMM_ISA"
#: largest small dimension the no-packing skinny path takes (C's ASYMO_SKINNY_MAX)
SKINNY_MAX = 8
#: min(M, N) up to which "mv" is chosen by default (the skinny path streams the big operand
#: once; above this, packing pays off)
SKINNY_DEFAULT = 4

KINDS = {"mm": lib.ASYMO_GEMM_MM, "mv": lib.ASYMO_GEMM_MV, "outer": lib.ASYMO_GEMM_OUTER}
SPLITS = {"M": lib.ASYMO_SPLIT_M, "N": lib.ASYMO_SPLIT_N, "batch": lib.ASYMO_SPLIT_BATCH}
DTYPES = {"float32": lib.ASYMO_DTYPE_F32, "float64": lib.ASYMO_DTYPE_F64}
MAX_CLUSTERS = 8

_FALLBACK_L1 = 32 * 1024
_FALLBACK_L2 = 512 * 1024
#: tasks per worker the default planner aims for (room for stealing to even out lag)
TASKS_PER_WORKER = 8
#: ... and at most this many FLOPs per task: a job ends when its last task does, so on a core
#: that is preempted or slower than planned the expected wait is about half a task (about
#: 0.25 ms here, below the 1 ms period of the asymmetry emulator)
TASK_FLOPS = 50e6
#: products of a batch smaller than this (FLOPs) are given whole to tasks
BATCH_SPLIT_FLOPS = 4e6
#: products (whole batches) below this many FLOPs are not worth a pool job: on a symmetric
#: machine they run in the calling thread, on an asymmetric one on the fastest cluster
#: (the measurements behind it: docs/tuning.md)
SERIAL_FLOPS = 4e6
SERIAL_FLOPS_MV = 1.5e5


# ---------------------------------------------------------------------------------------------
# ISA
# ---------------------------------------------------------------------------------------------
def isa_names():
    """All kernel family names, by ASYMO_ISA_* value."""
    return {int(v): ffi.string(lib.asymo_isa_name(v)).decode()
            for v in (lib.ASYMO_ISA_PORTABLE, lib.ASYMO_ISA_AVX2_FMA, lib.ASYMO_ISA_AVX512,
                      lib.ASYMO_ISA_NEON)}


_SUPPORTED = None
#: the ISA forced by env ASYMO_GEMM_ISA (read once, at import) or by `force_isa`
_forced_isa = os.environ.get(ISA_ENV_VAR) or None


def supported_isas():
    """Names of the kernel families this CPU runs and this build contains, best last."""
    global _SUPPORTED
    if _SUPPORTED is None:
        _SUPPORTED = tuple(
            name for value, name in sorted(isa_names().items())
            if lib.asymo_gemm_kernel_tile(value, lib.ASYMO_DTYPE_F32, ffi.NULL, ffi.NULL) == 0)
    return list(_SUPPORTED)


_DEFAULT = None


def best_isa():
    """The family used by default: the forced one (`force_isa`, or env ``ASYMO_GEMM_ISA`` at
    import), else the widest the CPU runs at full rate (AVX2 rather than AVX-512 on AMD Zen 4,
    whose 512-bit FMAs are two 256-bit halves)."""
    global _DEFAULT
    if _forced_isa is not None:
        return _check_isa(_forced_isa, source=f"env {ISA_ENV_VAR}")
    if _DEFAULT is None:
        _DEFAULT = isa_names()[lib.asymo_gemm_default_isa()]
    return _DEFAULT


@contextlib.contextmanager
def force_isa(name):
    """Use kernel family ``name`` for every plan made inside the block (tests, comparisons).

    Not thread-safe: it changes a process-wide default."""
    global _forced_isa
    _check_isa(name)
    saved, _forced_isa = _forced_isa, name
    for hook in _clear_hooks:
        hook()
    try:
        yield name
    finally:
        _forced_isa = saved
        for hook in _clear_hooks:
            hook()


def _check_isa(name, source="isa"):
    if _SUPPORTED is None:
        supported_isas()
    if isinstance(name, str) and name in _SUPPORTED:
        return name
    names = {v: k for k, v in isa_names().items()}
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"{source}={name!r} is not a kernel family; expected one of "
                         f"{sorted(names)}")
    raise ValueError(f"{source}={name!r}: this CPU or build cannot run it; supported: "
                     f"{list(_SUPPORTED)}")


def _isa_value(name):
    return {v: k for k, v in isa_names().items()}[name]


def kernel_tile(isa, dtype):
    """The micro-kernel's register tile ``(mr, nr)`` for ``isa`` and ``dtype``."""
    mr, nr = ffi.new("int *"), ffi.new("int *")
    rc = lib.asymo_gemm_kernel_tile(_isa_value(_check_isa(isa)), DTYPES[_dtype_name(dtype)],
                                    mr, nr)
    if rc != 0:  # pragma: no cover - _check_isa guards
        raise ValueError(f"no {isa} kernel for {dtype}")
    return mr[0], nr[0]


_DTYPE_ALIASES = {"float32": "float32", "float64": "float64", np.float32: "float32",
                  np.float64: "float64", np.dtype(np.float32): "float32",
                  np.dtype(np.float64): "float64"}


def _dtype_name(dtype):
    try:
        return _DTYPE_ALIASES[dtype]
    except (KeyError, TypeError):
        pass
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"asymo's GEMM computes float32 and float64, not {name}")
    return name


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmPlan:
    """A partition plan for ``nbatch`` products of shape ``(M, K) @ (K, N)`` (plain data).

    Attributes
    ----------
    shape : (M, K, N)
    dtype : "float32" or "float64"
    kind : "mm", "mv" or "outer"
    split_dim : "M", "N" or "batch"
    cluster_ranges : tuple of (start, stop)
        Per cluster, fastest first; in order, covering ``[0, size of split_dim)``; empty ranges
        leave a cluster idle.
    blocks : tuple of (mc, nc, kc)
        Per cluster block sizes (used by "mm", also inside each product of a "batch" split).
    chunks : tuple of int
        Per cluster: elements of split_dim per task ("mv", "outer") or products per task
        ("batch"); ignored by an "mm" split along M or N.
    isa : str
        Micro-kernel family.
    nbatch : int
        Number of products the plan was made for (a "batch" split needs it to match).
    serial : bool
        Run in the calling thread without the pool: for tiny products, where waking the
        workers costs more than the work.
    serial_cpus : tuple of int
        Run in the calling thread when it is on one of these cpus, else as planned (tiny
        products on an asymmetric machine: the fastest cluster's cpus, where the plan puts
        all the work).
    """

    shape: tuple
    dtype: str
    kind: str
    split_dim: str
    cluster_ranges: tuple
    blocks: tuple
    chunks: tuple
    isa: str
    nbatch: int = 1
    serial: bool = False
    serial_cpus: tuple = ()
    _cdata: object = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        M, K, N = (int(x) for x in self.shape)
        object.__setattr__(self, "shape", (M, K, N))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        object.__setattr__(self, "cluster_ranges",
                           tuple((int(a), int(b)) for a, b in self.cluster_ranges))
        object.__setattr__(self, "blocks", tuple(tuple(int(x) for x in b) for b in self.blocks))
        object.__setattr__(self, "chunks", tuple(int(x) for x in self.chunks))
        object.__setattr__(self, "nbatch", int(self.nbatch))
        object.__setattr__(self, "serial", bool(self.serial))
        object.__setattr__(self, "serial_cpus", tuple(int(c) for c in self.serial_cpus))
        self._validate()

    def _validate(self):
        M, K, N = self.shape
        if min(M, K, N) < 0 or self.nbatch < 1:
            raise ValueError(f"GemmPlan: bad shape {self.shape} / nbatch {self.nbatch}")
        if self.kind not in KINDS:
            raise ValueError(f"GemmPlan: kind {self.kind!r} is not one of {sorted(KINDS)}")
        if self.split_dim not in SPLITS:
            raise ValueError(f"GemmPlan: split_dim {self.split_dim!r} is not one of "
                             f"{sorted(SPLITS)}")
        _check_isa(self.isa, "GemmPlan: isa")
        n = len(self.cluster_ranges)
        if not 1 <= n <= MAX_CLUSTERS:
            raise ValueError(f"GemmPlan: {n} cluster ranges; expected 1..{MAX_CLUSTERS}")
        if len(self.blocks) != n or len(self.chunks) != n:
            raise ValueError(f"GemmPlan: {n} cluster ranges but {len(self.blocks)} blocks and "
                             f"{len(self.chunks)} chunks")
        size = {"M": M, "N": N, "batch": self.nbatch}[self.split_dim]
        pos = 0
        for c, (a, b) in enumerate(self.cluster_ranges):
            if a != pos or b < a:
                raise ValueError(f"GemmPlan: cluster_ranges {self.cluster_ranges} must be "
                                 f"contiguous, in order, from 0")
            pos = b
        if pos != size:
            raise ValueError(f"GemmPlan: cluster_ranges end at {pos} but {self.split_dim} is "
                             f"{size}")
        for b in self.blocks:
            if len(b) != 3 or min(b) < 1:
                raise ValueError(f"GemmPlan: blocks {self.blocks} must be (mc, nc, kc) >= 1")
        if min(self.chunks) < 1:
            raise ValueError(f"GemmPlan: chunks {self.chunks} must be >= 1")
        if self.kind == "outer" and K > 1:
            raise ValueError(f"GemmPlan: kind 'outer' needs K == 1, got K = {K}")
        if self.kind == "mv":
            small = {"M": N, "N": M, "batch": min(M, N)}[self.split_dim]
            if small > SKINNY_MAX:
                raise ValueError(f"GemmPlan: kind 'mv' split along {self.split_dim} needs the "
                                 f"other dimension <= {SKINNY_MAX}, got {small}")

    @property
    def nclusters(self):
        return len(self.cluster_ranges)

    @property
    def flops(self):
        M, K, N = self.shape
        return 2.0 * M * K * N * self.nbatch

    def in_caller(self):
        """True when this call should run in the calling thread (see ``serial``)."""
        return self.serial or (bool(self.serial_cpus) and lib.asymo_gemm_current_cpu()
                               in self.serial_cpus)

    def cdata(self):
        """The ``asymo_gemm_plan`` struct for the C driver (built once, kept alive here)."""
        if self._cdata is None:
            p = ffi.new("asymo_gemm_plan *")
            p.kind = KINDS[self.kind]
            p.split_dim = SPLITS[self.split_dim]
            p.isa = _isa_value(self.isa)
            p.nclusters = self.nclusters
            for c, ((a, b), (mc, nc, kc), ch) in enumerate(
                    zip(self.cluster_ranges, self.blocks, self.chunks)):
                p.start[c], p.stop[c] = a, b
                p.mc[c], p.nc[c], p.kc[c] = mc, nc, kc
                p.chunk[c] = ch
            object.__setattr__(self, "_cdata", p)
        return self._cdata

    def task_counts(self):
        """Pool tasks per cluster for one product (for the whole batch when split by batch).

        A "mv" plan whose big operand runs along the long dimension (``x @ W``, W row-major)
        is run with the same cluster shares applied to K instead (see csrc/gemm.c); its task
        counts then follow K."""
        g = ffi.new("asymo_gemm_args *")
        M, K, N = self.shape
        g.dtype = DTYPES[self.dtype]
        g.m, g.k, g.n = M, K, N
        g.nbatch = 1 if self.split_dim != "batch" else self.nbatch
        # the counts need no operands; dummy offsets keep the argument check happy
        offs = ffi.new("int64_t[]", max(g.nbatch, 1))
        g.a_offsets = g.b_offsets = g.c_offsets = offs
        dummy = ffi.new("char[1]")
        g.a = g.b = g.c = dummy
        counts = ffi.new("int64_t[]", self.nclusters)
        total = lib.asymo_gemm_task_counts(g, self.cdata(), counts)
        if total < 0:  # pragma: no cover - the plan validated itself
            raise ValueError(f"invalid plan for the C driver: {self}")
        return tuple(int(counts[c]) for c in range(self.nclusters))

    def to_dict(self):
        """JSON-ready form (``from_dict`` inverts it)."""
        return {"shape": list(self.shape), "dtype": self.dtype, "kind": self.kind,
                "split_dim": self.split_dim,
                "cluster_ranges": [list(r) for r in self.cluster_ranges],
                "blocks": [list(b) for b in self.blocks], "chunks": list(self.chunks),
                "isa": self.isa, "nbatch": self.nbatch, "serial": self.serial,
                "serial_cpus": list(self.serial_cpus)}

    @classmethod
    def from_dict(cls, d):
        try:
            return cls(shape=tuple(d["shape"]), dtype=d["dtype"], kind=d["kind"],
                       split_dim=d["split_dim"],
                       cluster_ranges=tuple(tuple(r) for r in d["cluster_ranges"]),
                       blocks=tuple(tuple(b) for b in d["blocks"]), chunks=tuple(d["chunks"]),
                       isa=d["isa"], nbatch=d.get("nbatch", 1),
                       serial=d.get("serial", False),
                       serial_cpus=tuple(d.get("serial_cpus", ())))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a GemmPlan dict: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Block sizes
# ---------------------------------------------------------------------------------------------
def _cache_budget(cluster):
    """(L1 bytes per core, L2 bytes per thread) of a cluster, with fallbacks when unknown."""
    l1 = cluster.l1d.size if cluster is not None and cluster.l1d else _FALLBACK_L1
    if cluster is not None and cluster.l2:
        shared = set(cluster.l2.shared_cpus) & set(cluster.cpus) or {0}
        l2 = cluster.l2.size // len(shared)
    else:
        l2 = _FALLBACK_L2
    return max(l1, 4096), max(l2, 16384)


def _round_up(x, m):
    return -(-x // m) * m


def _kc_for(K, l1, mr, nr, itemsize):
    """AsyMo constraint (1), mr*kc + nr*kc + mr*nr <= L1, with equal-size K panels."""
    kc_max = (l1 // itemsize - mr * nr) // (mr + nr)
    kc_max = max(16, kc_max - kc_max % 8)
    if K <= kc_max:
        return max(K, 1)
    npanels = -(-K // kc_max)
    return _round_up(-(-K // npanels), 8)


def block_candidates(M, K, N, cluster, nthreads, mr, nr, itemsize):
    """Candidate (mc, nc, kc) for ``cluster`` computing an M x N part of C with K.

    The candidates of `asymo.plan.costmodel.block_candidates` (AsyMo's constraints, section
    4.2) for the cluster's caches (L1 per core; the L2 shared by the cores that share it,
    fallbacks when unknown), in whole register tiles: mc and nc rounded up to multiples of
    ``mr`` and ``nr`` (an unpartitioned M or N becomes one block of whole tiles), each still
    within the L2 constraint. A cost model picks among these.
    """
    l1, l2 = _cache_budget(cluster)
    out = []
    for mc, nc, kc in _costmodel.block_candidates(M, K, N, threads=nthreads, l1_bytes=l1,
                                                  l2_bytes=l2, l2_sharing=1, mr=mr, nr=nr,
                                                  itemsize=itemsize):
        cand = (_round_up(mc, mr), _round_up(nc, nr), kc)
        if cand not in out and _costmodel.fits_l2(*cand, 1, l2, itemsize):
            out.append(cand)
    return out


def default_blocks(M, N, K, cluster, nthreads, mr, nr, itemsize):
    """Default (mc, nc, kc) for a cluster computing an M x N part of C with K.

    * kc: AsyMo's L1 constraint ``mr*kc + nr*kc + mr*nr <= L1`` (the B sliver and the A
      micro-panel rows stay in L1), with equal-size K panels.
    * nc: as wide as the cluster's columns while a kc x nc panel of B takes at most 3/4 of the
      per-thread L2 (wide panels keep A from being repacked), cut into equal blocks.
    * mc, nc: at least ``TASKS_PER_WORKER`` tasks per worker and tasks of at most
      ``TASK_FLOPS`` (small tasks balance, and let stealing even out lagging cores), but at
      least 8 micro-tiles a side: a short M is not cut, the columns are cut instead (down to
      nc = 8 nr); mc at most 16 micro-tiles; within AsyMo's cache constraint
      ``mc*kc + nc*kc + mc*nc <= L2`` per thread.
    * tasks: a multiple of the thread count (AsyMo's constraint (2)) through mc, or, when the
      floors cap them below the target and no mc does it, through the column width.

    Measured on the development machine (2 cores, AVX2 kernel): tens of tasks of 48-96 rows
    beat a few large ones by up to 20% on the DL shapes, and blocks of fewer than 8
    micro-tiles a side lost up to 40% on short-M shapes (49 x 1024 x 1024).
    """
    l1, l2 = _cache_budget(cluster)
    kc = _kc_for(K, l1, mr, nr, itemsize)
    budget = l2 // itemsize
    M, N = max(M, 1), max(N, 1)
    want = max(1, TASKS_PER_WORKER * max(nthreads, 1), int(2.0 * M * N * K / TASK_FLOPS))
    nc_max = max(nr, (budget * 3 // 4 // kc) // nr * nr)
    ntn = -(-N // nc_max)
    # tasks of at least 8 micro-tiles a side; a short M is not cut but N is, instead
    mc_min = 8 * mr
    ntm_max = max(1, M // mc_min)
    if ntm_max * ntn < want:
        ntn = max(ntn, min(-(-N // (8 * nr)), -(-want // ntm_max)))
    nc = _round_up(-(-N // ntn), nr)
    threads = max(nthreads, 1)

    def mc_for(nc):
        # ... and at most 16 micro-tiles (smaller A blocks measured faster on large M)
        ntn = -(-N // nc)
        ntm = max(1, min(-(-want // ntn), ntm_max), -(-M // (2 * mc_min)))
        mc_cap = max(mr, ((budget - nc * kc) // (kc + nc)) // mr * mr)
        mc = _balanced_mc(M, mr, ntm, ntn, threads, mc_cap)
        return mc, -(-M // mc) * ntn

    mc, tasks = mc_for(nc)
    if tasks % threads and tasks < want:
        # The floors capped the task count below ``want`` and left too few row blocks for mc
        # to make it a multiple of the threads (a short M is not cut). With a few tasks per
        # worker the odd one out costs a whole task: a running task cannot be stolen, so 9
        # column blocks on 4 cores run 3, 2, 2, 2 while the others wait (simulated Kirin 970
        # conv2d: 8 cores slower than 7). Vary the column width too, nearest column count
        # first (more tasks on a tie), never narrower than the floor (8 micro-tiles, or nc if
        # the cache made it less) nor wider than the cache allows (nc_max, and AsyMo's L2
        # constraint with the A and C blocks: mc_for cannot go below mr rows to keep it).
        ntn = -(-N // nc)
        widths = range(min(nc, 8 * nr), min(nc_max, _round_up(N, nr)) + 1, nr)
        for w in sorted(widths, key=lambda w: (abs(-(-N // w) - ntn), w)):
            m, t = mc_for(w)
            if t % threads == 0 and m * kc + w * kc + m * w <= budget:
                mc, nc = m, w
                break
    return (mc, nc, kc)


def _balanced_mc(M, mr, ntm, ntn, threads, cap):
    """mc (at most ``cap``) for about ``ntm`` row blocks, preferring a number of tasks that is
    a multiple of the thread count (AsyMo's constraint (2)): with 13 tasks on 4 workers one
    worker runs 4 and the others wait, whatever stealing does."""
    def blocks(n):
        mc = min(cap, _round_up(-(-M // n), mr))
        return mc, -(-M // mc)
    ntm = max(ntm, -(-M // cap))
    lo, hi = max(1, ntm // 2), max(ntm, min(2 * ntm, -(-M // mr)))
    for n in sorted(range(lo, hi + 1), key=lambda n: (abs(n - ntm), -n)):
        mc, nb = blocks(n)
        if (nb * ntn) % threads == 0:
            return mc
    return blocks(ntm)[0]


_chooser_lock = threading.Lock()
_block_chooser = None


def set_block_chooser(fn):
    """Replace the default block-size rule (the calibration's cost model plugs in here).

    ``fn(M, N, K, cluster, nthreads, mr, nr, itemsize) -> (mc, nc, kc)`` is called per cluster
    with the part of C the cluster computes; None restores `default_blocks`. Clears the plan
    cache.
    """
    global _block_chooser
    if fn is not None and not callable(fn):
        raise TypeError(f"block chooser must be callable or None, not {type(fn).__name__}")
    with _chooser_lock:
        _block_chooser = fn
    clear_plan_cache()


# ---------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------
_cache_lock = threading.Lock()
_plan_cache = {}
_PLAN_CACHE_MAX = 4096


#: called (no arguments) whenever cached plans become stale (`on_plans_cleared`)
_clear_hooks = []


def on_plans_cleared(hook):
    """Call ``hook()`` whenever the cached plans become stale (`clear_plan_cache`,
    `set_block_chooser`, `force_isa`): for caches that hold GEMM plans of their own, such as
    asymo.matmul's C fast path and conv2d's layer plans."""
    if not callable(hook):
        raise TypeError(f"hook must be callable, not {type(hook).__name__}")
    _clear_hooks.append(hook)


def clear_plan_cache():
    """Forget every cached plan (the next calls plan again)."""
    with _cache_lock:
        _plan_cache.clear()
    for hook in _clear_hooks:
        hook()




def _context(pool, topology):
    """(topology, active workers per cluster, pool or None)."""
    if pool is not None:
        topo = pool.topology
        active = tuple(getattr(pool, "active_workers_per_cluster", lambda: None)()
                       or (c.ncpus for c in topo.clusters))
        return topo, tuple(active), pool
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    return topology, tuple(c.ncpus for c in topology.clusters), None


def _split_units(units, pool, split, weights):
    if split is not None:
        if isinstance(split, (str, bytes)) or not hasattr(split, "__len__"):
            raise TypeError(f"split must be a sequence of weights (one per cluster), not "
                            f"{type(split).__name__}")
        try:
            split = [float(x) for x in split]
        except (TypeError, ValueError):
            raise TypeError(f"split entries must be numbers, got {split!r}") from None
        if len(split) != len(weights):
            raise ValueError(f"split has {len(split)} entries but there are {len(weights)} "
                             f"clusters")
        if any(not math.isfinite(w) or w < 0 for w in split) or sum(split) <= 0:
            raise ValueError(f"split ratio {split} must be finite, >= 0, with a positive entry")
    if pool is not None and hasattr(pool, "split_counts"):
        return list(pool.split_counts(units, split))
    return largest_remainder(units, weights if split is None else split)


def _ranges(size, unit, pool, split, weights):
    """Cluster ranges over ``size`` elements, boundaries on multiples of ``unit``."""
    units = -(-size // unit) if size > 0 else 0
    counts = _split_units(units, pool, split, weights)
    ranges, pos = [], 0
    for n in counts:
        stop = min(size, pos + n * unit)
        ranges.append((pos, stop))
        pos = stop
    if ranges:
        ranges[-1] = (ranges[-1][0], size)
    return tuple(ranges)


def plan_gemm(M, K, N, dtype="float32", pool=None, *, nbatch=1, split=None, blocks=None,
              isa=None, kind=None, split_dim=None, topology=None):
    """Plan ``nbatch`` products ``(M, K) @ (K, N)`` on ``pool`` (cached per arguments).

    Parameters
    ----------
    M, K, N : int
    dtype : "float32" or "float64" (or a NumPy dtype)
    pool : asymo.Pool or None
        Its topology and active workers give the clusters, their caches, and the split (via
        ``pool.split_counts``). None: the topology from ``topology`` or ``topology.detect()``.
    nbatch : int
        Products in the batch; small products of a batch are given whole to tasks.
    split : sequence of float, optional
        Processor-level split: a weight per cluster (default: capacity x active workers, as
        ``pool.split_counts``). ``(1, 0)`` runs on the first cluster only.
    blocks : (mc, nc, kc) or a sequence of them per cluster, optional
        Overrides the block sizes.
    isa : str, optional
        Kernel family (default `best_isa()`).
    kind : "mm", "mv" or "outer", optional
        Overrides the path choice.
    split_dim : "M", "N" or "batch", optional
        Overrides the split dimension.

    Returns
    -------
    GemmPlan
    """
    dname = _dtype_name(dtype)
    for name, v in (("M", M), ("K", K), ("N", N), ("nbatch", nbatch)):
        if not _integral(v):
            raise TypeError(f"plan_gemm: {name} must be an integer, not {v!r}")
    if blocks is not None:
        blocks = _check_blocks(blocks)
    M, K, N, nbatch = int(M), int(K), int(N), int(nbatch)
    if min(M, K, N) < 0 or nbatch < 1:
        raise ValueError(f"plan_gemm: bad shape (M, K, N) = ({M}, {K}, {N}), nbatch={nbatch}")
    isa = best_isa() if isa is None else _check_isa(isa)
    # the pool (or topology) enters the key by identity, checked on a hit
    if pool is not None:
        owner, limit = pool.topology, getattr(pool, "limit", None)
    elif topology is not None:
        owner, limit = topology, None
    else:
        owner, limit = None, None
    key = (M, K, N, dname, nbatch, isa, _freeze(split), _freeze(blocks), kind, split_dim,
           id(owner) if owner is not None else None, limit, _block_chooser,
           _split_cost.emulated_period())
    if owner is not None:
        with _cache_lock:
            hit = _plan_cache.get(key)
        if hit is not None and hit[1] is owner:
            return hit[0]
    topo, active, pool = _context(pool, topology)
    plan = _make_plan(M, K, N, dname, nbatch, isa, topo, active, pool, split, blocks, kind,
                      split_dim)
    if owner is not None:
        with _cache_lock:
            if len(_plan_cache) >= _PLAN_CACHE_MAX:
                _plan_cache.clear()
            _plan_cache[key] = (plan, owner)
    return plan


def _integral(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _check_blocks(blocks):
    """``blocks`` as one ``(mc, nc, kc)`` of ints >= 1, or a tuple of them (one per cluster);
    anything else (8.5, a bool, a string) is a TypeError / ValueError, never truncated."""
    def one(b):
        if isinstance(b, (str, bytes)) or not hasattr(b, "__len__") or len(b) != 3:
            raise ValueError(f"plan_gemm: blocks must be (mc, nc, kc) or one per cluster, "
                             f"not {blocks!r}")
        if not all(_integral(x) for x in b):
            raise TypeError(f"plan_gemm: block sizes must be integers, not {tuple(b)!r}")
        if min(int(x) for x in b) < 1:
            raise ValueError(f"plan_gemm: block sizes must be >= 1, not {tuple(b)!r}")
        return tuple(int(x) for x in b)

    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__len__") or not len(blocks):
        raise ValueError(f"plan_gemm: blocks must be (mc, nc, kc) or one per cluster, not "
                         f"{blocks!r}")
    if isinstance(blocks[0], (tuple, list)):
        return tuple(one(b) for b in blocks)
    return one(blocks)


def _freeze(x):
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    return x


def _make_plan(M, K, N, dname, nbatch, isa, topo, active, pool, split, blocks, kind,
               split_dim):
    itemsize = np.dtype(dname).itemsize
    mr, nr = kernel_tile(isa, dname)
    clusters = topo.clusters
    ncl = len(clusters)
    if ncl > MAX_CLUSTERS:
        raise ValueError(f"asymo's GEMM supports up to {MAX_CLUSTERS} clusters, the topology "
                         f"has {ncl}")
    weights = [c.capacity * a for c, a in zip(clusters, active)]
    if sum(weights) <= 0:
        weights = [c.capacity * c.ncpus for c in clusters]
    total_workers = max(1, sum(active))

    if kind is None:
        if K == 1 and M > 0 and N > 0:
            kind = "outer"
        elif min(M, N) <= SKINNY_DEFAULT:
            kind = "mv"
        else:
            kind = "mm"
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {sorted(KINDS)}")

    per_item = 2.0 * M * K * N
    small = per_item * nbatch < (SERIAL_FLOPS_MV if kind == "mv" else SERIAL_FLOPS)
    serial = small and split is None and not topo.is_asymmetric
    serial_cpus = ()
    if split is None and topo.is_asymmetric and ncl > 1:
        # the slower clusters' share must save more than their sync and tail cost
        # (asymo.plan.split_cost: one rule for matmul and convolutions)
        if small or _split_cost.fastest_only(per_item * nbatch, topo,
                                             "mv" if kind == "mv" else "mm", active=active):
            split = [1.0] + [0.0] * (ncl - 1)
        if small:
            serial_cpus = clusters[0].cpus
    if not serial and not serial_cpus and split is None and total_workers == 1:
        # One worker on one cpu: a calling thread already on that cpu would hand the product to
        # a thread that must preempt it (two context switches a call, measured at up to half
        # the speed of a matrix-vector product); it runs the product itself instead.
        only = [c for c, a in zip(clusters, active) if a > 0]
        if len(only) == 1 and only[0].ncpus == 1:
            serial_cpus = only[0].cpus
    if split_dim is None:
        if nbatch > 1 and per_item < BATCH_SPLIT_FLOPS and nbatch >= total_workers:
            split_dim = "batch"
        elif kind == "mv":
            split_dim = "M" if N <= SKINNY_MAX and (M >= N or M > SKINNY_MAX) else "N"
        elif kind == "outer":
            split_dim = "M" if M >= N else "N"
        else:  # AsyMo: divide the bigger matrix (A is M x K, B is K x N)
            split_dim = "M" if M >= N else "N"
    if split_dim not in SPLITS:
        raise ValueError(f"split_dim {split_dim!r} is not one of {sorted(SPLITS)}")

    # processor-level split
    if split_dim == "batch":
        ranges = _ranges(nbatch, 1, pool, split, weights)
    elif kind == "mm":
        ranges = _ranges(M if split_dim == "M" else N, mr if split_dim == "M" else nr, pool,
                         split, weights)
    else:
        ranges = _ranges(M if split_dim == "M" else N, 16, pool, split, weights)

    # core-level partition
    blks, chunks = [], []
    for c, cl in enumerate(clusters):
        a, b = ranges[c]
        threads = max(1, active[c])
        if split_dim == "batch":
            part_m, part_n = M, N
        elif split_dim == "M":
            part_m, part_n = b - a, N
        else:
            part_m, part_n = M, b - a
        if blocks is not None:
            blk = tuple(blocks[c]) if isinstance(blocks[0], (tuple, list)) else tuple(blocks)
        else:
            chooser = _block_chooser or default_blocks
            blk = tuple(int(x) for x in chooser(max(part_m, 1), max(part_n, 1), max(K, 1), cl,
                                               threads, mr, nr, itemsize))
        blks.append(blk)
        if split_dim == "batch":
            chunks.append(max(1, -(-(b - a) // (TASKS_PER_WORKER * threads))))
        elif kind == "mm":
            chunks.append(1)
        else:
            n = b - a
            # at least a few KB of the big operand per task, about TASKS_PER_WORKER per worker
            floor = 64 if kind == "mv" else 16
            chunks.append(max(floor, _round_up(-(-n // (TASKS_PER_WORKER * threads)), 16)))
    return GemmPlan(shape=(M, K, N), dtype=dname, kind=kind, split_dim=split_dim,
                    cluster_ranges=ranges, blocks=tuple(blks), chunks=tuple(chunks), isa=isa,
                    nbatch=nbatch, serial=serial, serial_cpus=serial_cpus)
