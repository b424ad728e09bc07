"""Issue 17, items 3, 4 and 8 (dvfs): several processes on one cpufreq tree, the guardian out
of reach of a process-group kill and of forked children, a cpufreq file vanishing mid-run.
All on fake sysfs trees (tests/_dvfs_fakes.py, tests/fixtures)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from asymo.dvfs import CpuFreq
from asymo.dvfs import _guardian
from asymo.hw.topology import detect

from _dvfs_fakes import kirin_topology, make_kirin970, read

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "sysfs")


@pytest.fixture(autouse=True)
def _private_run_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("ASYMO_RUN_DIR", str(d))
    return d


def _bounds(path):
    return read(f"{path}/scaling_min_freq"), read(f"{path}/scaling_max_freq")


def _kirin_fixture(tmp_path):
    src = os.path.join(FIXTURES, "kirin970")
    if not os.path.isdir(src):
        pytest.skip("topology fixtures not present")
    root = str(tmp_path / "kirin970")
    shutil.copytree(src, root, symlinks=True)
    return root


# -- item 3: two users of one policy --------------------------------------------------------------
def test_two_users_of_one_policy_restore_the_true_originals(tmp_path):
    root = _kirin_fixture(tmp_path)
    t = detect(sysfs_root=root)
    a = CpuFreq(t, sysfs_root=root, guardian=False)  # energy mode: the big cluster slowest
    b = CpuFreq(t, sysfs_root=root, guardian=False)  # latency mode, started a second later
    big = a.policies("big")[0].path
    original = _bounds(big)
    lowest = a.available_frequencies("big")[0]
    a.set_frequency("big", lowest)
    b.set_frequency("big", b.available_frequencies("big")[-2])
    a.restore()  # b still uses the policy: a writes nothing back
    assert _bounds(big) != original
    b.restore()  # the last one puts back what was there before a began
    assert _bounds(big) == original
    assert not a.changed and not b.changed


def test_first_user_ends_last(tmp_path):
    root = _kirin_fixture(tmp_path)
    t = detect(sysfs_root=root)
    a = CpuFreq(t, sysfs_root=root, guardian=False)
    b = CpuFreq(t, sysfs_root=root, guardian=False)
    big = a.policies("big")[0].path
    original = _bounds(big)
    a.set_frequency("big", a.available_frequencies("big")[0])
    b.set_frequency("big", b.available_frequencies("big")[2])
    b.restore()  # a still runs: b puts back a's setting, which it found
    assert _bounds(big) == (str(a.available_frequencies("big")[0]),) * 2
    a.restore()
    assert _bounds(big) == original


def _child(root, body, *, new_session=False):
    code = textwrap.dedent(f"""
        import os, sys, time, signal
        sys.path.insert(0, {os.path.join(REPO, 'tests')!r})
        from _dvfs_fakes import kirin_topology
        from asymo.dvfs import CpuFreq
        cf = CpuFreq(kirin_topology(), sysfs_root={str(root)!r})
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=new_session)


def _wait_ready(p):
    line = p.stdout.readline()
    assert line.strip() == "READY", (line, p.stderr.read())


def _wait_for(cond, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_a_killed_users_guardian_leaves_the_policy_to_the_live_user(tmp_path):
    root, paths = tmp_path, make_kirin970(tmp_path)
    p = _child(root, """
        cf.set_frequencies({"big": 1018000})
        print("READY", flush=True)
        time.sleep(60)
    """)
    try:
        _wait_ready(p)
        b = CpuFreq(kirin_topology(), sysfs_root=str(root), guardian=False)
        b.set_frequencies({"big": 1863000})
        p.kill()
        p.communicate(timeout=20)  # stderr closes when the child's guardian has finished
        # the guardian saw a live user of the policy: b's setting stays
        assert read(f"{paths['big']}/scaling_setspeed") == "1863000"
        b.restore()
    finally:
        p.kill()
    assert read(f"{paths['big']}/scaling_governor") == "schedutil"


# -- item 4: the guardian cannot be bypassed ------------------------------------------------------
def test_guardian_survives_a_kill_of_the_process_group(tmp_path):
    root, paths = tmp_path, make_kirin970(tmp_path)
    p = _child(root, """
        cf.set_frequencies({"big": 1863000, "little": 1018000})
        print("READY", flush=True)
        time.sleep(60)
    """, new_session=True)
    try:
        _wait_ready(p)
        assert read(f"{paths['big']}/scaling_governor") == "userspace"
        os.killpg(p.pid, signal.SIGKILL)  # timeout -s KILL, a service manager's stop
        p.wait(timeout=20)
        assert _wait_for(lambda: read(f"{paths['big']}/scaling_governor") == "schedutil"
                         and read(f"{paths['little']}/scaling_governor") == "schedutil")
    finally:
        p.kill()


def test_a_forked_child_does_not_delay_the_guardian(tmp_path):
    root, paths = tmp_path, make_kirin970(tmp_path)
    p = _child(root, """
        cf.set_frequencies({"big": 1863000})
        child = os.fork()
        if child == 0:  # multiprocessing's fork start method: the child inherits every fd
            time.sleep(60)
            os._exit(0)
        print("READY", child, flush=True)
        time.sleep(60)
    """)
    grandchild = None
    try:
        line = p.stdout.readline().split()
        assert line and line[0] == "READY", (line, p.stderr.read() if not line else "")
        grandchild = int(line[1])
        p.kill()
        p.wait(timeout=20)
        assert _wait_for(lambda: read(f"{paths['big']}/scaling_governor") == "schedutil",
                         timeout=10), "the guardian waited for the forked child"
    finally:
        p.kill()
        if grandchild:
            try:
                os.kill(grandchild, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- the shared record itself -------------------------------------------------------------------
def test_record_refuses_symlinks_and_ignores_garbage(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "rec.json"
    link.symlink_to(target)
    with pytest.raises(OSError):
        _guardian.join_record(str(link), "/p", {"scaling_max_freq": "1"}, [os.getpid(), None,
                                                                            "t"])
    assert target.read_text() == "keep"
    rec = tmp_path / "garbage.json"
    rec.write_text("[" * 100000)
    me = [os.getpid(), _guardian.proc_start(os.getpid()), "t"]
    assert _guardian.join_record(str(rec), "/p", {"scaling_max_freq": "5"}, me) == {
        "scaling_max_freq": "5"}
    # a holder whose process is gone no longer holds
    dead = [2 ** 22 + 12345, None, "x"]
    _guardian.join_record(str(rec), "/p", {}, dead)
    assert _guardian.leave_record(str(rec), me) == ("last", {"scaling_max_freq": "5"})
    assert not rec.exists()


# -- item 8: a cpufreq file vanishing while the frequency is set -----------------------------------
def test_exit_when_a_cpufreq_file_vanished(tmp_path):
    paths = make_kirin970(tmp_path)
    with pytest.warns(RuntimeWarning, match="vanished"):
        with CpuFreq(kirin_topology(), sysfs_root=str(tmp_path), guardian=False) as cf:
            cf.set_frequencies({"big": 1863000, "little": 1018000})
            os.unlink(f"{paths['little']}/scaling_setspeed")  # the cpu went offline
            os.unlink(f"{paths['little']}/scaling_governor")
    assert read(f"{paths['big']}/scaling_governor") == "schedutil"
    assert not cf.changed
