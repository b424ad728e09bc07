"""Issue 17, items 6 and 8 (the emulator): its lock file, speed 0.05, a garbage-collected
Emulation, a SIGKILL of `asymo emulate`."""
from __future__ import annotations

import gc
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

import asymo.lab.emulate as E
import asymo.lab.occupier as occupier
from asymo.hw import rundir
from asymo.hw import topology as topo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFFINITY = sorted(os.sched_getaffinity(0))
HAVE_FIFO = E.realtime_available()
emulator = pytest.mark.skipif(not HAVE_FIFO or len(AFFINITY) < 2,
                              reason="needs SCHED_FIFO (root or CAP_SYS_NICE) and 2 cpus")


# -- item 6: the lock file -------------------------------------------------------------------------
def test_lock_never_follows_a_planted_symlink(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    planted = tmp_path / "asymo-emulate-cpu1.lock"
    planted.symlink_to(victim)
    monkeypatch.setattr(occupier, "lock_paths", lambda cpu: [str(planted)])
    fd = occupier._lock_cpu(1)
    assert fd is None  # not locked through the link (the emulation runs unchecked)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.read_text() == "secret"


def test_lock_chmods_only_a_file_it_created(tmp_path, monkeypatch):
    path = tmp_path / "asymo-emulate-cpu1.lock"
    path.write_text("")
    path.chmod(0o600)
    monkeypatch.setattr(occupier, "lock_paths", lambda cpu: [str(path)])
    fds = occupier._lock_cpu(1)
    try:
        assert fds not in (None, False)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # someone else's: left alone
    finally:
        for fd in fds or ():
            os.close(fd)


def test_lock_lives_in_a_private_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(rundir.ENV_VAR, raising=False)
    if os.geteuid() == 0:
        assert occupier.lock_paths(3) == ["/run/asymo/emulate-cpu3.lock",
                                          "/tmp/asymo-emulate-cpu3.lock"]
        st = os.lstat("/run/asymo")
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv(rundir.ENV_VAR, str(d))
    assert occupier.lock_path(3) == str(d / "emulate-cpu3.lock")
    # a directory others may write, or a symlink, is refused
    bad = tmp_path / "open"
    bad.mkdir()
    bad.chmod(0o777)
    monkeypatch.setenv(rundir.ENV_VAR, str(bad))
    with pytest.raises(rundir.UnsafeRunDirError):
        rundir.run_dir()
    link = tmp_path / "link"
    link.symlink_to(d)
    monkeypatch.setenv(rundir.ENV_VAR, str(link))
    with pytest.raises(rundir.UnsafeRunDirError):
        rundir.run_dir()


# -- item 8: speed 0.05 as the README allows --------------------------------------------------------
def test_speed_005_is_accepted(monkeypatch):
    monkeypatch.setattr(E, "_rt_limits", lambda: (950000, 1000000))
    assert E._check_speeds({1: 0.05}, "fifo") == {1: 0.05}
    with pytest.raises(ValueError, match="below 0.05"):
        E._check_speeds({1: 0.049}, "fifo")


# -- item 8: a garbage-collected Emulation restores the environment --------------------------------
@emulator
def test_collected_emulation_restores_the_environment(monkeypatch):
    monkeypatch.delenv(topo.ENV_VAR, raising=False)
    monkeypatch.delenv(E.ENV_EMULATED, raising=False)
    try:
        emu = E.slow_cores({AFFINITY[-1]: 0.5}).start()
    except E.EmulationError as exc:
        if "another process" in str(exc):
            pytest.skip(f"the core is slowed by another process's emulation: {exc}")
        raise
    assert os.environ.get(topo.ENV_VAR)
    del emu
    gc.collect()
    assert topo.ENV_VAR not in os.environ
    assert E.ENV_EMULATED not in os.environ


# -- item 8: SIGKILL of `asymo emulate` ends its command ------------------------------------------
@emulator
def test_sigkill_of_asymo_emulate_ends_its_command():
    cmd = [sys.executable, "-m", "asymo", "emulate", "--core", str(AFFINITY[-1]), "--speed",
           "0.5", "--", sys.executable, "-c",
           "import os, time; print(os.getpid(), flush=True); time.sleep(60)"]
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop(topo.ENV_VAR, None)
    env.pop(E.ENV_EMULATED, None)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=REPO)
    child = None
    try:
        line = p.stdout.readline()
        if not line:
            err = p.stderr.read()
            if "another process" in err:
                pytest.skip(f"the core is slowed by another process's emulation: {err}")
        assert line.strip().isdigit(), (line, p.stderr.read() if not line else "")
        child = int(line)
        p.kill()
        p.wait(timeout=20)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            # reaped by init once it is gone; a zombie still answers kill(0)
            try:
                with open(f"/proc/{child}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the command kept running with the emulated topology")
    finally:
        p.kill()
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
