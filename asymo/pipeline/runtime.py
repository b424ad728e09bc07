"""Running a CNN as a pipeline of cluster-local stages, and the two baselines.

``Pipeline``: stage ``i`` owns an ``asymo.Pool`` on its own cores (cores of one cluster, as
Pipe-it requires) and a thread pinned to the same cores that takes frames from a bounded queue,
runs ``model.run_layers(x, first, last, pool=stage_pool)`` and hands the activation to the next
stage's queue. Several frames are in flight (one per stage plus the queued ones); the weights
are the model's own, shared by all stages; outputs come out in input order (every stage is one
FIFO thread). An exception in any stage stops the pipeline and is re-raised to the caller with
a note naming the stage and frame; every wait has a timeout, so nothing hangs, and ``close``
(or leaving the ``with`` block) joins the threads and closes the pools on every exit path. A
run that fails, times out or is abandoned (a ``stream`` not read to the end) closes the
pipeline: frames in flight cannot leak into a later run.

Each frame carries the index of the next layer it needs; stage ``i`` runs layers up to its
current boundary ``bounds[i]``. That makes ``repartition`` safe while frames are in flight (a
frame that already went past a moved boundary is simply finished by the next stage), which is
what online tuning (``asymo.pipeline.tuning``) needs.

Baselines with the same interface (``run(frames) -> (outputs, RunStats)``):

- ``KernelLevel``: every layer on all cores, one pool, one frame at a time (Pipe-it's
  "Kernel-level", here with asymo's capacity-aware split inside each operation).
- ``ParallelFrames``: paper 001's non-pipelined parallel design: one pool and one thread per
  cluster, each running whole frames; outputs reordered to input order.
"""
from __future__ import annotations

import contextlib
import math
import os
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from asymo.hw.topology import Cluster, Topology

__all__ = ["Pipeline", "KernelLevel", "ParallelFrames", "RunStats", "PipelineError",
           "sub_topology", "as_frames", "run_in_thread"]

_POLL = 0.05  # s: how often blocked threads look at the stop / failure flags
# Idle pool workers of a stage do not spin: the stage thread shares their cores, and a spinning
# worker delays the stage's own Python work between operations (docs/tuning.md).
STAGE_SPIN_US = 0


class PipelineError(RuntimeError):
    """The pipeline could not run (it was closed, timed out, or a stage thread is stuck)."""


@dataclass
class RunStats:
    """What one run measured (all times in seconds)."""

    frames: int
    wall: float
    throughput: float            # images/s at which results come out (steady state)
    wall_throughput: float       # frames / wall time, pipeline fill included
    latency: float               # median time from a frame's first stage start to its output
    latency_p90: float
    stage_busy: list = field(default_factory=list)         # per stage: time spent computing
    stage_utilisation: list = field(default_factory=list)  # busy / measured window
    stage_time: list = field(default_factory=list)         # mean compute time per frame

    def to_dict(self):
        return {"frames": self.frames, "wall_s": self.wall, "throughput": self.throughput,
                "wall_throughput": self.wall_throughput, "latency_s": self.latency,
                "latency_p90_s": self.latency_p90,
                "stage_busy_s": list(self.stage_busy),
                "stage_utilisation": list(self.stage_utilisation),
                "stage_time_s": list(self.stage_time)}


def _groups_rate(done, busy):
    """Frames/s of groups running whole frames side by side: per group, its finished frames'
    spacing (``done``: its finish times) or, with one frame, its busy time per frame."""
    rate = 0.0
    for ts, b in zip(done, busy):
        if len(ts) >= 2 and ts[-1] > ts[0]:
            rate += (len(ts) - 1) / (ts[-1] - ts[0])
        elif ts and b > 0:
            rate += len(ts) / b
    return rate if rate > 0 else None


