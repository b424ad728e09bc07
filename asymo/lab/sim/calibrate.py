"""Measure the simulator's inputs on this machine (``asymo bench scaling --calibrate-sim``).

A simulation is only as good as its inputs. For a machine at hand they are measured here, in
runs of their own (never the runs a validation compares against), and stored as plain JSON:

* **task structure and costs** per workload and core count: every pool job the workload
  issues, traced task by task as a worker of each cluster (:mod:`asymo.lab.sim.trace`), with the
  submitting thread's own work between jobs (``Job.delay``: Python glue, per-layer overheads,
  planning); medians over repeated traces;
* **availability of each emulated core** per workload: the same tasks traced on the emulated
  core, alone, against the fast core: the share of the core the workload really gets. The
  emulator stops the core for ``1 - speed`` of every period; what it costs beyond that (the
  helper's wake-up and switch, caches and TLB refilled after every stop) is stored as
  ``lost_per_period_s``, seconds lost per period, so that it carries over to another period;
* **co-running interference** per workload: the tasks traced on one core while another core
  runs the same workload without pause, against the same core alone, corrected for the share
  of the time the co-runner actually spent in tasks; the simulator applies it as
  :class:`asymo.lab.sim.CoRunning` (shared caches and memory bandwidth as one factor) when the
  rounds agree on a slowdown (a sign test; else the factor is 1);
* **scheduling overheads** per policy from jobs of no-op tasks (per job, per take);
* **the submitter's wake-up** (``submitter_wake_s``): the time the submitting thread takes
  to return from its futex sleep when it waited past its spin (``SUBMIT_SPIN_NS``) for the
  last task (:func:`measure_submitter_wake`). Calibrations written before it was measured
  load with 0 (a note is printed).

Everything is measured in interleaved rounds (:class:`SimCalibrator`), which a sweep can
interleave with its own (``asymo.lab.scaling.measure_scaling(calibrate=True)``).

:func:`sim_inputs` turns a calibration into simulator jobs and interference for a core
count; :func:`format_calibration` prints what was measured.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import statistics
import threading
import time
import warnings

import numpy as np

from asymo.hw import topology as topo
from asymo.lab.emulate import DEFAULT_PERIOD
from asymo.lab.loadmon import OtherLoad
from asymo.lab.machine import (OPEN_POOLS, emulated_cpus, fast_cpu, loadavg, open_pool,
                               pinned_thread, trace_cpus)
from asymo.lab.sampling import measure_items, overhead_items, overheads_from
from asymo.lab.sim.engine import CoRunning, DutyCycle, first_cores
from asymo.lab.sim.trace import (jobs_from_traces, merge_traces, task_seconds, trace_from_dict,
                                 trace_jobs, trace_to_dict)
from asymo.plan.split_cost import PERIOD_ENV_VAR, emulated_period
from asymo.runtime.ffi import ffi
from asymo.runtime.pool import POLICIES

__all__ = ["SCHEMA", "calibrate_sim", "SimCalibrator", "measure_submitter_wake",
           "submitter_wake", "spin_pair_task", "time_pair_job", "interquartile_mean",
           "default_period", "sim_inputs", "traced_ratio", "save_calibration",
           "load_calibration", "check_calibration", "format_calibration", "CalibrationWarning"]

SCHEMA = "asymo.sim.calibration/1"


class CalibrationWarning(UserWarning):
    """A simulator calibration file was unreadable or measured on another machine."""


@contextlib.contextmanager
def _co_runner(wl, cpu, topology):
    """A thread of this process that runs ``wl`` on a one-core pool on ``cpu`` without pause
    while switched on. Yields ``switch(on)``: ``switch(True)`` starts it running (returns once
    it does), ``switch(False)`` pauses it and returns the share of wall time its pool spent
    in tasks while it was on (its own serial work between runs is not interference)."""
    one = topo.Topology(clusters=(topo.Cluster(name="corun", cpus=(cpu,), capacity=1.0),),
                        source=topology.source, emulated={})
    stop, on, ready, box = threading.Event(), threading.Event(), threading.Event(), {}
    running = threading.Event()

    def loop():
        try:
            with pinned_thread(cpu), wl.runner("asymo", one) as run:
                box["pool"] = OPEN_POOLS[-1]
                run()
                ready.set()
                while not stop.is_set():
                    if on.is_set():
                        running.set()
                        run()
                    else:
                        running.clear()
                        on.wait()
        except BaseException as exc:     # reported to the caller below
            box["error"] = exc
            ready.set()

    th = threading.Thread(target=loop, name="asymo-corun", daemon=True)
    th.start()
    try:
        if not ready.wait(120) or "error" in box:
            raise RuntimeError(f"the co-running workload did not start: {box.get('error')!r}")
        pool = box["pool"]
        mark = [0.0]

        def switch(state):
            if state:
                on.set()
                running.wait(10)
                pool.reset_stats()
                mark[0] = time.perf_counter()
                return None
            busy = sum(w["busy_s"] for w in pool.stats()["workers"])
            share = busy / max(time.perf_counter() - mark[0], 1e-9)
            on.clear()
            while running.is_set() and th.is_alive():
                time.sleep(0.001)
            return min(1.0, share)
        yield switch
    finally:
        stop.set()
        on.set()
        th.join(120)
        if "error" in box:
            raise RuntimeError(f"the co-running workload failed: {box['error']!r}")


def _sample_seconds(measure, cpu, seconds, max_external, mon, max_samples=400):
    """Figures of ``measure()`` (seconds per call), pinned to ``cpu``, over calls totalling
    at least ``seconds`` (at least 3 calls, after one warm-up): a long sample, so that an
    emulated core's stops fall at every phase of the calls. Calls disturbed by other
    processes (more than ``max_external`` of the machine) are left out unless all were."""
    clean, every, total = [], [], 0.0
    with pinned_thread(cpu):
        measure()                                           # warm-up
        while (total < seconds or len(clean) < 3) and len(every) < max_samples:
            snap = mon.snapshot()
            x = measure()
            every.append(x)
            if mon.share_since(snap) <= max_external:
                clean.append(x)
                total += x
    return clean or every


def _traced_sums(run, pool, cpu, seconds, max_external, mon, bufs):
    """Seconds in tasks per run of ``run()``, traced as cluster 0 on ``cpu``
    (:func:`_sample_seconds`)."""
    return _sample_seconds(lambda: task_seconds(trace_jobs(run, pool, 0, buffers=bufs)),
                           cpu, seconds, max_external, mon)


def _untraced_seconds(run, cpu, seconds, max_external, mon):
    """Seconds per call of ``run()`` as it really runs (no tracing), pinned to ``cpu``
    (:func:`_sample_seconds`)."""
    def timed():
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0
    return _sample_seconds(timed, cpu, seconds, max_external, mon)


def _traced_ratio(untraced_s, trace, job_overhead_s):
    """Traced task time over what untraced calls on one core leave for the tasks (the call
    less the submitting thread's traced work and the per-job overheads): about 1 in a
    consistent calibration."""
    jobs, tail = trace
    tasks = task_seconds(trace)
    serial = sum(j.gap_s for j in jobs) + tail + job_overhead_s * len(jobs)
    left = untraced_s - serial
    if tasks <= 0 or not (math.isfinite(left) and left > 0):
        return None
    return tasks / left


def calibrate_sim(topology, workloads, *, repeats=5, emulator_period=None, min_time=0.02,
                  max_external=0.05, progress=False, corun=True, rounds=8, sample_s=0.03):
    """Measure what the simulator needs to model ``workloads`` on ``topology`` (this
    machine, possibly under the emulator). See the module docstring for what is measured.

    Parameters
    ----------
    topology : Topology
        As detected (with the emulator's override while it runs).
    workloads : sequence of asymo.lab.scaling.Workload
    repeats : int
        Traces per measurement (medians), and samples per no-op overhead job.
    emulator_period : float, optional
        Seconds per period of the emulator in use (default ``asymo.lab.emulate.DEFAULT_PERIOD``);
        recorded, and used to turn the measured availability into time lost per period.
    min_time, max_external
        As for :func:`asymo.lab.scaling.measure_scaling` (overhead jobs; traces taken while other
        processes used more than ``max_external`` of the machine are retaken).
    corun : bool
        Measure the co-running interference (needs two cores).
    rounds, sample_s
        Everything per workload is measured in ``rounds`` interleaved rounds (one trace per
        core count and cluster; availability and co-running from blocks of runs totalling
        at least ``sample_s`` seconds of tasks, 25 emulator periods at least on an emulated
        core): see ``_WorkloadCalibration``. ``repeats`` counts the overhead samples.

    Returns
    -------
    dict
        Plain JSON data (``SCHEMA``); :func:`save_calibration` writes it.
    """
    from tqdm import tqdm

    if emulator_period is None:
        emulator_period = default_period()
    # scheduling overheads: no-op jobs, interleaved rounds as in the sweep
    samples = measure_items(overhead_items(topology), repeats, min_time, progress,
                            desc="overheads", max_external=max_external,
                            main_cpu=topology.cpus[0])
    overheads = overheads_from(samples, max_external)
    cal = SimCalibrator(topology, workloads, emulator_period=emulator_period,
                        sample_s=sample_s, max_external=max_external, corun=corun)
    with cal, tqdm(total=rounds, desc="calibrating sim", unit="round", disable=not progress,
                   leave=False) as bar:
        for _ in range(rounds):
            cal.round()
            bar.update(1)
    out = cal.result(overheads)
    out["repeats"] = int(repeats)
    return out


class _StackedContext:
    """A context manager whose resources ``_open(stack)`` enters on one ExitStack: all of
    them are released on exit, and those already entered when opening fails part-way."""

    def __enter__(self):
        self._stack = contextlib.ExitStack().__enter__()
        try:
            self._open(self._stack)
        except BaseException:
            self._stack.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)


class _WorkloadCalibration(_StackedContext):
    """Everything measured for one workload, in rounds that each visit every measurement
    once (:meth:`round`), so that a burst of outside interference (other processes, other
    virtual machines: runs up to 2x slower for tens to hundreds of milliseconds on the
    development machine) spoils one sample of each at most, and so that the rounds can be
    interleaved with a sweep's (the machine's drift then hits both alike):

    * one trace per core count ``k`` and cluster (the task structure and per-task costs;
      per-task medians over the rounds);
    * the whole machine's job sequence traced as cluster 0 (the same tasks every time) on
      the fast core, on each emulated core, and on one core while a co-runner on another
      runs the workload without pause: blocks of runs totalling at least ``sample_s``
      seconds of tasks (25 emulator periods at least on an emulated core). Per core and
      kind, the interquartile mean over all runs: on an emulated core a run's time depends
      on how many stops fall into it (a spread the mean must cover), bursts must not count.

    A context manager: it holds the workload's pools (one per core count) and the
    co-runner's thread (paused between its blocks).
    """

    def __init__(self, wl, topology, fast, emulated, period, sample_s, max_external, corun):
        self.wl, self.topology, self.fast, self.emulated = wl, topology, fast, emulated
        self.period, self.sample_s, self.max_external = period, sample_s, max_external
        self.corun = corun
        self.mon = OtherLoad()
        self.bufs = (ffi.new("asymo_trace_job[]", 1 << 12), ffi.new("int64_t[]", 1 << 16))
        # co-running is traced on the emulated core when there is one (its co-runner, on a
        # fast core, is never stopped), else on the second core; the co-runner on the fast
        # core
        self.target = (emulated[0] if emulated else topology.cpus[1]) if corun else None
        self.other = None
        if corun:
            self.other = fast if fast != self.target else \
                next(c for c in topology.cpus if c != self.target)
        self.keys = [("alone", c) for c in dict.fromkeys(
            [fast] + emulated + ([self.target] if corun else []))]
        if corun:
            self.keys.append(("corun", self.target))
        self.sums = {key: [] for key in self.keys}
        self.blocks = {}                 # per key: one figure per round (for the sign test)
        self.shares = []
        self.traces, self.every = {}, {}
        self.untraced = []               # seconds per untraced 1-core call
        self.rounds = 0

    def _open(self, stack):
        self.runs = {}
        for k in range(1, self.topology.ncpus + 1):
            sub = first_cores(self.topology, k)
            run = stack.enter_context(self.wl.runner("asymo", sub))
            self.runs[k] = (run, OPEN_POOLS[-1], sub, trace_cpus(sub))
        self.switch = stack.enter_context(
            _co_runner(self.wl.independent_copy(), self.other, self.topology)) \
            if self.corun else None

    def round(self):
        bufs, mon = self.bufs, self.mon
        for k, (run, pool, sub, cpus) in self.runs.items():
            for c in range(sub.nclusters):
                with pinned_thread(cpus[c]):
                    if self.rounds == 0:
                        trace_jobs(run, pool, c, buffers=bufs)       # warm-up
                    snap = mon.snapshot()
                    tr = trace_jobs(run, pool, c, buffers=bufs)
                self.every.setdefault((k, c), []).append(tr)
                if mon.share_since(snap) <= self.max_external:
                    self.traces.setdefault((k, c), []).append(tr)
        run1, _, _, cpus1 = self.runs[1]
        self.untraced += _untraced_seconds(run1, cpus1[0], self.sample_s, self.max_external,
                                           mon)
        run, pool, _, _ = self.runs[self.topology.ncpus]
        for kind, cpu in self.keys:
            # an emulated core needs the longer sample to average over its periods
            need = self.sample_s if cpu not in self.emulated else \
                max(self.sample_s, 25 * (self.period or 0))
            if kind == "corun":
                self.switch(True)
            block = _traced_sums(run, pool, cpu, need, self.max_external, mon, bufs)
            self.sums[(kind, cpu)] += block
            self.blocks.setdefault((kind, cpu), []).append(interquartile_mean(block))
            if kind == "corun":
                self.shares.append(self.switch(False))
        self.rounds += 1

    def result(self):
        out = {"description": self.wl.describe(), "rounds": self.rounds, "traces": {}}
        for k, (_, _, sub, _) in self.runs.items():
            out["traces"][str(k)] = [
                trace_to_dict(merge_traces(self.traces.get((k, c)) or self.every[(k, c)]))
                for c in range(sub.nclusters)]
        mean = {key: interquartile_mean(v) for key, v in self.sums.items() if v}
        fast, target = self.fast, self.target
        out["task_s_fast"] = mean[("alone", fast)]
        if self.untraced:
            out["untraced_1core_s"] = interquartile_mean(self.untraced)
            out["untraced_samples"] = len(self.untraced)
        out["emulated"] = {}
        for cpu in self.emulated:
            a = mean[("alone", fast)] / mean[("alone", cpu)]
            nominal = self.topology.emulated[cpu]
            out["emulated"][str(cpu)] = {"availability": a, "nominal": nominal,
                                         "lost_per_period_s": (nominal - a) * self.period,
                                         "samples": len(self.sums[("alone", cpu)])}
        if self.corun:
            observed = mean[("alone", target)] / mean[("corun", target)]
            busy_share = statistics.fmean(self.shares)
            # a co-runner busy only part of the time slows us for that part: undo the
            # dilution
            factor = min(1.0, max(0.05, 1.0 - (1.0 - observed) / max(busy_share, 0.05)))
            # a slowdown counts only when the rounds agree on it (sign test: co-running
            # slower in all rounds but at most one, with >= 6 rounds: p < 0.11 under no
            # effect, 0.035 at 8 rounds): on a noisy machine the round-to-round spread is as
            # large as the effects, and a factor fitted to noise would bias every multi-core
            # prediction
            slower = sum(1 for a, c in zip(self.blocks[("alone", target)],
                                           self.blocks[("corun", target)]) if c > a)
            nrounds = len(self.blocks[("corun", target)])
            significant = nrounds >= 6 and slower >= nrounds - 1
            out["corun"] = {"factor": factor if significant else 1.0,
                            "measured_factor": factor, "observed": observed,
                            "significant": significant, "rounds_slower": slower,
                            "rounds": nrounds, "corunner_busy_share": busy_share,
                            "traced_cpu": target, "corunner_cpu": self.other,
                            "samples": [len(self.sums[("alone", target)]),
                                        len(self.sums[("corun", target)])]}
        return out


class SimCalibrator(_StackedContext):
    """The per-workload part of :func:`calibrate_sim`, one round at a time, for a sweep to
    interleave with its own rounds (``asymo.lab.scaling.measure_scaling(calibrate=True)``).

    Use as a context manager; call :meth:`round` between the sweep's rounds and
    :meth:`result` (with the overheads measured in the sweep's items) at the end.
    """

    def __init__(self, topology, workloads, *, emulator_period=None, sample_s=0.03,
                 max_external=0.05, corun=True):
        self.topology = topology
        self.period = emulator_period if emulator_period is not None else default_period()
        self.emulated = emulated_cpus(topology)
        self.fast = fast_cpu(topology)
        self.max_external = max_external
        self.parts = [_WorkloadCalibration(wl, topology, self.fast, self.emulated,
                                           self.period, sample_s, max_external,
                                           corun and topology.ncpus >= 2)
                      for wl in workloads if any(p in POLICIES for p in wl.policies())]
        self.sample_s = sample_s
        self.load_before = loadavg()
        self.t0 = time.perf_counter()

    def _open(self, stack):
        for part in self.parts:
            stack.enter_context(part)

    @property
    def rounds(self):
        return min((p.rounds for p in self.parts), default=0)

    def round(self):
        for part in self.parts:
            part.round()

    def result(self, overheads, *, interleaved=False):
        emulated = self.emulated
        wake, wake_info = measure_submitter_wake(self.topology)
        return {"schema": SCHEMA,
                "submitter_wake_s": wake, "submitter_wake": wake_info,
                "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
                "machine": _machine_id(),
                "topology": self.topology.to_spec(),
                "emulated": {str(c): self.topology.emulated[c] for c in emulated},
                "emulator_period_s": float(self.period) if emulated else None,
                "rounds": self.rounds, "sample_s": float(self.sample_s),
                "max_external_load": float(self.max_external),
                "interleaved_with_sweep": bool(interleaved),
                "overheads": overheads,
                "workloads": {p.wl.name: p.result() for p in self.parts},
                "loadavg_before": self.load_before, "loadavg_after": loadavg(),
                "seconds": time.perf_counter() - self.t0}


_SPIN_PAIR = None


def spin_pair_task():
    """A Numba cfunc task ``(task, ctx)`` for 2-task jobs: ``ctx`` points at 4 float64, task
    ``i`` spins ``ctx[i]`` iterations of a dependent multiply-add and stores into
    ``ctx[2 + i]``. Compiled once per process."""
    global _SPIN_PAIR
    if _SPIN_PAIR is None:
        import numba
        from numba import types

        @numba.cfunc(types.void(types.int64, types.voidptr), nopython=True)
        def spin(task, ctx):
            b = numba.carray(ctx, 4, dtype=np.float64)
            n = np.int64(b[task])
            a = 1.0
            for _ in range(n):
                a = a * 0.999999 + 1e-7
            b[2 + task] = a
        _SPIN_PAIR = spin
    return _SPIN_PAIR


def time_pair_job(pool, spin, buf, i0, i1):
    """Run one 2-task job of :func:`spin_pair_task` on ``pool``: ``i0`` and ``i1`` spin
    iterations for tasks 0 and 1, ``buf`` the task's 4-float context. Returns ``(wall_s,
    busy_s)``: the job's wall time and each worker's time inside the task (the pool's
    ``busy_s``, stats reset before the job)."""
    buf[0], buf[1] = i0, i1
    pool.reset_stats()
    t0 = time.perf_counter()
    pool.parallel_for(spin.address, 2, ctx=buf.ctypes.data)
    wall = time.perf_counter() - t0
    return wall, [w["busy_s"] for w in pool.stats()["workers"]]


#: The measuring pool's poll before the submitter sleeps (`measure_submitter_wake`), us.
WAKE_PROBE_SPIN_US = 10


def measure_submitter_wake(topology, *, jobs=100, task_s=300e-6, quantile=0.1, seed=0):
    """Seconds the submitting thread takes to wake when it waited past its spin.

    Two-task jobs under the ``even`` policy on the first two cores (task 0 on the
    submitter's core, task 1 on the other; docs/scaling-validation.md, "The even join"):
    "submitter short" jobs (task 0 short, task 1 ``task_s`` long: the submitter runs out of work,
    polls ``WAKE_PROBE_SPIN_US``, sleeps on its futex and is woken when task 1 ends) against
    "worker short" jobs (the job ends on the submitter's own core, within its poll). The
    measuring pool polls that briefly (a pool's default, ``ASYMO_POOL_SUBMIT_SPIN_NS``, is
    longer than the tasks) so that the submitter sleeps; what a wake-up costs does not depend
    on how long it polled first. Per job, wall time minus the
    longest task's time inside the task (the pool's ``busy_s``); the wake-up is the
    difference of the two cases' ``quantile`` (low quantiles: on an emulated core a job that
    starts in a stop waits for it; a random pause between jobs spreads their phase so that
    the low quantile is a job that did not). Returns ``(wake_s, info)``; ``wake_s`` is 0 on
    fewer than two cores.
    """
    if topology.ncpus < 2:
        return 0.0, {"note": "one core: no wake-up to measure"}
    sub = first_cores(topology, 2)
    spin = spin_pair_task()
    buf = np.zeros(4)
    rng = np.random.default_rng(seed)
    with open_pool(sub, "even") as pool, pinned_thread(sub.cpus[0]):
        pool.submit_spin_us = WAKE_PROBE_SPIN_US

        def job(i0, i1):
            wall, busy = time_pair_job(pool, spin, buf, i0, i1)
            return wall - max(busy), busy[0]

        for _ in range(10):
            job(1e5, 10)
        per_iter = statistics.median(job(1e5, 10)[1] for _ in range(10)) / 1e5
        n = max(int(task_s / per_iter), 20)
        over = {"submitter_short": [], "worker_short": []}
        for _ in range(jobs):
            for case, (i0, i1) in (("submitter_short", (n // 20, n)),
                                   ("worker_short", (n, n // 20))):
                time.sleep(float(rng.uniform(0, 1e-3)))
                over[case].append(job(i0, i1)[0])
    q = {c: float(np.quantile(v, quantile)) for c, v in over.items()}
    wake = max(0.0, q["submitter_short"] - q["worker_short"])
    return wake, {"jobs": int(jobs), "task_s": float(n * per_iter), "quantile": quantile,
                  "over_longest_s": q, "cpus": list(sub.cpus)}


def submitter_wake(cal):
    """The calibration's submitter wake-up in seconds (0, with a printed note, for a
    calibration written before it was measured)."""
    v = cal.get("submitter_wake_s")
    if v is None:
        print("note: this simulator calibration has no submitter wake-up (written before it "
              "was measured): simulating without it")
        return 0.0
    return float(v)


def interquartile_mean(values):
    """Mean of the values between the first and third quartile (all of them when fewer than
    four)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if v.size < 4:
        return float(v.mean())
    lo, hi = v.size // 4, v.size - v.size // 4
    return float(v[lo:hi].mean())


