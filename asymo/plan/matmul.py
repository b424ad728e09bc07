"""Calibrated partition plans for matmul: `plan_matmul` (AsyMo, paper 003, section 4.2).

The plan is made in two levels, as in the paper:

1. processor level: the product is divided between the clusters along the bigger matrix in
   the ratio of their measured capability for this kind of op (MM and MV differ), adjusted by
   the current load of each cluster read from ``/proc/stat`` (`asymo.hw.cpuload`);
2. core level: in each cluster, the block sizes ``(mc, nc, kc)`` (for the skinny MV path:
   the rows or columns per task) are the candidates of AsyMo's constraints with the least
   latency predicted by the cluster's cost model (`asymo.plan.costmodel`).

The calibration comes from the active profile (``asymo calibrate``; section "gemm"). Without
one -- missing, corrupt, made on another CPU or by another version -- the GEMM's default plan
is used (with a `asymo.profile.ProfileWarning` for an unusable file, never an error).

A plan is a `PartitionPlan`: a `asymo.plan.gemm.GemmPlan` (what the C driver runs) that also
records the split ratio, the task counts, the predicted latency and where the plan came from.
Plans are cached per shape (and per split ratio, which only changes when the load does).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
import weakref
from dataclasses import dataclass

from asymo.plan import costmodel as cm
from asymo.plan import gemm as gp
from asymo.plan import split_cost
from asymo.runtime.ffi import lib
from asymo.plan.calibration import parse_section
from asymo.hw.cpuload import LOAD_ENV_VAR, LoadMonitor, adjust_split, cluster_loads

__all__ = ["PartitionPlan", "plan_matmul", "plan_for_matmul", "clear_cache",
           "calibration_for", "plan_expiry"]

#: split ratios are rounded to this step (plans are cached per ratio)
RATIO_STEP = 1.0 / 64
#: seconds between two readings of /proc/stat for the load adjustment, and the time constant
#: of the average over readings
LOAD_INTERVAL_S = 0.5
LOAD_SMOOTHING_S = 2.0


@dataclass(frozen=True)
class PartitionPlan(gp.GemmPlan):
    """A `GemmPlan` with what the planner knew and predicted.

    Attributes (besides those of `GemmPlan`)
    ----------------------------------------
    ratio : tuple of float
        Processor-level split ratio used, fastest cluster first (sums to 1).
    tasks : tuple of int
        Pool tasks per cluster.
    predicted_s : float or None
        Predicted latency of the product (the slowest cluster; batch: per batch), None
        without a calibrated model for this plan.
    cluster_predicted_s : tuple
        Per cluster prediction (None for idle clusters or without a model).
    source : str
        ``"profile"`` (split and blocks calibrated), ``"profile-split"`` (calibrated split,
        default blocks: another dtype or kernel family than calibrated, or a batch split) or
        ``"default"`` (no usable profile).
    loads : tuple
        Per-cluster external load the split was adjusted for (None entries: not measured).
    """

    ratio: tuple = ()
    tasks: tuple = ()
    predicted_s: object = None
    cluster_predicted_s: tuple = ()
    source: str = "default"
    loads: tuple = ()

    def to_dict(self):
        d = super().to_dict()
        d.update(ratio=list(self.ratio), tasks=list(self.tasks), predicted_s=self.predicted_s,
                 cluster_predicted_s=list(self.cluster_predicted_s), source=self.source,
                 loads=list(self.loads))
        return d

    @classmethod
    def from_dict(cls, d):
        base = gp.GemmPlan.from_dict(d)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(gp.GemmPlan)
                  if f.init}
        try:
            return cls(**fields, ratio=tuple(d.get("ratio", ())),
                       tasks=tuple(d.get("tasks", ())), predicted_s=d.get("predicted_s"),
                       cluster_predicted_s=tuple(d.get("cluster_predicted_s", ())),
                       source=d.get("source", "default"), loads=tuple(d.get("loads", ())))
        except TypeError as exc:
            raise ValueError(f"not a PartitionPlan dict: {exc}") from None


# ---------------------------------------------------------------------------------------------
# The calibration of the active profile
# ---------------------------------------------------------------------------------------------
_warned = set()
_warn_lock = threading.Lock()


def _warn_once(key, message):
    from asymo.profile import ProfileWarning
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, ProfileWarning, stacklevel=4)


_cal_lock = threading.Lock()
_cal_cache = {}


def calibration_for(topology):
    """The calibration of the active profile for ``topology``, or None (defaults).

    A profile that cannot be used gives one `ProfileWarning` (from `asymo.profile`, or here
    for a "gemm" section that does not fit this topology or this asymo). Cached until
    `clear_cache` (finding the profile hashes the CPU's description).
    """
    from asymo import profile as prof
    where = (topology.to_spec(), tuple(sorted(topology.emulated.items())),
             os.environ.get(prof.ENV_VAR), os.environ.get("XDG_CACHE_HOME"), _generation)
    with _cal_lock:
        if where in _cal_cache:
            return _cal_cache[where]
    profile = prof.active_profile(topology)
    if profile is None:
        with _cal_lock:
            _cal_cache[where] = None
        return None
    key = (profile.path, id(profile), topology.to_spec())
    with _cal_lock:
        if key in _cal_cache:
            return _cal_cache[key]
    section = profile.sections.get("gemm")
    cal = None
    if section is not None:
        try:
            cal = parse_section(section, topology, profile.path)
        except ValueError as exc:
            _warn_once((profile.path, str(exc)),
                       f"calibration profile {profile.path}: the GEMM calibration cannot be "
                       f"used ({exc}); using default plans (re-run `asymo calibrate`)")
    with _cal_lock:
        _cal_cache[key] = _cal_cache[where] = cal
    return cal


# ---------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------
_monitors = {}
_monitor_lock = threading.Lock()


def _monitor(source):
    with _monitor_lock:
        monitor = _monitors.get(source)
        if monitor is None:
            monitor = _monitors[source] = LoadMonitor(source=source,
                                                      min_interval=LOAD_INTERVAL_S,
                                                      smoothing=LOAD_SMOOTHING_S)
        return monitor


def _current_loads(topology, source):
    """Per-cluster load now, measured as the calibration measured its baseline."""
    loads = _monitor(source).loads()
    return None if loads is None else cluster_loads(topology, loads)


def _load_enabled():
    return os.environ.get(LOAD_ENV_VAR, "1").strip().lower() not in ("0", "no", "off", "false")


def _quantise(ratio):
    q = [round(r / RATIO_STEP) for r in ratio]
    if sum(q) == 0:
        q = [1 if r == max(ratio) else 0 for r in ratio]
    total = sum(q)
    return tuple(x / total for x in q)


# ---------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------
_plan_lock = threading.Lock()
_plans = {}
_PLANS_MAX = 4096


_hot = {}
_pool_cals = {}
_generation = 0


def clear_cache():
    """Forget cached plans and calibrations: after a new calibration (`asymo calibrate` does
    it), or after changing ``ASYMO_PROFILE`` / ``ASYMO_LOAD_ADJUST`` at run time."""
    global _generation
    with _plan_lock:
        _plans.clear()
        _hot.clear()
        _pool_cals.clear()
        _generation += 1
    with _cal_lock:
        _cal_cache.clear()
    gp.clear_plan_cache()


def plan_for_matmul(M, K, N, dtype, pool, nbatch=1, with_cdata=False):
    """The plan `asymo.matmul` runs: `plan_matmul` through a lean cache.

    A hit costs a dictionary lookup (and, on an asymmetric machine with load adjustment, a
    clock read: the cache key includes the load window, which changes at most every
    `LOAD_INTERVAL_S`). With ``with_cdata``, returns ``(plan, plan.cdata())``.
    """
    entry = _pool_cals.get(id(pool))
    if entry is None or entry[0]() is not pool:
        entry = _pool_entry(pool)
    epoch = 0
    if entry[1] is not None:
        monitor = entry[1]
        monitor.loads()
        epoch = monitor.epoch
    key = (M, K, N, dtype, nbatch, id(pool), _get_limit(pool._handle) if pool is not None
           else 0, epoch, _generation, gp._forced_isa)
    hit = _hot.get(key)
    if hit is not None and hit[1]() is pool:
        return (hit[0], hit[2]) if with_cdata else hit[0]
    plan = plan_matmul(M, K, N, dtype, pool=pool, nbatch=nbatch)
    cdata = plan.cdata()
    with _plan_lock:
        if len(_hot) >= _PLANS_MAX:
            _hot.clear()
        _hot[key] = (plan, (lambda: None) if pool is None else weakref.ref(pool), cdata)
    return (plan, cdata) if with_cdata else plan


_get_limit = lib.asymo_pool_get_limit


def plan_expiry(pool):
    """Until when (`time.monotonic`) the plans `plan_for_matmul` gives for ``pool`` stay what
    they are: 0.0 when they depend on nothing but the shape, the pool's thread limit and what
    `clear_cache` resets; the end of the current load reading when the split is adjusted for
    the load; -1.0 when that cannot be said (no reading yet)."""
    entry = _pool_cals.get(id(pool))
    if entry is None or entry[0]() is not pool:
        entry = _pool_entry(pool)
    monitor = entry[1]
    if monitor is None:
        return 0.0
    until = monitor.next_window_at()
    if until is None or monitor._clock is not time.monotonic:
        return -1.0
    return float(until)


def _pool_entry(pool):
    """(weak reference to the pool, load monitor or None) for the lean cache."""
    _, topo, _ = _context(pool, None)
    cal = calibration_for(topo)
    monitor = (_monitor(cal.load_source)
               if cal is not None and topo.nclusters > 1 and _load_enabled() else None)
    key = id(pool)
    entry = ((lambda: None) if pool is None else weakref.ref(pool, _forget_pool(key)),
             monitor)
    with _plan_lock:
        _pool_cals[key] = entry
    return entry


def _forget_pool(key):
    """Weakref callback: drop a collected pool's entry (else one entry per pool ever made)."""
    def forget(ref):
        with _plan_lock:
            entry = _pool_cals.get(key)
            if entry is not None and entry[0] is ref:
                del _pool_cals[key]
    return forget


def _context(pool, topology):
    if pool is None and topology is None:
        try:
            from asymo.runtime.pool import get_pool
            pool = get_pool()
        except ImportError:  # pragma: no cover - a build without the pool
            pool = None
    if pool is not None:
        topo = pool.topology
        active = tuple(pool.active_workers_per_cluster())
    else:
        if topology is None:
            from asymo.hw.topology import detect
            topology = detect()
        topo = topology
        active = tuple(c.ncpus for c in topo.clusters)
    return pool, topo, active


def plan_matmul(M, K, N, dtype="float32", *, pool=None, nbatch=1, topology=None, load=None):
    """The partition plan asymo uses for ``(M, K) @ (K, N)`` (``nbatch`` of them).

    Parameters
    ----------
    M, K, N : int
        Shape of the product (numpy.matmul: A is M x K, B is K x N).
    dtype : "float32" or "float64" (or a NumPy dtype)
    pool : asymo.Pool, optional
        The pool the product runs on (default `asymo.get_pool()`): its clusters and active
        workers.
    nbatch : int
        Products in a batch (the GEMM may give whole products to tasks).
    topology : Topology, optional
        Plan for this topology without a pool (all its cpus active).
    load : bool, optional
        Adjust the split by the current per-cluster load (default: yes, unless env
        ``ASYMO_LOAD_ADJUST=0``).

    Returns
    -------
    PartitionPlan
        Split ratio, cluster ranges, per-cluster block sizes and task counts, predicted
        latency (seconds; None without a calibration), and the plan's source.

    Examples
    --------
    >>> import asymo
    >>> plan = asymo.plan_matmul(3136, 576, 64)          # doctest: +SKIP
    >>> plan.ratio, plan.blocks, plan.tasks, plan.predicted_s   # doctest: +SKIP
    """
    dname = gp._dtype_name(dtype)
    try:
        M, K, N, nbatch = (int(operator_index(v)) for v in (M, K, N, nbatch))
    except TypeError:
        raise TypeError(f"plan_matmul: M, K, N and nbatch must be integers, got "
                        f"{(M, K, N, nbatch)!r}") from None
    if min(M, K, N) < 0 or nbatch < 1:
        raise ValueError(f"plan_matmul: bad shape (M, K, N) = ({M}, {K}, {N}), "
                         f"nbatch={nbatch}")
    pool, topo, active = _context(pool, topology)
    cal = calibration_for(topo)
    isa = gp.best_isa()

    # the kind and split dimension the GEMM would choose
    base = gp.plan_gemm(M, K, N, dname, pool, nbatch=nbatch, isa=isa, topology=topo)
    kind_of_split = "mv" if base.kind == "mv" else "mm"
    if cal is None:
        weights = [c.capacity * a for c, a in zip(topo.clusters, active)]
        ratio = tuple(w / sum(weights) for w in weights) if sum(weights) > 0 else ()
        loads = ()
    else:
        caps = [c * a / cc.threads for c, a, cc in zip(cal.capability(kind_of_split), active,
                                                         cal.clusters)]
        if sum(caps) <= 0:
            caps = cal.capability(kind_of_split)
        if load is None:
            load = _load_enabled()
        loads = _current_loads(topo, cal.load_source) if load and topo.nclusters > 1 else None
        ratio = _quantise(adjust_split(caps, loads, [c.baseline_load for c in cal.clusters]))
        loads = tuple(loads) if loads is not None else ()
        if (topo.is_asymmetric and topo.nclusters > 1 and ratio and not base.serial
                and split_cost.fastest_only(base.flops, topo, kind_of_split, active=active,
                                            calibration=cal)):
            # the slower clusters' share saves less than their sync and tail cost
            ratio = (1.0,) + (0.0,) * (topo.nclusters - 1)

    key = (M, K, N, dname, nbatch, isa, topo.to_spec(), active, ratio, id(cal), id(pool))
    with _plan_lock:
        plan = _plans.get(key)
    if plan is not None:
        return plan
    plan = _make(M, K, N, dname, nbatch, isa, pool, topo, active, cal, base, ratio, loads)
    with _plan_lock:
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        _plans[key] = plan
    return plan


def operator_index(v):
    import operator
    if isinstance(v, bool):
        raise TypeError("bool is not a dimension")
    return operator.index(v)


def _make(M, K, N, dname, nbatch, isa, pool, topo, active, cal, base, ratio, loads):
    common = dict(nbatch=nbatch, isa=isa, topology=topo, kind=base.kind,
                  split_dim=base.split_dim)
    if cal is None:
        plan, source = base, "default"
        return _annotate(plan, ratio, None, (None,) * plan.nclusters, source, loads)
    if base.serial or base.serial_cpus:   # too small to split: runs in the calling thread
        return _annotate(base, ratio, None, (None,) * base.nclusters, "default", loads)
    split = [float(r) for r in ratio]
    plan = gp.plan_gemm(M, K, N, dname, pool, split=split, **common)
    tile_ok = cal.isa == isa and cal.dtype == dname and tuple(cal.tile) == gp.kernel_tile(
        isa, dname)
    if not tile_ok or plan.split_dim == "batch" or plan.kind == "outer" or min(M, K, N) == 0:
        return _annotate(plan, ratio, None, (None,) * plan.nclusters, "profile-split", loads)

    blocks, chunks, preds = list(plan.blocks), list(plan.chunks), []
    # at least two tasks per worker (costmodel.MIN_TASKS_PER_THREAD): with one, a lagging
    # core cannot be helped by stealing, nor an error in the split ratio absorbed
    for c, ((a, b), cc) in enumerate(zip(plan.cluster_ranges, cal.clusters)):
        part_m, part_n = (b - a, N) if plan.split_dim == "M" else (M, b - a)
        threads = max(1, active[c])
        if b <= a or active[c] == 0:
            preds.append(None)
            continue
        cands = cm.block_candidates(part_m, K, part_n, threads=threads, kind=plan.kind,
                                    min_i=cm.MIN_TASKS_PER_THREAD, **cc.cache)
        (mc, nc, kc), t = cm.choose_blocks(cc.model, part_m, K, part_n, threads=threads,
                                           kind=plan.kind, candidates=cands)
        if plan.kind == "mm":
            blocks[c] = (mc, nc, kc)
        else:  # the skinny path: a task is `chunk` elements of the split dimension
            chunks[c] = int(mc if plan.split_dim == "M" else nc)
        preds.append(max(float(t), 0.0))
    plan = dataclasses.replace(plan, blocks=tuple(blocks), chunks=tuple(chunks))
    return _annotate(plan, ratio, max((p for p in preds if p is not None), default=None),
                     tuple(preds), "profile", loads)


def _annotate(plan, ratio, predicted, cluster_predicted, source, loads):
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(gp.GemmPlan) if f.init}
    out = PartitionPlan(**fields, ratio=tuple(float(r) for r in ratio), tasks=(),
                        predicted_s=predicted, cluster_predicted_s=tuple(cluster_predicted),
                        source=source, loads=tuple(loads))
    tasks = out.task_counts() if min(plan.shape) > 0 else (0,) * plan.nclusters
    return dataclasses.replace(out, tasks=tuple(tasks))
