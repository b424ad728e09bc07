"""``asymo info``: the CPU topology as asymo sees it.

``build_info`` gathers what is shown as a dict of sections (JSON-ready); ``render_text`` turns
it into the table. To show more (e.g. the active calibration profile), add a key in
``build_info`` and, for the table, a renderer in ``RENDERERS``; ``--json`` prints every key.
"""
from __future__ import annotations

import os
import sys
import warnings

from asymo.cli.options import json_text
from asymo.hw import topology as topo

_EPILOG = """\
topology sources, first that answers wins: --topology / env ASYMO_TOPOLOGY (live system
only), Intel hybrid PMUs (devices/cpu_core, cpu_atom, cpu_lowpower), cpuN/cpu_capacity when
the values differ, cpufreq policies grouped by (base) frequency, else one cluster.

--topology format: clusters separated by ',', each [name:]cpulist[@capacity] with '+'
between ranges inside a cluster, e.g. 'big:0-3@1.0,little:4-7@0.45' or 'p:0-1+4-5,e:2-3@0.6'.
"""


def register(sub):
    import argparse
    p = sub.add_parser("info", help="show the CPU topology (clusters, caches, frequencies)",
                       description="Show the CPU topology as asymo sees it: clusters fastest "
                                   "first, relative capacity, caches, frequencies and cpufreq "
                                   "policies.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR",
                   help="read this sysfs tree instead of the live /sys; it describes another "
                        "machine (no affinity filtering, ASYMO_* variables ignored)")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="explicit topology, e.g. 'big:0-3@1.0,little:4-7@0.45' (caches and "
                        "frequencies are still read from sysfs)")
    p.set_defaults(func=run)


def build_info(topology, sysfs_root="/sys"):
    """The data ``asymo info`` shows, as JSON-ready sections (``{"topology": ...}``)."""
    from asymo.plan.calibration import profile_summary
    return {
        "sysfs_root": os.fspath(sysfs_root),
        "topology": topology.to_dict(),
        "profile": profile_summary(topology),
        "matmul_fast": _matmul_fast_state(),
    }


def _matmul_fast_state():
    from asymo.ops import matmul_fast
    st = matmul_fast.status()
    return {"state": st["state"], "available": st["available"], "enabled": st["enabled"]}


# -- table rendering --------------------------------------------------------------------

def _size(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.3g}{unit}"
    return f"{nbytes}B"


def _cache(c):
    if not c:
        return "-"
    n = len(c["shared_cpus"])
    return f"{_size(c['size'])}/{n}" if n else _size(c["size"])


def _freqs(c):
    lo, hi = c.get("min_freq_khz"), c.get("max_freq_khz")
    if hi is None:
        return "-"
    text = f"{hi // 1000}" if lo is None else f"{lo // 1000}-{hi // 1000}"
    n = len(c.get("available_freqs_khz") or ())
    return text + (f" ({n} steps)" if n else "")


def _policy(c):
    if c.get("cpufreq_policy"):
        return c["cpufreq_policy"]
    paths = c.get("cpufreq_policies") or []
    if not paths:
        return "-"
    return f"{len(paths)} policies in {os.path.dirname(paths[0])}"


_BASIS = {
    "override": "given by the override",
    "cpu_capacity": "kernel cpu_capacity",
    "base_frequency": "ratio of base frequencies, an estimate",
    "nominal_freq": "ratio of ACPI CPPC nominal frequencies, an estimate",
    "max_frequency": "ratio of maximum frequencies, an estimate",
    "equal": "all cores treated alike",
    "unknown": "unknown, all set to 1.0",
}


def _render_topology(t):
    emulated = {int(k): v for k, v in t.get("emulated", {}).items()}
    ncpus = sum(len(c["cpus"]) for c in t["clusters"])
    n = len(t["clusters"])
    lines = [f"CPU topology: {n} cluster{'s' * (n != 1)}, {ncpus} cpus "
             f"(source: {t['source']}; capacity: "
             f"{_BASIS.get(t.get('capacity_basis'), t.get('capacity_basis'))})"]
    head = ("cluster", "cpus", "capacity", "L1d", "L2", "L3", "freq MHz", "cpufreq policy")
    rows = []
    for c in t["clusters"]:
        cpus = topo.format_cpulist(c["cpus"])
        if any(cpu in emulated for cpu in c["cpus"]):
            cpus += "*"
        rows.append((c["name"], cpus, f"{c['capacity']:.3f}", _cache(c.get("l1d")),
                     _cache(c.get("l2")), _cache(c.get("l3")), _freqs(c), _policy(c)))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    right = {2}
    for r in [head] + rows:
        lines.append("  ".join(v.rjust(w) if i in right else v.ljust(w)
                               for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    lines.append("caches: size/number of cpus sharing one instance")
    if emulated:
        lines.append("* emulated slow cores: "
                     + ", ".join(f"cpu{cpu} at {s:g} of its speed"
                                 for cpu, s in sorted(emulated.items()))
                     + " (the emulator slows speed, not caches)")
    return "\n".join(lines)


# section key -> function(section) -> text; sections without one appear only in --json
def _render_profile(p):
    from asymo.plan.calibration import render_profile_summary
    return render_profile_summary(p)


RENDERERS = {
    "topology": _render_topology,
    "profile": _render_profile,
    "matmul_fast": lambda s: f"matmul fast path: {s['state']}",
}


def render_text(info):
    """The table ``asymo info`` prints for the sections of ``info``."""
    return "\n\n".join(RENDERERS[k](v) for k, v in info.items() if k in RENDERERS)


def run(args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", topo.TopologyWarning)
        try:
            t = topo.detect(sysfs_root=args.sysfs_root, override=args.topology)
        except topo.TopologyError as exc:
            _flush(caught)
            print(f"asymo info: error: {exc}", file=sys.stderr)
            return 2
    _flush(caught)
    info = build_info(t, args.sysfs_root)
    if args.json:
        print(json_text(info))
    else:
        print(render_text(info))
    return 0


def _flush(caught):
    for w in caught:
        if issubclass(w.category, topo.TopologyWarning):
            text = str(w.message).removeprefix("asymo.hw.topology: ")
            print(f"asymo info: warning: {text}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
