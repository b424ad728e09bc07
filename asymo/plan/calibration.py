"""The profile's "gemm" section as the planner reads it: `parse_section` validates it against
a topology and gives a `Calibration` (per-cluster cost models and capabilities);
`profile_summary` / `render_profile_summary` are what ``asymo info`` shows of it.

`asymo.calibrate.gemm` measures and writes the section.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass

from asymo import profile as prof
from asymo.plan import costmodel as cm

__all__ = ["SECTION", "SCHEMA", "BASELINE", "Calibration", "ClusterCalibration", "parse_section",
           "profile_summary", "render_profile_summary"]

SECTION = "gemm"
SCHEMA = 1
#: the paper's model (Table 2 terms, linear regression), stored beside the chosen one
BASELINE = "table2"


# ---------------------------------------------------------------------------------------------
# The stored calibration, read back
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterCalibration:
    name: str
    cpus: tuple
    threads: int
    model: cm.CostPredictor
    cache: dict
    capability: dict      # kind -> GFLOP/s
    baseline_load: float


@dataclass(frozen=True)
class Calibration:
    """The usable content of a profile's "gemm" section."""

    path: str
    isa: str
    dtype: str
    tile: tuple
    clusters: tuple
    created: str = ""
    load_source: str = "proc_stat"

    def capability(self, kind):
        return [c.capability[kind] for c in self.clusters]


#: plausible ranges of the numbers a "gemm" section holds: a value outside them (1e308
#: GFLOP/s, a 2^40-byte L1) is a corrupt or hand-edited profile, not a measurement
_CAPABILITY_GFLOPS = (1e-6, 1e7)
_CACHE_LIMITS = {"l1_bytes": 1 << 30, "l2_bytes": 1 << 36, "l2_sharing": 4096, "mr": 256,
                 "nr": 256, "itemsize": 16, "unit": 1 << 30}
_MAX_THREADS = 4096
_MAX_TILE = 1024


def parse_section(section, topology, path=""):
    """A `Calibration` from a profile's "gemm" section for ``topology``, or ValueError saying
    why it cannot be used (another schema, other clusters, a malformed model, numbers out of
    any plausible range...)."""
    try:
        return _parse_section(section, topology, path)
    except (TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise ValueError(f"malformed gemm section ({type(exc).__name__}: {exc})") from None


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_section(section, topology, path):
    if not isinstance(section, dict):
        raise ValueError("the gemm section is not a JSON object")
    if section.get("schema") != SCHEMA:
        raise ValueError(f"gemm section schema {section.get('schema')!r}, this asymo reads "
                         f"{SCHEMA}")
    clusters = section.get("clusters")
    if not isinstance(clusters, list) or len(clusters) != topology.nclusters:
        n = len(clusters) if isinstance(clusters, list) else "no"
        raise ValueError(f"the gemm section has {n} clusters, the topology "
                         f"{topology.nclusters}")
    out = []
    for c, cl in zip(clusters, topology.clusters):
        if (not isinstance(c, dict) or not isinstance(c.get("cpus"), list)
                or tuple(c["cpus"]) != tuple(cl.cpus)):
            raise ValueError(f"cluster {cl.name!r}: the profile's cpus "
                             f"{c.get('cpus') if isinstance(c, dict) else c!r} differ from "
                             f"{list(cl.cpus)}")
        try:
            model = cm.CostPredictor.from_dict(c.get("model"))
        except ValueError as exc:
            raise ValueError(f"cluster {cl.name!r}: {exc}") from None
        cap = c.get("capability_gflops")
        if not isinstance(cap, dict):
            raise ValueError(f"cluster {cl.name!r}: capability_gflops is {cap!r}, not an object")
        caps = {}
        for kind in ("mm", "mv"):
            v = cap.get(kind)
            lo, hi = _CAPABILITY_GFLOPS
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                    or not lo <= v <= hi):
                raise ValueError(f"cluster {cl.name!r}: capability {kind!r} is {v!r} "
                                 f"(GFLOP/s in [{lo:g}, {hi:g}])")
            caps[kind] = float(v)
        cache = c.get("cache")
        need = ("l1_bytes", "l2_bytes", "l2_sharing", "mr", "nr", "itemsize", "unit")
        if not isinstance(cache, dict) or any(not _is_int(cache.get(k))
                                              or not 1 <= cache[k] <= _CACHE_LIMITS[k]
                                              for k in need):
            raise ValueError(f"cluster {cl.name!r}: cache description {cache!r}")
        threads = c.get("threads")
        if not _is_int(threads) or not 1 <= threads <= _MAX_THREADS:
            raise ValueError(f"cluster {cl.name!r}: threads {threads!r}")
        base = c.get("baseline_load", 0.0)
        base = float(base) if isinstance(base, (int, float)) and 0 <= base <= 1 else 0.0
        out.append(ClusterCalibration(name=cl.name, cpus=tuple(cl.cpus), threads=threads,
                                      model=model, cache={k: cache[k] for k in need},
                                      capability=caps, baseline_load=base))
    tile = section.get("tile")
    if not (isinstance(tile, list) and len(tile) == 2
            and all(_is_int(x) and 0 < x <= _MAX_TILE for x in tile)):
        raise ValueError(f"kernel tile {tile!r}")
    source = section.get("load_source", "proc_stat")
    if source not in ("wait", "proc_stat"):
        raise ValueError(f"load_source {source!r}")
    return Calibration(path=path, isa=str(section.get("isa")), dtype=str(section.get("dtype")),
                       tile=tuple(tile), clusters=tuple(out),
                       created=str(section.get("created", "")), load_source=source)