def default_period():
    """The period of the emulator this process runs under (env ``ASYMO_EMULATED_PERIOD``,
    which ``asymo.lab.emulate`` sets while it runs), else ``asymo.lab.emulate.DEFAULT_PERIOD``
    (with a ``CalibrationWarning`` when the variable is set but not a period)."""
    period = emulated_period()
    if period is not None:
        return period
    text = os.environ.get(PERIOD_ENV_VAR)
    if text:
        warnings.warn(f"ignoring {PERIOD_ENV_VAR}={text!r}: not a period in seconds",
                      CalibrationWarning, stacklevel=2)
    return DEFAULT_PERIOD


def _machine_id():
    try:
        return {"cpu_model": topo.cpu_model_name(), "ncpus": os.cpu_count()}
    except Exception:  # pragma: no cover - informational only
        return {"cpu_model": "unknown", "ncpus": os.cpu_count()}


# --------------------------------------------------------------------------------------------
# using a calibration

#: a workload whose traced 1-core task time differs from untraced 1-core calls by more than
#: this is flagged: its traces were disturbed (the simulator's figures for it are suspect)
TRACE_CONSISTENCY_TOLERANCE = 0.15


def traced_ratio(cal, workload):
    """A consistency check of ``workload``'s calibration: its traced 1-core task time over
    the task time of untraced 1-core calls measured in the same rounds (None when the
    calibration has no untraced calls, e.g. a file from an older asymo).

    Not applied to the costs: scaling every core count's traces by it was tried on the
    development machine and made the validation worse (one disturbed 1-core trace then
    spoils every core count), so it only flags a calibration to distrust."""
    entry = cal["workloads"][workload]
    untraced = entry.get("untraced_1core_s")
    one = entry["traces"].get("1")
    if untraced is None or not one:
        return None
    job = cal.get("overheads", {}).get("asymo", {}).get("job", 0.0)
    return _traced_ratio(float(untraced), trace_from_dict(one[0]), float(job))