def _stats(n, t_first_start, t_out, t_start, busy, nstages, *, steady=True, counts=None,
           throughput=None):
    """``steady``: throughput from the spacing of the outputs (a pipeline's fill excluded);
    otherwise frames over the wall time, unless ``throughput`` gives the steady rate.
    ``counts``: frames each stage ran (default: all)."""
    t_out = np.asarray(t_out)
    wall = float(t_out.max() - t_first_start) if n else 0.0
    if throughput is not None and math.isfinite(throughput) and throughput > 0:
        thr = throughput
    elif steady and n >= 2 and t_out.max() > t_out.min():
        thr = (n - 1) / float(t_out.max() - t_out.min())
    else:
        thr = n / wall if wall > 0 else float("nan")
    lat = t_out - np.asarray(t_start)
    busy = [float(b) for b in busy]
    util = [b / wall if wall > 0 else float("nan") for b in busy]
    return RunStats(frames=n, wall=wall, throughput=float(thr),
                    wall_throughput=n / wall if wall > 0 else float("nan"),
                    latency=float(np.median(lat)) if n else float("nan"),
                    latency_p90=float(np.percentile(lat, 90)) if n else float("nan"),
                    stage_busy=busy, stage_utilisation=util,
                    stage_time=[b / c if c else float("nan")
                                for b, c in zip(busy, counts or [n] * len(busy))])


def sub_topology(topology, cpus, name=None):
    """The part of ``topology`` on ``cpus`` (clusters restricted, capacities kept)."""
    cpus = set(int(c) for c in cpus)
    clusters = []
    for cl in topology.clusters:
        mine = tuple(c for c in cl.cpus if c in cpus)
        if mine:
            clusters.append(Cluster(name=cl.name if name is None else name, cpus=mine,
                                    capacity=cl.capacity, l1d=cl.l1d, l2=cl.l2, l3=cl.l3))
    missing = cpus - {c for cl in clusters for c in cl.cpus}
    if missing:
        raise ValueError(f"cpu(s) {sorted(missing)} are not in the topology "
                         f"{topology.to_spec()}")
    emulated = {c: s for c, s in topology.emulated.items() if c in cpus}
    return Topology(clusters=tuple(clusters), source=topology.source, emulated=emulated)


def as_frames(frames, input_shape=None):
    """Frames as a list of float32 C-contiguous ``(1,) + input_shape`` arrays.

    ``frames``: an array ``(F,) + input_shape`` or an iterable of ``input_shape`` /
    ``(1,) + input_shape`` arrays; without ``input_shape``, of images ``(C, H, W)``.
    """
    rank = 3 if input_shape is None else len(input_shape)
    one = ("C, H, W" if input_shape is None
           else ", ".join(str(int(d)) for d in input_shape) + ("," if rank == 1 else ""))
    if isinstance(frames, np.ndarray):
        if frames.ndim != rank + 1:
            raise ValueError(f"frames must be an (F, {one}) array, got shape {frames.shape}")
        items = [frames[i:i + 1] for i in range(frames.shape[0])]
    else:
        items = list(frames)
    out = []
    for i, f in enumerate(items):
        a = np.asarray(f)
        if a.ndim == rank:
            a = a[None]
        if a.ndim != rank + 1 or a.shape[0] != 1:
            raise ValueError(f"frame {i} has shape {a.shape}; expected ({one}) or (1, {one})")
        if input_shape is not None and tuple(a.shape[1:]) != tuple(input_shape):
            raise ValueError(f"frame {i} has shape {tuple(a.shape[1:])}, the model takes "
                             f"{tuple(input_shape)}")
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"frame {i} has dtype {a.dtype}; expected floating point")
        out.append(np.ascontiguousarray(a, dtype=np.float32))
    return out


def _pin_current_thread(cpus):
    """Pin the calling thread (Linux: pid 0 is the thread) to ``cpus`` within the allowed set."""
    try:
        allowed = os.sched_getaffinity(0)
        want = set(cpus) & allowed
        if want:
            os.sched_setaffinity(0, want)
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        pass


