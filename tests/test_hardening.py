"""Regression tests from the hostile review (bad input, closed objects, restore paths)."""
import math
import os
import warnings

import numpy as np
import pytest

from asymo.runtime.ffi import ffi, lib

COUNT = ffi.addressof(lib, "asymo_task_count")
NCPU = len(os.sched_getaffinity(0))


def _pool(spec="big:0@1.0,little:1@0.5"):
    from asymo.runtime.pool import Pool
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Pool(spec)


# -- pool ------------------------------------------------------------------------------------
def test_pool_rejects_addresses_wider_than_a_pointer():
    with _pool() as pool:
        with pytest.raises(ValueError, match="ctx address"):
            pool.parallel_for(COUNT, 1, ctx=1 << 70)  # was truncated to NULL: segfault
        with pytest.raises(ValueError, match="fn address"):
            pool.parallel_for((1 << 64) + 8, 1)  # was truncated to 0x8


def test_pool_rejects_ntasks_beyond_int64():
    with _pool() as pool:
        with pytest.raises(ValueError, match="ntasks"):
            pool.parallel_for(COUNT, 1 << 70)
        with pytest.raises(ValueError, match="ntasks"):
            pool.split_counts(1 << 63)


def test_closed_pool_never_touches_freed_handle():
    pool = _pool()
    counts = np.zeros(4, np.int32)
    pool.parallel_for(COUNT, 4, ctx=counts)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.parallel_for(COUNT, 4, ctx=counts)
    with pytest.raises(ValueError, match="closed"):
        pool.queue  # was a KeyError from reading freed memory
    assert (counts == 1).all()


def test_pool_queue_argument_type():
    from asymo.runtime.pool import Pool
    with pytest.raises(ValueError, match="queue"):
        Pool("a:0@1", queue=["mutex"])


# -- pipeline --------------------------------------------------------------------------------
def _fake_plan_inputs(W=6):
    from types import SimpleNamespace

    from asymo.pipeline.configs import core_configs
    from asymo.pipeline.table import LayerTimes
    from asymo.hw.topology import parse_spec
    top = parse_spec("big:0-1@1.0,little:2-3@0.5")
    cfgs = core_configs(top)
    work = np.linspace(4e-3, 1e-3, W)
    cols = [work / top.clusters[c.cluster].capacity / c.count for c in cfgs]
    table = LayerTimes(cfgs, np.stack(cols, 1), out_bytes=np.full(W, 1e5),
                       kernel_level=work / 2, source="synthetic")
    return SimpleNamespace(name="fake", layers=[None] * W), top, table


@pytest.mark.parametrize("k", [float("nan"), -1e-6, float("inf")])
def test_plan_rejects_nonsense_transfer_k(k):
    from asymo.pipeline.plan import plan_pipeline
    model, top, table = _fake_plan_inputs()
    # NaN / negative k made stages look free: "inf img/s" and negative energy
    with pytest.raises(ValueError, match="transfer_k"):
        plan_pipeline(model, top, table=table, transfer_k=k)
    cfg = table.configs[0]
    with pytest.raises(ValueError, match="transfer_k"):
        plan_pipeline(model, top, table=table, transfer_k={cfg: k})
    plan = plan_pipeline(model, top, table=table, transfer_k=1e-9)
    assert math.isfinite(plan.predicted_throughput) and plan.predicted_energy >= 0


@pytest.mark.parametrize("t", [0, -5, float("nan"), float("inf")])
def test_pipeline_rejects_bad_timeout(t):
    from types import SimpleNamespace

    from asymo.pipeline.runtime import Pipeline
    from asymo.hw.topology import parse_spec
    cpu = min(os.sched_getaffinity(0))
    model = SimpleNamespace(layers=[None], run_layers=lambda x, a, b, pool=None: x)
    # NaN silently meant "wait forever"; 0 / negative timed out at once with a traceback
    with pytest.raises(ValueError, match="timeout"):
        Pipeline(model, [((cpu,), (0, 0))], topology=parse_spec(f"a:{cpu}@1"), timeout=t)


def _cli(capsys, *argv):
    """Run the CLI in-process: (exit status, stderr)."""
    from asymo.cli import main
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
        if isinstance(exc.code, str):
            print(exc.code, file=__import__("sys").stderr)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["plan", "alexnet", "--transfer-k", "nan"],
    ["plan", "alexnet", "--transfer-k=-1"],
    ["pipeline", "alexnet", "--timeout", "0"],
    ["pipeline", "alexnet", "--timeout", "nan"],
    ["pipeline", "alexnet", "--warmup=-1"],
])
def test_pipeline_cli_bad_numbers_are_clear_errors(argv, capsys):
    rc, err = _cli(capsys, *argv)  # an exception other than SystemExit fails the test
    assert rc != 0
    assert "transfer_k" in err or "--timeout" in err or "--warmup" in err


