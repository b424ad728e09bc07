"""What it costs one core to write cache lines another core holds (``csrc/lab/crosscore.c``).

Splitting work between cores moves data between their caches: a layer reads what the layer
before wrote on another core, and a buffer one core wrote is written by another next time.
That cost belongs to the machine and to the moment. On a big.LITTLE CPU it is higher between
clusters than within one; on the development VM it rises for tens of seconds at a time when
the host runs the two vCPUs on cores that share no last-level cache (docs/emulation.md, "the
VM's slow state"), which slows every library's two-core runs while one-core runs do not
change. The round trip of one cache line (``round_trip_s``) tells the two states apart:
50-90 ns against 310-360 ns there.

:func:`transfer_cost` measures it; :func:`asymo.cli.bench_model.compare` records it beside
each round of a benchmark so a reader can tell which figures met that state.

>>> c = transfer_cost(0, 1)                                   # doctest: +SKIP
>>> round(c.ratio, 1)                                        # doctest: +SKIP
2.0
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass

__all__ = ["TransferCost", "transfer_cost", "DEFAULT_BYTES"]

#: the buffer written across: a quarter of a MiB stays in any core's L2
DEFAULT_BYTES = 256 * 1024
MIN_BYTES, MAX_BYTES = 4096, 64 << 20
MAX_REPS = 1000


@dataclass(frozen=True)
class TransferCost:
    """Medians over the repetitions of one :func:`transfer_cost` call."""

    #: the cpu that wrote the buffer first, and the cpu that then wrote it
    cpu_from: int
    cpu_to: int
    nbytes: int
    #: seconds for ``cpu_to`` to write the buffer ``cpu_from`` had just written
    cross_s: float
    #: seconds for ``cpu_to`` to write it again (lines it already holds)
    own_s: float
    #: seconds for one cache line to go from ``cpu_from`` to ``cpu_to`` and back (median of
    #: batches of round trips); None where not measured
    round_trip_s: float | None = None
    #: the fastest batch's round trip: on a core the emulator stops for part of each period,
    #: the batches a stop missed
    round_trip_min_s: float | None = None

    @property
    def ratio(self):
        """``cross_s / own_s``: how much dearer a line written across the cores is."""
        return self.cross_s / self.own_s if self.own_s > 0 else float("inf")

    def to_dict(self):
        return {"cpu_from": self.cpu_from, "cpu_to": self.cpu_to, "nbytes": self.nbytes,
                "cross_s": self.cross_s, "own_s": self.own_s, "ratio": self.ratio,
                "round_trip_s": self.round_trip_s, "round_trip_min_s": self.round_trip_min_s}


def transfer_cost(cpu_from, cpu_to, *, nbytes=DEFAULT_BYTES, reps=9):
    """Time writes of lines another core holds against writes of lines the core holds.

    Two threads, pinned to ``cpu_from`` and ``cpu_to`` for the call only (the caller's own
    affinity is not touched), take turns: ``cpu_from`` writes a buffer of ``nbytes``, then
    ``cpu_to`` writes it twice; then they pass one cache line back and forth 1500 times.
    Returns a :class:`TransferCost` (medians of ``reps``; the round trip's median over 15
    batches). Takes about ``reps`` times a few tens of microseconds, plus under a
    millisecond of round trips.

    Raises ``ValueError`` for bad arguments or a cpu outside the process's affinity, and
    ``OSError`` when a thread cannot be started or pinned.
    """
    for name, v in (("cpu_from", cpu_from), ("cpu_to", cpu_to), ("nbytes", nbytes),
                    ("reps", reps)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if cpu_from == cpu_to:
        raise ValueError(f"cpu_from and cpu_to are both {cpu_from}; the probe needs two cpus")
    allowed = os.sched_getaffinity(0)
    for name, cpu in (("cpu_from", cpu_from), ("cpu_to", cpu_to)):
        if cpu not in allowed:
            raise ValueError(f"{name}={cpu} is not a cpu this process may use "
                             f"({sorted(allowed)})")
    if not MIN_BYTES <= nbytes <= MAX_BYTES:
        raise ValueError(f"nbytes={nbytes} is outside [{MIN_BYTES}, {MAX_BYTES}]")
    if not 1 <= reps <= MAX_REPS:
        raise ValueError(f"reps={reps} is outside [1, {MAX_REPS}]")
    from asymo.lab._native import ffi, lib  # compiled from csrc/lab/crosscore.c

    out = ffi.new("asymo_transfer_result *")
    rc = lib.asymo_transfer_probe(cpu_from, cpu_to, nbytes, reps, out)
    if rc == -errno.EINVAL:
        raise ValueError(f"transfer probe refused cpus {cpu_from} -> {cpu_to}, "
                         f"nbytes={nbytes}, reps={reps}")
    if rc != 0:
        raise OSError(-rc, f"transfer probe between cpus {cpu_from} and {cpu_to}: "
                           f"{os.strerror(-rc)}")
    return TransferCost(cpu_from, cpu_to, int(nbytes), out.cross_ns * 1e-9, out.own_ns * 1e-9,
                        out.round_trip_ns * 1e-9, out.round_trip_min_ns * 1e-9)
