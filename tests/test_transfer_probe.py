"""The cross-core transfer probe (asymo.lab.transfer, csrc/lab/crosscore.c) and how the model
benchmark records it beside its repeats."""
import errno
import os

import pytest

from asymo.cli.bench_model import SLOW_TRANSFER_FACTOR, _transfer_summary, format_table
from asymo.lab._native import ffi, lib
from asymo.lab.transfer import TransferCost, transfer_cost

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="the probe needs two cpus")


@two_cpus
def test_probe_times_both_writes():
    before = os.sched_getaffinity(0)
    c = transfer_cost(CPUS[0], CPUS[1], nbytes=64 * 1024, reps=5)
    assert isinstance(c, TransferCost)
    assert (c.cpu_from, c.cpu_to, c.nbytes) == (CPUS[0], CPUS[1], 64 * 1024)
    # 64 KiB written line by line takes microseconds, not nothing and not seconds
    assert 1e-7 < c.own_s < 1e-2 and 1e-7 < c.cross_s < 1e-2
    assert c.ratio == pytest.approx(c.cross_s / c.own_s)
    # a cache line's round trip between two cores: tens of nanoseconds to tens of
    # microseconds (a busy machine), never nothing
    assert 1e-8 < c.round_trip_min_s <= c.round_trip_s < 1e-4
    assert set(c.to_dict()) == {"cpu_from", "cpu_to", "nbytes", "cross_s", "own_s", "ratio",
                                "round_trip_s", "round_trip_min_s"}
    assert os.sched_getaffinity(0) == before  # the caller's affinity is untouched


def test_probe_rejects_bad_arguments():
    a = CPUS[0]
    with pytest.raises(ValueError, match="two cpus"):
        transfer_cost(a, a)
    with pytest.raises(ValueError, match="may use"):
        transfer_cost(a, max(CPUS) + 1)
    with pytest.raises(TypeError, match="int"):
        transfer_cost(a, True)
    with pytest.raises(TypeError, match="int"):
        transfer_cost(a, 1.0)
    if len(CPUS) > 1:
        with pytest.raises(ValueError, match="nbytes"):
            transfer_cost(CPUS[0], CPUS[1], nbytes=100)
        with pytest.raises(ValueError, match="reps"):
            transfer_cost(CPUS[0], CPUS[1], reps=0)


def test_native_probe_fails_cleanly_on_a_cpu_it_cannot_pin():
    """A side that cannot pin itself stops both sides: an error code, no hang."""
    out = ffi.new("asymo_transfer_result *")
    bad = 1000  # < CPU_SETSIZE, beyond any cpu of this machine
    assert lib.asymo_transfer_probe(CPUS[0], bad, 65536, 3, out) == -errno.EINVAL
    assert lib.asymo_transfer_probe(bad, CPUS[0], 65536, 3, out) == -errno.EINVAL
    assert lib.asymo_transfer_probe(CPUS[0], CPUS[0], 65536, 3, out) == -errno.EINVAL
    assert lib.asymo_transfer_probe(-1, CPUS[0], 65536, 3, out) == -errno.EINVAL
    assert lib.asymo_transfer_probe(CPUS[0], bad, 1024, 3, out) == -errno.EINVAL
    assert lib.asymo_transfer_probe(CPUS[0], bad, 65536, 0, out) == -errno.EINVAL
    assert lib.asymo_transfer_probe(CPUS[0], bad, 65536, 3, ffi.NULL) == -errno.EINVAL


def _costs(ratios, cross_us=None, trips_ns=None, fastest_ns=None):
    """Probe readings with these ratios (and cross-core times, 9 us each by default; round
    trips, median and fastest, none by default)."""
    cross_us = cross_us or [9.0] * len(ratios)

    def ns(v):
        return [None if t is None else t * 1e-9 for t in (v or [None] * len(ratios))]
    return [TransferCost(0, 1, 1 << 18, us * 1e-6, us * 1e-6 / q, rt, fast)
            for q, us, rt, fast in zip(ratios, cross_us, ns(trips_ns), ns(fastest_ns))]


def _result(readings, asymo, ort):
    samples = {"asymo": asymo, "ort": ort}
    readings = _costs(readings)
    return {"model": "m", "gflop": 1.0, "seconds": {"asymo": 1.0, "ort": 1.0},
            "ratio": {"ort": 1.0}, "best_other": "ort", "vs_best_other": 1.0,
            "machine": {"cpu": "x", "cpus": 2, "affinity": [0, 1], "pool_workers": 2,
                        "topology": "c0:0-1", "emulation": "none"},
            "method": "m", "transfer": _transfer_summary((0, 1), readings, samples)}


