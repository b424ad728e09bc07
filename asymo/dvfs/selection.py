"""Least-energy frequency selection from data reuse (AsyMo sections 4.4 and 5).

AsyMo's rule: the least-energy frequency of a model is decided by its data reuse rate
(operational intensity). For a matmul ``(M, K) x (K, N)`` (Eq. 2)::

    reuse = 2MNK / (MK + NK + 2MN) = 2 / (1/N + 1/M + 2/K)

so a matrix-vector product (M or N = 1) reuses data at most twice (memory bound) and a
matrix-matrix product up to about its smallest dimension (compute bound). Each cluster has two
offline energy-frequency curves, one for a compute-bound and one for a memory-bound
micro-benchmark; the model's curve is read between them by its reuse, and the frequency with
the least energy on it is chosen.

How asymo reads "between them" (the paper picks one of the two curves; asymo interpolates so
mixed models get a mixed answer, which reduces to the paper's rule at the ends):

* per op, the time at the top frequency is estimated with the cluster's roofline
  ``max(2MNK / peak_flops, itemsize * (MK + NK + 2MN) / peak_bytes)``; the model's reuse
  (reported) is the time-weighted mean of its ops' reuse over its MM / MV ops;
* an op's compute share ``w_i`` is 0 at or below the memory benchmark's reuse (about 2, an
  MV), 1 at or above the cluster's ridge point (``peak_flops / peak_elements``), and
  log-linear in between; the model's compute share ``w`` is the time-weighted mean of the
  ``w_i`` (so a model that spends 70% of its time in MVs is 70% memory-bound, however high
  the reuse of its convolutions);
* the model's time and energy at frequency f are then ``T(fmax) * [w * tc(f) + (1-w) * tm(f)]``
  and ``T(fmax) * [w * tc(f) Pc(f) + (1-w) * tm(f) Pm(f)]`` -- exactly the sum over its ops of
  the same expression with ``w_i`` -- with ``tc, tm`` the two curves' times relative to their
  top frequency and ``Pc, Pm`` their powers; the least-energy frequency minimises the
  latter.

Like the paper (which fixes the little Cortex-A53 cluster of the Kirin 970 at its highest
frequency: lowering it saves only 7% power there), the slowest cluster stays at its maximum
by default; ``fixed_at_max`` changes that. Modes: ``"latency"`` (every cluster at its
maximum, the paper's latency-first) and ``"energy"`` (energy-first).
"""
from __future__ import annotations

import errno
import math
import numbers
import warnings
from dataclasses import dataclass, field

from asymo.dvfs.curves import MV_REUSE_BOUND, estimate_curves, load_curves

__all__ = ["data_reuse", "op_kind", "as_shapes", "ReuseSummary", "model_reuse",
           "compute_weight", "ClusterPrediction", "predict_cluster", "least_energy_frequency",
           "FrequencyReport", "FrequencyPlan", "frequency_plan", "plan_frequencies",
           "DvfsWarning", "DEFAULT_RIDGE_REUSE", "MODES"]

#: Ridge point (flops per element) used when no curves give one: about the Kirin 970 big
#: cluster's (8.8 GFLOP/s over 4.6 GB/s of float32).
DEFAULT_RIDGE_REUSE = 8.0
MODES = {"latency": "latency", "latency-first": "latency", "energy": "energy",
         "energy-first": "energy"}


class DvfsWarning(UserWarning):
    """A frequency plan could not be applied as asked (it ran at the system's frequencies)."""


def _check_dim(x, name):
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"matmul dimension {name} must be an integer, got {x!r}")
    if x < 1:
        raise ValueError(f"matmul dimension {name} must be >= 1, got {x}")
    return int(x)


def data_reuse(M, K, N):
    """AsyMo Eq. 2: ``2MNK / (MK + NK + 2MN)`` for ``(M, K) @ (K, N)``."""
    M, K, N = _check_dim(M, "M"), _check_dim(K, "K"), _check_dim(N, "N")
    return 2.0 * M * N * K / (M * K + N * K + 2.0 * M * N)


def op_kind(M, K, N):
    """``"mv"`` (M or N is 1), ``"outer"`` (K is 1) or ``"mm"``."""
    if min(M, N) == 1:
        return "mv"
    if K == 1:
        return "outer"
    return "mm"


