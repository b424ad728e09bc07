"""What cores the CPU has, how they group into clusters, and what each cluster can do.

Every hardware fact asymo uses comes through this module so that every code path can be
tested on a machine that lacks the hardware: ``detect`` takes a ``sysfs_root`` and an explicit
``override``.

A *cluster* is a set of identical cores: one measured rate describes all of them. Where cpufreq
groups cpus into frequency domains of several cpus, a cluster never spans two domains, so one
frequency decision also describes it (RK3588's two A76 pairs are two clusters); one policy
per cpu (intel_pstate, amd-pstate) leaves identical cores in one cluster. Clusters are ordered
fastest first and each carries a ``capacity`` relative to the fastest (1.0).

Sources ``detect`` consults, the first that answers wins:

1. an explicit override: the ``override`` argument, else (live system only) env
   ``ASYMO_TOPOLOGY``;
2. Intel hybrid PMUs: ``devices/cpu_core/cpus``, ``cpu_atom/cpus``, ``cpu_lowpower/cpus``
   (P, E and LP-E cores; SMT siblings stay with their core type);
3. ``cpuN/cpu_capacity`` when the values differ (arm64, riscv);
4. cpufreq policies grouped by frequency (``base_frequency`` or ``acpi_cppc/nominal_freq``
   when every cpu has one, so Turbo Boost Max's favoured cores do not form a cluster of their
   own; ``cpuinfo_max_freq`` otherwise) when that gives more than one cluster;
5. one cluster of every cpu.

Override format, clusters separated by ``,``::

    big:0-3@1.0,little:4-7@0.45

Each item is ``[name:]cpulist[@capacity]``. The cpulist uses the kernel's list syntax with
``+`` (or ``;``) between ranges inside a cluster (``0-1+4-5``), because ``,`` separates
clusters. Capacity defaults to 1.0; capacities are normalised so the fastest cluster has 1.0
and clusters are re-ordered fastest first. Names default to ``c0``, ``c1`` ... On the live
system the caches and frequencies of an override's cpus are read from sysfs.

Emulation (set by ``asymo.lab.emulate``): env ``ASYMO_EMULATED="cpu:speed[,cpu:speed]"`` (e.g.
``1:0.5``) names the cores the asymmetry emulator slows; on the live system ``detect`` puts it
into ``Topology.emulated``.
"""
from __future__ import annotations

import dataclasses
import numbers
import os
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Optional

from asymo.hw.sysfs import (HYBRID_PMUS, MAX_CPU, SysfsError, SysfsReader, format_cpulist,
                          parse_cpulist)

__all__ = [
    "Cache", "Cluster", "Topology", "TopologyError", "TopologyWarning", "detect",
    "parse_spec", "parse_emulated", "parse_cpulist", "format_cpulist",
]

ENV_VAR = "ASYMO_TOPOLOGY"
EMULATED_ENV_VAR = "ASYMO_EMULATED"
# The sysfs root whose cpus this process runs on; any other root describes another machine.
LIVE_SYSFS = "/sys"

class TopologyError(ValueError):
    """A topology description (override string, JSON, sysfs root) is unusable."""


class TopologyWarning(UserWarning):
    """Part of the CPU description was malformed or missing; a fallback was used."""


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
    """A group of identical cores; ``capacity`` is relative to the fastest cluster (1.0).

    ``l1d``, ``l2`` and ``l3`` are the caches as the cluster's first cpu sees them
    (``shared_cpus`` says which cpus share each). Frequencies are in kHz.
    ``cpufreq_policies`` lists every cpufreq policy directory covering the cluster;
    ``cpufreq_policy`` is that directory when there is exactly one (a true frequency domain),
    else None (e.g. intel_pstate's one policy per cpu).
    """

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
    cpufreq_policies: tuple = ()

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
                 cpufreq_policy=self.cpufreq_policy,
                 cpufreq_policies=list(self.cpufreq_policies))
        return d

    @classmethod
    def from_dict(cls, d):
        caches = {lvl: (Cache.from_dict(d[lvl]) if d.get(lvl) else None)
                  for lvl in ("l1d", "l2", "l3")}
        return cls(name=str(d["name"]), cpus=tuple(int(c) for c in d["cpus"]),
                   capacity=float(d.get("capacity", 1.0)),
                   min_freq_khz=d.get("min_freq_khz"), max_freq_khz=d.get("max_freq_khz"),
                   available_freqs_khz=tuple(int(f) for f in d.get("available_freqs_khz", ())),
                   cpufreq_policy=d.get("cpufreq_policy"),
                   cpufreq_policies=tuple(str(p) for p in d.get("cpufreq_policies", ())),
                   **caches)


