"""Emulate an asymmetric CPU on a symmetric one.

A helper process pinned to each slowed core runs at SCHED_FIFO priority and, on a grid of
absolute deadlines ``period`` apart (0.5 ms by default), spins for ``1 - speed`` of each period
and sleeps for the rest. Any thread on that core, of any library, then gets ``speed`` of it: a
slow core whose slowness does not depend on who runs there, so asymo, NumPy and torch can be
compared side by side on the same emulated machine.

The period. A slowed core does not run continuously at ``speed``: it stops for ``(1 - speed) *
period`` of every period, so work shorter than a period is either not slowed at all or stalled
for a whole stop, where a real slow core would stretch it by ``1 / speed``. Shorter periods
are more faithful at the time scale of one task, but every stop costs the workload some speed
(the switch, and on a VM the core's caches refilled after the helper's spin): measured on the
development VM (2 vCPU AMD EPYC, KVM; ``bench/emulator_speed.py --periods``, speed 0.5),
single-thread float32 matmul ran at 0.496 / 0.477 / 0.451 / 0.432 / 0.396 of the free core at
periods 1 / 0.5 / 0.25 / 0.2 / 0.1 ms, and 100-us units of work were stretched by a median of
1.00 (10% of them by 8x) at 1 ms against 2.37 (p90 2.78) at 0.25 ms. The default, 0.5 ms, is
the shortest period whose delivered speed stays within 5% of the requested one for cache-heavy
work; it halves the longest stall of the former 1 ms. Pass ``period=`` (CLI ``--period``) to
choose; `asymo.plan.split_cost` reads the period of a running emulation from env
``ASYMO_EMULATED_PERIOD``.

This emulates *speed*, not cache size, memory bandwidth or instruction set: a slowed core keeps
its caches. Say so wherever emulated results are shown.

>>> import asymo.lab.emulate
>>> with asymo.lab.emulate.slow_cores({1: 0.5}) as emu:      # doctest: +SKIP
...     asymo.hw.topology.detect()      # two clusters: [0] at 1.0, then [1] at 0.5

Inside the block, env ``ASYMO_TOPOLOGY`` describes the emulated machine (slowed cores form
slower clusters, fastest first), env ``ASYMO_EMULATED`` lists ``cpu:speed`` pairs and env
``ASYMO_EMULATED_PERIOD`` gives the period in seconds; all are inherited by child processes and
restored on exit. Callables in :data:`on_topology_change` are
called after each change so caches of the topology (the default pool) can be dropped.

Safety: a helper dies with its parent (``PR_SET_PDEATHSIG`` + a ``getppid()`` check, which also
covers a parent that died before the helper armed the signal), stops by itself after
``time_limit`` seconds, and is killed when the block exits, by exception or not. SIGKILL of the
parent therefore never leaves a core occupied. PR_SET_PDEATHSIG follows the *thread* that
started the helper: start and stop an emulation in the same thread (a ``with`` block does).

Real-time scheduling needs root, CAP_SYS_NICE or ``ulimit -r`` >= 1. Where it is refused,
:class:`RealtimeUnavailableError` says so; ``mode="approximate"`` runs the helpers as normal
(SCHED_OTHER) threads at the lowest nice value allowed instead. The scheduler then shares the
core by weight, not by the clock, so the speed obtained is only approximate (unprivileged, with
the helper at nice 0 against a nice-0 workload, roughly no slower than 0.5); never use it for
published figures.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import selectors
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping

from asymo.plan import split_cost as _split_cost
from asymo.hw import topology as _topology
from asymo.lab.occupier import EXIT_PARENT_GONE, EXIT_TIME_LIMIT, lock_path

__all__ = [
    "slow_cores", "Emulation", "EmulationError", "RealtimeUnavailableError",
    "emulated_topology", "min_speed", "realtime_available", "format_emulated",
    "on_topology_change", "ENV_EMULATED", "ENV_PERIOD", "MODES",
]

ENV_EMULATED = _topology.EMULATED_ENV_VAR  # "ASYMO_EMULATED"
#: the period (seconds) of the running emulation, for cost models (`asymo.plan.split_cost`)
ENV_PERIOD = _split_cost.PERIOD_ENV_VAR  # "ASYMO_EMULATED_PERIOD"
MODES = ("fifo", "approximate")
#: seconds per spin/sleep cycle (see the module docstring for the measurements behind it)
DEFAULT_PERIOD = _split_cost.DEFAULT_EMULATED_PERIOD
DEFAULT_TIME_LIMIT = 3600.0
MIN_PERIOD, MAX_PERIOD = 1e-4, 0.1
READY_TIMEOUT = 30.0  # seconds for a helper to start (a loaded 2-core box is slow to fork)

# Called with no arguments after an emulation changed (or restored) ASYMO_TOPOLOGY, so modules
# that cache a topology can drop it. asymo.runtime.pool.reset_default_pool is called before these
# when asymo.runtime.pool is loaded.
on_topology_change = []

_registry_lock = threading.Lock()
_active_cpus = {}  # cpu -> id() of the Emulation slowing it in this process (no reference,
                  # so a forgotten Emulation can still be collected and stop its helpers)


class EmulationError(RuntimeError):
    """An emulator helper could not be started or stopped running too early."""


class RealtimeUnavailableError(EmulationError, PermissionError):
    """The kernel refused SCHED_FIFO for an emulator helper."""


def min_speed(mode="fifo"):
    """Slowest speed the emulator can produce in ``mode``.

    Real-time tasks may use at most ``sched_rt_runtime_us / sched_rt_period_us`` of a core (95%
    by default), so a SCHED_FIFO helper cannot leave less than the rest: 0.05.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "approximate":
        return 0.0
    runtime, period = _rt_limits()
    if runtime is None or runtime < 0:
        return 0.0
    return max(0.0, 1.0 - runtime / period)


