"""``asymo info``: the CPU topology as asymo sees it."""
from __future__ import annotations

import json

from asymo import topology as topo


def register(sub):
    p = sub.add_parser("info", help="show the CPU topology (clusters, caches, frequencies)",
                       description="Show the CPU topology as asymo sees it: clusters fastest "
                                   "first, relative capacity, caches and frequencies.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR",
                   help="read this sysfs tree instead of the live /sys (no affinity filtering)")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="explicit topology, e.g. 'big:0-3@1.0,little:4-7@0.45'")
    p.set_defaults(func=run)


def run(args):
    t = topo.detect(sysfs_root=args.sysfs_root, override=args.topology)
    info = {"topology": t.to_dict()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"topology source: {t.source}"
          + (f"  (emulated: {', '.join(f'cpu{c}@{s:g}' for c, s in sorted(t.emulated.items()))})"
             if t.emulated else ""))
    print(f"{'cluster':<10}{'cpus':<12}{'capacity':>9}")
    for c in t.clusters:
        print(f"{c.name:<10}{topo.format_cpulist(c.cpus):<12}{c.capacity:>9.3f}")
    return 0
