"""Regression tests for the failures of issue 17 (an adversarial run): each test failed before
its fix. Crashes are run in a child process so a segfault fails one test, not the suite."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import asymo
import asymo.runtime.pool as pool_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code, timeout=60, env=None):
    """Run ``code`` in a fresh interpreter; return (returncode, stdout + stderr). A hang is
    a failure (the child is killed at ``timeout``)."""
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full.pop("ASYMO_TOPOLOGY", None)
    full.update(env or {})
    try:
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                           capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"child hung for {timeout} s: {exc.stdout!r} {exc.stderr!r}")
    return p.returncode, p.stdout + p.stderr


# -- item 1: a pool closed or replaced under a running job ---------------------------------------
CLOSE_UNDER_JOB = """
import sys, threading, time
import numpy as np
import asymo
from asymo.runtime.ffi import ffi, lib
COUNT = ffi.addressof(lib, "asymo_task_count")
kind = {kind!r}
rng = np.random.default_rng(0)
a = rng.standard_normal((6, 160, 160)).astype(np.float32)
x = rng.standard_normal((1, 32, 40, 40)).astype(np.float32)
w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
errors = []
for it in range({rounds}):
    p = asymo.Pool()
    stop = False
    def loop():
        try:
            while not stop:
                if kind == "matmul3d":
                    asymo.matmul(a, a, pool=p)
                elif kind == "numba":
                    asymo.matmul(a, a, pool=p, backend="numba")
                elif kind == "conv2d":
                    asymo.conv2d(x, w, padding=1, pool=p)
                else:
                    counts = np.zeros(4096, np.int32)
                    p.parallel_for(COUNT, 4096, ctx=counts)
                    if not (counts == 1).all():
                        errors.append("a task did not run exactly once")
        except ValueError as e:  # the pool was closed before this call began: expected
            if "closed" not in str(e):
                errors.append(repr(e))
        except BaseException as e:
            errors.append(repr(e))
    t = threading.Thread(target=loop)
    t.start()
    time.sleep(0.002 * (it % 8))
    p.close()
    stop = True
    t.join(20)
    if t.is_alive():
        print("HANG")
        sys.exit(3)
