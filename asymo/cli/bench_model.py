"""``asymo bench MODEL.onnx``: a network on asymo against ONNX Runtime and torch, fairly.

Each library runs the same model on the same input, on all cores and on the fastest core
alone (pinned, one thread), side by side in one process:

- medians over interleaved rounds (the order alternates each round, so drift and
  interference hit every library alike), each round ``--min-time`` seconds of back-to-back
  calls;
- thread counts and pinning are set before a library's round, never inside the timed loop;
- a pause (``PAUSE_S``) between libraries, because OpenMP / ONNX Runtime threads keep spinning
  for a while after a call and would steal the next library's cores;
- the machine, the threads and the emulation are printed beside the figures;
- the cost of moving cache lines between two cores is read before every repeat and after
  the last (:mod:`asymo.lab.transfer`: a buffer written across, and one line's round trip;
  under the emulator, which stops one of the two, only the fastest round trip): the
  development VM makes it several times dearer for tens of seconds at a time, when the host
  runs its vCPUs on cores that share no last-level cache, which slows every library's
  all-core runs; the repeats it marks are listed, with the ratios over the others
  (docs/emulation.md, "the VM's slow state").

The contenders: ``asymo`` (its pinned pool on all cores), ``asymo 1 core`` (a pool on the
fastest core), ``ort`` (ONNX Runtime, CPU provider, intra-op threads = cores),
``ort 1 core`` (one intra-op thread, caller pinned to the fastest core), ``torch`` (the
``nn.Module`` when one is given, else the same planned graph run by torch eager operators,
``torch.set_num_threads(cores)``) and ``torch 1 core`` (one thread, pinned).

:func:`compare` is also what ``bench/models.py`` and the demo call.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

__all__ = ["compare", "format_table", "machine_description", "Contender", "PAUSE_S",
           "LIBRARIES"]

PAUSE_S = 0.3
LIBRARIES = ("ort", "torch")
#: a round is marked as met by dearer transfers between cores when the probe beside it reads
#: this many times the run's cheapest: as a ratio to a local write, as the cross-core write's
#: own time, or as a cache line's round trip (asymo.lab.transfer; on the development VM the
#: round trip reads 50-90 ns or 310-360 ns, the write's ratio about 1.6-2x in both, and a
#: third state doubles both writes, 8.9 -> 17-18 us, at a ratio of 2x)
SLOW_TRANSFER_FACTOR = 1.6
#: another library's outputs agree with asymo's when max |other - asymo| / max |asymo| over
#: every output is at most this: float32 kernels summing in another order differ by ~1e-6,
#: a wrong operator by far more
AGREE_RTOL = 1e-3
#: a failing library's reason is cut to this many characters (ONNX Runtime's messages can
#: name every node of the graph)
REASON_CHARS = 300


class Contender:
    """One library in one configuration: ``call()`` is timed; ``enter()`` / ``leave()`` set
    and restore its threads and pinning around a round (outside the timed loop).
    ``other``: another library than asymo, whose failure to run the model is reported as a
    result of the benchmark (asymo's own failure is an error)."""

    def __init__(self, name, call, enter=None, leave=None, note="", other=False):
        self.name, self.call, self.note, self.other = name, call, note, other
        self.enter = enter or (lambda: None)
        self.leave = leave or (lambda: None)


def _reason(exc):
    """An exception as one line of at most REASON_CHARS characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def _pin_enter(cpu, state):
    def enter():
        state["aff"] = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})

    def leave():
        os.sched_setaffinity(0, state.pop("aff"))
    return enter, leave


def machine_description(pool, emulation):
    from asymo.hw.topology import cpu_model_name

    cpu = cpu_model_name()
    return {"cpu": cpu, "cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
            "pool_workers": pool.nworkers, "topology": pool.topology.to_spec(),
            "emulation": emulation or "none (symmetric machine)"}


def _contenders(model, x, compare, pool, single_pool, fast_cpu, onnx_bytes, torch_module,
                threads, failed):
    """The contenders for ``compare``; the libraries that cannot even load the model go to
    ``failed`` (name -> one-line reason) instead."""
    out = [Contender("asymo", lambda: model(x, pool=pool), note=f"{pool.nworkers} workers")]
    if single_pool is not None:
        st = {}
        e, lv = _pin_enter(fast_cpu, st)  # the caller runs tasks too: pin it with the pool
        out.append(Contender("asymo 1 core", lambda: model(x, pool=single_pool), e, lv,
                             note=f"pool and caller on cpu {fast_cpu}"))
    if "ort" in compare:
        try:
            import onnxruntime as ort
        except ImportError:
            ort = None
        if ort is not None and onnx_bytes is not None:
            def session(n):
                so = ort.SessionOptions()
                so.intra_op_num_threads = n
                so.inter_op_num_threads = 1
                so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                # a model it refuses is reported in the table, with ORT's reason: not also
                # in ORT's own log on stderr
                so.log_severity_level = 4
                return ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
            try:
                s_all, s_one = session(threads), session(1)
            # any error: ONNX Runtime refuses models asymo runs (an LRN of even size, ...),
            # which is that library not running the model, not a failed benchmark
            except Exception as exc:
                failed["ort"] = failed["ort 1 core"] = _reason(exc)
            else:
                iname = s_all.get_inputs()[0].name
                out.append(Contender("ort", lambda: s_all.run(None, {iname: x}),
                                     note=f"{threads} intra-op threads", other=True))
                st = {}
                e, lv = _pin_enter(fast_cpu, st)
                out.append(Contender("ort 1 core", lambda: s_one.run(None, {iname: x}), e, lv,
                                     note=f"1 thread pinned to cpu {fast_cpu}", other=True))
    if "torch" in compare:
        try:
            import torch
        except ImportError:
            torch = None
        runner = None
        if torch is not None and torch_module is None:
            from asymo.models.torch_graph import TorchGraphRunner

            try:
                runner = TorchGraphRunner(model)
            except Exception as exc:  # as ONNX Runtime's above: torch does not run the model
                failed["torch"] = failed["torch 1 core"] = _reason(exc)
                torch = None
        if torch is not None:
            if torch_module is not None:
                xt = torch.from_numpy(x)

                def run_torch():
                    with torch.inference_mode():
                        return torch_module(xt)
                what = "nn.Module"
            else:
                def run_torch():
                    return runner(x)
                what = "same graph, torch eager ops"
            state = {}

            def t_enter(n, cpu=None):
                def enter():
                    state["threads"] = torch.get_num_threads()
                    torch.set_num_threads(n)
                    if cpu is not None:
                        state["aff"] = os.sched_getaffinity(0)
                        os.sched_setaffinity(0, {cpu})
                return enter

            def t_leave():
                torch.set_num_threads(state.pop("threads"))
                if "aff" in state:
                    os.sched_setaffinity(0, state.pop("aff"))
            out.append(Contender("torch", run_torch, t_enter(threads), t_leave,
                                 note=f"{threads} threads, {what}", other=True))
            out.append(Contender("torch 1 core", run_torch, t_enter(1, fast_cpu), t_leave,
                                 note=f"1 thread pinned to cpu {fast_cpu}, {what}",
                                 other=True))
    return out


def _call(c, failed):
    """``c.call()`` between ``c.enter()`` and ``c.leave()``; when another library than asymo
    fails (ONNX Runtime refusing a batch its file fixes, ...), None, with the reason in
    ``failed``."""
    c.enter()
    try:
        return c.call()
    except Exception as exc:  # any error of another library: it did not run the model
        if not c.other:
            raise
        failed[c.name] = _reason(exc)
        return None
    finally:
        c.leave()


def _measure(contenders, repeats, min_time, pause, progress, probe=None, failed=None):
    """Medians and samples per contender; with ``probe`` (a callable), also its readings
    before each repeat and after the last (one more than ``repeats``). Another library whose
    warm-up call fails is left out of the rounds, with its reason in ``failed``."""
    failed = {} if failed is None else failed
    inner = {}
    for c in contenders:
        if _call(c, failed) is None and c.name in failed:  # warm-up: plans, arenas, sessions
            continue
        c.enter()
        try:
            t0 = time.perf_counter()
            c.call()
            dt = max(time.perf_counter() - t0, 1e-6)
        finally:
            c.leave()
        # capped: a huge --min-time over a fast call must not overflow int()
        inner[c.name] = max(1, int(min(min_time / dt, 1e12)))
        time.sleep(pause)
        if progress is not None:
            progress.update(1)
    contenders = [c for c in contenders if c.name in inner]
    samples = {c.name: [] for c in contenders}
    readings = []
    for r in range(repeats):
        if probe is not None:
            readings.append(probe())
        order = contenders if r % 2 == 0 else contenders[::-1]
        for c in order:
            c.enter()
            try:
                t0 = time.perf_counter()
                for _ in range(inner[c.name]):
                    c.call()
                samples[c.name].append((time.perf_counter() - t0) / inner[c.name])
            finally:
                c.leave()
            time.sleep(pause)
            if progress is not None:
                progress.update(1)
    if probe is not None:
        readings.append(probe())
    return {k: statistics.median(v) for k, v in samples.items()}, samples, readings


def _transfer_probe(pool, fast_cpu, emulation):
    """``(cpus, probe)``: a callable giving the cross-core transfer cost (a
    `asymo.lab.transfer.TransferCost`) between the fastest core and another core of ``pool``,
    or ``(None, None)`` where it means nothing (one core). Under the emulator only its
    fastest round trip means anything (`_transfer_summary`)."""
    other = [c for cl in pool.topology.clusters for c in cl.cpus if c != fast_cpu]
    if not other:
        return None, None
    try:
        from asymo.lab.transfer import transfer_cost

        transfer_cost(fast_cpu, other[0], reps=1)
    except (ImportError, OSError, ValueError):
        return None, None
    return (fast_cpu, other[0]), lambda: transfer_cost(fast_cpu, other[0])


def _transfer_summary(cpus, costs, samples, emulated=False):
    """The probe's readings (``costs``: `TransferCost` objects, one before each repeat and one
    after the last) and the repeats they mark: a repeat is marked when the reading before or
    after it is SLOW_TRANSFER_FACTOR times the run's lowest, as a ratio (``readings``), as
    the cross-core write's time (``cross_us``) or as a line's round trip (``round_trip_ns``,
    None when a reading lacks it). ``emulated``: the other core was stopped for part of each
    period, which makes every figure but the fastest round trip (``round_trip_min_ns``) a
    reading of the stops; the repeats are marked by that one alone. When both kinds of repeat
    occurred, the figures over each: the unmarked (``steady``) and the marked (``dear``)."""
    from asymo.lab.transfer import DEFAULT_BYTES

    readings = [c.ratio for c in costs]
    cross_us = [c.cross_s * 1e6 for c in costs]
    trips = ([c.round_trip_s * 1e9 for c in costs]
             if all(c.round_trip_s is not None for c in costs) else None)

    def dear(v, r):
        return v is not None and max(v[r], v[r + 1]) > SLOW_TRANSFER_FACTOR * min(v)

    fastest = ([c.round_trip_min_s * 1e9 for c in costs]
               if all(c.round_trip_min_s is not None for c in costs) else None)
    if emulated:
        marked = [r for r in range(len(costs) - 1) if dear(fastest, r)]
        out = {"cpus": list(cpus), "emulated": True, "round_trip_min_ns": fastest,
               "marked_repeats": marked}
    else:
        marked = [r for r in range(len(costs) - 1)
                  if dear(readings, r) or dear(cross_us, r) or dear(trips, r)]
        out = {"cpus": list(cpus), "nbytes": DEFAULT_BYTES, "readings": readings,
               "cross_us": cross_us, "round_trip_ns": trips, "round_trip_min_ns": fastest,
               "marked_repeats": marked}
    steady = [r for r in range(len(readings) - 1) if r not in marked]
    if marked and steady:
        for key, reps in (("steady", steady), ("dear", marked)):
            med = {k: statistics.median(v[r] for r in reps) for k, v in samples.items()}
            out[key] = {"repeats": reps, "seconds": med, **_versus(med)}
    return out


def _versus(med):
    """``ratio`` (each other contender's time / asymo's), ``best_other`` (the fastest library
    other than asymo, all cores or one core) and ``vs_best_other`` from median seconds."""
    ta = med["asymo"]
    others = {k: v for k, v in med.items() if not k.startswith("asymo")}
    best = min(others, key=others.get) if others else None
    return {"ratio": {k: v / ta for k, v in med.items() if k != "asymo"}, "best_other": best,
            "vs_best_other": (others[best] / ta) if best else None}


def compare(model, x, *, compare=LIBRARIES, onnx_bytes=None, torch_module=None, pool=None,
            emulation=None, repeats=5, min_time=0.3, pause=PAUSE_S, progress=True,
            label=None):
    """Time ``model`` (a GraphModel) on ``x`` against the libraries in ``compare``.

    Returns a dict: the machine, per contender the median seconds per call and the samples,
    and the ratios ``other / asymo`` (> 1: asymo faster), including against the best of the
    other libraries on all cores or one core (``best_other``); ``failed``, the contenders of
    another library that could not load or run the model (name -> one-line reason; they are
    left out of the figures); ``max_rel_diff_vs_asymo``, per contender the largest
    ``max |other - asymo| / max |asymo|`` over every output (None: outputs of another number
    or size), which agrees within ``agreement_rtol``; ``output_shapes``, one per output
    (``output_shape``: the first's)."""
    import asymo
    from asymo.hw.topology import Cluster, Topology

    failed = {}
    own_pool = pool is None
    pool = asymo.Pool() if own_pool else pool
    fast = pool.topology.clusters[0]
    fast_cpu = fast.cpus[0]
    single = None
    if pool.nworkers > 1:
        single = asymo.Pool(topology=Topology(clusters=(Cluster(fast.name, (fast_cpu,),
                                                                capacity=1.0),)))
    threads = pool.nworkers
    bar = None
    try:
        cons = _contenders(model, x, tuple(compare), pool, single, fast_cpu, onnx_bytes,
                           torch_module, threads, failed)
        if progress:
            try:
                from tqdm import tqdm

                bar = tqdm(total=len(cons) * (repeats + 1), desc=label or model.name,
                           leave=False, unit="round")
            except ImportError:  # pragma: no cover - tqdm is a core dependency
                bar = None
        # a model on several clusters first times its nodes on all of them and on the fastest
        # alone (GraphModel.cluster_choice): settled before the timed rounds, like a warm-up
        from asymo.models.graph_model import CHOICE_MAX_CALLS

        clusters = None
        if hasattr(model, "chosen_clusters"):
            # the other libraries' threads (the previous model's last calls) must have
            # stopped spinning, or they slow the calls that decide, on all clusters most
            time.sleep(pause)
            for _ in range(CHOICE_MAX_CALLS):
                if model.chosen_clusters(pool, x.shape[0])["choice"] != "measuring":
                    break
                model(x, pool=pool)
            clusters = model.chosen_clusters(pool, x.shape[0])
        cpus, probe = _transfer_probe(pool, fast_cpu, emulation)
        # asymo's calls in the timed rounds (and their warm-ups), for the backups per call
        calls = [0]
        call = cons[0].call

        def counted():
            calls[0] += 1
            return call()
        cons[0].call = counted
        pool.reset_stats()
        med, samples, readings = _measure(cons, repeats, min_time, pause, bar, probe,
                                          failed)
        cons[0].call = call
        backups = _backups(pool, calls[0])
        # (a decided choice is checked again during the rounds: GraphModel's _Choice.observe)
        clusters_end = (model.chosen_clusters(pool, x.shape[0]) if clusters is not None
                        else None)
        # check the results agree (a wrong answer is no benchmark), every output
        refs = _outputs(model(x, pool=pool))
        diffs = {}
        for c in cons:
            if c.name in failed:
                continue
            y = _call(c, failed)
            if c.name not in failed:
                diffs[c.name] = _rel_diff(_outputs(y), refs)
        notes = {c.name: c.note for c in cons}
    finally:
        if bar is not None:
            bar.close()
        if single is not None:
            single.close()
        if own_pool:
            pool.close()
    return {
        "model": label or model.name, "batch": int(x.shape[0]),
        "input_shape": list(x.shape), "gflop": model.flops * x.shape[0] / 1e9,
        "machine": machine_description(pool, emulation),
        "method": f"medians of {repeats} interleaved rounds of >= {min_time:g} s, "
                  f"{pause:g} s pause between libraries, threads and pinning set outside "
                  "the timed loops",
        "seconds": med, "samples": samples, "notes": notes, **_versus(med),
        "output_shape": list(refs[0].shape),
        "output_shapes": [list(r.shape) for r in refs],
        "max_rel_diff_vs_asymo": diffs, "agreement_rtol": AGREE_RTOL,
        "failed": failed,
        "asymo_clusters": clusters,
        "asymo_clusters_end": clusters_end,
        "asymo_backups": backups,
        "transfer": (_transfer_summary(cpus, readings, samples, emulated=emulation is not None)
                     if readings else None),
    }


def _outputs(y):
    """A library's result (an array or tensor, or a tuple or list of them: one per model
    output) as a list of NumPy arrays."""
    ys = list(y) if isinstance(y, (list, tuple)) else [y]
    return [v.numpy() if hasattr(v, "numpy") else np.asarray(v) for v in ys]


def _rel_diff(ys, refs):
    """The largest `asymo.models.reference.relative_error` over the outputs (NaN and
    infinity must sit where asymo's are); None when the outputs cannot be compared (another
    count of outputs, or of elements)."""
    from asymo.models.reference import relative_error

    if len(ys) != len(refs) or any(y.size != ref.size for y, ref in zip(ys, refs)):
        return None
    return max((relative_error(y.reshape(ref.shape), ref) for y, ref in zip(ys, refs)
                if ref.size), default=0.0)


def _agreement_lines(r, indent):
    """The lines saying whether the other libraries' outputs agree with asymo's (within the
    result's ``agreement_rtol``) and which libraries did not run the model."""
    lines = []
    failed = r.get("failed") or {}
    for k, why in failed.items():
        base = k[:-len(" 1 core")] if k.endswith(" 1 core") else None
        if base is not None and failed.get(base) == why:
            continue  # said once, for the library on all cores
        lines.append(f"{indent}{k} did not run the model: {why}")
    diffs = r.get("max_rel_diff_vs_asymo") or {}
    if not diffs:
        return lines
    tol = r.get("agreement_rtol", AGREE_RTOL)
    differ = {k: v for k, v in diffs.items() if not (v is not None and v <= tol)}
    if differ:
        what = ", ".join(f"{k} {v:.1e}" if v is not None
                         else f"{k} (another number or size of outputs)"
                         for k, v in differ.items())
        lines.append(f"{indent}outputs DIFFER from asymo's by more than {tol:g} (max |other - "
                     f"asymo| / max |asymo|): {what}")
    else:
        worst = max(diffs.values())
        lines.append(f"{indent}outputs agree within {tol:g}: max |other - asymo| / "
                     f"max |asymo| = {worst:.1e}")
    return lines


def _backups(pool, calls):
    """What backup tasks did during ``calls`` calls of asymo on ``pool`` (pools of several
    clusters; None otherwise): tasks run again on the submitter's core because the core
    holding them had stopped, and the late copies that finished after them, per call
    (measured: the pool's counters)."""
    if pool.nclusters < 2 or calls < 1:
        return None
    st = pool.stats()["workers"]
    backup = sum(w["tasks_backup"] for w in st)
    late = sum(w["tasks_superseded"] for w in st)
    return {"calls": calls, "tasks_backup": backup, "tasks_superseded": late,
            "backups_per_call": backup / calls, "superseded_per_call": late / calls}


def format_table(results):
    """Text table of :func:`compare` results (one or several models)."""
    from asymo.models.graph_model import CHOICE_REFRESH_S

    if isinstance(results, dict):
        results = [results]
    names = []
    for r in results:
        for k in list(r["seconds"]) + list(r.get("failed") or {}):
            if k not in names:
                names.append(k)
    m = results[0]["machine"]
    lines = [f"machine: {m['cpu']}, {m['cpus']} cpus, affinity {m['affinity']}; asymo pool "
             f"{m['pool_workers']} workers ({m['topology']})",
             f"emulation: {m['emulation']}",
             f"method: {results[0]['method']}",
             "ms per batch; x = other / asymo (> 1: asymo faster); 'best' = the fastest of the "
             "other libraries, all cores or one core"]
    head = f"{'model':<18}{'GFLOP':>6}" + "".join(f"{n:>14}" for n in names) + \
        f"{'vs best':>16}"
    lines.append(head)
    for r in results:
        row = f"{r['model']:<18}{r['gflop']:>6.2f}"
        for n in names:
            v = r["seconds"].get(n)
            failed = n in (r.get("failed") or {})
            row += f"{v * 1e3:>14.2f}" if v else f"{'failed' if failed else '-':>14}"
        if r["best_other"]:
            row += f"{r['vs_best_other']:>8.2f}x {r['best_other']}"
        lines.append(row)
        ratios = "  ".join(f"{k} {v:.2f}x" for k, v in r["ratio"].items())
        lines.append(f"{'':<18}{ratios}")
        lines.extend(_agreement_lines(r, " " * 18))
        cl = r.get("asymo_clusters") or {}
        if cl.get("all_s") and cl.get("fastest_s"):
            where = {"all": "on all clusters", "fastest": "on the fastest cluster alone",
                     "per node": f"{cl['nodes_on_fastest']} nodes on the fastest cluster "
                                 "alone, the rest on all"}.get(cl["choice"],
                                                               "while still measuring")
            mix = (f", per node {cl['per_node_s'] * 1e3:.2f} ms" if cl.get("per_node_s")
                   else "")
            lines.append(f"{'':<18}asymo ran {where} (median of its first calls: all "
                         f"clusters {cl['all_s'] * 1e3:.2f} ms, fastest alone "
                         f"{cl['fastest_s'] * 1e3:.2f} ms{mix})")
        bk = r.get("asymo_backups")
        if bk:
            lines.append(f"{'':<18}backup tasks: {bk['backups_per_call']:.1f} per call run "
                         f"again on the fast core, {bk['superseded_per_call']:.1f} late copies "
                         f"(measured over asymo's {bk['calls']} calls)")
        tr = r.get("transfer")
        if tr and tr.get("emulated"):
            a, b = tr["cpus"]
            lines.append(f"{'':<18}a cache line's fastest round trip between cpus {a} and {b} "
                         "(the emulator stops one of them; asymo.lab.transfer): "
                         + " ".join(f"{v:.0f}" for v in tr["round_trip_min_ns"])
                         + " ns, beside the repeats")
        elif tr:
            a, b = tr["cpus"]
            cross = tr.get("cross_us") or [None] * len(tr["readings"])
            lines.append(f"{'':<18}cross-core writes (cpu {a} -> {b}, {tr['nbytes'] // 1024} "
                         f"KiB, asymo.lab.transfer): "
                         + " ".join(f"{v:.1f}x" + (f" ({us:.1f} us)" if us is not None else "")
                                    for v, us in zip(tr["readings"], cross))
                         + " a local write, beside the repeats")
            if tr.get("round_trip_ns"):
                lines.append(f"{'':<18}a cache line's round trip between them: "
                             + " ".join(f"{v:.0f}" for v in tr["round_trip_ns"]) + " ns")
        if tr and tr["marked_repeats"]:
            st, dear = tr.get("steady"), tr.get("dear")

            def ratios(fig):
                return "  ".join(f"{k} {v:.2f}x" for k, v in fig["ratio"].items())
            mk = ", ".join(str(i + 1) for i in tr["marked_repeats"])
            tail = (f": without them {ratios(st)}; in them alone {ratios(dear)}"
                    if st else "")
            what = ("fastest round trip" if tr.get("emulated") else
                    "lowest ratio, cross-core time or round trip")
            lines.append(f"{'':<18}repeat(s) {mk} met dearer transfers (>= "
                         f"{SLOW_TRANSFER_FACTOR:g}x the run's {what}){tail}")
        end = r.get("asymo_clusters_end") or {}
        if end.get("rechecks") or end.get("refreshes"):
            again = []
            if end.get("rechecks"):
                again.append(f"found slower than another and measured again "
                             f"{end['rechecks']} time(s)")
            if end.get("refreshes"):
                again.append(f"measured again on schedule {end['refreshes']} time(s) (every "
                             f"{CHOICE_REFRESH_S:g} s)")
            lines.append(f"{'':<18}during the timed rounds the choice was "
                         f"{' and '.join(again)}; at the end: {end['choice']}")
    return "\n".join(lines)


def plot(results, path):
    """A grouped bar chart of the milliseconds (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(results, dict):
        results = [results]
    names = list(results[0]["seconds"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results) * len(names) / 3), 4))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(results))]
        ax.bar(xs, [1e3 * r["seconds"].get(n, 0) for r in results], width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(results))])
    ax.set_xticklabels([r["model"] for r in results])
    ax.set_ylabel("ms per batch (lower is better)")
    ax.set_title(f"emulation: {results[0]['machine']['emulation']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