def test_summary_marks_repeats_beside_dear_readings():
    # readings before repeats 0..3 and after the last; repeats 1 and 2 touch the 6.0
    tr = _transfer_summary((0, 1), _costs([2.0, 2.1, 6.0, 2.0, 2.2]),
                           {"asymo": [1.0, 2.0, 2.0, 1.1], "ort": [1.1, 3.0, 3.0, 1.1]})
    assert tr["marked_repeats"] == [1, 2]
    st = tr["steady"]
    assert st["repeats"] == [0, 3]
    assert st["seconds"]["asymo"] == pytest.approx(1.05)
    assert st["ratio"]["ort"] == pytest.approx(1.1 / 1.05)
    assert st["best_other"] == "ort"
    dear = tr["dear"]  # the marked repeats' own figures
    assert dear["repeats"] == [1, 2] and dear["seconds"]["asymo"] == pytest.approx(2.0)
    assert dear["ratio"]["ort"] == pytest.approx(1.5)
    # a reading just under the factor marks nothing, and no 'steady' figures are made
    calm = _transfer_summary((0, 1), _costs([2.0, 2.0 * SLOW_TRANSFER_FACTOR - 0.01, 2.0]),
                             {"asymo": [1.0, 1.0], "ort": [1.0, 1.0]})
    assert calm["marked_repeats"] == [] and "steady" not in calm
    assert calm["readings"] == pytest.approx([2.0, 2.0 * SLOW_TRANSFER_FACTOR - 0.01, 2.0])
    assert calm["cross_us"] == pytest.approx([9.0, 9.0, 9.0])


def test_summary_marks_dearer_writes_at_an_unchanged_ratio():
    # both writes twice as dear (the VM state the ratio misses): the cross-core time marks
    # the repeat after it; a time just under the factor marks nothing
    tr = _transfer_summary((0, 1), _costs([2.0, 2.0, 2.0, 2.0], [9.0, 9.2, 18.0, 9.1]),
                           {"asymo": [1.0, 2.0, 1.0], "ort": [1.0, 2.5, 1.0]})
    assert tr["marked_repeats"] == [1, 2]
    assert tr["steady"]["repeats"] == [0]
    calm = _transfer_summary((0, 1), _costs([2.0, 2.0], [9.0, 9.0 * SLOW_TRANSFER_FACTOR - 0.1]),
                             {"asymo": [1.0], "ort": [1.0]})
    assert calm["marked_repeats"] == []


def test_summary_marks_a_dearer_round_trip_at_unchanged_writes():
    # the VM's vCPUs on cores without a shared cache: the round trip 60 -> 330 ns while the
    # writes read the same; a round trip just under the factor marks nothing
    tr = _transfer_summary((0, 1), _costs([2.0] * 4, None, [60, 62, 330, 61]),
                           {"asymo": [1.0, 1.8, 1.0], "ort": [1.0, 1.5, 1.0]})
    assert tr["marked_repeats"] == [1, 2]
    assert tr["round_trip_ns"] == pytest.approx([60, 62, 330, 61])
    calm = _transfer_summary((0, 1), _costs([2.0, 2.0], None,
                                            [60, 60 * SLOW_TRANSFER_FACTOR - 1]),
                             {"asymo": [1.0], "ort": [1.0]})
    assert calm["marked_repeats"] == []
    # readings without a round trip (older results) mark by the writes alone
    assert _transfer_summary((0, 1), _costs([2.0, 2.0]), {"asymo": [1.0], "ort": [1.0]})[
        "round_trip_ns"] is None


def test_emulated_summary_marks_by_the_fastest_round_trip_alone():
    # the emulator stops cpu 1: the writes and the median round trip read its stops (here
    # wildly); only the fastest batch's round trip tells the cache state
    costs = _costs([9.0, 2.0, 7.0, 2.0], [40.0, 9.0, 35.0, 9.0], [900, 80, 2000, 85],
                   [80, 78, 300, 82])
    tr = _transfer_summary((0, 1), costs, {"asymo": [1.0, 1.7, 1.0], "ort": [1.1, 1.2, 1.1]},
                           emulated=True)
    assert tr["emulated"] and tr["marked_repeats"] == [1, 2]
    assert tr["round_trip_min_ns"] == pytest.approx([80, 78, 300, 82])
    assert tr["steady"]["repeats"] == [0]
    r = _result([2.0, 2.0, 2.0, 2.0], [1.0, 1.7, 1.0], [1.1, 1.2, 1.1])
    r["transfer"] = tr
    text = format_table(r)
    assert "fastest round trip between cpus 0 and 1" in text and "80 78 300 82 ns" in text
    assert "repeat(s) 2, 3 met dearer transfers (>= 1.6x the run's fastest round trip)" in text
    assert "cross-core writes" not in text


def test_table_lists_readings_and_marked_repeats():
    text = format_table(_result([2.0, 6.0, 2.0, 2.0], [2.0, 2.0, 1.0], [3.0, 3.0, 1.2]))
    assert "cross-core writes (cpu 0 -> 1" in text
    assert "2.0x (9.0 us) 6.0x (9.0 us) 2.0x (9.0 us) 2.0x (9.0 us)" in text
    assert "repeat(s) 1, 2 met dearer transfers" in text and "without them ort 1.20x" in text
    assert "in them alone ort 1.50x" in text
    assert "round trip between" not in text  # readings without one
    r = _result([2.0, 2.0, 2.0], [1.0, 2.0], [1.0, 2.0])
    r["transfer"] = _transfer_summary((0, 1), _costs([2.0, 2.0, 2.0], None, [60, 70, 330]),
                                      {"asymo": [1.0, 2.0], "ort": [1.0, 2.0]})
    text = format_table(r)
    assert "a cache line's round trip between them: 60 70 330 ns" in text
    assert "repeat(s) 2 met dearer transfers" in text