print("errors", errors)
sys.exit(1 if errors else 0)
"""


@pytest.mark.parametrize("kind", ["matmul3d", "conv2d", "numba", "parallel_for"])
def test_close_waits_for_jobs_of_every_kind(kind):
    if kind == "numba":
        pytest.importorskip("numba")
    # (the first Numba run compiles its kernels: minutes on a busy 2-core machine)
    rc, out = run_child(CLOSE_UNDER_JOB.format(kind=kind, rounds=6 if kind == "numba" else 30),
                        timeout=300 if kind == "numba" else 60)
    assert rc == 0, out


def test_replacing_the_default_pool_never_breaks_a_running_job():
    # threads compute on the default pool while the main thread switches ASYMO_TOPOLOGY and
    # calls get_pool(): each switch replaces the default pool under them
    code = """
    import os, sys, threading, time
    import numpy as np
    import asymo
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 160, 160)).astype(np.float32)
    ref = np.matmul(a, a)
    x = rng.standard_normal((1, 32, 40, 40)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    cref = asymo.conv2d(x, w, padding=1)
    errors, done, stop = [], [0, 0], False
    def loop(i):
        while not stop:
            try:
                if i == 0:
                    ok = np.allclose(asymo.matmul(a, a), ref, rtol=1e-3, atol=1e-2)
                else:
                    ok = np.allclose(asymo.conv2d(x, w, padding=1), cref, rtol=1e-3, atol=1e-2)
                if not ok:
                    errors.append("wrong result")
                done[i] += 1
            except BaseException as e:
                errors.append(repr(e))
    ts = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for i in range(30):
        if i % 2:
            os.environ["ASYMO_TOPOLOGY"] = "solo:0@1"
        else:
            os.environ.pop("ASYMO_TOPOLOGY", None)
        asymo.get_pool()
        time.sleep(0.01)
    stop = True
    for t in ts:
        t.join(20)
    if any(t.is_alive() for t in ts):
        print("HANG")
        sys.exit(3)
    print("done", done, "errors", errors[:5])
    sys.exit(1 if errors or min(done) == 0 else 0)
    """
    rc, out = run_child(code)
    assert rc == 0, out


def test_close_from_a_thread_that_holds_the_pool_raises():
    p = asymo.Pool()
    try:
        with pool_mod.hold(p):
            with pytest.raises(RuntimeError, match="running a job on it"):
                p.close()
            assert not p.closed
    finally:
        p.close()
    assert p.closed
    with pytest.raises(ValueError, match="closed"):
        pool_mod.acquire(p)


def test_retired_pool_lives_until_its_last_job_ends():
    p = asymo.Pool()

    p._acquire()  # a job is running on it
    p._retire()  # what replacing the default pool does
    assert p.closed and not p._dead
    # the running job may go on using it, even for nested holds
    with pool_mod.hold(p):
        assert p.limit >= 1
    p._release()
    assert p._dead


# -- item 2: conv2d with out= aliasing its input -------------------------------------------------
@pytest.mark.parametrize("channels, k, groups, pad", [(32, 3, 1, 1), (32, 1, 1, 0),
                                                       (32, 3, 32, 1), (32, 3, 4, 1)])
def test_conv2d_out_aliasing_input(channels, k, groups, pad):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, channels, 28, 28)).astype(np.float32)
    w = rng.standard_normal((channels, channels // groups, k, k)).astype(np.float32)
    ref = asymo.conv2d(x.copy(), w, padding=pad, groups=groups)
    r = asymo.conv2d(x, w, padding=pad, groups=groups, out=x)
    assert r is x
    np.testing.assert_allclose(r, ref, rtol=1e-4, atol=1e-3)


def test_conv2d_out_aliasing_weight_and_bias():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
    # out is a view of the same buffer as the bias: (1, 4, 2, 2) outputs, 16 floats
    buf = rng.standard_normal(16).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    bias = buf[:4]
    ref = asymo.conv2d(x, w, bias.copy())
    r = asymo.conv2d(x, w, bias, out=buf.reshape(1, 4, 2, 2))
    np.testing.assert_allclose(r, ref, rtol=1e-5, atol=1e-4)


# -- item 8 (conv2d): argument types as torch, no input channels as torch ------------------------
@pytest.mark.parametrize("stride", ["12", b"12", (1.9, 2.7), 1.5, (True, 1), True,
                                    np.float32(2)])
def test_conv2d_stride_types(stride):
    x = np.zeros((1, 2, 6, 6), np.float32)
    w = np.zeros((2, 2, 3, 3), np.float32)
    with pytest.raises(TypeError, match="stride must be an int or a pair of ints"):
        asymo.conv2d(x, w, stride=stride)
    with pytest.raises(TypeError, match="padding must be an int or a pair of ints"):
        asymo.conv2d(x, w, padding=(1.5, 1))
    assert asymo.conv2d(x, w, stride=(np.int64(2), 1)).shape == (1, 2, 2, 4)


def test_conv2d_no_input_channels_is_empty_as_in_torch():
    x = np.zeros((2, 0, 5, 5), np.float32)
    w = np.zeros((4, 0, 3, 3), np.float32)
    assert asymo.conv2d(x, w, padding=1).shape == (2, 0, 5, 5)
    assert asymo.conv2d(x, w, np.ones(4, np.float32)).shape == (2, 0, 3, 3)
    assert asymo.conv2d(x[0], w).shape == (0, 3, 3)
    torch = pytest.importorskip("torch")
    t = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1)
    assert tuple(t.shape) == (2, 0, 5, 5)


# -- item 8: K >= 2^31 on broadcast views ------------------------------------------------------------
def test_matmul_k_beyond_int32_on_broadcast_views_as_numpy():
    k = 2 ** 31
    a = np.broadcast_to(np.float32(1), (k,))
    b = np.broadcast_to(np.float32(0.5), (k,))
    ref = np.matmul(a, b)  # NumPy's loop needs no copy of the operands
    np.testing.assert_array_equal(asymo.matmul(a, b), ref)
    a2 = np.broadcast_to(np.float32(1), (1, k))
    np.testing.assert_array_equal(asymo.matmul(a2, b), np.matmul(a2, b))


# -- item 8: argument validation of parallel_for and plan_gemm --------------------------------------
def test_parallel_for_split_rejects_bools():
    from asymo.runtime.ffi import ffi, lib
    count = ffi.addressof(lib, "asymo_task_count")
    with asymo.Pool("big:0@1.0,little:1@0.5") as p:
        c = np.zeros(4, np.int32)
        for bad in ([True, 3], [np.True_, 3], ["1", 3]):
            with pytest.raises(TypeError, match="split entries must be numbers"):
                p.parallel_for(count, 4, ctx=c, split=bad)
        assert not c.any()
        p.parallel_for(count, 4, ctx=c, split=[1, 3])
        assert (c == 1).all()


def test_plan_gemm_rejects_fractional_blocks():
    from asymo.plan.gemm import plan_gemm
    for bad in ((8.5, 64, 64), (8, 64, True), ((8, 64, 64.0),)):
        with pytest.raises(TypeError, match="integers"):
            plan_gemm(64, 64, 64, blocks=bad)
    with pytest.raises(ValueError, match=">= 1"):
        plan_gemm(64, 64, 64, blocks=(0, 64, 64))
    with pytest.raises(TypeError, match="M must be an integer"):
        plan_gemm(64.5, 64, 64)
    assert plan_gemm(64, 64, 64, blocks=(np.int64(8), 64, 64)).blocks[0] == (8, 64, 64)


# -- item 8: the per-pool calibration cache does not grow with every pool ---------------------------
def test_per_pool_cache_forgets_collected_pools():
    import gc

    from asymo.plan import matmul as mplan
    a = np.ones((256, 256), np.float32)
    before = len(mplan._pool_cals)
    pools = [asymo.Pool() for _ in range(12)]  # alive together: distinct ids
    for p in pools:
        asymo.matmul(a, a, pool=p)
        p.close()
    assert len(mplan._pool_cals) >= before + 12
    del pools, p
    gc.collect()
    assert len(mplan._pool_cals) <= before


# -- item 8 (user trial): asymo info --json | head, energy units, progress bars ---------------------
def test_info_json_into_a_closed_pipe_is_quiet():
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-m', 'asymo', 'info', '--json'], "
            "stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
            "p.stdout.readline(); p.stdout.close()\n"
            "err = p.stderr.read().decode(); p.wait()\n"
            "print('RC', p.returncode); print(err)\n")
    rc, out = run_child(code)
    assert rc == 0 and "RC " in out, out
    assert "Traceback" not in out and "BrokenPipeError" not in out, out


def test_plan_prints_energy_with_its_unit(capsys):
    from asymo.cli import main
    assert main(["plan", "squeezenet"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("energy per image")]
    assert line and line[0].split(":")[1].split()[1] == "J", line


class _BarRecorder:
    """Replace tqdm.tqdm by a subclass recording (n, total) after every update."""

    def __init__(self, monkeypatch):
        import tqdm as tqdm_mod
        bars = self.bars = []

        class Recorder(tqdm_mod.tqdm):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                self.first_total = self.total
                self.seen = []
                bars.append(self)

            def update(self, n=1):
                super().update(n)
                self.seen.append((self.n, self.total))

        monkeypatch.setattr(tqdm_mod, "tqdm", Recorder)

    def check(self):
        assert self.bars
        for bar in self.bars:
            assert all(total == bar.first_total and n <= total for n, total in bar.seen), \
                bar.seen


def test_scaling_progress_total_is_fixed(monkeypatch):
    """asymo bench scaling's bar: disturbed samples stall it, never move its end."""
    import contextlib

    from asymo.lab import sampling

    rec = _BarRecorder(monkeypatch)

    @contextlib.contextmanager
    def factory():
        yield lambda: None

    items = [(("a",), factory, True), (("b",), factory, False)]
    # every sample counts as disturbed: each item is sampled 4 x repeats times
    samples = sampling.measure_items(items, 3, 1e-5, True, max_external=-1.0)
    assert all(len(v) == sampling.MAX_ROUNDS_FACTOR * 3 for v in samples.values())
    rec.check()
    assert rec.bars[0].n == rec.bars[0].total


def test_progress_totals_never_change(monkeypatch, tmp_path):
    """asymo calibrate's bars: a total fixed when a bar starts, never passed."""
    from asymo.calibrate import gemm as calib
    from asymo.hw.topology import parse_spec
    from test_calibrate import FakeTimer

    rec = _BarRecorder(monkeypatch)
    bars = rec.bars
    monkeypatch.setenv("ASYMO_PROFILE", str(tmp_path / "profile.json"))
    calib.calibrate_gemm(parse_spec("big:0@1.0,little:1@0.5"), set_name="tiny",
                         progress=True, stream=open(os.devnull, "w"),
                         timer=FakeTimer({"big": 1.0, "little": 0.5}), save=False,
                         path=str(tmp_path / "profile.json"))
    assert len(bars) >= 2
    rec.check()
