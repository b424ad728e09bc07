"""Simulator task costs from AsyMo's block-size cost model (paper 003, section 4.2, Table 2).

The simulator's default turns a GEMM task's FLOPs into seconds with a flat per-cluster
GFLOP/s (the cluster's *capability*). A calibration profile (``asymo calibrate``, possibly
run on the device being simulated) holds, per cluster, the cost model that asymo's planner
uses to choose block sizes: it predicts the latency ``L(setting)`` of one cluster computing
an ``M x K x N`` product with blocks ``(mc, nc, kc)`` on ``threads`` cores. `ModelCosts`
turns those predictions into the simulator's per-task, per-cluster costs.

How a task's cost is derived
----------------------------
A plan (`asymo.plan.gemm.GemmPlan`) gives cluster *c* a share of the product -- ``part_m x K
x part_n`` (split along M or N), its blocks and ``n_c`` pool tasks (one ``mc x nc`` block of
C over the whole K loop each; for the skinny "mv" path, ``chunk`` rows or columns over all
of K). The model was fitted on exactly such runs: one cluster alone, ``T`` cores taking
the share's ``n_c`` tasks, timed from submit to join. So the share's setting is predicted
as a whole and spread back over its tasks:

``cost on cluster d of a task of c's share = (L_d(share_c, blocks_c, T_d) - max(F_d, 0))
/ ceil(n_c / T_d)``

where ``F_d`` is the model's constant term for the setting's kind (the intercept ``t_fram``;
for the extended model plus its skinny-path indicator's coefficient on "mv" settings).

* ``ceil(n_c / T)`` is the number of waves ``T`` cores run the ``n_c`` equal tasks in: what
  the timed run did. With this divisor, simulating a cluster alone on its own share (no
  simulator overheads) gives back the model's prediction less its per-call cost, exactly. (The
  Table 2 model writes the parallel part as ``n/T``; when ``T`` divides ``n`` the two agree,
  otherwise the last partial wave is what the wall clock saw.)
* A positive constant term is a per-call cost -- submitting, waking and joining -- not time
  inside tasks, so it is taken out of the task costs; the simulator charges the per-call
  cost as its own ``Overheads.job`` (measured on the pool directly), not the fitted constant,
  which extrapolates settings of about 0.1 ms to 100 ms to zero work. A *negative* constant
  cannot be a cost: it is the fit correcting its proportional terms (the profile of the
  development machine had ``t_fram`` = -0.40 ms (quick calibration) and -0.05 ms (full) for
  its MM settings under a positive-weight regression), so it stays in the prediction; taking
  it out would add ``|t_fram|`` to every share.
* The same task on another cluster *d* costs what *d*'s own model predicts for the same
  share with the same blocks on *d*'s cores (``T_d`` of them, which is what sets how many
  threads share its L2); so symmetric clusters with equal models give equal costs, and
  stealing moves a task at the price the thief's model puts on it.
* Tasks within a share are taken as equal (edge blocks are not modelled), as in the
  capability path.

What the model does not cover falls back to capabilities (the caller's FLOP-rate path):
"outer" products (K = 1), batch splits, plans whose task count is not the one this module
derives, and settings for which a model predicts no positive time (a linear fit
extrapolated far outside its data). `ModelCosts` counts both kinds of jobs, so the output
can say which costs came from where. The model was fitted to choose block sizes (the
ranking of settings), not to predict absolute time; see the README for how far off it is on
the machine it was fitted on.
"""
from __future__ import annotations

import math
import os

import numpy as np

from asymo.lab.sim.engine import Job
from asymo.plan import costmodel as cm

__all__ = ["ModelCosts", "share_settings", "fixed_cost", "gemm_task_costs", "load_model_costs",
           "model_costs_for"]


