"""Validating the simulator against a measured sweep of this machine (:func:`validate_sim`):
the emulator's duty cycles, phases and back-to-back calls (the report's text is
:func:`asymo.lab.scaling.report.format_validation`)."""
from __future__ import annotations

import math
import statistics

import numpy as np

from asymo.lab.machine import emulated_cpus
from asymo.lab.scaling.workloads import POOL_POLICIES
from asymo.lab.sim.calibrate import (calibrate_sim, default_period, sim_inputs, submitter_wake,
                                     traced_ratio)
from asymo.lab.sim.engine import DutyCycle, Job, Overheads, first_cores, simulate

__all__ = ["validate_sim", "back_to_back_calls", "sim_mean", "phased", "duty_cycles",
           "noop_overheads", "TOLERANCE", "SIM_PHASES", "SIM_BACK_TO_BACK_PERIODS",
           "SIM_BACK_TO_BACK_MAX"]


#: the issue's target: simulated throughput within this share of the measured
TOLERANCE = 0.10
SIM_PHASES = 4   # emulator phases averaged over (the stops' offset from the run's start)
# A validated sample is simulated as calls back to back (the sweep times them so: a call's
# duty-cycle phase follows from the previous one's end), enough to cover this many emulator
# periods, at most SIM_BACK_TO_BACK_MAX calls (speed).
SIM_BACK_TO_BACK_PERIODS = 40
SIM_BACK_TO_BACK_MAX = 32


def duty_cycles(topology, period):
    """The emulator's stops on ``topology``'s emulated cores: core ``cpu`` at speed ``s`` is
    stopped for ``1 - s`` of every period (see :class:`asymo.lab.sim.DutyCycle`)."""
    return [DutyCycle(cpu=cpu, busy=1.0 - topology.emulated[cpu], period=period)
            for cpu in emulated_cpus(topology)]


def phased(interference, i, n):
    """The interference list with every duty cycle's periods shifted by ``i / n`` of a
    period (other kinds unchanged)."""
    return [DutyCycle(cpu=d.cpu, busy=d.busy, period=d.period, phase=d.period * i / n)
            if isinstance(d, DutyCycle) else d for d in interference]


def back_to_back_calls(one_call_s, period):
    """How many calls of ``one_call_s`` seconds a back-to-back sample is simulated as: enough
    to cover ``SIM_BACK_TO_BACK_PERIODS`` emulator periods, 1 to ``SIM_BACK_TO_BACK_MAX``."""
    if not (one_call_s > 0 and math.isfinite(one_call_s)):
        return 1
    return int(min(SIM_BACK_TO_BACK_MAX,
                   max(1, math.ceil(SIM_BACK_TO_BACK_PERIODS * period / one_call_s))))


def sim_mean(topology, jobs, policy, overheads, interference, *, back_to_back=False):
    """Simulated makespan of one call (the job sequence ``jobs``), averaged over SIM_PHASES
    offsets of the emulator's periods. ``back_to_back``: the call is simulated ``R`` times
    in a row in one simulation (:func:`back_to_back_calls`; each call's jobs with their
    traced delays, so that the gap between calls is the submitter's own work and the
    duty-cycle phase carries over from one call to the next, as when the sweep times calls
    back to back), and the makespan is the total over ``R``; ``res.calls`` says ``R``."""
    duties = [d for d in interference if isinstance(d, DutyCycle)]
    if not duties:
        res = simulate(topology, jobs, policy=policy, overheads=overheads,
                       interference=interference)
        res.calls = 1
        return res
    def phased_runs(calls):
        return [simulate(topology, list(jobs) * calls, policy=policy, overheads=overheads,
                         interference=phased(interference, i, SIM_PHASES))
                for i in range(SIM_PHASES)]

    runs = phased_runs(1)
    reps = 1
    if back_to_back:
        one = statistics.fmean(r.makespan for r in runs)
        reps = back_to_back_calls(one, max(d.period for d in duties))
        if reps > 1:
            runs = phased_runs(reps)
    res = runs[0]
    res.makespan = statistics.fmean(r.makespan for r in runs) / reps
    res.calls = reps
    return res