@dataclass(frozen=True)
class Topology:
    """Clusters ordered fastest first.

    ``source`` says which description grouped the cpus (``override``, ``intel_hybrid``,
    ``cpu_capacity``, ``cpufreq``, ``single``); ``capacity_basis`` says where the capacities
    come from (``override``, ``cpu_capacity``, ``base_frequency``, ``nominal_freq``,
    ``max_frequency``, ``equal``, ``unknown``: frequency ratios are estimates, calibration
    measures the real rates); ``emulated`` maps cpu -> speed for cores the asymmetry emulator
    slowed (empty on real hardware).
    """

    clusters: tuple
    source: str = "single"
    emulated: dict = field(default_factory=dict)
    capacity_basis: str = "equal"

    def __post_init__(self):
        if not self.clusters:
            raise TopologyError("a topology needs at least one cluster")
        seen = set()
        for c in self.clusters:
            if not c.cpus:
                raise TopologyError(f"cluster {c.name!r} has no cpus")
            for cpu in c.cpus:
                # (Linux numbers cpus below its NR_CPUS, at most 8192)
                if not isinstance(cpu, numbers.Integral) or isinstance(cpu, bool) or \
                        not 0 <= cpu < MAX_CPU:
                    raise TopologyError(f"cluster {c.name!r}: cpu {cpu!r} is not a cpu number "
                                        f"in [0, {MAX_CPU})")
            if len(set(c.cpus)) != len(c.cpus):
                raise TopologyError(f"cluster {c.name!r} lists a cpu twice: {list(c.cpus)}")
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
                "capacity_basis": self.capacity_basis,
                "emulated": {str(k): v for k, v in sorted(self.emulated.items())},
                "clusters": [c.to_dict() for c in self.clusters]}

    @classmethod
    def from_dict(cls, d):
        return cls(clusters=tuple(Cluster.from_dict(c) for c in d["clusters"]),
                   source=str(d.get("source", "override")),
                   emulated={int(k): float(v) for k, v in d.get("emulated", {}).items()},
                   capacity_basis=str(d.get("capacity_basis", "equal")))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def cpu_model_name(proc_cpuinfo="/proc/cpuinfo"):
    """The CPU's model name from ``/proc/cpuinfo`` (or the platform's guess)."""
    try:
        with open(proc_cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "CPU part"):
                    return value.strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown"


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
        if any(name == c[0] for c in clusters):
            raise TopologyError(f"topology spec {spec!r}: cluster name {name!r} is used twice")
        clusters.append((name, cpus, capacity))
    top = max(c[2] for c in clusters)
    clusters.sort(key=lambda c: -c[2])
    return Topology(clusters=tuple(Cluster(name=n, cpus=c, capacity=cap / top)
                                   for n, c, cap in clusters),
                    source="override", capacity_basis="override")




def parse_emulated(text):
    """Parse ``ASYMO_EMULATED`` (``"cpu:speed[,cpu:speed]"``) into ``({cpu: speed}, problems)``.

    Items that do not parse, or whose speed is outside (0, 1], are left out and described in
    ``problems`` (a list of strings) rather than raised: the emulator sets this variable, and a
    broken value must not stop a program from running.
    """
    emulated, problems = {}, []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        cpu_text, sep, speed_text = item.partition(":")
        try:
            cpu, speed = int(cpu_text), float(speed_text)
        except ValueError:
            problems.append(f"{item!r} is not cpu:speed (e.g. 1:0.5)")
            continue
        if not sep or cpu < 0 or not 0.0 < speed <= 1.0:
            problems.append(f"{item!r}: need a cpu id >= 0 and a speed in (0, 1]")
            continue
        if cpu in emulated:
            problems.append(f"cpu {cpu} is listed twice; using {speed:g}")
        emulated[cpu] = speed
    return emulated, problems


