"""Readers for the Linux sysfs files that describe CPUs.

This module only reads and parses; deciding what the files mean (which cores form a cluster,
how fast each is) is ``asymo.hw.topology``'s job. Every reader takes the sysfs root it was given,
so a copied or generated tree (``tests/fixtures/sysfs/*``) reads exactly like the live ``/sys``.

A file that is absent where the kernel may legitimately omit it gives ``None`` (or an empty
result); a file that exists but does not parse, an empty cpu list, or a description that
contradicts itself raises ``SysfsError`` naming the file, so the caller can fall back to the
next source with a warning.

Files read (all under ``<root>/devices``)::

    system/cpu/online                              cpus the kernel runs
    system/cpu/cpuN/cpu_capacity                   arm64/riscv capacity, max 1024
    system/cpu/cpuN/acpi_cppc/nominal_freq         MHz, ACPI CPPC nominal (non-turbo) frequency
    system/cpu/cpuN/cache/indexK/{level,type,size,shared_cpu_list,coherency_line_size}
    system/cpu/cpufreq/policyX/{related_cpus,affected_cpus,cpuinfo_min_freq,cpuinfo_max_freq,
                                base_frequency,scaling_available_frequencies,
                                scaling_boost_frequencies}      (frequencies in kHz)
    cpu_core/cpus, cpu_atom/cpus, cpu_lowpower/cpus   Intel hybrid PMUs (P, E, LP-E cores)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from asymo.hw.files import read_regular_file

__all__ = ["SysfsError", "SysfsReader", "CpufreqPolicy", "CacheInfo", "HYBRID_PMUS",
           "parse_cpulist", "format_cpulist", "parse_size"]

# Intel hybrid PMU directories, fastest core type first.
HYBRID_PMUS = ("cpu_core", "cpu_atom", "cpu_lowpower")
#: cpu numbers are below this (Linux's NR_CPUS is at most 8192): a cpu list or topology naming
#: more is not this machine's
MAX_CPU = 1 << 15
#: the most bytes read of one sysfs attribute (they are a page at most)
ATTRIBUTE_BYTES = 1 << 16

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class SysfsError(ValueError):
    """A sysfs file exists but is malformed, or the files contradict each other."""


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def read_attribute(path, *, strict=False):
    """The stripped text of the sysfs-style attribute file ``path``, or None when it cannot
    be read as one: missing, not a regular file (a FIFO or device planted in a fake tree must
    not block or flood the reader), over `ATTRIBUTE_BYTES`, not UTF-8. ``strict``: raise
    ``OSError`` saying why instead of returning None."""
    try:
        return read_regular_file(path, ATTRIBUTE_BYTES).decode().strip()
    except OSError:
        if strict:
            raise
        return None
    except ValueError as exc:  # over the size, or not text (UnicodeDecodeError)
        if strict:
            why = "not text" if isinstance(exc, UnicodeDecodeError) else exc
            raise OSError(f"{path}: {why}") from None
        return None


def parse_cpulist(text, sep=","):
    """Parse the kernel's cpu list syntax (``0-3,6,8-9``) into a sorted tuple.

    Raises ``ValueError`` on anything else (an empty string gives an empty tuple).
    """
    text = text.strip()
    if not text:
        return ()
    cpus = set()
    for part in text.split(sep):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad cpu list item {part!r} in {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"bad cpu range {part!r} in {text!r}")
        if hi >= MAX_CPU:
            raise ValueError(f"cpu {hi} in {text!r} is beyond the {MAX_CPU} cpus Linux numbers")
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


def parse_size(text):
    """Parse a sysfs cache size (``"32K"``, ``"2M"``, ``"512"``) into bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


@dataclass(frozen=True)
class CacheInfo:
    """One cache as one cpu sees it (``cpuN/cache/indexK``)."""

    level: int
    type: str  # "Data", "Instruction" or "Unified"
    size: int  # bytes
    shared_cpus: tuple
    line_size: Optional[int]


