"""Planning: from a model and a machine to a pipeline plan (plain data).

``plan_pipeline`` builds the time matrix ``T`` (the calibrated Pipe-it time model, the default
model scaled by capacity, or measured layer times), then chooses stages and layer ranges for
the objective:

- ``throughput``: ``method="optimal"`` (default) solves every stage configuration of Pipe-it's
  design space exactly (``optimal_pipeline``); ``"pipe-it"`` runs Algorithm 3 (merge_stage);
  ``"two-stage"`` runs paper 004's Algorithm 1 over all pairs of core configurations. The
  kernel-level run (one stage on every core) competes too. The other methods' predictions are
  reported beside the choice (``alternatives``).
- ``latency`` and ``energy``: the partition minimising the sum of stage times, or of stage
  energies (active power x time), over the same space plus kernel-level (paper 004 Eq. 4-5).

The plan also carries the kernel-level prediction and paper 004's Pareto set of
(throughput, latency, energy) over its candidate set.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import numpy as np

from asymo.pipeline.configs import core_configs, stage_cpus
from asymo.pipeline.dse import merge_stage
from asymo.pipeline.optimal import StageCost, optimal_pipeline
from asymo.pipeline.two_stage import OBJECTIVES, best_two_stage, candidates

__all__ = ["StagePlan", "PipelinePlan", "plan_pipeline", "default_power", "METHODS"]

METHODS = ("optimal", "pipe-it", "two-stage")
POWER_ESTIMATE = ("estimated, relative units: active power of a core taken as its capacity "
                  "squared (no power meter)")


def default_power(topology, *, with_source=False):
    """Active power (W) of each core configuration's cores (and ``"all"``) at top frequency.

    From ``asymo.dvfs``'s power model (``P = P_static + C V^2 f``, an estimate built from what
    the system describes); if that cannot be built, relative units with a core's power taken
    as its capacity squared. Either way no power meter is read.
    """
    out, source = {}, POWER_ESTIMATE
    try:
        from asymo.dvfs.power_model import PowerModel
        pm = PowerModel.from_system(topology)
        per_core = []
        for cl in topology.clusters:
            cp = pm[cl.name]
            per_core.append(cp.core_dynamic_w(cp.freqs_khz[-1]) + cp.p_static_w / cp.ncpus)
        source = (f"{pm.source}: active power of the stage's cores at top frequency, "
                  "estimated (no power meter)")
    except Exception:  # noqa: BLE001 - any failure: fall back to the relative estimate
        per_core = [cl.capacity ** 2 for cl in topology.clusters]
    for c in core_configs(topology):
        out[c] = c.count * per_core[c.cluster]
    out["all"] = sum(cl.ncpus * p for cl, p in zip(topology.clusters, per_core))
    return (out, source) if with_source else out


@dataclass
class StagePlan:
    cpus: tuple
    layers: tuple            # (first, last), inclusive indices into model.layers
    config: object           # CoreConfig, or "all" for kernel-level on every core
    label: str
    predicted_time: float    # s per image

    def to_dict(self):
        return {"cpus": list(self.cpus), "layers": list(self.layers), "config": self.label,
                "predicted_time_s": self.predicted_time}


@dataclass
class PipelinePlan:
    model: str
    topology: object
    objective: str
    method: str
    stages: list
    predicted_throughput: float
    predicted_latency: float
    predicted_energy: float
    kernel_level_predicted_throughput: float
    kernel_level_predicted_latency: float
    source: str
    energy_source: str = POWER_ESTIMATE
    alternatives: dict = field(default_factory=dict)
    pareto: list = field(default_factory=list)

    @property
    def layer_ranges(self):
        return [s.layers for s in self.stages]

    def describe(self):
        return "-".join(s.label for s in self.stages)

    def to_dict(self):
        return {
            "model": self.model, "topology": self.topology.to_spec(),
            "objective": self.objective, "method": self.method,
            "pipeline": self.describe(),
            "stages": [s.to_dict() for s in self.stages],
            "predicted_throughput": self.predicted_throughput,
            "predicted_latency_s": self.predicted_latency,
            "predicted_energy_per_image": self.predicted_energy, "energy_unit": "J",
            "kernel_level_predicted_throughput": self.kernel_level_predicted_throughput,
            "kernel_level_predicted_latency_s": self.kernel_level_predicted_latency,
            "prediction_source": self.source, "energy_source": self.energy_source,
            "alternatives": self.alternatives, "pareto": self.pareto,
        }


def _stages_from(P, L, table, topology, cost):
    """Drop empty stages, attach cpus and inclusive ranges."""
    cpus = stage_cpus(P, topology)
    out = []
    for cfg, (a, b), cp in zip(P, L, cpus):
        if b <= a:
            continue
        out.append(StagePlan(cp, (a, b - 1), cfg, cfg.label(topology), cost(cfg, a, b)))
    return out


def _kernel_stage(table, topology):
    W = table.nlayers
    t = float(table.kernel_level.sum())
    return [StagePlan(tuple(topology.cpus), (0, W - 1), "all", "all", t)]


def _metrics(stages, power):
    times = [s.predicted_time for s in stages]
    period = max(times)
    energy = sum(power[s.config] * s.predicted_time for s in stages)
    return 1.0 / period if period > 0 else float("inf"), float(sum(times)), float(energy)


def _check_transfer_k(transfer_k):
    """A negative or NaN ``k`` makes stages look free (infinite throughput): refuse it."""
    if transfer_k is None:
        return
    values = transfer_k.values() if hasattr(transfer_k, "values") else [transfer_k]
    for k in values:
        try:
            ok = math.isfinite(float(k)) and float(k) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"transfer_k must be finite and >= 0 (seconds per byte), "
                             f"got {k!r}")


def plan_pipeline(model, topology=None, *, objective="throughput", method="optimal",
                  table=None, timemodel=None, transfer_k=None, power=None,
                  allow_kernel_level=True):
    """Plan a pipeline for ``model`` on ``topology``.

    Parameters
    ----------
    model : Model
        A zoo model (``.name``, ``.layers``).
    topology : Topology, optional
        The machine to plan for (default: this one, ``asymo.hw.topology.detect()``).
    objective : {"throughput", "latency", "energy"}
    method : {"optimal", "pipe-it", "two-stage"}
        How the throughput objective is searched (see module docstring).
    table : LayerTimes, optional
        Use these layer times (e.g. measured ones) instead of the time model.
    timemodel : LayerTimeModel, optional
        Default: the calibrated model from the profile, else the default model.
    transfer_k : float or mapping CoreConfig -> float, optional
        Paper 004's ``k`` (s/byte) for activations crossing a stage boundary.
    power : mapping, optional
        Active power per core configuration (and ``"all"``); default ``default_power``.
    allow_kernel_level : bool
        Let the kernel-level run (one stage, every core) win if it is predicted better.

    Returns
    -------
    PipelinePlan
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    _check_transfer_k(transfer_k)
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    if table is None:
        if timemodel is None:
            from asymo.pipeline.timemodel import LayerTimeModel
            timemodel = LayerTimeModel.load(topology)
        table = timemodel.table(model, core_configs(topology))
    if table.nlayers != len(model.layers):
        raise ValueError(f"the time table has {table.nlayers} layers, the model "
                         f"{len(model.layers)}")
    if not np.any(np.asarray(table.times) > 0):
        # the time model leaves element-wise work out (negligible beside convolutions):
        # a model of nothing else would be planned at an infinite rate
        raise ValueError(f"the time model predicts no time for any layer of {model.name} "
                         "(it counts convolutions, matrix products and pooling, not "
                         "element-wise operators): measure the layers instead "
                         "(`--measured`, asymo.pipeline.calibrate.measure_layer_times)")
    if power is None:
        power, energy_source = default_power(topology, with_source=True)
    else:
        energy_source = "given power model"
    power = dict(power)
    sizes = [c.ncpus for c in topology.clusters]
    W = table.nlayers
    cost = StageCost(table, transfer_k=transfer_k)

    alternatives = {}
    chosen = None

    def record(name, P, L):
        stages = _stages_from(P, L, table, topology, cost)
        thr, lat, en = _metrics(stages, power)
        alternatives[name] = {"pipeline": "-".join(s.label for s in stages),
                              "layers": [list(s.layers) for s in stages],
                              "predicted_throughput": thr, "predicted_latency_s": lat,
                              "predicted_energy_per_image": en}
        return stages

    pipeit = merge_stage((0, W), sizes, table)
    s_pipeit = record("pipe-it", pipeit.P, pipeit.L)
    try:
        two, P2, L2 = best_two_stage(table, sizes, transfer_k=transfer_k)
        s_two = record("two-stage", P2, L2)
    except ValueError:  # a single core: no two disjoint configurations
        s_two = None
    try:
        opt = optimal_pipeline(table, sizes, cost=cost)
        s_opt = record("optimal", opt.P, opt.L)
    except ValueError:
        s_opt = None
    s_kl = None
    if table.kernel_level is not None:
        s_kl = _kernel_stage(table, topology)
        thr, lat, en = _metrics(s_kl, power)
        alternatives["kernel-level"] = {"pipeline": "all", "layers": [[0, W - 1]],
                                        "predicted_throughput": thr,
                                        "predicted_latency_s": lat,
                                        "predicted_energy_per_image": en}

    used_method = method
    if objective == "throughput":
        chosen = {"optimal": s_opt or s_pipeit, "pipe-it": s_pipeit,
                  "two-stage": s_two or s_pipeit}[method]
        if method == "optimal" and s_opt is None:
            used_method = "pipe-it"
        if allow_kernel_level and s_kl is not None and \
                _metrics(s_kl, power)[0] > _metrics(chosen, power)[0]:
            chosen, used_method = s_kl, "kernel-level"
    else:
        weight = None if objective == "latency" else power
        c2 = StageCost(table, transfer_k=transfer_k, weight=weight)
        try:
            best = optimal_pipeline(table, sizes, combine="sum", cost=c2)
            chosen = _stages_from(best.P, best.L, table, topology, cost)
        except ValueError:
            chosen = s_pipeit
        key = 1 if objective == "latency" else 2
        if allow_kernel_level and s_kl is not None and \
                _metrics(s_kl, power)[key] < _metrics(chosen, power)[key]:
            chosen, used_method = s_kl, "kernel-level"
        else:
            used_method = "optimal"
    thr, lat, en = _metrics(chosen, power)

    # paper 004's candidate set plus the chosen plan and kernel-level
    cands = candidates(table, sizes, transfer_k=transfer_k)
    pts = []
    for P, L in cands:
        st = _stages_from(P, L, table, topology, cost)
        pts.append((tuple(s.label for s in st), [list(s.layers) for s in st],
                    _metrics(st, power)))
    for st in filter(None, (chosen, s_kl, s_opt)):
        pts.append((tuple(s.label for s in st), [list(s.layers) for s in st],
                    _metrics(st, power)))
    front = _pareto(pts)
    kl_thr = kl_lat = float("nan")
    if s_kl is not None:
        kl_thr, kl_lat, _ = _metrics(s_kl, power)
    return PipelinePlan(model=getattr(model, "name", "model"), topology=topology,
                        objective=objective, method=used_method, stages=chosen,
                        predicted_throughput=thr, predicted_latency=lat, predicted_energy=en,
                        kernel_level_predicted_throughput=kl_thr,
                        kernel_level_predicted_latency=kl_lat, source=table.source,
                        energy_source=energy_source, alternatives=alternatives,
                        pareto=front)


def _pareto(pts):
    """Non-dominated (max throughput, min latency, min energy) points, deduplicated."""
    uniq = {}
    for labels, layers, m in pts:
        uniq.setdefault((labels, tuple(map(tuple, layers))), m)
    keys = list(uniq)
    M = np.array([uniq[k] for k in keys], dtype=np.float64).reshape(-1, 3)
    M[:, 0] = -M[:, 0]  # minimise all three
    M = np.nan_to_num(M, nan=0.0)
    front = []
    for i, k in enumerate(keys):
        le = np.all(M <= M[i], axis=1)
        lt = np.any(M < M[i], axis=1)
        if np.any(le & lt):
            continue
        thr, lat, en = uniq[k]
        front.append({"pipeline": "-".join(k[0]), "layers": [list(x) for x in k[1]],
                      "predicted_throughput": thr, "predicted_latency_s": lat,
                      "predicted_energy_per_image": en})
    front.sort(key=lambda d: -d["predicted_throughput"])
    return front
