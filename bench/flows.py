"""Flows on and off: a network's model planned with FLOW_MAX_LAYERS at each of several values
(0: no flows), and the same network on the fast core alone, side by side.

A flow (docs/models.md) runs a chain of blocked layers as one pool job on pools of several
clusters, so it matters only where some core is slower: run it under the emulator. Each
process builds every variant once and times them in shuffled rounds of calls; a model's speed
moves with where its arena lands, so the script runs several processes and reports, for each
variant, its ratio to the last one per process, and their median:

    flock /tmp/asymo-bench.lock python3 bench/flows.py --emulate 1:0.5 --processes 8

Prints the machine, the pool, the emulation and each process's medians, with the tasks each
variant ran twice a call (the pool's backups and the flows' own runs again); ratios > 1:
faster than the last variant. The emulator changes speed only: the slowed core keeps its caches.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def one_process(args):
    """Time the variants in this process; print one JSON line of medians (ms) per variant."""
    import numpy as np
    import torch

    import asymo
    import asymo.models.graph_model as gm
    from _convbench import emulated, machine_lines
    from asymo.hw.topology import Cluster, Topology
    from asymo.models import torchvision_defs as tv
    from asymo.models.torch_loader import export_onnx_bytes

    x = np.random.default_rng(0).standard_normal((1, 3, args.size, args.size)).astype(np.float32)
    data = export_onnx_bytes(tv.build(args.net), torch.from_numpy(x))
    limits = [int(v) for v in args.flows.split(",")]
    with emulated(args.emulate) as emu:
        pool = asymo.get_pool()
        fast = pool.topology.clusters[0]
        alone = asymo.Pool(topology=Topology(clusters=(Cluster(fast.name, fast.cpus[:1]),)))
        models, info = {}, {}
        saved = gm.FLOW_MAX_LAYERS
        try:
            for limit in limits:
                gm.FLOW_MAX_LAYERS = limit
                m = asymo.from_onnx(data, name=args.net, pool=pool, cluster_choice="all")
                plan = m.plan(1, backups=pool.nclusters > 1)
                models[f"flows of {limit}"] = m
                info[f"flows of {limit}"] = (len(plan.flows), plan.arena_bytes)
        finally:
            gm.FLOW_MAX_LAYERS = saved
        models["fast core alone"] = asymo.from_onnx(data, name=args.net, pool=alone)
        want = models["fast core alone"](x).copy()
        for name, m in models.items():
            got = m(x)
            if float(np.abs(got - want).max()) > 1e-4 * float(np.abs(want).max()):
                raise SystemExit(f"{name}: outputs differ from the fast core alone")
            for _ in range(3):
                m(x)
        times = {name: [] for name in models}
        for _ in range(args.rounds):
            names = list(models)
            random.shuffle(names)
            for name in names:
                ts = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    models[name](x)
                    ts.append(time.perf_counter() - t0)
                times[name].append(statistics.median(ts))
        # what each variant ran twice: the pool's backups and the flows' own runs again
        again = {}
        for name, m in models.items():
            if name == "fast core alone":
                continue
            pool.reset_stats()
            before = m._flow_counts()[0]
            for _ in range(args.calls):
                m(x)
            backups = sum(w["tasks_backup"] for w in pool.stats()["workers"])
            again[name] = (backups + m._flow_counts()[0] - before) / args.calls
        out = {"medians_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
               "run_again_per_call": again,
               "plans": {k: {"flows": n, "arena_mb": b / 2**20} for k, (n, b) in info.items()}}
        if args.describe:
            out["machine"] = machine_lines(pool, emu, "not used")
    print(json.dumps(out))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="mobilenet_v2", help="a network of "
                    "asymo.models.torchvision_defs (default mobilenet_v2)")
    ap.add_argument("--size", type=int, default=224, help="image size (default 224)")
    ap.add_argument("--emulate", default="1:0.5", help="cpu:speed,... (default 1:0.5; '' none)")
    ap.add_argument("--flows", default="16,0", help="FLOW_MAX_LAYERS values to compare, the "
                    "last the baseline (default 16,0)")
    ap.add_argument("--processes", type=int, default=6, help="processes (default 6)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds a process (default 8)")
    ap.add_argument("--calls", type=int, default=15, help="calls a round (default 15)")
    ap.add_argument("--json", help="write every process's medians here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--describe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        one_process(args)
        return
    runs = []
    for i in range(args.processes):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--net", args.net,
               "--size", str(args.size), "--emulate", args.emulate, "--flows", args.flows,
               "--rounds", str(args.rounds), "--calls", str(args.calls)]
        if i == 0:
            cmd.append("--describe")
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        run = json.loads(r.stdout.strip().splitlines()[-1])
        if i == 0:
            print("\n".join(run["machine"]))
            print(f"network {args.net} at {args.size} x {args.size}, batch 1; "
                  + "; ".join(f"{k}: {v['flows']} flows, arena {v['arena_mb']:.1f} MB"
                              for k, v in run["plans"].items()))
            print(f"method: {args.processes} processes, each {args.rounds} shuffled rounds of "
                  f"{args.calls} calls a variant; per process the median of its rounds; "
                  "x = the last flows variant's time / this one's (> 1: faster)")
        runs.append(run)
        med = run["medians_ms"]
        base = med[f"flows of {args.flows.split(',')[-1]}"]
        again = run["run_again_per_call"]
        print(f"process {i + 1}: " + " | ".join(
            f"{k} {v:.2f} ms x{base / v:.3f}"
            + (f" ({again[k]:.1f} tasks run again a call)" if k in again else "")
            for k, v in med.items()), flush=True)
    base_key = f"flows of {args.flows.split(',')[-1]}"
    ratios = {k: statistics.median(r["medians_ms"][base_key] / r["medians_ms"][k] for r in runs)
              for k in runs[0]["medians_ms"]}
    print("median over processes of the per-process ratio: "
          + " | ".join(f"{k} x{v:.3f}" for k, v in ratios.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