# ---------------------------------------------------------------------------- detection
#
# A source looks at sysfs and returns groups of cpus with a raw speed score each, or None when
# it does not apply; SysfsError means its files are malformed and the next source is tried.


@dataclass
class _Group:
    cpus: tuple
    score: float
    kind: str = ""  # Intel core type (cpu_core / cpu_atom / cpu_lowpower), else ""


_HYBRID_NAMES = {"cpu_core": "P", "cpu_atom": "E", "cpu_lowpower": "LP-E"}
_LEVEL_NAMES = {2: ("big", "little"), 3: ("big", "mid", "little")}


class _Detection:
    """One ``detect`` call: the reader, the cpus in use, facts read once, warnings."""

    def __init__(self, reader, cpus):
        self.reader = reader
        self.cpus = tuple(cpus)
        self.warnings = []
        self._policies = None
        self._policies_error = None
        self._caches_warned = False

    def warn(self, message):
        if message not in self.warnings:
            self.warnings.append(message)

    def policies(self):
        """cpufreq policies (raises SysfsError once malformed, every time asked)."""
        if self._policies is None and self._policies_error is None:
            try:
                self._policies = self.reader.cpufreq_policies()
            except SysfsError as exc:
                self._policies_error = exc
        if self._policies_error is not None:
            raise self._policies_error
        return self._policies

    def policies_or_none(self):
        """cpufreq policies, or None (with a warning) when they are malformed."""
        try:
            return self.policies()
        except SysfsError as exc:
            if not any(str(exc) in w for w in self.warnings):  # said once is enough
                self.warn(f"cpufreq: {exc}; frequencies are left unknown")
            return None

    def freq_scores(self, cpus):
        """``({cpu: kHz}, basis)``: each cpu's frequency for telling core types apart.

        ``base_frequency`` or the ACPI CPPC nominal frequency when every cpu has one:
        Turbo Boost Max gives two or so favoured cores of one type a higher maximum, so
        grouping by ``cpuinfo_max_freq`` would split identical cores. Else the maximum.
        Returns None when there is no cpufreq; raises SysfsError when it does not cover cpus.
        """
        policies = self.policies()
        if not policies:
            return None
        owner = {cpu: p for p in policies for cpu in p.cpus}
        uncovered = [cpu for cpu in cpus if cpu not in owner]
        if uncovered:
            raise SysfsError(f"cpu{uncovered[0]} belongs to no cpufreq policy")
        if all(owner[cpu].base_khz for cpu in cpus):
            return {cpu: owner[cpu].base_khz for cpu in cpus}, "base_frequency"
        nominal = {cpu: self.reader.nominal_freq_khz(cpu) for cpu in cpus}
        if all(nominal.values()):
            return nominal, "nominal_freq"
        return {cpu: owner[cpu].max_khz for cpu in cpus}, "max_frequency"

    def cache_entries(self, cpu):
        try:
            return self.reader.caches(cpu)
        except SysfsError as exc:
            if not self._caches_warned:
                self._caches_warned = True
                self.warn(f"caches: {exc}; cache sizes are left unknown")
            return []


