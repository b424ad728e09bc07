"""Energy meters: measure (or, failing that, estimate) the energy used over an interval.

Every meter has ``start() -> token`` and ``stop(token) -> MeterReading``, and
``measure()``, a context manager whose ``.reading`` is set when the block ends. A
``MeterReading`` is plain data that says whether it was ``measured`` and by what ``source``.

Meters, in the order ``detect_meter`` tries them:

* ``RaplMeter``: Intel/AMD RAPL through powercap,
  ``<sysfs>/class/powercap/intel-rapl:N/energy_uj`` (package zones; uJ, readable by root only
  since Linux 5.10). The counter wraps to 0 after ``max_energy_range_uj``; each read adds
  ``max_energy_range_uj - previous + current`` when the value went down, so intervals are
  exact as long as the counter is read at least once per wrap period (minutes to hours).
* ``HwmonMeter``: ``<sysfs>/class/hwmon/hwmonN/energyK_input`` (cumulative uJ) or
  ``powerK_input`` (instantaneous uW, sampled in a background thread and integrated with the
  trapezoid rule).
* ``CallableMeter``: a user function returning cumulative joules (``kind="energy"``) or
  instantaneous watts (``kind="power"``, sampled and integrated).
* ``CsvTraceMeter``: a trace written by an external meter (Monsoon, a USB power meter, a lab
  supply); see its docstring for the format.
* ``PowerModelMeter``: no measurement at all -- an estimate from ``P = P_static + C V^2 f``
  using per-cpu busy time from ``/proc/stat`` and the current frequencies. Always labelled
  ``measured=False`` with a source starting with ``estimate:``.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from asymo.hw.files import read_regular_file
from asymo.hw.sysfs import read_attribute

#: the largest power trace read (bytes): hours of samples at 1 kHz
MAX_TRACE_BYTES = 256 << 20

__all__ = ["MeterReading", "Meter", "MeterUnavailable", "RaplMeter", "HwmonMeter",
           "CallableMeter", "CsvTraceMeter", "PowerModelMeter", "detect_meter",
           "available_meters", "integrate_power"]


class MeterUnavailable(OSError):
    """The requested meter does not exist on this system or cannot be read."""


@dataclass(frozen=True)
class MeterReading:
    """Energy over one interval. ``measured`` is False for estimates."""

    energy_j: float
    elapsed_s: float
    measured: bool
    source: str
    detail: dict = field(default_factory=dict)

    @property
    def power_w(self):
        return self.energy_j / self.elapsed_s if self.elapsed_s > 0 else float("nan")

    @property
    def label(self):
        return "measured" if self.measured else "estimated"

    def to_dict(self):
        return {"energy_j": self.energy_j, "elapsed_s": self.elapsed_s,
                "power_w": self.power_w, "measured": self.measured, "source": self.source,
                "detail": dict(self.detail)}

    def __str__(self):
        return (f"{self.energy_j:.4g} J over {self.elapsed_s:.4g} s "
                f"({self.power_w:.4g} W, {self.label}: {self.source})")


class _Measurement:
    def __init__(self):
        self.reading = None


class Meter:
    """Base class: subclasses implement ``start`` and ``stop``."""

    measured = True
    source = "meter"

    def start(self):
        raise NotImplementedError

    def stop(self, token):
        raise NotImplementedError

    @contextmanager
    def measure(self):
        """``with meter.measure() as m: work()`` then ``m.reading``."""
        m = _Measurement()
        token = self.start()
        try:
            yield m
        finally:
            m.reading = self.stop(token)

    def describe(self):
        return {"source": self.source, "measured": self.measured}

    def __repr__(self):
        return f"{type(self).__name__}(source={self.source!r}, measured={self.measured})"


def integrate_power(times, watts, t0=None, t1=None):
    """Trapezoid integral of power samples over ``[t0, t1]`` (joules), interpolating linearly
    at the edges. Raises ValueError when the samples do not cover the interval."""
    n = len(times)
    if n != len(watts):
        raise ValueError("times and watts differ in length")
    if n == 0:
        raise ValueError("no power samples")
    t0 = times[0] if t0 is None else t0
    t1 = times[-1] if t1 is None else t1
    if t1 < t0:
        raise ValueError(f"interval end {t1} before start {t0}")
    if n == 1:
        if times[0] == t0 == t1:
            return 0.0
        raise ValueError("one power sample cannot cover an interval")
    if t0 < times[0] - 1e-9 or t1 > times[-1] + 1e-9:
        raise ValueError(f"power samples cover [{times[0]}, {times[-1]}], not the requested "
                         f"[{t0}, {t1}]")

    def at(t):
        # first sample index with time >= t
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if times[mid] < t:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return watts[0]
        ta, tb = times[lo - 1], times[lo]
        if tb == ta:
            return watts[lo]
        return watts[lo - 1] + (watts[lo] - watts[lo - 1]) * (t - ta) / (tb - ta)

    pts = [(t0, at(t0))]
    pts += [(t, w) for t, w in zip(times, watts) if t0 < t < t1]
    pts.append((t1, at(t1)))
    return sum((tb - ta) * (wa + wb) / 2 for (ta, wa), (tb, wb) in zip(pts, pts[1:]))


class _PowerSampler:
    """Samples ``read_w()`` every ``interval_s`` in a daemon thread."""

    def __init__(self, read_w, interval_s):
        self.read_w = read_w
        self.interval_s = interval_s
        self.times, self.watts = [], []
        self._stop = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="asymo-power-sampler",
                                        daemon=True)

    def _sample(self):
        w = float(self.read_w())
        self.times.append(time.monotonic())
        self.watts.append(w)

    def _run(self):
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
        except Exception as exc:  # noqa: BLE001 - reported by finish()
            self._error = exc

    def begin(self):
        self._sample()
        t0 = self.times[0]
        self._thread.start()
        return t0

    def finish(self):
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise MeterUnavailable(f"power sampling failed: {self._error}") from self._error
        self._sample()
        return self.times[-1]


# ------------------------------------------------------------------------------------ RAPL

class RaplMeter(Meter):
    """Package energy from RAPL powercap zones (``intel-rapl:N``; also used on AMD Zen).

    Parameters
    ----------
    sysfs_root : str
    zones : list of str or None
        Zone names (``"package-0"``, ``"psys"``) or directory names (``"intel-rapl:0"``) to
        sum; default: every top-level ``intel-rapl:N`` zone (one per package).
    """

    def __init__(self, sysfs_root="/sys", zones=None):
        base = os.path.join(sysfs_root, "class", "powercap")
        try:
            names = sorted(n for n in os.listdir(base) if re.fullmatch(r"intel-rapl:\d+", n))
        except OSError:
            names = []
        if not names:
            raise MeterUnavailable(f"no RAPL powercap zones under {base}")
        self._zones = []
        for n in names:
            d = os.path.join(base, n)
            label = read_attribute(os.path.join(d, "name")) or n
            if zones is not None and n not in zones and label not in zones:
                continue
            try:
                rng = int(read_attribute(os.path.join(d, "max_energy_range_uj"), strict=True))
                raw = int(read_attribute(os.path.join(d, "energy_uj"), strict=True))
            except PermissionError:
                raise MeterUnavailable(
                    f"{d}/energy_uj is readable by root only (Linux >= 5.10); run as root "
                    "or grant read access to measure energy") from None
            except (OSError, ValueError, TypeError) as exc:
                raise MeterUnavailable(f"cannot read RAPL zone {d}: {exc}") from None
            self._zones.append({"path": d, "name": label, "range": rng, "last": raw,
                                "total": 0})
        if not self._zones:
            raise MeterUnavailable(f"none of the RAPL zones {zones} exists under {base}")
        self._lock = threading.Lock()
        self.source = "rapl:" + ",".join(f"{z['name']}" for z in self._zones)

    def read_uj(self):
        """Cumulative energy (uJ) since construction, wrap-arounds unfolded."""
        with self._lock:
            total = 0
            for z in self._zones:
                raw = int(read_attribute(os.path.join(z["path"], "energy_uj"), strict=True))
                delta = raw - z["last"]
                if delta < 0:
                    delta = z["range"] - z["last"] + raw
                z["total"] += delta
                z["last"] = raw
                total += z["total"]
            return total

    def start(self):
        return (time.monotonic(), self.read_uj())

    def stop(self, token):
        t0, e0 = token
        e1 = self.read_uj()
        t1 = time.monotonic()
        return MeterReading(energy_j=(e1 - e0) * 1e-6, elapsed_s=t1 - t0, measured=True,
                            source=self.source)


# ----------------------------------------------------------------------------------- hwmon

_SUMMARY = re.compile(r"socket|package|pkg|sys|total|soc|cpu\b", re.I)


class HwmonMeter(Meter):
    """Energy from hwmon sensors: ``energyK_input`` (uJ, preferred) or ``powerK_input`` (uW).

    Parameters
    ----------
    sysfs_root : str
    sensors : list of str or None
        ``"hwmonN/energyK_input"`` style paths relative to ``class/hwmon``. By default the
        first hwmon device with energy inputs (else power inputs) is used; if some of its
        inputs are labelled as a total (socket, package, sys ...) only those are summed, so
        per-core and per-socket counters (``amd_energy``) are not counted twice.
    interval_s : float
        Sampling interval for power inputs.
    """

    def __init__(self, sysfs_root="/sys", sensors=None, interval_s=0.01):
        base = os.path.join(sysfs_root, "class", "hwmon")
        self.interval_s = float(interval_s)
        if sensors is not None:
            paths = [os.path.join(base, s) for s in sensors]
            for p in paths:
                if not os.path.exists(p):
                    raise MeterUnavailable(f"hwmon sensor {p} does not exist")
        else:
            paths = self._discover(base)
        kinds = {("energy" if os.path.basename(p).startswith("energy") else "power")
                 for p in paths}
        if len(kinds) != 1:
            raise MeterUnavailable("hwmon sensors must be all energy*_input or all "
                                   "power*_input")
        self.kind = kinds.pop()
        self._paths = paths
        for p in paths:
            try:
                int(read_attribute(p, strict=True))
            except PermissionError:
                raise MeterUnavailable(f"hwmon sensor {p} is not readable by this "
                                       "process") from None
            except (OSError, ValueError, TypeError) as exc:
                raise MeterUnavailable(f"cannot read hwmon sensor {p}: {exc}") from None
        self.source = "hwmon:" + ",".join(os.path.relpath(p, base) for p in paths)

    @staticmethod
    def _discover(base):
        try:
            devs = sorted(os.listdir(base), key=lambda n: (len(n), n))
        except OSError:
            devs = []
        for kind in ("energy", "power"):
            for dev in devs:
                d = os.path.join(base, dev)
                try:
                    files = os.listdir(d)
                except OSError:
                    continue
                inputs = sorted(f for f in files if re.fullmatch(rf"{kind}\d+_input", f))
                if not inputs:
                    continue
                labels = {f: read_attribute(os.path.join(d, f.replace("_input", "_label"))) or ""
                          for f in inputs}
                totals = [f for f in inputs if _SUMMARY.search(labels[f])]
                return [os.path.join(d, f) for f in (totals or inputs)]
        raise MeterUnavailable(f"no hwmon energy*_input or power*_input under {base}")

    def _read_sum(self):
        return sum(int(read_attribute(p, strict=True)) for p in self._paths)

    def start(self):
        if self.kind == "energy":
            return (time.monotonic(), self._read_sum())
        sampler = _PowerSampler(lambda: self._read_sum() * 1e-6, self.interval_s)
        return (sampler.begin(), sampler)

    def stop(self, token):
        t0, state = token
        if self.kind == "energy":
            e1 = self._read_sum()
            t1 = time.monotonic()
            if e1 < state:
                raise MeterUnavailable(f"hwmon energy counter went backwards ({state} -> {e1} "
                                       "uJ): the sensor was reset during the measurement")
            return MeterReading((e1 - state) * 1e-6, t1 - t0, True, self.source)
        t1 = state.finish()
        e = integrate_power(state.times, state.watts, t0, t1)
        return MeterReading(e, t1 - t0, True, self.source,
                            {"samples": len(state.times), "integrated": "power"})


# -------------------------------------------------------------------------------- callable

class CallableMeter(Meter):
    """Energy from a user function.

    Parameters
    ----------
    fn : callable
        ``fn() -> float``: cumulative energy in joules (``kind="energy"``) or instantaneous
        power in watts (``kind="power"``, sampled every ``interval_s`` and integrated).
    kind : {"energy", "power"}
    measured : bool
        Whether ``fn`` measures (True) or estimates (False); carried into every reading.
    name : str
    """

    def __init__(self, fn, kind="energy", *, interval_s=0.01, measured=True, name=None):
        if not callable(fn):
            raise TypeError("fn must be callable")
        if kind not in ("energy", "power"):
            raise ValueError(f"kind must be 'energy' or 'power', got {kind!r}")
        self.fn, self.kind, self.interval_s = fn, kind, float(interval_s)
        self.measured = bool(measured)
        label = name or getattr(fn, "__name__", "fn")
        self.source = f"callable:{label}" if measured else f"estimate:callable:{label}"

    def _value(self):
        v = float(self.fn())
        if not math.isfinite(v):
            raise ValueError(f"meter function returned {v}")
        return v

    def start(self):
        if self.kind == "energy":
            return (time.monotonic(), self._value())
        sampler = _PowerSampler(self._value, self.interval_s)
        return (sampler.begin(), sampler)

    def stop(self, token):
        t0, state = token
        if self.kind == "energy":
            e1 = self._value()
            return MeterReading(e1 - state, time.monotonic() - t0, self.measured, self.source)
        t1 = state.finish()
        return MeterReading(integrate_power(state.times, state.watts, t0, t1), t1 - t0,
                            self.measured, self.source, {"samples": len(state.times)})


# ------------------------------------------------------------------------------- CSV trace

_TIME_COLS = ("timestamp", "time", "t", "time_s", "timestamp_s")
_POWER_COLS = {"power_w": 1.0, "power": 1.0, "watts": 1.0, "w": 1.0, "power_mw": 1e-3,
               "power_uw": 1e-6}
_ENERGY_COLS = {"energy_j": 1.0, "energy": 1.0, "joules": 1.0, "j": 1.0, "energy_mj": 1e-3,
                "energy_uj": 1e-6}


class CsvTraceMeter(Meter):
    """Energy from a CSV trace written by an external meter.

    Format: a header row, then one row per sample, comma separated::

        timestamp,power_w
        1718000000.000,3.41
        1718000000.010,3.52

    * ``timestamp`` (also ``time``, ``t``): seconds. By default Unix time (``time.time()``,
      the external logger must run on the same clock, e.g. NTP-synchronised); with
      ``clock="monotonic"`` the host's ``time.monotonic()``; with ``offset_s`` added to the
      trace's timestamps to align another clock.
    * then either a power column -- ``power_w`` / ``power`` / ``watts`` (W), ``power_mw``
      (mW), ``power_uw`` (uW) -- integrated with the trapezoid rule, or a cumulative energy
      column -- ``energy_j`` / ``energy`` / ``joules`` (J), ``energy_mj``, ``energy_uj`` --
      differenced (interpolated at the interval ends).

    Timestamps must not decrease. Lines starting with ``#`` are comments. The trace may still
    be growing: ``stop`` waits up to ``wait_s`` for samples past the end of the interval.
    ``energy_between(t0, t1)`` integrates any interval after the fact.
    """

    def __init__(self, path, *, clock="realtime", offset_s=0.0, wait_s=2.0, measured=True):
        if clock not in ("realtime", "monotonic"):
            raise ValueError(f"clock must be 'realtime' or 'monotonic', got {clock!r}")
        self.path = os.fspath(path)
        self.clock = time.time if clock == "realtime" else time.monotonic
        self.offset_s = float(offset_s)
        self.wait_s = float(wait_s)
        self.measured = bool(measured)
        if not os.path.exists(self.path):
            raise MeterUnavailable(f"CSV power trace {self.path} does not exist")
        self.source = f"csv:{self.path}"

    def read_trace(self):
        """``(times, values, kind)`` with kind ``"power"`` (W) or ``"energy"`` (J)."""
        try:  # a regular file of bounded size: /dev/zero or a FIFO would never end
            text = read_regular_file(self.path, MAX_TRACE_BYTES).decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: not a text file ({exc.reason})") from None
        rows = [r for r in csv.reader(io.StringIO(text, newline=""))
                if r and not r[0].lstrip().startswith("#")]
        if not rows:
            raise ValueError(f"{self.path}: empty trace (expected a header row such as "
                             "'timestamp,power_w')")
        header = [h.strip().lower() for h in rows[0]]
        tcol = next((header.index(c) for c in _TIME_COLS if c in header), None)
        if tcol is None:
            raise ValueError(f"{self.path}: no timestamp column (one of {_TIME_COLS}) in "
                             f"header {rows[0]}")
        kind = scale = vcol = None
        for cols, k in ((_POWER_COLS, "power"), (_ENERGY_COLS, "energy")):
            for name, s in cols.items():
                if name in header:
                    kind, scale, vcol = k, s, header.index(name)
                    break
            if kind:
                break
        if kind is None:
            raise ValueError(f"{self.path}: no power or energy column in header {rows[0]} "
                             f"(expected one of {list(_POWER_COLS) + list(_ENERGY_COLS)})")
        times, vals = [], []
        for lineno, row in enumerate(rows[1:], start=2):
            try:
                t = float(row[tcol]) + self.offset_s
                v = float(row[vcol]) * scale
            except (IndexError, ValueError):
                raise ValueError(f"{self.path}: line {lineno}: cannot parse {row!r} as "
                                 "numbers") from None
            if not (math.isfinite(t) and math.isfinite(v)):
                raise ValueError(f"{self.path}: line {lineno}: non-finite value in {row!r}")
            if times and t < times[-1]:
                raise ValueError(f"{self.path}: line {lineno}: timestamp {t} goes backwards")
            times.append(t)
            vals.append(v)
        return times, vals, kind

    def energy_between(self, t0, t1):
        """Joules between two timestamps (trace clock)."""
        times, vals, kind = self.read_trace()
        if not times or times[0] > t0 + 1e-9 or times[-1] < t1 - 1e-9:
            span = f"[{times[0]}, {times[-1]}]" if times else "nothing"
            raise ValueError(f"{self.path}: trace covers {span}, not the requested interval "
                             f"[{t0}, {t1}]")
        if kind == "power":
            return integrate_power(times, vals, t0, t1)
        return _interp(times, vals, t1) - _interp(times, vals, t0)

    def start(self):
        return (self.clock(), time.monotonic())

    def stop(self, token):
        t0, m0 = token
        t1, m1 = self.clock(), time.monotonic()
        deadline = m1 + self.wait_s
        while True:
            try:
                e = self.energy_between(t0, t1)
                break
            except ValueError as exc:
                if "not the requested interval" not in str(exc) or time.monotonic() > deadline:
                    raise MeterUnavailable(str(exc)) from None
                time.sleep(min(0.05, self.wait_s / 10 + 1e-3))
        return MeterReading(e, m1 - m0, self.measured, self.source,
                            {"t0": t0, "t1": t1})


def _interp(times, vals, t):
    for i in range(1, len(times)):
        if times[i] >= t:
            ta, tb = times[i - 1], times[i]
            if tb == ta:
                return vals[i]
            return vals[i - 1] + (vals[i] - vals[i - 1]) * (t - ta) / (tb - ta)
    return vals[-1]


# ----------------------------------------------------------------------------- power model

class PowerModelMeter(Meter):
    """An *estimate* of energy from a power model, never a measurement.

    energy = sum over clusters of ``P_static * T + sum over its cpus of busy_s * C V(f)^2 f``,
    with busy seconds per cpu from ``<procfs_root>/stat`` (user + nice + system + irq +
    softirq + steal) and ``f`` the cluster's frequency (``scaling_cur_freq`` through
    ``cpufreq`` at start and stop, averaged; the model's top frequency when unknown).
    """

    measured = False

    def __init__(self, power_model, topology, *, cpufreq=None, procfs_root="/proc",
                 activity=1.0):
        self.model = power_model
        self.topology = topology
        self.cpufreq = cpufreq
        self.procfs_root = procfs_root
        self.activity = float(activity)
        self.source = power_model.source
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _busy(self):
        busy = {}
        try:
            with open(os.path.join(self.procfs_root, "stat")) as f:
                for line in f:
                    m = re.match(r"cpu(\d+)\s+(.*)", line)
                    if not m:
                        continue
                    v = [int(x) for x in m.group(2).split()]
                    v += [0] * (8 - len(v))
                    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
                    busy[int(m.group(1))] = (user + nice + system + irq + softirq + steal) \
                        / self._hz
        except OSError:
            pass
        return busy

    def _freqs(self):
        out = {}
        for c in self.topology.clusters:
            f = None
            if self.cpufreq is not None:
                try:
                    f = self.cpufreq.frequency(c.name)
                except (KeyError, OSError):
                    f = None
            out[c.name] = f or self.model[c.name].freqs_khz[-1]
        return out

    def start(self):
        return (time.monotonic(), self._busy(), self._freqs())

    def stop(self, token):
        t0, b0, f0 = token
        b1, f1 = self._busy(), self._freqs()
        elapsed = time.monotonic() - t0
        total = 0.0
        per = {}
        for c in self.topology.clusters:
            cp = self.model[c.name]
            khz = (f0[c.name] + f1[c.name]) / 2
            busy_s = sum(max(0.0, b1.get(cpu, 0.0) - b0.get(cpu, 0.0)) for cpu in c.cpus)
            busy_s = min(busy_s, elapsed * c.ncpus)
            e = cp.p_static_w * elapsed + busy_s * cp.core_dynamic_w(khz, self.activity)
            per[c.name] = {"energy_j": e, "busy_s": busy_s, "khz": khz}
            total += e
        return MeterReading(total, elapsed, False, self.source, {"clusters": per})


# ------------------------------------------------------------------------------ discovery

def available_meters(sysfs_root="/sys"):
    """``[(name, ok, detail)]`` for RAPL and hwmon: what exists and why not."""
    out = []
    for name, cls in (("rapl", RaplMeter), ("hwmon", HwmonMeter)):
        try:
            m = cls(sysfs_root)
            out.append((name, True, m.source))
        except MeterUnavailable as exc:
            out.append((name, False, str(exc)))
    return out


def detect_meter(sysfs_root="/sys", topology=None, *, power_model=None, cpufreq=None,
                 procfs_root="/proc"):
    """The best meter this system has: RAPL, then hwmon, else a ``PowerModelMeter``
    estimate (``meter.measured`` tells which)."""
    for cls in (RaplMeter, HwmonMeter):
        try:
            return cls(sysfs_root)
        except MeterUnavailable:
            continue
    if topology is None:
        from asymo.hw.topology import detect
        topology = cpufreq.topology if cpufreq is not None else detect(sysfs_root)
    if power_model is None:
        from asymo.dvfs.power_model import PowerModel
        power_model = PowerModel.from_system(topology, sysfs_root, cpufreq=cpufreq)
    return PowerModelMeter(power_model, topology, cpufreq=cpufreq, procfs_root=procfs_root)