@dataclass(frozen=True)
class CpufreqPolicy:
    """One cpufreq policy (a frequency domain: its cpus always run at one frequency)."""

    name: str  # "policy4"
    path: str  # absolute path of the policy directory
    cpus: tuple  # related_cpus: every cpu of the domain, online or not
    min_khz: Optional[int]
    max_khz: int
    base_khz: Optional[int]  # intel_pstate's non-turbo frequency
    available_khz: tuple  # scaling_available_frequencies + scaling_boost_frequencies, sorted


class SysfsReader:
    """Read CPU facts from the sysfs tree rooted at ``root``."""

    def __init__(self, root="/sys"):
        self.root = os.fspath(root)
        self.cpu_dir = os.path.join(self.root, "devices", "system", "cpu")

    # -- primitive readers ------------------------------------------------------------
    def _path(self, rel):
        return os.path.join(self.root, rel)

    def exists(self, rel):
        return os.path.exists(self._path(rel))

    def read(self, rel):
        """Text of ``rel`` stripped, or None when the file does not exist."""
        try:
            return read_attribute(self._path(rel), strict=True)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise SysfsError(f"{rel}: cannot read ({exc.strerror or exc})") from None

    def read_int(self, rel, *, positive=True):
        """Integer in ``rel``, or None when absent; SysfsError when it is not one."""
        text = self.read(rel)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            raise SysfsError(f"{rel}: expected an integer, found {text[:40]!r}") from None
        if positive and value <= 0:
            raise SysfsError(f"{rel}: expected a positive integer, found {value}")
        return value

    def read_cpulist(self, rel):
        """Cpu list in ``rel``, or None when absent; empty lists are errors.

        Both kernel spellings are accepted: ranges (``0-3,6``, used by ``cache/*/shared_cpu_list``
        and ``devices/cpu_core/cpus``) and space-separated ids (``0 1 2 3``, used by cpufreq's
        ``related_cpus`` / ``affected_cpus``).
        """
        text = self.read(rel)
        if text is None:
            return None
        try:
            cpus = parse_cpulist(text if "," in text else ",".join(text.split()))
        except ValueError as exc:
            raise SysfsError(f"{rel}: {exc}") from None
        if not cpus:
            raise SysfsError(f"{rel}: empty cpu list")
        return cpus

    def read_int_list(self, rel):
        """Whitespace-separated positive integers, or () when absent."""
        text = self.read(rel)
        if text is None:
            return ()
        try:
            values = tuple(int(v) for v in text.split())
        except ValueError:
            raise SysfsError(f"{rel}: expected integers, found {text[:40]!r}") from None
        if any(v <= 0 for v in values):
            raise SysfsError(f"{rel}: frequencies must be positive")
        return values

    def _cpu_rel(self, cpu, *parts):
        return os.path.join("devices", "system", "cpu", f"cpu{cpu}", *parts)

    # -- facts ------------------------------------------------------------------------
    def online_cpus(self):
        """Cpus in ``cpu/online``, or None when the file is absent."""
        return self.read_cpulist(os.path.join("devices", "system", "cpu", "online"))

    def cpu_dirs(self):
        """Cpu ids that have a ``cpuN`` directory (sorted; empty when there are none)."""
        try:
            names = os.listdir(self.cpu_dir)
        except OSError:
            return ()
        return tuple(sorted(int(n[3:]) for n in names if re.fullmatch(r"cpu\d+", n)))

    def hybrid_pmus(self):
        """``{pmu: cpus}`` for the Intel hybrid PMUs present (empty on other CPUs)."""
        found = {}
        for pmu in HYBRID_PMUS:
            rel = os.path.join("devices", pmu)
            if not os.path.isdir(self._path(rel)):
                continue
            cpus = self.read_cpulist(os.path.join(rel, "cpus"))
            if cpus is None:
                raise SysfsError(f"{rel}/cpus: missing")
            found[pmu] = cpus
        return found

    def cpu_capacities(self, cpus):
        """``{cpu: cpu_capacity}``, or None when no cpu of ``cpus`` has the file.

        Raises SysfsError when only some have it or a value is not a positive integer.
        """
        values = {cpu: self.read_int(self._cpu_rel(cpu, "cpu_capacity")) for cpu in cpus}
        missing = [cpu for cpu, v in values.items() if v is None]
        if len(missing) == len(values):
            return None
        if missing:
            raise SysfsError(f"cpu{missing[0]}/cpu_capacity: missing while other cpus have one")
        return values

    def nominal_freq_khz(self, cpu):
        """ACPI CPPC nominal frequency of ``cpu`` in kHz (the file is in MHz), or None."""
        mhz = self.read_int(self._cpu_rel(cpu, "acpi_cppc", "nominal_freq"))
        return None if mhz is None else mhz * 1000

    def cpufreq_policies(self):
        """Every ``cpufreq/policyX``, sorted by number; [] when there is no cpufreq."""
        base = os.path.join("devices", "system", "cpu", "cpufreq")
        try:
            names = os.listdir(self._path(base))
        except OSError:
            return []
        names = sorted((n for n in names if re.fullmatch(r"policy\d+", n)),
                       key=lambda n: int(n[6:]))
        policies, owner = [], {}
        for name in names:
            rel = os.path.join(base, name)
            cpus = self.read_cpulist(os.path.join(rel, "related_cpus"))
            if cpus is None:
                cpus = self.read_cpulist(os.path.join(rel, "affected_cpus"))
            if cpus is None:
                raise SysfsError(f"{rel}: neither related_cpus nor affected_cpus")
            for cpu in cpus:
                if cpu in owner:
                    raise SysfsError(f"{rel}: cpu{cpu} is also in {owner[cpu]}")
                owner[cpu] = name
            max_khz = self.read_int(os.path.join(rel, "cpuinfo_max_freq"))
            if max_khz is None:
                raise SysfsError(f"{rel}/cpuinfo_max_freq: missing")
            min_khz = self.read_int(os.path.join(rel, "cpuinfo_min_freq"))
            if min_khz is not None and min_khz > max_khz:
                raise SysfsError(f"{rel}: cpuinfo_min_freq {min_khz} > cpuinfo_max_freq "
                                 f"{max_khz}")
            avail = set(self.read_int_list(os.path.join(rel, "scaling_available_frequencies")))
            avail.update(self.read_int_list(os.path.join(rel, "scaling_boost_frequencies")))
            policies.append(CpufreqPolicy(
                name=name, path=self._path(rel), cpus=cpus, min_khz=min_khz, max_khz=max_khz,
                base_khz=self.read_int(os.path.join(rel, "base_frequency")),
                available_khz=tuple(sorted(avail))))
        return policies

    def caches(self, cpu):
        """Caches of ``cpu`` as ``[CacheInfo]`` in index order ([] when none are described).

        Entries without a ``size`` are skipped: ARM firmware often describes levels only.
        """
        rel_dir = self._cpu_rel(cpu, "cache")
        try:
            names = os.listdir(self._path(rel_dir))
        except OSError:
            return []
        out = []
        for name in sorted((n for n in names if re.fullmatch(r"index\d+", n)),
                           key=lambda n: int(n[5:])):
            rel = os.path.join(rel_dir, name)
            size_text = self.read(os.path.join(rel, "size"))
            if size_text is None:
                continue
            try:
                size = parse_size(size_text)
            except ValueError as exc:
                raise SysfsError(f"{rel}/size: {exc}") from None
            level = self.read_int(os.path.join(rel, "level"))
            if level is None:
                raise SysfsError(f"{rel}/level: missing")
            ctype = self.read(os.path.join(rel, "type")) or "Unified"
            if ctype not in ("Data", "Instruction", "Unified"):
                raise SysfsError(f"{rel}/type: unknown cache type {ctype[:40]!r}")
            shared = self.read_cpulist(os.path.join(rel, "shared_cpu_list")) or ()
            if shared and cpu not in shared:
                raise SysfsError(f"{rel}/shared_cpu_list: does not contain cpu{cpu}")
            out.append(CacheInfo(level=level, type=ctype, size=size, shared_cpus=shared,
                                 line_size=self.read_int(os.path.join(rel,
                                                                      "coherency_line_size"))))
        return out
