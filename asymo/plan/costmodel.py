"""AsyMo's block-size cost model (paper 003, section 4.2, Table 2) as scikit-learn estimators.

A setting is one product ``(M, K) @ (K, N)`` computed by one cluster's ``threads`` cores with
block sizes ``(mc, nc, kc)``; the model predicts its latency in seconds. Settings are rows of
a 2-D array with the columns of `SETTING_COLUMNS`:

``M, K, N, mc, nc, kc, threads, kind``  (kind: 0 = "mm", the packed GEMM; 1 = "mv", the
no-packing skinny path, whose task is ``mc`` rows (or ``nc`` columns) over the whole K)

Table 2 as published, per setting::

    (1) FLOP_task = mc * nc * kc
        Data_task = DataTypeSize / CachelineSize * (mc*kc + kc*nc + 2*mc*nc)
    (2) Cost_seq  = K/kc * (t_comp * FLOP_task + t_data * Data_task)
    (3) Cost_par  = 1/Thread# * M/mc * N/nc * Cost_seq
    (4) Cost_other = p * Cost_seq + t_sched * M/mc * N/nc * K/kc + t_fram
    (5) Cost = Cost_par + Cost_other

Cost is linear in ``(t_comp, t_data, p*t_comp, p*t_data, t_sched, t_fram)``, so linear
regression on the five terms of `table2_features` (intercept = t_fram) trains it, as the paper
does; ``p`` is reported as the ratio of the fitted coefficients.

Constraints (section 4.2) give the candidates the model chooses among (`block_candidates`):

1. cache size: ``mr*kc + nr*kc + mr*nr <= L1`` (the micro-kernel's block in L1) and
   ``(mc*kc + nc*kc + mc*nc) * Thread# <= L2`` (the blocks of all threads sharing the L2);
2. least memory accesses: ``mc = nc = sqrt(M*N / (i * Thread#))``, i = 1, 2, ... When
   M << N (or N << M) and the block would exceed M, M is not partitioned (nor N, likewise).

`BlockCostModel` is the estimator (``fit`` / ``predict``, parameters and fitted coefficients
as plain JSON through ``to_dict`` / ``from_dict``; no pickle); it lives in `asymo.calibrate.costfit`
with the validation (scikit-learn is imported only there) and is re-exported here.
`CostPredictor` reads the same JSON and predicts, for the planner. ``features="table2"`` is the
paper's model; ``features="extended"`` adds what the paper's formula leaves out for asymo's
GEMM (whole blocks: ceil counts and register-tile padding; the critical path of the last wave
of tasks; A re-packed per column block, B packed once, C updated per K panel; separate terms
for the skinny path).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = [
    "SETTING_COLUMNS", "KIND_CODES", "TABLE2_FEATURES", "EXTENDED_FEATURES", "FEATURE_SETS",
    "REGRESSORS", "MODEL_FORMAT", "table2_features", "extended_features", "features",
    "CostPredictor",
    "kc_for_l1", "block_candidates", "fits_l2", "choose_blocks", "MIN_TASKS_PER_THREAD",
]

SETTING_COLUMNS = ("M", "K", "N", "mc", "nc", "kc", "threads", "kind")
KIND_CODES = {"mm": 0, "mv": 1}
MODEL_FORMAT = "asymo-costmodel"
MODEL_FORMAT_VERSION = 1

TABLE2_FEATURES = (
    "par_flop",   # 1/T * M/mc * N/nc * K/kc * FLOP_task      (coefficient t_comp)
    "par_data",   # 1/T * M/mc * N/nc * K/kc * Data_task      (t_data)
    "seq_flop",   # K/kc * FLOP_task                          (p * t_comp)
    "seq_data",   # K/kc * Data_task                          (p * t_data)
    "tasks",      # M/mc * N/nc * K/kc                        (t_sched)
)

EXTENDED_FEATURES = (
    "mm_flop",        # padded FLOPs of the whole product / T
    "mm_crit_flop",   # last-wave critical path: ceil(tasks/T) * padded FLOPs of one task
    "mm_crit_data",   # ... and its Data_task over the K loop
    "mm_pack_a",      # elements of A packed / T (A is re-packed for every column block)
    "mm_pack_b",      # elements of B packed / T (once per cluster)
    "mm_c_update",    # elements of C read-modify-written, once per K panel, / T
    "mm_tasks",       # pool tasks / T
    "mm_steps",       # task x K-panel steps / T
    "mv",             # indicator: the skinny path (its own fixed cost)
    "mv_stream",      # elements of the long operand streamed / T
    "mv_crit",        # ceil(tasks/T) * elements of one task
    "mv_tasks",       # pool tasks / T
)

FEATURE_SETS = {"table2": TABLE2_FEATURES, "extended": EXTENDED_FEATURES}

#: the least i of constraint (2) the planner considers (tasks per thread). Calibration times
#: undisturbed runs (the minimum of samples), so the unbalance interference causes -- Table
#: 2's p * Cost_seq -- is not in its data and the fitted models favour one task per thread;
#: with two, stealing can still even out a lagging core or an error in the split ratio.
#: (measured: docs/tuning.md)
MIN_TASKS_PER_THREAD = 2
REGRESSORS = ("linear", "positive")


# ---------------------------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------------------------
def as_settings(X):
    """``X`` as a float64 array of settings (columns `SETTING_COLUMNS`), validated."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[np.newaxis, :]
    if X.ndim != 2 or X.shape[1] not in (len(SETTING_COLUMNS) - 1, len(SETTING_COLUMNS)):
        raise ValueError(f"settings must be an array of shape (n, {len(SETTING_COLUMNS)}) with "
                         f"columns {SETTING_COLUMNS} (kind optional), got shape {X.shape}")
    if X.shape[1] == len(SETTING_COLUMNS) - 1:
        X = np.column_stack([X, np.zeros(len(X))])
    if not np.all(np.isfinite(X)):
        raise ValueError("settings contain NaN or infinite values")
    if X.size and np.any(X[:, :7] < 1):
        bad = np.argwhere(X[:, :7] < 1)[0]
        raise ValueError(f"setting {bad[0]}: {SETTING_COLUMNS[bad[1]]} = {X[bad[0], bad[1]]:g}; "
                         "dimensions, block sizes and threads must be >= 1")
    if X.size and not np.all(np.isin(X[:, 7], list(KIND_CODES.values()))):
        raise ValueError(f"settings: kind must be one of {KIND_CODES}")
    return X


