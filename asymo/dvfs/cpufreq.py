"""The cpufreq actuator: read and set each cluster's CPU frequency through Linux sysfs.

Files used, under ``<sysfs_root>/devices/system/cpu/cpufreq/policyX/`` (or the older per-cpu
``cpuN/cpufreq/``)::

    related_cpus affected_cpus            which cpus the policy drives
    scaling_driver                        e.g. cpufreq-dt, intel_pstate, acpi-cpufreq
    scaling_governor                      current governor (written)
    scaling_available_governors           e.g. "userspace ondemand schedutil performance"
    scaling_available_frequencies         kHz list (absent on intel_pstate / amd-pstate)
    cpuinfo_min_freq cpuinfo_max_freq     hardware limits (kHz)
    scaling_min_freq scaling_max_freq     policy limits (written when clamping)
    scaling_setspeed                      target under the userspace governor (written)
    scaling_cur_freq                      current frequency (kHz)

Two ways to set a frequency, chosen per policy:

* ``userspace``: switch ``scaling_governor`` to ``userspace`` and write ``scaling_setspeed``
  (the governor the AsyMo paper uses; < 1 ms transition). The policy limits are widened only
  when the target lies outside them.
* ``clamp``: where the userspace governor is unavailable (intel_pstate, amd-pstate active
  mode, or a kernel built without it), write ``scaling_min_freq = scaling_max_freq = f``.
  Writes are ordered so ``min <= max`` holds after every single write (older kernels reject
  anything else).

Every change is undone on every exit path: the context manager, an exception in the ``with``
block, ``atexit``, SIGINT / SIGTERM (our handler restores, then chains to the handler that was
installed before it, or re-raises the signal with the default action; Python only lets the
main thread install handlers, so changes made first from another thread rely on the other
mechanisms), and -- for what no Python code survives (SIGKILL, a segfault in native code,
``os._exit``) -- a guardian process (``_guardian.py``) that holds the original values while
changes are outstanding and writes them back when this process dies. The guardian runs in a
session of its own (a SIGKILL of this process's group does not reach it) and watches this
process itself, not only its pipe (a forked child holding the pipe cannot delay it). What can
still keep the last written values: a power loss or a kernel crash, a SIGKILL of the guardian
itself (``kill -9`` of its pid, or of every process of the machine or cgroup, as a container
stop does) at the same time as this process's, and a guardian that could not be started (a
RuntimeWarning says so).

Several processes may change one policy at the same time: a record per policy, shared
through asymo's run directory (`asymo.hw.rundir`, root's ``/run/asymo/cpufreq`` when run as
root) under an flock, keeps the values from before the first of them wrote and which
processes use it. One that ends while another still uses the policy writes nothing back; the
last one puts back the true originals (not the settings of the one that started first).

Before anything is written, every file that will be written is checked (present, a sysfs
attribute that has a store method -- mode with a write bit -- and writable by this process);
if any check fails nothing is written. If a write fails half way (EINVAL, EBUSY, EPERM ...),
the writes already made are rolled back before the error is raised.
"""
from __future__ import annotations

import atexit
import errno
import os
import re
import json
import signal
import stat
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Optional

from asymo.dvfs import _guardian
from asymo.hw import rundir as _rundir
from asymo.hw.sysfs import read_attribute
from asymo.hw.topology import Cluster, Topology, parse_cpulist

__all__ = ["CpuFreq", "CpuFreqError", "CpuFreqPermissionError", "PolicyInfo", "FrequencyChange",
           "CPUFREQ_DIR"]

CPUFREQ_DIR = os.path.join("devices", "system", "cpu", "cpufreq")
_CPU_DIR = os.path.join("devices", "system", "cpu")

_MIN, _MAX = "scaling_min_freq", "scaling_max_freq"
_GOV, _SPEED = "scaling_governor", "scaling_setspeed"


class CpuFreqError(OSError):
    """The CPU frequency cannot be read or changed (absent, not permitted, rejected)."""


class CpuFreqPermissionError(CpuFreqError, PermissionError):
    """A cpufreq file is read-only for this process (not root, or no store method)."""