def noop_overheads(cal, topology, duties):
    """Per-policy overheads: the no-op job times less what the model already explains (the
    emulator's stops delay a job whose tasks wait for a stopped core)."""
    nw = topology.ncpus
    ncl = topology.nclusters
    out = {}
    for pol, o in cal["overheads"].items():
        small, big = o.get("small_s"), o.get("big_s")
        if small is None or not duties:
            out[pol] = o
            continue
        zero = [Job(costs=np.zeros((n, ncl)), name="noop") for n in (nw, 64 * nw)]
        s_small = sim_mean(topology, zero[:1], pol, Overheads(), duties).makespan
        s_big = sim_mean(topology, zero[1:], pol, Overheads(), duties).makespan
        per_take = max(0.0, ((big - s_big) - (small - s_small)) / 63.0)
        out[pol] = {"job": max(0.0, small - s_small - per_take), "task": per_take,
                    "steal": per_take}
    return out


def validate_sim(measured, *, calibration=None, topology=None, workloads=None, repeats=5,
                 min_time=0.02, emulator_period=None):
    """Compare the simulator with a measured sweep of this machine, workload by workload.

    The simulator is given only a calibration (:mod:`asymo.lab.sim.calibrate`, measured in runs
    separate from the sweep: ``calibration``, else ``measured.calibration``, else measured
    now): each workload's real job sequence traced task by task as each cluster with the
    submitting thread's work between jobs; on an emulated machine the emulator's duty cycle
    (an emulated core at speed ``s`` is stopped for ``1 - s`` of every ``emulator_period``
    plus the time per period the workload was measured to lose beyond that), each sample
    simulated as calls back to back (the duty-cycle phase carried from call to call, as the
    sweep times them; :func:`back_to_back_calls`) and averaged over ``SIM_PHASES`` starting
    offsets; the workload's co-running interference factor; per-policy overheads from no-op
    jobs; the submitter's measured wake-up, charged to a job whose last task ends past the
    submitter's spin (``Overheads.wake``). The measured multi-core throughputs are what it must
    reproduce.

    ``emulator_period`` is the period of the emulator the sweep ran under (default: the
    sweep's ``meta["emulator_period_s"]``, else the running emulator's
    ``ASYMO_EMULATED_PERIOD``, else ``asymo.lab.emulate.DEFAULT_PERIOD``); a
    calibration measured at another period is carried over through its time lost per
    period.

    Fills ``sim_throughput`` on the measured pool-policy points and returns (and stores on
    ``measured``) a dict with per-point errors and, per workload, ``sim_error`` per policy:
    the relative error at the largest core count, and ``sim_error_duty_only``: the same
    simulation with the nominal duty cycle and no co-running interference (what the inputs
    beyond the traces change). The top-level ``sim_error`` is the spin workload's
    (scheduling alone), or the first workload's when spin was not measured;
    ``sim_error_by_workload`` has them all.
    """
    topology = topology if topology is not None else measured.topology
    workloads = list(workloads or measured.workload_objs or [])
    byname = {wl.name: wl for wl in workloads}
    pts = [p for p in measured.points if p.policy in POOL_POLICIES and p.workload in byname]
    if not pts:
        raise ValueError("validation needs workloads measured with pool policies")
    names = list(dict.fromkeys(p.workload for p in pts))
    if emulator_period is None:
        emulator_period = measured.meta.get("emulator_period_s")
    if emulator_period is None:
        emulator_period = default_period()
    cal = calibration or getattr(measured, "calibration", None)
    if cal is None or any(n not in cal["workloads"] for n in names):
        cal = calibrate_sim(topology, [byname[n] for n in names], repeats=repeats,
                            min_time=min_time, emulator_period=emulator_period)
    duties = duty_cycles(topology, emulator_period)
    overheads = noop_overheads(cal, topology, duties)
    wake = submitter_wake(cal)
    out = {}
    for name in names:
        wl = byname[name]
        mine = sorted((p for p in pts if p.workload == name), key=lambda q: (q.policy, q.cores))
        kmax = max(p.cores for p in mine)
        rows, sim_error, sim_error0 = [], {}, {}
        inputs = {}
        for p in mine:
            if p.cores not in inputs:
                inputs[p.cores] = (
                    sim_inputs(cal, name, p.cores, topology, emulator_period=emulator_period),
                    sim_inputs(cal, name, p.cores, topology, emulator_period=emulator_period,
                               corun=False, availability=False))
            (jobs, itf), (_, itf0) = inputs[p.cores]
            sub = first_cores(topology, p.cores)
            o = overheads[p.policy]
            ov = Overheads(job=o["job"], task=o["task"], steal=o["steal"], wake=wake)
            res = sim_mean(sub, jobs, p.policy, ov, itf, back_to_back=True)
            res0 = sim_mean(sub, jobs, p.policy, ov, itf0, back_to_back=True)
            sim_tp = wl.throughput(res.makespan)
            p.sim_throughput = sim_tp
            best = wl.throughput(min(p.times_s)) if p.times_s else p.throughput
            rows.append({"policy": p.policy, "cores": p.cores, "measured": p.throughput,
                         "measured_best": best, "simulated": sim_tp,
                         "error": sim_tp / p.throughput - 1.0,
                         "error_vs_best": sim_tp / best - 1.0,
                         "simulated_duty_only": wl.throughput(res0.makespan),
                         "calls_back_to_back": res.calls,
                         "error_duty_only": wl.throughput(res0.makespan) / p.throughput - 1.0,
                         "steals_by_direction": res.steals_by_direction})
            if p.cores == kmax:
                sim_error[p.policy] = rows[-1]["error"]
                sim_error0[p.policy] = rows[-1]["error_duty_only"]
        # diagnostic: the error of the predicted speedup over the policy's own 1-core point
        # (the level of a run drifts with the machine's load between the calibration and
        # the sweep; the scaling is what the multi-core model adds)
        one = {r["policy"]: r for r in rows if r["cores"] == 1}
        for r in rows:
            b = one.get(r["policy"])
            r["error_speedup"] = ((r["simulated"] / b["simulated"]) /
                                  (r["measured"] / b["measured"]) - 1.0) if b else None
        jobs = inputs[kmax][0][0]
        entry = cal["workloads"][name]
        out[name] = {"unit": wl.unit, "jobs": len(jobs) - 1,
                     "tasks": int(sum(j.ntasks for j in jobs)),
                     "serial_s": float(sum(j.delay for j in jobs)),
                     "availability": {c: a["availability"]
                                      for c, a in entry.get("emulated", {}).items()},
                     "corun_factor": entry.get("corun", {}).get("factor"),
                     "points": rows, "sim_error": sim_error,
                     "sim_error_duty_only": sim_error0,
                     "max_abs_error": max(abs(r["error"]) for r in rows)}
    primary = "spin" if "spin" in out else names[0]
    val = {"workloads": out, "primary": primary, "sim_error": dict(out[primary]["sim_error"]),
           "sim_error_by_workload": {n: dict(w["sim_error"]) for n, w in out.items()},
           "max_abs_error": max(w["max_abs_error"] for w in out.values()), "tolerance": TOLERANCE,
           "calibration": cal,
           "model": {"task_costs": "traced (asymo.lab.sim.trace), per task and cluster, medians "
                                   "of runs separate from the sweep",
                     "traced_over_untraced_1core": {n: traced_ratio(cal, n) for n in names},
                     "emulator": [{"cpu": d.cpu, "stopped": d.busy, "period_s": d.period}
                                  for d in duties],
                     "emulator_period_s": emulator_period if duties else None,
                     "phases": SIM_PHASES if duties else 1,
                     "back_to_back": {"periods": SIM_BACK_TO_BACK_PERIODS,
                                      "max_calls": SIM_BACK_TO_BACK_MAX} if duties else None,
                     "submitter_wake_s": wake,
                     "overheads_s": overheads}}
    measured.validation = val
    return val