def table2_features(X, *, itemsize=4, line_size=64):
    """The five terms of Table 2 whose coefficients are (t_comp, t_data, p*t_comp, p*t_data,
    t_sched); t_fram is the intercept.

    Block sizes larger than the matrix are clipped to it (a block cannot exceed the matrix:
    section 4.2's special case, the dimension is not partitioned).

    Parameters
    ----------
    X : array_like, shape (n, 8) or (n, 7)
        Settings, columns `SETTING_COLUMNS` (``kind`` is ignored: Table 2 has one formula).
    itemsize, line_size : int
        DataTypeSize and CachelineSize, bytes.

    Returns
    -------
    ndarray, shape (n, 5)
    """
    X = as_settings(X)
    M, K, N = X[:, 0], X[:, 1], X[:, 2]
    mc, nc, kc = np.minimum(X[:, 3], M), np.minimum(X[:, 4], N), np.minimum(X[:, 5], K)
    T = X[:, 6]
    flop_task = mc * nc * kc
    data_task = itemsize / line_size * (mc * kc + kc * nc + 2 * mc * nc)
    ksteps = K / kc
    units = (M / mc) * (N / nc)
    seq_flop = ksteps * flop_task
    seq_data = ksteps * data_task
    return np.column_stack([units / T * seq_flop, units / T * seq_data, seq_flop, seq_data,
                            units * ksteps])


