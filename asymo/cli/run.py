"""``asymo run MODEL.onnx``: load an ONNX model, run it, and say how long it took."""
from __future__ import annotations

import collections
import statistics
import sys
import time

import numpy as np

#: The largest --input .npy file read.
MAX_INPUT_BYTES = 1 << 30


def register(sub):
    p = sub.add_parser(
        "run", help="run an ONNX model on asymo (load time, latency, top classes)",
        description="Load MODEL.onnx with asymo.from_onnx (operators checked, BatchNorm "
                    "folded, epilogues fused, arena planned), run it on --input (a .npy "
                    "array, NCHW float32) or on a random batch, and print the load time, the "
                    "time to the first result, the median latency of --repeats calls and the "
                    "top classes of the first image.")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--input", default=None, metavar="FILE.npy",
                   help="input array (.npy, float32, (N,) + the model's input shape); "
                        "default: random normal")
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="batch size of the random input (default 1)")
    p.add_argument("--repeats", type=int, default=10, metavar="N",
                   help="timed calls after the first (default 10)")
    p.add_argument("--output", default=None, metavar="FILE.npy",
                   help="write the first output there")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def load_input(path):
    """The ``--input`` array; an unreadable file becomes a one-line exit message."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError as exc:
        raise SystemExit(f"asymo run: cannot read --input {path!r}: "
                         f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SystemExit(f"asymo run: --input {path!r} is not a regular file")
    if st.st_size > MAX_INPUT_BYTES:
        raise SystemExit(f"asymo run: --input {path!r} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"asymo run: cannot read --input {path!r}: {exc}") from None


def random_input(model, batch, prog):
    """A random normal float32 batch of ``batch`` inputs of ``model``; one that does not fit
    in memory is a one-line exit message naming ``prog`` (the subcommand), not NumPy's
    traceback."""
    from asymo.cli.options import random_frames

    try:
        x, = random_frames(np.random.default_rng(0), [("--batch", batch)], model.input_shape)
    except ValueError as exc:
        raise SystemExit(f"{prog}: error: {exc}") from None
    return x


def first_call(model, x, prog):
    """``model(x)``, with what asymo refuses to run (several inputs, a wrong shape or dtype,
    no memory for the batch) as a one-line exit message."""
    try:
        return model(x)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"{prog}: {exc}") from None
    except MemoryError:
        raise SystemExit(f"{prog}: error: a batch of {x.shape[0]} does not fit in memory "
                         f"(input {tuple(x.shape)})") from None


def load_onnx(path):
    """``(model, seconds)``; errors become a one-line exit message."""
    import asymo
    from asymo.models.graph import GraphError

    t0 = time.perf_counter()
    try:
        m = asymo.from_onnx(path)
    except (GraphError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"asymo: {exc}") from None
    return m, time.perf_counter() - t0


def top_classes(y, unbatched, k=5):
    """``[[class, score], ...]``: the ``k`` best classes of the first image, or None when the
    output is not ``(N, classes)`` with several classes (an unbatched input's output is
    ``(classes,)``): a top-k of a feature map or of one score per image means nothing."""
    scores = np.asarray(y)
    if unbatched:
        scores = scores[None]
    if scores.ndim != 2 or scores.shape[1] < 2:
        return None
    first = scores[0]
    return [[int(i), float(first[i])] for i in np.argsort(first)[::-1][:k]]


def run(args):
    from asymo.cli.options import check_output, json_text

    if args.batch < 1 or args.repeats < 0:
        raise SystemExit("asymo run: --batch must be >= 1 and --repeats >= 0")
    if args.output is not None:
        try:  # before the model is loaded and run, not after
            check_output(args.output, "--output")
        except ValueError as exc:
            raise SystemExit(f"asymo run: error: {exc}") from None
    t_start = time.perf_counter()
    model, t_load = load_onnx(args.model)
    if args.input:
        x = load_input(args.input)
    else:
        x = random_input(model, args.batch, "asymo run")
    y = first_call(model, x, "asymo run")
    t_first = time.perf_counter() - t_start
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - t0)
    y0 = y[0] if isinstance(y, tuple) else y
    if args.output:
        try:
            np.save(args.output, y0)
        except OSError as exc:  # the path was checked before the run; this changed since
            raise SystemExit(f"asymo run: error: cannot write --output {args.output}: "
                             f"{exc.strerror or exc}") from None
    # the model accepts one image without the batch dimension (GraphModel._as_input): its
    # first dimension is then a channel, not the batch
    unbatched = x.ndim == len(model.input_shape)
    images = 1 if unbatched else x.shape[0]
    top = top_classes(y0, unbatched)
    from asymo.runtime.pool import get_pool

    pool = model.pool if model.pool is not None else get_pool()
    plan = model.plan(images, backups=pool.nclusters > 1)  # the arena its calls used
    paths = collections.Counter(k.split(":", 1)[1] for k in plan.kernels.values()
                                if k.startswith("conv2d:"))
    res = {"model": model.name, "input_shape": list(x.shape), "unbatched": unbatched,
           "images": images, "output_shape": list(y0.shape),
           "load_s": t_load, "first_result_s": t_first,
           "median_s": statistics.median(times) if times else None,
           "nodes": len(model.source_graph.nodes), "planned_nodes": len(model.graph.nodes),
           "rewrites": len(model.rewrites), "arena_bytes": plan.arena_bytes,
           "gflop": model.flops * images / 1e9, "conv_paths": dict(paths),
           "top5": top}
    if args.json:
        print(json_text(res))
        return 0
    out = sys.stdout
    print(f"{model.name}: input {tuple(x.shape)}"
          + (" (one image, no batch dimension)" if unbatched else "")
          + f" -> output {tuple(y0.shape)}, {res['gflop']:.3f} GFLOP", file=out)
    print(f"graph: {res['nodes']} nodes, {res['planned_nodes']} after planning "
          f"({res['rewrites']} rewrites), arena {plan.arena_bytes / 1e6:.2f} MB "
          f"(one buffer per tensor: {plan.naive_bytes / 1e6:.2f} MB)", file=out)
    if paths:
        print("convolutions: " + ", ".join(f"{n} {p}" for p, n in paths.most_common()),
              file=out)
    print(f"load {t_load * 1e3:.1f} ms, file to first result {t_first * 1e3:.1f} ms", file=out)
    if times:
        print(f"median latency {statistics.median(times) * 1e3:.2f} ms over {len(times)} calls",
              file=out)
    if top is not None:
        print("top-5 of image 0: " + ", ".join(f"{i} ({v:.3g})" for i, v in top), file=out)
    return 0
