"""CPU power model ``P = P_static + C * V^2 * f`` per cluster, for estimating energy where no
power meter exists. Everything it produces is an *estimate* and is labelled so.

Voltages per frequency (operating performance points, OPPs) come from the first source that
answers, per cluster:

1. a table the caller supplies: ``{cluster name: {kHz: volts}}``;
2. the kernel's OPP debugfs (root only, debugfs mounted):
   ``<sysfs_root>/kernel/debug/opp/cpuN/opp:<Hz>/`` with ``rate_hz`` and
   ``supply-0/u_volt_target`` (kernels >= 4.11) or ``u_volt_target`` (older), in uV;
3. the devicetree the kernel booted with: ``<sysfs_root>/devices/system/cpu/cpuN/of_node``
   -> ``operating-points-v2`` (a phandle) -> the ``opp-table`` node with that ``phandle`` ->
   children with ``opp-hz`` (big-endian u64, Hz) and ``opp-microvolt`` (big-endian u32, uV;
   the first cell is the target), skipping ``status = "disabled"``; or the legacy
   ``operating-points`` property (u32 pairs ``<kHz uV>``);
4. documented defaults: V rises linearly from ``DEFAULT_V_MIN`` at the lowest to
   ``DEFAULT_V_MAX`` at the highest frequency.

The switched capacitance ``C`` (per core) comes from the devicetree's
``dynamic-power-coefficient`` (the value the kernel's Energy Model uses: uW / MHz / V^2, so
``C = coefficient * 1e-12`` farad) or, by default, from ``DEFAULT_CORE_DYNAMIC_W`` (dynamic
power of one busy core at its top frequency, scaled by the cluster's capacity).
``P_static`` per cluster defaults to ``DEFAULT_STATIC_W_PER_CORE`` times its core count.
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from asymo.hw.files import read_regular_file
from asymo.hw.sysfs import ATTRIBUTE_BYTES, read_attribute

__all__ = ["ClusterPower", "PowerModel", "read_opp_table", "DEFAULT_V_MIN", "DEFAULT_V_MAX",
           "DEFAULT_CORE_DYNAMIC_W", "DEFAULT_STATIC_W_PER_CORE", "DEFAULT_MIN_FREQ_FRACTION",
           "DEFAULT_MAX_FREQ_KHZ"]

#: Default core voltage (V) at the lowest and highest frequency of a cluster when no OPP table
#: is available: the usual span of mobile and desktop DVFS ranges.
DEFAULT_V_MIN = 0.70
DEFAULT_V_MAX = 1.05
#: Default dynamic power (W) of one fully busy core of the fastest cluster at its top
#: frequency; slower clusters get this times their capacity squared (little cores are both
#: slower and narrower).
DEFAULT_CORE_DYNAMIC_W = 1.5
#: Default static (leakage + uncore share) power per core, W.
DEFAULT_STATIC_W_PER_CORE = 0.1
#: Where no frequency range is known: the lowest frequency as a fraction of the highest, and
#: the highest itself.
DEFAULT_MIN_FREQ_FRACTION = 0.4
DEFAULT_MAX_FREQ_KHZ = 2_000_000


@dataclass(frozen=True)
class ClusterPower:
    """Power model of one cluster.

    ``opp`` is a tuple of ``(kHz, volts)`` ascending; ``c_eff`` the switched capacitance of
    one core (F); ``voltage_source`` names where the voltages came from.
    """

    name: str
    ncpus: int
    p_static_w: float
    c_eff: float
    opp: tuple
    voltage_source: str
    capacitance_source: str

    def __post_init__(self):
        if not self.opp:
            raise ValueError(f"power model of cluster {self.name!r} has no operating points")
        if self.c_eff <= 0 or self.p_static_w < 0:
            raise ValueError(f"power model of cluster {self.name!r}: C must be > 0 and "
                             "P_static >= 0")

    @property
    def freqs_khz(self):
        return tuple(f for f, _ in self.opp)

    def voltage(self, khz):
        """Voltage at ``khz``: the OPP's, interpolated linearly between OPPs (clamped)."""
        pts = self.opp
        if khz <= pts[0][0]:
            return pts[0][1]
        if khz >= pts[-1][0]:
            return pts[-1][1]
        for (f0, v0), (f1, v1) in zip(pts, pts[1:]):
            if f0 <= khz <= f1:
                return v0 + (v1 - v0) * (khz - f0) / (f1 - f0)
        return pts[-1][1]  # pragma: no cover - unreachable for sorted points

    def core_dynamic_w(self, khz, activity=1.0):
        """Dynamic power of one core: ``activity * C * V^2 * f``."""
        v = self.voltage(khz)
        return activity * self.c_eff * v * v * khz * 1e3

    def power_w(self, khz, busy_cores=None, activity=1.0):
        """Cluster power with ``busy_cores`` (default all) cores busy at ``khz``."""
        n = self.ncpus if busy_cores is None else busy_cores
        return self.p_static_w + n * self.core_dynamic_w(khz, activity)

    def to_dict(self):
        return {"name": self.name, "ncpus": self.ncpus, "p_static_w": self.p_static_w,
                "c_eff": self.c_eff, "opp": [list(p) for p in self.opp],
                "voltage_source": self.voltage_source,
                "capacitance_source": self.capacitance_source}


