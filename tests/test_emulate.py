"""The asymmetry emulator: argument checks, topology/env, helper lifetime, measured speed."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import asymo.lab.emulate as E
from asymo.hw import topology as topo
from asymo.lab._native import ffi, lib  # the emulator (csrc/lab/emulate.c)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFFINITY = sorted(os.sched_getaffinity(0))
FAST_CPU, SLOW_CPU = AFFINITY[0], AFFINITY[-1]
HAVE_FIFO = E.realtime_available()

needs_emulator = [
    pytest.mark.emulator,
    pytest.mark.skipif(not HAVE_FIFO, reason="SCHED_FIFO refused (needs root or CAP_SYS_NICE)"),
    pytest.mark.skipif(len(AFFINITY) < 2, reason="needs at least 2 usable cpus"),
]


def emulator(f):
    for m in reversed(needs_emulator):
        f = m(f)
    return f


def child_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop(E.ENV_EMULATED, None)
    env.pop(E.ENV_PERIOD, None)
    env.pop(topo.ENV_VAR, None)
    env.update(extra)
    return env


def running(pid):
    """True while pid exists and is not a zombie (a zombie no longer occupies its core)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids, timeout=1.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.005)
    return not any(running(p) for p in pids)


def helpers_of(parent_pid):
    """pids of occupier helpers whose parent (by command line) is parent_pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"asymo.lab.occupier" in argv and b"--parent-pid" in argv:
            if argv[argv.index(b"--parent-pid") + 1] == str(parent_pid).encode() and running(d):
                out.append(int(d))
    return out


# -- argument checks (no helper started) -----------------------------------------------------

@pytest.mark.parametrize("speeds", [
    {1: 0.0}, {1: -0.5}, {1: 1.5}, {1: math.nan}, {1: math.inf}, {1: 0.01}, {-1: 0.5},
])
def test_bad_speeds_raise_value_error(speeds):
    with pytest.raises(ValueError):
        E.slow_cores(speeds)


@pytest.mark.parametrize("speeds", [[(1, 0.5)], {"1": 0.5}, {True: 0.5}, {1: "0.5"}, {1: None}])
def test_wrong_types_raise_type_error(speeds):
    with pytest.raises(TypeError):
        E.slow_cores(speeds)


@pytest.mark.parametrize("kw", [
    {"period": 0.0}, {"period": 1.0}, {"period": math.nan}, {"time_limit": 0},
    {"time_limit": -1}, {"time_limit": math.inf}, {"time_limit": math.nan}, {"mode": "fast"},
])
def test_bad_options_raise_value_error(kw):
    with pytest.raises(ValueError):
        E.slow_cores({SLOW_CPU: 0.5}, **kw)


def test_speed_floor_message_names_rt_throttling():
    with pytest.raises(ValueError, match="real-time"):
        E.slow_cores({1: 0.04})
    assert E.min_speed("fifo") == pytest.approx(0.05, abs=0.05)
    assert E.min_speed("approximate") == 0.0
    # The approximate mode is not throttled, so the floor does not apply there.
    E.slow_cores({1: 0.04}, mode="approximate")


def test_cpu_outside_affinity_is_refused_before_any_helper():
    with pytest.raises(ValueError, match="affinity"):
        E.slow_cores({max(AFFINITY) + 1000: 0.5}).start()
    assert helpers_of(os.getpid()) == []


def test_emulated_env_format_round_trips():
    speeds = {3: 0.75, 1: 0.5}
    text = E.format_emulated(speeds)
    assert text == "1:0.5,3:0.75"
    assert topo.parse_emulated(text) == (speeds, [])
    assert E.format_emulated({2: 1 / 3}) == "2:0.333333"


# -- the emulated topology (pure function) ----------------------------------------------------

def test_emulated_topology_splits_clusters_by_speed():
    base = topo.parse_spec("big:0-3@1.0,little:4-7@0.5")
    t = E.emulated_topology({1: 0.5, 2: 0.5, 5: 0.8}, base=base, cpus=range(8))
    got = [(c.name, c.cpus, round(c.capacity, 6)) for c in t.clusters]
    assert got == [("big", (0, 3), 1.0), ("big-emu0.5", (1, 2), 0.5),
                   ("little", (4, 6, 7), 0.5), ("little-emu0.8", (5,), 0.4)]
    assert t.emulated == {1: 0.5, 2: 0.5, 5: 0.8}
    # The env spec describes the same machine.
    again = topo.parse_spec(t.to_spec())
    assert [(c.cpus, round(c.capacity, 6)) for c in again.clusters] == \
        [(c.cpus, round(c.capacity, 6)) for c in t.clusters]


def test_emulated_topology_respects_affinity_and_renormalises():
    base = topo.parse_spec("c0:0-3@1")
    t = E.emulated_topology({2: 0.5, 3: 0.5}, base=base, cpus=[2, 3])
    assert [(c.cpus, c.capacity) for c in t.clusters] == [((2, 3), 1.0)]
    t = E.emulated_topology({0: 0.25, 1: 0.75}, base=base, cpus=[0, 1, 2])
    assert [(c.cpus, round(c.capacity, 6)) for c in t.clusters] == \
        [((2,), 1.0), ((1,), 0.75), ((0,), 0.25)]
    with pytest.raises(ValueError):
        E.emulated_topology({0: 0.5}, base=base, cpus=[9])


def test_speed_one_starts_no_helper_and_keeps_env(monkeypatch):
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    monkeypatch.delenv(E.ENV_EMULATED, raising=False)
    with E.slow_cores({SLOW_CPU: 1.0}) as emu:
        assert emu.pids == {}
        assert topo.ENV_VAR not in os.environ and E.ENV_EMULATED not in os.environ
    assert helpers_of(os.getpid()) == []


def test_cpu_slowed_by_enclosing_process_is_refused(monkeypatch):
    monkeypatch.setenv(E.ENV_EMULATED, f"{SLOW_CPU}:0.5")
    with pytest.raises(ValueError, match="already slowed"):
        E.slow_cores({SLOW_CPU: 0.7}).start()
    assert helpers_of(os.getpid()) == []


# -- the C loop and the helper's own checks ----------------------------------------------------

def run_occupier(*args):
    r, w = os.pipe()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "asymo.lab.occupier", "--ready-fd", str(w), *args],
            pass_fds=(w,), env=child_env(), capture_output=True, timeout=30)
    finally:
        os.close(w)
    with os.fdopen(r) as f:
        return proc.returncode, f.read()


def test_occupier_rejects_bad_parameters():
    rc, status = run_occupier("--cpu", str(SLOW_CPU), "--busy", "1.5", "--period-ns", "1000000",
                              "--time-limit", "1", "--mode", "fifo",
                              "--parent-pid", str(os.getpid()))
    assert rc == 2 and status == "error params 22\n"


def test_occupier_refuses_to_run_for_a_parent_that_is_gone():
    # Parent pid 1 is not the helper's parent: the same check that catches a parent which
    # died before PR_SET_PDEATHSIG was armed.
    rc, status = run_occupier("--cpu", str(SLOW_CPU), "--busy", "0.5", "--period-ns", "1000000",
                              "--time-limit", "1", "--mode", "approximate",
                              "--parent-pid", "1")
    assert rc == 2 and status == "error parent 3\n"


def test_occupy_core_spins_the_requested_share_of_each_period():
    import threading

    params = ffi.new("asymo_occupy_params *", {
        "cpu": SLOW_CPU, "busy_fraction": 0.4, "period_ns": 1_000_000, "time_limit_s": 0.2,
        "mode": lib.ASYMO_OCCUPY_FIFO if HAVE_FIFO else lib.ASYMO_OCCUPY_APPROXIMATE,
        "parent_pid": 0, "ready_fd": -1})
    stats = ffi.new("asymo_occupy_stats *")
    out = []
    # A throwaway thread: the call pins and re-prioritises the thread that makes it.
    t = threading.Thread(target=lambda: out.append(lib.asymo_occupy_core(params, stats)))
    t.start()
    t.join(10)
    assert out == [0]
    assert stats.stop_reason == lib.ASYMO_OCCUPY_TIME_LIMIT
    assert 0.19 < stats.elapsed_ns / 1e9 < 0.3
    # A wake-up later than a whole period merges periods: on this VM the timer wake-ups of a
    # SCHED_FIFO thread were measured 150-400 us late on average at times (2026-11-22, an
    # otherwise idle machine), so only a loose lower bound holds.
    assert 100 <= stats.periods + stats.skipped <= 201
    # The core is taken from the time each wake-up is due (late_ns: interrupt, switch) to the
    # end of the busy phase on the grid: at least the requested share counting the lateness,
    # never more than it in the busy phases themselves (the lateness is the host's, and can
    # reach past the busy phase, so it bounds nothing from above).
    assert (stats.busy_ns + stats.late_ns) / stats.elapsed_ns > 0.35
    assert stats.busy_ns / stats.elapsed_ns <= 0.41


# -- helper lifetime (needs SCHED_FIFO) ---------------------------------------------------------

@emulator
def test_helper_is_fifo_pinned_and_env_is_set_then_restored(monkeypatch):
    monkeypatch.delenv(E.ENV_EMULATED, raising=False)
    monkeypatch.setenv(topo.ENV_VAR, f"all:{FAST_CPU}-{SLOW_CPU}@1")
    calls = []
    monkeypatch.setattr(E, "on_topology_change",
                        [lambda: calls.append(os.environ.get(E.ENV_EMULATED))])
    with E.slow_cores({SLOW_CPU: 0.5}) as emu:
        pid = emu.pids[SLOW_CPU]
        assert os.sched_getscheduler(pid) == os.SCHED_FIFO
        assert os.sched_getaffinity(pid) == {SLOW_CPU}
        assert os.environ[E.ENV_EMULATED] == f"{SLOW_CPU}:0.5"
        t = topo.detect()
        assert t.clusters[0].cpus == (FAST_CPU,) and t.clusters[0].capacity == 1.0
        assert t.clusters[-1].cpus == (SLOW_CPU,) and t.clusters[-1].capacity == 0.5
        assert emu.topology.to_spec() == os.environ[topo.ENV_VAR]
        assert float(os.environ[E.ENV_PERIOD]) == E.DEFAULT_PERIOD == emu.period
        emu.check()
    assert not running(pid)
    assert os.environ[topo.ENV_VAR] == f"all:{FAST_CPU}-{SLOW_CPU}@1"
    assert E.ENV_EMULATED not in os.environ and E.ENV_PERIOD not in os.environ
    assert calls == [f"{SLOW_CPU}:0.5", None]
    # the period is a parameter; cost models read it from the environment
    from asymo.plan import split_cost
    with E.slow_cores({SLOW_CPU: 0.5}, period=2e-4):
        assert split_cost.emulated_period() == 2e-4
    assert split_cost.emulated_period() is None


@emulator
def test_default_pool_follows_the_emulated_topology(monkeypatch):
    pool_mod = pytest.importorskip("asymo.runtime.pool")
    monkeypatch.delenv(E.ENV_EMULATED, raising=False)
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    pool_mod.reset_default_pool()
    before = pool_mod.get_pool()
    clusters = lambda t: [(c.cpus, round(c.capacity, 6)) for c in t.clusters]  # noqa: E731
    with E.slow_cores({SLOW_CPU: 0.5}) as emu:
        inside = pool_mod.get_pool()
        assert before.closed and inside is not before
        assert clusters(inside.topology) == clusters(emu.topology)
        assert inside.topology.emulated == {SLOW_CPU: 0.5}
    after = pool_mod.get_pool()
    assert inside.closed and not after.topology.emulated
    assert clusters(after.topology) == clusters(before.topology)
    pool_mod.reset_default_pool()


@emulator
def test_helper_stops_after_an_exception_in_the_block():
    with pytest.raises(ZeroDivisionError):
        with E.slow_cores({SLOW_CPU: 0.5}) as emu:
            pid = emu.pids[SLOW_CPU]
            1 / 0
    assert not running(pid)
    assert topo.ENV_VAR not in os.environ or os.environ.get(E.ENV_EMULATED) is None


@emulator
def test_a_forgotten_emulation_stops_its_helper_when_collected(monkeypatch):
    import gc

    monkeypatch.delenv(E.ENV_EMULATED, raising=False)
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    emu = E.slow_cores({SLOW_CPU: 0.5}).start()
    pid = emu.pids[SLOW_CPU]
    del emu
    gc.collect()
    assert wait_gone([pid], timeout=1.0)
    assert E.ENV_EMULATED not in os.environ  # a collected emulation restores the env (issue 17)
    with E.slow_cores({SLOW_CPU: 0.5}):  # and the cpu is free again
        pass


@emulator
def test_same_cpu_cannot_be_slowed_twice():
    with E.slow_cores({SLOW_CPU: 0.5}):
        with pytest.raises(ValueError, match="already slowed"):
            E.slow_cores({SLOW_CPU: 0.7}).start()
        # Another process that does not see our env is stopped by the per-cpu lock.
        code = f"import asymo.lab.emulate as E\nwith E.slow_cores({{{SLOW_CPU}: 0.7}}): pass"
        r = subprocess.run([sys.executable, "-c", code], env=child_env(),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "already slowed by an emulator helper" in r.stderr


@emulator
def test_nested_emulations_compose(monkeypatch):
    monkeypatch.delenv(E.ENV_EMULATED, raising=False)
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    with E.slow_cores({FAST_CPU: 0.75}):
        with E.slow_cores({SLOW_CPU: 0.5}) as inner:
            assert os.environ[E.ENV_EMULATED] == f"{FAST_CPU}:0.75,{SLOW_CPU}:0.5"
            t = topo.detect()
            cap = {cpu: c.capacity for c in t.clusters for cpu in c.cpus}
            assert t.clusters[-1].cpus == (SLOW_CPU,)
            assert cap[SLOW_CPU] / cap[FAST_CPU] == pytest.approx(0.5 / 0.75, abs=1e-4)
            assert max(cap.values()) == 1.0 and cap[FAST_CPU] == (0.75 if len(cap) > 2 else 1)
            assert inner.topology.emulated == {FAST_CPU: 0.75, SLOW_CPU: 0.5}
        assert os.environ[E.ENV_EMULATED] == f"{FAST_CPU}:0.75"
    assert E.ENV_EMULATED not in os.environ and topo.ENV_VAR not in os.environ


@emulator
def test_helper_dies_within_a_second_of_kill_9_of_its_parent():
    code = textwrap.dedent(f"""
        import time, asymo.lab.emulate as E
        with E.slow_cores({{{SLOW_CPU}: 0.5}}) as emu:
            print(emu.pids[{SLOW_CPU}], flush=True)
            time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        helper = int(parent.stdout.readline())
        assert running(helper)
    finally:
        parent.kill()
        parent.wait()
    assert wait_gone([helper], timeout=1.0)


