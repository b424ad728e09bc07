"""The scaling sweep from the simulator (:func:`simulate_scaling`) for a preset CPU or a
topology, with interference windows (:func:`parse_interference`)."""
from __future__ import annotations

import math

import numpy as np

from asymo.hw import topology as topo
from asymo.lab.scaling.result import Point, ScalingResult
from asymo.lab.scaling.workloads import POOL_POLICIES
from asymo.lab.sim.costs import model_costs_for
from asymo.lab.sim.engine import CoRunning, Interference, Job, Overheads, first_cores, simulate
from asymo.lab.sim.presets import Preset, get_preset

# Scheduling costs the simulator uses for preset CPUs unless told otherwise, from asymo's pool
# on the development machine: an empty job through parallel_for 3.8 us (bench/pool_overhead.py,
# README "Thread pool"), a take from the own queue one uncontended lock round trip (~50 ns);
# a steal (locking another core's queue, a few cache-line transfers) is an estimate. A phone
# core is slower, so these are optimistic there; --sim-overheads changes them.
DEFAULT_SIM_OVERHEADS = Overheads(job=4e-6, task=50e-9, steal=0.5e-6)


def _numpy_model_jobs(jobs, k):
    """OpenBLAS's static split: each job becomes k equal contiguous chunks, one per thread."""
    out = []
    for j in jobs:
        if j.costs.ndim == 1:
            out.append(Job(costs=np.full(k, j.costs.sum() / k), name=j.name))
        else:
            out.append(Job(costs=np.tile(j.costs.sum(axis=0) / k, (k, 1)), name=j.name))
    return out


def parse_interference(text):
    """Parse ``"4:0.5"`` / ``"4:0.5:2:10,5:0"`` into Interference windows.

    Each item is ``CPU:SPEED[:START_MS:STOP_MS]``: the core runs at ``SPEED`` of its speed
    from START to STOP milliseconds after the start of each simulated run (the whole run when
    omitted).
    """
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) == 2:
                out.append(Interference(cpu=int(parts[0]), speed=float(parts[1])))
            elif len(parts) == 4:
                out.append(Interference(cpu=int(parts[0]), speed=float(parts[1]),
                                        start=float(parts[2]) / 1e3,
                                        stop=float(parts[3]) / 1e3))
            else:
                raise ValueError("expected CPU:SPEED or CPU:SPEED:START_MS:STOP_MS")
        except ValueError as exc:
            raise ValueError(f"bad interference item {item.strip()!r}: {exc}") from None
    return out


