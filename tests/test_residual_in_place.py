"""A convolution's output written onto its shortcut's memory (graph_model.RESIDUAL_IN_PLACE,
bind_conv2d with residual=out): where the planner shares the storage, what a bound call does
with it, and that every network result equals the one without it bit for bit."""
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import asymo  # noqa: E402
from asymo.models import graph_model as gm  # noqa: E402
from asymo.models import reference  # noqa: E402
from asymo.ops import conv as conv_mod  # noqa: E402
from asymo.ops.conv import bind_conv2d  # noqa: E402
from asymo.runtime.pool import hold  # noqa: E402

RNG = np.random.default_rng(31)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def _residual_net(c=64, hw=7, shortcut_is_output=False, last_1x1=False):
    """x -> stem -> three blocks ``h = relu(conv(relu(conv(h))) + h)`` (1x1 then 3x3, or 3x3
    then 1x1 with ``last_1x1``; the second block's shortcut a 1x1 projection of it), the last
    block's input also a graph output when ``shortcut_is_output``."""
    k1, k2 = ((3, 1) if last_1x1 else (1, 3))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h0"], ["r0"])]
    inits = [("w0", _w(c, 3, 3, 3))]
    prev = "r0"
    for b in range(3):
        nodes += [helper.make_node("Conv", [prev, f"a{b}"], [f"p{b}"], pads=[k1 // 2] * 4),
                  helper.make_node("Relu", [f"p{b}"], [f"q{b}"]),
                  helper.make_node("Conv", [f"q{b}", f"k{b}"], [f"s{b}"], pads=[k2 // 2] * 4)]
        inits += [(f"a{b}", _w(c, c, k1, k1)), (f"k{b}", _w(c, c, k2, k2))]
        short = prev
        if b == 1:  # a projected shortcut, read by this block's sum only
            nodes.append(helper.make_node("Conv", [prev, "d1"], ["sc1"]))
            inits.append(("d1", _w(c, c, 1, 1)))
            short = "sc1"
        nodes += [helper.make_node("Add", [f"s{b}", short], [f"t{b}"]),
                  helper.make_node("Relu", [f"t{b}"], [f"h{b + 1}"])]
        prev = f"h{b + 1}"
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]),
              helper.make_node("Flatten", ["g"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shortcut_is_output:
        outs.append(helper.make_tensor_value_info("h2", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "res", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, hw, hw])], outs,
        [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _residual_convs(m):
    return [(i, n) for i, n in enumerate(m.graph.nodes)
            if n.op == "asymo.Conv" and len(n.inputs) > 3 and n.inputs[3]]


@pytest.mark.parametrize("backup_flops", [50e6, 0])
@pytest.mark.parametrize("last_1x1", [False, True])
@pytest.mark.parametrize("shortcut_is_output", [False, True])
def test_planner_shares_a_dying_shortcut_on_write_once_paths(shortcut_is_output, last_1x1,
                                                             backup_flops, monkeypatch):
    # (in plans with backups only layers of RESIDUAL_IN_PLACE_BACKUP_FLOPS or more share,
    # and their steps back nothing up; these layers have 3.6 MFLOP or less)
    monkeypatch.setattr(gm, "RESIDUAL_IN_PLACE_BACKUP_FLOPS", backup_flops)
    m = asymo.from_onnx(_residual_net(shortcut_is_output=shortcut_is_output,
                                      last_1x1=last_1x1))
    p, pb = m.plan(1), m.plan(1, backups=True)
    convs = _residual_convs(m)
    assert len(convs) == 3
    shared = 0
    for i, n in convs:
        r, y = n.inputs[3], n.outputs[0]
        # (the block output that is also a graph output keeps its own memory, and so does
        # the block reading it as its shortcut: the caller gets it back)
        ok = (p.kernels[n.name] in gm.RESIDUAL_IN_PLACE_PATHS
              and not (shortcut_is_output and "h2" in (r, y)))
        assert (p.storage[y] == p.storage[r]) is ok, (n.name, p.kernels[n.name])
        shared += ok
        # where tasks may be backed up, only above the limit
        assert (pb.storage[y] == pb.storage[r]) is (ok and not backup_flops)
    # an instance of the plan with backups bound to two clusters: the layers that share back
    # nothing up, the others do (every path here writes its outputs once)
    if len(os.sched_getaffinity(0)) < 2:
        return
    inst = gm._Instance(m.graph, pb, m._conv_weights, m._matvec, m._blocked_weight)
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    with asymo.Pool(f"big:{c0}@1.0,little:{c1}@0.5") as pool, hold(pool):
        steps = inst._steps_for(pool)
        for i, n in convs:
            flags = [args[5] for _fn, args in steps[i].calls]
            backed = any(f & conv_mod.lib.ASYMO_RUN_BACKUP for f in flags)
            assert backed is (pb.storage[n.outputs[0]] != pb.storage[n.inputs[3]]), n.name
    if all(p.kernels[n.name] in gm.RESIDUAL_IN_PLACE_PATHS for _, n in convs):
        assert shared == (1 if shortcut_is_output else 3)
    # off: nothing shared
    gm_off = asymo.from_onnx(_residual_net(shortcut_is_output=shortcut_is_output))
    old = gm.RESIDUAL_IN_PLACE
    gm.RESIDUAL_IN_PLACE = False
    try:
        q = gm_off.plan(1)
    finally:
        gm.RESIDUAL_IN_PLACE = old
    assert all(q.storage[n.outputs[0]] != q.storage[n.inputs[3]]
               for _, n in _residual_convs(gm_off))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cpus")
@pytest.mark.parametrize("c,hw,last_1x1", [(64, 7, False), (32, 14, False), (64, 14, True),
                                           (32, 28, True)])
def test_results_equal_the_unshared_plan_bit_for_bit(c, hw, last_1x1, monkeypatch):
    # the shortcut added by 3x3 (rows path at 7 x 7, Winograd at 14 x 14: not shared) and 1x1
    # layers (pointwise forms), on one worker, two workers of one cluster and two clusters
    # (whose plans back tasks up: shared too, the limit lowered, those layers backing nothing
    # up), batches 1 and 3, repeated calls; against ONNX Runtime too
    monkeypatch.setattr(gm, "RESIDUAL_IN_PLACE_BACKUP_FLOPS", 0)
    ort = pytest.importorskip("onnxruntime")
    model = _residual_net(c, hw, shortcut_is_output=True, last_1x1=last_1x1)
    data = model.SerializeToString()
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    pools = [asymo.Pool(f"c0:{c0}"), asymo.Pool(f"c0:{c0},{c1}"),
             asymo.Pool(f"big:{c0}@1.0,little:{c1}@0.5")]
    on = asymo.from_onnx(data)
    monkeypatch.setattr(gm, "RESIDUAL_IN_PLACE", False)
    off = asymo.from_onnx(data)
    off.plan(1), off.plan(3), off.plan(1, backups=True), off.plan(3, backups=True)
    monkeypatch.setattr(gm, "RESIDUAL_IN_PLACE", True)
    assert any(on.plan(1).storage[n.outputs[0]] == on.plan(1).storage[n.inputs[3]]
               for _, n in _residual_convs(on)) or not any(
        on.plan(1).kernels[n.name] in gm.RESIDUAL_IN_PLACE_PATHS for _, n in _residual_convs(on))
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    try:
        for batch in (1, 3):
            x = RNG.standard_normal((batch, 3, hw, hw)).astype(np.float32)
            want = sess.run(None, {"x": x})
            for pool in pools:
                for _ in range(2):
                    got, got_h = on(x, pool=pool)
                    ref, ref_h = off(x, pool=pool)
                    np.testing.assert_array_equal(got, ref)
                    np.testing.assert_array_equal(got_h, ref_h)
                    for a, b in ((got, want[0]), (got_h, want[1])):  # (atol by magnitude)
                        np.testing.assert_allclose(a, b, rtol=1e-4,
                                                   atol=1e-5 * max(1.0, np.abs(b).max()))
    finally:
        for pool in pools:
            pool.close()


def _conv_ref(x, w, b):
    return reference.conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                            (1, 1), ((0, 0), (0, 0)))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cpus")
def test_bound_call_adds_the_shortcut_in_place_or_copies_it():
    # residual=out: each call adds the layer to what out holds (a write-once path: in place,
    # its jobs backing nothing up even where backups are allowed; a path that adds its K
    # blocks into the output: the residual copied first, the same sums)
    x, w, b = _w(1, 64, 7, 7), _w(96, 64, 1, 1), _w(96)
    conv = _conv_ref(x, w, b)
    r0 = _w(1, 96, 7, 7)
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    cases = [("c0:%d,%d" % (c0, c1), False, {}),
             ("big:%d@1.0,little:%d@0.5" % (c0, c1), True, {}),
             ("c0:%d,%d" % (c0, c1), False, {"POINTWISE": "off", "ROWS": "off"})]
    for spec, backup, settings in cases:
        saved = {k: getattr(conv_mod, k) for k in settings}
        for k, v in settings.items():
            setattr(conv_mod, k, v)
        try:
            with asymo.Pool(spec) as pool:
                y = r0.copy()
                bound = bind_conv2d(x, w, b, residual=y, out=y, pool=pool, backup=backup)
                path = conv_mod.conv_path(x.shape, w.shape, residual=True)
                in_place = path in ("pointwise runs", "pointwise rows", "rows")
                assert (bound.calls is not None) is in_place, (spec, backup, path)
                if in_place:
                    assert not any(args[5] & conv_mod.lib.ASYMO_RUN_BACKUP
                                   for _fn, args in bound.calls)
                with hold(pool):
                    bound()
                    np.testing.assert_allclose(y, conv + r0, rtol=1e-4, atol=1e-4)
                    bound()
                    np.testing.assert_allclose(y, 2 * conv + r0, rtol=1e-4, atol=1e-4)
        finally:
            for k, v in saved.items():
                setattr(conv_mod, k, v)


def test_a_layer_reading_its_shortcut_as_input_too_keeps_its_own_memory():
    # the input a view of the shortcut (a reshape to the same shape): writing onto the
    # shortcut would overwrite what the layer's other tasks still read
    ort = pytest.importorskip("onnxruntime")
    c = 64
    nodes = [helper.make_node("Conv", ["x", "w0"], ["r"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["r", "shape"], ["v"]),
             helper.make_node("Conv", ["v", "w1"], ["s"]),
             helper.make_node("Add", ["s", "r"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["g"])]
    inits = [("w0", _w(c, 3, 3, 3)), ("w1", _w(c, c, 1, 1)),
             ("shape", np.array([1, c, 7, 7], np.int64))]
    g = helper.make_graph(nodes, "view", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 7, 7])], [helper.make_tensor_value_info(
            "g", TensorProto.FLOAT, None)], [numpy_helper.from_array(v, k) for k, v in inits])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = asymo.from_onnx(model)
    conv = next(n for n in m.graph.nodes if n.op == "asymo.Conv" and len(n.inputs) > 3
                and n.inputs[3])
    p = m.plan(1)
    assert p.storage[conv.outputs[0]] != p.storage[conv.inputs[3]]
    x = RNG.standard_normal((1, 3, 7, 7)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-4)