def _from_hybrid(d):
    pmus = d.reader.hybrid_pmus()
    if not pmus:
        return None
    owner = {}
    for pmu, cpus in pmus.items():
        for cpu in cpus:
            if cpu in owner:
                raise SysfsError(f"devices/{pmu}/cpus: cpu{cpu} is also in {owner[cpu]}")
            owner[cpu] = pmu
    orphans = [cpu for cpu in d.cpus if cpu not in owner]
    if orphans:
        raise SysfsError(f"devices/{{{','.join(pmus)}}}/cpus: cpu{orphans[0]} belongs to no "
                         "core type")
    kinds = [(pmu, tuple(c for c in d.cpus if owner[c] == pmu))
             for pmu in HYBRID_PMUS if pmu in pmus]
    kinds = [(pmu, cpus) for pmu, cpus in kinds if cpus]

    # The PMUs say which cores are alike, not how fast each type is: take that from the
    # kernel's capacities when they tell the types apart, else from frequencies.
    def by_kind(per_cpu, reduce):
        return [reduce([per_cpu[c] for c in cpus]) for _, cpus in kinds]

    try:
        caps = d.reader.cpu_capacities(d.cpus)
    except SysfsError as exc:
        d.warn(f"cpu_capacity: {exc}; not used")
        caps = None
    scores, basis = None, None
    if caps is not None:
        scores = by_kind(caps, statistics.fmean)
        basis = "cpu_capacity"
        if len(set(scores)) == 1 and len(kinds) > 1:
            scores = None
    if scores is None:
        try:
            freqs = d.freq_scores(d.cpus)
        except SysfsError as exc:
            d.warn(f"{exc}; not used for core speeds")
            freqs = None
        if freqs is not None:
            scores, basis = by_kind(freqs[0], statistics.median), freqs[1]
    if scores is None:
        scores, basis = [1.0] * len(kinds), "unknown" if len(kinds) > 1 else "equal"
        if len(kinds) > 1:
            d.warn("Intel hybrid CPU: neither cpu_capacity nor cpufreq tells how fast each "
                   "core type is; all get capacity 1.0 until calibration measures them")
    groups = [_Group(cpus, score, kind=pmu) for (pmu, cpus), score in zip(kinds, scores)]
    return groups, basis


def _from_capacity(d):
    caps = d.reader.cpu_capacities(d.cpus)
    if caps is None or len(set(caps.values())) == 1:
        return None
    values = sorted(set(caps.values()), reverse=True)
    return [_Group(tuple(c for c in d.cpus if caps[c] == v), float(v)) for v in values], \
        "cpu_capacity"


def _from_cpufreq(d):
    freqs = d.freq_scores(d.cpus)
    if freqs is None:
        return None
    per_cpu, basis = freqs
    values = sorted(set(per_cpu.values()), reverse=True)
    return [_Group(tuple(c for c in d.cpus if per_cpu[c] == v), float(v))
            for v in values], basis


_SOURCES = (("intel_hybrid", _from_hybrid), ("cpu_capacity", _from_capacity),
            ("cpufreq", _from_cpufreq))


def _split_by_domain(groups, policies):
    """Split a group of identical cores that spans several multi-cpu frequency domains.

    On an RK3588 the four A76 cores are two cpufreq policies of two; each pair is binned and
    clocked on its own, so each is a cluster. One policy per cpu (intel_pstate, acpi-cpufreq)
    is not a domain structure and leaves the group whole.
    """
    if not policies:
        return groups
    out = []
    for g in groups:
        doms = {}
        for p in policies:
            inside = tuple(c for c in g.cpus if c in p.cpus)
            if inside:
                doms[p.name] = inside
        covered = sum(len(v) for v in doms.values()) == len(g.cpus)
        if len(doms) > 1 and covered and all(len(v) >= 2 for v in doms.values()):
            out.extend(_Group(cpus, g.score, g.kind)
                       for cpus in sorted(doms.values(), key=lambda cpus: cpus[0]))
        else:
            out.append(g)
    return out


def _pick_caches(entries):
    """``{"l1d": Cache, "l2": Cache, "l3": Cache}`` from one cpu's cache entries."""
    picked = {}
    for e in entries:
        key = {1: "l1d", 2: "l2", 3: "l3"}.get(e.level)
        if key is None or e.type == "Instruction" or key in picked:
            continue
        picked[key] = Cache(level=e.level, size=e.size, shared_cpus=e.shared_cpus,
                            line_size=e.line_size or 64)
    return picked


