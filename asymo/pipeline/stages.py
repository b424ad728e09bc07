"""Streaming a ``CutGraph`` through stages of any executor, on ``asymo.pipeline.Pipeline``.

The runtime is the layer-level ``Pipeline`` (bounded queues, ordered outputs, one pinned thread
per stage, an exception in a stage re-raised to the caller, ``close`` on every exit path,
per-stage busy time and utilisation). Here it is given

- a model-like ``StagedGraph`` whose "layers" are the graph's segments, and
- one ``StageRunner`` per stage in place of the stage's asymo pool: the stage's executor(s)
  and its preallocated output buffers.

A ``StageRunner`` owns the executor of its planned segment range (built before any frame
runs) and builds others on demand if the pipeline is re-partitioned. Each stage but the last
writes into a ring of preallocated output buffers: a buffer is reused only after more frames
than can be in flight behind it (queue capacity plus the frame in each later stage), so a
frame's activation is never overwritten while a later stage still reads it. The last stage
writes a fresh array per frame (the caller keeps the outputs).
"""
from __future__ import annotations

import threading

import numpy as np

from asymo.pipeline.executors import make_executor
from asymo.pipeline.runtime import KernelLevel, ParallelFrames, Pipeline

__all__ = ["StagedGraph", "StageRunner", "graph_pipeline", "graph_parallel_frames",
           "plan_runtime", "open_plan"]


class StagedGraph:
    """A ``CutGraph`` seen by ``Pipeline``: ``layers`` are its segments."""

    def __init__(self, graph):
        self.graph = graph
        self.name = graph.name
        self.layers = list(graph.segments)
        self.input_shape = tuple(graph.input_shape)

    def run_layers(self, x, first, last, *, pool=None):
        if not isinstance(pool, StageRunner):
            raise TypeError("a StagedGraph runs on a StageRunner (one per stage)")
        return pool.run(x, first, last)


class StageRunner:
    """The executor(s) and output buffers of one stage (see the module docstring).

    Parameters
    ----------
    graph : CutGraph
    kind : {"asymo", "ort", "torch"}
    cpus : sequence of int
    segments : (first, last)
        The planned range; its executor is built now.
    ring : int
        Output buffers per boundary (0: allocate per frame, as the last stage does).
    topology : Topology, optional
        For the asymo executor's pool.
    """

    def __init__(self, graph, kind, cpus, segments, *, ring=0, topology=None):
        self.graph, self.kind = graph, kind
        self.cpus = tuple(int(c) for c in cpus)
        self.ring = int(ring)
        self._topology = topology
        self._execs = {}
        self._rings = {}
        self._next = {}
        self._lock = threading.Lock()
        self._closed = False
        self._executor(*segments)

    def _executor(self, first, last):
        key = (int(first), int(last))
        ex = self._execs.get(key)
        if ex is None:
            with self._lock:
                if self._closed:
                    raise RuntimeError("stage runner is closed")
                ex = make_executor(self.kind, self.graph, first, last, self.cpus,
                                   topology=self._topology)
                self._execs[key] = ex
        return ex

    def _buffer(self, ex, last):
        if self.ring <= 0 or last == len(self.graph) - 1:
            return None
        bufs = self._rings.get(last)
        if bufs is None:
            bufs = self._rings[last] = [np.empty(ex.output_shape, np.float32)
                                        for _ in range(self.ring)]
            self._next[last] = 0
        i = self._next[last]
        self._next[last] = (i + 1) % len(bufs)
        return bufs[i]

    def run(self, x, first, last):
        ex = self._executor(first, last)
        return ex.run(x, out=self._buffer(ex, last))

    @property
    def executors(self):
        return dict(self._execs)

    def close(self):
        with self._lock:
            self._closed = True
            execs, self._execs = list(self._execs.values()), {}
        for ex in execs:
            ex.close()
        self._rings.clear()


def graph_pipeline(graph, stages, *, topology=None, queue_depth=1, timeout=None,
                   pin_threads=True):
    """A running ``Pipeline`` over ``graph``.

    Parameters
    ----------
    graph : CutGraph
    stages : sequence of ``(kind, cpus, (first, last))``
        Executor, cpus and inclusive segment range of each stage, in order (contiguous,
        covering every segment; cpus disjoint).
    topology : Topology, optional
    queue_depth, timeout, pin_threads
        As for ``Pipeline``.

    Returns
    -------
    Pipeline
        Use it as a context manager; ``run(frames)`` gives ``(outputs, RunStats)``.
    """
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    stages = [(str(k), tuple(int(c) for c in cpus), (int(a), int(b)))
              for k, cpus, (a, b) in stages]
    by_cpus = {}
    for k, cpus, rng in stages:
        by_cpus[frozenset(cpus)] = (k, cpus, rng)
    # a buffer is reused after ring frames: enough for the queue plus one frame in every stage
    ring = (int(queue_depth) + 2) * len(stages) + 1
    return Pipeline(StagedGraph(graph), [(cpus, rng) for _, cpus, rng in stages],
                    topology=topology, queue_depth=queue_depth, timeout=timeout,
                    pin_threads=pin_threads, pool_factory=_runner_factory(graph, by_cpus, ring,
                                                                          topology))