def as_shapes(ops_or_model):
    """Matmul shapes ``[(M, K, N), ...]`` from a model (anything with ``matmul_shapes()``)
    or an iterable of 3-tuples."""
    src = ops_or_model
    if hasattr(src, "matmul_shapes") and callable(src.matmul_shapes):
        src = src.matmul_shapes()
    if isinstance(src, (str, bytes)) or not hasattr(src, "__iter__"):
        raise TypeError("ops_or_model must be a model with matmul_shapes() or a list of "
                        f"(M, K, N) tuples, got {type(ops_or_model).__name__}")
    shapes = []
    for i, s in enumerate(src):
        try:
            m, k, n = s
        except (TypeError, ValueError):
            raise ValueError(f"op {i}: expected an (M, K, N) matmul shape, got {s!r}") from None
        try:
            shapes.append((_check_dim(_int(m), "M"), _check_dim(_int(k), "K"),
                           _check_dim(_int(n), "N")))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"op {i} {s!r}: {exc}") from None
    if not shapes:
        raise ValueError("no matmul shapes: the model has no MM / MV ops to plan for")
    return shapes


def _int(x):
    if hasattr(x, "item") and not isinstance(x, numbers.Integral):
        x = x.item()  # numpy scalars
    return x


@dataclass(frozen=True)
class ReuseSummary:
    """Data reuse of a model: the time-weighted mean and how it was made."""

    reuse: float
    n_ops: int
    n_mm: int
    n_mv: int
    mv_time_share: float
    ridge_reuse: float
    time_s: float  # estimated time of all ops at the top frequency on this roofline
    flops: float
    compute_share: float  # time-weighted mean of the ops' compute weights

    def to_dict(self):
        return dict(self.__dict__)


def model_reuse(ops_or_model, *, peak_flops=None, peak_bytes=None, itemsize=4,
                ridge_reuse=None, memory_reuse=MV_REUSE_BOUND):
    """Time-weighted data reuse of a model's MM / MV ops (AsyMo Eq. 2 per op).

    Op times come from the roofline ``max(flops / peak_flops, bytes / peak_bytes)``; give
    ``peak_flops`` and ``peak_bytes`` (a cluster's), or only ``ridge_reuse`` (then times are in
    arbitrary units and ``time_s`` is relative).
    """
    shapes = as_shapes(ops_or_model)
    if peak_flops is None or peak_bytes is None:
        ridge = DEFAULT_RIDGE_REUSE if ridge_reuse is None else float(ridge_reuse)
        peak_flops, peak_bytes = ridge, float(itemsize)  # time in units of 1/peak
    ridge = peak_flops / (peak_bytes / itemsize)
    total_t = wsum = mv_t = flops = csum = 0.0
    n_mm = n_mv = 0
    for m, k, n in shapes:
        f = 2.0 * m * n * k
        elems = m * k + n * k + 2.0 * m * n
        t = max(f / peak_flops, elems * itemsize / peak_bytes)
        r = f / elems
        total_t += t
        wsum += t * r
        csum += t * compute_weight(r, memory_reuse, ridge)
        flops += f
        if op_kind(m, k, n) == "mm":
            n_mm += 1
        else:
            n_mv += 1
            mv_t += t
    return ReuseSummary(reuse=wsum / total_t, n_ops=len(shapes), n_mm=n_mm, n_mv=n_mv,
                        mv_time_share=mv_t / total_t, ridge_reuse=ridge, time_s=total_t,
                        flops=flops, compute_share=csum / total_t)


def compute_weight(reuse, memory_reuse=MV_REUSE_BOUND, ridge_reuse=DEFAULT_RIDGE_REUSE):
    """Share of the compute-bound curve for a given reuse: 0 at or below ``memory_reuse``,
    1 at or above ``ridge_reuse``, log-linear between."""
    if not reuse > 0:
        raise ValueError(f"reuse must be > 0, got {reuse}")
    if ridge_reuse <= memory_reuse:
        return 1.0 if reuse > memory_reuse else 0.0
    w = math.log(reuse / memory_reuse) / math.log(ridge_reuse / memory_reuse)
    return min(1.0, max(0.0, w))


