"""GEMM calibration: measure the data set per cluster, fit the cost model, derive split
ratios, check the model on held-out shapes, and store it all in the profile (section "gemm").

AsyMo, paper 003, section 5: every setting of `asymo.calibrate.gemm_set` (size x block sizes) is
timed on each cluster alone, on a pool restricted to that cluster's cores (the other
clusters idle). Per cluster the cost model of `asymo.plan.costmodel` is trained by linear
regression with 10-fold cross-validation (the paper's Table 2 model), an extended feature set
is tried beside it, and the one that predicts held-out folds better is kept. The capability
of each cluster per op kind (MM, MV) gives the processor-level split ratios. On shapes
outside the training set, every candidate is timed (exhaustive search over the candidates)
and the latency of the model's choice is compared with the best one.

Measurements are persisted after every size to ``<profile>.gemm-partial.json``, so an
interrupted run resumes where it stopped (same CPU, same set, same kernel family).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import sys
import tempfile
import textwrap
import time

import numpy as np

from asymo.calibrate import gemm_set as cset
from asymo.calibrate import costfit
from asymo.plan import costmodel as cm
from asymo.hw.cpuload import LoadMonitor, cluster_loads
from asymo.plan.calibration import BASELINE, SCHEMA, SECTION

__all__ = ["GemmTimer", "calibrate_gemm", "fit_cluster", "format_report", "partial_path",
           "MODEL_CHOICES"]

_PARTIAL_FORMAT = "asymo-gemm-partial"

#: the models compared on held-out folds: name -> BlockCostModel parameters. "table2" is the
#: paper's (linear regression on Table 2's terms); the others extend it.
MODEL_CHOICES = {
    "table2": {"features": "table2", "regressor": "linear"},
    "table2-relative": {"features": "table2", "regressor": "linear", "relative": True},
    "extended": {"features": "extended", "regressor": "linear"},
    "extended-positive": {"features": "extended", "regressor": "positive"},
    "extended-positive-relative": {"features": "extended", "regressor": "positive",
                                   "relative": True},
}
#: held-out R^2 a model must reach to be preferred (the paper reports 0.97 and 0.98)
R2_TARGET = 0.95
#: a measurement round during which the cluster's load rose more than this above its usual
#: level does not count as quiet (the adaptive rounds continue, within the budget)
DISTURBED_LOAD = 0.15


def partial_path(profile_path):
    """Where an interrupted calibration keeps its measurements."""
    return os.fspath(profile_path) + ".gemm-partial.json"


# ---------------------------------------------------------------------------------------------
# Timing on one cluster
# ---------------------------------------------------------------------------------------------
def gemm_args_2d(a, b, c):
    """The C argument struct for one 2-D product ``c = a @ b`` (same dtype, any strides)."""
    from asymo.plan import gemm as gemm_plan
    from asymo.runtime.ffi import ffi
    es = a.itemsize
    g = ffi.new("asymo_gemm_args *")
    g.dtype = gemm_plan.DTYPES[a.dtype.name]
    g.m, g.k = a.shape
    g.n = b.shape[1]
    g.a = ffi.cast("void *", a.ctypes.data)
    g.rsa, g.csa = a.strides[0] // es, a.strides[1] // es
    g.b = ffi.cast("void *", b.ctypes.data)
    g.rsb, g.csb = b.strides[0] // es, b.strides[1] // es
    g.c = ffi.cast("void *", c.ctypes.data)
    g.rsc, g.csc = c.strides[0] // es, c.strides[1] // es
    g.nbatch = 1
    return g


class GemmTimer:
    """Times block settings with asymo's GEMM on a pool restricted to one cluster.

    Use as a context manager (pools are closed on exit). ``measure`` returns, per setting,
    the minimum (``statistic="min"``, default) or the median over ``repeats`` samples; the
    settings of one size are interleaved sample by sample, so a burst of outside load hits
    all of them alike. A sample repeats the call until it lasts ``min_sample_s`` (small
    products take microseconds).

    The minimum is the default because on a shared machine the median measures the other
    processes as much as the block sizes: the fastest of several interleaved samples is the
    latency with the least interference, and the most reproducible.
    """

    def __init__(self, topology, *, dtype="float32", isa=None, seed=0, statistic="min"):
        if statistic not in ("min", "median"):
            raise ValueError(f"statistic={statistic!r}; expected 'min' or 'median'")
        self.statistic = statistic
        from asymo.plan import gemm as gemm_plan
        self.topology = topology
        self.dtype = np.dtype(dtype)
        self.isa = isa or gemm_plan.best_isa()
        self.tile = gemm_plan.kernel_tile(self.isa, self.dtype.name)
        self._rng = np.random.default_rng(seed)
        self._pools = {}
        self._monitor = LoadMonitor(min_interval=0.0)
        self._floor = {}
        self.rounds = self.clean_rounds = 0

    def _disturbed(self, cluster):
        """Was the cluster more contended than usual since the last call?

        The load (`asymo.hw.cpuload.LoadMonitor`: the share of time our runnable threads waited
        for their cpus) is compared with the least seen on this cluster so far: a steady
        share (e.g. the emulator's occupier) is part of the cluster's speed, a burst above it
        is another process getting in the way.
        """
        loads = self._monitor.loads()
        if not loads:
            return False
        vals = [loads[c] for c in cluster.cpus if loads.get(c) is not None]
        if not vals:
            return False
        level = max(vals)
        floor = min(self._floor.get(cluster.name, level), level)
        self._floor[cluster.name] = floor
        return level > floor + DISTURBED_LOAD

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool(self, cluster):
        if cluster.name not in self._pools:
            from asymo.runtime.pool import Pool
            from asymo.hw.topology import Topology
            only = Topology(clusters=(dataclasses.replace(cluster, capacity=1.0),),
                            source=self.topology.source,
                            emulated={c: s for c, s in self.topology.emulated.items()
                                      if c in cluster.cpus},
                            capacity_basis=self.topology.capacity_basis)
            self._pools[cluster.name] = Pool(only)
        return self._pools[cluster.name]

    def plan(self, pool, size, blocks):
        """The GEMM plan running ``size`` with ``blocks`` on ``pool`` (one cluster)."""
        from asymo.plan import gemm as gemm_plan
        plan = gemm_plan.plan_gemm(size.M, size.K, size.N, self.dtype.name, pool,
                                   blocks=tuple(blocks), kind=size.kind, isa=self.isa)
        if size.kind == "mv":
            chunk = blocks[0] if plan.split_dim == "M" else blocks[1]
            plan = dataclasses.replace(plan, chunks=(int(chunk),))
        return plan

    def measure(self, cluster, size, blocks_list, *, repeats, min_sample_s, max_repeats=None,
                budget_s=None, rtol=0.01):
        """Latency (seconds) of each block setting of ``size`` on ``cluster``.

        With ``statistic="min"`` the rounds continue past ``repeats`` while any setting's
        minimum still improves by more than ``rtol`` -- two undisturbed rounds without
        improvement end it, a round during which other processes kept the cluster busier than
        usual (`_disturbed`) does not count -- up to ``max_repeats`` rounds or
        ``budget_s`` seconds: on a busy machine clean samples are rare, on a quiet one
        ``repeats`` rounds suffice.
        """
        from asymo.runtime.ffi import lib
        pool = self._pool(cluster)
        a = self._rng.standard_normal((size.M, size.K)).astype(self.dtype)
        b = self._rng.standard_normal((size.K, size.N)).astype(self.dtype)
        c = np.empty((size.M, size.N), self.dtype)
        g = gemm_args_2d(a, b, c)
        plans = [self.plan(pool, size, blk).cdata() for blk in blocks_list]
        handle = pool._handle

        def run(p, n):
            pool._acquire()  # the handle stays valid while held (asymo.runtime.pool.acquire)
            try:
                t0 = time.perf_counter()
                for _ in range(n):
                    rc = lib.asymo_gemm(handle, g, p)
                    if rc != lib.ASYMO_OK:
                        raise RuntimeError(f"asymo_gemm failed ({rc}) on {size}")
                return (time.perf_counter() - t0) / n
            finally:
                pool._release()

        t_start = time.perf_counter()
        inner = []
        for p in plans:
            run(p, 1)  # warm up: page faults, packed-buffer cache
            t = run(p, 1)
            inner.append(int(min(2000, max(1, math.ceil(min_sample_s / max(t, 1e-8))))))
        samples = [[] for _ in plans]
        best = [math.inf] * len(plans)
        adaptive = self.statistic == "min"
        max_repeats = max(repeats, max_repeats or repeats) if adaptive else repeats
        quiet = clean = 0
        self._monitor.loads()
        for r in range(max_repeats):
            improved = False
            for i, p in enumerate(plans):
                t = run(p, inner[i])
                samples[i].append(t)
                if t < best[i] * (1 - rtol):
                    improved = True
                best[i] = min(best[i], t)
            disturbed = self._disturbed(cluster)
            self.rounds += 1
            if not disturbed:
                clean += 1
                quiet = 0 if improved else quiet + 1
            self.clean_rounds += not disturbed
            if r + 1 < repeats:
                continue
            if budget_s is not None and time.perf_counter() - t_start > budget_s:
                break
            # a minimum is trusted once it held through two undisturbed rounds
            if quiet >= 2 and clean >= min(repeats, 2):
                break
        if size.kind == "mm":  # the result is checked once, so a wrong plan cannot calibrate
            ref = a.astype(np.float64) @ b.astype(np.float64)
            if not np.allclose(c, ref, rtol=1e-3, atol=1e-3 * math.sqrt(size.K)):
                raise RuntimeError(f"GEMM result wrong for {size} with {blocks_list[-1]}")
        reduce = np.min if self.statistic == "min" else np.median
        return [float(reduce(s)) for s in samples]


# ---------------------------------------------------------------------------------------------
# Persisted measurements
# ---------------------------------------------------------------------------------------------
def _blocks_key(blocks):
    return "x".join(str(int(v)) for v in blocks)


def _write_json(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gemm-partial-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _valid_clusters(clusters):
    """Whether a partial file's ``clusters`` has the shape `_State` writes: per cluster, per
    phase, per size, per blocks a number of seconds (and a ``load`` list); anything else
    (a hand-edited or damaged file) is not resumed from."""
    if not isinstance(clusters, dict):
        return False
    for cl in clusters.values():
        if not isinstance(cl, dict) or not isinstance(cl.get("load", []), list):
            return False
        for phase in ("train", "held_out", "confirm"):
            sizes = cl.get(phase, {})
            if not isinstance(sizes, dict) or not all(
                    isinstance(per, dict) and all(isinstance(v, (int, float)) and
                                                  not isinstance(v, bool) for v in per.values())
                    for per in sizes.values()):
                return False
    return True


class _State:
    """The measurements so far, keyed by cluster, phase, size and blocks."""

    def __init__(self, path, ident):
        self.path = path
        self.ident = ident
        self.data = {"format": _PARTIAL_FORMAT, "ident": ident, "clusters": {}}
        self.resumed = 0

    def load(self):
        from asymo.profile.files import read_json_file
        try:
            data = read_json_file(self.path)  # a regular file only, bounded
        except (OSError, ValueError):
            return False
        if (not isinstance(data, dict) or data.get("format") != _PARTIAL_FORMAT
                or data.get("ident") != self.ident or not _valid_clusters(data.get("clusters"))):
            return False
        self.data = data
        self.resumed = sum(len(v) for cl in data["clusters"].values()
                           for ph in ("train", "held_out", "confirm")
                           for v in cl.get(ph, {}).values())
        return True

    def cluster(self, name):
        return self.data["clusters"].setdefault(name, {"train": {}, "held_out": {}, "confirm": {},
                                                       "load": []})

    def get(self, name, phase, size, blocks):
        v = self.cluster(name)[phase].get(size.key, {}).get(_blocks_key(blocks))
        return float(v) if isinstance(v, (int, float)) and v > 0 else None

    def put(self, name, phase, size, blocks_list, seconds):
        d = self.cluster(name)[phase].setdefault(size.key, {})
        for blk, s in zip(blocks_list, seconds):
            d[_blocks_key(blk)] = float(s)

    def save(self):
        _write_json(self.path, self.data)

    def remove(self):
        with contextlib.suppress(OSError):
            os.unlink(self.path)


# ---------------------------------------------------------------------------------------------
# Fitting and evaluation
# ---------------------------------------------------------------------------------------------
def _rows(size, blocks_list, threads):
    return [[size.M, size.K, size.N, b[0], b[1], b[2], threads, cm.KIND_CODES[size.kind]]
            for b in blocks_list]


def fit_cluster(X, y, groups, *, itemsize, line_size, mr, nr, seed=0, choices=None):
    """Fit every model of ``choices`` (default `MODEL_CHOICES`) and score it on held-out data.

    Each model gets the paper's 10-fold cross-validation (R^2 and relative error of
    held-out settings) and the block-choice regret on held-out sizes
    (`asymo.calibrate.costfit.choice_regret`, sizes grouped in 10 folds). The model kept is, among
    those whose held-out R^2 reaches `R2_TARGET` (all of them if none does), the one with the
    least median regret (then mean regret): choosing blocks is what the model is for, and the
    median is robust to the few sizes whose timings a busy machine spoiled. Ties go to the
    paper's model.

    Returns ``(chosen_name, {name: {"model": dict, "cv": dict, "regret": dict}})``.
    """
    choices = choices or MODEL_CHOICES
    results = {}
    for name, params in choices.items():
        model = costfit.BlockCostModel(itemsize=itemsize, line_size=line_size, mr=mr, nr=nr,
                                  **params)
        cv = costfit.cross_validate(model, X, y, n_splits=10, seed=seed)
        regret = costfit.choice_regret(model, X, y, groups, n_splits=10)
        model.fit(X, y)
        results[name] = {"model": model.to_dict(), "cv": cv, "regret": regret}
    good = [n for n in results if results[n]["cv"]["r2"] >= R2_TARGET] or list(results)
    best = min(good, key=lambda n: (round(results[n]["regret"]["median"], 3),
                                    round(results[n]["regret"]["mean"], 3), n != BASELINE))
    return best, results


def _gmean(xs):
    xs = [x for x in xs if x > 0]
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else 0.0


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def calibrate_gemm(topology=None, *, set_name=None, path=None, resume=True, progress=True,
                   timer=None, dtype="float32", isa=None, seed=0, save=True, stream=None,
                   profile=None):
    """Calibrate the GEMM cost model and split ratios on every cluster; return the section.

    Parameters
    ----------
    topology : Topology, optional
        Default `asymo.hw.topology.detect()`.
    set_name : {"full", "quick", "tiny"}, optional
        The data set (`asymo.calibrate.gemm_set.get_set`).
    path : str, optional
        Profile file (default: ``ASYMO_PROFILE`` or the XDG cache path for this CPU).
    resume : bool
        Continue an interrupted run of the same set on the same CPU.
    progress : bool
        Show a tqdm progress bar (on ``stream``, default stderr).
    timer : object, optional
        ``measure(cluster, size, blocks_list, repeats=, min_sample_s=, max_repeats=,
        budget_s=) -> [seconds]`` with attributes ``tile`` (mr, nr) and ``isa``; default a
        `GemmTimer` (real measurements). Tests pass synthetic ones.
    save : bool
        Write the profile (merging with its other sections).
    profile : Profile, optional
        Profile to store into (default: the one at ``path`` if usable, else a new one).

    Returns
    -------
    dict
        The "gemm" section (see `format_report` for what it reports).

    Notes
    -----
    Phases, per cluster: the training settings; every candidate of the held-out shapes; then,
    once the models are fitted, the chosen and the best candidates of each held-out shape are
    timed again side by side (so a lucky sample cannot make the best look better than it is).
    Every measurement is saved to `partial_path` as it completes; KeyboardInterrupt leaves
    that file for the next run to resume from.
    """
    from asymo import profile as prof
    from asymo.hw.topology import detect
    topology = topology or detect()
    spec = cset.get_set(set_name)
    path = prof.profile_path(topology, path)
    itemsize = np.dtype(dtype).itemsize
    own_timer = timer is None
    if own_timer:
        timer = GemmTimer(topology, dtype=dtype, isa=isa, seed=seed)
    t_start = time.monotonic()
    try:
        mr, nr = timer.tile
        fingerprint = prof.cpu_fingerprint(topology)[0]
        ident = {"fingerprint": fingerprint, "set": spec.digest, "dtype": np.dtype(dtype).name,
                 "isa": timer.isa, "tile": [mr, nr], "schema": SCHEMA}
        state = _State(partial_path(path), ident)
        if resume:
            state.load()
        run = _Run(topology, spec, state, timer, itemsize, seed)
        # two bars, each with a total known when it starts: how much confirmation work there
        # is depends on the fit (a total growing under a bar made it go back from 100%)
        bar = _progress(run.total, run.done, progress, stream)
        try:
            for ci in range(len(topology.clusters)):
                run.measure(ci, ("train", "held_out"), bar)
        finally:
            bar.close()
        fits = [run.fit(ci) for ci in range(len(topology.clusters))]
        confirm = [run.confirm_work(ci, fits[ci]) for ci in range(len(topology.clusters))]
        total, done = run.count(confirm)
        bar = _progress(total, done, progress, stream)
        try:
            for ci in range(len(topology.clusters)):
                run.measure(ci, ("confirm",), bar, work=confirm[ci], label="confirming")
        finally:
            bar.close()

        section = run.section(fits, dtype)
        section["duration_s"] = round(time.monotonic() - t_start, 2)
        section["resumed_measurements"] = state.resumed
        if save:
            profile = profile or prof.load_profile(path, topology) or prof.Profile.new(topology,
                                                                                     path)
            profile.sections[SECTION] = section
            prof.save_profile(profile, path)
            section["path"] = path
        state.remove()
        _clear_plan_caches()
        return section
    finally:
        if own_timer:
            timer.close()


def _clear_plan_caches():
    mod = sys.modules.get("asymo.plan.matmul")
    if mod is not None:
        mod.clear_cache()


def _cpus(cl):
    from asymo.hw.topology import format_cpulist
    return "cpu " + format_cpulist(cl.cpus)


def _progress(total, done, enabled, stream):
    from tqdm import tqdm
    return tqdm(total=total, initial=done, unit="setting", disable=not enabled,
                file=stream or sys.stderr, dynamic_ncols=True, leave=True)


class _Run:
    """The work of one calibration: what to measure per cluster, and what it gives."""

    def __init__(self, topology, spec, state, timer, itemsize, seed):
        self.topology, self.spec, self.state, self.timer = topology, spec, state, timer
        self.itemsize, self.seed = itemsize, seed
        mr, nr = timer.tile
        self.caches = [cset.CacheInfo.for_cluster(cl, mr, nr, itemsize)
                       for cl in topology.clusters]
        self.work = []  # per cluster: [(phase, size, blocks_list)]
        for ci, cl in enumerate(topology.clusters):
            T, w = cl.ncpus, []
            for size in spec.mm + spec.mv:
                n = spec.mm_settings if size.kind == "mm" else spec.mv_settings
                w.append(("train", size, cset.training_blocks(size, T, self.caches[ci], n)))
            for size in spec.held_out:
                w.append(("held_out", size, cset.candidate_blocks(
                    size, T, self.caches[ci], spec.max_candidates,
                    min_i=cm.MIN_TASKS_PER_THREAD)))
            self.work.append(w)
        self.total, self.done = self.count(self.work)
        self.monitor = LoadMonitor(min_interval=0.0)

    def count(self, work):
        """(settings in ``work`` -- a list per cluster --, of those already measured)."""
        total = sum(len(b) for w in work for _, _, b in w)
        done = sum(1 for ci, w in enumerate(work) for ph, s, bl in w for b in bl
                   if self._get(ci, ph, s, b) is not None)
        return total, done

    def _get(self, ci, phase, size, blocks):
        return self.state.get(self.topology.clusters[ci].name, phase, size, blocks)

    def measure(self, ci, phases, bar, work=None, label="calibrating"):
        cl = self.topology.clusters[ci]
        work = [w for w in (work or self.work[ci]) if w[0] in phases]
        todo_all = [(ph, s, [b for b in bl if self._get(ci, ph, s, b) is None])
                    for ph, s, bl in work]
        todo_all = [t for t in todo_all if t[2]]
        if not todo_all:
            return
        bar.set_description(f"{label} {cl.name} ({_cpus(cl)})")
        self.monitor.loads()
        spec = self.spec
        for phase, size, todo in todo_all:
            repeats = spec.repeats * (2 if phase == "confirm" else 1)
            secs = self.timer.measure(cl, size, todo, repeats=repeats,
                                      min_sample_s=spec.min_sample_s,
                                      max_repeats=(spec.max_repeats or None),
                                      budget_s=(spec.budget_s or None))
            self.state.put(cl.name, phase, size, todo, secs)
            self.state.save()
            bar.update(len(todo))
        loads = self.monitor.loads()
        if loads is not None:
            lo = cluster_loads(self.topology, loads)[ci]
            if lo is not None:
                self.state.cluster(cl.name)["load"].append(lo)
                self.state.save()

    def training_data(self, ci):
        T = self.topology.clusters[ci].ncpus
        X, y, names = [], [], []
        for phase, size, bl in self.work[ci]:
            if phase == "train":
                X += _rows(size, bl, T)
                y += [self._get(ci, phase, size, b) for b in bl]
                names += [size.name] * len(bl)
        return np.array(X, dtype=np.float64), np.array(y, dtype=np.float64), names

    def fit(self, ci):
        cl = self.topology.clusters[ci]
        X, y, names = self.training_data(ci)
        mr, nr = self.timer.tile
        line = cl.l1d.line_size if cl.l1d else 64
        return fit_cluster(X, y, names, itemsize=self.itemsize, line_size=line, mr=mr, nr=nr,
                           seed=self.seed)

    def _held_out(self, ci, fit):
        """Per held-out shape: (size, candidates, seconds, {model: chosen index})."""
        T = self.topology.clusters[ci].ncpus
        models = {n: cm.CostPredictor.from_dict(f["model"]) for n, f in fit[1].items()}
        out = []
        for phase, size, bl in self.work[ci]:
            if phase != "held_out":
                continue
            secs = [self._get(ci, phase, size, b) for b in bl]
            X = np.array(_rows(size, bl, T), dtype=np.float64)
            chosen = {n: int(np.argmin(m.predict(X))) for n, m in models.items()}
            out.append((size, bl, secs, chosen))
        return out

    def confirm_work(self, ci, fits):
        work = []
        for size, bl, secs, chosen in self._held_out(ci, fits):
            idx = sorted({int(np.argmin(secs)), *chosen.values()})
            work.append(("confirm", size, [bl[i] for i in idx]))
        return work

    def section(self, fits, dtype):
        topology, state = self.topology, self.state
        mr, nr = self.timer.tile
        out_clusters = []
        for ci, cl in enumerate(topology.clusters):
            chosen_name, results = fits[ci]
            X, y, names = self.training_data(ci)
            best_by_kind = {"mm": [], "mv": []}
            for phase, size, bl in self.work[ci]:
                if phase == "train":
                    t = min(self._get(ci, phase, size, b) for b in bl)
                    best_by_kind[size.kind].append(size.flops / t / 1e9)
            held = []
            for size, bl, secs, chosen in self._held_out(ci, fits[ci]):
                # confirmed timings replace (by minimum) the first ones
                secs = [min(s, self._get(ci, "confirm", size, b) or math.inf)
                        for s, b in zip(secs, bl)]
                held.append((size, bl, secs, chosen))
            models = {}
            for name, fit in results.items():
                shapes = [_gap_entry(size, bl, secs, chosen[name])
                          for size, bl, secs, chosen in held]
                gaps = [g["gap"] for g in shapes]
                models[name] = {"model": fit["model"], "cv": fit["cv"],
                                "regret": fit["regret"], "gap": {
                    "median": float(np.median(gaps)) if gaps else None,
                    "max": float(max(gaps)) if gaps else None, "shapes": shapes}}
            loads = state.cluster(cl.name).get("load") or []
            out_clusters.append({
                "name": cl.name, "cpus": list(cl.cpus), "threads": cl.ncpus,
                "cache": dataclasses.asdict(self.caches[ci]),
                "capability_gflops": {k: _gmean(v) for k, v in best_by_kind.items()},
                "baseline_load": float(np.mean(loads)) if loads else 0.0,
                "model_name": chosen_name,
                "model": results[chosen_name]["model"],
                "models": models,
                "data": {"columns": list(cm.SETTING_COLUMNS) + ["seconds", "size"],
                         "rows": [[float(v) for v in r] + [float(t), n]
                                  for r, t, n in zip(X, y, names)]},
                "held_out": [{"size": size.name, "shape": [size.M, size.K, size.N],
                              "kind": size.kind, "blocks": [list(b) for b in bl],
                              "seconds": [float(t) for t in secs]}
                             for size, bl, secs, _ in held],
            })
        split = {}
        for kind in ("mm", "mv"):
            caps = [c["capability_gflops"][kind] for c in out_clusters]
            total = sum(caps)
            split[kind] = ([c / total for c in caps] if total > 0
                           else [1 / len(caps)] * len(caps))
        report = {
            "r2": {c["name"]: c["models"][c["model_name"]]["cv"]["r2"] for c in out_clusters},
            "r2_table2": {c["name"]: c["models"][BASELINE]["cv"]["r2"] for c in out_clusters},
            "median_gap": {c["name"]: c["models"][c["model_name"]]["gap"]["median"]
                           for c in out_clusters},
            "median_gap_table2": {c["name"]: c["models"][BASELINE]["gap"]["median"]
                                  for c in out_clusters},
        }
        return {
            "schema": SCHEMA, "set": self.spec.name, "set_digest": self.spec.digest,
            "dtype": np.dtype(dtype).name, "isa": self.timer.isa, "tile": [mr, nr],
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "topology": topology.to_spec(),
            "emulated": {str(k): v for k, v in sorted(topology.emulated.items())},
            "settings_per_cluster": sum(len(bl) for ph, _, bl in self.work[0] if ph == "train"),
            "load_source": self.monitor.source,
            "measurement": {
                "statistic": getattr(self.timer, "statistic", "min"),
                "rounds": getattr(self.timer, "rounds", None),
                "undisturbed_rounds": getattr(self.timer, "clean_rounds", None)},
            "clusters": out_clusters, "split": split, "report": report,
        }


def _gap_entry(size, blocks_list, seconds, chosen):
    best = int(np.argmin(seconds))
    return {"size": size.name, "shape": [size.M, size.K, size.N], "kind": size.kind,
            "candidates": len(blocks_list), "chosen": list(blocks_list[chosen]),
            "best": list(blocks_list[best]), "chosen_s": seconds[chosen],
            "best_s": seconds[best], "gap": seconds[chosen] / seconds[best] - 1.0}


def format_report(section):
    """The text ``asymo calibrate`` prints: per cluster and model, the held-out R^2 and error,
    the choice regret on held-out sizes and the gap on held-out shapes; capabilities and
    split ratios."""
    emulated = section.get("emulated")
    lines = [f"GEMM calibration: {section['set']} set, {section['dtype']}, {section['isa']} "
             f"kernels, topology {section['topology']}"
             + (f" (emulated slow cores {emulated}: speed, not caches)" if emulated else "")]
    meas = section.get("measurement") or {}
    if meas.get("rounds"):
        lines.append(f"  {section['settings_per_cluster']} training settings per cluster, "
                     f"{meas['statistic']} of interleaved samples; "
                     f"{meas['undisturbed_rounds']}/{meas['rounds']} measurement rounds "
                     "undisturbed by other processes")
    head = ("model", "R^2", "err", "regret", "mean regret", "gap", "max gap")
    for c in section["clusters"]:
        lines.append("")
        lines.append(f"  cluster {c['name']} (cpus {','.join(map(str, c['cpus']))}, "
                     f"{c['threads']} thread{'s' * (c['threads'] != 1)}): "
                     f"MM {c['capability_gflops']['mm']:.1f} GFLOP/s, "
                     f"MV {c['capability_gflops']['mv']:.1f} GFLOP/s, load while measured "
                     f"{c['baseline_load']:.0%} ({section.get('load_source', 'proc_stat')})")
        rows = []
        for name, m in c["models"].items():
            g = m["gap"]
            rows.append((("* " if name == c["model_name"] else "  ") + name,
                         f"{m['cv']['r2']:.3f}", f"{m['cv']['mdape']:.1%}",
                         f"{m['regret']['median']:.1%}", f"{m['regret']['mean']:.1%}",
                         "-" if g["median"] is None else f"{g['median']:.1%}",
                         "-" if g["max"] is None else f"{g['max']:.1%}"))
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        for r in [head] + rows:
            lines.append("    " + "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                            for i, (v, w) in enumerate(zip(r, widths))))
    lines.append("")
    lines += textwrap.wrap(
        "R^2, err: 10-fold cross-validation, held-out folds (err: median relative error); "
        "regret: latency of the model's choice vs the best setting, sizes held out (grouped "
        "10-fold; median and mean over sizes); gap: the same on shapes outside the training "
        "set, every candidate measured (median and max over shapes). * = model used for "
        f"planning (least median regret among those with R^2 >= {R2_TARGET}); table2 = the "
        "paper's model.", width=94, initial_indent="  ", subsequent_indent="  ")
    lines.append("  split ratios (fastest cluster first): "
                 + "; ".join(f"{k.upper()} " + " : ".join(f"{x:.3f}" for x in v)
                             for k, v in section["split"].items()))
    if section.get("duration_s") is not None:
        lines.append(f"  took {section['duration_s']:.0f} s"
                     + (f" (resumed with {section['resumed_measurements']} measurements "
                        "from an interrupted run)" if section.get("resumed_measurements")
                        else ""))
    return "\n".join(lines)