# -- dvfs CLI and profile --------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["dvfs", "status", "--sysfs-root", "/nonexistent-asymo"],
    ["dvfs", "status", "--topology", "not-a-spec"],
    ["dvfs", "plan", "--shapes", "0,1,1"],
    ["dvfs", "plan", "--shapes", ";"],
])
def test_dvfs_cli_bad_arguments_are_clear_errors(argv, capsys):
    rc, err = _cli(capsys, *argv)  # these raised TopologyError / ValueError tracebacks
    assert rc != 0
    assert "asymo dvfs" in err


def test_dvfs_plan_warns_when_explicit_profile_is_missing(tmp_path, capsys):
    from asymo.profile import ProfileWarning
    with pytest.warns(ProfileWarning, match="no calibration profile"):
        rc, _ = _cli(capsys, "dvfs", "plan", "--shapes", "64,64,64", "--topology", "c0:0@1",
                     "--profile", str(tmp_path / "typo.json"))
    assert rc == 0


def test_profile_deeply_nested_json_is_corrupt_not_a_crash(tmp_path):
    from asymo.profile import ProfileWarning, load_profile
    p = tmp_path / "deep.json"
    p.write_text('{"format": "asymo-profile", "sections": ' + "[" * 100000 + "]" * 100000
                 + "}")
    with pytest.warns(ProfileWarning, match="corrupt"):
        assert load_profile(str(p)) is None


def _corrupt_cpufreq_tree(root, listed="-4 1 2"):
    cpu = root / "devices/system/cpu"
    (cpu / "cpu0").mkdir(parents=True)
    (cpu / "online").write_text("0\n")
    pol = cpu / "cpufreq/policy0"
    pol.mkdir(parents=True)
    (pol / "related_cpus").write_text("0\n")
    (pol / "affected_cpus").write_text("0\n")
    (pol / "cpuinfo_min_freq").write_text("-1\n")
    (pol / "cpuinfo_max_freq").write_text("0\n")
    (pol / "scaling_available_frequencies").write_text(listed + "\n")
    return root


def test_cpufreq_ignores_non_positive_frequencies(tmp_path):
    from asymo.dvfs import CpuFreq
    from asymo.hw.topology import parse_spec
    root = _corrupt_cpufreq_tree(tmp_path)
    cf = CpuFreq(parse_spec("c0:0@1"), sysfs_root=str(root))
    info = cf.info("c0")
    # was frequencies (-4, 1, 2) and cpuinfo_min -1: a power model with C < 0 crashed
    # `asymo dvfs status`
    assert all(f > 0 for f in info.frequencies_khz)
    assert info.cpuinfo_min_khz is None and info.cpuinfo_max_khz is None


def test_dvfs_status_on_corrupt_cpufreq_tree(tmp_path, capsys):
    from asymo.hw.topology import TopologyWarning

    root = _corrupt_cpufreq_tree(tmp_path, listed="abc")
    # the corrupt value is named in a warning, and the status still prints
    with pytest.warns(TopologyWarning, match="cpuinfo_max_freq"):
        rc, _ = _cli(capsys, "dvfs", "status", "--sysfs-root", str(root), "--topology",
                     "c0:0@1")
    assert rc == 0


# -- emulator --------------------------------------------------------------------------------
def test_emulated_topology_validates_speeds_and_cpus():
    from asymo.lab.emulate import emulated_topology
    from asymo.hw.topology import parse_spec
    base = parse_spec("c0:0-1@1")
    with pytest.raises(ValueError, match="cpu ids"):
        emulated_topology({-1: 0.5}, base=base, cpus=[0, 1])
    with pytest.raises(ValueError, match="speed"):
        emulated_topology({1: float("nan")}, base=base, cpus=[0, 1])
    with pytest.raises(ValueError, match="speed"):
        emulated_topology({1: 1.5}, base=base, cpus=[0, 1])
    # a cpu the machine does not have was reported as emulated without any cluster slowed
    t = emulated_topology({7: 0.5}, base=base, cpus=[0, 1])
    assert t.emulated == {} and t.nclusters == 1
    t = emulated_topology({np.int64(1): 0.5}, base=base, cpus=[0, 1])
    assert t.emulated == {1: 0.5} and t.to_spec() == "c0:0@1,c0-emu0.5:1@0.5"


def test_pipeline_cli_emulate_refused_by_the_emulator_is_a_clear_error(capsys):
    # a cpu outside the affinity mask: a ValueError traceback from Emulation.start()
    cpu = max(os.sched_getaffinity(0)) + 1000
    rc, err = _cli(capsys, "pipeline", "alexnet", "--emulate", f"{cpu}:0.5", "--frames", "1")
    assert rc == 2
    assert f"asymo pipeline: error: --emulate {cpu}:0.5: cpu {cpu} is not in" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [("--frames", "100000000000"),
                                  ("--warmup", "100000000000", "--frames", "2")])