@dataclass(frozen=True)
class ClusterPrediction:
    """Predicted time and energy of the whole model run on one cluster, per frequency."""

    cluster: str
    reuse: float
    weight: float  # compute share w
    time_fmax_s: float
    freqs_khz: tuple
    time_s: tuple
    energy_j: tuple

    def at(self, khz):
        i = self.freqs_khz.index(khz)
        return self.time_s[i], self.energy_j[i]


def predict_cluster(curves, shapes, freqs_khz=None):
    """Time and energy of running all ``shapes`` on one cluster at each frequency."""
    summary = model_reuse(shapes, peak_flops=curves.peak_flops, peak_bytes=curves.peak_bytes,
                          itemsize=curves.itemsize, memory_reuse=curves.memory_reuse)
    w = summary.compute_share
    freqs = tuple(sorted(set(freqs_khz))) if freqs_khz else curves.freqs_khz
    c, m = curves.compute, curves.memory
    times, energies = [], []
    for f in freqs:
        tc, tm = c.relative_time(f), m.relative_time(f)
        times.append(summary.time_s * (w * tc + (1 - w) * tm))
        energies.append(summary.time_s * (w * tc * c.power_at(f)
                                          + (1 - w) * tm * m.power_at(f)))
    return ClusterPrediction(curves.cluster, summary.reuse, w, summary.time_s, freqs,
                             tuple(times), tuple(energies))


def least_energy_frequency(prediction, tolerance=0.0):
    """The frequency with the least predicted energy; with ``tolerance`` > 0, the fastest
    frequency whose energy is within that fraction of the least (measurement noise)."""
    e_min = min(prediction.energy_j)
    ok = [f for f, e in zip(prediction.freqs_khz, prediction.energy_j)
          if e <= e_min * (1 + tolerance) + 1e-300]
    return max(ok) if tolerance > 0 else prediction.freqs_khz[prediction.energy_j.index(e_min)]


@dataclass
class FrequencyReport:
    """Plain data: chosen frequencies and predicted time and energy of both modes."""

    mode: str
    model: str
    n_ops: int
    clusters: list
    predicted: dict
    estimated: bool
    notes: list = field(default_factory=list)
    applied: bool = False
    applied_reason: str = "not applied yet: use the plan as a context manager"

    @property
    def frequencies(self):
        """``{cluster: kHz}`` of the chosen mode."""
        return {c["name"]: c["target_khz"] for c in self.clusters}

    def to_dict(self):
        return {"mode": self.mode, "model": self.model, "n_ops": self.n_ops,
                "clusters": [dict(c) for c in self.clusters],
                "predicted": {k: dict(v) for k, v in self.predicted.items()},
                "estimated": self.estimated, "notes": list(self.notes),
                "applied": self.applied, "applied_reason": self.applied_reason}

    def __str__(self):
        tag = "ESTIMATED" if self.estimated else "measured curves"
        lines = [f"frequency plan: {self.mode}-first for {self.model} ({self.n_ops} MM/MV ops)"
                 f"  [{tag}]"]
        lines.append(f"  {'cluster':<9}{'reuse':>8}{'compute':>9}{'latency-first':>15}"
                     f"{'energy-first':>14}  curves")
        for c in self.clusters:
            fixed = " (fixed at max)" if c["fixed_at_max"] else ""
            lines.append(f"  {c['name']:<9}{c['reuse']:>8.2f}{c['compute_weight']:>9.2f}"
                         f"{_mhz(c['latency_khz']):>15}{_mhz(c['energy_khz']):>14}  "
                         f"{c['curve_source']}{fixed}")
        lat, en = self.predicted["latency"], self.predicted["energy"]
        word = "estimated" if self.estimated else "predicted"
        lines.append("  (reuse: AsyMo Eq. 2, time-weighted; compute: time share on the "
                     "compute-bound curve)")
        lines.append(f"  {word} (whole model, clusters sharing the work):")
        lines.append(f"    {'':<16}{'latency-first':>15}{'energy-first':>14}")
        lines.append(f"    {'time':<16}{_ms(lat['time_s']):>15}{_ms(en['time_s']):>14}")
        lines.append(f"    {'energy':<16}{_mj(lat['energy_j']):>15}{_mj(en['energy_j']):>14}")
        if lat["energy_j"] > 0:
            lines.append(f"    energy-first: time x{en['time_s'] / lat['time_s']:.3f}, "
                         f"energy x{en['energy_j'] / lat['energy_j']:.3f} of latency-first")
        lines.append(f"  applied: {'yes' if self.applied else 'no'}"
                     + (f" ({self.applied_reason})" if self.applied_reason else ""))
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _mhz(khz):
    return "-" if khz is None else f"{khz / 1000:.0f} MHz"


