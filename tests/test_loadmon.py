"""asymo._loadmon.OtherLoad: the share of the machine other processes used, including
processes that start and exit inside the window (the machine-wide run time less ours)."""
import subprocess
import sys
import time

import pytest

from asymo._loadmon import OtherLoad


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
    snap = mon.snapshot()
    t0 = time.monotonic()
    for _ in range(6):   # each starts, burns 50 ms and exits inside the window
        subprocess.run([sys.executable, "-c", burn], check=True)
    elapsed = time.monotonic() - t0
    share = mon.share_since(snap)
    # at least the 0.3 s they burned (interpreter start-up comes on top)
    assert share >= 0.3 / (elapsed * mon.ncpus) * 0.9
