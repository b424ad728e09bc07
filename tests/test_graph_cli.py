"""asymo run / plan / bench MODEL.onnx, and the pipeline's prediction warning (small model,
bounded time)."""
import json
import os
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from asymo.cli import main  # noqa: E402
from asymo.cli.bench import normalize_argv  # noqa: E402
from asymo.cli.pipeline import prediction_warnings  # noqa: E402


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory):
    rng = np.random.default_rng(0)
    def w(*s):
        return numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32))
    inits = [w(8, 3, 3, 3), w(8, 8, 3, 3), w(10, 8)]
    for t, n in zip(inits, ("w1", "w2", "fw")):
        t.name = n
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["c", "w2"], ["d"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["d", "c"], ["e"]),
             helper.make_node("Relu", ["e"], ["f"]),
             helper.make_node("GlobalAveragePool", ["f"], ["g"]),
             helper.make_node("Flatten", ["g"], ["h"]),
             helper.make_node("Gemm", ["h", "fw"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path_factory.mktemp("m") / "small.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_run_prints_timing_and_top5(small_onnx, capsys, tmp_path):
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(small_onnx), "--input", str(tmp_path / "x.npy"), "--repeats", "2",
                 "--json", "--output", str(tmp_path / "y.npy")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["input_shape"] == [2, 3, 16, 16] and res["output_shape"] == [2, 10]
    assert res["planned_nodes"] < res["nodes"] and len(res["top5"]) == 5
    assert np.load(tmp_path / "y.npy").shape == (2, 10)
    with pytest.raises(SystemExit, match="must have shape"):
        np.save(tmp_path / "bad.npy", x[:, :, :8])
        main(["run", str(small_onnx), "--input", str(tmp_path / "bad.npy")])
    (tmp_path / "bad.onnx").write_bytes(small_onnx.read_bytes()[:100])
    with pytest.raises(SystemExit, match="corrupt or truncated"):
        main(["run", str(tmp_path / "bad.onnx")])


def test_plan_accepts_onnx(small_onnx, capsys):
    assert main(["plan", str(small_onnx), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stages"]
    assert main(["plan", str(small_onnx), "--objective", "energy"]) == 0
    assert "energy" in capsys.readouterr().out


def test_bench_model_short(small_onnx, capsys, tmp_path):
    assert normalize_argv(["bench", "m.onnx", "--json", "f"]) == ["bench", "model", "m.onnx",
                                                                  "--json", "f"]
    assert normalize_argv(["bench", "scaling"]) == ["bench", "scaling"]
    out = tmp_path / "b.json"
    assert main(["bench", str(small_onnx), "--repeats", "1", "--min-time", "0.005",
                 "--no-progress", "--compare", "ort", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "machine:" in text and "asymo" in text
    res = json.loads(out.read_text())
    assert "asymo" in res["seconds"] and res["output_shape"] == [1, 10]
    with pytest.raises(SystemExit, match="--compare"):
        main(["bench", str(small_onnx), "--compare", "tvm"])


def test_pipeline_prediction_warning():
    ok = {"throughput": 90.0, "predicted_throughput": 100.0}
    assert prediction_warnings(ok) == []
    low = {"throughput": 34.3, "predicted_throughput": 73.3,
           "kernel_level": {"throughput": 50.0, "predicted_throughput": 52.0}}
    w = prediction_warnings(low)
    assert len(w) == 1 and "0.47x" in w[0] and "re-measure" in w[0].lower()


def test_demo_network_section(capsys):
    pytest.importorskip("torch")
    from asymo.cli.demo import network_demo

    res = network_demo("squeezenet1_1", size=64, repeats=1, min_time=0.01)
    text = capsys.readouterr().out
    assert "how to read it" in text and "lower is better" in text
    assert res["seconds"]["asymo"] > 0 and "torch" in res["seconds"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cpus")
def test_bench_model_reports_backup_tasks_on_pools_of_several_clusters(small_onnx):
    import warnings

    import asymo
    from asymo.cli.bench_model import compare, format_table

    m = asymo.from_onnx(str(small_onnx))
    x = np.random.default_rng(0).standard_normal((1,) + m.input_shape).astype(np.float32)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        two = asymo.Pool(f"big:{cpus[0]}@1.0,little:{cpus[1]}@0.5")
    with two:
        res = compare(m, x, compare=(), pool=two, repeats=1, min_time=0.005, pause=0.0,
                      progress=False)
    bk = res["asymo_backups"]
    # every asymo call of the rounds and their warm-ups is counted; the counters are the
    # pool's own (no core stops here, so few or no backups)
    assert bk["calls"] >= 3
    assert bk["tasks_backup"] >= bk["tasks_superseded"] >= 0
    assert bk["backups_per_call"] == pytest.approx(bk["tasks_backup"] / bk["calls"])
    assert "backup tasks:" in format_table(res)
    res = compare(m, x, compare=(), repeats=1, min_time=0.005, pause=0.0, progress=False)
    assert res["asymo_backups"] is None and "backup tasks:" not in format_table(res)


def _onnx_file(path, nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_run_bad_input_output_and_batch_are_one_line_errors(small_onnx, tmp_path, monkeypatch):
    # these were FileNotFoundError / _ArrayMemoryError tracebacks
    with pytest.raises(SystemExit, match="cannot read --input .*No such file"):
        main(["run", str(small_onnx), "--input", str(tmp_path / "missing.npy")])
    # the output path is checked before the model is even loaded (it failed after the run)
    import asymo.cli.run as run_mod

    monkeypatch.setattr(run_mod, "load_onnx", lambda p: pytest.fail("loaded before --output"))
    with pytest.raises(SystemExit, match="--output .*does not exist"):
        main(["run", str(small_onnx), "--output", str(tmp_path / "no" / "y.npy")])
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="--batch 1000000000000 inputs of shape .* GiB"):
        main(["run", str(small_onnx), "--repeats", "0", "--batch", str(10 ** 12)])


def test_run_report_of_an_unbatched_input_and_of_one_score_per_image(small_onnx, tmp_path,
                                                                     capsys):
    x = np.random.default_rng(1).standard_normal((3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(small_onnx), "--input", str(tmp_path / "x.npy"), "--repeats", "0",
                 "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    np.save(tmp_path / "x1.npy", x[None])
    assert main(["run", str(small_onnx), "--input", str(tmp_path / "x1.npy"), "--repeats",
                 "0", "--json"]) == 0
    batched = json.loads(capsys.readouterr().out)
    # one image without the batch dimension: not 3 images (C was taken for the batch), and
    # the top-5 of its 10 classes (it listed one entry)
    assert one["unbatched"] and one["images"] == 1 and one["output_shape"] == [10]
    assert one["gflop"] == pytest.approx(batched["gflop"])
    assert len(one["top5"]) == 5 and one["top5"] == batched["top5"]
    assert main(["run", str(small_onnx), "--input", str(tmp_path / "x.npy"), "--repeats",
                 "0"]) == 0
    assert "one image, no batch dimension" in capsys.readouterr().out
    # an output of one number per image has no top-5
    p = _onnx_file(tmp_path / "mean.onnx",
                   [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
                    helper.make_node("Flatten", ["g"], ["y"])],
                   [_vi("x", ["N", 1, 4, 4])], [_vi("y", None)])
    assert main(["run", str(p), "--repeats", "0", "--batch", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["output_shape"] == [2, 1] and res["top5"] is None
    assert main(["run", str(p), "--repeats", "0"]) == 0
    assert "top-5" not in capsys.readouterr().out


def test_run_json_with_nan_outputs_is_valid_json(small_onnx, tmp_path, capsys):
    np.save(tmp_path / "nan.npy", np.full((1, 3, 16, 16), np.nan, np.float32))
    assert main(["run", str(small_onnx), "--input", str(tmp_path / "nan.npy"), "--repeats",
                 "0", "--json"]) == 0
    text = capsys.readouterr().out

    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")
    res = json.loads(text, parse_constant=refuse)  # bare NaN tokens were printed
    assert [score for _, score in res["top5"]] == [None] * 5
    assert "written as null" in res["json_note"]


def test_every_commands_json_goes_through_one_strict_writer():
    # json_text: non-finite numbers as null with a note, json.dumps's default= passed on;
    # no command of the CLI writes JSON any other way
    import pathlib

    from asymo.cli.options import json_text

    doc = json.loads(json_text({"a": [float("inf"), 1.0], "b": np.float32(1.5)}, default=str))
    assert doc == {"a": [None, 1.0], "b": "1.5",
                   "json_note": "1 non-finite number(s) (not a number, infinite) written as null"}
    assert json.loads(json_text([float("nan")])) == [None]
    cli = pathlib.Path(__file__).resolve().parent.parent / "asymo" / "cli"
    direct = [f.name for f in cli.glob("*.py") if f.name != "options.py"
              and re.search(r"json\.dumps?\(|^\s*import json$", f.read_text(), re.M)]
    assert direct == []


@pytest.mark.parametrize("argv, msg", [
    (["--json", "/nonexistent-asymo/x.json"], "--json .*does not exist"),
    (["--plot", "/nonexistent-asymo/x.png"], "--plot .*does not exist"),
    (["--plot", "b.xyz"], "unknown image format 'xyz'"),
    (["--emulate", "100000:0.5"], "--emulate 100000:0.5: cpu 100000 is not in this process"),
    (["--min-time", "inf"], "--min-time: must be a positive number of seconds"),
    (["--min-time", "nan"], "--min-time: must be a positive number of seconds"),
])
def test_bench_model_bad_options_fail_before_the_run(small_onnx, monkeypatch, capsys, argv,
                                                      msg):
    import re

    import asymo.cli.bench_model as bm

    # these failed after the whole benchmark, or with tracebacks
    monkeypatch.setattr(bm, "compare", lambda *a, **k: pytest.fail("benchmark ran"))
    with pytest.raises(SystemExit) as exc:
        main(["bench", str(small_onnx), "--no-progress", *argv])
    text = exc.value.code if isinstance(exc.value.code, str) else capsys.readouterr().err
    assert exc.value.code != 0 and re.search(msg, text), text
    assert "Traceback" not in text


def test_bench_model_reports_a_library_that_cannot_run_the_model(tmp_path):
    pytest.importorskip("onnxruntime")
    import asymo
    from asymo.cli.bench_model import compare, format_table

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32),
                                "w")
    # a static batch of 1 (torch.onnx.export's default) run with a batch of 2: asymo runs
    # it, ONNX Runtime refuses the input at its first call
    static = _onnx_file(tmp_path / "static.onnx", [helper.make_node("Conv", ["x", "w"], ["y"])],
                        [_vi("x", [1, 3, 6, 6])], [_vi("y", [1, 4, 4, 4])], [w])
    # an LRN of even size: asymo runs it, ONNX Runtime refuses to load it
    lrn = _onnx_file(tmp_path / "lrn.onnx", [helper.make_node("LRN", ["x"], ["y"], size=2)],
                     [_vi("x", [1, 3, 4, 4])], [_vi("y", [1, 3, 4, 4])])
    for path, batch, why in ((static, 2, "invalid dimensions"), (lrn, 1, "size_ % 2")):
        m = asymo.from_onnx(str(path))
        x = rng.standard_normal((batch,) + m.input_shape).astype(np.float32)
        res = compare(m, x, compare=("ort",), onnx_bytes=path.read_bytes(), repeats=1,
                      min_time=0.001, pause=0.0, progress=False)
        assert set(res["failed"]) == {"ort", "ort 1 core"} and why in res["failed"]["ort"]
        assert "asymo" in res["seconds"] and "ort" not in res["seconds"]
        assert res["best_other"] is None
        text = format_table(res)
        assert "failed" in text and text.count("ort did not run the model: ") == 1
        assert "\n" not in res["failed"]["ort"]


def test_bench_model_says_when_outputs_differ(small_onnx):
    import asymo
    from asymo.cli.bench_model import AGREE_RTOL, compare, format_table

    m = asymo.from_onnx(str(small_onnx))
    x = np.random.default_rng(0).standard_normal((1,) + m.input_shape).astype(np.float32)
    res = compare(m, x, compare=(), repeats=1, min_time=0.001, pause=0.0, progress=False)
    assert res["agreement_rtol"] == AGREE_RTOL == 1e-3
    assert f"outputs agree within {AGREE_RTOL:g}" in format_table(res)
    # 2.5 was printed as "outputs agree: ... = 2.5e+00"
    for bad, shown in ((2.5, "torch 2.5e+00"), (float("nan"), "torch nan"),
                       (None, "torch (another number or size of outputs)")):
        res["max_rel_diff_vs_asymo"] = {"asymo 1 core": 0.0, "torch": bad}
        text = format_table(res)
        assert "outputs agree" not in text
        assert "outputs DIFFER from asymo's by more than 0.001" in text and shown in text


def test_bench_model_two_outputs_and_two_inputs(tmp_path, capsys):
    import asymo
    from asymo.cli.bench_model import compare

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32),
                                "w")
    two_out = _onnx_file(tmp_path / "two_out.onnx",
                         [helper.make_node("Conv", ["x", "w"], ["c"]),
                          helper.make_node("GlobalAveragePool", ["c"], ["p"]),
                          helper.make_node("Flatten", ["p"], ["y1"]),
                          helper.make_node("Relu", ["c"], ["y2"])],
                         [_vi("x", ["N", 3, 6, 6])], [_vi("y1", None), _vi("y2", None)], [w])
    m = asymo.from_onnx(str(two_out))
    x = rng.standard_normal((1,) + m.input_shape).astype(np.float32)
    have_ort = __import__("importlib").util.find_spec("onnxruntime") is not None
    # both outputs are compared (this was a ValueError traceback, np.asarray of the tuple)
    res = compare(m, x, compare=("ort",), onnx_bytes=two_out.read_bytes(), repeats=1,
                  min_time=0.001, pause=0.0, progress=False)
    assert res["output_shapes"] == [[1, 4], [1, 4, 4, 4]] and res["output_shape"] == [1, 4]
    if have_ort:
        assert res["max_rel_diff_vs_asymo"]["ort"] < 1e-5
    two_in = _onnx_file(tmp_path / "two_in.onnx", [helper.make_node("Add", ["x", "z"], ["y"])],
                        [_vi("x", ["N", 3, 4, 4]), _vi("z", ["N", 3, 4, 4])],
                        [_vi("y", None)])
    # `asymo run`'s one line (a TypeError traceback from the timed rounds)
    with pytest.raises(SystemExit, match=r"asymo bench: .*expected 2 input\(s\)"):
        main(["bench", str(two_in), "--no-progress", "--repeats", "1"])
