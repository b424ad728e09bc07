"""Is a slower cluster's share of a job worth what it costs? One decision for every op.

Giving the slower clusters part of a job (AsyMo's processor-level split) saves time in
proportion to the work, but costs a roughly fixed amount per job: the other cluster's cores
must be woken and synchronised with, operands shared between them, and the job ends only when
the last of their tasks does. For a small job the fastest cluster alone finishes first. The
rule::

    use the slower clusters  iff  F / (R_0 + R_1 + ...) + overhead  <  F / R_0

with F the job's work (FLOPs; bytes for element-wise passes), R_c cluster c's rate for this
kind of work (all its active cores) and ``overhead = SYNC_S + tail``:

* `SYNC_S`: what involving a second cluster costs at all, on any machine;
* ``tail``: the expected wait for a slower core that is not running when the job needs it.
  A real core runs continuously: 0 (the last task's granularity is the planner's business:
  small tasks, stealing). A core slowed by `asymo.lab.emulate` is *stopped*
  for ``(1 - s)`` of every emulator period P: a job that ends while it is stopped waits for
  the rest of the stop, ``(1 - s) P / 2`` on average, with probability ``1 - s``, unless the
  faster cluster could steal the work first -- `TAIL_CATCH` of those jobs wait (fitted):
  ``tail = TAIL_CATCH (1 - s)^2 P / 2``. The emulator publishes P in env
  ``ASYMO_EMULATED_PERIOD``.

Rates come from the calibration profile (``asymo calibrate`` measured each cluster's MM and MV
GFLOP/s) when there is one, else from `DEFAULT_RATE` (per core at capacity 1) scaled by
capacity and active cores.

Measured on the development machine (2-core Zen 4 VM, float32, emulated core 1 at 0.5;
``bench/split_cost.py``): the split pays for MM above ~16-33 MFLOP at P = 1 ms and ~8-16 MFLOP
at 0.25 ms, for MV above ~4-8 MFLOP at 1 ms and ~2-4 MFLOP at 0.25 ms; the model puts the
crossovers at 19.6 / 9.2 MFLOP (MM) and 6.5 / 3.1 MFLOP (MV). At the emulator's 0.5 ms
default (crossovers 12.6 / 4.2 MFLOP) it chose the faster plan for 19 of 20 products; the miss
was a 5 us difference on a 150 us product.

Used by `asymo.plan.gemm` and `asymo.plan.matmul` (matmul: MM and MV), `asymo.ops.conv_gemm` (a
convolution's GEMM) and `asymo.ops.conv` (depthwise convolutions, element-wise epilogues).
"""
from __future__ import annotations

import math
import os

from asymo.hw import environ as _environ

__all__ = ["fastest_only", "pool_fastest_only", "split_gain", "cluster_rates", "emulated_period",
           "tail_s", "SYNC_S", "TAIL_CATCH", "DEFAULT_RATE", "PERIOD_ENV_VAR",
           "DEFAULT_EMULATED_PERIOD"]

#: env var in which `asymo.lab.emulate` publishes its period (seconds) while an emulation runs
PERIOD_ENV_VAR = "ASYMO_EMULATED_PERIOD"
#: the period (seconds) assumed for an emulated core when none is published: the emulator's
#: default period (`asymo.lab.emulate` takes its default from here)
DEFAULT_EMULATED_PERIOD = 5e-4

#: seconds a job pays for involving another cluster at all: waking its workers, the job's
#: state and shared operands (B panels, the vector) crossing between cores, the submitter's
#: wait for the last worker (how it was fitted: docs/tuning.md)
SYNC_S = 25e-6
#: fraction of the jobs that find a stopped emulated core at their end and cannot steal around
#: it (fitted with bench/split_cost.py: docs/tuning.md)
TAIL_CATCH = 0.5

#: single-core rate at capacity 1 by kind of work, for topologies without a calibration:
#: "mm" float32 GEMM and "mv" matrix-vector products (FLOP/s), "depthwise" (FLOP/s) and
#: "epilogue" (bytes/s of output, element-wise bias / activation / residual passes); the
#: convolution kinds encode measured split thresholds as rates (docs/tuning.md)
DEFAULT_RATE = {"mm": 75.0e9, "mv": 25.0e9, "depthwise": 75.0e9, "epilogue": 4.0e9}