def run_in_thread(fn, cpus, *, name="asymo-measure", cancel=None):
    """``fn()`` in a new thread pinned to ``cpus`` (executors pin their calling thread; the
    caller's own affinity is left alone). Returns its result or raises its exception.

    If the caller is interrupted (Ctrl-C) while waiting, ``cancel`` (a ``threading.Event``
    that ``fn`` polls) is set and the thread is waited for until it stops (a second Ctrl-C
    stops waiting): a thread left inside a library's native code (an ONNX Runtime session)
    while the interpreter exits aborts the process. Without ``cancel`` it is given a few
    seconds."""
    box = {}

    def body():
        try:
            os.sched_setaffinity(0, set(cpus))
        except (AttributeError, OSError):  # pragma: no cover - non-Linux
            pass
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    try:
        t.join()
    except BaseException:
        if cancel is None:
            t.join(5.0)
        else:
            cancel.set()
            while t.is_alive():
                t.join(0.5)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def _single_threaded_blas():
    """BLAS called from a stage thread must stay on the stage's cores: limit NumPy's BLAS to
    one thread while stages run (asymo's own kernels use the stage pool instead)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _default_pool_factory(topology, spin_us):
    from asymo.runtime.pool import Pool
    return Pool(topology=topology, spin_us=spin_us)


def _check_timeout(timeout):
    """None (no limit) or a positive finite number of seconds; NaN would mean "never"."""
    if timeout is None:
        return None
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"timeout must be a number of seconds or None, not "
                        f"{type(timeout).__name__}") from None
    if not (t > 0 and t != float("inf")):
        raise ValueError(f"timeout must be > 0 and finite (seconds) or None, got {timeout!r}")
    return t


class _Base:
    """Shared plumbing: pools, threads, failure propagation, clean close."""

    def __init__(self, model, topology, pool_factory, spin_us, timeout):
        if not hasattr(model, "run_layers") or not hasattr(model, "layers"):
            raise TypeError("model must provide .layers and .run_layers(x, first, last, pool=)")
        if topology is None:
            from asymo.hw.topology import detect
            topology = detect()
        self.model = model
        self.topology = topology
        self._pool_factory = pool_factory or _default_pool_factory
        self._spin_us = spin_us
        self.timeout = _check_timeout(timeout)
        self._owned = {}      # thread name -> the pool that thread uses
        self._unowned = []    # pools no thread owns (kernel-level: the caller's)
        self._pool_lock = threading.Lock()
        self._threads = []
        self._closed = False
        self._stop = threading.Event()
        self._failed = threading.Event()
        self._error = None
        self._error_lock = threading.Lock()
        self._run_lock = threading.Lock()  # one run at a time: frames of two would mix

    def _make_pool(self, cpus, owner=None):
        pool = self._pool_factory(sub_topology(self.topology, cpus), self._spin_us)
        with self._pool_lock:
            if owner is None:
                self._unowned.append(pool)
            else:
                self._owned[owner] = pool
        return pool

    def _fail(self, exc, where):
        with self._error_lock:
            if self._error is None:
                try:
                    exc.add_note(f"asymo.pipeline: raised in {where}")
                except AttributeError:  # pragma: no cover - Python < 3.11
                    pass
                self._error = exc
        self._failed.set()

    def _raise_if_failed(self):
        if self._failed.is_set():
            raise self._error

    def _put(self, q, item):
        """Put with a timeout loop; False if the run was stopped or failed meanwhile."""
        while True:
            if self._stop.is_set() or self._failed.is_set():
                return False
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue

    def _get(self, q):
        """Get with a timeout loop; None if the run was stopped or failed meanwhile."""
        while True:
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if self._stop.is_set() or self._failed.is_set():
                    return None

    @contextlib.contextmanager
    def _close_on_error(self):
        """A run that fails or times out leaves frames in flight: shut down (without waiting
        for a stuck thread) so no stale frame can reach a later run."""
        try:
            yield
        except BaseException as exc:
            self._close_after_run(exc)
            raise

    def _close_after_run(self, exc=None):
        """Close because a run ended early (``exc``: how; None: abandoned), and say so to
        whoever uses the runtime next."""
        if not self._closed:
            how = ("was abandoned" if exc is None or isinstance(exc, GeneratorExit)
                   else "timed out" if isinstance(exc, TimeoutError)
                   else "was interrupted" if isinstance(exc, KeyboardInterrupt)
                   else f"failed ({type(exc).__name__})")
            self._closed_why = (f"it closed itself when a run {how}, so that frames in "
                                "flight cannot reach a later run")
        self.close(timeout=0.5, warn=False)

    @contextlib.contextmanager
    def _one_run(self, what):
        """Hold the run lock for a run (``what``: the runtime, for the refusal): frames of
        two runs at once would share the queues."""
        if not self._run_lock.acquire(blocking=False):
            raise PipelineError(f"{what} is already running frames")
        try:
            yield
        finally:
            self._run_lock.release()

    def _check_open(self):
        if self._closed:
            why = getattr(self, "_closed_why", None)
            raise PipelineError("operation on a closed pipeline" + (f": {why}" if why else ""))

    def _await(self, q, deadline_s):
        """Next item of the output queue, or raise the stage error / a timeout."""
        deadline_s = _check_timeout(deadline_s)
        t_end = None if deadline_s is None else time.perf_counter() + deadline_s
        while True:
            self._raise_if_failed()
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                dead = [t.name for t in self._threads if not t.is_alive()]
                if dead and not self._failed.is_set():
                    raise PipelineError(f"pipeline thread(s) {dead} ended unexpectedly")
                if t_end is not None and time.perf_counter() > t_end:
                    raise TimeoutError(f"no output within {deadline_s} s")

    def close(self, timeout=10.0, *, warn=True):
        """Stop the threads and close the pools. Idempotent; safe on every exit path.

        A thread still inside a model call after ``timeout`` seconds is left to finish; its
        pool is closed by the thread itself when the call returns.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        stuck = []
        for t in self._threads:
            t.join(timeout)
            if t.is_alive():
                stuck.append(t.name)
        if stuck and warn:
            warnings.warn(f"asymo.pipeline: thread(s) {stuck} did not stop within {timeout} s; "
                          "they finish their current call, then close their pools",
                          RuntimeWarning, stacklevel=2)
        with self._pool_lock:
            for t, p in list(self._owned.items()):
                if t not in stuck:
                    p.close()
                    del self._owned[t]
            for p in self._unowned:
                p.close()
            self._unowned.clear()

    def _thread_exit(self, name):
        """Called by a worker thread on its way out: close its pool if the run is over."""
        with self._pool_lock:
            if self._closed and name in self._owned:
                self._owned.pop(name).close()

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # pragma: no cover - last resort
        try:
            self.close(timeout=1.0)
        except Exception:
            pass


