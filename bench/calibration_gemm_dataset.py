"""The GEMM calibration data set (AsyMo, paper 003, section 5), listed for a topology.

The definition lives in `asymo.calibrate.gemm_set` (so an installed asymo can calibrate); this
script shows what `asymo calibrate` measures on each cluster: the 15 MM sizes (VGG-16 and
MobileNet V1 convolutions as asymo runs them, ``weight @ columns``), the 20 MV sizes, the
block sizes of every setting, and the held-out shapes whose candidates are all measured.

    python3 bench/calibration_gemm_dataset.py [--set full|quick|tiny] [--topology SPEC] [--json OUT]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymo.calibrate import gemm_set as cset  # noqa: E402
from asymo.plan import costmodel as cm  # noqa: E402
from asymo.hw import topology as topo  # noqa: E402


def describe(spec, topology, mr, nr, itemsize=4):
    """The settings of ``spec`` per cluster, as JSON-ready data."""
    out = {"set": spec.name, "digest": spec.digest, "tile": [mr, nr], "clusters": []}
    for cl in topology.clusters:
        cache = cset.CacheInfo.for_cluster(cl, mr, nr, itemsize)
        sizes = []
        for size in spec.mm + spec.mv:
            n = spec.mm_settings if size.kind == "mm" else spec.mv_settings
            sizes.append({"name": size.name, "kind": size.kind, "shape": [size.M, size.K, size.N],
                          "blocks": [list(b) for b in cset.training_blocks(size, cl.ncpus,
                                                                           cache, n)]})
        held = [{"name": s.name, "kind": s.kind, "shape": [s.M, s.K, s.N],
                 "candidates": [list(b) for b in cset.candidate_blocks(
                     s, cl.ncpus, cache, spec.max_candidates,
                     min_i=cm.MIN_TASKS_PER_THREAD)]}
                for s in spec.held_out]
        out["clusters"].append({"name": cl.name, "cpus": list(cl.cpus),
                                "cache": cache.__dict__, "training": sizes, "held_out": held})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="full", choices=sorted(cset.SETS))
    ap.add_argument("--topology", default=None, help="override spec (default: detect)")
    ap.add_argument("--tile", default=None, metavar="MR,NR",
                    help="register tile (default: the best kernel of this CPU)")
    ap.add_argument("--json", default=None, metavar="OUT", help="write the listing as JSON")
    args = ap.parse_args(argv)
    t = topo.detect(override=args.topology)
    if args.tile:
        mr, nr = (int(v) for v in args.tile.split(","))
    else:
        from asymo.plan import gemm as gemm_plan
        mr, nr = gemm_plan.kernel_tile(gemm_plan.best_isa(), "float32")
    d = describe(cset.get_set(args.set), t, mr, nr)
    for c in d["clusters"]:
        n_train = sum(len(s["blocks"]) for s in c["training"])
        n_held = sum(len(s["candidates"]) for s in c["held_out"])
        print(f"cluster {c['name']} (cpus {c['cpus']}): {len(c['training'])} sizes, "
              f"{n_train} training settings; {len(c['held_out'])} held-out shapes, "
              f"{n_held} candidates")
        for s in c["training"]:
            blocks = " ".join("x".join(map(str, b)) for b in s["blocks"])
            print(f"  {s['name']:<22} {s['kind']} {'x'.join(map(str, s['shape'])):<15} {blocks}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d, f, indent=1)


if __name__ == "__main__":
    main()