def _rt_limits():
    try:
        with open("/proc/sys/kernel/sched_rt_runtime_us") as f:
            runtime = int(f.read())
        with open("/proc/sys/kernel/sched_rt_period_us") as f:
            period = int(f.read())
        if period <= 0:
            raise ValueError
        return runtime, period
    except (OSError, ValueError):
        return 950000, 1000000  # the kernel's default


def realtime_available():
    """Whether this process may use SCHED_FIFO (tried in a throwaway thread)."""
    result = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            result.append(True)
        except (OSError, AttributeError):
            result.append(False)

    t = threading.Thread(target=probe, name="asymo-rt-probe")
    t.start()
    t.join()
    return result[0]


def format_emulated(speeds):
    """``{cpu: speed}`` as ``ASYMO_EMULATED`` text (``"1:0.5,3:0.75"``); the inverse of
    :func:`asymo.hw.topology.parse_emulated`."""
    return ",".join(f"{cpu}:{speed:.6g}" for cpu, speed in sorted(speeds.items()))


def _affinity():
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return set(range(os.cpu_count() or 1))


def emulated_topology(speeds, base=None, cpus=None):
    """The topology of this machine with the cores in ``speeds`` slowed.

    Each cluster of ``base`` keeps its unslowed cpus; its slowed cpus form one new cluster per
    distinct speed, with capacity ``cluster capacity * speed`` and the same caches (the emulator
    slows cores, it does not shrink caches). Clusters are ordered fastest first and
    capacities renormalised so the fastest is 1.0.

    Parameters
    ----------
    speeds : mapping of int to float
        cpu -> speed in (0, 1]; speed 1.0 leaves the cpu as it is.
    base : Topology, optional
        The machine before slowing; ``asymo.hw.topology.detect()`` by default.
    cpus : iterable of int, optional
        Usable cpus; this process's affinity mask by default. Others are dropped.

    Returns
    -------
    Topology
        ``emulated`` holds ``base.emulated`` plus the slowed cpus of ``speeds``.
    """
    speeds = _check_speeds(speeds, "approximate")  # types, cpu >= 0, speed in (0, 1]
    if base is None:
        base = _topology.detect()
    allowed = set(cpus) if cpus is not None else _affinity()
    clusters, used_names, placed = [], set(), set()
    for cl in base.clusters:
        by_speed = {}
        for c in cl.cpus:
            if c in allowed:
                by_speed.setdefault(float(speeds.get(c, 1.0)), []).append(c)
                placed.add(c)
        for s in sorted(by_speed, reverse=True):
            name = cl.name if s == 1.0 else f"{cl.name}-emu{s:g}"
            while name in used_names:
                name += "'"
            used_names.add(name)
            clusters.append(dataclasses.replace(cl, name=name, cpus=tuple(by_speed[s]),
                                                capacity=cl.capacity * s))
    if not clusters:
        raise ValueError("no cpu of the topology is in this process's affinity mask")
    top = max(c.capacity for c in clusters)
    clusters = sorted((dataclasses.replace(c, capacity=c.capacity / top) for c in clusters),
                      key=lambda c: -c.capacity)
    emulated = dict(base.emulated)
    # only cpus of the result: a cpu outside it was not slowed, whatever ``speeds`` said
    emulated.update({c: s for c, s in speeds.items() if s != 1.0 and c in placed})
    return base.replace(clusters=tuple(clusters), emulated=emulated)