_STOP = object()


class Pipeline(_Base):
    """A layer-level pipeline: one pool and one pinned thread per stage.

    Parameters
    ----------
    model : Model
        Anything with ``.layers`` and ``.run_layers(x, first, last, *, pool=None)``.
    stages : sequence
        Either a ``PipelinePlan`` or ``(cpus, (first, last))`` pairs: the cores of each stage
        and the inclusive layer range it runs; ranges must be contiguous and cover the chain.
    topology : Topology, optional
        The machine (default ``asymo.hw.topology.detect()``); stage cores must belong to it.
    queue_depth : int
        Capacity of each inter-stage queue (frames waiting in front of a stage). One keeps
        every stage fed while adding the least latency (a frame waits for at most the frame
        in the next stage and the one queued before it).
    spin_us : int, optional
        Spin time of the stage pools' idle workers (``asymo.Pool(spin_us=)``); default 0
        (``STAGE_SPIN_US``), None for the pool's own default.
    timeout : float, optional
        Longest wait (s) for the next output before ``TimeoutError`` (None: no limit).
    pin_threads : bool
        Pin each stage thread to its stage's cores (cluster-local Python work too).
    """

    def __init__(self, model, stages, *, topology=None, queue_depth=1, spin_us=STAGE_SPIN_US,
                 timeout=None, pin_threads=True, pool_factory=None):
        super().__init__(model, topology, pool_factory, spin_us, timeout)
        if hasattr(stages, "stages") and hasattr(stages, "to_dict"):  # a PipelinePlan
            stages = [(s.cpus, tuple(s.layers)) for s in stages.stages]
        stages = [(tuple(int(c) for c in cpus), (int(a), int(b))) for cpus, (a, b) in stages]
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        W = len(model.layers)
        nxt = 0
        used = set()
        for i, (cpus, (a, b)) in enumerate(stages):
            if not cpus:
                raise ValueError(f"stage {i} has no cpus")
            if used & set(cpus):
                raise ValueError(f"stage {i} reuses cpu(s) {sorted(used & set(cpus))}")
            used |= set(cpus)
            if a != nxt or b < a:
                raise ValueError(f"stage {i} layers [{a}, {b}] do not continue at layer {nxt} "
                                 "(stages hold contiguous, non-empty ranges in order)")
            nxt = b + 1
        if nxt != W:
            raise ValueError(f"stages cover layers [0, {nxt - 1}] but the model has {W}")
        if int(queue_depth) < 1:
            raise ValueError(f"queue_depth must be >= 1, got {queue_depth}")
        self.stage_cpus = [c for c, _ in stages]
        self.nstages = len(stages)
        self.nlayers = W
        self._bounds = [b for _, (_, b) in stages]
        self._bounds_lock = threading.Lock()
        self._queues = [queue.Queue(maxsize=int(queue_depth)) for _ in range(self.nstages + 1)]
        self._busy = [0.0] * self.nstages
        self._t_start = {}
        try:
            self.pools = [self._make_pool(cpus, f"asymo-pipeline-stage{i}")
                          for i, cpus in enumerate(self.stage_cpus)]
        except BaseException:
            self.close()
            raise
        for i in range(self.nstages):
            t = threading.Thread(target=self._stage_loop, args=(i, pin_threads),
                                 name=f"asymo-pipeline-stage{i}", daemon=True)
            self._threads.append(t)
            t.start()

    @property
    def layers(self):
        """Current inclusive layer range of every stage."""
        with self._bounds_lock:
            b = list(self._bounds)
        first = [0] + [x + 1 for x in b[:-1]]
        return [(f, l) for f, l in zip(first, b)]

    def repartition(self, layers):
        """Move the stage boundaries (same stages and cores); safe with frames in flight.

        ``layers``: inclusive ``(first, last)`` per stage, contiguous, covering the chain;
        empty stages are written ``(k, k - 1)``.
        """
        layers = [(int(a), int(b)) for a, b in layers]
        if len(layers) != self.nstages:
            raise ValueError(f"{len(layers)} ranges for {self.nstages} stages")
        nxt = 0
        for i, (a, b) in enumerate(layers):
            if a != nxt or b < a - 1:
                raise ValueError(f"stage {i} range [{a}, {b}] does not continue at layer {nxt}")
            nxt = b + 1
        if nxt != self.nlayers:
            raise ValueError(f"ranges cover {nxt} of {self.nlayers} layers")
        with self._bounds_lock:
            self._bounds = [b for _, b in layers]

    def _stage_loop(self, i, pin):
        try:
            self._stage_body(i, pin)
        finally:
            self._thread_exit(threading.current_thread().name)

    def _stage_body(self, i, pin):
        if pin:
            _pin_current_thread(self.stage_cpus[i])
        qin, qout = self._queues[i], self._queues[i + 1]
        pool = self.pools[i]
        last_stage = i == self.nstages - 1
        while True:
            item = self._get(qin)
            if item is None:
                return
            if item is _STOP:
                self._put(qout, _STOP)
                return
            seq, x, nxt = item
            if self._failed.is_set():
                continue
            try:
                with self._bounds_lock:
                    last = self.nlayers - 1 if last_stage else self._bounds[i]
                if nxt <= last:
                    t0 = time.perf_counter()
                    self._t_start.setdefault(seq, t0)
                    x = self.model.run_layers(x, nxt, last, pool=pool)
                    self._busy[i] += time.perf_counter() - t0
                    nxt = last + 1
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self._fail(exc, f"stage {i} (cpus {list(self.stage_cpus[i])}) on frame {seq}")
                continue
            if not self._put(qout, (seq, x, nxt)):
                return

    def stream(self, frames, *, timeout=None):
        """Yield the outputs of ``frames`` in input order (a generator; see ``run``)."""
        self._check_open()
        frames = as_frames(frames, getattr(self.model, "input_shape", None))
        timeout = self.timeout if timeout is None else timeout
        with self._one_run("the pipeline"):
            done, error = False, None
            try:
                self._raise_if_failed()
                self._busy = [0.0] * self.nstages
                self._t_start = {}

                def feed():
                    for seq, f in enumerate(frames):
                        if not self._put(self._queues[0], (seq, f, 0)):
                            return

                threading.Thread(target=feed, name="asymo-pipeline-feeder", daemon=True).start()
                for expect in range(len(frames)):
                    item = self._await(self._queues[-1], timeout)
                    seq, x, nxt = item
                    if seq != expect or nxt != self.nlayers:  # pragma: no cover - invariant
                        raise PipelineError(f"frame {seq} arrived for {expect} (layer {nxt})")
                    yield seq, x
                done = True
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not done or self._failed.is_set():
                    # a failed, timed-out or abandoned stream may leave frames in flight (fed
                    # ones included): shut everything down without waiting for a stage that
                    # may be stuck (it closes its pool when it returns)
                    self._close_after_run(error if error is not None else self._error)

    def run(self, frames, *, timeout=None):
        """Process ``frames`` and return ``(outputs, RunStats)``; outputs stacked in order.

        Raises the first exception of any stage (with a note naming stage and frame), or
        ``TimeoutError`` if no output arrives within ``timeout`` seconds.
        """
        frames = as_frames(frames, getattr(self.model, "input_shape", None))
        if not frames:
            raise ValueError("no frames to process")
        outs, t_out, seqs = [], [], []
        t0 = time.perf_counter()
        with _single_threaded_blas():
            for seq, x in self.stream(frames, timeout=timeout):
                t_out.append(time.perf_counter())
                outs.append(x)
                seqs.append(seq)
        t_start = [self._t_start.get(s, t0) for s in seqs]
        stats = _stats(len(outs), min(t_start), t_out, t_start, self._busy, self.nstages)
        return np.concatenate(outs, axis=0), stats

    def measure(self, frames, layers=None, *, timeout=None):
        """Per-stage mean compute time per frame (s) for ``frames``, optionally after
        ``repartition(layers)``: the ``execute``/``measure`` callback of online tuning."""
        if layers is not None:
            self.repartition(layers)
        _, st = self.run(frames, timeout=timeout)
        return st.stage_time

    def close(self, timeout=10.0, *, warn=True):
        if not self._closed:
            for q in self._queues[:1]:
                try:
                    q.put_nowait(_STOP)
                except queue.Full:
                    pass
        super().close(timeout, warn=warn)