def sim_inputs(cal, workload, k, topology, *, emulator_period=None, corun=True,
               availability=True):
    """Simulator inputs for ``workload`` on the first ``k`` cores of ``topology``.

    Returns ``(jobs, interference)``: the traced jobs (:func:`asymo.lab.sim.trace.jobs_from_traces`)
    and, per emulated core among them, a :class:`~asymo.lab.sim.DutyCycle` stopping it for
    ``1 - speed`` of every ``emulator_period`` plus the time lost per period measured for
    this workload (``availability=False``: the nominal stop only), plus a
    :class:`~asymo.lab.sim.CoRunning` with the workload's measured factor (``corun=False``:
    none).
    """
    try:
        entry = cal["workloads"][workload]
    except KeyError:
        raise ValueError(f"the simulator calibration has no workload {workload!r} "
                         f"(it has {sorted(cal['workloads'])})") from None
    traces = entry["traces"].get(str(k))
    if traces is None:
        raise ValueError(f"the simulator calibration has no traces of {workload!r} on {k} "
                         "cores")
    sub = first_cores(topology, k)
    jobs = jobs_from_traces([[trace_from_dict(t)] for t in traces], sub)
    period = emulator_period if emulator_period is not None else \
        (cal.get("emulator_period_s") or default_period())
    itf = []
    for cpu in emulated_cpus(sub):
        busy = 1.0 - sub.emulated[cpu]
        got = entry.get("emulated", {}).get(str(cpu))
        if availability and got is not None:
            busy += got["lost_per_period_s"] / period
        itf.append(DutyCycle(cpu=cpu, busy=min(max(busy, 0.0), 0.99), period=period))
    f = entry.get("corun", {}).get("factor")
    if corun and f is not None and sub.ncpus > 1 and f < 1.0:
        itf.append(CoRunning(factor=f))
    return jobs, itf


