"""Pipelines over any runtime (issue 18): cut graph, executors, runtime, planner, CLI.

Small ONNX models built with onnx.helper (no torch needed); ONNX Runtime and torch parts skip
cleanly when those are not installed.
"""
import glob
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from asymo.pipeline.executors import available_executors, make_executor  # noqa: E402
from asymo.pipeline.graphcut import CutGraph  # noqa: E402

HAVE_ORT = "ort" in available_executors()
HAVE_TORCH = "torch" in available_executors()
needs_ort = pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime not installed")
CPUS = sorted(os.sched_getaffinity(0))


def _small_cnn(seed=0, c=8, hw=16, classes=10):
    """conv-relu, maxpool, a two-branch concat, a residual block, GAP, flatten, gemm."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)

    inits = [w("w0", c, 3, 3, 3), w("b0", c), w("wa", c, c, 1, 1), w("wb", c, c, 3, 3),
             w("w1", 2 * c, 2 * c, 3, 3), w("b1", 2 * c), w("wf", classes, 2 * c),
             w("bf", classes)]
    N = helper.make_node
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        N("Relu", ["c0"], ["r0"], name="relu0"),
        N("MaxPool", ["r0"], ["p0"], name="pool0", kernel_shape=[2, 2], strides=[2, 2]),
        N("Conv", ["p0", "wa"], ["ba"], name="branch_a"),
        N("Conv", ["p0", "wb"], ["bb"], name="branch_b", pads=[1, 1, 1, 1]),
        N("Concat", ["ba", "bb"], ["cat"], name="concat", axis=1),
        N("Relu", ["cat"], ["rc"], name="relu1"),
        N("Conv", ["rc", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        N("Add", ["c1", "rc"], ["res"], name="add"),
        N("Relu", ["res"], ["r1"], name="relu2"),
        N("GlobalAveragePool", ["r1"], ["gap"], name="gap"),
        N("Flatten", ["gap"], ["flat"], name="flatten"),
        N("Gemm", ["flat", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(nodes, "small_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["N", 3, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         ["N", classes])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def graph():
    return CutGraph(_small_cnn())


def _frames(n, seed=1, hw=16):
    return np.random.default_rng(seed).standard_normal((n, 3, hw, hw), dtype=np.float32)


def _reference(model, frames):
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"x": frames[i:i + 1]})[0]
                           for i in range(len(frames))])


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("asymo-")]


# --- cut graph --------------------------------------------------------------------------------

def test_cut_points_never_inside_branches(graph):
    names = [(graph.node_names[s.start], graph.node_names[s.stop - 1])
             for s in graph.segments]
    # the two-branch concat and the residual block are whole segments
    assert ("branch_a", "concat") in names
    assert ("conv1", "add") in names
    assert graph.segments[0].input == "x" and graph.segments[-1].output == "y"
    assert graph.input_shape == (3, 16, 16)
    for a, b in zip(graph.segments, graph.segments[1:]):
        assert a.stop == b.start and a.output == b.input
    assert graph.out_bytes[-1] == 4 * 10


def test_cut_graph_rejects_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        CutGraph(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="not a regular file"):
        CutGraph(tmp_path)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError):
        CutGraph(bad)
    m = _small_cnn()
    m.graph.output.append(helper.make_tensor_value_info("gap", TensorProto.FLOAT, ["N", 16, 1, 1]))
    with pytest.raises(ValueError, match="one input and one output"):
        CutGraph(m)
    with pytest.raises(TypeError):
        CutGraph(42)


# --- executors --------------------------------------------------------------------------------

@needs_ort
@pytest.mark.parametrize("kind", ["ort", "asymo", "torch"])
def test_executor_matches_whole_model_ort(graph, kind):
    from asymo.pipeline.runtime import run_in_thread

    if kind not in available_executors():
        pytest.skip(f"{kind} not installed")
    x = _frames(1)
    ref = _reference(graph.proto, x)
    cut = 3
    y = x
    for a, b in [(0, cut), (cut + 1, len(graph) - 1)]:
        ex = make_executor(kind, graph, a, b, CPUS[:1])
        try:
            # run() pins its calling thread to the stage cpus: not the test's own thread
            y = run_in_thread(lambda: ex.run(y), CPUS[:1])
        finally:
            ex.close()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@needs_ort
def test_executor_checks_input_and_out(graph):
    ex = make_executor("ort", graph, 0, 0, CPUS[:1])
    try:
        with pytest.raises(ValueError, match="float32"):
            ex.run(_frames(1).astype(np.float64))
        with pytest.raises(ValueError, match="out must"):
            ex.run(_frames(1), out=np.empty((1, 2), np.float32))
    finally:
        ex.close()
    with pytest.raises(RuntimeError, match="closed"):
        ex.run(_frames(1))


def test_operator_asymo_lacks_leaves_ort_only():
    """Selu: asymo's loader refuses the graph (naming operator, node and opset); the cut
    points come from the ONNX nodes and ONNX Runtime still runs every stage."""
    m = _small_cnn()
    m.graph.node[1].op_type = "Selu"
    g = CutGraph(m)
    assert g.asymo_graph is None and "Selu" in g.asymo_error
    for kind in ("asymo", "torch"):
        with pytest.raises(ValueError, match="Selu.*relu0.*opset 17"):
            make_executor(kind, g, 0, len(g) - 1, CPUS[:1])
    if HAVE_ORT:
        from asymo.pipeline.runtime import run_in_thread

        x = _frames(1)
        ref = _reference(m, x)
        cut = 2
        exs = [make_executor("ort", g, 0, cut, CPUS[:1]),
               make_executor("ort", g, cut + 1, len(g) - 1, CPUS[:1])]
        try:
            y = run_in_thread(lambda: exs[1].run(exs[0].run(x)), CPUS[:1])
        finally:
            for e in exs:
                e.close()
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def _task_affinities():
    out = {}
    for d in glob.glob("/proc/self/task/*"):
        try:
            with open(os.path.join(d, "status")) as f:
                line = next(x for x in f if x.startswith("Cpus_allowed_list"))
        except (OSError, StopIteration):
            continue
        out[os.path.basename(d)] = line.split()[1]
    return out


def _parse_list(text):
    cpus = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


@needs_ort
@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cpus")
def test_ort_threads_pinned_within_stage_cpus(graph):
    from asymo.pipeline.runtime import run_in_thread

    for cpus in [(CPUS[0],), (CPUS[1],), tuple(CPUS[:2])]:
        before = _task_affinities()
        ex = make_executor("ort", graph, 0, len(graph) - 1, cpus)
        try:
            new = {k: v for k, v in _task_affinities().items() if k not in before}
            # ONNX Runtime counts the caller as one intra-op thread: n - 1 workers
            assert len(new) == len(cpus) - 1
            for aff in new.values():
                assert _parse_list(aff) <= set(cpus)
            caller = run_in_thread(lambda: (ex.run(_frames(1)), os.sched_getaffinity(0))[1],
                                   cpus)
            assert caller == {cpus[0]}
        finally:
            ex.close()
        # the session's workers end with it
        assert not set(new) & set(_task_affinities())


@needs_ort
@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cpus")
def test_ort_stage_spins_only_with_every_core_to_itself(graph):
    from asymo.hw.topology import Cluster, Topology

    top = Topology(clusters=(Cluster("c0", tuple(CPUS[:2]), capacity=1.0),))
    for cpus, spin in [(tuple(CPUS[:2]), "1"), ((CPUS[0],), "0")]:
        ex = make_executor("ort", graph, 0, len(graph) - 1, cpus, topology=top)
        try:
            opts = ex.session.get_session_options()
            assert opts.get_session_config_entry("session.intra_op.allow_spinning") == spin
        finally:
            ex.close()


# --- runtime ----------------------------------------------------------------------------------

def _two_stages(graph, kinds=("ort", "ort")):
    cut = len(graph) // 2
    c1 = CPUS[1] if len(CPUS) > 1 else CPUS[0]
    if c1 == CPUS[0]:
        pytest.skip("needs two cpus")
    return [(kinds[0], (CPUS[0],), (0, cut)), (kinds[1], (c1,), (cut + 1, len(graph) - 1))]


@needs_ort
def test_pipeline_outputs_ordered_and_correct(graph):
    from asymo.pipeline.stages import graph_pipeline

    x = _frames(12, seed=3)
    ref = _reference(graph.proto, x)
    with graph_pipeline(graph, _two_stages(graph, ("ort", "asymo")), timeout=60) as p:
        y, st = p.run(x)
        y2, _ = p.run(x[::-1].copy())
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y2, ref[::-1], rtol=1e-4, atol=1e-4)
    assert st.frames == 12 and len(st.stage_utilisation) == 2
    assert all(0 < u <= 1.0 + 1e-6 for u in st.stage_utilisation)
    assert not _pipeline_threads()


@needs_ort
def test_bounded_queues_backpressure(graph):
    from asymo.pipeline.stages import graph_pipeline

    started, finished = [0], [0]
    ahead = []
    with graph_pipeline(graph, _two_stages(graph), timeout=60, queue_depth=1) as p:
        r0, r1 = p.pools
        run0, run1 = r0.run, r1.run

        def fast(x, a, b):
            started[0] += 1
            ahead.append(started[0] - finished[0])
            return run0(x, a, b)

        def slow(x, a, b):
            time.sleep(0.01)
            y = run1(x, a, b)
            finished[0] += 1
            return y

        r0.run, r1.run = fast, slow
        p.run(_frames(20))
    # queue of 1 between the stages: stage 0 can be at most the queued frame, the one it
    # computes and the one stage 1 holds ahead of stage 1's completions
    assert max(ahead) <= 3
    assert finished[0] == 20


@needs_ort
@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_stage_exception_shuts_down_cleanly(graph, exc_type):
    from asymo.pipeline.stages import graph_pipeline

    p = graph_pipeline(graph, _two_stages(graph), timeout=60)
    runner = p.pools[1]
    orig = runner.run
    calls = [0]

    def boom(x, a, b):
        calls[0] += 1
        if calls[0] == 3:
            raise exc_type("stage failure")
        return orig(x, a, b)

    runner.run = boom
    with pytest.raises(exc_type, match="stage failure") as info:
        p.run(_frames(10))
    if exc_type is RuntimeError:
        assert any("stage 1" in n for n in getattr(info.value, "__notes__", []))
    p.close()
    deadline = time.time() + 5
    while _pipeline_threads() and time.time() < deadline:
        time.sleep(0.02)
    assert not _pipeline_threads()
    # sessions released: every stage's executors are closed
    assert all(not r.executors for r in p.pools)


@needs_ort
def test_ctrl_c_in_caller_closes_pipeline(graph):
    from asymo.pipeline.stages import graph_pipeline

    p = graph_pipeline(graph, _two_stages(graph), timeout=60)
    ex = [e for r in p.pools for e in r.executors.values()]
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(p.stream(_frames(30))):
            if i == 2:
                raise KeyboardInterrupt
    deadline = time.time() + 5
    while _pipeline_threads() and time.time() < deadline:
        time.sleep(0.02)
    assert not _pipeline_threads()
    assert all(e._closed for e in ex)
    p.close()


# --- planner ----------------------------------------------------------------------------------

def test_planner_picks_executor_and_cut_per_stage(graph):
    """Synthetic measurements: the fast core wins with ort on the head, the slow core with
    asymo on the tail; the single-stage runs are slower than the pipeline."""
    from asymo.pipeline.anyplan import SegmentTimes, plan_graph_pipeline
    from asymo.pipeline.configs import core_configs
    from asymo.pipeline.table import LayerTimes
    from asymo.hw.topology import parse_spec

    top = parse_spec("big:0@1.0,little:1@0.5")
    cfgs = core_configs(top)
    S = len(graph)
    base = np.linspace(1.0, 2.0, S) * 1e-3
    ort_t = np.stack([base, 2 * base], axis=1)
    asymo_t = np.stack([1.5 * base, 1.6 * base], axis=1)
    st = SegmentTimes({"ort": LayerTimes(cfgs, ort_t), "asymo": LayerTimes(cfgs, asymo_t)},
                      {("ort", (0, 1)): base.sum() * 0.9, ("ort", (0,)): base.sum()})
    power = {cfgs[0]: 1.0, cfgs[1]: 0.25, "all": 1.25}
    plan = plan_graph_pipeline(graph, top, segment_times=st, transfer_k=0.0, search=False,
                               power=power, parallel=False)
    assert [s.executor for s in plan.stages] == ["ort", "asymo"]
    assert [s.cpus for s in plan.stages] == [(0,), (1,)]
    a, b = plan.stages[0].segments[1], plan.stages[1].segments[0]
    assert b == a + 1
    head = base[:a + 1].sum()
    tail = 1.6 * base[a + 1:].sum()
    assert plan.model_throughput == pytest.approx(1 / max(head, tail))
    # no other cut does better
    for c in range(S - 1):
        assert max(base[:c + 1].sum(), 1.6 * base[c + 1:].sum()) >= max(head, tail) - 1e-12
    assert plan.predicted_throughput > 1 / (base.sum() * 0.9)
    # a transfer cost large enough makes the single-stage run win
    plan2 = plan_graph_pipeline(graph, top, segment_times=st, transfer_k=1.0, search=False,
                                power=power, parallel=False)
    assert len(plan2.stages) == 1 and plan2.stages[0].executor == "ort"
    with pytest.raises(ValueError):
        plan_graph_pipeline(graph, top, segment_times=st, transfer_k=-1.0, search=False)
    # ... where whole frames per core have no transfer to pay: the parallel design wins,
    # each core on its fastest executor for the whole graph (a whole-graph time where one
    # was measured, else the sum of the segments)
    plan3 = plan_graph_pipeline(graph, top, segment_times=st, transfer_k=1.0, search=False,
                                power=power)
    assert plan3.mode == "parallel" and plan3.describe().startswith("frames: ")
    assert [(s.executor, s.cpus, s.segments) for s in plan3.stages] == [
        ("ort", (0,), (0, S - 1)), ("asymo", (1,), (0, S - 1))]
    rate = 1 / base.sum() + 1 / (1.6 * base.sum())
    assert plan3.predicted_throughput == pytest.approx(rate)
    assert plan3.predicted_latency == pytest.approx(2 / rate)
    assert plan3.to_dict()["mode"] == "parallel"
    with pytest.raises(ValueError, match="open_plan"):
        plan3.stage_specs()
    # the latency objective never takes it (a frame on the slow core is slower)
    plan4 = plan_graph_pipeline(graph, top, segment_times=st, transfer_k=1.0, search=False,
                                objective="latency", power=power)
    assert plan4.mode == "pipeline"


@pytest.mark.parametrize("parallel_runs, chosen, predicted", [
    ((10.0, 9.0, 11.0, 8.0, 9.5, 9.0), "parallel", 9.0),  # steady: the best trial stays chosen
    ((10.0, 3.0, 4.0), "pipeline", 6.0),     # a lucky first trial: the play-off overturns it
    ((10.0, 30.0, 9.0, 30.0, 10.0, 10.0), "parallel", 10.0),  # one outlier run sets nothing
    ((20.0, 5.0, 6.5), "pipeline", 6.0),     # the trial that picked it does not count
])
def test_the_best_trials_meet_again_and_fresh_runs_predict(graph, monkeypatch, parallel_runs,
                                                           chosen, predicted):
    """The best few candidates by their trial are run again, in turn; the plan with the best
    median over those runs (not the trial that picked it) is chosen, and the median of PREDICT_RUNS fresh runs of it (not of
    the runs that chose it) is its prediction."""
    from asymo.pipeline import anyplan
    from asymo.pipeline.configs import core_configs
    from asymo.pipeline.table import LayerTimes
    from asymo.hw.topology import parse_spec

    top = parse_spec("big:0@1.0,little:1@0.5")
    cfgs = core_configs(top)
    base = np.linspace(1.0, 2.0, len(graph)) * 1e-3
    st = anyplan.SegmentTimes({"ort": LayerTimes(cfgs, np.stack([base, 2 * base], axis=1))},
                              {("ort", (0,)): base.sum()})
    calls, order, nframes = {}, [], []

    def fake_try(graph_, stages, topology, frames, timeout, mode="pipeline"):
        d = anyplan._describe(stages, mode)
        calls[d] = calls.get(d, 0) + 1
        order.append(d)
        nframes.append(frames)
        if mode == "parallel":
            rate = parallel_runs[calls[d] - 1]
        else:  # every pipeline of stages (and the single-stage run) steady at 6 / 5 / 4...
            rate = 6.0 if d.count("|") else 5.0
        return rate, [1.0 / rate] * len(stages)

    monkeypatch.setattr(anyplan, "_try", fake_try)
    monkeypatch.setattr(anyplan, "PLAYOFF_SIZE", 2)
    plan = anyplan.plan_graph_pipeline(graph, top, segment_times=st, transfer_k=0.0,
                                       search=True)
    rounds, fresh = anyplan.PLAYOFF_ROUNDS, anyplan.PREDICT_RUNS
    assert plan.mode == chosen
    assert plan.predicted_throughput == pytest.approx(predicted)
    # the two finalists, and the best single-stage run (5 frames/s: never in the top two),
    # ran PLAYOFF_ROUNDS more times each, in turn; then the chosen one PREDICT_RUNS times
    finalists = {d for d, n in calls.items() if n >= 1 + rounds}
    assert len(finalists) == 3 and plan.describe() in finalists
    assert calls[plan.describe()] == 1 + rounds + fresh
    assert sum("|" not in d for d in finalists) == 1  # the single-stage run
    tail = order[-(3 * rounds + fresh):-fresh]
    assert len(set(tail[:3])) == 3 and tail[:3] == tail[3:6]
    assert order[-fresh:] == [plan.describe()] * fresh
    # the play-off's and the prediction's runs are longer than the search's trials
    longer = anyplan.PLAYOFF_FRAMES * 8
    assert nframes[-(3 * rounds + fresh):] == [longer] * (3 * rounds + fresh)
    assert set(nframes[:-(3 * rounds + fresh)]) == {8}
    assert plan.trials[-1]["pipeline"] == plan.describe() + " (chosen)"
    assert plan.trials[-1]["measured_throughput"] == pytest.approx(predicted)
    assert len(plan.trials[-1]["measured_runs"]) == fresh
    assert len(plan.trials[-1]["play_off_runs"]) == rounds


@needs_ort
@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cpus")
def test_parallel_plan_runs_whole_frames_per_core(graph):
    """A parallel-design plan from the online search runs through ``open_plan``: outputs in
    input order and equal to the whole model's."""
    from asymo.pipeline.anyplan import GraphPlan, GraphStage
    from asymo.pipeline.stages import open_plan
    from asymo.hw.topology import parse_spec

    top = parse_spec(f"big:{CPUS[0]}@1.0,little:{CPUS[-1]}@0.5")
    W = len(graph)
    stages = [GraphStage("ort", (CPUS[0],), (0, W - 1), "bigx1", 1e-3),
              GraphStage("asymo", (CPUS[-1],), (0, W - 1), "littlex1", 2e-3)]
    plan = GraphPlan(model=graph.name, topology=top, objective="throughput", stages=stages,
                     predicted_throughput=1.0, model_throughput=1.0, predicted_latency=1.0,
                     predicted_energy=1.0, transfer_k=0.0, source="test", mode="parallel")
    x = _frames(7)
    with open_plan(graph, plan) as p:
        y, st = p.run(x)
    np.testing.assert_allclose(y, _reference(_small_cnn(), x), rtol=1e-4, atol=1e-4)
    assert st.frames == 7 and len(st.stage_busy) == 2


