"""Fitting AsyMo's cost model (paper 003, section 5): the scikit-learn estimator
`BlockCostModel`, K-fold cross-validation and the block-choice regret on held-out sizes.

The features, constraints and candidates are in `asymo.plan.costmodel`; this module is the part
that needs scikit-learn (imported here only, so planning does not pay for it).
"""
from __future__ import annotations

import math

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score
from sklearn.model_selection import KFold

from asymo.plan.costmodel import (FEATURE_SETS, MODEL_FORMAT, MODEL_FORMAT_VERSION, REGRESSORS,
                             SETTING_COLUMNS, CostPredictor, as_settings, positive_int, features,
                             model_params)

__all__ = ["BlockCostModel", "cross_validate", "choice_regret"]


class BlockCostModel(RegressorMixin, BaseEstimator):
    """Latency of a block setting on one cluster (AsyMo Table 2), a scikit-learn regressor.

    Parameters
    ----------
    features : {"table2", "extended"}
        ``"table2"``: the paper's model; ``"extended"``: `extended_features`.
    regressor : {"linear", "positive"}
        ``"linear"``: ordinary least squares (`sklearn.linear_model.LinearRegression`, the
        paper's choice); ``"positive"``: least squares with non-negative costs (a cost
        cannot be negative; this keeps predictions sane outside the training range).
    relative : bool
        Weight samples by ``1 / y**2``: minimise relative rather than absolute squared error,
        so small products count as much as large ones when choosing their block sizes.
    itemsize, line_size : int
        Bytes per element and per cache line.
    mr, nr : int
        Register tile of the micro-kernel (``"extended"`` pads blocks to it).

    Attributes
    ----------
    coef_ : ndarray
        One cost per feature (seconds per unit of the feature).
    intercept_ : float
        Fixed cost (t_fram), seconds.
    feature_names_ : tuple of str

    Examples
    --------
    >>> X = [[256, 2304, 3136, 96, 96, 168, 2, 0], [256, 2304, 3136, 192, 192, 168, 2, 0]]
    >>> model = BlockCostModel().fit(X * 4, [0.010, 0.011] * 4)      # doctest: +SKIP
    >>> model.predict(X)                                             # doctest: +SKIP
    """

    def __init__(self, features="table2", regressor="linear", relative=False, itemsize=4,
                 line_size=64, mr=1, nr=1):
        self.features = features
        self.regressor = regressor
        self.relative = relative
        self.itemsize = itemsize
        self.line_size = line_size
        self.mr = mr
        self.nr = nr

    # -- features -------------------------------------------------------------------------
    def _check_params(self):
        if self.features not in FEATURE_SETS:
            raise ValueError(f"features={self.features!r}; expected one of {list(FEATURE_SETS)}")
        if self.regressor not in REGRESSORS:
            raise ValueError(f"regressor={self.regressor!r}; expected one of {list(REGRESSORS)}")
        for name in ("itemsize", "line_size", "mr", "nr"):
            positive_int(name, getattr(self, name))

    def transform(self, X):
        """The feature matrix of settings ``X`` (columns ``feature_names_``)."""
        self._check_params()
        return features(X, self.features, itemsize=self.itemsize, line_size=self.line_size,
                        mr=self.mr, nr=self.nr)

    def _make_regressor(self):
        return LinearRegression(positive=self.regressor == "positive")

    # -- fit / predict --------------------------------------------------------------------
    def fit(self, X, y, sample_weight=None):
        """Fit the costs to measured latencies ``y`` (seconds) of settings ``X``."""
        F = self.transform(X)
        y = np.asarray(y, dtype=np.float64).ravel()
        if len(y) != len(F):
            raise ValueError(f"{len(F)} settings but {len(y)} latencies")
        if len(y) < 2:
            raise ValueError(f"need at least 2 settings to fit, got {len(y)}")
        if not np.all(np.isfinite(y)) or np.any(y <= 0):
            raise ValueError("latencies must be finite and > 0 seconds")
        w = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, float).ravel()
        if self.relative:
            w = w / y ** 2
        # scale the columns (they span 1 .. 1e10) and the target so the solvers are well
        # conditioned
        scale = np.abs(F).max(axis=0)
        scale[scale == 0] = 1.0
        yscale = float(np.abs(y).max())
        reg = self._make_regressor()
        reg.fit(F / scale, y / yscale, sample_weight=w / w.mean())
        self.coef_ = np.asarray(reg.coef_, dtype=np.float64) / scale * yscale
        self.intercept_ = float(reg.intercept_) * yscale
        self.feature_names_ = FEATURE_SETS[self.features]
        self.n_features_in_ = len(SETTING_COLUMNS)
        return self

    def predict(self, X):
        """Predicted latency (seconds) of each setting."""
        if not hasattr(self, "coef_"):
            raise ValueError("this BlockCostModel is not fitted yet; call fit() or from_dict()")
        return self.transform(X) @ self.coef_ + self.intercept_

    # -- interpretation -------------------------------------------------------------------
    def table2_parameters(self):
        """The paper's named parameters from a ``"table2"`` fit: t_comp, t_data, p, t_sched,
        t_fram (p from the ratio of the fitted coefficients; NaN when undefined)."""
        if self.features != "table2" or not hasattr(self, "coef_"):
            raise ValueError("table2_parameters needs a fitted features='table2' model")
        tc, td, ptc, ptd, ts = (float(c) for c in self.coef_)
        ratios = [a / b for a, b in ((ptc, tc), (ptd, td)) if b > 0 and a >= 0]
        return {"t_comp": tc, "t_data": td, "p": float(np.mean(ratios)) if ratios else math.nan,
                "t_sched": ts, "t_fram": self.intercept_}

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self):
        """Parameters and fitted costs as plain JSON data (`from_dict` inverts it)."""
        d = {"format": MODEL_FORMAT, "version": MODEL_FORMAT_VERSION,
             "params": self.get_params()}
        if hasattr(self, "coef_"):
            d["coef"] = [float(c) for c in self.coef_]
            d["intercept"] = float(self.intercept_)
            d["feature_names"] = list(self.feature_names_)
        return d

    @classmethod
    def from_dict(cls, d):
        """Rebuild a model from `to_dict` output; ValueError if it is not one."""
        try:
            params = model_params(d, cls().get_params())
            model = cls(**params)
            model._check_params()
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a BlockCostModel dict: {exc}") from None
        if "coef" in d:
            fitted = CostPredictor.from_dict(d)   # validates coefficients and names
            model.coef_, model.intercept_ = fitted.coef, fitted.intercept
            model.feature_names_ = FEATURE_SETS[model.features]
            model.n_features_in_ = len(SETTING_COLUMNS)
        return model

    def predictor(self):
        """The fitted model as a `CostPredictor` (plain data, no scikit-learn)."""
        return CostPredictor.from_dict(self.to_dict())