def _check_speeds(speeds, mode):
    if not isinstance(speeds, Mapping):
        raise TypeError("speeds must be a mapping {cpu: speed}, e.g. {1: 0.5}, "
                        f"not {type(speeds).__name__}")
    floor = min_speed(mode)
    out = {}
    for cpu, speed in speeds.items():
        if isinstance(cpu, bool) or not isinstance(cpu, numbers.Integral):
            raise TypeError(f"cpu ids must be integers, got {cpu!r}")
        if isinstance(speed, bool) or not isinstance(speed, numbers.Real):
            raise TypeError(f"speed of cpu {cpu} must be a number, got {speed!r}")
        cpu, speed = int(cpu), float(speed)
        if cpu < 0:
            raise ValueError(f"cpu ids are >= 0, got {cpu}")
        if not (0.0 < speed <= 1.0):
            raise ValueError(f"speed of cpu {cpu} must be in (0, 1] (a fraction of the core "
                             f"left to everyone else), got {speed!r}")
        # (1 - 950000 / 1000000 is 0.050000000000000044: 0.05 itself must pass)
        if speed < floor - 1e-9:
            runtime, period = _rt_limits()
            raise ValueError(
                f"speed {speed:g} of cpu {cpu} is below {floor:g}, the slowest the emulator "
                f"can make a core: the kernel lets real-time tasks use at most "
                f"{runtime / period:.0%} of a core (kernel.sched_rt_runtime_us={runtime} of "
                f"sched_rt_period_us={period})")
        out[cpu] = speed
    return dict(sorted(out.items()))


class _Helper:
    """One occupier process and the read end of its status pipe."""

    def __init__(self, cpu, speed, proc, ready_r):
        self.cpu, self.speed, self.proc, self.ready_r = cpu, speed, proc, ready_r
        self.status = b""
        self.detail = ""  # what the helper reported once running, e.g. "fifo priority=1"

    @property
    def pid(self):
        return self.proc.pid


