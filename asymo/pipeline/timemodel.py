"""Per-layer execution-time prediction (Pipe-it, paper 000, Section V).

- ``GemmTimeRegressor``: Eq. 5, ``T = b1 N + b2 K + b3 M + b4 NK + b5 KM + b6 NM + b7 NMK + b8``
  on the GEMM dimensions of Eq. 4, fitted by linear regression for one core configuration
  (type, count). It is a scikit-learn estimator (``fit``/``predict``). Layer times span four
  orders of magnitude, so the least-squares fit weights each sample by ``1/T^2`` (it minimises
  relative error, the figure Table III reports); the model form is Eq. 5's.
- ``MultiCoreModel``: Eq. 6-8, ``T_multi = (T - a1)/H + a2 N/(ts H) + a3``, which predicts a
  core count ``H`` of a cluster from that cluster's single-core Eq. 5, with ``a1..a3`` fitted
  by linear regression on multi-core measurements (``a = 0`` until some exist).
- ``LayerTimeModel``: one Eq. 5 regressor per core configuration and *operation family*
  (``conv``: dense/grouped convolution; ``dwconv``: depthwise; ``fc``: fully connected, which
  the paper also fits with Eq. 5, Sect. V-D; ``pool``: pooling/LRN, the light steps Pipe-it
  folds into the preceding layer, with N = output pixels, K = window, M = channels), plus the
  kernel-level configuration (all cores in one pool). It predicts a zoo layer as the sum over
  its steps and builds the time matrix ``T`` for the DSE. It serialises to plain JSON (the
  profile section ``"pipeline"``).

Without a calibration, ``LayerTimeModel.default(topology)`` takes the reference single-core
fit shipped with asymo (measured on the development machine, see ``reference_timemodel.json``)
and scales it by each cluster's capacity (Eq. 8 for core counts); its predictions are labelled
as such.
"""
from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression

from asymo.pipeline.configs import CoreConfig
from asymo.pipeline.table import LayerTimes

__all__ = ["GemmTimeRegressor", "MultiCoreModel", "LayerTimeModel", "eq5_features",
           "layer_operations", "FAMILIES", "KERNEL_LEVEL", "TimeModelWarning"]

FAMILIES = ("conv", "dwconv", "fc", "pool")
KERNEL_LEVEL = "all"          # key of the kernel-level configuration (every core, one pool)
SECTION = "pipeline"
FORMAT = "asymo-pipeline-timemodel"
FORMAT_VERSION = 1
_MIN_TIME = 1e-7              # a prediction below 0.1 us is clipped: Eq. 5 can dip below 0


class TimeModelWarning(UserWarning):
    """A stored time model could not be used; a default is used instead."""


def eq5_features(X):
    """The seven non-constant terms of Eq. 5 for rows ``(N, K, M)``."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 3:
        raise ValueError(f"X must have shape (n, 3) with columns N, K, M; got {X.shape}")
    if np.any(X <= 0) or not np.all(np.isfinite(X)):
        raise ValueError("GEMM dimensions N, K, M must be finite and positive")
    N, K, M = X[:, 0], X[:, 1], X[:, 2]
    return np.stack([N, K, M, N * K, K * M, N * M, N * K * M], axis=1)


class GemmTimeRegressor(RegressorMixin, BaseEstimator):
    """Pipe-it Eq. 5 for one core configuration.

    Parameters
    ----------
    relative : bool, default True
        Weight samples by ``1 / T^2`` so the fit minimises relative error.

    Attributes
    ----------
    coef_ : ndarray, shape (8,)
        ``beta_1 .. beta_8`` (seconds per unit of N, K, M, NK, KM, NM, NMK; intercept).
    """

    def __init__(self, relative=True):
        self.relative = relative

    def fit(self, X, y, sample_weight=None):
        F = eq5_features(X)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (F.shape[0],):
            raise ValueError(f"y must have shape ({F.shape[0]},), got {y.shape}")
        if np.any(y <= 0) or not np.all(np.isfinite(y)):
            raise ValueError("measured times must be finite and positive")
        if F.shape[0] < 2:
            raise ValueError("Eq. 5 needs at least 2 samples")
        w = 1.0 / y ** 2 if self.relative else np.ones_like(y)
        if sample_weight is not None:
            w = w * np.asarray(sample_weight, dtype=np.float64)
        # scale columns for conditioning, then map the coefficients back
        scale = np.abs(F).max(axis=0)
        scale[scale == 0] = 1.0
        ys = y.mean()
        reg = LinearRegression().fit(F / scale, y / ys, sample_weight=w)
        self.coef_ = np.concatenate([reg.coef_ * ys / scale, [reg.intercept_ * ys]])
        self.n_samples_ = int(F.shape[0])
        self.floor_ = float(max(_MIN_TIME, 0.25 * y.min()))
        return self

    def predict(self, X):
        c = self._coef()
        t = eq5_features(X) @ c[:7] + c[7]
        return np.maximum(t, getattr(self, "floor_", _MIN_TIME))

    def _coef(self):
        if not hasattr(self, "coef_"):
            raise RuntimeError("GemmTimeRegressor is not fitted")
        return self.coef_

    def scaled(self, factor):
        """A copy whose predictions are ``factor`` times this one's."""
        out = GemmTimeRegressor(self.relative)
        out.coef_ = self._coef() * float(factor)
        out.n_samples_ = getattr(self, "n_samples_", 0)
        out.floor_ = getattr(self, "floor_", _MIN_TIME) * float(factor)
        return out

    def to_dict(self):
        return {"coef": [float(v) for v in self._coef()], "n_samples": self.n_samples_,
                "floor": self.floor_}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or not isinstance(d.get("coef"), list):
            raise ValueError(f"an Eq. 5 model is an object with a 'coef' list, not {d!r:.80}")
        coef = np.asarray(d["coef"], dtype=np.float64)
        if coef.shape != (8,) or not np.all(np.isfinite(coef)):
            raise ValueError("an Eq. 5 model has 8 finite coefficients")
        out = cls()
        out.coef_ = coef
        out.n_samples_ = int(d.get("n_samples", 0))
        out.floor_ = float(d.get("floor", _MIN_TIME))
        if not (math.isfinite(out.floor_) and 0 < out.floor_ < 1e3):
            raise ValueError(f"an Eq. 5 model's floor is {out.floor_!r} s")
        return out