def save_calibration(cal, path):
    with open(path, "w") as f:
        json.dump(cal, f, indent=1)


def check_calibration(cal, topology=None):
    """Raise ``ValueError`` naming the problem when ``cal`` is not a usable calibration (for
    ``topology``, when given)."""
    if not isinstance(cal, dict) or cal.get("schema") != SCHEMA:
        raise ValueError(f"not a simulator calibration (schema {SCHEMA!r} expected)")
    if topology is not None and cal.get("topology") != topology.to_spec():
        raise ValueError(f"calibrated for topology {cal.get('topology')!r}, this run is "
                         f"{topology.to_spec()!r}")
    wls = cal.get("workloads")
    if not isinstance(wls, dict):
        raise ValueError("calibration has no 'workloads' table")
    for name, e in wls.items():
        for k, traces in e["traces"].items():
            for t in traces:
                trace_from_dict(t)
        for cpu, a in e.get("emulated", {}).items():
            if not (math.isfinite(a["availability"]) and 0 < a["availability"] <= 1.5 and
                    math.isfinite(a["lost_per_period_s"])):
                raise ValueError(f"workload {name!r}: bad availability record for cpu {cpu}")
        u = e.get("untraced_1core_s")
        if u is not None and not (isinstance(u, (int, float)) and math.isfinite(u) and u > 0):
            raise ValueError(f"workload {name!r}: untraced_1core_s={u!r} must be a number > 0")
        f = e.get("corun", {}).get("factor")
        if f is not None and not (0 < f <= 1):
            raise ValueError(f"workload {name!r}: co-running factor {f!r} outside (0, 1]")
    w = cal.get("submitter_wake_s")
    if w is not None and not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
        raise ValueError(f"submitter_wake_s={w!r} must be a number >= 0")
    for pol, o in cal.get("overheads", {}).items():
        for key in ("job", "task", "steal"):
            v = o.get(key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"overheads of {pol!r}: {key}={v!r} must be a number >= 0")