class Emulation:
    """Slows some cores while active; use through :func:`slow_cores` as a context manager.

    Parameters
    ----------
    speeds : mapping of int to float
        cpu -> speed in (0, 1], the share of the core left to everyone else. 1.0 starts no
        helper; in ``"fifo"`` mode speeds below :func:`min_speed` (0.05) are impossible.
    period : float, default 5e-4
        Seconds per spin/sleep cycle, in [1e-4, 0.1]. Shorter periods slow the core more
        evenly (work shorter than a period is otherwise either not slowed or stalled for a
        whole stop); longer ones cost fewer interruptions, whose cost makes the core slower
        than requested at short periods (module docstring).
    time_limit : float, default 3600
        Seconds after which the helpers stop by themselves, whatever happens to this process.
        A helper that stopped before the block ended is reported by a RuntimeWarning on exit.
    mode : {"fifo", "approximate"}
        ``"fifo"``: SCHED_FIFO helpers (needs root or CAP_SYS_NICE), precise. ``"approximate"``:
        SCHED_OTHER helpers at the lowest nice value allowed; share by weight, imprecise.

    Attributes
    ----------
    topology : Topology or None
        The emulated topology while active.
    env : dict
        The environment variables set while active.
    """

    def __init__(self, speeds, *, period=DEFAULT_PERIOD, time_limit=DEFAULT_TIME_LIMIT,
                 mode="fifo"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.speeds = _check_speeds(speeds, mode)
        try:
            period = float(period)
            time_limit = float(time_limit)
        except (TypeError, ValueError):
            raise TypeError("period and time_limit must be numbers of seconds") from None
        if not MIN_PERIOD <= period <= MAX_PERIOD:
            raise ValueError(f"period must be in [{MIN_PERIOD:g}, {MAX_PERIOD:g}] seconds, "
                             f"got {period!r}")
        if not (0 < time_limit < 1e8) or math.isnan(time_limit):
            raise ValueError(f"time_limit must be a positive finite number of seconds, "
                             f"got {time_limit!r}")
        self.period, self.time_limit = period, time_limit
        self.topology = None
        self.env = {}
        self._helpers = []
        self._saved_env = None
        self._owner_pid = None

    # -- public ---------------------------------------------------------------------------
    @property
    def active(self):
        return self._saved_env is not None

    @property
    def slowed(self):
        """cpu -> speed of the cores that have a helper."""
        return {c: s for c, s in self.speeds.items() if s < 1.0}

    @property
    def pids(self):
        """cpu -> pid of each running helper."""
        return {h.cpu: h.pid for h in self._helpers}

    @property
    def helper_status(self):
        """cpu -> what each helper reported once running, e.g. ``"fifo priority=1"`` or
        ``"approximate nice=-20"``."""
        return {h.cpu: h.detail for h in self._helpers}

    def start(self):
        """Start the helpers and set the environment. Raises on any failure, leaving nothing
        running."""
        if self.active:
            raise RuntimeError("this emulation is already active")
        allowed = _affinity()
        outside = sorted(set(self.speeds) - allowed)
        if outside:
            raise ValueError(f"cpu {outside[0]} is not in this process's affinity mask "
                             f"({_topology.format_cpulist(allowed)}); asymo never pins outside it")
        inherited = self._inherited_emulation()
        slowed = self.slowed
        with _registry_lock:
            busy = sorted((set(_active_cpus) | set(inherited)) & set(slowed))
            if busy:
                raise ValueError(f"cpu {busy[0]} is already slowed by an enclosing emulation")
            for cpu in slowed:
                _active_cpus[cpu] = id(self)
        try:
            env = {}
            if slowed:
                topo = emulated_topology(self.speeds, cpus=allowed)
                # An enclosing emulation (e.g. `asymo emulate -- python ...`) is already in
                # ASYMO_TOPOLOGY; keep its cpus in ASYMO_EMULATED too.
                topo = topo.replace(emulated={**inherited, **topo.emulated})
                env = {_topology.ENV_VAR: topo.to_spec(),
                       ENV_EMULATED: format_emulated(topo.emulated),
                       ENV_PERIOD: repr(self.period)}
                self.topology = topo
            self._start_helpers(slowed)
        except BaseException:
            self._release_cpus()
            self.topology = None
            raise
        self.env = env
        self._saved_env = {k: os.environ.get(k) for k in env}
        self._owner_pid = os.getpid()
        os.environ.update(env)
        if env:
            _notify_topology_change()
        return self

    def check(self):
        """Raise EmulationError if a helper is no longer running."""
        problems = self._early_exits()
        if problems:
            raise EmulationError("; ".join(problems))

    def stop(self):
        """Stop the helpers and restore the environment (idempotent)."""
        if not self.active or os.getpid() != self._owner_pid:
            return  # a forked child does not own its parent's helpers
        try:
            problems = self._early_exits()
            self._stop_helpers()
        finally:
            saved, self._saved_env = self._saved_env, None
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self._release_cpus()
            if saved:
                _notify_topology_change()
        if problems:
            warnings.warn("emulation ended early, so part of the run was NOT emulated: "
                          + "; ".join(problems), RuntimeWarning, stacklevel=3)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        # A forgotten Emulation must not keep cores busy until the time limit, nor leave the
        # environment describing cores that are no longer slowed.
        if os.getpid() != getattr(self, "_owner_pid", None):
            return
        if getattr(self, "_helpers", None):
            for h in self._helpers:
                try:
                    h.proc.kill()
                except OSError:
                    pass
            self._release_cpus()
        saved, self._saved_env = getattr(self, "_saved_env", None), None
        if saved:
            for k, v in saved.items():
                if os.environ.get(k) != self.env.get(k):
                    continue  # changed since (another emulation): not ours to undo
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            try:
                _notify_topology_change()
            except Exception:  # noqa: BLE001 - a finalizer must not raise
                pass

    def __repr__(self):
        speeds = ", ".join(f"cpu{c}@{s:g}" for c, s in self.speeds.items())
        return (f"Emulation({speeds}, mode={self.mode!r}, period={self.period:g}, "
                f"{'active' if self.active else 'inactive'})")

    # -- helpers --------------------------------------------------------------------------
    @staticmethod
    def _inherited_emulation():
        emulated, problems = _topology.parse_emulated(os.environ.get(ENV_EMULATED, ""))
        for p in problems:
            warnings.warn(f"{ENV_EMULATED}: {p}; ignored", RuntimeWarning, stacklevel=4)
        return emulated

    def _release_cpus(self):
        with _registry_lock:
            for cpu in list(_active_cpus):
                if _active_cpus[cpu] == id(self):
                    del _active_cpus[cpu]

    def _start_helpers(self, slowed):
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"]
                                          if env.get("PYTHONPATH") else "")
        try:
            for cpu, speed in slowed.items():
                r, w = os.pipe()
                try:
                    cmd = [sys.executable, "-m", "asymo.lab.occupier", "--cpu", str(cpu),
                           "--busy", repr(1.0 - speed),
                           "--period-ns", str(int(round(self.period * 1e9))),
                           "--time-limit", repr(self.time_limit), "--mode", self.mode,
                           "--parent-pid", str(os.getpid()), "--ready-fd", str(w)]
                    # A new session: a Ctrl-C meant for the workload does not reach the helper.
                    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            pass_fds=(w,), env=env, start_new_session=True)
                except BaseException:
                    os.close(r)
                    raise
                finally:
                    os.close(w)
                self._helpers.append(_Helper(cpu, speed, proc, r))
            self._wait_ready()
        except BaseException:
            self._stop_helpers()
            raise

    def _wait_ready(self):
        sel = selectors.DefaultSelector()
        pending = {}
        for h in self._helpers:
            sel.register(h.ready_r, selectors.EVENT_READ, h)
            pending[h.ready_r] = h
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    cpus = ", ".join(str(h.cpu) for h in pending.values())
                    raise EmulationError(f"emulator helper for cpu {cpus} did not start within "
                                         f"{READY_TIMEOUT:g} s")
                for key, _ in sel.select(timeout=left):
                    h = key.data
                    chunk = os.read(h.ready_r, 256)
                    h.status += chunk
                    if chunk and not h.status.endswith(b"\n"):
                        continue
                    sel.unregister(h.ready_r)
                    del pending[h.ready_r]
                    os.close(h.ready_r)
                    h.ready_r = None
                    self._check_status(h)
        finally:
            sel.close()

    def _check_status(self, h):
        words = h.status.decode(errors="replace").split()
        if words and words[0] == "ok":
            h.detail = " ".join(words[1:])
            return
        if len(words) == 3 and words[0] == "error":
            step, err = words[1], int(words[2]) if words[2].isdigit() else 0
            if step == "sched_setscheduler" and err in (1, 13):  # EPERM, EACCES
                raise RealtimeUnavailableError(
                    f"the kernel refused SCHED_FIFO for the emulator helper on cpu {h.cpu} "
                    f"({os.strerror(err)}). Real-time scheduling needs root or the "
                    "CAP_SYS_NICE capability (or `ulimit -r` >= 1), and a cgroup with "
                    "real-time runtime (cpu.rt_runtime_us > 0) where RT group scheduling is "
                    "enabled" + (" (this process is root, so CAP_SYS_NICE was dropped, as in "
                                 "an unprivileged container)" if os.geteuid() == 0 else "")
                    + ". Run as root, grant CAP_SYS_NICE, or ask for the imprecise "
                    "SCHED_OTHER emulator by name: mode='approximate' (CLI: --approximate).")
            if step == "cpu_busy":
                raise EmulationError(
                    f"cpu {h.cpu} is already slowed by an emulator helper of another process "
                    f"(it holds {lock_path(h.cpu)}); two helpers on one core would "
                    "add up. Wait for that emulation to end.")
            if step == "sched_setaffinity":
                raise EmulationError(f"cannot pin the emulator helper to cpu {h.cpu}: "
                                     f"{os.strerror(err)} (is it online and in the cpuset?)")
            raise EmulationError(f"emulator helper for cpu {h.cpu} failed at {step}: "
                                 f"{os.strerror(err) if err else words[2]}")
        # No status line: the helper died before reporting (e.g. asymo._native missing).
        try:
            _, err_text = h.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            err_text = b""
        tail = err_text.decode(errors="replace").strip().splitlines()[-3:]
        raise EmulationError(f"emulator helper for cpu {h.cpu} exited before starting "
                             f"(status {h.proc.poll()}): " + (" | ".join(tail) or "no output"))

    def _early_exits(self):
        problems = []
        for h in self._helpers:
            rc = h.proc.poll()
            if rc is None:
                continue
            if rc == EXIT_TIME_LIMIT:
                why = f"reached its time limit of {self.time_limit:g} s"
            elif rc == EXIT_PARENT_GONE:
                why = "found its parent gone (started from a thread that has exited?)"
            elif rc < 0:
                why = (f"was killed by signal {-rc} (PR_SET_PDEATHSIG fires when the thread "
                       "that started the emulation exits: start and stop it in one thread)")
            else:
                why = f"exited with status {rc}"
            problems.append(f"the helper slowing cpu {h.cpu} {why}")
        return problems

    def _stop_helpers(self):
        helpers, self._helpers = self._helpers, []
        for h in helpers:
            if h.proc.poll() is None:
                try:
                    h.proc.kill()
                except OSError:
                    pass
        for h in helpers:
            try:
                h.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
                pass
            if h.ready_r is not None:
                os.close(h.ready_r)
                h.ready_r = None


