"""``asymo calibrate --energy``: measure energy-frequency curves per cluster and store them in
the calibration profile (section ``"energy"``).

For each cluster whose frequency can be set, at each of its frequencies (all listed ones, or
``max_points`` spread over the range where the driver lists none), the compute-bound and the
memory-bound micro-benchmarks of `asymo.calibrate.energy_kernels` run on all the cluster's cores,
``repeats`` times each; the medians of time per unit of work and of power are kept. Energy
comes from the meter (RAPL, hwmon, a callable, a CSV trace), or, where none exists, from the
power model -- then the curves say ``measured_energy: false``. Frequencies are restored
afterwards whatever happens.
"""
from __future__ import annotations

import statistics
import sys
import time

from asymo.dvfs.curves import ClusterCurves, BenchCurve, SECTION, curves_to_section

__all__ = ["calibrate_energy", "CALIBRATE_ENERGY_HELP", "format_calibration"]

CALIBRATE_ENERGY_HELP = (
    "measure energy-frequency curves (AsyMo): at each CPU frequency of each cluster, run a "
    "compute-bound and a memory-bound micro-benchmark pinned to the cluster's cores and "
    "record time and energy; stored in the profile's 'energy' section and used by "
    "asymo.frequency_plan(mode='energy'). Needs permission to set frequencies (root; the "
    "userspace governor, or scaling_min/max_freq on intel_pstate). Energy is measured with "
    "RAPL or hwmon when readable, else ESTIMATED from a power model (P = P_static + C*V^2*f) "
    "and labelled so. Without cpufreq nothing is measured and estimated curves are used.")


def _pick_freqs(freqs, listed, max_points):
    """The frequencies to measure: the listed ones (at most ``max_points``, ends kept), or
    ``max_points`` spread over [min, max] in 100 MHz steps where the driver lists none."""
    freqs = sorted(set(freqs))
    if not listed and len(freqs) == 2:
        lo, hi = freqs
        step = 100_000  # P-state drivers work in 100 MHz ratios anyway
        pts = {lo, hi}
        for i in range(1, max_points - 1):
            pts.add(int(round((lo + (hi - lo) * i / (max_points - 1)) / step) * step))
        freqs = sorted(p for p in pts if lo <= p <= hi)
    if len(freqs) > max_points:
        idx = sorted({round(i * (len(freqs) - 1) / (max_points - 1)) for i in range(max_points)})
        freqs = [freqs[i] for i in idx]
    return freqs


def _say(progress, msg):
    if progress:
        print(msg, file=sys.stderr, flush=True)