# Plan caches (asymo.ops.conv, asymo.plan.gemm) key on the period on every call: read it from the
# raw environment (asymo.hw.environ) and parse a value once.
_environ_data = _environ.DATA
_PERIOD_KEY = os.fsencode(PERIOD_ENV_VAR)
_last = (None, None)    # (raw env value, its period)


def _parse_period(text):
    if not text:
        return None
    try:
        period = float(text)
    except ValueError:
        return None
    return period if math.isfinite(period) and period > 0 else None


def emulated_period(environ=None):
    """The emulator's period in seconds from env ``ASYMO_EMULATED_PERIOD``, or None."""
    global _last
    if environ is not None or _environ_data is None:
        env = os.environ if environ is None else environ
        return _parse_period(env.get(PERIOD_ENV_VAR))
    raw = _environ_data.get(_PERIOD_KEY)
    if raw is None:
        return None
    last = _last
    if last[0] == raw:
        return last[1]
    period = _parse_period(os.fsdecode(raw))
    _last = (raw, period)
    return period


def tail_s(topology, cluster, period=None):
    """Expected wait (seconds) at the end of a job for a core of ``cluster`` that is not
    running: ``TAIL_CATCH (1 - s)^2 P / 2`` for the slowest emulated cpu of the cluster
    (speed s, emulator period P), 0 for real cores."""
    emulated = getattr(topology, "emulated", None) or {}
    speeds = [emulated[c] for c in topology.clusters[cluster].cpus if c in emulated]
    if not speeds:
        return 0.0
    if period is None:
        period = emulated_period()
    if period is None:
        period = DEFAULT_EMULATED_PERIOD
    s = min(speeds)
    return TAIL_CATCH * (1.0 - s) ** 2 * period / 2.0


def cluster_rates(topology, kind="mm", active=None, calibration=None):
    """Rate of each cluster (all its active cores) for ``kind`` (see `DEFAULT_RATE`):
    calibrated GFLOP/s for "mm" and "mv" when ``calibration`` has them, else
    ``DEFAULT_RATE[kind]`` x capacity x active cores."""
    if kind not in DEFAULT_RATE:
        raise ValueError(f"kind must be one of {sorted(DEFAULT_RATE)}, got {kind!r}")
    clusters = topology.clusters
    if active is None:
        active = [c.ncpus for c in clusters]
    if calibration is not None and kind in ("mm", "mv"):
        caps = calibration.capability(kind)
        threads = [cc.threads for cc in calibration.clusters]
        return [cap * 1e9 * a / max(t, 1) for cap, a, t in zip(caps, active, threads)]
    return [DEFAULT_RATE[kind] * c.capacity * a for c, a in zip(clusters, active)]


def split_gain(flops, topology, kind="mm", *, active=None, calibration=None, period=None):
    """Seconds saved by giving the slower clusters their share of a job of ``flops`` units of
    work (FLOPs; bytes for "epilogue"), negative when the fastest cluster alone is faster.
    ``period`` overrides the emulator period read from the environment. See the module
    docstring."""
    rates = cluster_rates(topology, kind, active, calibration)
    if len(rates) < 2 or rates[0] <= 0:
        return 0.0
    used = [c for c in range(1, len(rates)) if rates[c] > 0]
    if not used:
        return 0.0
    alone = flops / rates[0]
    split = (flops / (rates[0] + sum(rates[c] for c in used)) + SYNC_S
             + max(tail_s(topology, c, period) for c in used))
    return alone - split


def fastest_only(flops, topology, kind="mm", *, active=None, calibration=None, period=None):
    """True when a job of ``flops`` units of work should run on the fastest cluster alone: the
    topology has several clusters and the slower ones' share saves less than it costs
    (`split_gain` <= 0)."""
    if topology is None or len(topology.clusters) < 2:
        return False
    return split_gain(flops, topology, kind, active=active, calibration=calibration,
                      period=period) <= 0.0


def pool_fastest_only(pool, work, kind="mm"):
    """`fastest_only` for a job of ``work`` units on ``pool`` (its topology and active
    workers); False on a pool with one cluster. Plan-time only: callers cache the answer in
    their plans."""
    return pool.nclusters > 1 and fastest_only(work, pool.topology, kind,
                                               active=pool.active_workers_per_cluster())
