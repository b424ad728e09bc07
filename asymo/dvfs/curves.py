"""Energy-frequency curves: per cluster, time and power of a compute-bound and a memory-bound
micro-benchmark at each frequency (AsyMo section 5, "profiling of energy-frequency curves").

A curve stores, per frequency, the time per unit of work (seconds per flop for the compute
benchmark, per byte for the memory one) and the average power while it ran; energy per unit
is their product. Curves are either *measured* (``asymo calibrate --energy``: times measured,
energy from a meter -- or from the power model when no meter exists, which the curve records)
or *estimated* (``estimate_curves``: times from a roofline model, power from the power model;
see the ``DEFAULT_*`` constants). The profile section ``"energy"`` holds measured curves.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

__all__ = ["BenchCurve", "ClusterCurves", "CurveFormatError", "estimate_curves",
           "curves_to_section", "curves_from_section", "load_curves", "SECTION",
           "DEFAULT_FLOPS_PER_CYCLE", "DEFAULT_MEM_BANDWIDTH", "DEFAULT_MEM_FREQ_INSENSITIVE",
           "DEFAULT_MEM_ACTIVITY", "MV_REUSE_BOUND"]

SECTION = "energy"
FORMAT = "asymo-energy-curves"
VERSION = 1

#: Estimated curves: FP32 flops per cycle per core of the fastest cluster (a 128-bit FMA
#: pipe), times the cluster's capacity for slower clusters.
DEFAULT_FLOPS_PER_CYCLE = 8.0
#: Estimated curves: DRAM bandwidth (bytes/s) a whole cluster streams at its top frequency,
#: times its capacity.
DEFAULT_MEM_BANDWIDTH = 8e9
#: Estimated curves: fraction of memory-bound time that does not shrink with the core clock
#: (DRAM latency and bandwidth); the rest scales with 1/f.
DEFAULT_MEM_FREQ_INSENSITIVE = 0.6
#: Estimated curves: switching activity of cores stalled on memory, relative to compute.
DEFAULT_MEM_ACTIVITY = 0.5
#: AsyMo Eq. 2: matrix-vector products reuse each element at most twice.
MV_REUSE_BOUND = 2.0


class CurveFormatError(ValueError):
    """The stored energy curves are malformed."""


def _interp(xs, ys, x):
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if xs[i] >= x:
            x0, x1 = xs[i - 1], xs[i]
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)
    return ys[-1]  # pragma: no cover


@dataclass(frozen=True)
class BenchCurve:
    """Time per unit of work and power over frequency for one micro-benchmark.

    ``unit`` is ``"flop"`` (compute) or ``"byte"`` (memory); ``reuse`` is the benchmark's
    data reuse rate (AsyMo Eq. 2; None for the in-cache compute kernel, whose reuse is
    unbounded). ``measured_time`` / ``measured_energy`` say what was measured;
    ``energy_source`` names the meter or the power model.
    """

    kind: str
    freqs_khz: tuple
    time_per_unit_s: tuple
    power_w: tuple
    unit: str
    reuse: float = None
    measured_time: bool = False
    measured_energy: bool = False
    energy_source: str = ""

    def __post_init__(self):
        n = len(self.freqs_khz)
        if n == 0:
            raise CurveFormatError(f"{self.kind} curve has no points")
        if len(self.time_per_unit_s) != n or len(self.power_w) != n:
            raise CurveFormatError(f"{self.kind} curve: {n} frequencies but "
                                   f"{len(self.time_per_unit_s)} times and "
                                   f"{len(self.power_w)} powers")
        if list(self.freqs_khz) != sorted(set(self.freqs_khz)):
            raise CurveFormatError(f"{self.kind} curve: frequencies must be strictly "
                                   "ascending")
        for t, p in zip(self.time_per_unit_s, self.power_w):
            if not (math.isfinite(t) and t > 0 and math.isfinite(p) and p >= 0):
                raise CurveFormatError(f"{self.kind} curve: times must be > 0 and powers >= 0 "
                                       f"and finite (got {t}, {p})")
        if min(self.freqs_khz) <= 0:
            raise CurveFormatError(f"{self.kind} curve: frequencies must be > 0 kHz")
        if self.reuse is not None and not (math.isfinite(self.reuse) and self.reuse > 0):
            raise CurveFormatError(f"{self.kind} curve: reuse must be > 0 and finite, got "
                                   f"{self.reuse}")

    @property
    def fmax_khz(self):
        return self.freqs_khz[-1]

    @property
    def energy_per_unit_j(self):
        return tuple(t * p for t, p in zip(self.time_per_unit_s, self.power_w))

    def time_at(self, khz):
        """Seconds per unit at ``khz`` (linear between measured points, clamped)."""
        return _interp(self.freqs_khz, self.time_per_unit_s, khz)

    def power_at(self, khz):
        return _interp(self.freqs_khz, self.power_w, khz)

    def energy_at(self, khz):
        return self.time_at(khz) * self.power_at(khz)

    def relative_time(self, khz):
        """Time at ``khz`` relative to the top frequency of the curve."""
        return self.time_at(khz) / self.time_at(self.fmax_khz)

    def to_dict(self):
        return {"kind": self.kind, "freqs_khz": list(self.freqs_khz),
                "time_per_unit_s": list(self.time_per_unit_s), "power_w": list(self.power_w),
                "unit": self.unit, "reuse": self.reuse, "measured_time": self.measured_time,
                "measured_energy": self.measured_energy, "energy_source": self.energy_source}

    @classmethod
    def from_dict(cls, d):
        try:
            return cls(kind=str(d["kind"]), freqs_khz=tuple(int(f) for f in d["freqs_khz"]),
                       time_per_unit_s=tuple(float(t) for t in d["time_per_unit_s"]),
                       power_w=tuple(float(p) for p in d["power_w"]), unit=str(d["unit"]),
                       reuse=None if d.get("reuse") is None else float(d["reuse"]),
                       measured_time=bool(d.get("measured_time", False)),
                       measured_energy=bool(d.get("measured_energy", False)),
                       energy_source=str(d.get("energy_source", "")))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # (int(inf))
            if isinstance(exc, CurveFormatError):
                raise
            raise CurveFormatError(f"malformed benchmark curve: {exc!r}") from None


@dataclass(frozen=True)
class ClusterCurves:
    """The compute-bound and memory-bound curves of one cluster."""

    cluster: str
    cpus: tuple
    compute: BenchCurve
    memory: BenchCurve
    itemsize: int = 4

    def __post_init__(self):
        # (the bytes of an element: a matmul's traffic is elements x itemsize)
        if self.itemsize not in (1, 2, 4, 8, 16):
            raise CurveFormatError(f"cluster {self.cluster!r}: itemsize must be 1, 2, 4, 8 or "
                                   f"16 bytes, got {self.itemsize}")

    @property
    def source(self):
        """``"measured"``, ``"measured time, estimated energy"`` or ``"estimate"``."""
        curves = (self.compute, self.memory)
        if all(c.measured_time and c.measured_energy for c in curves):
            return "measured"
        if all(c.measured_time for c in curves):
            return "measured time, estimated energy"
        return "estimate"

    @property
    def estimated(self):
        return self.source != "measured"

    @property
    def freqs_khz(self):
        """Frequencies both curves cover (ascending)."""
        lo = max(self.compute.freqs_khz[0], self.memory.freqs_khz[0])
        hi = min(self.compute.fmax_khz, self.memory.fmax_khz)
        return tuple(sorted({f for f in self.compute.freqs_khz + self.memory.freqs_khz
                             if lo <= f <= hi}))

    @property
    def fmax_khz(self):
        return min(self.compute.fmax_khz, self.memory.fmax_khz)

    @property
    def peak_flops(self):
        """Compute throughput of the whole cluster at its top frequency (flop/s)."""
        return 1.0 / self.compute.time_at(self.fmax_khz)

    @property
    def peak_bytes(self):
        """Memory throughput of the whole cluster at its top frequency (bytes/s)."""
        return 1.0 / self.memory.time_at(self.fmax_khz)

    @property
    def ridge_reuse(self):
        """Roofline ridge point in AsyMo's reuse units (flops per element accessed): ops with
        a higher reuse are compute bound on this cluster."""
        return self.peak_flops / (self.peak_bytes / self.itemsize)

    @property
    def memory_reuse(self):
        return self.memory.reuse if self.memory.reuse else MV_REUSE_BOUND

    def to_dict(self):
        return {"cluster": self.cluster, "cpus": list(self.cpus), "itemsize": self.itemsize,
                "compute": self.compute.to_dict(), "memory": self.memory.to_dict()}

    @classmethod
    def from_dict(cls, d):
        try:
            return cls(cluster=str(d["cluster"]), cpus=tuple(int(c) for c in d["cpus"]),
                       compute=BenchCurve.from_dict(d["compute"]),
                       memory=BenchCurve.from_dict(d["memory"]),
                       itemsize=int(d.get("itemsize", 4)))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # (int(inf))
            if isinstance(exc, CurveFormatError):
                raise
            raise CurveFormatError(f"malformed cluster curves: {exc!r}") from None


def estimate_curves(topology, power_model, *, freqs=None,
                    flops_per_cycle=DEFAULT_FLOPS_PER_CYCLE,
                    mem_bandwidth=DEFAULT_MEM_BANDWIDTH,
                    mem_freq_insensitive=DEFAULT_MEM_FREQ_INSENSITIVE,
                    mem_activity=DEFAULT_MEM_ACTIVITY):
    """Estimated curves for every cluster (no measurement involved).

    compute: time per flop ``1 / (ncpus * flops_per_cycle * capacity * f)``, power
    ``P_static + ncpus * C V^2 f``. memory: time per byte
    ``(a + (1 - a) * fmax / f) / (mem_bandwidth * capacity)`` with
    ``a = mem_freq_insensitive``, power ``P_static + ncpus * mem_activity * C V^2 f``.

    Parameters
    ----------
    freqs : dict or None
        ``{cluster name: kHz list}``; default the power model's operating points.
    """
    out = {}
    for cl in topology.clusters:
        cp = power_model[cl.name]
        fl = sorted(set(int(f) for f in (freqs or {}).get(cl.name, ()) or cp.freqs_khz))
        if len(fl) == 1 and len(cp.freqs_khz) > 1:
            fl = list(cp.freqs_khz)
        fmax = fl[-1]
        flops = [cl.ncpus * flops_per_cycle * cl.capacity * f * 1e3 for f in fl]
        bw = mem_bandwidth * cl.capacity
        a = mem_freq_insensitive
        src = power_model.source
        compute = BenchCurve("compute", tuple(fl), tuple(1.0 / x for x in flops),
                             tuple(cp.power_w(f) for f in fl), "flop", None, False, False, src)
        memory = BenchCurve("memory", tuple(fl),
                            tuple((a + (1 - a) * fmax / f) / bw for f in fl),
                            tuple(cp.power_w(f, activity=mem_activity) for f in fl), "byte",
                            MV_REUSE_BOUND, False, False, src)
        out[cl.name] = ClusterCurves(cl.name, tuple(cl.cpus), compute, memory)
    return out


def curves_to_section(curves, *, meter=None, notes=()):
    """The profile section (plain JSON data) holding ``{name: ClusterCurves}``."""
    return {"format": FORMAT, "version": VERSION,
            "meter": dict(meter or {}), "notes": list(notes),
            "clusters": {name: c.to_dict() for name, c in curves.items()}}


def curves_from_section(section, topology=None):
    """Parse a profile section; with ``topology``, keep only clusters whose name and cpus
    match it. Raises CurveFormatError when the section is malformed."""
    if not isinstance(section, dict) or section.get("format") != FORMAT:
        raise CurveFormatError("not an asymo energy-curves section")
    if section.get("version") != VERSION:
        raise CurveFormatError(f"energy curves version {section.get('version')!r}, this asymo "
                               f"reads {VERSION}")
    clusters = section.get("clusters")
    if not isinstance(clusters, dict):
        raise CurveFormatError("energy curves section has no clusters")
    out = {name: ClusterCurves.from_dict(d) for name, d in clusters.items()}
    if topology is not None:
        want = {c.name: tuple(c.cpus) for c in topology.clusters}
        out = {n: c for n, c in out.items() if want.get(n) == tuple(c.cpus)}
    return out


def load_curves(topology, profile=None):
    """Measured curves from ``profile`` (default: the active profile), ``{}`` if none.

    A malformed section gives a warning and ``{}`` (callers fall back to estimates).
    """
    if profile is None:
        try:
            from asymo.profile import active_profile
            profile = active_profile(topology)
        except Exception as exc:  # noqa: BLE001 - a broken profile must not break inference
            warnings.warn(f"cannot load the calibration profile ({exc}); using estimated "
                          "energy curves", RuntimeWarning, stacklevel=2)
            return {}
    if profile is None:
        return {}
    section = profile.sections.get(SECTION) if hasattr(profile, "sections") else None
    if section is None:
        return {}
    try:
        return curves_from_section(section, topology)
    except CurveFormatError as exc:
        from asymo.profile import ProfileWarning
        warnings.warn(f"energy curves in profile {getattr(profile, 'path', '')} are unusable "
                      f"({exc}); using estimated curves (re-run `asymo calibrate --energy`)",
                      ProfileWarning, stacklevel=2)
        return {}