class KernelLevel(_Base):
    """Baseline: every layer on all cores of ``topology`` (one pool), one frame at a time.

    ``run`` goes through the frames in one thread pinned to ``cpus`` (the caller's own
    affinity is left alone): no hand-over between threads per frame. Its outputs reach the
    caller one by one, so ``timeout`` bounds the wait for each, as in the other runtimes."""

    _THREAD = "asymo-kernel-level"

    def __init__(self, model, *, topology=None, cpus=None, spin_us=STAGE_SPIN_US,
                 timeout=None, pool_factory=None):
        super().__init__(model, topology, pool_factory, spin_us, timeout)
        self.cpus = tuple(self.topology.cpus if cpus is None else cpus)
        # owned by the run thread: a close while it is stuck in a call leaves the pool to it
        self.pool = self._make_pool(self.cpus, self._THREAD)

    def run(self, frames, *, timeout=None):
        """Process ``frames`` and return ``(outputs, RunStats)`` (see `Pipeline.run`)."""
        self._check_open()
        self._raise_if_failed()
        frames = as_frames(frames, getattr(self.model, "input_shape", None))
        if not frames:
            raise ValueError("no frames to process")
        timeout = self.timeout if timeout is None else timeout
        with self._one_run("the kernel-level runtime"):
            self._threads = []
            results = queue.Queue()
            t = threading.Thread(target=self._loop, args=(frames, results),
                                 name=self._THREAD, daemon=True)
            outs, t_start, t_out = [], [], []
            with self._close_on_error():
                self._threads.append(t)
                t.start()
                for _ in frames:
                    y, t0, t1 = self._await(results, timeout)
                    outs.append(y)
                    t_start.append(t0)
                    t_out.append(t1)
                t.join()
        busy = sum(b - a for a, b in zip(t_start, t_out))
        return np.concatenate(outs, axis=0), _stats(len(outs), t_start[0], t_out, t_start,
                                                    [busy], 1)

    def _loop(self, frames, results):
        try:
            _pin_current_thread(self.cpus)
            W = len(self.model.layers)
            for seq, f in enumerate(frames):
                if self._stop.is_set():
                    return
                try:
                    t0 = time.perf_counter()
                    y = self.model.run_layers(f, 0, W - 1, pool=self.pool)
                    results.put((y, t0, time.perf_counter()))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    self._fail(exc, f"the kernel-level run (cpus {list(self.cpus)}) on "
                                    f"frame {seq}")
                    return
        finally:
            self._thread_exit(threading.current_thread().name)