@needs_ort
def test_cli_pipeline_onnx(tmp_path):
    path = tmp_path / "small.onnx"
    onnx.save(_small_cnn(), str(path))
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "asymo", "pipeline", str(path), "--frames", "4",
                        "--executors", "ort", "--json", "--stages-only"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["segments"] > 3 and out["throughput"] > 0
    assert {s["executor"] for s in out["plan"]["stages"]} == {"ort"}
    assert out["plan"]["mode"] == "pipeline"
    assert not any(t["pipeline"].startswith("frames:") for t in out["plan"]["trials"])
    assert isinstance(out["prediction_ok"], bool)
    r = subprocess.run([sys.executable, "-m", "asymo", "pipeline", str(path),
                        "--executors", "nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown executor" in r.stderr


@needs_ort
def test_single_stage_plan_runs_frames_in_one_pinned_thread(graph):
    """A one-stage plan runs frame after frame in a thread pinned to its cpus (no queues),
    leaving the caller's affinity alone; a single stage must cover the whole graph."""
    from asymo.pipeline.anyplan import GraphStage
    from asymo.pipeline.runtime import KernelLevel
    from asymo.pipeline.stages import plan_runtime
    from asymo.hw.topology import parse_spec

    top = parse_spec(f"big:{CPUS[0]}@1.0")
    W = len(graph)
    before = os.sched_getaffinity(0)
    x = _frames(5)
    with plan_runtime(graph, [GraphStage("ort", (CPUS[0],), (0, W - 1), "bigx1", 1e-3)],
                      topology=top) as p:
        assert isinstance(p, KernelLevel)
        y, st = p.run(x)
    np.testing.assert_allclose(y, _reference(_small_cnn(), x), rtol=1e-4, atol=1e-4)
    assert st.frames == 5 and os.sched_getaffinity(0) == before
    with pytest.raises(ValueError, match="cover segments"):
        plan_runtime(graph, [GraphStage("ort", (CPUS[0],), (1, W - 1), "bigx1", 1e-3)],
                     topology=top)
    with pytest.raises(ValueError, match="mode"):
        plan_runtime(graph, [], "zigzag", topology=top)


@needs_ort
@pytest.mark.parametrize("kind", ["ort", "asymo"])
def test_stages_around_a_pool_onnx_shape_inference_gets_wrong(tmp_path, kind):
    """ONNX's shape inference gives a ceil-mode pool whose last window would start in the
    padding one more column than the operator gives (torch, ONNX Runtime, asymo: 13 here);
    ONNX Runtime then refused the stage's output buffer and the next stage's input."""
    torch = pytest.importorskip("torch")
    from asymo.models.torch_loader import export_onnx_bytes
    from asymo.pipeline.anyplan import GraphStage
    from asymo.pipeline.stages import plan_runtime

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.AvgPool2d(2, 2, 1, ceil_mode=True),
                              torch.nn.ReLU(), torch.nn.Conv2d(4, 5, 3)).eval()
    x = torch.randn(3, 3, 25, 25)
    path = tmp_path / "pool.onnx"
    path.write_bytes(export_onnx_bytes(net, (x[:1],)))
    g = CutGraph(str(path))
    assert [s.output_shape[2] for s in g.segments] == [25, 13, 13, 11]
    with torch.no_grad():
        ref = net(x).numpy()
    W = len(g)
    for cut in (0, 1, 2):
        stages = [GraphStage(kind, (CPUS[0],), (0, cut), "c0", 1e-3),
                  GraphStage(kind, (CPUS[-1],), (cut + 1, W - 1), "c1", 1e-3)]
        with plan_runtime(g, stages) as p:
            y, _ = p.run(x.numpy())
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@needs_ort
def test_baselines_leave_out_a_runtime_that_cannot_run_the_model(tmp_path):
    """The torch executor covers fewer operators than asymo and ONNX Runtime (HardSwish
    here): `--compare` leaves its baseline out with the reason instead of failing."""
    torch = pytest.importorskip("torch")
    from asymo.hw.topology import parse_spec
    from asymo.models.torch_loader import export_onnx_bytes
    from asymo.pipeline.compare import runtime_baselines

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Hardswish()).eval()
    path = tmp_path / "hs.onnx"
    path.write_bytes(export_onnx_bytes(net, (torch.randn(1, 3, 8, 8),)))
    skipped = {}
    base = runtime_baselines(CutGraph(str(path)), parse_spec(f"big:{CPUS[0]}@1.0"),
                             np.zeros((2, 3, 8, 8), np.float32), pause=0.0, skipped=skipped)
    assert set(base) == {"ort@all", "ort@fast"}
    assert "HardSwish" in skipped["torch"]