def simulate_scaling(target, workloads, *, policies=None, overheads=None, speeds=None,
                     gflops_per_core=None, max_cores=None, interference=(), corun=None,
                     progress=False, cost_models=None):
    """The scaling sweep from the simulator instead of the machine.

    Parameters
    ----------
    target : str, Preset or Topology
        A preset name (``asymo.lab.sim.preset_names()``) or a topology.
    workloads : sequence of Workload
    policies : sequence of str, optional
        Pool policies, plus ``"numpy"`` modelled as OpenBLAS's static split (one equal range
        per thread). Default: the four pool policies and numpy.
    overheads : Overheads, optional
        Default ``DEFAULT_SIM_OVERHEADS``.
    speeds : sequence of float, optional
        True per-cluster speeds (default: the capacities).
    gflops_per_core : sequence of float, optional
        Per-cluster FP32 rate; default: the preset's, or 10 GFLOP/s x capacity.
    interference : sequence of Interference
        Cores slowed in every simulated run (windows on cores not yet added are ignored; a
        cpu the topology does not have, or a core stopped for the whole run, is a
        ValueError).
    corun : float, optional
        Co-running interference (:class:`asymo.lab.sim.CoRunning`): a core's speed while one
        other core runs tasks, all cores sharing one resource. Default: none (an assumption
        for a preset: measure it on the device with ``--calibrate-sim``).
    cost_models : ModelCosts, Calibration, str or path, optional
        Price GEMM tasks with AsyMo's cost model instead of ``gflops_per_core``: the models
        (`asymo.lab.sim.costs.ModelCosts`), a parsed profile section
        (`asymo.plan.calibration.Calibration`) or a calibration profile file (``asymo
        calibrate``, e.g. run on the device) whose clusters must match the target's
        (ValueError naming the mismatch otherwise). Work the models do not cover keeps the
        capabilities; ``meta["task_costs"]`` says which jobs came from where
        (`asymo.lab.sim.costs`).
    """
    if isinstance(target, str):
        target = get_preset(target)
    if isinstance(target, Preset):
        preset_name, topology = target.name, target.topology
        rates = list(gflops_per_core or target.gflops_per_core)
    elif isinstance(target, topo.Topology):
        preset_name, topology = None, target
        rates = list(gflops_per_core or [10.0 * c.capacity for c in topology.clusters])
    else:
        raise TypeError(f"target must be a preset name, Preset or Topology, not "
                        f"{type(target).__name__}")
    if len(rates) != topology.nclusters:
        raise ValueError(f"gflops_per_core has {len(rates)} entries for "
                         f"{topology.nclusters} clusters")
    if speeds is not None:
        # True speeds differ from the capacities: scale each cluster's rate accordingly.
        speeds = list(speeds)
        if len(speeds) != topology.nclusters:
            raise ValueError(f"speeds has {len(speeds)} entries for {topology.nclusters} "
                             "clusters")
        rates = [rates[0] * s for s in speeds]
    interference = list(interference)
    for itf in interference:
        # checked against the whole topology: the sweep drops windows on cores not yet
        # added, which would otherwise hide a cpu the topology does not have at all
        if itf.cpu not in topology.cpus:
            raise ValueError(f"interference on cpu {itf.cpu}, which the simulated topology "
                             f"({topology.to_spec()}) does not have")
        if itf.speed == 0 and math.isinf(itf.stop):
            raise ValueError(f"interference stops cpu {itf.cpu} for the whole run, so no run "
                             "that uses it would ever finish; give the stop a window "
                             "(CPU:0:START_MS:STOP_MS) or simulate without that core")
    overheads = overheads if overheads is not None else DEFAULT_SIM_OVERHEADS
    pols = list(policies) if policies is not None else list(POOL_POLICIES) + ["numpy"]
    bad = [p for p in pols if p not in POOL_POLICIES and p != "numpy"]
    if bad:
        raise ValueError(f"the simulator models the pool policies and 'numpy', not {bad}")
    ncores = topology.ncpus if max_cores is None else min(int(max_cores), topology.ncpus)
    if cost_models is not None:
        cost_models = model_costs_for(cost_models, topology)
    from tqdm import tqdm
    points = []
    plan = [(wl, pol, k) for wl in workloads for pol in pols for k in range(1, ncores + 1)]
    for wl, pol, k in tqdm(plan, desc="simulating", unit="pt", disable=not progress,
                           leave=False):
        sub = first_cores(topology, k)
        sub_rates = rates[:sub.nclusters]
        jobs = (wl.sim_jobs(sub, sub_rates) if cost_models is None
                else wl.sim_jobs(sub, sub_rates, task_costs=cost_models))
        itf = [i for i in interference if i.cpu in sub.cpus]
        if corun is not None and k > 1:
            itf.append(CoRunning(factor=corun))
        if pol == "numpy":
            jobs = _numpy_model_jobs(jobs, k)
            res = simulate(sub, jobs, policy="even", overheads=overheads, interference=itf)
        else:
            res = simulate(sub, jobs, policy=pol, overheads=overheads, interference=itf)
        points.append(Point(workload=wl.name, policy=pol, cores=k,
                            throughput=wl.throughput(res.makespan), unit=wl.unit,
                            time_s=res.makespan, cpus=list(sub.cpus)))
    res = ScalingResult(points=points, mode="simulated", topology=first_cores(topology, ncores),
                        meta={"preset": preset_name, "gflops_per_core": rates,
                              "overheads_s": overheads.to_dict(),
                              "corun_factor": corun,
                              "interference": [{"cpu": i.cpu, "speed": i.speed,
                                                "start_s": i.start,
                                                "stop_s": i.stop if math.isfinite(i.stop)
                                                else None} for i in interference],
                              "model": "discrete-event simulation of the pool (asymo.lab.sim); "
                                       "compute only: no caches or memory bandwidth; 'numpy' "
                                       "modelled as a static equal split; "
                                       + (cost_models.describe() if cost_models is not None
                                          else "task costs: capabilities (gflops_per_core)"),
                              "task_costs": (cost_models.to_dict() if cost_models is not None
                                             else "capabilities")},
                        workloads={wl.name: wl.describe() for wl in workloads})
    res.fill_speedups()
    return res
