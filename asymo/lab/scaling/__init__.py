"""Scaling benchmark: throughput as cores are added, fastest cluster first.

For each workload (``spin``, ``matmul``, ``conv2d``, ``models``) and each way of running it
(the pool policies ``asymo``, ``even``, ``shared``, ``steal``; NumPy with its BLAS threads
limited by threadpoolctl; torch when installed) the workload runs on the first ``k`` cores of
the topology for k = 1 .. ncpus (all cores of the fastest cluster first, then the next
cluster), and its throughput is the work per run over the median time per run. This is the
measurement behind AsyMo's Fig. 11 and Pipe-it's Fig. 3: on an asymmetric CPU, a policy that
splits work evenly gets *slower* when the slow cores join.

The same sweep can come from the simulator (:func:`simulate_scaling`, any preset CPU), and
:func:`validate_sim` checks the simulator against a measured sweep of this machine.

Every point is plain data (:class:`Point`); :class:`ScalingResult` renders the table, the JSON
and the plot.

Modules:

- :mod:`~asymo.lab.scaling.machine`: machine state for a run (thread affinity, pinned threads,
  the pools runners open, BLAS / torch thread limits).
- :mod:`~asymo.lab.scaling.workloads`: :class:`Workload` and its kinds, ``POOL_POLICIES`` and
  ``BASELINES``.
- :mod:`~asymo.lab.scaling.result`: :class:`Point`, :class:`ScalingResult` (table, JSON, plot).
- :mod:`~asymo.lab.scaling.measure`: :func:`measure_scaling` and the calibration runs.
- :mod:`~asymo.lab.scaling.simulate`: :func:`simulate_scaling`, :func:`parse_interference`.
- :mod:`~asymo.lab.scaling.validate`: :func:`validate_sim`, :func:`format_validation`.

The public names, and the private ones other parts of asymo use, are re-exported here. A
module-level setting (e.g. ``SIM_BACK_TO_BACK_MAX``) is read in the module that defines it:
change it there (``asymo.lab.scaling.validate.SIM_BACK_TO_BACK_MAX``), not here.
"""
from asymo.lab.scaling.machine import (_OPEN_POOLS, _asymo_attr, _open_pool, _pinned_thread,
                                   _thread_ids, parse_emulate, process_affinity)
from asymo.lab.scaling.measure import (BASELINE_SETTLE_S, CALIBRATION_ROUNDS, DEFAULT_MAX_EXTERNAL,
                                   MAX_ROUNDS_FACTOR, _calibration_from, _calibration_items,
                                   _loadavg, _measure_items, measure_scaling)
from asymo.lab.scaling.result import SCHEMA, Point, ScalingResult
from asymo.lab.scaling.simulate import DEFAULT_SIM_OVERHEADS, parse_interference, simulate_scaling
from asymo.lab.scaling.validate import (SIM_BACK_TO_BACK_MAX, SIM_BACK_TO_BACK_PERIODS, SIM_PHASES,
                                    _duty_cycles, _noop_overheads, _phased, _sim_mean,
                                    _trace_cpus, back_to_back_calls, format_validation,
                                    validate_sim)
from asymo.lab.scaling.workloads import (BASELINES, POOL_POLICIES, WORKLOADS, Conv2dWorkload,
                                     MatmulWorkload, ModelWorkload, SpinWorkload, Workload,
                                     _im2col_conv, make_workloads)
from asymo.lab.sim.calibrate import calibrate_sim

__all__ = [
    "POOL_POLICIES", "BASELINES", "WORKLOADS", "Point", "ScalingResult", "Workload",
    "SpinWorkload", "MatmulWorkload", "Conv2dWorkload", "ModelWorkload", "make_workloads",
    "measure_scaling", "simulate_scaling", "validate_sim", "calibrate_sim",
    "parse_emulate", "parse_interference", "process_affinity", "DEFAULT_SIM_OVERHEADS",
]
