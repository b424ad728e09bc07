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

Modules, lowest first (each imports only those above it, the simulator :mod:`asymo.lab.sim`
and :mod:`asymo.lab.machine` / :mod:`asymo.lab.sampling`):

- :mod:`~asymo.lab.scaling.workloads`: :class:`Workload` and its kinds, ``POOL_POLICIES`` and
  ``BASELINES``.
- :mod:`~asymo.lab.scaling.report`: the text of a validation, numbers in table columns.
- :mod:`~asymo.lab.scaling.result`: :class:`Point`, :class:`ScalingResult` (table, JSON, plot).
- :mod:`~asymo.lab.scaling.measure`: :func:`measure_scaling`.
- :mod:`~asymo.lab.scaling.simulate`: :func:`simulate_scaling`, :func:`parse_interference`.
- :mod:`~asymo.lab.scaling.validate`: :func:`validate_sim` and its pieces.

Machine state for a run (affinity, pinned threads, the pools runners open) is
:mod:`asymo.lab.machine`; the sampler the measurements share is :mod:`asymo.lab.sampling`.
The public names are re-exported here. A module-level setting (e.g.
``SIM_BACK_TO_BACK_MAX``) is read in the module that defines it: change it there
(``asymo.lab.scaling.validate.SIM_BACK_TO_BACK_MAX``), not here.
"""
from asymo.lab.machine import parse_emulate, process_affinity
from asymo.lab.scaling.measure import CALIBRATION_ROUNDS, measure_scaling
from asymo.lab.scaling.report import format_validation
from asymo.lab.scaling.result import SCHEMA, Point, ScalingResult
from asymo.lab.scaling.simulate import DEFAULT_SIM_OVERHEADS, parse_interference, simulate_scaling
from asymo.lab.scaling.validate import (SIM_BACK_TO_BACK_MAX, SIM_BACK_TO_BACK_PERIODS, SIM_PHASES,
                                        TOLERANCE, back_to_back_calls, duty_cycles,
                                        noop_overheads, phased, sim_mean, validate_sim)
from asymo.lab.scaling.workloads import (BASELINES, POOL_POLICIES, WORKLOADS, Conv2dWorkload,
                                         MatmulWorkload, ModelWorkload, SpinWorkload, Workload,
                                         im2col_conv, make_workloads)
from asymo.lab.sim.calibrate import calibrate_sim

__all__ = [
    "POOL_POLICIES", "BASELINES", "WORKLOADS", "Point", "ScalingResult", "Workload",
    "SpinWorkload", "MatmulWorkload", "Conv2dWorkload", "ModelWorkload", "make_workloads",
    "measure_scaling", "simulate_scaling", "validate_sim", "calibrate_sim",
    "parse_emulate", "parse_interference", "process_affinity", "DEFAULT_SIM_OVERHEADS",
]