def extended_features(X, *, itemsize=4, line_size=64, mr=1, nr=1):
    """Features of asymo's GEMM as it runs (see `EXTENDED_FEATURES`).

    Counts are whole blocks (ceil), blocks are padded to the register tile ``mr x nr`` (the
    micro-kernel computes full tiles), and the unbalance term is the critical path of the
    last wave of tasks, ``ceil(tasks / T)`` sequential units. MM and MV ("mv" kind) settings
    use disjoint columns: they run different code.
    """
    X = as_settings(X)
    M, K, N = X[:, 0], X[:, 1], X[:, 2]
    mc, nc, kc = np.minimum(X[:, 3], M), np.minimum(X[:, 4], N), np.minimum(X[:, 5], K)
    T = X[:, 6]
    mv = X[:, 7] == KIND_CODES["mv"]
    mm = ~mv
    ntm, ntn, npc = np.ceil(M / mc), np.ceil(N / nc), np.ceil(K / kc)
    tasks = ntm * ntn
    waves = np.ceil(tasks / T)
    mc_pad = np.ceil(mc / mr) * mr
    nc_pad = np.ceil(nc / nr) * nr
    m_pad = np.ceil(M / mr) * mr
    n_pad = np.ceil(N / nr) * nr
    per_line = line_size / itemsize
    f = {
        "mm_flop": m_pad * n_pad * K / T,
        "mm_crit_flop": waves * mc_pad * nc_pad * K,
        "mm_crit_data": waves * npc * (mc * kc + kc * nc + 2 * mc * nc) / per_line,
        "mm_pack_a": ntn * M * K / T,
        "mm_pack_b": N * K / T,
        "mm_c_update": M * N * npc / T,
        "mm_tasks": tasks / T,
        "mm_steps": tasks * npc / T,
    }
    # the skinny path: the task is mc rows (or nc columns) of the long operand over all of K
    long_dim = np.where(M >= N, M, N)
    short = np.where(M >= N, N, M)
    chunk = np.where(M >= N, mc, nc)
    mv_tasks = np.ceil(long_dim / chunk)
    g = {
        "mv": np.ones_like(M),
        "mv_stream": long_dim * K * short / T,
        "mv_crit": np.ceil(mv_tasks / T) * chunk * K,
        "mv_tasks": mv_tasks / T,
    }
    cols = [np.where(mm, f[name], 0.0) if name.startswith("mm_") else np.where(mv, g[name], 0.0)
            for name in EXTENDED_FEATURES]
    return np.column_stack(cols)


# ---------------------------------------------------------------------------------------------
# A fitted model, for planning
# ---------------------------------------------------------------------------------------------
def positive_int(name, v):
    """``v`` as an int, or a ValueError naming ``name`` unless it is a positive integer."""
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name}={v!r}; expected a positive integer")
    return int(v)


def features(X, kind="table2", *, itemsize=4, line_size=64, mr=1, nr=1):
    """The feature matrix of settings ``X`` for the feature set ``kind``."""
    if kind == "table2":
        return table2_features(X, itemsize=itemsize, line_size=line_size)
    if kind == "extended":
        return extended_features(X, itemsize=itemsize, line_size=line_size, mr=mr, nr=nr)
    raise ValueError(f"features={kind!r}; expected one of {list(FEATURE_SETS)}")


def model_params(d, known):
    """The ``params`` of a serialised cost model after checking its format and version;
    ValueError when they do not match or a parameter is not one of `known`."""
    if d.get("format") != MODEL_FORMAT or d.get("version") != MODEL_FORMAT_VERSION:
        raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
    params = dict(d["params"])
    unknown = set(params) - set(known)
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)}")
    return params