class ParallelFrames(_Base):
    """Baseline: paper 001's non-pipelined parallel design, whole frames per cluster.

    One pool and one pinned thread per cluster (or per ``groups`` of cpus); each thread takes
    the next frame from a shared queue and runs the whole model on its cores. Outputs are
    returned in input order. Latency is that of the cluster a frame ran on.

    ``frame_times`` (expected seconds per frame of each group, optional) keeps a slow group
    from taking one of the last frames of a run: a group takes a frame only while the others
    would need longer than it does to clear the frames still queued (with ``n`` queued and the
    others' combined rate ``R``, it takes one when ``n / R`` exceeds its own frame time; the
    fastest group always takes one).
    Without it every free group takes the next frame.
    """

    def __init__(self, model, *, topology=None, groups=None, spin_us=STAGE_SPIN_US,
                 timeout=None, pin_threads=True, pool_factory=None, frame_times=None):
        super().__init__(model, topology, pool_factory, spin_us, timeout)
        self.groups = [tuple(g) for g in (groups or [c.cpus for c in self.topology.clusters])]
        self._patience = self._patience_for(frame_times)
        self._fed = threading.Condition()
        self._in = queue.Queue()
        self._out = queue.Queue()
        self._busy = [0.0] * len(self.groups)
        self._t_done = [[] for _ in self.groups]  # per group: when it finished each frame
        self._t_start = {}
        try:
            self.pools = [self._make_pool(g, f"asymo-parallel-{i}")
                          for i, g in enumerate(self.groups)]
        except BaseException:
            self.close()
            raise
        for i in range(len(self.groups)):
            t = threading.Thread(target=self._worker, args=(i, pin_threads),
                                 name=f"asymo-parallel-{i}", daemon=True)
            self._threads.append(t)
            t.start()

    def _patience_for(self, frame_times):
        """Per group: how many frames must be queued before it takes one (see the class
        docstring); 0 when no ``frame_times`` are given."""
        if frame_times is None:
            return [0.0] * len(self.groups)
        t = [float(x) for x in frame_times]
        if len(t) != len(self.groups) or not all(math.isfinite(x) and x > 0 for x in t):
            raise ValueError(f"frame_times must be {len(self.groups)} positive finite seconds "
                             f"(one per group), got {frame_times!r}")
        rate = sum(1.0 / x for x in t)
        need = [t[i] * (rate - 1.0 / t[i]) for i in range(len(t))]
        need[t.index(min(t))] = 0.0  # the fastest group always takes one: no deadlock
        return need

    def _next_frame(self, i):
        """The next (seq, frame) for worker ``i``, ``_STOP`` or None (stopped / failed)."""
        need = self._patience[i]
        if need <= 0:
            return self._get(self._in)
        while not (self._stop.is_set() or self._failed.is_set()):
            with self._fed:  # run() queues a whole run's frames under this lock
                n = self._in.qsize()
                if n == 0:
                    self._fed.wait(_POLL)
                    continue
            if n > need:
                try:
                    return self._in.get_nowait()
                except queue.Empty:
                    continue
            time.sleep(0.0005)  # the faster groups clear the tail; look again
        return None

    def _worker(self, i, pin):
        try:
            self._worker_body(i, pin)
        finally:
            self._thread_exit(threading.current_thread().name)

    def _worker_body(self, i, pin):
        if pin:
            _pin_current_thread(self.groups[i])
        W = len(self.model.layers)
        while True:
            item = self._next_frame(i)
            if item is None or item is _STOP:
                if item is _STOP:
                    self._in.put(_STOP)  # let the other workers see it too
                return
            seq, x = item
            if self._failed.is_set():
                continue
            try:
                t0 = time.perf_counter()
                self._t_start[seq] = t0
                y = self.model.run_layers(x, 0, W - 1, pool=self.pools[i])
                t1 = time.perf_counter()
                self._busy[i] += t1 - t0
                self._t_done[i].append(t1)
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc, f"parallel worker {i} (cpus {list(self.groups[i])}) on "
                                f"frame {seq}")
                continue
            self._out.put((seq, y))

    def run(self, frames, *, timeout=None):
        self._check_open()
        self._raise_if_failed()
        frames = as_frames(frames, getattr(self.model, "input_shape", None))
        if not frames:
            raise ValueError("no frames to process")
        timeout = self.timeout if timeout is None else timeout
        with self._one_run("the parallel-frames runtime"):
            return self._run(frames, timeout)

    def _run(self, frames, timeout):
        self._busy = [0.0] * len(self.groups)
        self._t_done = [[] for _ in self.groups]
        self._t_start = {}
        pending, outs, t_out, t_start = {}, [], [], []
        nxt = 0
        with _single_threaded_blas(), self._close_on_error():
            with self._fed:
                for seq, f in enumerate(frames):
                    self._in.put((seq, f))
                self._fed.notify_all()
            while nxt < len(frames):
                seq, y = self._await(self._out, timeout)
                pending[seq] = (y, time.perf_counter())
                while nxt in pending:  # reorder to input order
                    y, t = pending.pop(nxt)
                    outs.append(y)
                    t_out.append(t)
                    t_start.append(self._t_start[nxt])
                    nxt += 1
        # the steady rate is the sum of the groups' rates, each from the spacing of the frames
        # it finished (the reordered outputs come in bursts, and frames over wall time counts
        # the end of a finite run, where groups fall idle one by one, as a pipeline's fill
        # is not counted)
        return np.concatenate(outs, axis=0), _stats(
            len(outs), min(t_start), t_out, t_start, self._busy, len(self.groups),
            steady=False, counts=[len(t) for t in self._t_done],
            throughput=_groups_rate(self._t_done, self._busy))

    def close(self, timeout=10.0, *, warn=True):
        if not self._closed:
            self._in.put(_STOP)
        super().close(timeout, warn=warn)
