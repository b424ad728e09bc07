"""What cores the CPU has, how they group into clusters, and what each cluster can do.

Every hardware fact asymo uses comes through this module so that every code path can be
tested on a machine that lacks the hardware: ``detect`` takes a ``sysfs_root`` and an explicit
``override``.

Override format (argument or env ``ASYMO_TOPOLOGY``), clusters fastest first::

    big:0-3@1.0,little:4-7@0.45

Each item is ``[name:]cpulist@capacity`` where cpulist uses the kernel's list syntax with
``+`` or ``;`` between ranges inside a cluster (``0-1+4-5``) because ``,`` separates clusters;
capacity is relative to the fastest cluster (1.0). Names default to ``c0``, ``c1`` ...
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Optional

__all__ = [
    "Cache", "Cluster", "Topology", "TopologyError", "detect", "parse_spec",
    "parse_cpulist", "format_cpulist",
]

ENV_VAR = "ASYMO_TOPOLOGY"


class TopologyError(ValueError):
    """A topology description (override string or JSON) is malformed."""


@dataclass(frozen=True)
class Cache:
    """One cache level as seen by a cluster."""

    level: int
    size: int  # bytes
    shared_cpus: tuple = ()
    line_size: int = 64

    def to_dict(self):
        return {"level": self.level, "size": self.size,
                "shared_cpus": list(self.shared_cpus), "line_size": self.line_size}

    @classmethod
    def from_dict(cls, d):
        return cls(level=int(d["level"]), size=int(d["size"]),
                   shared_cpus=tuple(int(c) for c in d.get("shared_cpus", ())),
                   line_size=int(d.get("line_size", 64)))


@dataclass(frozen=True)
class Cluster:
    """A group of identical cores; ``capacity`` is relative to the fastest cluster (1.0)."""

    name: str
    cpus: tuple
    capacity: float = 1.0
    l1d: Optional[Cache] = None
    l2: Optional[Cache] = None
    l3: Optional[Cache] = None
    min_freq_khz: Optional[int] = None
    max_freq_khz: Optional[int] = None
    available_freqs_khz: tuple = ()
    cpufreq_policy: Optional[str] = None

    @property
    def ncpus(self):
        return len(self.cpus)

    def to_dict(self):
        d = {"name": self.name, "cpus": list(self.cpus), "capacity": self.capacity}
        for lvl in ("l1d", "l2", "l3"):
            c = getattr(self, lvl)
            d[lvl] = c.to_dict() if c is not None else None
        d.update(min_freq_khz=self.min_freq_khz, max_freq_khz=self.max_freq_khz,
                 available_freqs_khz=list(self.available_freqs_khz),
                 cpufreq_policy=self.cpufreq_policy)
        return d

    @classmethod
    def from_dict(cls, d):
        caches = {lvl: (Cache.from_dict(d[lvl]) if d.get(lvl) else None)
                  for lvl in ("l1d", "l2", "l3")}
        return cls(name=str(d["name"]), cpus=tuple(int(c) for c in d["cpus"]),
                   capacity=float(d.get("capacity", 1.0)),
                   min_freq_khz=d.get("min_freq_khz"), max_freq_khz=d.get("max_freq_khz"),
                   available_freqs_khz=tuple(int(f) for f in d.get("available_freqs_khz", ())),
                   cpufreq_policy=d.get("cpufreq_policy"), **caches)


@dataclass(frozen=True)
class Topology:
    """Clusters ordered fastest first.

    ``source`` says which description answered (``override``, ``intel_hybrid``,
    ``cpu_capacity``, ``cpufreq``, ``single``); ``emulated`` maps cpu -> speed for cores the
    asymmetry emulator slowed (empty on real hardware).
    """

    clusters: tuple
    source: str = "single"
    emulated: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.clusters:
            raise TopologyError("a topology needs at least one cluster")
        seen = set()
        for c in self.clusters:
            if not c.cpus:
                raise TopologyError(f"cluster {c.name!r} has no cpus")
            dup = seen.intersection(c.cpus)
            if dup:
                raise TopologyError(f"cpu {sorted(dup)[0]} appears in two clusters")
            seen.update(c.cpus)
            if not (0 < c.capacity <= 1.0 + 1e-9):
                raise TopologyError(
                    f"cluster {c.name!r} has capacity {c.capacity}; capacities are relative "
                    "to the fastest cluster and must lie in (0, 1]")

    @property
    def cpus(self):
        """All cpu ids, fastest cluster first."""
        return tuple(cpu for c in self.clusters for cpu in c.cpus)

    @property
    def ncpus(self):
        return len(self.cpus)

    @property
    def nclusters(self):
        return len(self.clusters)

    @property
    def is_asymmetric(self):
        return len({round(c.capacity, 6) for c in self.clusters}) > 1

    def cluster_of(self, cpu):
        """Index of the cluster that holds ``cpu``."""
        for i, c in enumerate(self.clusters):
            if cpu in c.cpus:
                return i
        raise KeyError(f"cpu {cpu} is not in this topology")

    def to_spec(self):
        """The override string that reproduces the clusters (not the caches)."""
        return ",".join(f"{c.name}:{format_cpulist(c.cpus, sep='+')}@{c.capacity:g}"
                        for c in self.clusters)

    def to_dict(self):
        return {"source": self.source,
                "emulated": {str(k): v for k, v in sorted(self.emulated.items())},
                "clusters": [c.to_dict() for c in self.clusters]}

    @classmethod
    def from_dict(cls, d):
        return cls(clusters=tuple(Cluster.from_dict(c) for c in d["clusters"]),
                   source=str(d.get("source", "override")),
                   emulated={int(k): float(v) for k, v in d.get("emulated", {}).items()})

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_cpulist(text, sep=","):
    """Parse the kernel's cpu list syntax (``0-3,6,8-9``) into a sorted tuple.

    Raises ``ValueError`` on anything else (an empty string gives an empty tuple).
    """
    text = text.strip()
    if not text:
        return ()
    cpus = set()
    for part in re.split(rf"[{re.escape(sep)}]", text):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad cpu list item {part!r} in {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"bad cpu range {part!r} in {text!r}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus, sep=","):
    """Inverse of ``parse_cpulist``: ``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return sep.join(out)