class MultiCoreModel(RegressorMixin, BaseEstimator):
    """Pipe-it Eq. 6-8 for one core type: ``T_multi = (T - a1)/H + a2 N/(ts H) + a3``.

    ``fit(X, y)`` takes rows ``(N, T, H)``: GEMM rows ``N``, the single-core time ``T``
    (Eq. 5) and the core count ``H``; ``y`` is the measured multi-core time.
    """

    def __init__(self, tile=64, relative=True):
        self.tile = tile
        self.relative = relative

    def fit(self, X, y):
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != 3 or y.shape != (X.shape[0],):
            raise ValueError("X must be (n, 3) rows of (N, T, H) and y (n,)")
        N, T, H = X.T
        if np.any(H < 1) or np.any(y <= 0):
            raise ValueError("core counts must be >= 1 and times positive")
        target = y - T / H
        F = np.stack([-1.0 / H, N / (self.tile * H)], axis=1)
        w = 1.0 / y ** 2 if self.relative else None
        reg = LinearRegression().fit(F, target, sample_weight=w)
        self.alpha_ = np.array([reg.coef_[0], reg.coef_[1], reg.intercept_])
        return self

    def predict(self, X):
        X = np.asarray(X, dtype=np.float64)
        N, T, H = X.T
        a1, a2, a3 = getattr(self, "alpha_", np.zeros(3))
        return np.maximum((T - a1) / H + a2 * N / (self.tile * H) + a3, _MIN_TIME)

    def to_dict(self):
        return {"alpha": [float(v) for v in getattr(self, "alpha_", np.zeros(3))],
                "tile": self.tile}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or not isinstance(d.get("alpha"), list):
            raise ValueError(f"an Eq. 6-8 model is an object with an 'alpha' list, not "
                             f"{d!r:.80}")
        tile = d.get("tile", 64)
        if isinstance(tile, bool) or not isinstance(tile, int) or not 1 <= tile <= 4096:
            raise ValueError(f"an Eq. 6-8 model's tile is {tile!r}")
        out = cls(tile=tile)
        a = np.asarray(d["alpha"], dtype=np.float64)
        if a.shape != (3,) or not np.all(np.isfinite(a)):
            raise ValueError("Eq. 6-8 has 3 finite coefficients")
        out.alpha_ = a
        return out


# --- zoo layers as operations ----------------------------------------------------------------

def _pair(v):
    return (int(v), int(v)) if np.isscalar(v) else (int(v[0]), int(v[1]))