def share_settings(plan):
    """Each cluster's share of ``plan`` as a cost-model setting.

    Returns
    -------
    list of (setting, ntasks) or None
        Per cluster: ``setting`` = ``[M, K, N, mc, nc, kc, threads, kind]`` with ``threads``
        left as 0 (the caller sets the cluster it predicts for), and the share's task count;
        ``None`` for an idle cluster. None instead of the list when the model does not
        describe the plan (see the module docstring).
    """
    M, K, N = plan.shape
    if plan.kind not in cm.KIND_CODES or plan.split_dim not in ("M", "N") or min(M, K, N) < 1:
        return None
    if getattr(plan, "serial", False):
        # the calling thread runs the whole product alone, with the first cluster's blocks
        mc, nc, kc = plan.blocks[0]
        if plan.kind == "mv":
            chunk = plan.chunks[0]
            mc, nc, kc = (chunk, N, K) if plan.split_dim == "M" else (M, chunk, K)
        return [([M, K, N, mc, nc, kc, 0, cm.KIND_CODES[plan.kind]], 1)]
    counts = plan.task_counts()
    out = []
    for (a, b), (mc, nc, kc), chunk, n in zip(plan.cluster_ranges, plan.blocks, plan.chunks,
                                               counts):
        if b <= a:
            if n:
                return None
            out.append(None)
            continue
        part_m, part_n = (b - a, N) if plan.split_dim == "M" else (M, b - a)
        if plan.kind == "mm":
            expect = math.ceil(part_m / mc) * math.ceil(part_n / nc)
        else:   # the skinny path: a task is `chunk` elements of the split dimension, all of K
            mc, nc, kc = (chunk, part_n, K) if plan.split_dim == "M" else (part_m, chunk, K)
            expect = math.ceil((b - a) / chunk)
        if n != expect:
            return None     # the driver cuts this plan otherwise (e.g. shares applied to K)
        out.append(([part_m, K, part_n, mc, nc, kc, 0, cm.KIND_CODES[plan.kind]], n))
    return out


def fixed_cost(model, kind):
    """The constant term of ``model``'s prediction for settings of ``kind`` (a
    `asymo.plan.costmodel.KIND_CODES` value): the intercept, plus the coefficient of the extended
    feature set's skinny-path indicator for "mv" settings."""
    fixed = model.intercept
    if model.features == "extended" and kind == cm.KIND_CODES["mv"]:
        fixed += float(model.coef[cm.EXTENDED_FEATURES.index("mv")])
    return fixed


def gemm_task_costs(plan, models, threads):
    """Seconds each task of ``plan`` takes on a core of each cluster, from the cost models.

    Parameters
    ----------
    plan : asymo.plan.gemm.GemmPlan
        The plan as the simulated topology would run it (one range and block per cluster).
    models : sequence of CostPredictor
        One per cluster of the plan, fastest first.
    threads : sequence of int
        Cores of each cluster (the ``T`` the model predicts for).

    Returns
    -------
    ndarray of shape (ntasks, nclusters), or None
        Row order is the pool's (cluster 0's tasks first). None when the models do not cover
        the plan (the caller then uses capabilities).
    """
    ncl = plan.nclusters
    if len(models) != ncl or len(threads) != ncl:
        raise ValueError(f"gemm_task_costs: the plan has {ncl} clusters but {len(models)} "
                         f"models and {len(threads)} thread counts were given")
    threads = [int(t) for t in threads]
    if min(threads) < 1:
        raise ValueError(f"gemm_task_costs: threads must be >= 1, got {threads}")
    shares = share_settings(plan)
    if shares is None:
        return None
    serial = getattr(plan, "serial", False)
    rows = []
    for share in shares:
        if share is None:
            continue
        setting, n = share
        per_task = []
        for d, (model, T) in enumerate(zip(models, threads)):
            T = 1 if serial else T       # the calling thread alone
            X = np.array([setting[:6] + [T, setting[7]]], dtype=np.float64)
            work = float(model.predict(X)[0]) - max(fixed_cost(model, setting[7]), 0.0)
            if not (math.isfinite(work) and work > 0):
                return None
            per_task.append(work / math.ceil(n / T))
        rows.extend([per_task] * n)
    return np.array(rows, dtype=np.float64).reshape(len(rows), ncl)