def cross_validate(model, X, y, *, n_splits=10, seed=0):
    """K-fold cross-validation (the paper: K = 10) of ``model`` on settings ``X``, ``y``.

    Returns a dict: ``r2`` (R^2 of the held-out predictions of all folds together: every
    setting predicted by the model that did not see it), ``r2_fold_mean`` and ``r2_folds``
    (R^2 within each held-out fold, which is fragile when a fold happens to hold similar
    latencies), ``mdape`` and ``mape`` (median and mean absolute relative error of held-out
    predictions), ``n``.
    """
    from sklearn.base import clone
    X = as_settings(X)
    y = np.asarray(y, dtype=np.float64).ravel()
    if len(y) < 4:
        raise ValueError(f"cross-validation needs at least 4 settings, got {len(y)}")
    n_splits = min(n_splits, len(y) // 2)  # at least 2 settings per held-out fold (R^2)
    pred = np.empty_like(y)
    folds = []
    for train, test in KFold(n_splits, shuffle=True, random_state=seed).split(X):
        m = clone(model).fit(X[train], y[train])
        pred[test] = m.predict(X[test])
        folds.append(r2_score(y[test], pred[test]) if len(test) > 1 else math.nan)
    rel = np.abs(pred - y) / y
    folds = [f for f in folds if math.isfinite(f)]
    return {"r2": float(r2_score(y, pred)), "r2_fold_mean": float(np.mean(folds)),
            "r2_folds": [float(f) for f in folds], "mdape": float(np.median(rel)),
            "mape": float(np.mean(rel)), "n": int(len(y))}


def choice_regret(model, X, y, groups, *, n_splits=10):
    """How much slower the model's choice is than the best measured setting, on held-out sizes.

    The settings are grouped by size (``groups``: one label per row); whole sizes are held
    out (GroupKFold), the model is fitted on the others and picks the setting it predicts
    fastest among the held-out size's measured settings. The regret of a size is
    ``y[chosen] / min(y) - 1``. This is what block choice needs from the model (ranking the
    settings of one size), measured without looking at any shape used for reporting.

    Returns a dict: ``mean``, ``median``, ``max`` and ``per_size`` (label -> regret).
    """
    from sklearn.base import clone
    from sklearn.model_selection import GroupKFold
    X = as_settings(X)
    y = np.asarray(y, dtype=np.float64).ravel()
    groups = np.asarray(groups)
    labels = np.unique(groups)
    n_splits = min(n_splits, len(labels))
    if n_splits < 2:
        raise ValueError(f"choice_regret needs at least 2 sizes, got {len(labels)}")
    per = {}
    for train, test in GroupKFold(n_splits).split(X, y, groups):
        m = clone(model).fit(X[train], y[train])
        pred = m.predict(X[test])
        for g in np.unique(groups[test]):
            idx = np.flatnonzero(groups[test] == g)
            chosen = idx[int(np.argmin(pred[idx]))]
            per[str(g)] = float(y[test][chosen] / y[test][idx].min() - 1.0)
    vals = list(per.values())
    return {"mean": float(np.mean(vals)), "median": float(np.median(vals)),
            "max": float(np.max(vals)), "per_size": per}