def profile_summary(topology, path=None):
    """What ``asymo info`` shows about the active profile (JSON-ready).

    ``status``: "missing", "unusable" (with ``reason``: corrupt, another CPU, another
    version) or "ok" (with ``sections`` and, for the GEMM calibration, its quality figures).
    """
    path = prof.profile_path(topology, path)
    out = {"path": path}
    if not os.path.exists(path):
        out.update(status="missing", reason="not calibrated: run `asymo calibrate`")
        return out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", prof.ProfileWarning)
        p = prof.load_profile(path, topology)
    if p is None:
        reasons = [str(w.message) for w in caught if issubclass(w.category, prof.ProfileWarning)]
        out.update(status="unusable", reason=reasons[0] if reasons else "unreadable")
        return out
    out.update(status="ok", version=p.version, fingerprint=p.fingerprint,
               sections=sorted(p.sections))
    g = p.sections.get(SECTION)
    if g is not None:
        try:
            parse_section(g, topology, path)
        except ValueError as exc:
            out["gemm"] = {"usable": False, "reason": str(exc)}
            return out
        try:
            out["gemm"] = _gemm_summary(g)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # parse_section checks what the planner reads; the figures shown here are only
            # the calibration's report on itself
            out["gemm"] = {"usable": True, "figures": f"malformed ({type(exc).__name__}: {exc})"}
    return out


def _gemm_summary(g):
    """The GEMM section's quality figures for `profile_summary` (numbers checked)."""
    def num(v):
        if v is not None and not isinstance(v, (int, float)):
            raise TypeError(f"{v!r} is not a number")
        return v

    return {
        "usable": True, "set": g.get("set"), "created": g.get("created"),
        "isa": g.get("isa"), "dtype": g.get("dtype"), "duration_s": g.get("duration_s"),
        "split": {str(k): [float(x) for x in v] for k, v in (g.get("split") or {}).items()},
        "clusters": [{"name": str(c["name"]), "model": str(c.get("model_name")),
                      "r2": float(c["models"][c["model_name"]]["cv"]["r2"]),
                      "r2_table2": float(c["models"][BASELINE]["cv"]["r2"]),
                      "regret": num(c["models"][c["model_name"]]["regret"]["median"]),
                      "median_gap": num(c["models"][c["model_name"]]["gap"]["median"]),
                      "median_gap_table2": num(c["models"][BASELINE]["gap"]["median"]),
                      "capability_gflops": {k: float(v) for k, v in
                                            (c.get("capability_gflops") or {}).items()}}
                     for c in g["clusters"]],
    }


def render_profile_summary(s):
    """The ``asymo info`` table for `profile_summary`."""
    if s["status"] == "missing":
        return (f"calibration profile: none ({s['path']}); default plans are used "
                "(run `asymo calibrate`)")
    if s["status"] == "unusable":
        return f"calibration profile: unusable, default plans are used\n  {s['reason']}"
    lines = [f"calibration profile: {s['path']} (version {s['version']}, sections: "
             f"{', '.join(s['sections']) or 'none'})"]
    g = s.get("gemm")
    if g is None:
        lines.append("  no GEMM calibration: default plans (run `asymo calibrate`)")
        return "\n".join(lines)
    if not g["usable"]:
        lines.append(f"  GEMM calibration unusable ({g['reason']}): default plans")
        return "\n".join(lines)
    if "figures" in g:
        lines.append(f"  GEMM calibration in use; its quality figures are {g['figures']}")
        return "\n".join(lines)
    split = "; ".join(f"{k.upper()} " + ":".join(f"{x:.2f}" for x in v)
                      for k, v in (g.get("split") or {}).items())
    lines.append(f"  GEMM: {g['set']} set, {g['dtype']} {g['isa']}, {g['created']}; split "
                 f"{split}")
    head = ("cluster", "model", "R^2", "R^2 table2", "regret", "gap", "gap table2", "MM GFLOP/s")
    rows = []
    for c in g["clusters"]:
        pct = (lambda v: "-" if v is None else f"{v:.1%}")
        rows.append((c["name"], c["model"], f"{c['r2']:.3f}", f"{c['r2_table2']:.3f}",
                     pct(c["regret"]), pct(c["median_gap"]), pct(c["median_gap_table2"]),
                     f"{(c.get('capability_gflops') or {}).get('mm', 0):.1f}"))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        lines.append("  " + "  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                                      for i, (v, w) in enumerate(zip(r, widths))))
    lines.append("  R^2: held-out folds of 10-fold CV; regret: held-out sizes; gap: chosen vs "
                 "best blocks on shapes outside the training set (medians)")
    return "\n".join(lines)