@dataclass(frozen=True)
class PolicyInfo:
    """What one cpufreq policy (a frequency domain) offers, as read from sysfs.

    ``method`` is how asymo would set a frequency (``"userspace"``, ``"clamp"``) or None with
    ``reason`` saying why it cannot.
    """

    path: str
    cpus: tuple
    driver: Optional[str]
    governor: Optional[str]
    available_governors: tuple
    frequencies_khz: tuple
    frequencies_listed: bool
    cpuinfo_min_khz: Optional[int]
    cpuinfo_max_khz: Optional[int]
    scaling_min_khz: Optional[int]
    scaling_max_khz: Optional[int]
    cur_khz: Optional[int]
    method: Optional[str]
    reason: str = ""
    error: Optional[int] = None  # errno behind ``reason`` (EACCES, ENOENT, ENODEV)

    def to_dict(self):
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class FrequencyChange:
    """Handle returned by ``CpuFreq.set_frequencies``: ``undo()`` puts back the values that
    were there just before (not necessarily the values from before the first change)."""

    cpufreq: "CpuFreq"
    targets: dict
    _before: dict = field(repr=False, default_factory=dict)
    undone: bool = False

    def undo(self):
        if not self.undone:
            self.cpufreq._put_back(self._before)
            self.undone = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


# --------------------------------------------------------------------------------------------
# process-wide safety net: every CpuFreq with outstanding changes is restored at exit and on
# SIGINT / SIGTERM.

_registry_lock = threading.RLock()
_active = []  # CpuFreq instances with changes, in order of first change
_prev_handlers = {}  # signum -> handler installed before ours
_atexit_registered = False
_GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _restore_all():
    """Restore every CpuFreq that changed something (newest first). Never raises."""
    with _registry_lock:
        pending = list(reversed(_active))
    for cf in pending:
        try:
            cf.restore()
        except Exception as exc:  # noqa: BLE001 - keep restoring the others
            warnings.warn(f"asymo.dvfs: could not restore cpufreq settings: {exc}",
                          RuntimeWarning, stacklevel=2)


def _on_signal(signum, frame):
    prev = _prev_handlers.get(signum, signal.SIG_DFL)
    _restore_all()
    _uninstall_handlers()
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or None: installed from C): die the way the signal would have killed us
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers():
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_restore_all)
        _atexit_registered = True
    if threading.current_thread() is not threading.main_thread():
        return  # Python only lets the main thread install handlers; atexit still covers us
    for sig in _GUARDED_SIGNALS:
        current = signal.getsignal(sig)
        if current is _on_signal:
            continue
        _prev_handlers[sig] = current
        signal.signal(sig, _on_signal)


def _uninstall_handlers():
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _GUARDED_SIGNALS:
        if sig in _prev_handlers and signal.getsignal(sig) is _on_signal:
            prev = _prev_handlers.pop(sig)
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)


def _register(cf):
    with _registry_lock:
        if cf not in _active:
            _active.append(cf)
        _install_handlers()


def _unregister(cf):
    with _registry_lock:
        if cf in _active:
            _active.remove(cf)
        if not _active:
            _uninstall_handlers()


# --------------------------------------------------------------------------------------------


