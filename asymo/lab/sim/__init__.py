"""Simulate asymo's pool on CPUs this machine cannot be.

A discrete-event model of the pool (one worker per core, per-cluster task split, each
policy's queueing and stealing rules, scheduling overheads, interference on chosen cores,
the asymmetry emulator's duty cycle, co-running interference), its calibration for the
machine at hand (``asymo.lab.sim.calibrate``),
built-in CPU presets (Kirin 970, Snapdragon 845, RK3588, Pixel 6, Intel 6P+8E) and job
builders for the workloads ``asymo bench scaling`` measures, with GEMM task costs from the
per-cluster rates or from AsyMo's cost model in a calibration profile (``asymo.lab.sim.costs``).

Modules, lowest first: ``engine`` (the model; the pool's policies and constants read from the
C library), ``presets``, ``costs``, ``trace`` (tracing real jobs on the pool) and
``calibrate`` (measuring the model's inputs on this machine, with :mod:`asymo.lab.machine`
and :mod:`asymo.lab.sampling`). Nothing here imports :mod:`asymo.lab.scaling`, which builds
on it.

>>> from asymo.lab import sim
>>> job = sim.Job.uniform(96, 1e-3)                 # 96 tasks of 1 ms on a speed-1.0 core
>>> r = sim.simulate("kirin970", job, policy="asymo")
>>> round(r.efficiency, 2) > 0.9
True
"""
from asymo.lab.sim.engine import (POLICIES, CoRunning, DutyCycle, Interference, Job, Overheads,
                                  SimResult, first_cores, simulate, split_counts)
from asymo.lab.sim.costs import ModelCosts, load_model_costs
from asymo.lab.sim.presets import PRESETS, Preset, get_preset, preset_names

__all__ = [
    "POLICIES", "CoRunning", "DutyCycle", "Interference", "Job", "Overheads", "SimResult",
    "first_cores", "simulate", "split_counts", "PRESETS", "Preset", "get_preset", "preset_names",
    "ModelCosts", "load_model_costs",
]
