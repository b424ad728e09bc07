"""Max / average pooling layers of the zoo CNNs: asymo vs torch, and optionally vs an earlier
asymo build, side by side in one process, on the fast core alone and on all cores.

"before" (``--before-so`` and ``--before-py``) is an older asymo: its compiled ``_native``
module (loaded beside the current one under another package name) and its
``asymo/ops/pooling.py`` source (run with its kernel taken from that module and the tasks
submitted to the current pool, which both builds share). So the comparison covers the C
kernel and the Python entry both. Make them from a checkout of the older commit:

    cp asymo/_native*.so /tmp/before/ && git show REV:asymo/ops/pooling.py > /tmp/before/pooling.py
    flock /tmp/asymo-bench.lock python3 bench/pooling.py \\
        --before-so /tmp/before/_native.cpython-311-x86_64-linux-gnu.so --before-py /tmp/before/pooling.py

"1core" pins the caller to the first cpu, asymo on a one-worker pool there, torch one thread;
"all" uses every core (asymo's default pool, torch as many threads). Times are medians of
alternating rounds (``side_by_side``).
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _convbench import machine_lines, side_by_side  # noqa: E402

# (label, kind, shape, kernel, stride, padding, ceil_mode)
LAYERS = [
    ("googlenet 7x7", "max", (1, 832, 7, 7), 3, 1, 1, True),
    ("googlenet 14x14", "max", (1, 512, 14, 14), 3, 1, 1, True),
    ("googlenet 28x28", "max", (1, 256, 28, 28), 3, 1, 1, True),
    ("googlenet 112/2", "max", (1, 64, 112, 112), 3, 2, 0, True),
    ("alexnet-ish 111/2", "max", (1, 64, 111, 111), 3, 2, 0, True),
    ("incept. avg 17x17", "avg", (1, 768, 17, 17), 3, 1, 1, False),
    ("squeezenet gap", "gap", (1, 1000, 13, 13), 13, 1, 0, False),
    ("mobilenet2 gap", "gap", (1, 1280, 7, 7), 7, 1, 0, False),
]


def load_before(so_path, py_path):
    """The older pooling entry points (max_pool2d, avg_pool2d) over the older kernel."""
    from asymo.runtime import tasks
    from asymo.runtime.ffi import ffi

    # the module's init function is named after the last part of its name: keep "_native"
    name = "asymo_before_build._native"
    loader = importlib.machinery.ExtensionFileLoader(name, so_path)
    spec = importlib.util.spec_from_file_location(name, so_path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    old_ffi, old_lib = mod.ffi, mod.lib
    ns = {"__name__": "asymo_before_pooling"}
    with open(py_path) as f:
        exec(compile(f.read(), py_path, "exec"), ns)
    fn_type = "void (*)(int64_t, void *)"

    def task_fn(fname):
        addr = int(old_ffi.cast("uintptr_t", old_ffi.addressof(old_lib, fname)))
        return ffi.cast(fn_type, addr)

    def run_tasks(pool, fn, job, ntasks, counts=None, *, inline=False):
        job = ffi.cast("void *", int(old_ffi.cast("uintptr_t", job)))
        return tasks.run_tasks(pool, fn, job, ntasks, counts, inline=inline)

    ns.update(ffi=old_ffi, task_fn=task_fn, run_tasks=run_tasks)
    return ns["max_pool2d"], ns["avg_pool2d"]


def layer_fns(layer, x, pool, before, torch):
    import asymo

    _, kind, shape, k, s, p, ceil = layer
    if kind == "gap":
        fns = {"asymo": lambda: asymo.avg_pool2d(x, shape[2:], 1, pool=pool)}
        if before:
            fns["before"] = lambda: before[1](x, shape[2:], 1, pool=pool)
        if torch:
            xt = torch.from_numpy(x)
            fns["torch"] = lambda: torch.nn.functional.adaptive_avg_pool2d(xt, 1)
        return fns
    a_fn = asymo.max_pool2d if kind == "max" else asymo.avg_pool2d
    fns = {"asymo": lambda: a_fn(x, k, s, p, ceil_mode=ceil, pool=pool)}
    if before:
        b_fn = before[0] if kind == "max" else before[1]
        fns["before"] = lambda: b_fn(x, k, s, p, ceil_mode=ceil, pool=pool)
    if torch:
        xt = torch.from_numpy(x)
        t_fn = torch.nn.functional.max_pool2d if kind == "max" else \
            torch.nn.functional.avg_pool2d
        fns["torch"] = lambda: t_fn(xt, k, s, p, ceil_mode=ceil)
    return fns


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-so", default=None)
    parser.add_argument("--before-py", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.03)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)

    import asymo

    try:
        import torch
    except ImportError:  # torch is optional
        torch = None
    before = load_before(args.before_so, args.before_py) if args.before_so else None
    cpus = sorted(os.sched_getaffinity(0))
    fast = cpus[0]
    pool = asymo.Pool()
    pool_one = asymo.Pool(f"fast:{fast}", spin_us=0)
    try:
        for line in machine_lines(pool, None, pool.nworkers if torch else None):
            print(line)
        print(f"{args.dtype}, batch 1, medians of {args.repeats} alternating rounds; "
              "times in ms; speedup = before / asymo")
        libs = ["before"] * bool(before) + ["asymo"] + ["torch"] * bool(torch)
        head = " ".join(f"{lib + c:>9}" for c in ("1", "N") for lib in libs)
        print(f"{'layer':<18} {'shape':<16} {'op':<10} {head}  {'x1':>6} {'xN':>6}")
        rng = np.random.default_rng(0)
        for layer in LAYERS:
            label, kind, shape, k, s, p, ceil = layer
            x = rng.standard_normal(shape).astype(args.dtype)
            times = {}
            for config in ("1", "N"):
                threads = 1 if config == "1" else pool.nworkers
                fns = layer_fns(layer, x, pool_one if config == "1" else pool, before, torch)
                if config == "1":
                    os.sched_setaffinity(0, {fast})
                try:
                    if torch is not None:
                        torch.set_num_threads(threads)
                    t = side_by_side(fns, args.repeats, args.min_time, args.pause)
                finally:
                    os.sched_setaffinity(0, set(cpus))
                times.update({(lib, config): v for lib, v in t.items()})
            cols = " ".join(f"{times[(lib, c)] * 1e3:>9.4f}" for c in ("1", "N") for lib in libs)
            sp = ""
            if before:
                sp = " ".join(f"{times[('before', c)] / times[('asymo', c)]:>5.2f}x"
                              for c in ("1", "N"))
            op = f"{kind} {k}/{s}/{p}{'c' if ceil else ''}"
            print(f"{label:<18} {'x'.join(map(str, shape[1:])):<16} {op:<10} {cols}  {sp}",
                  flush=True)
    finally:
        pool.close()
        pool_one.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