@emulator
def test_helper_stops_at_its_time_limit_and_the_exit_warns():
    with pytest.warns(RuntimeWarning, match="time limit"):
        with E.slow_cores({SLOW_CPU: 0.5}, time_limit=0.2) as emu:
            pid = emu.pids[SLOW_CPU]
            assert wait_gone([pid], timeout=5.0)
            with pytest.raises(E.EmulationError, match="time limit"):
                emu.check()


@pytest.mark.skipif(len(AFFINITY) < 2, reason="needs at least 2 usable cpus")
def test_without_cap_sys_nice_a_clear_error_or_the_approximate_mode_by_name():
    # The child drops CAP_SYS_NICE from its bounding set, so the helpers it execs have no
    # CAP_SYS_NICE even as root, and RLIMIT_RTPRIO / RLIMIT_NICE 0: SCHED_FIFO is refused.
    code = textwrap.dedent(f"""
        import ctypes, resource
        PR_CAPBSET_DROP, CAP_SYS_NICE = 24, 23
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0) != 0 and ctypes.get_errno() != 1:
            raise SystemExit("prctl failed")
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
        import asymo.lab.emulate as E
        try:
            E.slow_cores({{{SLOW_CPU}: 0.5}}).start()
        except E.RealtimeUnavailableError as exc:
            print("refused:", exc)
        with E.slow_cores({{{SLOW_CPU}: 0.5}}, mode="approximate") as emu:
            print("approximate:", emu.helper_status[{SLOW_CPU}], emu.env[E.ENV_EMULATED])
    """)
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "CAP_SYS_NICE" in r.stdout and "root" in r.stdout
    assert f"approximate: approximate nice=0 {SLOW_CPU}:0.5" in r.stdout