def calibrate_energy(topology=None, cpufreq=None, meter=None, progress=True, *, profile=None,
                     save=True, clusters=None, frequencies=None, duration_s=0.2, repeats=3,
                     max_points=12, settle_s=0.05, memory_bytes=None, sysfs_root="/sys"):
    """Measure energy-frequency curves and store them in the profile.

    Parameters
    ----------
    topology : Topology or None
        Default ``cpufreq.topology`` or ``asymo.hw.topology.detect(sysfs_root)``.
    cpufreq : CpuFreq or None
        Default ``CpuFreq(topology, sysfs_root)``.
    meter : Meter or None
        Default ``detect_meter(...)``: RAPL, hwmon, else the power-model estimate.
    progress : bool
        Print progress to stderr.
    profile : Profile or None
        Profile to store into (default: the active one, or a new one).
    save : bool
        Write the profile to disk.
    clusters : list or None
        Cluster names to calibrate (default all).
    frequencies : dict or None
        ``{cluster: [kHz, ...]}`` to measure instead of the available ones.
    duration_s, repeats : float, int
        Length of one benchmark run and how many runs per point (medians kept).
    max_points : int
        At most this many frequencies per cluster.
    memory_bytes : int or None
        Size of the memory benchmark's matrix (default 4x the cluster's LLC, >= 64 MiB).

    Returns
    -------
    dict
        ``status`` ("ok", "partial" or "unavailable"), ``messages``, ``measured_energy``,
        ``meter`` (source, measured), ``clusters`` ({name: curves as dict, or
        {"skipped": reason}}), ``profile_path`` (when saved).
    """
    from asymo.dvfs.cpufreq import CpuFreq
    from asymo.dvfs.meters import detect_meter

    if topology is None:
        if cpufreq is not None:
            topology = cpufreq.topology
        else:
            from asymo.hw.topology import detect
            topology = detect(sysfs_root=sysfs_root)
    if cpufreq is None:
        cpufreq = CpuFreq(topology, sysfs_root=sysfs_root)
    if repeats < 1 or duration_s <= 0 or max_points < 2:
        raise ValueError("repeats must be >= 1, duration_s > 0 and max_points >= 2")
    names = [c.name for c in topology.clusters]
    wanted = names if clusters is None else list(clusters)
    for n in wanted:
        if n not in names:
            raise ValueError(f"no cluster {n!r}; clusters are {names}")

    result = {"status": "unavailable", "messages": [], "clusters": {}, "measured_energy": False,
              "meter": None, "profile_path": None}
    todo = []
    for cl in topology.clusters:
        if cl.name not in wanted:
            continue
        info = cpufreq.info(cl.name)
        if info.method is None:
            msg = (f"{cl.name}: CPU frequency cannot be set ({info.reason}); no energy curve "
                   "measured -- estimated curves will be used")
            result["clusters"][cl.name] = {"skipped": info.reason}
            result["messages"].append(msg)
            _say(progress, "asymo calibrate --energy: " + msg)
            continue
        todo.append((cl, info))
    if not todo:
        result["messages"].append(
            "energy calibration skipped: CPU frequencies cannot be set on this machine. "
            "asymo.frequency_plan uses ESTIMATED curves (power model P = P_static + C*V^2*f, "
            "roofline times) instead.")
        return result

    if meter is None:
        meter = detect_meter(cpufreq.sysfs_root, topology, cpufreq=cpufreq)
    result["meter"] = {"source": meter.source, "measured": bool(meter.measured)}
    result["measured_energy"] = bool(meter.measured)
    if not meter.measured:
        result["messages"].append(
            f"no power meter readable: energy is ESTIMATED by {meter.source}; times are "
            "measured")
    _say(progress, f"asymo calibrate --energy: meter {meter.source} "
                   f"({'measured' if meter.measured else 'ESTIMATE'})")

    from asymo.calibrate import energy_kernels as bench
    bench.warm_up()

    curves = {}
    for cl, info in todo:
        freqs = (frequencies or {}).get(cl.name) or _pick_freqs(
            info.frequencies_khz, info.frequencies_listed, max_points)
        llc = max((c.size for c in (cl.l3, cl.l2) if c is not None), default=None)
        reuse = bench.memory_reuse(memory_bytes, llc)
        cols = {"compute": ([], []), "memory": ([], [])}
        applied = []
        bar = _bar(progress, len(freqs), cl.name)
        checkpoint = cpufreq.checkpoint([cl.name])
        try:
            for f in freqs:
                change = cpufreq.set_frequency(cl.name, int(f), nearest=True)
                applied.append(change.targets[cl.name])
                time.sleep(settle_s)
                for kind in ("compute", "memory"):
                    tpu, pw = [], []
                    for _ in range(repeats):
                        if kind == "compute":
                            r = bench.run_compute(cl.cpus, duration_s, meter=meter)
                        else:
                            r = bench.run_memory(cl.cpus, duration_s, meter=meter,
                                                 nbytes=memory_bytes, llc_bytes=llc)
                        tpu.append(r.time_per_unit_s)
                        pw.append(r.reading.power_w)
                    cols[kind][0].append(statistics.median(tpu))
                    cols[kind][1].append(statistics.median(pw))
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            checkpoint.undo()  # the cluster's frequency settings as they were before
        order = sorted(range(len(applied)), key=applied.__getitem__)
        uniq = [i for j, i in enumerate(order) if j == 0 or applied[i] != applied[order[j - 1]]]
        pick = lambda xs: tuple(xs[i] for i in uniq)  # noqa: E731
        src = meter.source
        compute = BenchCurve("compute", pick(applied), pick(cols["compute"][0]),
                             pick(cols["compute"][1]), "flop", None, True,
                             bool(meter.measured), src)
        memory = BenchCurve("memory", pick(applied), pick(cols["memory"][0]),
                            pick(cols["memory"][1]), "byte", reuse, True,
                            bool(meter.measured), src)
        curves[cl.name] = ClusterCurves(cl.name, tuple(cl.cpus), compute, memory)
        result["clusters"][cl.name] = curves[cl.name].to_dict()
        _say(progress, "  " + _summary_line(cl.name, result["clusters"][cl.name]))

    result["status"] = "ok" if len(curves) == len(wanted) else "partial"
    section = curves_to_section(curves, meter=result["meter"], notes=result["messages"])
    if profile is None:
        from asymo.profile import Profile, active_profile
        profile = active_profile(topology) or Profile.new(topology)
    old = profile.sections.get(SECTION)
    if isinstance(old, dict) and isinstance(old.get("clusters"), dict) and \
            old.get("format") == section["format"] and old.get("version") == section["version"]:
        merged = dict(old["clusters"])  # keep clusters calibrated earlier
        merged.update(section["clusters"])
        section["clusters"] = merged
    profile.sections[SECTION] = section
    if save:
        from asymo.profile import save_profile
        result["profile_path"] = save_profile(profile)
    return result


def _bar(progress, total, name):
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=f"energy curves {name}", unit="freq", file=sys.stderr)


def _summary_line(name, c):
    if "skipped" in c:
        return f"{name}: skipped ({c['skipped']})"
    comp, mem = c["compute"], c["memory"]
    e_c = [t * p for t, p in zip(comp["time_per_unit_s"], comp["power_w"])]
    e_m = [t * p for t, p in zip(mem["time_per_unit_s"], mem["power_w"])]
    fc = comp["freqs_khz"][e_c.index(min(e_c))]
    fm = mem["freqs_khz"][e_m.index(min(e_m))]
    gflops = 1e-9 / comp["time_per_unit_s"][-1]
    gbs = 1e-9 / mem["time_per_unit_s"][-1]
    energy = "measured" if comp.get("measured_energy") else "ESTIMATED"
    return (f"{name}: {len(comp['freqs_khz'])} frequencies "
            f"{comp['freqs_khz'][0] // 1000}-{comp['freqs_khz'][-1] // 1000} MHz; at the top "
            f"{gflops:.1f} GFLOP/s, {gbs:.1f} GB/s; least energy ({energy}): compute-bound "
            f"{fc // 1000} MHz, memory-bound {fm // 1000} MHz")


def format_calibration(result):
    """Human-readable summary of ``calibrate_energy``'s result (for the CLI)."""
    lines = [f"energy calibration: {result['status']}"]
    if result.get("meter"):
        m = result["meter"]
        lines.append(f"  energy source: {m['source']} "
                     f"({'measured' if m['measured'] else 'ESTIMATED'})")
    for name, c in result["clusters"].items():
        lines.append("  " + _summary_line(name, c))
    for m in result["messages"]:
        lines.append(f"  note: {m}")
    if result.get("profile_path"):
        lines.append(f"  saved to {result['profile_path']}")
    return "\n".join(lines)