def layer_operations(steps):
    """Flatten a layer's steps into ``(family, N, K, M, repeat)`` operations.

    Dense convolution: Eq. 4 dims; a grouped one is ``groups`` GEMMs of ``M/groups`` maps.
    Depthwise: ``N = Ow Oh``, ``K = Fw Fh``, ``M = channels``. Fully connected: ``(1, in, out)``.
    Pooling / LRN: ``N`` output pixels, ``K`` window, ``M`` channels. Flatten, softmax and the
    element-wise add of a residual block are negligible and skipped.
    """
    ops = []
    for s in steps:
        kind = type(s).__name__
        if kind == "Conv":
            n, k, m = s.gemm_dims
            if s.groups > 1 and getattr(s, "depthwise", False):
                kh, kw = _pair(s.kernel)
                ops.append(("dwconv", n, kh * kw, s.out_shape[0], 1))
            elif s.groups > 1:
                ops.append(("conv", n, k, max(1, m // s.groups), s.groups))
            else:
                ops.append(("conv", n, k, m, 1))
        elif kind == "Linear":
            n, k, m = s.gemm_dims
            ops.append(("fc", n, k, m, 1))
        elif kind == "Pool":
            c, h, w = s.in_shape
            oh, ow = s.out_shape[1], s.out_shape[2]
            win = h * w if s.kernel is None else _pair(s.kernel)[0] * _pair(s.kernel)[1]
            ops.append(("pool", oh * ow, win, c, 1))
        elif kind == "LRN":
            c, h, w = s.in_shape
            ops.append(("pool", h * w, s.size, c, 1))
        elif kind == "Concat":
            for b in s.branches:
                ops.extend(layer_operations(b))
        elif kind == "Residual":
            ops.extend(layer_operations(s.main))
            ops.extend(layer_operations(s.shortcut))
    return ops


def _config_key(config):
    if config == KERNEL_LEVEL:
        return KERNEL_LEVEL
    return f"{config.cluster}x{config.count}"


def _parse_key(key):
    if key == KERNEL_LEVEL:
        return KERNEL_LEVEL
    c, _, n = key.partition("x")
    return CoreConfig(int(c), int(n))


class LayerTimeModel:
    """Eq. 5 per (core configuration, operation family), Eq. 6-8 per cluster for core counts
    that were not measured.

    Parameters
    ----------
    models : dict
        ``{config: {family: GemmTimeRegressor}}`` with ``config`` a ``CoreConfig`` or
        ``KERNEL_LEVEL``.
    multicore : dict, optional
        ``{cluster: MultiCoreModel}``.
    source : str
        Label for predictions made with this model.
    capacities : sequence of float, optional
        Cluster capacities, used to scale a cluster's model from another cluster when it has
        none.
    """

    def __init__(self, models, multicore=None, source="predicted (calibrated)",
                 capacities=None, kernel_level_cores=None):
        self.models = {k: dict(v) for k, v in models.items()}
        # without a kernel-level fit: Eq. 8 with this (capacity-weighted) core count
        self.kernel_level_cores = kernel_level_cores
        self.multicore = dict(multicore or {})
        self.source = source
        self.capacities = None if capacities is None else [float(c) for c in capacities]

    # -- fitting -------------------------------------------------------------------------------
    @classmethod
    def fit(cls, samples, *, tile=64, capacities=None, source="predicted (calibrated)"):
        """Fit from micro-benchmark samples.

        Parameters
        ----------
        samples : iterable of dict
            ``{"config": CoreConfig or "all", "family": str, "N": int, "K": int, "M": int,
            "seconds": float}``.
        """
        by = {}
        for s in samples:
            cfg = s["config"]
            if isinstance(cfg, str) and cfg != KERNEL_LEVEL:
                cfg = _parse_key(cfg)
            fam = s["family"]
            if fam not in FAMILIES:
                raise ValueError(f"unknown operation family {fam!r}; expected one of {FAMILIES}")
            by.setdefault(cfg, {}).setdefault(fam, []).append(
                (s["N"], s["K"], s["M"], s["seconds"]))
        if not by:
            raise ValueError("no samples to fit")
        models = {}
        for cfg, fams in by.items():
            for fam, rows in fams.items():
                a = np.asarray(rows, dtype=np.float64)
                if a.shape[0] < 9:
                    warnings.warn(f"only {a.shape[0]} samples for {fam} on {cfg}; Eq. 5 has "
                                  "8 coefficients", TimeModelWarning, stacklevel=2)
                models.setdefault(cfg, {})[fam] = GemmTimeRegressor().fit(a[:, :3], a[:, 3])
        out = cls(models, source=source, capacities=capacities)
        # Eq. 6-8: for each cluster with single-core and multi-core measurements
        multi = {}
        for cfg, fams in by.items():
            if cfg == KERNEL_LEVEL or cfg.count == 1:
                continue
            single = models.get(CoreConfig(cfg.cluster, 1), {})
            rows = fams.get("conv", [])
            if "conv" in single and rows:
                a = np.asarray(rows, dtype=np.float64)
                T1 = single["conv"].predict(a[:, :3])
                multi.setdefault(cfg.cluster, []).append(
                    np.stack([a[:, 0], T1, np.full(len(a), cfg.count), a[:, 3]], axis=1))
        for cl, parts in multi.items():
            a = np.concatenate(parts)
            out.multicore[cl] = MultiCoreModel(tile=tile).fit(a[:, :3], a[:, 3])
        return out

    # -- prediction ----------------------------------------------------------------------------
    def _regressor(self, config, family):
        fams = self.models.get(config)
        if fams:
            return fams.get(family) or fams.get("conv")
        return None

    def predict_ops(self, ops, config):
        """Time of a list of ``(family, N, K, M, repeat)`` operations on ``config``."""
        if not ops:
            return 0.0
        total = 0.0
        for fam in {o[0] for o in ops}:
            rows = np.array([o[1:4] for o in ops if o[0] == fam], dtype=np.float64)
            reps = np.array([o[4] for o in ops if o[0] == fam], dtype=np.float64)
            total += float((self._predict(rows, config, fam) * reps).sum())
        return total

    def _predict(self, X, config, family):
        reg = self._regressor(config, family)
        if reg is not None:
            return reg.predict(X)
        if config == KERNEL_LEVEL:
            if self.kernel_level_cores is None:
                raise KeyError("no kernel-level model")
            # Eq. 8 with H = the capacity-weighted core count of the whole machine
            c0 = CoreConfig(0, 1)
            single = self._regressor(c0, family) or self._scaled_single(0, family)
            T1 = single.predict(X)
            mc = self.multicore.get(0) or MultiCoreModel()
            return mc.predict(np.stack([X[:, 0], T1, np.full(len(X),
                                                             self.kernel_level_cores)], axis=1))
        # Eq. 6-8 from the cluster's single-core model
        single = self._regressor(CoreConfig(config.cluster, 1), family)
        if single is None:
            single = self._scaled_single(config.cluster, family)
        T1 = single.predict(X)
        if config.count == 1:
            return T1
        mc = self.multicore.get(config.cluster) or MultiCoreModel()
        return mc.predict(np.stack([X[:, 0], T1, np.full(len(X), config.count)], axis=1))

    def _scaled_single(self, cluster, family):
        """A cluster without its own fit: another cluster's single-core fit scaled by the
        capacity ratio."""
        if not self.capacities or cluster >= len(self.capacities):
            raise KeyError(f"no time model for cluster {cluster} and no capacities to scale")
        for c, cap in enumerate(self.capacities):
            reg = self._regressor(CoreConfig(c, 1), family)
            if reg is not None:
                return reg.scaled(cap / self.capacities[cluster])
        raise KeyError(f"no single-core time model for family {family!r}")

    def predict_layer(self, layer, config):
        """Predicted time (s) of a zoo ``Layer`` (its steps) for one image on ``config``."""
        return self.predict_ops(layer_operations(layer.steps), config)

    def table(self, model, configs, *, kernel_level=True):
        """The time matrix ``T`` of a zoo model for ``configs`` (a ``LayerTimes``)."""
        configs = list(configs)
        ops = [layer_operations(l.steps) for l in model.layers]
        times = np.array([[self.predict_ops(o, c) for c in configs] for o in ops])
        kl = None
        if kernel_level:
            try:
                kl = np.array([self.predict_ops(o, KERNEL_LEVEL) for o in ops])
            except KeyError:
                kl = None
        out_bytes = [4 * int(np.prod(l.output_shape)) for l in model.layers]
        return LayerTimes(configs, times, [l.name for l in model.layers], out_bytes, kl,
                          self.source)

    # -- defaults ------------------------------------------------------------------------------
    @classmethod
    def reference(cls):
        """The reference fit shipped with asymo (one core of the development machine)."""
        path = os.path.join(os.path.dirname(__file__), "reference_timemodel.json")
        with open(path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def default(cls, topology):
        """Reference single-core fit scaled to each cluster by capacity (no calibration).

        Core counts use Eq. 8 with the reference's multi-core coefficients; kernel-level (every
        core in one pool, asymo's capacity-weighted split) uses Eq. 8 with ``H`` = the
        capacity-weighted core count. Neither knows the cost of sharing data across clusters,
        which only a calibration on the machine measures.
        """
        ref = cls.reference()
        base = ref.models[ref.reference_config]
        caps = [c.capacity for c in topology.clusters]
        models = {CoreConfig(ci, 1): {f: r.scaled(1.0 / cap) for f, r in base.items()}
                  for ci, cap in enumerate(caps)}
        mc = ref.multicore.get(ref.reference_config.cluster)
        multicore = {ci: mc for ci in range(len(caps))} if mc is not None else {}
        total = sum(c.capacity * c.ncpus for c in topology.clusters)
        return cls(models, multicore, source=f"predicted (default model: {ref.source}, "
                   "scaled by cluster capacity; not calibrated on this machine)",
                   capacities=caps, kernel_level_cores=total)

    @classmethod
    def load(cls, topology, profile=None):
        """The calibrated model from the profile section ``"pipeline"``, else the default.

        A section that is corrupt or from another format is reported with a
        ``TimeModelWarning`` and replaced by the default.
        """
        if profile is None:
            from asymo.profile import active_profile
            profile = active_profile(topology)
        sec = None if profile is None else profile.sections.get(SECTION)
        if sec:
            try:
                m = cls.from_dict(sec)
                if m.capacities is None:
                    m.capacities = [c.capacity for c in topology.clusters]
                elif len(m.capacities) != topology.nclusters:
                    raise ValueError(f"{len(m.capacities)} capacities for "
                                     f"{topology.nclusters} clusters")
                if (m.kernel_level_cores is not None
                        and m.kernel_level_cores > topology.ncpus * (1 + 1e-6)):
                    raise ValueError(f"kernel_level_cores {m.kernel_level_cores:g} exceeds "
                                     f"the {topology.ncpus} cpus of the topology")
                bad = [c.cluster for c in m.models
                       if c != KERNEL_LEVEL and not 0 <= c.cluster < topology.nclusters]
                if bad:
                    raise ValueError(f"models for cluster {bad[0]}, the topology has "
                                     f"{topology.nclusters}")
                return m
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
                warnings.warn(f"the profile's pipeline time model is unusable ({exc}); "
                              "using the default model", TimeModelWarning, stacklevel=2)
        return cls.default(topology)

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self):
        return {"format": FORMAT, "version": FORMAT_VERSION, "source": self.source,
                "capacities": self.capacities, "kernel_level_cores": self.kernel_level_cores,
                "models": {_config_key(c): {f: r.to_dict() for f, r in fams.items()}
                           for c, fams in self.models.items()},
                "multicore": {str(c): m.to_dict() for c, m in self.multicore.items()}}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not an asymo pipeline time model")
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(f"time model version {d.get('version')!r}, expected "
                             f"{FORMAT_VERSION}")
        raw_models = d.get("models")
        if not isinstance(raw_models, dict) or not raw_models:
            raise ValueError(f"'models' must be a non-empty object, not {raw_models!r:.80}")
        models = {}
        for key, fams in raw_models.items():
            cfg = _parse_key(key)
            if not isinstance(fams, dict) or not fams:
                raise ValueError(f"models[{key!r}] must be a non-empty object")
            for f in fams:
                if f not in FAMILIES:
                    raise ValueError(f"unknown operation family {f!r}")
            models[cfg] = {f: GemmTimeRegressor.from_dict(r) for f, r in fams.items()}
        raw_multi = d.get("multicore")
        if raw_multi is None:
            raw_multi = {}
        if not isinstance(raw_multi, dict):
            raise ValueError(f"'multicore' must be an object, not {raw_multi!r:.80}")
        multicore = {}
        for c, m in raw_multi.items():
            if not (isinstance(c, str) and c.isdigit() and int(c) < 64):
                raise ValueError(f"multicore key {c!r} is not a cluster index")
            multicore[int(c)] = MultiCoreModel.from_dict(m)
        caps = d.get("capacities")
        if caps is not None and not (
                isinstance(caps, list) and caps
                and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                        and math.isfinite(v) and 0 < v <= 1e3 for v in caps)):
            raise ValueError(f"'capacities' must be a list of positive numbers, not "
                             f"{caps!r:.80}")
        klc = d.get("kernel_level_cores")
        if klc is not None and (isinstance(klc, bool) or not isinstance(klc, (int, float))
                                or not math.isfinite(klc) or not 1 <= klc <= 4096):
            raise ValueError(f"'kernel_level_cores' is {klc!r}: a core count >= 1")
        out = cls(models, multicore, source=str(d.get("source", "predicted")),
                  capacities=caps, kernel_level_cores=None if klc is None else float(klc))
        out.reference_config  # noqa: B018 - raises ValueError without a single-core model
        return out

    @property
    def reference_config(self):
        singles = [c for c in self.models if c != KERNEL_LEVEL and c.count == 1]
        if not singles:
            raise ValueError("the model has no single-core configuration")
        return min(singles)