def parse_spec(spec):
    """Parse an override string (see module docstring) into a Topology (source ``override``).

    Clusters are re-ordered fastest first; capacities are normalised so the fastest is 1.0.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise TopologyError("empty topology spec; expected e.g. 'big:0-3@1.0,little:4-7@0.45'")
    clusters = []
    for i, item in enumerate(spec.split(",")):
        item = item.strip()
        name, _, rest = item.rpartition(":")
        name = name.strip() or f"c{i}"
        cpus_text, at, cap_text = rest.partition("@")
        try:
            cpus = parse_cpulist(cpus_text.replace(";", "+"), sep="+")
        except ValueError as exc:
            raise TopologyError(f"topology spec {spec!r}: {exc}") from None
        if not cpus:
            raise TopologyError(f"topology spec {spec!r}: cluster {name!r} has no cpus")
        try:
            capacity = float(cap_text) if at else 1.0
        except ValueError:
            raise TopologyError(
                f"topology spec {spec!r}: capacity {cap_text!r} of {name!r} is not a number"
            ) from None
        if not capacity > 0 or capacity != capacity or capacity == float("inf"):
            raise TopologyError(f"topology spec {spec!r}: capacity of {name!r} must be > 0")
        clusters.append((name, cpus, capacity))
    top = max(c[2] for c in clusters)
    clusters.sort(key=lambda c: -c[2])
    return Topology(clusters=tuple(Cluster(name=n, cpus=c, capacity=cap / top)
                                   for n, c, cap in clusters), source="override")


def _affinity():
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return set(range(os.cpu_count() or 1))


def detect(sysfs_root="/sys", override=None):
    """Describe the CPU: clusters fastest first, capacities, caches and frequencies.

    Parameters
    ----------
    sysfs_root : str
        Root of the sysfs tree to read. Anything but ``"/sys"`` describes another machine
        (a fixture, a copied tree): then no affinity filtering is applied.
    override : str, Topology or None
        Explicit description; when None, env ``ASYMO_TOPOLOGY`` is consulted.

    Returns
    -------
    Topology
    """
    if override is None:
        override = os.environ.get(ENV_VAR) or None
    if isinstance(override, Topology):
        return override
    if override is not None:
        return parse_spec(override)
    live = os.path.realpath(sysfs_root) == "/sys"
    # Minimal source until the sysfs readers land: one cluster of the usable cpus.
    cpus = tuple(sorted(_affinity())) if live else (0,)
    return Topology(clusters=(Cluster(name="c0", cpus=cpus, capacity=1.0),), source="single")
