"""Measuring the scaling sweep on this machine (:func:`measure_scaling`): undisturbed samples,
pool policies interleaved in rounds, and the runs the simulator's calibration needs."""
from __future__ import annotations

import contextlib
import statistics

from asymo.hw import topology as topo
from asymo.lab.machine import loadavg
from asymo.lab.sampling import (DEFAULT_MAX_EXTERNAL, measure_items, overhead_items,
                                overheads_from, summarize)
from asymo.lab.scaling.result import Point, ScalingResult, machine_meta
from asymo.lab.scaling.workloads import BASELINES, POOL_POLICIES
from asymo.lab.sim.calibrate import SimCalibrator, default_period
from asymo.lab.sim.engine import first_cores

__all__ = ["measure_scaling", "CALIBRATION_ROUNDS"]

#: calibration rounds at least, when the simulator is calibrated beside a sweep
CALIBRATION_ROUNDS = 8


def _policies_for(workload, policies):
    have = workload.policies()
    if policies is None:
        return have
    return [p for p in policies if p in have]


def measure_scaling(workloads, *, policies=None, topology=None, max_cores=None, repeats=5,
                    min_time=0.02, progress=True, calibrate=False,
                    max_external=DEFAULT_MAX_EXTERNAL, emulator_period=None):
    """Measure throughput at 1 .. ncpus cores (fastest cluster first) on this machine.

    Parameters
    ----------
    workloads : sequence of Workload
    policies : sequence of str, optional
        Subset of ``POOL_POLICIES + BASELINES``; default: every one available for each workload
        (policies a workload cannot run, e.g. torch when absent, are skipped).
    topology : Topology, optional
        Default ``asymo.hw.topology.detect()`` (which sees the emulator's override).
    max_cores : int, optional
        Stop at this many cores.
    repeats : int
        Samples per point (pool policies interleaved over all points, baselines in blocks;
        see :func:`asymo.lab.sampling.measure_items`); the median is reported.
    min_time : float
        Each sample lasts at least this long (seconds).
    progress : bool
        Show a tqdm progress bar on stderr.
    calibrate : bool
        Also measure what the simulator needs to model the workloads here (see
        :mod:`asymo.lab.sim.calibrate`), in runs of its own: one calibration round after each
        round of the sweep (at least ``CALIBRATION_ROUNDS``), so that a drift in the
        machine's speed hits the calibration and the points alike; stored as
        ``result.calibration``, used by :func:`validate_sim`.
    max_external : float
        A sample during which other processes used more than this share of the machine's
        cores counts as disturbed: points are re-sampled (up to 4x ``repeats``) until they
        have ``repeats`` undisturbed samples, and the median is over those (over all samples
        when none was undisturbed; ``Point.samples_clean`` says which). 1.0 keeps everything.
    emulator_period : float, optional
        Seconds per period of the emulator the topology runs under (recorded in the meta
        data, used by the calibration and :func:`validate_sim`); default: the running
        emulator's (env ``ASYMO_EMULATED_PERIOD``), else ``asymo.lab.emulate.DEFAULT_PERIOD``.

    Returns
    -------
    ScalingResult
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if min_time < 0:
        raise ValueError(f"min_time must be >= 0, got {min_time}")
    if policies is not None:
        unknown = [p for p in policies if p not in POOL_POLICIES + BASELINES]
        if unknown:
            raise ValueError(f"unknown policy {unknown[0]!r}; choose from "
                             f"{', '.join(POOL_POLICIES + BASELINES)}")
    topology = topology if topology is not None else topo.detect()
    ncores = topology.ncpus if max_cores is None else min(int(max_cores), topology.ncpus)
    if ncores < 1:
        raise ValueError(f"max_cores must be >= 1, got {max_cores}")
    items, meta = [], {}
    for wl in workloads:
        for pol in _policies_for(wl, policies):
            for k in range(1, ncores + 1):
                sub = first_cores(topology, k)
                items.append(((wl.name, pol, k),
                              lambda wl=wl, pol=pol, sub=sub: wl.runner(pol, sub),
                              pol in POOL_POLICIES))
                meta[(wl.name, pol, k)] = (wl, sub)
    if not items:
        raise RuntimeError("nothing to measure: none of the requested policies can run the "
                           "requested workloads in this build")
    pool_workloads = [wl for wl in workloads
                      if any(p in POOL_POLICIES for p in _policies_for(wl, policies))]
    calibration = None
    calibrator = contextlib.nullcontext()
    if calibrate:
        # the simulator's inputs, measured in runs of their own, one calibration round
        # after each of the sweep's rounds (drift in the machine's speed hits both alike)
        items += overhead_items(topology)
        calibrator = SimCalibrator(topology, pool_workloads, emulator_period=emulator_period,
                                   max_external=max_external)
    load_before = loadavg()
    with calibrator as cal:
        samples = measure_items(items, repeats, min_time, progress, desc="scaling",
                                 max_external=max_external, main_cpu=topology.cpus[0],
                                 between_rounds=cal.round if calibrate else None)
        if calibrate:
            while cal.rounds < CALIBRATION_ROUNDS:
                cal.round()
            overheads = overheads_from(samples, max_external)
            calibration = cal.result(overheads, interleaved=True)
    load_after = loadavg()
    points = []
    for key, (wl, sub) in meta.items():
        med, times, shares, nclean = summarize(samples[key], max_external)
        points.append(Point(workload=wl.name, policy=key[1], cores=key[2],
                            throughput=wl.throughput(med), unit=wl.unit, time_s=med,
                            cpus=list(sub.cpus), times_s=times,
                            external_load=statistics.median(shares),
                            samples_clean=nclean, samples_total=len(samples[key])))
    res = ScalingResult(points=points, mode="measured", topology=first_cores(topology, ncores),
                        meta=machine_meta(topology) | {"repeats": repeats,
                                                        "min_time_s": min_time,
                                                        "interleaved": True,
                                                        "max_external_load": max_external,
                                                        "loadavg_before": load_before,
                                                        "loadavg_after": load_after},
                        workloads={wl.name: wl.describe() for wl in workloads})
    res.workload_objs = list(workloads)
    if topology.emulated:
        if emulator_period is None:
            emulator_period = default_period()
        res.meta["emulator_period_s"] = emulator_period
    res.calibration = calibration
    res.fill_speedups()
    return res
