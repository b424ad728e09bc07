"""A bounded stress run (issue 17): threads submit matmul, conv2d and parallel_for jobs while
other threads create, replace and close pools and an emulation starts and stops. It must end
with no crash, no hang and every result right. Runs in a child process (a crash fails this
test, not the suite), about 15 s."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STRESS = r"""
import os, sys, threading, time, traceback, warnings
import numpy as np
import asymo
import asymo.lab.emulate as E
from asymo.runtime import pool as pool_mod
from asymo.runtime.ffi import ffi, lib

DURATION = float(sys.argv[1])
warnings.simplefilter("ignore")  # unpinned workers, emulation notes
COUNT = ffi.addressof(lib, "asymo_task_count")
rng = np.random.default_rng(0)
A2 = rng.standard_normal((200, 300)).astype(np.float32)
B2 = rng.standard_normal((300, 150)).astype(np.float32)
A3 = rng.standard_normal((4, 96, 128))
B3 = rng.standard_normal((4, 128, 64))
REF2, REF3 = A2 @ B2, A3 @ B3
X = rng.standard_normal((1, 16, 24, 24)).astype(np.float32)
W = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
CREF = asymo.conv2d(X, W, padding=1)
XD = rng.standard_normal((1, 32, 20, 20)).astype(np.float32)
WD = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
DREF = asymo.conv2d(XD, WD, padding=1, groups=32)

stop = threading.Event()
errors, counts = [], {}
lock = threading.Lock()
shared = {"pool": asymo.Pool()}


def record(name):
    with lock:
        counts[name] = counts.get(name, 0) + 1


def fail(name, what):
    with lock:
        errors.append(f"{name}: {what}")


def guarded(name, body):
    def run():
        while not stop.is_set():
            try:
                body(name)
            except BaseException:
                fail(name, traceback.format_exc(limit=4))
                return
    return threading.Thread(target=run, name=name, daemon=True)


def matmul_default(name):
    r = asymo.matmul(A2, B2)
    if not np.allclose(r, REF2, rtol=1e-4, atol=1e-3):
        fail(name, "wrong 2-D product")
    r = asymo.matmul(A3, B3)
    if not np.allclose(r, REF3, rtol=1e-10, atol=1e-9):
        fail(name, "wrong batched product")
    record(name)


def matmul_numba(name):
    r = asymo.matmul(A3, B3, backend="numba")
    if not np.allclose(r, REF3, rtol=1e-10, atol=1e-9):
        fail(name, "wrong Numba product")
    record(name)


def conv(name):
    if not np.allclose(asymo.conv2d(X, W, padding=1), CREF, rtol=1e-4, atol=1e-3):
        fail(name, "wrong conv2d")
    if not np.allclose(asymo.conv2d(XD, WD, padding=1, groups=32), DREF, rtol=1e-4,
                       atol=1e-3):
        fail(name, "wrong depthwise conv2d")
    record(name)


def parallel_for_default(name):
    c = np.zeros(5000, np.int32)
    with pool_mod.hold() as p:  # the default pool, held: replacing it cannot break the job
        p.parallel_for(COUNT, 5000, ctx=c)
    if not (c == 1).all():
        fail(name, "a task did not run exactly once")
    record(name)


def parallel_for_shared(name):
    # a pool another thread closes and replaces: a closed pool is a clear ValueError before
    # the job starts, never a crash, a hang or a half-done job
    c = np.zeros(3000, np.int32)
    p = shared["pool"]
    try:
        p.parallel_for(COUNT, 3000, ctx=c)
    except ValueError as exc:
        if "closed" not in str(exc):
            raise
        if c.any():
            fail(name, "a job on a closed pool ran some tasks")
        record(name + " (closed)")
        return
    if not (c == 1).all():
        fail(name, "a task did not run exactly once")
    r = None
    try:
        r = asymo.matmul(A2, B2, pool=p)
    except ValueError as exc:
        if "closed" not in str(exc):
            raise
    if r is not None and not np.allclose(r, REF2, rtol=1e-4, atol=1e-3):
        fail(name, "wrong product on the shared pool")
    record(name)


def pool_churn(name):
    # new pools, used and closed, and the shared pool replaced under its users
    with asymo.Pool("a:0@1.0,b:1@0.5", policy="steal") as p:
        if not np.allclose(asymo.conv2d(X, W, padding=1, pool=p), CREF, rtol=1e-4, atol=1e-3):
            fail(name, "wrong conv2d on a fresh pool")
    old, shared["pool"] = shared["pool"], asymo.Pool()
    time.sleep(0.005)
    old.close()
    record(name)


def default_churn(name):
    i = counts.get(name, 0)
    if i % 2:
        pool_mod.reset_default_pool()
    else:
        os.environ["ASYMO_POOL_POLICY"] = "even" if i % 4 == 0 else "asymo"
        asymo.get_pool()
    time.sleep(0.02)
    record(name)


threads = [guarded("matmul", matmul_default), guarded("matmul2", matmul_default),
           guarded("numba", matmul_numba), guarded("conv2d", conv),
           guarded("parallel_for", parallel_for_default),
           guarded("parallel_for_shared", parallel_for_shared),
           guarded("pool_churn", pool_churn), guarded("default_churn", default_churn)]
asymo.matmul(A3, B3, backend="numba")  # compile the Numba kernels before the clock starts
for t in threads:
    t.start()

# the main thread starts and stops emulations (it replaces the default pool each time)
cpus = sorted(os.sched_getaffinity(0))
emulations = 0
end = time.monotonic() + DURATION
while time.monotonic() < end:
    if len(cpus) > 1 and E.realtime_available():
        try:
            with E.slow_cores({cpus[-1]: 0.5}):
                asymo.get_pool()
                time.sleep(0.15)
            emulations += 1
        except E.EmulationError as exc:  # another process's emulation holds the core
            if "another process" not in str(exc):
                raise
    time.sleep(0.1)
stop.set()
for t in threads:
    t.join(30)
hung = [t.name for t in threads if t.is_alive()]
shared["pool"].close()
print("counts", dict(sorted(counts.items())), "emulations", emulations)
if hung:
    print("HUNG", hung)
    sys.exit(3)
if errors:
    print("ERRORS", *errors[:5], sep="\n")
    sys.exit(1)
missing = [t.name for t in threads if not counts.get(t.name)]
if missing:
    print("NO PROGRESS", missing)
    sys.exit(2)
print("OK")
"""


def test_stress_jobs_while_pools_change():
    pytest.importorskip("numba")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("ASYMO_TOPOLOGY", "ASYMO_EMULATED", "ASYMO_POOL_POLICY"):
        env.pop(k, None)
    try:
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", STRESS, "12"],
                           capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the stress run hung: {exc.stdout!r} {exc.stderr[-3000:]!r}")
    out = p.stdout + p.stderr[-4000:]
    assert p.returncode == 0 and "OK" in p.stdout, out