class PowerModel:
    """``P = P_static + C * V^2 * f`` for every cluster of a topology (an estimate).

    Build it with ``PowerModel.from_system(topology, sysfs_root, opp_tables=...)``, or
    directly from ``ClusterPower`` objects.
    """

    measured = False

    def __init__(self, clusters):
        self.clusters = {c.name: c for c in clusters}
        if not self.clusters:
            raise ValueError("a power model needs at least one cluster")

    def __getitem__(self, name):
        try:
            return self.clusters[name]
        except KeyError:
            raise KeyError(f"power model has no cluster {name!r}; it has "
                           f"{list(self.clusters)}") from None

    @property
    def source(self):
        kinds = sorted({c.voltage_source.split(":")[0] for c in self.clusters.values()})
        return "estimate:power-model(voltages: " + ",".join(kinds) + ")"

    def to_dict(self):
        return {"source": self.source, "measured": False,
                "clusters": {n: c.to_dict() for n, c in self.clusters.items()}}

    @classmethod
    def from_system(cls, topology=None, sysfs_root="/sys", *, opp_tables=None, cpufreq=None,
                    static_w_per_core=DEFAULT_STATIC_W_PER_CORE,
                    core_dynamic_w=DEFAULT_CORE_DYNAMIC_W):
        """Build the model from what the system describes (see module docstring for order).

        Parameters
        ----------
        topology : Topology or None
        sysfs_root : str
        opp_tables : dict or None
            ``{cluster name: {kHz: volts}}`` supplied by the user (highest priority).
        cpufreq : CpuFreq or None
            Used for the frequency range when no OPP table exists.
        """
        if topology is None:
            from asymo.hw.topology import detect
            topology = cpufreq.topology if cpufreq is not None else detect(sysfs_root)
        out = []
        for cl in topology.clusters:
            opp, vsrc = None, ""
            if opp_tables and cl.name in opp_tables:
                opp = _clean_table(opp_tables[cl.name], cl.name)
                vsrc = "user-table"
            if opp is None:
                for cpu in cl.cpus:
                    opp = read_opp_debugfs(sysfs_root, cpu)
                    if opp:
                        vsrc = f"debugfs:{os.path.join(sysfs_root, 'kernel/debug/opp')}/cpu{cpu}"
                        break
            dpc = None
            for cpu in cl.cpus:
                dt_opp, dt_dpc, where = read_opp_devicetree(sysfs_root, cpu)
                if opp is None and dt_opp:
                    opp, vsrc = dt_opp, f"devicetree:{where}"
                dpc = dpc or dt_dpc
                if dt_opp or dt_dpc:
                    break
            if opp is None:
                lo, hi = _freq_range(cl, cpufreq)
                opp = ((lo, DEFAULT_V_MIN), (hi, DEFAULT_V_MAX)) if hi > lo else \
                    ((hi, DEFAULT_V_MAX),)
                vsrc = (f"default:linear {DEFAULT_V_MIN}-{DEFAULT_V_MAX} V over "
                        f"{lo}-{hi} kHz")
            top_khz, top_v = opp[-1]
            if dpc:
                c_eff, csrc = dpc * 1e-12, f"devicetree:dynamic-power-coefficient={dpc}"
            else:
                dyn = core_dynamic_w * cl.capacity ** 2
                c_eff = dyn / (top_v * top_v * top_khz * 1e3)
                csrc = (f"default:{dyn:.3g} W per busy core at {top_khz} kHz "
                        f"({core_dynamic_w} W x capacity^2)")
            out.append(ClusterPower(name=cl.name, ncpus=cl.ncpus,
                                    p_static_w=static_w_per_core * cl.ncpus, c_eff=c_eff,
                                    opp=opp, voltage_source=vsrc, capacitance_source=csrc))
        return cls(out)


def _clean_table(table, name):
    try:
        items = sorted((int(k), float(v)) for k, v in dict(table).items())
    except (TypeError, ValueError):
        raise ValueError(f"OPP table for cluster {name!r} must map kHz (int) to volts "
                         "(float)") from None
    if not items or any(k <= 0 or not (0.1 < v < 3.0) for k, v in items):
        raise ValueError(f"OPP table for cluster {name!r} must be non-empty with kHz > 0 and "
                         f"voltages in volts (0.1..3): got {items}")
    return tuple(items)