def test_models_the_pipeline_cannot_plan_or_run_say_why(tmp_path):
    """Two outputs (`asymo plan`, `--measured`, a file not named .onnx: GraphError
    tracebacks before), a model of element-wise layers only (planned at an infinite rate
    before) and a non-image model (refused over frames the user never passed before)."""
    import asymo
    from asymo.cli import main
    from asymo.pipeline.plan import plan_pipeline
    from asymo.pipeline.runtime import as_frames

    two = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]),
                             helper.make_node("Sigmoid", ["x"], ["b"])], "two",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                            [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                             helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    path = tmp_path / "two.bin"
    onnx.save(helper.make_model(two, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    for argv in (["plan", str(path)], ["plan", str(path), "--measured"],
                 ["pipeline", str(path), "--frames", "1"]):
        with pytest.raises(SystemExit, match="one input and one output"):
            main(argv)
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = asymo.from_onnx(helper.make_model(relu, opset_imports=[helper.make_opsetid("", 13)]))
    with pytest.raises(ValueError, match="predicts no time"):
        plan_pipeline(m)
    frames = as_frames(np.zeros((3, 16), np.float32), (16,))
    assert [f.shape for f in frames] == [(1, 16)] * 3
    with pytest.raises(ValueError, match=r"\(F, 16,\) array"):
        as_frames(np.zeros((3, 4, 4), np.float32), (16,))
