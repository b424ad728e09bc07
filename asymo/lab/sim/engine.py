"""Discrete-event simulation of asymo's pool running jobs on a (possibly imaginary) CPU.

The model is the pool's own: one worker per core, a job is ``ntasks`` calls partitioned per
cluster, and a policy decides which worker runs which task (see ``POLICIES``). Time advances
from one task completion to the next; at each completion the idle worker takes its next task
by the policy's rules, looking at the queues as they are at that instant. A task's duration
is its cost on the worker's cluster, stretched by any interference on that core, plus the
per-task (and per-steal) scheduling overhead.

What is modelled: relative core speeds, task granularity, queueing and stealing rules,
scheduling overheads, time-varying interference, the asymmetry emulator's stop-and-go
(``DutyCycle``), and co-running interference (``CoRunning``: a core is slower while other
cores run tasks -- shared caches and memory bandwidth, as one measured factor). What is not:
caches and memory bandwidth as such, frequency changes (express them as interference), SMT.

With ``CoRunning`` a task's speed depends on what the other cores do while it runs, so the
simulation advances piecewise (every task start and end and every change of a core's
availability is an event, and every running piece of work progresses at its current rate
until the next one); without it, a task's end is computed when it starts.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from asymo.hw.topology import Topology
from asymo.runtime.partition import largest_remainder
from asymo.runtime.ffi import lib
from asymo.runtime.pool import POLICIES as _POOL_POLICIES

__all__ = [
    "POLICIES", "Job", "Overheads", "Interference", "DutyCycle", "CoRunning", "SimResult",
    "simulate", "split_counts", "first_cores",
]

#: the pool's policies, as the C library names them (``ASYMO_POLICY_*``)
POLICIES = tuple(_POOL_POLICIES)
#: the submitter polls its job this long, then sleeps (the C pool's constant)
SUBMIT_SPIN_S = lib.ASYMO_POOL_SUBMIT_SPIN_NS * 1e-9


@dataclass(frozen=True)
class Overheads:
    """Scheduling costs in seconds (all default to zero).

    Parameters
    ----------
    job : float
        Once per job: submitting, waking the workers and joining. Added before the first task.
    task : float
        Every take: one chunk of tasks from the worker's own queue (a lock round trip), or one
        task from the shared counter (an atomic increment).
    steal : float
        Every steal operation: scanning queues, locking the victim, moving half of its last
        range into the thief's queue.
    wake : float
        The submitting thread's wake-up: it polls its job for ``spin`` seconds after it ran
        out of work of its own, then sleeps on a futex and takes ``wake`` seconds to return
        once the last task ends (measured: ``asymo.lab.sim.calibrate.measure_submitter_wake``).
        The submitter is modelled as the first worker of the fastest cluster (it helps as the
        worker of its own core): a job ends ``wake`` later when its last task ends more than
        ``spin`` after that worker found no more work to take.
    spin : float
        The submitter's polling window (``ASYMO_POOL_SUBMIT_SPIN_NS`` of the C pool).
    """

    job: float = 0.0
    task: float = 0.0
    steal: float = 0.0
    wake: float = 0.0
    spin: float = SUBMIT_SPIN_S

    def __post_init__(self):
        for name in ("job", "task", "steal", "wake", "spin"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Overheads.{name} must be a finite number >= 0, got {v!r}")

    def to_dict(self):
        out = {"job": self.job, "task": self.task, "steal": self.steal}
        if self.wake:   # only when modelled: results without it keep their old form
            out.update(wake=self.wake, spin=self.spin)
        return out


@dataclass(frozen=True)
class Interference:
    """Core ``cpu`` runs at ``speed`` (fraction of its normal speed, 0..1) in [start, stop).

    Overlapping windows on one core multiply. ``speed=0`` stops the core: a task running there
    resumes when the window ends (and never, if it does not end).
    """

    cpu: int
    speed: float
    start: float = 0.0
    stop: float = math.inf

    def __post_init__(self):
        if not (0.0 <= self.speed <= 1.0):
            raise ValueError(f"Interference.speed must lie in [0, 1], got {self.speed!r}")
        if not (self.start >= 0 and self.stop > self.start):
            raise ValueError(f"Interference window [{self.start}, {self.stop}) is empty or "
                             "starts before 0")


@dataclass(frozen=True)
class Job:
    """One parallel job: ``ntasks`` tasks and how the asymo policy splits them per cluster.

    Parameters
    ----------
    costs : array_like
        Either shape ``(ntasks,)``: seconds each task takes on a core of speed 1.0 (a core of
        speed s takes ``cost / s``); or shape ``(ntasks, nclusters)``: seconds each task takes
        on a core of each cluster (e.g. predicted by the cost model, where block sizes differ
        per cluster). Column order is the topology's (fastest first).
    split : sequence or None
        Per-cluster task counts (ints summing to ntasks) or ratios (floats), as
        ``Pool.parallel_for(split=...)`` takes them; task ids ``[0, counts[0])`` belong to the
        fastest cluster and so on. None: the pool's default, cluster capacity x core count.
    name : str
        Label carried into the result.
    delay : float
        Seconds the submitting thread works on its own before it submits this job (Python
        glue, planning, serial pieces of an operation): the job starts that much after the
        previous one ended (plus the per-job overhead).
    """

    costs: np.ndarray
    split: Optional[Sequence] = None
    name: str = ""
    delay: float = 0.0

    def __post_init__(self):
        costs = np.asarray(self.costs, dtype=np.float64)
        if costs.ndim not in (1, 2):
            raise ValueError(f"Job.costs must be 1-D (ntasks,) or 2-D (ntasks, nclusters), "
                             f"got shape {costs.shape}")
        if costs.size and not (np.all(np.isfinite(costs)) and np.all(costs >= 0)):
            raise ValueError("Job.costs must be finite and >= 0")
        if not (math.isfinite(self.delay) and self.delay >= 0):
            raise ValueError(f"Job.delay must be a finite number >= 0, got {self.delay!r}")
        costs = costs.copy()
        costs.setflags(write=False)
        object.__setattr__(self, "costs", costs)

    @property
    def ntasks(self):
        return int(self.costs.shape[0])

    @classmethod
    def uniform(cls, ntasks, cost, *, split=None, name="", delay=0.0):
        """``ntasks`` equal tasks of ``cost`` seconds each at speed 1.0."""
        ntasks = _check_count(ntasks, "ntasks")
        return cls(costs=np.full(ntasks, float(cost)), split=split, name=name, delay=delay)


def _check_count(n, what):
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"{what} must be >= 0, got {n}")
    return int(n)


def split_counts(ntasks, weights):
    """Per-cluster task counts proportional to ``weights``, summing to ``ntasks``.

    The pool's rule (`asymo.runtime.partition.largest_remainder`): largest-remainder rounding,
    ties to the faster (earlier) cluster.
    """
    ntasks = _check_count(ntasks, "ntasks")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) \
            or w.sum() <= 0:
        raise ValueError(f"split weights must be a non-empty list of finite numbers >= 0 "
                         f"with a positive sum, got {list(np.atleast_1d(w))}")
    return largest_remainder(ntasks, [float(x) for x in w])


def _job_counts(job, topology):
    nclusters = topology.nclusters
    if job.split is None:
        return split_counts(job.ntasks, [c.capacity * c.ncpus for c in topology.clusters])
    split = list(job.split)
    if len(split) != nclusters:
        raise ValueError(f"job {job.name!r}: split has {len(split)} entries but the topology "
                         f"has {nclusters} clusters")
    if all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in split):
        if any(s < 0 for s in split) or sum(split) != job.ntasks:
            raise ValueError(f"job {job.name!r}: split counts {split} must be >= 0 and sum "
                             f"to ntasks={job.ntasks}")
        return [int(s) for s in split]
    return split_counts(job.ntasks, split)


def first_cores(topology, k):
    """The topology restricted to its first ``k`` cores, fastest cluster first.

    Scaling curves add cores in this order: all of the fastest cluster, then the next.
    """
    k = _check_count(k, "k")
    if not 1 <= k <= topology.ncpus:
        raise ValueError(f"k must lie in [1, {topology.ncpus}], got {k}")
    clusters, left = [], k
    for c in topology.clusters:
        if left == 0:
            break
        take = c.cpus[:left]
        left -= len(take)
        clusters.append(dataclasses.replace(c, cpus=take))
    # Keep capacities relative to the original fastest cluster (always present here).
    return Topology(clusters=tuple(clusters), source=topology.source,
                    emulated={cpu: s for cpu, s in topology.emulated.items()
                              if any(cpu in c.cpus for c in clusters)})


@dataclass
class SimResult:
    """What a simulation produced: plain numbers, ``to_dict()`` gives JSON-ready data.

    ``busy`` is time spent inside tasks per worker (as the pool's ``busy_ns``), ``steals`` is a
    (thief cluster x victim cluster) matrix of stolen tasks (counted as the pool counts them:
    when run, by the cluster they were taken from), ``steal_ops`` the steal operations per
    worker (each moves a range of tasks).
    """

    policy: str
    topology: Topology
    makespan: float
    job_makespans: list
    busy: np.ndarray
    tasks_run: np.ndarray
    tasks_stolen: np.ndarray
    steal_ops: np.ndarray
    steals: np.ndarray
    ideal_makespan: float
    overheads: Overheads = field(default_factory=Overheads)

    @property
    def workers(self):
        """(cpu, cluster index) of each worker, in worker order."""
        return [(cpu, i) for i, c in enumerate(self.topology.clusters) for cpu in c.cpus]

    @property
    def utilization(self):
        """Per-worker busy time over the makespan."""
        if not self.makespan or not math.isfinite(self.makespan):
            return np.zeros_like(self.busy)
        return self.busy / self.makespan

    @property
    def efficiency(self):
        """Ideal makespan (work spread in proportion to speed, no overhead) over makespan."""
        if not self.makespan or not math.isfinite(self.makespan):
            return 0.0
        return self.ideal_makespan / self.makespan

    @property
    def steals_by_direction(self):
        """Stolen tasks: within a cluster, by a faster cluster from a slower one, and by a
        slower cluster from a faster one (never under the ``asymo`` policy)."""
        s = self.steals
        n = s.shape[0]
        same = int(np.trace(s))
        from_slower = int(sum(s[i, j] for i in range(n) for j in range(n) if j > i))
        from_faster = int(sum(s[i, j] for i in range(n) for j in range(n) if j < i))
        return {"same_cluster": same, "faster_from_slower": from_slower,
                "slower_from_faster": from_faster}

    def to_dict(self):
        return {
            "policy": self.policy,
            "makespan": self.makespan,
            "ideal_makespan": self.ideal_makespan,
            "efficiency": self.efficiency,
            "job_makespans": list(self.job_makespans),
            "workers": [{"cpu": cpu, "cluster": self.topology.clusters[ci].name,
                         "busy": float(b), "tasks_run": int(r), "tasks_stolen": int(st),
                         "steal_ops": int(so)}
                        for (cpu, ci), b, r, st, so in zip(self.workers, self.busy,
                                                           self.tasks_run, self.tasks_stolen,
                                                           self.steal_ops)],
            "steals": self.steals.tolist(),
            "steals_by_direction": self.steals_by_direction,
            "overheads": self.overheads.to_dict(),
            "topology": self.topology.to_dict(),
        }


@dataclass(frozen=True)
class DutyCycle:
    """Core ``cpu`` is stopped for ``busy`` of every ``period`` seconds and runs at full speed
    otherwise: the asymmetry emulator (``asymo.lab.emulate``), whose SCHED_FIFO helper takes the
    core for ``busy * period`` at the start of each period. ``phase`` shifts the periods:
    stops cover ``[k * period - phase, k * period - phase + busy * period)``.

    Averaged over a long run the core has speed ``1 - busy``, but a task shorter than a period
    either runs untouched or waits out a whole stop: this is what a uniformly slow core
    (``Interference(cpu, 1 - busy)``) does not capture.
    """

    cpu: int
    busy: float
    period: float = 1e-3
    phase: float = 0.0

    def __post_init__(self):
        if not (0.0 <= self.busy < 1.0):
            raise ValueError(f"DutyCycle.busy must lie in [0, 1), got {self.busy!r}")
        if not (math.isfinite(self.period) and self.period > 0):
            raise ValueError(f"DutyCycle.period must be > 0, got {self.period!r}")
        if not math.isfinite(self.phase):
            raise ValueError(f"DutyCycle.phase must be finite, got {self.phase!r}")

    def finish(self, start, work):
        """Time at which ``work`` seconds of running started at ``start`` complete."""
        if work <= 0 or self.busy == 0:
            return start + max(work, 0.0)
        P, stop = self.period, self.busy * self.period
        run = P - stop
        # position in the period, measured from the start of a stop
        k = math.floor((start + self.phase) / P)
        t0 = k * P - self.phase            # start of the current period's stop
        if start < t0 + stop:
            start = t0 + stop              # wait out the stop
        avail = t0 + P - start             # running time left in this period
        eps = 1e-9 * P                     # rounding: a task ending on a boundary ends there
        if work <= avail + eps:
            return start + work
        work -= avail
        full, rest = divmod(work, run)
        if rest > run - eps:
            full, rest = full + 1, 0.0
        t = t0 + P + full * P              # start of the stop of the period where it ends
        if rest <= eps:
            return t
        return t + stop + rest


    def state(self, t):
        """(availability at ``t``: 0 while stopped, 1 while running; time of the next
        change)."""
        if self.busy == 0:
            return 1.0, math.inf
        P, stop = self.period, self.busy * self.period
        eps = 1e-9 * P
        k = math.floor((t + self.phase) / P)
        t0 = k * P - self.phase
        if t + eps < t0:                 # rounding put t just before its period's start
            t0 -= P
        if t < t0 + stop - eps:
            return 0.0, t0 + stop
        if t < t0 + P - eps:
            return 1.0, t0 + P
        return 0.0, t0 + P + stop       # on the boundary: the next stop starts now


@dataclass(frozen=True)
class CoRunning:
    """Cores that slow each other down while they run tasks at the same time (shared caches,
    memory bandwidth, a shared power budget): a core running a task while ``n`` other cores
    of the group run tasks goes at ``1 / (1 + n * (1 / factor - 1))`` of its speed, so
    ``factor`` is its speed with one other core busy (measured: ``asymo bench scaling
    --calibrate-sim``), and the slowdown grows linearly in time per extra co-runner (an
    extrapolation beyond two cores). A core counts as running while it is inside a task and
    not stopped (by a ``DutyCycle`` or a speed-0 window); scheduling overheads neither slow
    nor are slowed.

    Parameters
    ----------
    factor : float
        In (0, 1]; 1 means no interference.
    cpus : sequence of int, optional
        The cores sharing the resource (default: every core of the simulated topology).
    """

    factor: float
    cpus: Optional[tuple] = None

    def __post_init__(self):
        if not (isinstance(self.factor, (int, float)) and 0.0 < self.factor <= 1.0):
            raise ValueError(f"CoRunning.factor must lie in (0, 1], got {self.factor!r}")
        if self.cpus is not None:
            cpus = tuple(int(c) for c in self.cpus)
            if len(set(cpus)) != len(cpus) or any(c < 0 for c in cpus):
                raise ValueError(f"CoRunning.cpus must be distinct cpu numbers >= 0, got "
                                 f"{self.cpus!r}")
            object.__setattr__(self, "cpus", cpus)

    def speed(self, others):
        """Speed factor of a core while ``others`` other cores of the group run tasks."""
        return 1.0 / (1.0 + others * (1.0 / self.factor - 1.0))


class _Clock:
    """Per-core speed factor over time from interference windows."""

    def __init__(self, windows, duty=None):
        self.duty = duty
        self.windows = sorted(windows, key=lambda w: w.start)
        points = {0.0}
        for w in self.windows:
            points.add(w.start)
            points.add(w.stop)
        self.points = sorted(p for p in points if math.isfinite(p))

    def factor(self, t):
        f = 1.0
        for w in self.windows:
            if w.start <= t < w.stop:
                f *= w.speed
        return f

    def state(self, t):
        """(speed factor at ``t``, time of the next change)."""
        if self.duty is not None:
            return self.duty.state(t)
        if not self.windows:
            return 1.0, math.inf
        nxt = next((p for p in self.points if p > t), math.inf)
        return self.factor(t), nxt

    def finish(self, start, work):
        """Time at which ``work`` seconds (at full speed) started at ``start`` complete."""
        if self.duty is not None:
            if self.windows:
                raise ValueError("a core takes either a duty cycle or interference windows")
            return self.duty.finish(start, work)
        if not self.windows or work <= 0:
            return start + work
        t, left = start, work
        while True:
            nxt = next((p for p in self.points if p > t), math.inf)
            f = self.factor(t)
            if f > 0:
                need = left / f
                if t + need <= nxt:
                    return t + need
                left -= (nxt - t) * f
            if not math.isfinite(nxt):
                return math.inf
            t = nxt


class _Workers:
    """Worker layout of a topology: cluster index and true speed of each worker."""

    def __init__(self, topology, speeds):
        self.cluster = []
        self.cpu = []
        for ci, c in enumerate(topology.clusters):
            for cpu in c.cpus:
                self.cluster.append(ci)
                self.cpu.append(cpu)
        self.n = len(self.cpu)
        self.speed = [speeds[ci] for ci in self.cluster]
        self.by_cluster = [[w for w in range(self.n) if self.cluster[w] == ci]
                           for ci in range(topology.nclusters)]


# Constants of the C pool that shape the schedule (pool.h), read from the library: the owner
# doubles its chunk while a chunk runs shorter than CHUNK_TARGET_S, up to CHUNK_MAX tasks.
CHUNK_TARGET_S = lib.ASYMO_POOL_CHUNK_TARGET_NS * 1e-9
CHUNK_MAX = lib.ASYMO_POOL_CHUNK_MAX


class _Queues:
    """Per-worker deques of task ranges [lo, hi) with the cluster they were stolen from
    (-1: queued by the submitter), and the pending task count of each, as in pool.c."""

    def __init__(self, n):
        self.q = [deque() for _ in range(n)]
        self.pending = [0] * n

    def push_back(self, w, lo, hi, origin=-1):
        if hi > lo:
            self.q[w].append([lo, hi, origin])
            self.pending[w] += hi - lo

    def push_front(self, w, lo, hi, origin):
        self.q[w].appendleft([lo, hi, origin])
        self.pending[w] += hi - lo

    def pop_front(self, w, chunk):
        """Owner: a chunk from the front range, never more than a quarter of what is left
        in that range (at least one task)."""
        q = self.q[w]
        while q:
            r = q[0]
            n = r[1] - r[0]
            if n == 0:
                q.popleft()
                continue
            k = min(chunk, max(n // 4, 1))
            out = (r[0], r[0] + k, r[2])
            r[0] += k
            if r[0] == r[1]:
                q.popleft()
            self.pending[w] -= k
            return out
        return None

    def steal_back(self, v):
        """Thief: the back half (rounded up) of the victim's last non-empty range."""
        q = self.q[v]
        for r in reversed(q):
            n = r[1] - r[0]
            if n == 0:
                continue
            k = (n + 1) // 2
            out = (r[1] - k, r[1])
            r[1] -= k
            while q and q[-1][0] == q[-1][1]:
                q.pop()
            self.pending[v] -= k
            return out
        return None


def _queue_even(queues, ntasks, nworkers):
    """even / steal: equal contiguous blocks in worker order, the first ``ntasks % n`` one
    longer."""
    base, extra = divmod(ntasks, nworkers)
    at = 0
    for w in range(nworkers):
        k = base + (1 if w < extra else 0)
        queues.push_back(w, at, at + k)
        at += k


def _queue_shortest_first(queues, members, first, n):
    """asymo: water-filling over the cluster's current queue lengths; each worker gets one
    contiguous range, in worker order (pool.c queue_shortest_first)."""
    L = [queues.pending[w] for w in members]
    order = sorted(range(len(members)), key=lambda i: L[i])   # stable
    left, level, m = n, L[order[0]], 1
    while m < len(members):
        cost = m * (L[order[m]] - level)
        if cost > left:
            break
        left -= cost
        level = L[order[m]]
        m += 1
    each, extra = divmod(left, m)
    give = [0] * len(members)
    for rank in range(m):
        i = order[rank]
        give[i] = level - L[i] + each + (1 if rank < extra else 0)
    at = first
    for i, w in enumerate(members):
        if give[i]:
            queues.push_back(w, at, at + give[i])
            at += give[i]


def _longest(queues, candidates, exclude):
    best, best_len = None, 0
    for v in candidates:
        if v != exclude and queues.pending[v] > best_len:
            best, best_len = v, queues.pending[v]
    return best


class _Policy:
    """One job's scheduling state under one policy, mirroring csrc/pool.c."""

    def __init__(self, policy, job, counts, workers):
        self.policy = policy
        self.workers = workers
        self.ntasks = job.ntasks
        self.next_shared = 0
        self.queues = _Queues(workers.n)
        self.chunk = [1] * workers.n
        if policy == "asymo":
            first = 0
            for ci, count in enumerate(counts):
                if count:
                    _queue_shortest_first(self.queues, workers.by_cluster[ci], first, count)
                first += count
        elif policy in ("even", "steal"):
            _queue_even(self.queues, job.ntasks, workers.n)

    def pop(self, w):
        """(lo, hi, origin) to run now, or None."""
        if self.policy == "shared":
            if self.next_shared < self.ntasks:
                self.next_shared += 1
                return self.next_shared - 1, self.next_shared, -1
            return None
        return self.queues.pop_front(w, self.chunk[w])

    def take(self, w):
        """w's next range and whether w stole it: its own queue's front, else a range stolen
        into its queue -- the thief goes straight back to its own queue, where the stolen
        range now sits in front, and takes its first chunk before anyone can steal it back
        (in pool.c a window of a few instructions). ``(None, False)`` when w finds no work."""
        r = self.pop(w)
        if r is not None or self.steal(w) is None:
            return r, False
        return self.pop(w), True

    def adapt(self, w, seconds):
        if self.policy == "shared":
            return
        if seconds < CHUNK_TARGET_S:
            if self.chunk[w] < CHUNK_MAX:
                self.chunk[w] *= 2
        elif seconds > 4 * CHUNK_TARGET_S and self.chunk[w] > 1:
            self.chunk[w] //= 2

    def steal(self, w):
        """Move the back half of a victim's last range to the front of w's queue; return the
        victim, or None when there is nothing w may steal."""
        wk, q = self.workers, self.queues
        if self.policy == "asymo":
            # own cluster first (longest queue), then slower clusters, nearest first; a
            # faster cluster is never a victim
            candidates = (_longest(q, wk.by_cluster[ci], w)
                          for ci in range(wk.cluster[w], len(wk.by_cluster)))
            victim = next((v for v in candidates if v is not None), None)
        elif self.policy == "steal":
            # the next non-empty queue after w, in worker order (pthreadpool)
            victim = next((v for v in ((w + i) % wk.n for i in range(1, wk.n))
                           if q.pending[v] > 0), None)
        else:
            return None
        if victim is None:
            return None
        lo, hi = q.steal_back(victim)
        q.push_front(w, lo, hi, wk.cluster[victim])
        return victim


def _speeds(topology, speeds):
    if speeds is None:
        return [c.capacity for c in topology.clusters]
    speeds = [float(s) for s in speeds]
    if len(speeds) != topology.nclusters:
        raise ValueError(f"speeds has {len(speeds)} entries but the topology has "
                         f"{topology.nclusters} clusters")
    if not all(math.isfinite(s) and s > 0 for s in speeds):
        raise ValueError(f"speeds must be finite and > 0, got {speeds}")
    return speeds


def _resolve_topology(topology):
    if isinstance(topology, Topology):
        return topology
    if isinstance(topology, str):
        from asymo.lab.sim.presets import get_preset
        return get_preset(topology).topology
    if hasattr(topology, "topology") and isinstance(topology.topology, Topology):
        return topology.topology  # a Preset
    raise TypeError(f"topology must be a Topology or a preset name, not "
                    f"{type(topology).__name__}")


def simulate(topology, jobs, *, policy="asymo", speeds=None, overheads=None,
             interference=()):
    """Simulate the pool running ``jobs`` one after the other.

    Parameters
    ----------
    topology : Topology, Preset or str
        The CPU (a preset name such as ``"kirin970"``). One worker per core.
    jobs : Job or sequence of Job
        Run in order, each starting when the previous one has finished (a barrier, as
        ``parallel_for`` returns only when its job is done).
    policy : {"asymo", "even", "shared", "steal"}
        The rules of ``csrc/pool.c``. Queues hold ranges of task ids; an owner takes a chunk
        from the front of its first range (1 task at the start of a job, doubled while a chunk
        runs under 20 us, halved above 80 us, never more than a quarter of the range); a thief
        takes the back half of the victim's last range into the front of its own queue.
        ``asymo``: each cluster's tasks (from the job's split) are water-filled into the
        shortest queues of that cluster's workers, one contiguous range each; an idle worker
        steals from the longest queue of its own cluster, then of slower clusters (nearest
        first), never from a faster cluster. ``even``: equal contiguous ranges in worker order,
        no stealing. ``shared``: one counter, every worker takes the next task id.
        ``steal``: the even ranges; an idle worker steals from the next non-empty queue after
        its own in worker order, in any direction.
    speeds : sequence of float, optional
        True per-cluster speed (fastest first), e.g. measured capabilities. Defaults to the
        topology's capacities. The asymo split still uses the capacities (what the pool
        believes) unless the job gives its own split: a wrong belief shows up as imbalance.
    overheads : Overheads, optional
        Scheduling costs (default: none).
    interference : sequence of Interference, DutyCycle or CoRunning
        Cores slowed for time windows (absolute time from the start of the first job),
        stopped periodically (the emulator), or slowed while other cores run tasks
        (co-running interference; see :class:`CoRunning`).

    Returns
    -------
    SimResult
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    topology = _resolve_topology(topology)
    overheads = overheads if overheads is not None else Overheads()
    if not isinstance(overheads, Overheads):
        raise TypeError("overheads must be an Overheads instance")
    if isinstance(jobs, Job):
        jobs = [jobs]
    jobs = list(jobs)
    if not all(isinstance(j, Job) for j in jobs):
        raise TypeError("jobs must be a Job or a sequence of Job")
    sp = _speeds(topology, speeds)
    workers = _Workers(topology, sp)
    cpus = set(workers.cpu)
    per_cpu, duty, groups = {}, {}, []
    for itf in interference:
        if isinstance(itf, CoRunning):
            members = workers.cpu if itf.cpus is None else itf.cpus
            outside = sorted(set(members) - cpus)
            if outside:
                raise ValueError(f"CoRunning names cpu(s) {outside}, which are not in the "
                                 f"topology (cpus {sorted(cpus)})")
            groups.append((itf, [w for w in range(workers.n) if workers.cpu[w] in members]))
            continue
        if not isinstance(itf, (Interference, DutyCycle)):
            raise TypeError("interference must be a sequence of Interference, DutyCycle or "
                            "CoRunning")
        if itf.cpu not in cpus:
            raise ValueError(f"interference on cpu {itf.cpu}, which is not in the topology "
                             f"(cpus {sorted(cpus)})")
        if isinstance(itf, DutyCycle):
            if itf.cpu in duty:
                raise ValueError(f"two duty cycles on cpu {itf.cpu}")
            duty[itf.cpu] = itf
        else:
            per_cpu.setdefault(itf.cpu, []).append(itf)
    bad = sorted(set(duty) & set(per_cpu))
    if bad:
        raise ValueError(f"cpu(s) {bad} have both a duty cycle and interference windows")
    clocks = [_Clock(per_cpu.get(cpu, ()), duty.get(cpu)) for cpu in workers.cpu]

    nclusters = topology.nclusters
    stats = _Tally(workers.n, nclusters)
    total_speed = sum(workers.speed)
    now, ideal = 0.0, 0.0
    job_makespans = []

    for job in jobs:
        if job.costs.ndim == 2 and job.costs.shape[1] != nclusters:
            raise ValueError(f"job {job.name!r}: costs have {job.costs.shape[1]} columns but "
                             f"the topology has {nclusters} clusters")
        counts = _job_counts(job, topology)
        if job.costs.ndim == 1:
            cost_on = [job.costs / s for s in sp]
            ideal += float(job.costs.sum()) / total_speed
        else:
            cost_on = [job.costs[:, ci] for ci in range(nclusters)]
            # Lower bound with 2-D costs: every task at the rate of its cheapest cluster,
            # spread over the machine's total speed.
            ideal += float((job.costs * np.asarray(sp)).min(axis=1).sum()) / total_speed
        ideal += overheads.job + job.delay
        state = _Policy(policy, job, counts, workers)
        start = now + job.delay + overheads.job
        if groups:
            end, idle0 = _run_job_piecewise(state, start, workers, clocks, groups, cost_on,
                                            overheads, stats)
            end = _submitter_wakes(end, idle0, overheads)
            job_makespans.append(end - now)
            now = end
            continue
        heap = [(start, w) for w in range(workers.n)]
        heapq.heapify(heap)
        end, idle0 = start, start
        while heap:
            t, w = heapq.heappop(heap)
            clock = clocks[w]
            r, stole = state.take(w)
            if r is None:
                end = max(end, t)
                if w == 0:
                    idle0 = t
                continue
            t_take = t
            if stole:
                stats.steal_ops[w] += 1
                t_take = clock.finish(t, overheads.steal)
            lo, hi, origin = r
            ci = workers.cluster[w]
            t_start = clock.finish(t_take, overheads.task)
            t_end = clock.finish(t_start, float(cost_on[ci][lo:hi].sum()))
            stats.ran(state, w, ci, lo, hi, origin, t_end - t_start)
            heapq.heappush(heap, (t_end, w))
        end = _submitter_wakes(end, idle0, overheads)
        job_makespans.append(end - now)
        now = end

    return SimResult(policy=policy, topology=topology, makespan=now,
                     job_makespans=job_makespans, busy=stats.busy, tasks_run=stats.tasks_run,
                     tasks_stolen=stats.tasks_stolen, steal_ops=stats.steal_ops,
                     steals=stats.steals, ideal_makespan=ideal, overheads=overheads)


class _Tally:
    """What a simulation counts, per worker (and stolen tasks per cluster pair), for both
    event loops."""

    def __init__(self, nworkers, nclusters):
        self.busy = np.zeros(nworkers)
        self.tasks_run = np.zeros(nworkers, dtype=np.int64)
        self.tasks_stolen = np.zeros(nworkers, dtype=np.int64)
        self.steal_ops = np.zeros(nworkers, dtype=np.int64)
        self.steals = np.zeros((nclusters, nclusters), dtype=np.int64)

    def ran(self, state, w, ci, lo, hi, origin, seconds):
        """Worker ``w`` (of cluster ``ci``) ran tasks ``lo:hi`` (stolen from a worker of
        cluster ``origin``, or its own when negative) in ``seconds``; the policy adapts its
        chunk to it."""
        self.busy[w] += seconds
        self.tasks_run[w] += hi - lo
        if origin >= 0:
            self.tasks_stolen[w] += hi - lo
            self.steals[ci, origin] += hi - lo
        state.adapt(w, seconds)


def _submitter_wakes(end, idle0, overheads):
    """The job's end as the submitter sees it: it ran out of work at ``idle0`` (as worker 0),
    polled for ``overheads.spin`` and then slept; past the spin it returns ``wake`` late."""
    if overheads.wake and end - idle0 > overheads.spin:
        return end + overheads.wake
    return end


def _run_job_piecewise(state, start, workers, clocks, groups, cost_on, overheads, stats):
    """One job with co-running interference: the schedule of the event-per-completion loop
    in :func:`simulate` (same decisions, same order at equal times: lowest worker first),
    but every running piece of work -- steal overhead, take overhead, task -- progresses at
    its current rate (the core's availability, times the co-running slowdown for tasks)
    until the next event: a piece ending or a core's availability changing. Returns the
    time the job's last task ended and the time worker 0 found no more work."""
    n = workers.n
    member_of = [[g for g, (_, ws) in enumerate(groups) if w in ws] for w in range(n)]
    segs = [None] * n          # per worker: list of pieces [kind, work left, work, ...]
    task = [None] * n          # per worker: (lo, hi, origin, started at)
    now, end, idle0 = start, start, start
    pending = list(range(n))   # workers deciding at `now`, in worker order

    def begin(w):
        """Drop finished (or empty) pieces at the front of w's list; note a task's start.
        Returns True while w has work left."""
        s = segs[w]
        while s and s[0][1] <= 0.0:
            done = s.pop(0)
            if done[0] == "task":
                lo, hi, origin, t0 = task[w]
                stats.ran(state, w, workers.cluster[w], lo, hi, origin, now - t0)
                task[w] = None
            if s and s[0][0] == "task":
                lo, hi, origin, _ = task[w]
                task[w] = (lo, hi, origin, now)
        if not s:
            segs[w] = None
            return False
        return True

    while True:
        # decisions at `now`, lowest worker first (the heap order of simulate's loop); a
        # worker whose take held no work at all decides again at once
        while pending:
            pending.sort()
            w = pending.pop(0)
            r, stole = state.take(w)
            if r is None:
                end = max(end, now)
                if w == 0:
                    idle0 = now
                continue
            pieces = []
            if stole:
                stats.steal_ops[w] += 1
                pieces.append(["steal", overheads.steal, overheads.steal])
            lo, hi, origin = r
            cost = float(cost_on[workers.cluster[w]][lo:hi].sum())
            pieces.append(["take", overheads.task, overheads.task])
            pieces.append(["task", cost, cost])
            segs[w] = pieces
            task[w] = (lo, hi, origin, now)
            if not begin(w):
                pending.append(w)
        running = [w for w in range(n) if segs[w] is not None]
        if not running:
            return end, idle0
        avail, nxt = {}, math.inf
        for w in running:
            f, ch = clocks[w].state(now)
            avail[w] = f
            nxt = min(nxt, ch)
        active = {w for w in running if segs[w][0][0] == "task" and avail[w] > 0}
        for w in running:
            r = avail[w]
            if r > 0 and segs[w][0][0] == "task":
                for g in member_of[w]:
                    itf, ws = groups[g]
                    r *= itf.speed(sum(1 for v in ws if v != w and v in active))
            piece = segs[w][0]
            # piece: [kind, work left at `since`, work at start, since, rate, projected end];
            # the end is projected again only when the rate changes, so that a piece run at
            # one rate ends at start + work exactly, as in simulate's event loop
            if len(piece) == 3 or piece[4] != r:
                if len(piece) > 3:
                    piece[1] -= piece[4] * (now - piece[3])
                    del piece[3:]
                piece.extend([now, r, now + piece[1] / r if r > 0 else math.inf])
        t_next = min(nxt, min(segs[w][0][5] for w in running))
        if not math.isfinite(t_next):
            # every running core is stopped for good
            return math.inf, idle0
        now = t_next
        for w in running:
            piece = segs[w][0]
            # ends now; or, at a change of availability, within rounding of now (a piece
            # ending on the start of a stop ends there, as DutyCycle.finish has it)
            if piece[5] <= now or (now == nxt and piece[1] - piece[4] * (now - piece[3])
                                   <= 1e-9 * piece[2]):
                piece[1] = 0.0
                if not begin(w):
                    pending.append(w)