def _ms(s):
    return f"{s * 1e3:.3g} ms"


def _mj(j):
    return f"{j * 1e3:.3g} mJ"


def _joint(preds, freqs):
    """Clusters share each op in proportion to their speed, so the model takes
    ``1 / sum(1 / T_c)``; every cluster draws its power for that long."""
    rate = power = 0.0
    for name, p in preds.items():
        t, e = p.at(freqs[name])
        rate += 1.0 / t
        power += e / t
    t = 1.0 / rate
    return {"time_s": t, "energy_j": t * power, "power_w": power}


def plan_frequencies(ops_or_model, mode="energy", *, topology, curves, available=None,
                     fixed_at_max=None, tolerance=0.0):
    """Choose per-cluster frequencies (no system access; see ``frequency_plan``).

    Parameters
    ----------
    curves : dict
        ``{cluster name: ClusterCurves}`` for every cluster of ``topology``.
    available : dict or None
        ``{cluster name: kHz list}`` settable frequencies (default: the curves' points);
        only those within the curves' range are considered for energy-first.
    fixed_at_max : iterable or None
        Clusters (names or indices) kept at their maximum in energy-first mode. Default: the
        slowest cluster when there are several (as in the paper), none otherwise.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
    mode = MODES[mode]
    shapes = as_shapes(ops_or_model)
    names = [c.name for c in topology.clusters]
    missing = [n for n in names if n not in curves]
    if missing:
        raise ValueError(f"no energy curves for clusters {missing}")
    if fixed_at_max is None:
        fixed = {topology.clusters[-1].name} if topology.nclusters > 1 else set()
    else:
        fixed = set()
        for f in fixed_at_max:
            if isinstance(f, numbers.Integral) and not isinstance(f, bool):
                fixed.add(names[f])
            elif f in names:
                fixed.add(f)
            else:
                raise ValueError(f"fixed_at_max: no cluster {f!r}; clusters are {names}")
    notes = []
    preds, rows = {}, []
    lat_f, en_f = {}, {}
    for cl in topology.clusters:
        cv = curves[cl.name]
        avail = sorted(set(int(f) for f in (available or {}).get(cl.name, ()) or ()))
        fmax = avail[-1] if avail else cv.fmax_khz
        lo, hi = cv.freqs_khz[0], cv.fmax_khz
        cand = [f for f in avail if lo <= f <= hi] if avail else list(cv.freqs_khz)
        if avail and len(cand) < len(avail):
            notes.append(f"{cl.name}: {len(avail) - len(cand)} available frequencies lie "
                         f"outside the curves' range {lo}-{hi} kHz and were not considered")
        if not cand:
            cand = [min(max(fmax, lo), hi)]
        pred = predict_cluster(cv, shapes, sorted(set(cand) | {min(max(fmax, lo), hi)}))
        preds[cl.name] = pred
        lat = min(max(fmax, lo), hi)
        best = lat if cl.name in fixed else least_energy_frequency(
            _restrict(pred, cand), tolerance)
        lat_f[cl.name], en_f[cl.name] = lat, best
        energy_khz = fmax if cl.name in fixed else best
        rows.append({"name": cl.name, "cpus": list(cl.cpus), "reuse": pred.reuse,
                     "compute_weight": pred.weight, "latency_khz": fmax,
                     "energy_khz": energy_khz,
                     "target_khz": fmax if mode == "latency" else energy_khz,
                     "fixed_at_max": cl.name in fixed, "curve_source": cv.source,
                     "energy_source": cv.compute.energy_source,
                     "ridge_reuse": cv.ridge_reuse})
        if fmax > hi:
            notes.append(f"{cl.name}: the curves stop at {hi} kHz, below the maximum {fmax} "
                         "kHz; predictions at the maximum use the curves' last point")
    predicted = {"latency": _joint(preds, lat_f), "energy": _joint(preds, en_f)}
    estimated = any(curves[n].estimated for n in names)
    if estimated:
        notes.append("curves are estimated (power model and roofline defaults), not measured:"
                     " run `asymo calibrate --energy` where frequencies can be set")
    name = getattr(ops_or_model, "name", None) or f"{len(shapes)} matmul shapes"
    return FrequencyReport(mode=mode, model=str(name), n_ops=len(shapes), clusters=rows,
                           predicted=predicted, estimated=estimated, notes=notes)


def _restrict(pred, freqs):
    keep = [i for i, f in enumerate(pred.freqs_khz) if f in set(freqs)]
    return ClusterPrediction(pred.cluster, pred.reuse, pred.weight, pred.time_fmax_s,
                             tuple(pred.freqs_khz[i] for i in keep),
                             tuple(pred.time_s[i] for i in keep),
                             tuple(pred.energy_j[i] for i in keep))


class FrequencyPlan:
    """Chosen frequencies for a model, applied while used as a context manager.

    Made by ``asymo.frequency_plan``; ``report`` holds the choice and the predictions.
    """

    def __init__(self, report, cpufreq, *, owns_cpufreq=False, strict=False):
        self.report = report
        self.cpufreq = cpufreq
        self._owns = owns_cpufreq
        self.strict = strict
        self._change = None

    @property
    def mode(self):
        return self.report.mode

    @property
    def frequencies(self):
        return self.report.frequencies

    def apply(self):
        """Set the frequencies (those that can be set; see ``report.applied_reason``)."""
        from asymo.dvfs.cpufreq import CpuFreqError
        cf = self.cpufreq
        if cf is None:
            self._not_applied("no cpufreq access")
            return self
        settable, reasons = {}, []
        for name, khz in self.frequencies.items():
            info = cf.info(name)
            if info.method is None:
                reasons.append(f"{name}: {info.reason}")
            else:
                settable[name] = khz
        if reasons and self.strict:
            raise CpuFreqError(errno.ENODEV, "cannot apply the frequency plan: "
                               + "; ".join(reasons))
        if not settable:
            self._not_applied("; ".join(reasons))
            return self
        settable = self._merge_shared_policies(cf, settable)
        try:
            self._change = cf.set_frequencies(settable, nearest=True)
        except (CpuFreqError, ValueError) as exc:
            if self.strict:
                raise
            self._not_applied(str(exc))
            return self
        self.report.applied = True
        self.report.applied_reason = ("" if not reasons else
                                      "partly: " + "; ".join(reasons))
        if reasons:
            warnings.warn("frequency plan applied only in part: " + "; ".join(reasons),
                          DvfsWarning, stacklevel=3)
        return self

    def _merge_shared_policies(self, cf, targets):
        """Clusters driven by one cpufreq policy (e.g. an emulated split of a symmetric CPU)
        can only run at one frequency: give them the highest of their targets, and say so."""
        owner = {}
        for name in targets:
            for info in cf.policies(name):
                owner.setdefault(info.path, []).append(name)
        out = dict(targets)
        for path, names in owner.items():
            if len(set(names)) > 1 and len({out[n] for n in names}) > 1:
                top = max(out[n] for n in names)
                for n in names:
                    out[n] = top
                self.report.notes.append(
                    f"clusters {sorted(set(names))} share cpufreq policy {path}: all set to "
                    f"{top // 1000} MHz, the highest of their targets")
        for row in self.report.clusters:
            row["applied_khz"] = out.get(row["name"])
        return out

    def _not_applied(self, why):
        self.report.applied = False
        self.report.applied_reason = why
        warnings.warn(f"frequency plan not applied, running at the system's frequencies: {why}",
                      DvfsWarning, stacklevel=4)

    def restore(self):
        """Undo what ``apply`` set (and everything, if the plan made its own CpuFreq)."""
        try:
            if self._change is not None:
                self._change.undo()
                self._change = None
        finally:
            if self._owns and self.cpufreq is not None:
                self.cpufreq.restore()

    def __enter__(self):
        return self.apply()

    def __exit__(self, *exc):
        self.restore()
        return False

    def __repr__(self):
        return (f"FrequencyPlan(mode={self.mode!r}, frequencies={self.frequencies}, "
                f"estimated={self.report.estimated}, applied={self.report.applied})")


def frequency_plan(ops_or_model, mode="energy", cpufreq=None, *, topology=None, profile=None,
                   curves=None, power_model=None, fixed_at_max=None, tolerance=0.0,
                   strict=False, sysfs_root="/sys"):
    """Plan (and, as a context manager, apply) CPU frequencies for a model.

    ::

        with asymo.frequency_plan(model, mode="energy") as plan:
            model.run(images)
        print(plan.report)

    Parameters
    ----------
    ops_or_model : model or list of (M, K, N)
        Anything with ``matmul_shapes()`` (the asymo zoo), or the shapes themselves.
    mode : {"energy", "latency"}
        ``"latency"`` (latency-first): every cluster at its maximum frequency.
        ``"energy"`` (energy-first): each cluster at its least-energy frequency for this
        model's data reuse, the slowest cluster at its maximum (see ``fixed_at_max``).
    cpufreq : CpuFreq or None
        Where to apply; default a ``CpuFreq`` on the live system (restored on exit).
    topology : Topology or None
        Default ``cpufreq.topology`` or ``asymo.hw.topology.detect()``.
    profile : Profile or None
        Where measured curves come from (default: the active calibration profile).
    curves : dict or None
        ``{cluster name: ClusterCurves}`` to use instead of the profile's.
    power_model : PowerModel or None
        For estimated curves of clusters without measured ones (default:
        ``PowerModel.from_system``).
    fixed_at_max : iterable or None
        Clusters kept at maximum frequency in energy-first mode (default: the slowest).
    tolerance : float
        Take the fastest frequency within this fraction of the least energy.
    strict : bool
        Raise ``CpuFreqError`` when the frequencies cannot be set, instead of warning
        (``DvfsWarning``) and running at the system's frequencies.

    Returns
    -------
    FrequencyPlan
        ``.report`` (a ``FrequencyReport``: print it, or ``.to_dict()``) is available at once.
    """
    from asymo.dvfs.cpufreq import CpuFreq
    from asymo.dvfs.power_model import PowerModel

    owns = False
    if cpufreq is None:
        cpufreq = CpuFreq(topology, sysfs_root=sysfs_root)
        owns = True
    if topology is not None and [c.name for c in topology.clusters] != \
            [c.name for c in cpufreq.topology.clusters]:
        raise ValueError("topology and cpufreq.topology name different clusters: "
                         f"{[c.name for c in topology.clusters]} vs "
                         f"{[c.name for c in cpufreq.topology.clusters]}")
    topology = topology or cpufreq.topology
    available = {}
    for c in topology.clusters:
        try:
            freqs = cpufreq.available_frequencies(c.name)
        except (KeyError, OSError):
            freqs = ()
        available[c.name] = list(freqs)
    unknown = [n for n, f in available.items() if not f]
    chosen = dict(curves) if curves else load_curves(topology, profile)
    missing = [c.name for c in topology.clusters if c.name not in chosen]
    if missing:
        if power_model is None:
            power_model = PowerModel.from_system(topology, cpufreq.sysfs_root, cpufreq=cpufreq)
        est = estimate_curves(topology, power_model, freqs=available)
        for n in missing:
            chosen[n] = est[n]
    report = plan_frequencies(ops_or_model, mode, topology=topology, curves=chosen,
                              available=available, fixed_at_max=fixed_at_max,
                              tolerance=tolerance)
    for n in unknown:
        lo, hi = chosen[n].freqs_khz[0], chosen[n].fmax_khz
        report.notes.append(f"{n}: no cpufreq frequencies known on this system; the plan "
                            f"uses the curves' range {lo // 1000}-{hi // 1000} MHz")
    return FrequencyPlan(report, cpufreq, owns_cpufreq=owns, strict=strict)
