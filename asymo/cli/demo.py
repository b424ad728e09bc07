"""``asymo demo``: a short side-by-side run of asymo against NumPy (and torch when installed).

Everything printed is measured in this run, on this machine, with the thread counts shown; run
it under ``asymo emulate --core 1 --speed 0.5 -- asymo demo`` to see the asymmetric case.
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np


def register(sub):
    p = sub.add_parser(
        "demo", help="measure asymo vs NumPy/torch on a few DL shapes (about 30 s)",
        description="Measure asymo.matmul and asymo.conv2d against NumPy (and torch when "
                    "installed) on this machine, side by side, and print the ratios. Run it "
                    "under `asymo emulate --core 1 --speed 0.5 --` to emulate a slow core.")
    p.add_argument("--repeats", type=int, default=15, help="timed repeats per contender "
                   "(median reported; default 15)")
    p.add_argument("--network", default="resnet18", metavar="NAME",
                   help="torchvision-style network run end to end against ONNX Runtime and "
                        "torch (default resnet18; 'none' to skip; needs torch)")
    p.set_defaults(func=run)


def _median_time(fn, repeats):
    fn()  # warm-up: plans, packing buffers, BLAS thread start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run(args):
    if args.repeats < 1:
        raise SystemExit("asymo demo: --repeats must be >= 1")
    from threadpoolctl import threadpool_limits

    import asymo
    from asymo.hw.topology import Cluster, Topology

    pool = asymo.get_pool()
    topo = pool.topology
    ncores = pool.nworkers
    fast = Topology(clusters=(Cluster("fast", (topo.clusters[0].cpus[0],)),), source="override")
    emulated = ", ".join(f"cpu{c} at {s:g}" for c, s in sorted(topo.emulated.items()))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
          f"asymo pool: {ncores} workers on {topo.to_spec()}")
    print("emulation: " + (emulated + " (emulates speed, not cache size)" if emulated
                           else "none (symmetric cores)"))
    print(f"timings: median of {args.repeats} runs; NumPy/torch limited to {ncores} threads\n")

    rng = np.random.default_rng(0)
    rows = []
    with asymo.Pool(fast) as fast_pool, threadpool_limits(ncores):
        for M, K, N in ((784, 1152, 128), (3136, 576, 64), (1, 4096, 4096)):
            a = rng.standard_normal((M, K), dtype=np.float32)
            b = rng.standard_normal((K, N), dtype=np.float32)
            t_np = _median_time(lambda: np.matmul(a, b), args.repeats)
            t_as = _median_time(lambda: asymo.matmul(a, b), args.repeats)
            t_fast = _median_time(lambda: asymo.matmul(a, b, pool=fast_pool), args.repeats)
            err = float(np.max(np.abs(asymo.matmul(a, b) - a @ b)))
            rows.append((f"matmul {M}x{K}x{N} f32", 2.0 * M * K * N, t_as, t_np, t_fast, err))

        x = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
        w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
        t_as = _median_time(lambda: asymo.conv2d(x, w, padding=1), args.repeats)
        t_fast = _median_time(lambda: asymo.conv2d(x, w, padding=1, pool=fast_pool),
                              args.repeats)
        t_torch, err, torch_note = None, float("nan"), ""
        try:
            import torch
            torch.set_num_threads(ncores)
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            with torch.no_grad():
                t_torch = _median_time(lambda: torch.nn.functional.conv2d(xt, wt, padding=1),
                                       args.repeats)
                ref = torch.nn.functional.conv2d(xt, wt, padding=1).numpy()
            err = float(np.max(np.abs(asymo.conv2d(x, w, padding=1) - ref)))
        except ImportError:
            # still checked, against a float64 NumPy convolution over sliding windows
            xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
            win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
            ref = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))
            err = float(np.max(np.abs(asymo.conv2d(x, w, padding=1) - ref)))
            torch_note = (" (torch is not installed here: n/a; conv2d's error is against "
                          "a float64 NumPy convolution)")
        rows.append(("conv2d 3x3 64->64 56x56", 2.0 * 64 * 64 * 9 * 56 * 56, t_as, t_torch,
                     t_fast, err))

    print(f"{'operation':<26}{'asymo GFLOP/s':>14}{'vs baseline':>13}{'vs fast core':>14}"
          f"{'max |err|':>11}")
    for name, flops, t_as, t_base, t_fast, err in rows:
        base = f"{t_base / t_as:.2f}x" if t_base else "n/a"
        print(f"{name:<26}{flops / t_as / 1e9:>14.1f}{base:>13}{t_fast / t_as:>13.2f}x"
              f"{err:>11.1e}")
    print("\nbaseline: numpy.matmul (OpenBLAS) for matmul, torch conv2d for conv2d"
          f"{torch_note}; fast core: asymo on the fastest core alone")
    if args.network != "none":
        network_demo(args.network)
    return 0


def network_demo(name, *, size=224, repeats=3, min_time=0.2):
    """A real network end to end: built from torchvision-style definitions, exported to ONNX
    (in memory), loaded with asymo.from_onnx, timed against ONNX Runtime and torch."""
    try:
        import torch

        from asymo.models import torchvision_defs as tv
    except ImportError:
        print(f"\nnetwork {name}: skipped (needs torch for the network definition and the "
              "ONNX export)")
        return None
    import asymo
    from asymo.cli.bench_model import compare, format_table
    from asymo.models.reference import relative_error
    from asymo.models.torch_loader import export_onnx_bytes

    net = tv.build(name)
    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    data = export_onnx_bytes(net, torch.from_numpy(x))
    t0 = time.perf_counter()
    model = asymo.from_onnx(data, name=name)
    y = model(x)
    t_load = time.perf_counter() - t0
    with torch.inference_mode():
        ref = net(torch.from_numpy(x)).numpy()
    err = relative_error(y, ref)
    topo = asymo.get_pool().topology
    emu = ", ".join(f"cpu{c} at {s:g}" for c, s in sorted(topo.emulated.items()))
    print(f"\nnetwork {name} ({size}x{size}, batch 1): ONNX to first result "
          f"{t_load * 1e3:.0f} ms; max |asymo - torch| / max |torch| = {err:.1e}")
    res = compare(model, x, onnx_bytes=data, torch_module=net, repeats=repeats,
                  min_time=min_time, label=name,
                  emulation=(emu + " (emulated: speed, not cache size)") if emu else None)
    print(format_table(res))
    print("how to read it: ms per image, lower is better; each 'x' is that library's time / "
          "asymo's time, so above 1.00x asymo is faster; 'vs best' puts asymo against the "
          "fastest of ONNX Runtime and torch, whether on all cores or on the fast core alone.")
    return res