def _cluster_details(d, cpus, policies):
    """Caches and frequencies of the cluster made of ``cpus`` (keyword arguments of Cluster)."""
    details = _pick_caches(d.cache_entries(cpus[0]))
    mine = [p for p in policies or () if set(p.cpus) & set(cpus)]
    if mine:
        mins = [p.min_khz for p in mine if p.min_khz is not None]
        avail = sorted({f for p in mine for f in p.available_khz})
        details.update(
            min_freq_khz=min(mins) if mins else None,
            max_freq_khz=max(p.max_khz for p in mine),
            available_freqs_khz=tuple(avail),
            cpufreq_policy=mine[0].path if len(mine) == 1 else None,
            cpufreq_policies=tuple(p.path for p in mine))
    return details


def _name_clusters(groups, capacities):
    """Names: P/E/LP-E on Intel hybrids, else big/little or big/mid/little, else c0, c1 ...

    Several clusters at one capacity (RK3588's two A76 pairs) are numbered: big0, big1.
    """
    if all(g.kind for g in groups):
        names = [_HYBRID_NAMES[g.kind] for g in groups]
    else:
        levels = sorted({round(c, 6) for c in capacities}, reverse=True)
        level_names = _LEVEL_NAMES.get(len(levels))
        if level_names is None or len(level_names) == 1:
            return [f"c{i}" for i in range(len(groups))]
        names = [level_names[levels.index(round(c, 6))] for c in capacities]
    out, seen = [], {}
    for n in names:
        if names.count(n) > 1:
            seen[n] = seen.get(n, -1) + 1
            out.append(f"{n}{seen[n]}")
        else:
            out.append(n)
    return out


def _build(d, groups, source, basis, policies):
    """A Topology from raw groups: capacities normalised, fastest first, details filled."""
    top = max(g.score for g in groups)
    # Ties (capacity unknown on a hybrid, RK3588's A76 pairs): core type, then cpu id.
    rank = {pmu: i for i, pmu in enumerate(HYBRID_PMUS)}
    order = sorted(groups, key=lambda g: (-g.score, rank.get(g.kind, 0), g.cpus[0]))
    capacities = [g.score / top for g in order]
    names = _name_clusters(order, capacities)
    clusters = tuple(Cluster(name=name, cpus=g.cpus, capacity=cap,
                             **_cluster_details(d, g.cpus, policies))
                     for name, g, cap in zip(names, order, capacities))
    return Topology(clusters=clusters, source=source, capacity_basis=basis)


def _usable_cpus(reader, allowed, root, warn):
    """Cpus to describe: online ones, and on the live system only those in the affinity mask."""
    try:
        online = reader.online_cpus()
    except SysfsError as exc:
        warn(f"{exc}; using the cpuN directories")
        online = None
    if online is None:
        online = reader.cpu_dirs()
    if allowed is None:
        if not online:
            raise TopologyError(f"{root}: describes no cpu (no devices/system/cpu/online, no "
                                "cpuN directories); is it a sysfs tree?")
        return tuple(online)
    usable = tuple(sorted(set(online) & allowed))
    if not usable:
        if online:
            warn(f"no online cpu in sysfs is in this process's affinity mask "
                 f"{format_cpulist(allowed)}; using the affinity mask")
        usable = tuple(sorted(allowed))
    return usable


def _restrict_override(topology, allowed, warn):
    """Drop an override's cpus that this process may not run on; renormalise capacities."""
    if allowed is None:
        return topology
    dropped = sorted(set(topology.cpus) - allowed)
    if not dropped:
        return topology
    kept = [(c, tuple(cpu for cpu in c.cpus if cpu in allowed)) for c in topology.clusters]
    kept = [(c, cpus) for c, cpus in kept if cpus]
    if not kept:
        raise TopologyError(f"topology override {topology.to_spec()!r} names no cpu in this "
                            f"process's affinity mask {format_cpulist(allowed)}")
    warn(f"topology override: cpus {format_cpulist(dropped)} are outside this process's "
         f"affinity mask {format_cpulist(allowed)} and are not used")
    top = max(c.capacity for c, _ in kept)
    return topology.replace(clusters=tuple(
        dataclasses.replace(c, cpus=cpus, capacity=c.capacity / top) for c, cpus in kept))