class ModelCosts:
    """Per-cluster cost models for a topology, as the simulator's source of GEMM task costs.

    Parameters
    ----------
    models : sequence of CostPredictor
        One per cluster of ``topology``, fastest first.
    topology : Topology
        The full topology the models belong to. Simulated sub-topologies (its first ``k``
        cores, `asymo.lab.sim.first_cores`) use the models of the clusters they keep, with their
        own core counts.
    source : str
        Where the models came from (a profile path), for the output.
    names : sequence of str, optional
        The model variant per cluster (the profile's ``model_name``), for the output.

    ``jobs_model`` and ``jobs_capabilities`` count the GEMM jobs built from the models and
    those the models do not cover (which used capabilities); `reset` zeroes them.
    """

    def __init__(self, models, topology, *, source="", names=None):
        models = tuple(models)
        if len(models) != topology.nclusters:
            raise ValueError(f"{len(models)} cost models for a topology of "
                             f"{topology.nclusters} clusters ({topology.to_spec()})")
        for m in models:
            if not isinstance(m, cm.CostPredictor):
                raise TypeError(f"cost models must be asymo.plan.costmodel.CostPredictor, not "
                                f"{type(m).__name__}")
        self.models = models
        self.topology = topology
        self.source = str(source)
        self.names = tuple(names) if names is not None else tuple(m.features for m in models)
        self.reset()

    def reset(self):
        self.jobs_model = 0
        self.jobs_capabilities = 0

    @classmethod
    def from_calibration(cls, calibration, topology):
        """From a parsed profile section (`asymo.plan.calibration.Calibration`)."""
        return cls([c.model for c in calibration.clusters], topology,
                   source=calibration.path or "calibration",
                   names=[getattr(c.model, "features", "") for c in calibration.clusters])

    def models_for(self, topology):
        """The models of ``topology``'s clusters: a prefix of this one's (same order, each
        cluster's cpus among the full cluster's)."""
        if topology.nclusters > len(self.models):
            raise ValueError(f"topology {topology.to_spec()} has more clusters than the cost "
                             f"models' ({self.topology.to_spec()})")
        for sub, full in zip(topology.clusters, self.topology.clusters):
            if not set(sub.cpus) <= set(full.cpus):
                raise ValueError(f"cluster {sub.name!r} (cpus {list(sub.cpus)}) is not part of "
                                 f"the cost models' cluster {full.name!r} (cpus "
                                 f"{list(full.cpus)})")
        return self.models[:topology.nclusters]

    def task_costs(self, plan, topology):
        """`gemm_task_costs` for ``plan`` on ``topology`` (this topology or its first cores),
        or None when the models do not cover the plan."""
        models = self.models_for(topology)
        return gemm_task_costs(plan, models, [c.ncpus for c in topology.clusters])

    def gemm_job(self, plan, topology, name=""):
        """A simulator `Job` for ``plan`` with cost-model task costs (the plan's split), or
        None when the models do not cover the plan: the caller builds the job from
        capabilities. Counts both outcomes."""
        costs = self.task_costs(plan, topology)
        if costs is None:
            self.jobs_capabilities += 1
            return None
        self.jobs_model += 1
        if getattr(plan, "serial", False):
            split = [1] + [0] * (topology.nclusters - 1)
        else:
            split = list(plan.task_counts())
        return Job(costs=costs, split=split, name=name)

    def describe(self):
        """One line for the output: where task costs came from."""
        models = ", ".join(f"{c.name}: {n}" for c, n in zip(self.topology.clusters, self.names))
        return (f"GEMM task costs: cost model from {self.source} ({models}; {self.jobs_model} "
                f"jobs, {self.jobs_capabilities} not covered -> capabilities); other work: "
                "capabilities")

    def to_dict(self):
        return {"source": self.source, "clusters": [
            {"name": c.name, "cpus": list(c.cpus), "model": n,
             "fixed_s": {k: fixed_cost(m, v) for k, v in cm.KIND_CODES.items()}}
            for c, n, m in zip(self.topology.clusters, self.names, self.models)],
            "jobs_from_model": self.jobs_model,
            "jobs_from_capabilities": self.jobs_capabilities}


