"""asymo.lab.loadmon.OtherLoad: the share of the machine other processes used, including
processes that start and exit inside the window (the machine-wide run time less ours)."""
import shlex
import subprocess
import sys
import time

import pytest

from asymo.lab.loadmon import OtherLoad


def _fake_total(path, ns):
    path.write_text(f"{ns}\n")


def test_machine_total_less_our_time_is_other_load(tmp_path, monkeypatch):
    usage = tmp_path / "cpuacct.usage"
    _fake_total(usage, 10**12)
    mon = OtherLoad(ncpus=2, cpuacct_paths=[str(tmp_path / "missing"), str(usage)])
    if not mon.available:
        pytest.skip("no /proc/<pid>/schedstat here")
    assert mon.precise and mon.cpuacct == str(usage)
    clock = iter([100.0, 101.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    own = iter([5 * 10**9, 5 * 10**9 + 3 * 10**8])       # we ran 0.3 s
    monkeypatch.setattr(time, "process_time_ns", lambda: next(own))
    snap = mon.snapshot()
    # 1 s window on 2 cpus; everyone together ran 1.1 s: others 0.8 s of 2 cpu-seconds
    _fake_total(usage, 10**12 + 11 * 10**8)
    assert mon.share_since(snap) == pytest.approx(0.4, abs=0.02)


def test_without_a_machine_total_the_per_process_figure_is_used(tmp_path):
    mon = OtherLoad(cpuacct_paths=[str(tmp_path / "missing")])
    assert mon.cpuacct is None and not mon.precise
    snap = mon.snapshot()
    assert snap[2] is None
    assert 0.0 <= mon.share_since(snap) <= 1.0


def test_unreadable_total_is_not_used(tmp_path):
    bad = tmp_path / "cpuacct.usage"
    bad.write_text("not a number\n")
    assert OtherLoad(cpuacct_paths=[str(bad)]).cpuacct is None


def test_short_lived_processes_are_counted():
    mon = OtherLoad()
    if not mon.precise:
        pytest.skip("no machine-wide run time (cgroup v1 cpuacct) here")
    burn = "import time\nt = time.process_time() + 0.05\nwhile time.process_time() < t: pass"
    # not our descendants: the shell leaves the burner behind (reparented away from us) and
    # exits; run() returns when the burner, holding the pipe, has exited too
    orphan = f"{shlex.quote(sys.executable)} -c {shlex.quote(burn)} &"
    snap = mon.snapshot()
    t0 = time.monotonic()
    for _ in range(6):   # each starts, burns 50 ms and exits inside the window
        subprocess.run(["sh", "-c", orphan], check=True, stdout=subprocess.PIPE)
    elapsed = time.monotonic() - t0
    share = mon.share_since(snap)
    # at least the 0.3 s they burned (interpreter start-up comes on top)
    assert share >= 0.3 / (elapsed * mon.ncpus) * 0.9


def test_our_children_that_exit_in_the_window_are_not_other_load(tmp_path, monkeypatch):
    # A child of ours burns CPU before the first snapshot and exits (reaped) before the
    # second: its run time is ours, not the other processes'. Its time was in the first
    # snapshot's live descendants and leaves /proc with it, so without the reaped children's
    # time it read as 0.4 s of the machine used by others (0.2 of 2 cpus over the 1 s).
    usage = tmp_path / "cpuacct.usage"
    _fake_total(usage, 10**12)
    mon = OtherLoad(ncpus=2, cpuacct_paths=[str(usage)])
    if not mon.available:
        pytest.skip("no /proc/<pid>/schedstat here")
    burn = ("import sys, time\nt = time.process_time() + 0.4\n"
            "while time.process_time() < t: pass\nprint('ready', flush=True)\nsys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        clock = iter([100.0, 101.0])
        monkeypatch.setattr(time, "monotonic", lambda: next(clock))
        own = iter([5 * 10**9, 5 * 10**9 + 10**8])       # we ran 0.1 s
        monkeypatch.setattr(time, "process_time_ns", lambda: next(own))
        real = time.perf_counter()
        snap = mon.snapshot()
        child.stdin.close()
        assert child.wait(timeout=30) == 0
        # nobody else ran: the machine's total grew by our own 0.1 s (and the child's exit)
        _fake_total(usage, 10**12 + 10**8)
        share = mon.share_since(snap)
        # the per-process figure is real: others may have used every cpu meanwhile
        real = time.perf_counter() - real
        assert share <= 0.02 + real < 0.15, (share, real)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