def _freq_range(cluster, cpufreq):
    lo = hi = None
    if cpufreq is not None:
        try:
            freqs = cpufreq.available_frequencies(cluster.name)
            if freqs:
                lo, hi = freqs[0], freqs[-1]
        except (KeyError, OSError):
            pass
    if hi is None and cluster.available_freqs_khz:
        lo, hi = min(cluster.available_freqs_khz), max(cluster.available_freqs_khz)
    if hi is None and cluster.max_freq_khz:
        hi = cluster.max_freq_khz
        lo = cluster.min_freq_khz or int(hi * DEFAULT_MIN_FREQ_FRACTION)
    if hi is None:
        hi = DEFAULT_MAX_FREQ_KHZ
        lo = int(hi * DEFAULT_MIN_FREQ_FRACTION)
    return int(lo), int(hi)


def _read_bytes(path):
    """A device-tree property's bytes, or None (see `asymo.hw.sysfs.read_attribute`)."""
    try:
        return read_regular_file(path, ATTRIBUTE_BYTES)
    except (OSError, ValueError):
        return None


def read_opp_debugfs(sysfs_root, cpu):
    """OPPs of ``cpu`` from ``<sysfs_root>/kernel/debug/opp/cpuN``: ((kHz, V), ...) or None."""
    base = os.path.join(sysfs_root, "kernel", "debug", "opp", f"cpu{cpu}")
    try:
        names = os.listdir(base)
    except OSError:
        return None
    pts = {}
    for n in names:
        if not n.startswith("opp:"):
            continue
        d = os.path.join(base, n)
        if read_attribute(os.path.join(d, "available")) in ("N", "0"):
            continue
        rate = read_attribute(os.path.join(d, "rate_hz")) or n[4:]
        uv = read_attribute(os.path.join(d, "supply-0", "u_volt_target")) or read_attribute(
            os.path.join(d, "u_volt_target"))
        try:
            hz, uv = int(rate), int(uv)
        except (TypeError, ValueError):
            continue
        if hz > 0 and uv > 0:
            pts[hz // 1000] = uv / 1e6
    return tuple(sorted(pts.items())) or None


def _be_u32s(data):
    if not data or len(data) % 4:
        return ()
    return struct.unpack(f">{len(data) // 4}I", data)


def read_opp_devicetree(sysfs_root, cpu):
    """OPPs and dynamic-power-coefficient of ``cpu`` from the devicetree.

    Returns ``(((kHz, V), ...) or None, coefficient or None, node path or "")``.
    """
    link = os.path.join(sysfs_root, "devices", "system", "cpu", f"cpu{cpu}", "of_node")
    if not os.path.exists(link):
        return None, None, ""
    node = os.path.realpath(link)
    if os.path.realpath(sysfs_root) != "/sys" and node.startswith("/sys/"):
        node = os.path.join(sysfs_root, node[len("/sys/"):])
    dpc = _be_u32s(_read_bytes(os.path.join(node, "dynamic-power-coefficient")))
    dpc = dpc[0] if dpc else None
    legacy = _be_u32s(_read_bytes(os.path.join(node, "operating-points")))
    if legacy and len(legacy) % 2 == 0:
        pts = tuple(sorted((legacy[i], legacy[i + 1] / 1e6) for i in range(0, len(legacy), 2)))
        return pts, dpc, node
    ph = _be_u32s(_read_bytes(os.path.join(node, "operating-points-v2")))
    if not ph:
        return None, dpc, node
    dt_base = os.path.join(sysfs_root, "firmware", "devicetree", "base")
    table = _find_phandle(dt_base, ph[0])
    if table is None:
        return None, dpc, node
    pts = {}
    for child in sorted(os.listdir(table)):
        d = os.path.join(table, child)
        if not os.path.isdir(d) or not re.match(r"opp[-@_]", child):
            continue
        status = _read_bytes(os.path.join(d, "status"))
        if status is not None and status.rstrip(b"\0") not in (b"okay", b"ok"):
            continue
        hz_cells = _be_u32s(_read_bytes(os.path.join(d, "opp-hz")))
        uv_cells = _be_u32s(_read_bytes(os.path.join(d, "opp-microvolt")))
        if len(hz_cells) < 1 or not uv_cells:
            continue
        hz = (hz_cells[0] << 32 | hz_cells[1]) if len(hz_cells) >= 2 else hz_cells[0]
        pts[hz // 1000] = uv_cells[0] / 1e6
    return (tuple(sorted(pts.items())) or None), dpc, table


def _find_phandle(dt_base, phandle):
    for dirpath, dirnames, filenames in os.walk(dt_base):
        for key in ("phandle", "linux,phandle"):
            if key in filenames:
                val = _be_u32s(_read_bytes(os.path.join(dirpath, key)))
                if val and val[0] == phandle:
                    return dirpath
    return None


def read_opp_table(sysfs_root, cpu):
    """OPPs of ``cpu`` from debugfs, else the devicetree: ``(((kHz, V), ...), source)`` or
    ``(None, "")``."""
    pts = read_opp_debugfs(sysfs_root, cpu)
    if pts:
        return pts, "debugfs"
    pts, _, where = read_opp_devicetree(sysfs_root, cpu)
    if pts:
        return pts, f"devicetree:{where}"
    return None, ""