class CostPredictor:
    """A fitted cost model as plain data: predicts latencies, nothing else.

    The planner's view of a `BlockCostModel` (same JSON form, `from_dict` / `to_dict`),
    without importing scikit-learn on the path of ``asymo.matmul``.
    """

    def __init__(self, *, features="table2", coef, intercept, itemsize=4, line_size=64, mr=1,
                 nr=1, params=None):
        if features not in FEATURE_SETS:
            raise ValueError(f"features={features!r}; expected one of {list(FEATURE_SETS)}")
        self.features = features
        self.itemsize = positive_int("itemsize", itemsize)
        self.line_size = positive_int("line_size", line_size)
        self.mr, self.nr = positive_int("mr", mr), positive_int("nr", nr)
        self.coef = np.asarray(coef, dtype=np.float64)
        self.intercept = float(intercept)
        names = FEATURE_SETS[features]
        if self.coef.shape != (len(names),):
            raise ValueError(f"{self.coef.size} coefficients for features {names}")
        if not (np.all(np.isfinite(self.coef)) and math.isfinite(self.intercept)):
            raise ValueError("non-finite coefficients")
        self.params = dict(params or {})

    def predict(self, X):
        """Predicted latency (seconds) of each setting (rows of `SETTING_COLUMNS`)."""
        return features(X, self.features, itemsize=self.itemsize, line_size=self.line_size,
                        mr=self.mr, nr=self.nr) @ self.coef + self.intercept

    def to_dict(self):
        params = {"features": self.features, "itemsize": self.itemsize,
                  "line_size": self.line_size, "mr": self.mr, "nr": self.nr, **self.params}
        return {"format": MODEL_FORMAT, "version": MODEL_FORMAT_VERSION, "params": params,
                "coef": [float(c) for c in self.coef], "intercept": self.intercept,
                "feature_names": list(FEATURE_SETS[self.features])}

    @classmethod
    def from_dict(cls, d):
        """From `BlockCostModel.to_dict` output; ValueError if it is not a fitted model."""
        try:
            params = model_params(d, _PARAMS)
            if params.get("regressor", "linear") not in REGRESSORS:
                raise ValueError(f"regressor={params.get('regressor')!r}")
            if not isinstance(params.get("relative", False), bool):
                raise ValueError(f"relative={params.get('relative')!r}")
            if "coef" not in d:
                raise ValueError("the model is not fitted")
            feats = params.get("features", "table2")
            if feats not in FEATURE_SETS or list(d["feature_names"]) != list(FEATURE_SETS[feats]):
                raise ValueError(f"feature names {d.get('feature_names')!r}")
            rest = {k: v for k, v in params.items() if k in ("regressor", "relative")}
            return cls(features=feats, coef=d["coef"], intercept=d["intercept"],
                       itemsize=params.get("itemsize", 4), line_size=params.get("line_size", 64),
                       mr=params.get("mr", 1), nr=params.get("nr", 1), params=rest)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a BlockCostModel dict: {exc}") from None


_PARAMS = ("features", "regressor", "relative", "itemsize", "line_size", "mr", "nr")