def load_model_costs(path, topology):
    """`ModelCosts` from a calibration profile file (as ``asymo calibrate`` writes it) whose
    clusters match ``topology``'s.

    The file may come from another machine (the device being simulated): unlike
    `asymo.profile.load_profile`, the CPU fingerprint is not required to be this one's. It is
    read as JSON only (never unpickled); anything that is not a usable profile with a GEMM
    calibration for ``topology`` raises ValueError saying what is wrong.
    """
    from asymo.plan.calibration import SECTION, parse_section
    from asymo.profile import PROFILE_VERSION
    path = os.fspath(path)
    where = f"calibration profile {path}"
    from asymo.profile.files import loads_bounded, read_regular_file
    try:
        raw = read_regular_file(path)  # a regular file only, size-limited, never blocking
    except OSError as exc:
        raise ValueError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        data = loads_bounded(raw)
    except ValueError as exc:
        raise ValueError(f"{where} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != "asymo-profile":
        raise ValueError(f"{where} is not an asymo calibration profile (no "
                         "'format': 'asymo-profile')")
    if data.get("version") != PROFILE_VERSION:
        raise ValueError(f"{where} has version {data.get('version')!r}; this asymo reads "
                         f"version {PROFILE_VERSION}")
    sections = data.get("sections")
    if not isinstance(sections, dict) or SECTION not in sections:
        raise ValueError(f"{where} has no GEMM calibration (section {SECTION!r}): run "
                         "`asymo calibrate` on the device")
    section = sections[SECTION]
    try:
        cal = parse_section(section, topology, path)
    except ValueError as exc:
        theirs = section.get("topology") if isinstance(section, dict) else None
        raise ValueError(f"{where} does not fit the simulated topology "
                         f"{topology.to_spec()!r} (the profile's: {theirs!r}): {exc}") from None
    if cal.dtype != "float32":
        raise ValueError(f"{where} is calibrated for {cal.dtype}; the simulated workloads are "
                         "float32")
    # the profile's name for each model variant, else the parsed model's feature set
    names = [c.get("model_name") if isinstance(c.get("model_name"), str) else cc.model.features
             for c, cc in zip(section["clusters"], cal.clusters)]
    return ModelCosts([c.model for c in cal.clusters], topology, source=path, names=names)


def model_costs_for(source, topology):
    """`ModelCosts` for simulating ``topology`` (or its first cores), with zeroed counters.

    ``source``: a `ModelCosts` (checked against ``topology``), a parsed profile section
    (`asymo.plan.calibration.Calibration`, checked likewise) or the path of a profile file
    (`load_model_costs`). ValueError when the models do not fit ``topology``.
    """
    from asymo.plan.calibration import Calibration
    if isinstance(source, ModelCosts):
        costs = source
    elif isinstance(source, Calibration):
        if len(source.clusters) != topology.nclusters or any(
                tuple(c.cpus) != tuple(cl.cpus)
                for c, cl in zip(source.clusters, topology.clusters)):
            raise ValueError(f"the calibration's clusters "
                             f"{[list(c.cpus) for c in source.clusters]} do not match the "
                             f"simulated topology {topology.to_spec()!r}")
        costs = ModelCosts.from_calibration(source, topology)
    elif isinstance(source, (str, os.PathLike)):
        costs = load_model_costs(source, topology)
    else:
        raise TypeError(f"cost_models must be ModelCosts, a Calibration or a profile path, not "
                        f"{type(source).__name__}")
    costs.models_for(topology)
    costs.reset()
    return costs