def _runner_factory(graph, by_cpus, ring, topology):
    """``pool_factory`` for the runtime: the ``StageRunner`` of the stage on those cpus."""
    def factory(sub, _spin_us):
        k, cpus, rng = by_cpus[frozenset(sub.cpus)]
        return StageRunner(graph, k, cpus, rng, ring=ring, topology=topology)
    return factory


def graph_parallel_frames(graph, groups, *, topology=None, timeout=None, pin_threads=True,
                          frame_times=None):
    """A running ``ParallelFrames`` over ``graph``: whole frames per group of cpus, each group
    running the whole graph on its own executor (paper 001's parallel design, over any
    executor).

    Parameters
    ----------
    graph : CutGraph
    groups : sequence of ``(kind, cpus)``
        Executor and cpus of each group (cpus disjoint).
    topology : Topology, optional
    timeout, pin_threads, frame_times
        As for ``ParallelFrames`` (``frame_times``: expected seconds per frame of each group,
        so a slow group leaves the last frames of a run to the faster ones).

    Returns
    -------
    ParallelFrames
        Use it as a context manager; ``run(frames)`` gives ``(outputs, RunStats)``, outputs
        in input order.
    """
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    last = len(graph) - 1
    groups = [(str(k), tuple(int(c) for c in cpus)) for k, cpus in groups]
    by_cpus = {frozenset(cpus): (k, cpus, (0, last)) for k, cpus in groups}
    if len(by_cpus) != len(groups):
        raise ValueError(f"groups must have disjoint cpus, got {groups}")
    return ParallelFrames(StagedGraph(graph), topology=topology,
                          groups=[cpus for _, cpus in groups], timeout=timeout,
                          pin_threads=pin_threads, frame_times=frame_times,
                          pool_factory=_runner_factory(graph, by_cpus, 0, topology))


def plan_runtime(graph, stages, mode="pipeline", *, topology=None, timeout=None):
    """The runtime for a plan's stages (``GraphStage``: executor, cpus, segments, times):
    whole frames per group (``mode == "parallel"``, each group's frame time its measured one
    where a trial ran it, else the predicted), one stage run frame after frame in one pinned
    thread (``KernelLevel``: no queues to hand frames through), or a pipeline."""
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    if mode == "parallel":
        return graph_parallel_frames(graph, [(s.executor, s.cpus) for s in stages],
                                     topology=topology, timeout=timeout,
                                     frame_times=[_frame_time(s) for s in stages])
    if mode != "pipeline":
        raise ValueError(f"mode must be 'pipeline' or 'parallel', got {mode!r}")
    if len(stages) == 1:
        s = stages[0]
        if tuple(s.segments) != (0, len(graph) - 1):
            raise ValueError(f"a single stage must cover segments [0, {len(graph) - 1}], got "
                             f"{list(s.segments)}")
        cpus = tuple(int(c) for c in s.cpus)
        by_cpus = {frozenset(cpus): (str(s.executor), cpus, (0, len(graph) - 1))}
        return KernelLevel(StagedGraph(graph), topology=topology, cpus=cpus, timeout=timeout,
                           pool_factory=_runner_factory(graph, by_cpus, 0, topology))
    return graph_pipeline(graph, [(s.executor, s.cpus, s.segments) for s in stages],
                          topology=topology, timeout=timeout)


def open_plan(graph, plan, *, topology=None, timeout=None):
    """The runtime a ``GraphPlan`` describes (see ``plan_runtime``). A context manager;
    ``run(frames)`` gives ``(outputs, RunStats)``."""
    return plan_runtime(graph, plan.stages, plan.mode,
                        topology=plan.topology if topology is None else topology,
                        timeout=timeout)


def _frame_time(stage):
    """A group's seconds per frame: measured by the planner's trial when it ran, else
    predicted."""
    t = stage.measured_time
    return t if t == t and t > 0 else stage.predicted_time