# ---------------------------------------------------------------------------------------------
# Constraints and candidates (section 4.2)
# ---------------------------------------------------------------------------------------------
def _round_up(x, m):
    return -(-int(x) // int(m)) * int(m)


def _round_near(x, m):
    """Nearest positive multiple of m."""
    return max(int(m), int(round(x / m)) * int(m))


def kc_for_l1(K, l1_bytes, mr, nr, itemsize=4):
    """kc from constraint (1), ``mr*kc + nr*kc + mr*nr <= L1``, cutting K into equal panels.

    The largest kc (a multiple of 8, at least 8) allowed by the L1 size; when K is larger,
    ``ceil(K / kc_max)`` panels of equal depth (so no thin last panel).
    """
    K = int(K)
    kc_max = (int(l1_bytes) // itemsize - mr * nr) // (mr + nr)
    kc_max = max(8, kc_max - kc_max % 8)
    if K <= kc_max:
        return max(K, 1)
    panels = -(-K // kc_max)
    kc = -(-K // panels)
    up = _round_up(kc, 8)
    return up if up <= kc_max else kc


def fits_l2(mc, nc, kc, sharing, l2_bytes, itemsize=4):
    """Constraint (1): ``(mc*kc + nc*kc + mc*nc) * Thread# <= L2`` (Thread#: threads sharing
    one L2 instance)."""
    return (mc * kc + nc * kc + mc * nc) * sharing * itemsize <= l2_bytes


def block_candidates(M, K, N, *, threads, l1_bytes, l2_bytes, l2_sharing=None, mr=1, nr=1,
                     itemsize=4, kind="mm", unit=16, min_i=1, max_i=None):
    """Candidate block sizes ``(mc, nc, kc)`` for one cluster (section 4.2 constraints).

    Parameters
    ----------
    M, K, N : int
        The part of the product the cluster computes.
    threads : int
        Thread# of the cluster.
    l1_bytes, l2_bytes : int
        L1d size per core and L2 size of one instance.
    l2_sharing : int, optional
        Threads sharing one L2 instance (default ``threads``: the paper's "L2 is public to all
        cores within a processor").
    mr, nr : int
        Register tile (kind "mm"); blocks are rounded to multiples of it.
    kind : {"mm", "mv"}
        "mm": constraint (2) gives ``mc = nc = sqrt(M N / (i T))`` for i = 1..max_i (M, or
        N, not partitioned when the block would exceed it) and constraint (1) kc and the L2
        bound. "mv" (skinny path, no K blocking): the long dimension is cut into
        ``L / (i T)`` chunks (multiples of ``unit``), the short one is not partitioned and
        kc = K. The L2 bound is not applied to MV chunks: the skinny path reads each element
        of the long operand once (no reuse to keep in cache), and bounding its chunk by the
        L2 only forces tiny tasks for long rows.

    Returns
    -------
    list of (mc, nc, kc)
        Distinct candidates, fewest tasks first; never empty (if no candidate fits the L2,
        the one with the smallest footprint is returned).

    ``min_i`` and ``max_i`` bound i (default from 1 to: 64 for "mm"; for "mv" until the
    chunk reaches ``unit``). ``min_i=2`` keeps at least two tasks per thread, so work can be
    stolen (the planner asks for it when a product is split between clusters).
    """
    M, K, N, T = int(M), int(K), int(N), int(threads)
    if min(M, K, N, T) < 1:
        raise ValueError(f"block_candidates: M, K, N, threads must be >= 1, got "
                         f"({M}, {K}, {N}), threads={T}")
    if kind not in KIND_CODES:
        raise ValueError(f"kind={kind!r}; expected one of {list(KIND_CODES)}")
    sharing = T if l2_sharing is None else max(1, int(l2_sharing))
    min_i = max(1, int(min_i))
    out, rejected = [], []

    def add(mc, nc, kc):
        cand = (int(min(mc, M)), int(min(nc, N)), int(min(kc, K)))
        if cand in out or cand in rejected:
            return
        ok = kind == "mv" or fits_l2(*cand, sharing, l2_bytes, itemsize)
        (out if ok else rejected).append(cand)

    if kind == "mv":
        long_is_m = M >= N
        L = M if long_is_m else N
        for i in range(min_i, max(min_i, max_i or -(-L // (T * unit))) + 1):
            chunk = min(L, _round_up(-(-L // (i * T)), unit))
            add(*((chunk, N, K) if long_is_m else (M, chunk, K)))
            if chunk <= unit:
                break
    else:
        kc = kc_for_l1(K, l1_bytes, mr, nr, itemsize)
        for i in range(min_i, max(min_i, max_i or 64) + 1):
            units = i * T
            side = math.sqrt(M * N / units)
            if side >= M:      # M << N: do not partition M, cut N into `units` blocks
                mc, nc = M, min(N, _round_up(-(-N // units), nr))
            elif side >= N:    # N << M: do not partition N
                mc, nc = min(M, _round_up(-(-M // units), mr)), N
            else:
                mc, nc = min(M, _round_near(side, mr)), min(N, _round_near(side, nr))
            add(mc, nc, kc)
            if mc <= mr and nc <= nr:
                break
    if not out:
        out = [min(rejected, key=lambda c: c[0] * c[2] + c[1] * c[2] + c[0] * c[1])]
    return sorted(out, key=lambda c: (-(c[0] * c[1]), c))


def choose_blocks(model, M, K, N, *, threads, kind="mm", candidates=None, **cache):
    """The candidate with the least predicted latency: ``((mc, nc, kc), seconds)``.

    ``candidates`` defaults to `block_candidates` with ``cache`` (``l1_bytes``, ``l2_bytes``,
    ``l2_sharing``, ``mr``, ``nr``, ``itemsize``, ``unit``).
    """
    if candidates is None:
        candidates = block_candidates(M, K, N, threads=threads, kind=kind, **cache)
    if not candidates:
        raise ValueError("choose_blocks: no candidates")
    X = np.array([[M, K, N, mc, nc, kc, threads, KIND_CODES[kind]]
                  for mc, nc, kc in candidates], dtype=np.float64)
    pred = model.predict(X)
    best = int(np.argmin(pred))
    return tuple(candidates[best]), float(pred[best])