def _notify_topology_change():
    # The default pool pins its workers by the topology it was built from. Only a pool that
    # exists is reset: importing asymo.runtime.pool here would start nothing useful.
    pool = sys.modules.get("asymo.runtime.pool")
    hooks = list(on_topology_change)
    if pool is not None and hasattr(pool, "reset_default_pool"):
        hooks.insert(0, pool.reset_default_pool)
    for hook in hooks:
        try:
            hook()
        except Exception as exc:  # a stale cache must not keep a core occupied
            warnings.warn(f"asymo.lab.emulate.on_topology_change hook {hook!r} failed: {exc!r}",
                          RuntimeWarning, stacklevel=3)


def slow_cores(speeds, *, period=DEFAULT_PERIOD, time_limit=DEFAULT_TIME_LIMIT, mode="fifo"):
    """Slow the given cores while a ``with`` block runs.

    Parameters
    ----------
    speeds : mapping of int to float
        cpu -> speed in (0, 1], e.g. ``{1: 0.5}`` leaves half of cpu 1 to everyone else.
    period, time_limit, mode
        See :class:`Emulation`.

    Returns
    -------
    Emulation
        A context manager; ``with`` returns it, active (``.topology``, ``.env``, ``.pids``).

    Raises
    ------
    ValueError
        Bad speeds, cpus outside the affinity mask, a cpu already slowed.
    RealtimeUnavailableError
        SCHED_FIFO refused (not root, no CAP_SYS_NICE) and ``mode`` is not ``"approximate"``.
    EmulationError
        A helper could not be started.

    Examples
    --------
    >>> with slow_cores({1: 0.5}) as emu:     # doctest: +SKIP
    ...     print(os.environ["ASYMO_TOPOLOGY"])
    c0:0@1,c0-emu0.5:1@0.5
    """
    return Emulation(speeds, period=period, time_limit=time_limit, mode=mode)