def _affinity():
    """The cpus the process may run on: its main thread's mask, not the calling thread's (a
    pipeline stage or a pool worker is pinned to one core, and the default pool it may build
    serves the whole process)."""
    try:
        return set(os.sched_getaffinity(os.getpid()))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return set(range(os.cpu_count() or 1))


def _is_live(root):
    return os.path.realpath(root) == os.path.realpath(LIVE_SYSFS)


def detect(sysfs_root="/sys", override=None):
    """Describe the CPU: clusters fastest first, capacities, caches and frequencies.

    Parameters
    ----------
    sysfs_root : str or path
        Root of the sysfs tree to read. The live ``/sys`` describes this machine: only cpus
        in ``os.sched_getaffinity(0)`` are used, and env ``ASYMO_TOPOLOGY`` /
        ``ASYMO_EMULATED`` apply. Any other root describes another machine (a fixture, a
        copied tree): all its online cpus are used and the environment is ignored.
    override : str, Topology or None
        Explicit description (see the module docstring for the string format). A string's
        clusters get caches and frequencies from ``sysfs_root``; a Topology is returned as
        is. When None, env ``ASYMO_TOPOLOGY`` is consulted on the live system.

    Returns
    -------
    Topology

    Raises
    ------
    TopologyError
        The override (argument or environment) is malformed or names no usable cpu, or
        ``sysfs_root`` is not a directory describing cpus.

    Warns
    -----
    TopologyWarning
        A sysfs source was malformed or partial and the next one was used; caches or
        frequencies could not be read; ``ASYMO_EMULATED`` held items that were ignored.
    """
    if isinstance(override, Topology):
        return override
    root = os.fspath(sysfs_root)
    live = _is_live(root)
    if not live and not os.path.isdir(root):
        raise TopologyError(f"sysfs root {root!r} is not a directory")
    reader = SysfsReader(root)
    allowed = _affinity() if live else None
    messages = []

    def warn(message):
        if message not in messages:
            messages.append(message)

    if override is None and live and os.environ.get(ENV_VAR, "").strip():
        try:
            override = parse_spec(os.environ[ENV_VAR])
        except TopologyError as exc:
            raise TopologyError(f"environment variable {ENV_VAR}: {exc}") from None
    elif isinstance(override, str):
        override = parse_spec(override)
    elif override is not None:
        raise TypeError(f"override must be a str, a Topology or None, not "
                        f"{type(override).__name__}")

    if override is not None:
        topology = _restrict_override(override, allowed, warn)
        d = _Detection(reader, topology.cpus)
        policies = d.policies_or_none()
        topology = topology.replace(clusters=tuple(
            dataclasses.replace(c, **_cluster_details(d, c.cpus, policies))
            for c in topology.clusters))
    else:
        d = _Detection(reader, _usable_cpus(reader, allowed, root, warn))
        topology = None
        for source, find in _SOURCES:
            try:
                found = find(d)
            except SysfsError as exc:
                d.warn(f"{source}: {exc}; trying the next source")
                continue
            if found is None:
                continue
            groups, basis = found
            policies = d.policies_or_none()
            groups = _split_by_domain(groups, policies)
            if len(groups) > 1 or source == "intel_hybrid":
                topology = _build(d, groups, source, basis, policies)
                break
        if topology is None:
            topology = _build(d, [_Group(d.cpus, 1.0)], "single", "equal",
                              d.policies_or_none())
    for m in d.warnings:
        warn(m)

    if live:
        emulated, problems = parse_emulated(os.environ.get(EMULATED_ENV_VAR, ""))
        for p in problems:
            warn(f"{EMULATED_ENV_VAR}: {p}; ignored")
        for cpu in sorted(set(emulated) - set(topology.cpus)):
            warn(f"{EMULATED_ENV_VAR}: cpu {cpu} is not in the topology; ignored")
            del emulated[cpu]
        if emulated:
            topology = topology.replace(emulated=emulated)

    for m in messages:
        warnings.warn(f"asymo.hw.topology: {m}", TopologyWarning, stacklevel=2)
    return topology