def load_calibration(path, topology=None):
    """Read a calibration written by :func:`save_calibration`; None (with a
    ``CalibrationWarning`` saying why) when it is unreadable, of another format, or for
    another topology."""
    from asymo.profile.files import read_json_file
    try:
        cal = read_json_file(path)  # a regular file only, size- and depth-limited
        check_calibration(cal, topology)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"ignoring simulator calibration {path}: {exc}", CalibrationWarning,
                      stacklevel=2)
        return None
    return cal


def format_calibration(cal):
    """What a calibration measured, as text lines."""
    lines = [f"simulator calibration ({cal.get('measured_at', '?')}, topology "
             f"{cal.get('topology')}, {cal.get('rounds')} interleaved rounds; 1-min load "
             f"average {_num(cal.get('loadavg_before'))} before, "
             f"{_num(cal.get('loadavg_after'))} after)"]
    if cal.get("emulated"):
        lines.append("emulator: " + ", ".join(
            f"cpu {c} at {s:g}" for c, s in cal["emulated"].items())
            + f", period {cal['emulator_period_s'] * 1e3:g} ms")
    lines.append(f"{'workload':<10}{'jobs':>6}{'tasks':>7}{'serial ms':>11}"
                 f"{'task ms':>9}{'tr/un':>7}{'avail':>8}{'lost us/per':>13}{'co-run':>8}"
                 "  (measured in rounds slower, busy)")
    suspect = []
    for name, e in cal["workloads"].items():
        traces = e["traces"][str(max(int(k) for k in e["traces"]))][0]
        ntasks = sum(j["ntasks"] for j in traces["jobs"])
        serial = sum(j["gap_s"] for j in traces["jobs"]) + traces["tail_s"]
        em = list(e.get("emulated", {}).values())
        avail = f"{em[0]['availability']:.3f}" if em else "-"
        lost = f"{em[0]['lost_per_period_s'] * 1e6:.1f}" if em else "-"
        cr = e.get("corun")
        crs = f"{cr['factor']:.3f}" if cr else "-"
        obs = ""
        if cr:
            obs = (f"({cr.get('measured_factor', cr['factor']):.3f} in "
                   f"{cr.get('rounds_slower', '?')}/{cr.get('rounds', '?')}, "
                   f"{cr['corunner_busy_share']:.2f})")
        ratio = traced_ratio(cal, name)
        trun = f"{ratio:.2f}" if ratio is not None else "-"
        if ratio is not None and abs(ratio - 1) > TRACE_CONSISTENCY_TOLERANCE:
            suspect.append(f"{name} ({ratio:.2f})")
        lines.append(f"{name:<10}{len(traces['jobs']):>6}{ntasks:>7}{serial * 1e3:>11.2f}"
                     f"{e['task_s_fast'] * 1e3:>9.2f}{trun:>7}{avail:>8}{lost:>13}{crs:>8}"
                     f"  {obs}")
    lines.append("tr/un: traced 1-core task time over that of untraced 1-core calls in the "
                 "same rounds (a consistency check, about 1); avail: the emulated core's "
                 "share of a fast core on the workload's tasks (nominal: its emulated speed); lost: time lost per emulator period beyond "
                 "the nominal stop; co-run: a core's speed while another runs the same "
                 "workload, as used (1 unless the co-running runs were slower in all rounds "
                 "but one), as measured, in how many rounds co-running was slower, and the "
                 "co-runner's share of time in tasks.")
    if suspect:
        lines.append(f"WARNING: traced and untraced 1-core runs disagree by more than "
                     f"{TRACE_CONSISTENCY_TOLERANCE:.0%} for {', '.join(suspect)}: those "
                     "traces were disturbed; distrust the simulated figures built on them and "
                     "calibrate again on a quieter machine.")
    ov = cal.get("overheads", {})
    if ov:
        lines.append("overheads (no-op jobs): " + "; ".join(
            f"{p} job {o['job'] * 1e6:.1f} us, take {o['task'] * 1e9:.0f} ns"
            for p, o in ov.items()))
    if cal.get("submitter_wake_s") is not None:
        lines.append(f"submitter wake-up past its spin: {cal['submitter_wake_s'] * 1e6:.1f} us")
    return lines


def _num(v):
    return f"{v:.2f}" if isinstance(v, (int, float)) else "?"