# -- measured speed -----------------------------------------------------------------------------

def measured_speed(slow, fast, rounds=5, seconds=0.08, workload="matmul"):
    """Medians over rounds of (time on the free core) / (time on the slowed core), and of the
    share of the slowed core the work got (its cpu time / wall time there).

    Single-thread NumPy matmul (one OpenBLAS thread), measured in a child process in a session
    of its own at nice -20 (autogroup and thread) where permitted: other processes on a shared
    machine then barely disturb it, while the SCHED_FIFO helper preempts it exactly as it
    would any normal thread.
    """
    r = subprocess.run([sys.executable, "-m", "asymo.lab.speedprobe", "--fast", str(fast),
                        "--slow", str(slow), "--rounds", str(rounds), "--seconds", str(seconds),
                        "--workload", workload, "--shield"], env=child_env(),
                       capture_output=True, text=True, timeout=120, start_new_session=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return median(out["ratios"]), median(out["share"])


@emulator
@pytest.mark.parametrize("speed", [0.5, 0.3])
def test_single_thread_work_on_the_slowed_core_runs_at_the_requested_speed(speed):
    # Other processes on a shared 2-core box can skew one measurement: up to 3 attempts, each
    # a median of 5 interleaved rounds. A helper that does not slow the core fails all three.
    def ok(m):
        ratio, share = m
        return abs(ratio - speed) < 0.15 and abs(share - speed) < 0.1

    measured = []
    with E.slow_cores({SLOW_CPU: speed}):
        for _ in range(3):
            measured.append(measured_speed(SLOW_CPU, FAST_CPU))
            if ok(measured[-1]):
                break
    assert ok(measured[-1]), f"asked {speed}, measured (time ratio, cpu share) {measured}"
    # The same measurement without emulation shows the core given back: the whole cpu share,
    # and no time ratio near the one asked (1 / speed: 2 or more). The bound on the ratio
    # leaves room for the host: a VM whose host held one vCPU back read 1.34-1.42 for a
    # second, with the full share, long after every helper had gone.
    def unemulated(m):
        ratio, share = m
        return 0.8 < ratio < 1.6 and share > 0.85

    control = []
    for _ in range(3):
        control.append(measured_speed(SLOW_CPU, FAST_CPU, rounds=3, seconds=0.05))
        if unemulated(control[-1]):
            break
    assert unemulated(control[-1]), f"unemulated {control}"


@pytest.mark.skipif(len(AFFINITY) < 2, reason="needs at least 2 usable cpus")
def test_burst_probe_times_every_unit_against_the_free_core():
    # the fidelity probe of bench/emulator_speed.py, without emulation: two equal cores give a
    # stretch near 1 for most units (up to three probes: a busy host's neighbour can hold one
    # of the cores for the 40 ms a probe takes, as in the measurement above)
    for _ in range(3):
        r = subprocess.run([sys.executable, "-m", "asymo.lab.speedprobe", "--fast",
                            str(FAST_CPU), "--slow", str(SLOW_CPU), "--workload", "burst",
                            "--unit-us", "200", "--units", "200"], env=child_env(),
                           capture_output=True, text=True, timeout=120, start_new_session=True)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        stretch = sorted(out["stretch"])
        assert len(stretch) == 200 and all(x > 0 for x in stretch)
        assert 50e-6 < out["unit_s"] < 1e-3
        if 0.6 < stretch[len(stretch) // 2] < 1.6:
            break
    assert 0.6 < stretch[len(stretch) // 2] < 1.6, stretch[::20]


# -- command line -------------------------------------------------------------------------------

def asymo_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "asymo", *args], env=child_env(),
                          capture_output=True, text=True, timeout=60, **kw)


def test_cli_rejects_bad_arguments():
    for args in (["emulate", "--core", "1", "--speed", "0.5"],
                 ["emulate", "--core", "1", "--speed", "2", "--", "true"],
                 ["emulate", "--core", "1", "--core", "1", "--speed", "0.5", "--", "true"],
                 ["emulate", "--core", "0", "--core", "1", "--core", "2", "--speed", "0.5",
                  "--speed", "0.6", "--", "true"]):
        r = asymo_cli(*args)
        assert r.returncode == 2 and "error" in r.stderr, args
    assert "COMMAND" in asymo_cli("emulate", "--help").stdout


@emulator
def test_cli_runs_the_command_with_the_emulated_topology_and_its_exit_code():
    r = asymo_cli("emulate", "--core", str(SLOW_CPU), "--speed", "0.5", "--", sys.executable,
                  "-c", "import os, sys; print(os.environ['ASYMO_EMULATED']); "
                        "print(os.environ['ASYMO_TOPOLOGY']); sys.exit(7)")
    assert r.returncode == 7, r.stderr
    emulated, spec = r.stdout.split()
    assert emulated == f"{SLOW_CPU}:0.5"
    t = topo.parse_spec(spec)
    assert (t.clusters[-1].cpus, t.clusters[-1].capacity) == ((SLOW_CPU,), 0.5)
    assert "emulates speed, not cache size" in r.stderr


@emulator
def test_cli_info_under_emulation_shows_two_clusters():
    r = asymo_cli("emulate", "-q", "--core", str(SLOW_CPU), "--speed", "0.5", "--",
                  sys.executable, "-m", "asymo", "info", "--json")
    assert r.returncode == 0, r.stderr
    clusters = json.loads(r.stdout)["topology"]["clusters"]
    assert [(c["cpus"], c["capacity"]) for c in clusters] == \
        [([c for c in AFFINITY if c != SLOW_CPU], 1.0), ([SLOW_CPU], 0.5)]


@emulator
def test_cli_ctrl_c_stops_command_and_helper():
    # SIGINT as at a terminal even when this run was started with it ignored (a background job)
    p = subprocess.Popen([sys.executable, "-m", "asymo", "emulate", "-q", "--core",
                          str(SLOW_CPU), "--speed", "0.5", "--", "sleep", "30"], env=child_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 20
        while not helpers_of(p.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        helpers = helpers_of(p.pid)
        assert helpers
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 130
    finally:
        if p.poll() is None:
            p.kill()
    assert wait_gone(helpers, timeout=1.0)