def _read_int(path):
    text = read_attribute(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _reroot(path, sysfs_root):
    """Map an absolute /sys path onto ``sysfs_root`` (a fixture or copied tree)."""
    if os.path.realpath(sysfs_root) == "/sys":
        return path
    if path == "/sys" or path.startswith("/sys/"):
        return os.path.join(sysfs_root, path[len("/sys/"):])
    return path


def _check_writable(path):
    """Raise CpuFreqError unless ``path`` is a sysfs attribute this process can write.

    sysfs marks attributes without a store method read-only for everybody (mode 0444), and
    the kernel refuses writes to them even for root; a plain ``os.access`` check would say yes
    to root, so the mode bits are checked as well.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CpuFreqError(errno.ENOENT, f"cpufreq file {path} does not exist") from None
    except OSError as exc:
        raise CpuFreqError(exc.errno or errno.EIO, f"cannot stat cpufreq file {path}: "
                                                   f"{exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CpuFreqError(errno.EINVAL, f"cpufreq path {path} is not a file")
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK):
        raise CpuFreqPermissionError(
            errno.EACCES,
            f"cpufreq file {path} is read-only for this process (mode "
            f"{stat.filemode(st.st_mode)}, uid {os.geteuid()}); setting CPU frequencies needs "
            "root (or a udev rule / group permission on the cpufreq files)")


class _Policy:
    """Resolved policy directory of one cluster (one cluster may span several policies, e.g.
    intel_pstate exposes one policy per cpu)."""

    def __init__(self, path, cpus):
        self.path = path
        self.cpus = cpus

    def file(self, name):
        return os.path.join(self.path, name)


class CpuFreq:
    """Per-cluster access to Linux cpufreq: read governors and frequencies, set a frequency.

    Parameters
    ----------
    topology : Topology or None
        Clusters to control; by default ``asymo.hw.topology.detect(sysfs_root)``. Each cluster's
        policy directory comes from ``Cluster.cpufreq_policy`` (a path or a name such as
        ``"policy4"``) or, when absent, from the policies whose ``related_cpus`` cover the
        cluster's cpus.
    sysfs_root : str
        Root of the sysfs tree (``"/sys"`` on a live system; a fixture directory in tests).

    Notes
    -----
    Use it as a context manager (``with CpuFreq(t) as cf: cf.set_frequency("big", 1863000)``)
    so everything is restored when the block ends, however it ends. ``restore()`` may also be
    called directly; it is idempotent. Changes still outstanding at interpreter exit or on
    SIGINT / SIGTERM are restored by a process-wide handler.

    ``write_log`` lists every ``(path, value)`` written, in order (restores included).
    """

    def __init__(self, topology=None, sysfs_root="/sys", *, guardian=True):
        if topology is None:
            from asymo.hw.topology import detect
            topology = detect(sysfs_root=sysfs_root)
        if not isinstance(topology, Topology):
            raise TypeError(f"topology must be an asymo.hw.topology.Topology, got "
                            f"{type(topology).__name__}")
        self.topology = topology
        self.sysfs_root = os.fspath(sysfs_root)
        self._lock = threading.RLock()
        self._policies = {c.name: self._resolve(c) for c in topology.clusters}
        self._original = {}  # policy path -> {file: value before our first write}
        self.write_log = []
        self._use_guardian = bool(guardian)
        self._guardian = None
        self._records = {}  # policy path -> shared record file this object holds
        self._token = os.urandom(8).hex()

    # ---------------------------------------------------------------- shared originals
    def _holder(self):
        pid = os.getpid()  # after a fork the child is another holder
        return [pid, _guardian.proc_start(pid), self._token]

    def _record_file(self, path):
        import hashlib
        try:
            d = _rundir.run_dir("cpufreq")
        except OSError as exc:
            warnings.warn(f"asymo.dvfs: no shared record of cpufreq originals ({exc}); two "
                          "processes changing one policy at once may restore each other's "
                          "settings", RuntimeWarning, stacklevel=4)
            return None
        return os.path.join(d, hashlib.sha256(path.encode()).hexdigest()[:32] + ".json")

    def _join(self, path, snapshot):
        """This object's originals of ``path``: the shared record's true originals
        (completed by ``snapshot``), or ``snapshot`` when no record can be kept."""
        record = self._records.get(path) or self._record_file(path)
        if record is not None:
            try:
                orig = _guardian.join_record(record, path, snapshot, self._holder())
            except OSError as exc:
                warnings.warn(f"asymo.dvfs: cannot use the shared record {record} ({exc})",
                              RuntimeWarning, stacklevel=4)
            else:
                self._records[path] = record
                return orig
        return snapshot

    def _leave(self, path):
        """What to write back to ``path`` when this object lets it go: ``(kind, values)`` of
        `_guardian.leave_record` ("absent": this object's own originals)."""
        record = self._records.pop(path, None)
        kind, values = "absent", None
        if record is not None:
            try:
                kind, values = _guardian.leave_record(record, self._holder())
            except OSError:
                kind, values = "absent", None
        if kind == "absent":
            values = self._original.get(path, {})
        return kind, values

    # ---------------------------------------------------------------- crash guardian
    def _sync_guardian(self):
        """Keep the guardian process's copy of the original values current (and stop it
        when nothing is outstanding). Failures only warn: the other mechanisms remain."""
        if not self._use_guardian:
            return
        state = {p: dict(v) for p, v in self._original.items() if v}
        records = {p: r for p, r in self._records.items() if p in state}
        g = self._guardian
        if not state:
            if g is not None:
                self._guardian = None
                try:
                    g.stdin.write(b'{"state": {}}\n')
                    g.stdin.close()
                except OSError:
                    pass
                try:
                    g.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    g.kill()
                    g.wait()
            return
        line = (json.dumps({"state": state, "records": records,
                            "holder": self._holder()}) + "\n").encode()
        for _attempt in range(2):
            if g is None or g.poll() is not None:
                try:
                    g = subprocess.Popen(
                        [sys.executable, "-I", "-S",
                         os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      "_guardian.py"), str(os.getpid())],
                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True,
                        start_new_session=True)  # a kill of our process group spares it
                except OSError as exc:
                    warnings.warn(f"asymo.dvfs: cannot start the cpufreq crash guardian "
                                  f"({exc}); changes are still restored on exit and on "
                                  "SIGINT/SIGTERM", RuntimeWarning, stacklevel=3)
                    self._use_guardian = False
                    return
                self._guardian = g
            try:
                g.stdin.write(line)
                g.stdin.flush()
                return
            except OSError:
                g = None

    # ---------------------------------------------------------------- discovery
    def _all_policies(self):
        base = os.path.join(self.sysfs_root, CPUFREQ_DIR)
        try:
            names = os.listdir(base)
        except OSError:
            return []
        out = []
        for n in sorted((n for n in names if re.fullmatch(r"policy\d+", n)),
                        key=lambda n: int(n[6:])):
            path = os.path.join(base, n)
            text = read_attribute(os.path.join(path, "related_cpus")) or read_attribute(
                os.path.join(path, "affected_cpus"))
            cpus = _parse_cpus(text)
            if cpus:
                out.append(_Policy(path, cpus))
        return out

    def _resolve(self, cluster):
        named = cluster.cpufreq_policy
        if named:
            if os.path.isabs(named):
                candidates = [_reroot(named, self.sysfs_root)]
            elif os.sep in named:  # relative to the cwd (detect() joins sysfs_root) or root
                candidates = [named, os.path.join(self.sysfs_root, named)]
            else:
                candidates = [os.path.join(self.sysfs_root, CPUFREQ_DIR, named)]
            path = next((c for c in candidates if os.path.isdir(c)), candidates[-1])
            if os.path.isdir(path):
                cpus = _parse_cpus(read_attribute(os.path.join(path, "related_cpus"))
                                   or read_attribute(os.path.join(path, "affected_cpus"))
                                   ) or tuple(cluster.cpus)
                return [_Policy(os.path.realpath(path), cpus)]
        wanted = set(cluster.cpus)
        found = [p for p in self._all_policies() if wanted.intersection(p.cpus)]
        covered = set().union(*(p.cpus for p in found)) if found else set()
        for cpu in sorted(wanted - covered):  # old kernels: per-cpu cpufreq directories
            path = os.path.join(self.sysfs_root, _CPU_DIR, f"cpu{cpu}", "cpufreq")
            if os.path.isdir(path):
                real = os.path.realpath(path)
                if all(p.path != real for p in found):
                    cpus = (_parse_cpus(read_attribute(os.path.join(real, "related_cpus")))
                            or (cpu,))
                    found.append(_Policy(real, cpus))
        for p in found:
            p.path = os.path.realpath(p.path)
        return found

    def _cluster(self, cluster):
        """Accept a cluster name, index or Cluster; return its name."""
        if isinstance(cluster, Cluster):
            cluster = cluster.name
        if isinstance(cluster, bool):
            raise TypeError("cluster must be a name, an index or a Cluster, not a bool")
        if isinstance(cluster, int):
            try:
                return self.topology.clusters[cluster].name
            except IndexError:
                raise IndexError(f"cluster index {cluster} out of range: this topology has "
                                 f"{self.topology.nclusters} clusters") from None
        if isinstance(cluster, str):
            if cluster not in self._policies:
                raise KeyError(f"no cluster named {cluster!r}; clusters are "
                               f"{[c.name for c in self.topology.clusters]}")
            return cluster
        raise TypeError(f"cluster must be a name, an index or a Cluster, got "
                        f"{type(cluster).__name__}")

    def _policy_info(self, pol):
        f = pol.file
        governor = read_attribute(f(_GOV))
        govs = tuple((read_attribute(f("scaling_available_governors")) or "").split())
        listed = read_attribute(f("scaling_available_frequencies"))
        freqs = ()
        if listed:
            try:
                freqs = tuple(sorted({int(x) for x in listed.split()}))
            except ValueError:
                freqs = ()
            if any(x <= 0 for x in freqs):  # a corrupt list: ignore it, as an unparsable one
                freqs = ()
            listed = listed if freqs else None
        # a frequency of 0 kHz or less is corrupt data, not a bound
        cmin, cmax = (x if x is not None and x > 0 else None for x in
                      (_read_int(f("cpuinfo_min_freq")), _read_int(f("cpuinfo_max_freq"))))
        if not freqs:
            freqs = tuple(sorted({x for x in (cmin, cmax) if x}))
        smin, smax = _read_int(f(_MIN)), _read_int(f(_MAX))
        cur = _read_int(f("scaling_cur_freq")) or _read_int(f("cpuinfo_cur_freq"))
        method, reason, error = None, "", errno.ENODEV
        if not os.path.isdir(pol.path):
            reason = f"cpufreq policy directory {pol.path} does not exist"
            error = errno.ENOENT
        elif not freqs:
            reason = (f"{pol.path} lists no frequencies (neither scaling_available_frequencies "
                      "nor cpuinfo_min_freq/cpuinfo_max_freq)")
        elif "userspace" in govs and os.path.exists(f(_SPEED)) and os.path.exists(f(_GOV)):
            method = "userspace"
        elif os.path.exists(f(_MIN)) and os.path.exists(f(_MAX)):
            method = "clamp"
        else:
            reason = (f"{pol.path} has neither the userspace governor (available: "
                      f"{' '.join(govs) or 'none listed'}) nor scaling_min_freq/"
                      "scaling_max_freq")
        if method is not None:
            files = [_GOV, _SPEED] if method == "userspace" else [_MIN, _MAX]
            try:
                for name in files:
                    _check_writable(f(name))
            except CpuFreqError as exc:
                method, reason, error = None, str(exc.strerror or exc), exc.errno
        return PolicyInfo(path=pol.path, cpus=tuple(pol.cpus),
                          driver=read_attribute(f("scaling_driver")), governor=governor,
                          available_governors=govs, frequencies_khz=freqs,
                          frequencies_listed=bool(listed), cpuinfo_min_khz=cmin,
                          cpuinfo_max_khz=cmax, scaling_min_khz=smin, scaling_max_khz=smax,
                          cur_khz=cur, method=method, reason=reason,
                          error=None if method else error)

    # ---------------------------------------------------------------- reading
    def policies(self, cluster):
        """``PolicyInfo`` of every cpufreq policy behind ``cluster`` (fresh sysfs read)."""
        return [self._policy_info(p) for p in self._policies[self._cluster(cluster)]]

    def info(self, cluster):
        """One ``PolicyInfo`` summarising the cluster (its first policy; the method and reason
        account for all of them)."""
        name = self._cluster(cluster)
        infos = self.policies(name)
        if not infos:
            cpus = next(c.cpus for c in self.topology.clusters if c.name == name)
            return PolicyInfo(path="", cpus=tuple(cpus), driver=None, governor=None,
                              available_governors=(), frequencies_khz=(),
                              frequencies_listed=False, cpuinfo_min_khz=None,
                              cpuinfo_max_khz=None, scaling_min_khz=None,
                              scaling_max_khz=None, cur_khz=None, method=None,
                              reason=f"no cpufreq policy found for cluster {name!r} (cpus "
                                     f"{list(cpus)}) under "
                                     f"{os.path.join(self.sysfs_root, CPUFREQ_DIR)}",
                              error=errno.ENODEV)
        first = infos[0]
        bad = [i for i in infos if i.method is None]
        if bad:
            return _replace(first, method=None, reason=bad[0].reason, error=bad[0].error)
        if len({i.method for i in infos}) > 1:
            return _replace(first, method="mixed")
        return first

    def governors(self):
        """``{cluster name: governor}`` (None where unreadable)."""
        return {c.name: self.info(c.name).governor for c in self.topology.clusters}

    def available_frequencies(self, cluster):
        """Settable frequencies in kHz, ascending (``scaling_available_frequencies``, or the
        ``cpuinfo_min_freq`` / ``cpuinfo_max_freq`` pair where the driver lists none)."""
        return self.info(cluster).frequencies_khz

    def frequency(self, cluster):
        """Current frequency (kHz) of the cluster's first policy, or None if unreadable."""
        return self.info(cluster).cur_khz

    def max_frequency(self, cluster):
        info = self.info(cluster)
        return info.cpuinfo_max_khz or (info.frequencies_khz[-1] if info.frequencies_khz
                                        else None)

    def can_set(self, cluster):
        """True if this process can set the cluster's frequency (see ``info().reason``)."""
        return self.info(cluster).method is not None

    @property
    def changed(self):
        """True while some setting differs from what it was before our first write."""
        return bool(self._original)

    # ---------------------------------------------------------------- writing
    def _write(self, path, value):
        """One write of ``value`` to a sysfs attribute (single write() call, like ``echo``)."""
        data = str(value).encode()
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            n = os.write(fd, data)
            if n != len(data):
                raise OSError(errno.EIO, f"short write to {path}")
        finally:
            os.close(fd)
        self.write_log.append((path, str(value)))

    def _bounds_plan(self, path, lo, hi):
        """Writes that move (min, max) to (lo, hi) keeping min <= max after each write."""
        cur_min = _read_int(os.path.join(path, _MIN))
        steps = []
        if hi is not None and (cur_min is None or lo is None or hi >= cur_min):
            steps.append((_MAX, hi))
            if lo is not None:
                steps.append((_MIN, lo))
        else:
            if lo is not None:
                steps.append((_MIN, lo))
            if hi is not None:
                steps.append((_MAX, hi))
        return steps

    def _plan_set(self, info, khz):
        """The list of (file, value) writes that sets one policy to ``khz``."""
        steps = []
        if info.method == "userspace":
            lo = khz if info.scaling_min_khz is not None and khz < info.scaling_min_khz else None
            hi = khz if info.scaling_max_khz is not None and khz > info.scaling_max_khz else None
            if lo is not None or hi is not None:
                steps += self._bounds_plan(info.path, lo, hi)
            if info.governor != "userspace":
                steps.append((_GOV, "userspace"))
            steps.append((_SPEED, khz))
        else:
            steps += self._bounds_plan(info.path, khz, khz)
        return steps

    def _snapshot(self, path, names):
        snap = {}
        gov = read_attribute(os.path.join(path, _GOV))
        for name in names:
            if name == _SPEED and gov != "userspace":
                continue  # reads "<unsupported>" under other governors: nothing to put back
            value = read_attribute(os.path.join(path, name))
            if value is not None:
                snap[name] = value
        return snap

    def _put_back(self, states, handed_back=None):
        """Write ``{policy path: {file: value}}`` back (bounds ordered, then governor, then
        setspeed). Collects errors and raises one CpuFreqError at the end. A file that no
        longer exists (the cpu went offline, the driver was unloaded) has nothing to restore:
        a RuntimeWarning, not an error."""
        errors, vanished = [], []
        with self._lock:
            for path, state in (handed_back or {}).items():
                self._write_state(path, state, errors, vanished)
            pending = list(states.items())
            while pending:
                path, state = pending.pop(0)
                self._write_state(path, state, errors, vanished)
                orig = self._original.get(path)
                if orig is None:
                    continue
                for k in [k for k in orig if not os.path.exists(os.path.join(path, k))]:
                    del orig[k]  # vanished: nothing left to restore there
                if all(read_attribute(os.path.join(path, k)) == str(v) for k, v in orig.items()):
                    del self._original[path]
                    if path in self._records:
                        # back to our originals (a rollback, an undo): leave the shared record;
                        # as its last holder, put back what others left to us
                        kind, rest = self._leave(path)
                        if kind in ("last", "top") and rest:
                            pending.append((path, rest))
            if not self._original:
                _unregister(self)
            self._sync_guardian()
        if vanished:
            warnings.warn("asymo.dvfs: cpufreq files vanished before they could be restored "
                          "(cpu offline?): " + ", ".join(sorted(set(vanished))),
                          RuntimeWarning, stacklevel=3)
        if errors:
            raise CpuFreqError(errno.EIO, "could not restore cpufreq settings: "
                                          + "; ".join(errors))

    def _write_state(self, path, state, errors, vanished):
        lo, hi = state.get(_MIN), state.get(_MAX)
        steps = self._bounds_plan(path, int(lo) if lo is not None else None,
                                  int(hi) if hi is not None else None) \
            if (lo is not None or hi is not None) else []
        if _GOV in state:
            steps.append((_GOV, state[_GOV]))
        if _SPEED in state:
            steps.append((_SPEED, state[_SPEED]))
        for name, value in steps:
            fpath = os.path.join(path, name)
            if read_attribute(fpath) == str(value):
                continue
            try:
                self._write(fpath, value)
            except FileNotFoundError:
                vanished.append(fpath)
            except OSError as exc:
                if not os.path.exists(fpath):
                    vanished.append(fpath)
                else:
                    errors.append(f"{fpath} <- {value}: {exc.strerror or exc}")

    def set_frequency(self, cluster, khz, *, nearest=False):
        """Set one cluster's frequency (kHz). See ``set_frequencies``."""
        return self.set_frequencies({cluster: khz}, nearest=nearest)

    def set_frequencies(self, targets, *, nearest=False):
        """Set several clusters' frequencies, all or nothing.

        Parameters
        ----------
        targets : dict
            ``{cluster (name, index or Cluster): kHz}``.
        nearest : bool
            Snap each target to the closest available frequency instead of raising
            ``ValueError`` when it is not one of them.

        Returns
        -------
        FrequencyChange
            ``.undo()`` (or using it as a context manager) puts back what was there before
            this call. ``restore()`` puts back what was there before the first change.

        Raises
        ------
        ValueError
            A frequency that is not available (or outside ``cpuinfo_min_freq`` ..
            ``cpuinfo_max_freq`` where no list exists), or two clusters sharing a policy
            asked for different frequencies.
        CpuFreqError
            cpufreq absent or not permitted (nothing written), or a write rejected by the
            kernel (earlier writes rolled back).
        """
        if not isinstance(targets, dict):
            raise TypeError("targets must be a dict {cluster: kHz}")
        per_policy = {}
        resolved = {}
        for cluster, khz in targets.items():
            name = self._cluster(cluster)
            khz = _as_khz(khz, name)
            info = self.info(name)
            if info.method is None:
                cls = CpuFreqPermissionError if info.error in (errno.EACCES, errno.EPERM) \
                    else CpuFreqError
                raise cls(info.error or errno.ENODEV,
                          f"cannot set the frequency of cluster {name!r}: {info.reason}")
            khz = _validate(info, khz, name, nearest)
            resolved[name] = khz
            for pinfo in self.policies(name):
                prev = per_policy.get(pinfo.path)
                if prev is not None and prev[1] != khz:
                    raise ValueError(
                        f"clusters share cpufreq policy {pinfo.path} (cpus "
                        f"{list(pinfo.cpus)}) but were asked for different frequencies "
                        f"({prev[1]} and {khz} kHz)")
                per_policy[pinfo.path] = (pinfo, khz)
        with self._lock:
            plans = {path: self._plan_set(pinfo, khz) for path, (pinfo, khz) in
                     per_policy.items()}
            # Pre-flight: every file we will write must be writable, or nothing is written.
            for path, steps in plans.items():
                for name, _ in steps:
                    _check_writable(os.path.join(path, name))
            touched = {path: [n for n, _ in steps] for path, steps in plans.items()}
            before = {path: self._snapshot(path, names + ([_SPEED] if _GOV in names else []))
                      for path, names in touched.items()}
            for path, snap in before.items():
                orig = self._original.setdefault(path, {})
                # the true originals when another process changed the policy first
                for k, v in self._join(path, {**snap, **orig}).items():
                    orig.setdefault(k, v)
                    if path in self._records:
                        orig[k] = v
                if orig.get(_GOV, "userspace") != "userspace":
                    orig.pop(_SPEED, None)  # the original governor had no setspeed
            if any(self._original.values()):
                _register(self)
                self._sync_guardian()
            done = []
            try:
                for path, steps in plans.items():
                    done.append(path)
                    for name, value in steps:
                        self._write(os.path.join(path, name), value)
            except OSError as exc:
                try:
                    self._put_back({p: before[p] for p in done})
                except CpuFreqError as exc2:
                    raise CpuFreqError(
                        exc.errno or errno.EIO,
                        f"writing cpufreq failed ({exc}) and the rollback failed too "
                        f"({exc2})") from exc
                if isinstance(exc, CpuFreqError):
                    raise
                cls = CpuFreqPermissionError if exc.errno in (errno.EACCES, errno.EPERM) \
                    else CpuFreqError
                raise cls(exc.errno or errno.EIO,
                          f"the kernel rejected a cpufreq write ({exc}); earlier writes of "
                          "this call were rolled back") from exc
            return FrequencyChange(self, resolved, before)

    def checkpoint(self, clusters=None):
        """Remember the current settings of ``clusters`` (default all); the returned
        ``FrequencyChange``'s ``undo()`` puts them back, whatever was set in between."""
        names = [self._cluster(c) for c in clusters] if clusters is not None else \
            [c.name for c in self.topology.clusters]
        before = {}
        with self._lock:
            for n in names:
                for p in self._policies[n]:
                    before[p.path] = self._snapshot(p.path, [_MIN, _MAX, _GOV, _SPEED])
        return FrequencyChange(self, {}, before)

    def set_max(self, clusters=None):
        """Set clusters (default: all that can be set) to their maximum frequency."""
        names = [self._cluster(c) for c in clusters] if clusters is not None else \
            [c.name for c in self.topology.clusters if self.can_set(c.name)]
        return self.set_frequencies({n: self.max_frequency(n) for n in names})

    def restore(self):
        """Put back every setting changed through this object (idempotent)."""
        with self._lock:
            if not self._original:
                _unregister(self)
                return
            states, handed_back = {}, {}
            for p in list(self._original):
                kind, values = self._leave(p)
                if kind in ("last", "absent"):
                    states[p] = dict(values)
                else:  # another process still uses the policy: the last one restores it
                    del self._original[p]
                    if values:  # "top": put back the setting of the one before us
                        handed_back[p] = values
            self._put_back(states, handed_back)

    close = restore

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False

    def __repr__(self):
        return (f"CpuFreq(clusters={[c.name for c in self.topology.clusters]}, "
                f"sysfs_root={self.sysfs_root!r}, changed={self.changed})")

    def describe(self):
        """Plain-data summary of every cluster (for ``asymo dvfs status`` and reports)."""
        out = {}
        for c in self.topology.clusters:
            info = self.info(c.name)
            d = info.to_dict()
            d["policy_cpus"] = d.pop("cpus")
            out[c.name] = {"cpus": list(c.cpus), **d}
        return out


def _replace(info, **changes):
    d = dict(info.__dict__)
    d.update(changes)
    return PolicyInfo(**d)


def _parse_cpus(text):
    if not text:
        return ()
    try:
        return parse_cpulist(text.replace(" ", ","))
    except ValueError:
        return ()


def _as_khz(value, name):
    try:
        import numbers
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError
        khz = int(value)
        if khz != value:
            raise TypeError
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"frequency for cluster {name!r} must be an integer number of kHz, "
                        f"got {value!r}") from None
    if khz <= 0:
        raise ValueError(f"frequency for cluster {name!r} must be positive, got {khz} kHz")
    return khz


def _validate(info, khz, name, nearest):
    freqs = info.frequencies_khz
    if info.frequencies_listed:
        if khz in freqs:
            return khz
        if nearest:
            return min(freqs, key=lambda f: (abs(f - khz), -f))
        raise ValueError(f"{khz} kHz is not an available frequency of cluster {name!r}; "
                         f"available: {list(freqs)} (pass nearest=True to snap)")
    lo = info.cpuinfo_min_khz or freqs[0]
    hi = info.cpuinfo_max_khz or freqs[-1]
    if lo <= khz <= hi:
        return khz
    if nearest:
        return min(max(khz, lo), hi)
    raise ValueError(f"{khz} kHz is outside cluster {name!r}'s range {lo}..{hi} kHz")
