"""Scaling results as plain data: :class:`Point` per (workload, policy, core count) and
:class:`ScalingResult` for a sweep (text table, JSON, plot), with the machine's meta data."""
from __future__ import annotations

import math
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from asymo.hw import topology as topo
from asymo.lab.machine import torch_module
from asymo.lab.scaling.report import format_number, format_validation

SCHEMA = "asymo.bench.scaling/1"


@dataclass
class Point:
    """One (workload, policy, core count) measurement or simulation."""

    workload: str
    policy: str
    cores: int
    throughput: float
    unit: str
    time_s: float
    cpus: list
    speedup: float = float("nan")     # over the same policy on one core
    times_s: list = field(default_factory=list)   # the samples the median is taken over
    sim_throughput: Optional[float] = None
    external_load: Optional[float] = None   # median share of the cores others used
    samples_clean: Optional[int] = None     # samples with external load <= the limit
    samples_total: Optional[int] = None

    def to_dict(self):
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class ScalingResult:
    """A whole sweep: points plus what produced them (machine, topology, emulation, mode)."""

    points: list
    mode: str                      # "measured" or "simulated"
    topology: topo.Topology
    meta: dict = field(default_factory=dict)
    workloads: dict = field(default_factory=dict)   # name -> description
    validation: Optional[dict] = None
    calibration: Optional[dict] = None
    workload_objs: list = field(default_factory=list, repr=False, compare=False)

    def fill_speedups(self):
        """Set every point's speedup over the same workload and policy on one core."""
        base = {(p.workload, p.policy): p.throughput for p in self.points if p.cores == 1}
        for p in self.points:
            b = base.get((p.workload, p.policy))
            p.speedup = p.throughput / b if b else float("nan")

    def series(self):
        """{workload: {policy: [(cores, throughput), ...]}} in core order."""
        out = {}
        for p in self.points:
            out.setdefault(p.workload, {}).setdefault(p.policy, []).append(
                (p.cores, p.throughput))
        for w in out.values():
            for v in w.values():
                v.sort()
        return out

    def label(self):
        if self.mode == "simulated":
            return f"SIMULATED: {self.meta.get('preset') or 'topology'} " \
                   f"({self.topology.to_spec()})"
        emu = self.topology.emulated
        e = (", emulated " + ", ".join(f"cpu{c}@{s:g}" for c, s in sorted(emu.items()))) \
            if emu else ""
        return f"MEASURED on {self.meta.get('cpu_model', 'this machine')} " \
               f"({self.topology.ncpus} cores{e})"

    def sim_conditions(self):
        """What a simulated sweep assumed besides the model, in words: per-core rates,
        scheduling overheads, interference windows, co-running ("" when measured)."""
        if self.mode != "simulated":
            return ""
        m = self.meta
        parts = []
        rates = m.get("gflops_per_core")
        if rates:
            names = [c.name for c in self.topology.clusters]
            source = ("the preset's" if m.get("preset")
                      else "assumed: 10 x capacity, a topology spec has no rate")
            parts.append("per-core GFLOP/s " + ", ".join(
                f"{n} {r:.3g}" for n, r in zip(names, rates)) + f" ({source})")
        ov = m.get("overheads_s")
        if ov:
            parts.append(f"overheads job {ov['job'] * 1e6:.3g} us, task "
                         f"{ov['task'] * 1e6:.3g} us, steal {ov['steal'] * 1e6:.3g} us")
        parts.append(self._interference_text())
        return "; ".join(parts)

    def _interference_text(self):
        m = self.meta
        windows = []
        for i in m.get("interference") or ():
            when = ("for the whole run" if i.get("stop_s") is None and not i.get("start_s")
                    else f"from {i.get('start_s', 0) * 1e3:g} to "
                         + ("the end" if i.get("stop_s") is None
                            else f"{i['stop_s'] * 1e3:g} ms"))
            windows.append(f"cpu {i['cpu']} at {i['speed']:g} of its speed {when}")
        text = ("interference: " + ", ".join(windows)) if windows else "no interference"
        corun = m.get("corun_factor")
        text += (f"; co-running factor {corun:g} (a core's speed while one other runs "
                 "tasks)" if corun is not None else "; no co-running slowdown")
        return text

    def table(self):
        """The sweep as a text table: one row per (workload, policy), one column per core
        count, throughput in the workload's unit, then the best speedup over one core."""
        lines = [self.label()]
        if self.mode == "measured":
            m = self.meta
            clean = sum(p.samples_clean or 0 for p in self.points)
            total = sum(p.samples_total or 0 for p in self.points)
            short = [f"{p.workload}/{p.policy}/{p.cores}" for p in self.points
                     if (p.samples_clean or 0) < m.get("repeats", 0)]
            lines.append(f"median of {m.get('repeats')} runs per point (pool policies "
                         f"interleaved) taken while other processes used <= "
                         f"{m.get('max_external_load', 1.0) * 100:.0f}% of the cores: "
                         f"{clean} of {total} runs; 1-min load average "
                         f"{m.get('loadavg_before', float('nan')):.2f} before, "
                         f"{m.get('loadavg_after', float('nan')):.2f} after")
            if short:
                lines.append("too few undisturbed runs (figures less reliable): "
                             + ", ".join(short[:8]) + (" ..." if len(short) > 8 else ""))
            if self.topology.emulated:
                lines.append("note: the emulator slows cores by time-slicing; it emulates "
                             "speed, not cache size.")
        else:
            lines.append("model: " + self.meta.get("model", ""))
            lines.append("simulated with: " + self.sim_conditions())
        ncores = max((p.cores for p in self.points), default=0)
        cluster_of = [c.name for c in self.topology.clusters for _ in c.cpus]
        for wl, by_policy in self.series().items():
            unit = next(p.unit for p in self.points if p.workload == wl)
            lines.append("")
            lines.append(f"{wl}  [{unit}]  {self.workloads.get(wl, '')}")
            lines.append(f"{'cluster':<10}" + "".join(f"{cluster_of[k - 1][:9]:>10}"
                                                   for k in range(1, ncores + 1)))
            lines.append(f"{'cores':<10}" + "".join(f"{k:>10}" for k in range(1, ncores + 1))
                         + f"{'best/1':>9}")
            for pol, pts in by_policy.items():
                vals = dict(pts)
                row = f"{pol:<10}"
                for k in range(1, ncores + 1):
                    v = vals.get(k)
                    row += f"{format_number(v):>10}"
                sp = max(v for _, v in pts) / vals[1] if vals.get(1) else float("nan")
                row += f"{sp:>8.2f}x"
                lines.append(row)
        lines.append("")
        lines.append("cores are added fastest cluster first; best/1: best throughput over "
                     "the policy's own 1-core figure.")
        if self.validation:
            lines.append("")
            lines.extend(format_validation(self.validation))
        return "\n".join(lines)

    def to_dict(self):
        d = {"schema": SCHEMA, "mode": self.mode, "label": self.label(),
             "meta": self.meta, "workloads": self.workloads,
             "topology": self.topology.to_dict(),
             "points": [p.to_dict() for p in self.points]}
        if self.validation is not None:
            d["validation"] = self.validation
            d["sim_error"] = dict(self.validation.get("sim_error", {}))
        return d

    def plot(self, path):
        """Write a PNG: one panel per workload, throughput against cores, a line per policy."""
        fig = self.figure()
        import matplotlib.pyplot as plt
        try:
            fig.savefig(path, dpi=110)
        finally:
            plt.close(fig)

    def figure(self):
        """The matplotlib figure :meth:`plot` writes (the caller closes it)."""
        try:
            import matplotlib
            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from None
        series = self.series()
        n = max(1, len(series))
        ncols = min(n, 2)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.3 * nrows + 0.4),
                                 squeeze=False)
        flat = [ax for row in axes for ax in row]
        for ax in flat[n:]:
            ax.set_visible(False)
        styles = {"asymo": ("tab:red", "o", "-"), "even": ("tab:blue", "s", "--"),
                  "shared": ("tab:green", "^", "-."), "steal": ("tab:purple", "v", ":"),
                  "numpy": ("black", "x", "--"), "torch": ("tab:orange", "d", "--")}
        sim_pts = {(p.workload, p.policy, p.cores): p.sim_throughput for p in self.points
                   if p.sim_throughput is not None}
        cluster_of = [c.name for c in self.topology.clusters for _ in c.cpus]
        acc, bounds = 0, []
        for c in self.topology.clusters[:-1]:
            acc += c.ncpus
            bounds.append(acc + 0.5)
        for ax, (wl, by_policy) in zip(flat, series.items()):
            unit = next(p.unit for p in self.points if p.workload == wl)
            for pol, pts in by_policy.items():
                color, marker, ls = styles.get(pol, (None, ".", "-"))
                xs, ys = zip(*pts)
                label = pol
                if pol == "numpy" and self.mode == "simulated":
                    label = "numpy (model: static even split)"
                ax.plot(xs, ys, marker=marker, linestyle=ls, color=color, label=label)
                sims = [(k, sim_pts.get((wl, pol, k))) for k in xs]
                sims = [(k, v) for k, v in sims if v is not None]
                if sims:
                    sx, sy = zip(*sims)
                    ax.plot(sx, sy, linestyle="none", marker=marker, color=color,
                            markerfacecolor="none", markersize=11, alpha=0.7)
            for b in bounds:
                ax.axvline(b, color="grey", linewidth=0.8, linestyle=":")
            desc = self.workloads.get(wl, wl)
            ax.set_title(desc if len(desc) <= 70 else desc[:67] + "...", fontsize=9)
            # the cluster of each core under its number (as the table's 'cluster' row): tick
            # labels, which a legend never covers
            ax.set_xticks(range(1, self.topology.ncpus + 1))
            ax.set_xticklabels([f"{k}\n{name[:9]}" for k, name in
                                enumerate(cluster_of, start=1)], fontsize=8)
            ax.set_xlabel("cores and their cluster (fastest cluster first)")
            ax.set_ylabel(unit + (" (simulated)" if self.mode == "simulated" else ""))
            ax.set_ylim(bottom=0)
            ax.set_xlim(0.5, self.topology.ncpus + 0.5)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            if any(k[0] == wl for k in sim_pts):
                from matplotlib.lines import Line2D
                handles.append(Line2D([], [], linestyle="none", marker="o", color="grey",
                                      markerfacecolor="none", markersize=9))
                labels.append("hollow: simulated")
            ax.legend(handles, labels, fontsize=8)
        title = self.label()
        if self.mode == "measured" and self.topology.emulated:
            period = self.meta.get("emulator_period_s")
            title += ("\nthe emulator slows a core by time-slicing"
                      + (f" (period {period * 1e3:g} ms)" if period else "")
                      + ": speed only, not cache size")
        if self.mode == "simulated":
            title += "\n" + self._interference_text()
        if sim_pts:
            title += ("\nhollow markers: the simulator, fed only by its calibration (traced "
                      "tasks, availability, co-running), measured in separate runs")
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        return fig


def machine_meta(topology):
    """What a measured sweep records about the machine: CPU, platform, library versions,
    usable cores, topology and emulation."""
    from asymo.hw.topology import cpu_model_name
    meta = {"cpu_model": cpu_model_name(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "usable_cpus": sorted(os.sched_getaffinity(0)),
            "topology_spec": topology.to_spec(),
            "emulated": {str(k): v for k, v in sorted(topology.emulated.items())}}
    torch = torch_module()
    if torch is not None:
        meta["torch"] = torch.__version__
    try:
        from threadpoolctl import threadpool_info
        meta["blas"] = [{"internal_api": i.get("internal_api"), "version": i.get("version"),
                         "num_threads": i.get("num_threads")}
                        for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception:  # pragma: no cover - informational only
        pass
    return meta