def test_pipeline_cli_frames_that_cannot_fit_are_a_clear_error(capsys, args):
    # the frames are made before the run: a NumPy MemoryError traceback before
    rc, err = _cli(capsys, "pipeline", "squeezenet", *args)
    assert rc == 1
    assert "asymo pipeline: error:" in err and "GiB, more than the" in err
    assert "Traceback" not in err


def test_attribute_and_trace_readers_take_regular_files_only(tmp_path):
    """A FIFO in a fake sysfs tree hung `asymo info` and `asymo dvfs status`, /dev/zero behind
    an attribute or a power trace read until memory ran out, non-UTF-8 bytes were a
    UnicodeDecodeError traceback, and a cpu list could name millions of cpus."""
    from asymo.dvfs.meters import CsvTraceMeter
    from asymo.hw.sysfs import SysfsError, SysfsReader, parse_cpulist, read_attribute

    fifo = tmp_path / "online"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    binary = tmp_path / "label"
    binary.write_bytes(b"\xff\xfe")
    for p in (fifo, zero, binary, tmp_path):
        assert read_attribute(str(p)) is None
    with pytest.raises(SysfsError, match="online"):
        SysfsReader(str(tmp_path)).read("online")
    for p in (fifo, zero, tmp_path):
        with pytest.raises((OSError, ValueError)):
            CsvTraceMeter(str(p)).read_trace()
    with pytest.raises(ValueError, match="beyond"):
        parse_cpulist("0-40000")


def test_malformed_energy_curves_pids_and_models_are_refused_cleanly(capsys):
    """From a file fuzz: int(inf) in a curve was an OverflowError traceback, itemsize 0 a
    ZeroDivisionError, a negative reuse 'math domain error'; a shared cpufreq record's pid
    beyond pid_max an OverflowError; `dvfs plan --model ""` an AttributeError."""
    from asymo.dvfs import PowerModel
    from asymo.dvfs._guardian import holder_alive
    from asymo.dvfs.curves import ClusterCurves, CurveFormatError, estimate_curves
    from asymo.hw.topology import parse_spec

    t = parse_spec("big:0@1.0")
    d = next(iter(estimate_curves(t, PowerModel.from_system(t, "/nonexistent")).values())).to_dict()
    for path, value in ((("compute", "freqs_khz", 0), float("inf")), (("cpus", 0), float("inf")),
                        (("itemsize",), 0), (("compute", "reuse"), -1.0)):
        bad = __import__("copy").deepcopy(d)
        box = bad
        for k in path[:-1]:
            box = box[k]
        box[path[-1]] = value
        with pytest.raises(CurveFormatError):
            ClusterCurves.from_dict(bad)
    assert holder_alive([1 << 70, None]) is False
    rc, err = _cli(capsys, "dvfs", "plan", "--model", "")
    assert rc == 2 and "--model is empty" in err and "Traceback" not in err


def test_a_profiles_malformed_quality_figures_do_not_break_asymo_info():
    """`asymo info` read the GEMM section's report on itself unchecked (KeyError, TypeError,
    ValueError tracebacks for 50 of 876 mutated profiles the planner accepted)."""
    from asymo.plan.calibration import _gemm_summary, render_profile_summary

    c = {"name": "big", "model_name": "m", "models": {"m": {"cv": {"r2": "high"}}}}
    with pytest.raises((TypeError, ValueError)):
        _gemm_summary({"clusters": [c]})
    text = render_profile_summary({"status": "ok", "path": "p.json", "version": 3,
                                   "sections": ["gemm"],
                                   "gemm": {"usable": True, "figures": "malformed (x)"}})
    assert "quality figures are malformed" in text


def test_calibrate_checks_its_profile_path_and_partial_file_first(capsys, tmp_path):
    """A directory or a path in a missing directory as --profile failed after the whole
    measurement (and the missing directories were made); a partial file of the wrong JSON
    types was resumed from (AttributeError tracebacks)."""
    from asymo.calibrate.gemm import _valid_clusters

    rc, err = _cli(capsys, "calibrate", "--quick", "--no-progress", "--profile", str(tmp_path))
    assert rc == 2 and "not a regular file" in err
    missing = tmp_path / "no" / "such" / "p.json"
    rc, err = _cli(capsys, "calibrate", "--quick", "--no-progress", "--profile", str(missing))
    assert rc == 2 and "does not exist" in err and not (tmp_path / "no").exists()
    good = {"big": {"train": {"64x64x64": {"8,8,8": 1e-4}}, "held_out": {}, "confirm": {},
                    "load": []}}
    assert _valid_clusters(good)
    for bad in ([], {"big": []}, {"big": {"train": []}}, {"big": {"train": {"s": []}}},
                {"big": {"train": {"s": {"b": "fast"}}}}, {"big": {"load": {}}}):
        assert not _valid_clusters(bad)
