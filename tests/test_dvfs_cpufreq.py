"""CpuFreq on fake sysfs trees: exact writes, exact restores, every exit path."""
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from asymo.dvfs import CpuFreq, CpuFreqError, CpuFreqPermissionError
from asymo.dvfs import cpufreq as cpufreq_mod
from asymo.hw.topology import Cluster, Topology

from _dvfs_fakes import (KIRIN_BIG_KHZ, KIRIN_LITTLE_KHZ, kirin_topology, make_intel_pstate,
                         make_kirin970, make_policy, read)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    # every test must leave the process-wide safety net empty and our handlers uninstalled
    assert cpufreq_mod._active == []
    assert signal.getsignal(signal.SIGTERM) is not cpufreq_mod._on_signal


@pytest.fixture
def kirin(tmp_path):
    paths = make_kirin970(tmp_path)
    return tmp_path, paths


def rel(log, root):
    return [(os.path.relpath(p, root), v) for p, v in log]


def test_reads_governors_and_frequencies(kirin):
    root, paths = kirin
    for named in (False, True):
        cf = CpuFreq(kirin_topology(with_policy_names=named), sysfs_root=str(root))
        assert cf.governors() == {"big": "schedutil", "little": "schedutil"}
        assert cf.available_frequencies("big") == KIRIN_BIG_KHZ
        assert cf.available_frequencies(1) == KIRIN_LITTLE_KHZ
        info = cf.info("big")
        assert info.method == "userspace" and info.cpus == (4, 5, 6, 7)
        assert info.path == os.path.realpath(paths["big"])
        assert cf.frequency("big") == 2362000 and cf.max_frequency("little") == 1844000
        assert cf.can_set("little") and not cf.changed


def test_userspace_exact_writes_and_restore(kirin):
    root, paths = kirin
    big = paths["big"]
    with CpuFreq(kirin_topology(), sysfs_root=str(root)) as cf:
        cf.set_frequency("big", 1863000)
        assert rel(cf.write_log, root) == [
            ("devices/system/cpu/cpufreq/policy4/scaling_governor", "userspace"),
            ("devices/system/cpu/cpufreq/policy4/scaling_setspeed", "1863000")]
        assert read(f"{big}/scaling_governor") == "userspace"
        assert read(f"{big}/scaling_setspeed") == "1863000"
        assert cf.changed
        # the little cluster was not touched
        assert read(f"{paths['little']}/scaling_governor") == "schedutil"
        n = len(cf.write_log)
    assert rel(cf.write_log[n:], root) == [
        ("devices/system/cpu/cpufreq/policy4/scaling_governor", "schedutil")]
    assert read(f"{big}/scaling_governor") == "schedutil"
    assert not cf.changed


def test_restore_after_exception_in_block(kirin):
    root, paths = kirin
    with pytest.raises(ZeroDivisionError):
        with CpuFreq(kirin_topology(), sysfs_root=str(root)) as cf:
            cf.set_frequencies({"big": 1018000, "little": 1210000})
            1 / 0
    assert read(f"{paths['big']}/scaling_governor") == "schedutil"
    assert read(f"{paths['little']}/scaling_governor") == "schedutil"
    assert rel(cf.write_log, root)[-2:] == [
        ("devices/system/cpu/cpufreq/policy4/scaling_governor", "schedutil"),
        ("devices/system/cpu/cpufreq/policy0/scaling_governor", "schedutil")]


def test_already_userspace_restores_setspeed(tmp_path):
    make_kirin970(tmp_path, governor="userspace")
    cf = CpuFreq(kirin_topology(), sysfs_root=str(tmp_path))
    cf.set_frequency("big", 682000)
    assert rel(cf.write_log, tmp_path) == [
        ("devices/system/cpu/cpufreq/policy4/scaling_setspeed", "682000")]
    cf.set_frequency("big", 1210000)
    cf.restore()
    assert rel(cf.write_log, tmp_path)[-1] == (
        "devices/system/cpu/cpufreq/policy4/scaling_setspeed", "2362000")
    assert read(tmp_path / "devices/system/cpu/cpufreq/policy4/scaling_governor") == "userspace"


def test_userspace_widens_policy_limits_when_needed(kirin):
    root, paths = kirin
    big = paths["big"]
    with open(f"{big}/scaling_max_freq", "w") as f:  # e.g. a thermal daemon capped it
        f.write("1498000\n")
    with CpuFreq(kirin_topology(), sysfs_root=str(root)) as cf:
        cf.set_frequency("big", 1863000)
        assert [v for _, v in cf.write_log] == ["1863000", "userspace", "1863000"]
        assert read(f"{big}/scaling_max_freq") == "1863000"
    assert read(f"{big}/scaling_max_freq") == "1498000"
    assert read(f"{big}/scaling_governor") == "schedutil"


def test_invalid_frequency_changes_nothing(kirin):
    root, paths = kirin
    cf = CpuFreq(kirin_topology(), sysfs_root=str(root))
    with pytest.raises(ValueError, match="not an available frequency.*1863000"):
        cf.set_frequency("big", 1800000)
    with pytest.raises(TypeError, match="integer number of kHz"):
        cf.set_frequency("big", 1.5e6 + 0.5)
    with pytest.raises(KeyError, match="no cluster named 'mid'"):
        cf.set_frequency("mid", 1863000)
    with pytest.raises(IndexError):
        cf.set_frequency(5, 1863000)
    assert cf.write_log == [] and not cf.changed
    change = cf.set_frequency("big", 1800000, nearest=True)
    assert change.targets == {"big": 1863000}
    cf.restore()


def test_intel_pstate_clamps_min_and_max(tmp_path):
    pols = make_intel_pstate(tmp_path, ncpus=2)
    topo = Topology(clusters=(Cluster("p", (0, 1), 1.0),))
    cf = CpuFreq(topo, sysfs_root=str(tmp_path))
    info = cf.info("p")
    assert info.method == "clamp" and info.driver == "intel_pstate"
    assert cf.available_frequencies("p") == (800000, 4200000)
    assert len(cf.policies("p")) == 2
    with pytest.raises(ValueError, match="outside"):
        cf.set_frequency("p", 5000000)
    with cf:
        cf.set_frequency("p", 2000000)
        assert rel(cf.write_log, tmp_path) == [
            ("devices/system/cpu/cpufreq/policy0/scaling_max_freq", "2000000"),
            ("devices/system/cpu/cpufreq/policy0/scaling_min_freq", "2000000"),
            ("devices/system/cpu/cpufreq/policy1/scaling_max_freq", "2000000"),
            ("devices/system/cpu/cpufreq/policy1/scaling_min_freq", "2000000")]
        n = len(cf.write_log)
    assert rel(cf.write_log[n:], tmp_path) == [
        ("devices/system/cpu/cpufreq/policy0/scaling_max_freq", "4200000"),
        ("devices/system/cpu/cpufreq/policy0/scaling_min_freq", "800000"),
        ("devices/system/cpu/cpufreq/policy1/scaling_max_freq", "4200000"),
        ("devices/system/cpu/cpufreq/policy1/scaling_min_freq", "800000")]
    for p in pols.values():
        assert read(f"{p}/scaling_min_freq") == "800000"
        assert read(f"{p}/scaling_max_freq") == "4200000"
        assert read(f"{p}/scaling_governor") == "powersave"


def test_clamp_keeps_min_le_max_after_every_write(tmp_path, monkeypatch):
    """Older kernels reject min > max: check the invariant after every single write."""
    pols = make_intel_pstate(tmp_path, ncpus=1)
    pol = pols[0]
    # start from a narrowed policy so restores have to move both bounds
    with open(f"{pol}/scaling_min_freq", "w") as f:
        f.write("1500000")
    with open(f"{pol}/scaling_max_freq", "w") as f:
        f.write("2500000")
    real = CpuFreq._write

    def strict_write(self, path, value):
        real(self, path, value)
        lo, hi = int(read(f"{pol}/scaling_min_freq")), int(read(f"{pol}/scaling_max_freq"))
        assert lo <= hi, f"min {lo} > max {hi} after writing {value} to {path}"

    monkeypatch.setattr(CpuFreq, "_write", strict_write)
    cf = CpuFreq(Topology(clusters=(Cluster("p", (0,), 1.0),)), sysfs_root=str(tmp_path))
    for f in (4000000, 900000, 3000000, 1000000):
        cf.set_frequency("p", f)
        assert read(f"{pol}/scaling_min_freq") == read(f"{pol}/scaling_max_freq") == str(f)
    ch = cf.set_frequency("p", 4100000)
    ch.undo()  # back to 1000000, not to the originals
    assert read(f"{pol}/scaling_max_freq") == "1000000" and cf.changed
    cf.restore()
    assert (read(f"{pol}/scaling_min_freq"), read(f"{pol}/scaling_max_freq")) == \
        ("1500000", "2500000")
    assert not cf.changed


@pytest.mark.parametrize("governors", ["ondemand performance", None])
def test_without_userspace_governor_falls_back_to_clamp(tmp_path, governors):
    make_policy(str(tmp_path), 0, (0,), KIRIN_LITTLE_KHZ, governor=None, governors=governors)
    cf = CpuFreq(Topology(clusters=(Cluster("c", (0,), 1.0),)), sysfs_root=str(tmp_path))
    info = cf.info("c")
    assert info.governor is None and info.method == "clamp"
    with cf:
        cf.set_frequency("c", 1210000)
        assert [os.path.basename(p) for p, _ in cf.write_log] == \
            ["scaling_max_freq", "scaling_min_freq"]  # target above the old min: max first
    assert read(tmp_path / "devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "1844000"
    assert read(tmp_path / "devices/system/cpu/cpufreq/policy0/scaling_min_freq") == "509000"


def test_read_only_files_mean_nothing_changes(kirin):
    root, paths = kirin
    os.chmod(f"{paths['little']}/scaling_setspeed", 0o444)  # sysfs: no store method
    cf = CpuFreq(kirin_topology(), sysfs_root=str(root))
    assert cf.can_set("big") and not cf.can_set("little")
    assert "read-only" in cf.info("little").reason
    before = {k: read(f"{p}/scaling_governor") for k, p in paths.items()}
    with pytest.raises(CpuFreqPermissionError, match="little.*read-only") as ei:
        cf.set_frequencies({"big": 1863000, "little": 1844000})
    assert ei.value.errno == errno.EACCES and isinstance(ei.value, PermissionError)
    assert cf.write_log == [] and not cf.changed
    assert {k: read(f"{p}/scaling_governor") for k, p in paths.items()} == before


def test_failed_write_rolls_back_earlier_writes(kirin, monkeypatch):
    root, paths = kirin
    real = CpuFreq._write

    def failing(self, path, value):
        if path.endswith("policy0/scaling_setspeed"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real(self, path, value)

    monkeypatch.setattr(CpuFreq, "_write", failing)
    cf = CpuFreq(kirin_topology(), sysfs_root=str(root))
    with pytest.raises(CpuFreqError, match="rejected.*rolled back"):
        cf.set_frequencies({"big": 1863000, "little": 1018000})
    assert rel(cf.write_log, root) == [
        ("devices/system/cpu/cpufreq/policy4/scaling_governor", "userspace"),
        ("devices/system/cpu/cpufreq/policy4/scaling_setspeed", "1863000"),
        ("devices/system/cpu/cpufreq/policy0/scaling_governor", "userspace"),
        # rollback
        ("devices/system/cpu/cpufreq/policy4/scaling_governor", "schedutil"),
        ("devices/system/cpu/cpufreq/policy0/scaling_governor", "schedutil")]
    assert not cf.changed


def test_absent_cpufreq_is_a_clear_error(tmp_path):
    cf = CpuFreq(Topology(clusters=(Cluster("c0", (0, 1), 1.0),)), sysfs_root=str(tmp_path))
    info = cf.info("c0")
    assert info.method is None and "no cpufreq policy" in info.reason
    with pytest.raises(CpuFreqError, match="cannot set the frequency of cluster 'c0'"):
        cf.set_frequency("c0", 1000000)
    assert not os.path.exists(tmp_path / "devices")


def test_clusters_sharing_a_policy_cannot_disagree(tmp_path):
    make_policy(str(tmp_path), 0, (0, 1), KIRIN_LITTLE_KHZ)
    topo = Topology(clusters=(Cluster("a", (0,), 1.0), Cluster("b", (1,), 0.5)))
    cf = CpuFreq(topo, sysfs_root=str(tmp_path))
    with pytest.raises(ValueError, match="share cpufreq policy"):
        cf.set_frequencies({"a": 1844000, "b": 509000})
    with cf:
        cf.set_frequencies({"a": 1844000, "b": 1844000})


def _child(root, body):
    # (SIGUSR1 dumps the child's threads to stderr: _wait_dead's report of a child that hung)
    code = textwrap.dedent(f"""
        import sys, time, signal, faulthandler
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        sys.path.insert(0, {os.path.join(REPO, 'tests')!r})
        from _dvfs_fakes import kirin_topology
        from asymo.dvfs import CpuFreq
        cf = CpuFreq(kirin_topology(), sysfs_root={str(root)!r})
    """) + textwrap.dedent(body)
    # SIGINT as at a terminal even when this run was started with it ignored (a background job)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_ready(p):
    line = p.stdout.readline()
    assert line.strip() == "READY", (line, p.stderr.read())


def _wait_dead(p, why, timeout=20):
    """Wait for child ``p`` to end; if it has not within ``timeout`` s, fail with where its
    threads were (faulthandler) and what it wrote to stderr."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        p.kill()
        _, err = p.communicate(timeout=20)
        pytest.fail(f"the child did not end within {timeout} s after {why}; its stderr, "
                    f"threads last:\n{err}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_restores_then_dies_like_the_signal(kirin, sig):
    root, paths = kirin
    p = _child(root, """
        cf.set_frequencies({"big": 1863000, "little": 1018000})
        print("READY", flush=True)
        time.sleep(30)
    """)
    try:
        _wait_ready(p)
        assert read(f"{paths['big']}/scaling_governor") == "userspace"
        p.send_signal(sig)
        _wait_dead(p, sig.name)
    finally:
        p.kill()
    if sig == signal.SIGTERM:
        assert p.returncode == -signal.SIGTERM
    else:  # Python's default SIGINT handler raises KeyboardInterrupt after our restore
        assert p.returncode != 0 and "KeyboardInterrupt" in p.stderr.read()
    for k in ("big", "little"):
        assert read(f"{paths[k]}/scaling_governor") == "schedutil"


def test_sigterm_chains_to_the_previous_handler(kirin):
    root, paths = kirin
    p = _child(root, """
        def mine(signum, frame):
            print("user handler saw governor", open({gov!r}).read().strip(), flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, mine)
        cf.set_frequency("big", 682000)
        print("READY", flush=True)
        time.sleep(30)
    """.replace("{gov!r}", repr(f"{paths['big']}/scaling_governor")))
    try:
        _wait_ready(p)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 3
    assert "user handler saw governor schedutil" in out  # restored before chaining
    assert read(f"{paths['big']}/scaling_governor") == "schedutil"


def test_atexit_restores_on_normal_exit(kirin):
    root, paths = kirin
    p = _child(root, """
        cf.set_frequency("little", 509000)
        print("READY", flush=True)
    """)
    try:
        _wait_ready(p)
        _wait_dead(p, "READY")
    finally:
        p.kill()
    assert p.returncode == 0
    assert read(f"{paths['little']}/scaling_governor") == "schedutil"


def test_guardian_restores_after_sigkill(kirin):
    """No Python code runs on SIGKILL (or a segfault): the guardian process restores."""
    root, paths = kirin
    p = _child(root, """
        cf.set_frequencies({"big": 1863000, "little": 1018000})
        print("READY", flush=True)
        time.sleep(30)
    """)
    try:
        _wait_ready(p)
        assert read(f"{paths['little']}/scaling_setspeed") == "1018000"
        p.kill()
        # stderr reaches EOF once the guardian, which inherited it, has finished too
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGKILL
    assert "exited without restoring" in err
    for k in ("big", "little"):
        assert read(f"{paths[k]}/scaling_governor") == "schedutil"


def test_guardian_lives_only_while_changes_are_outstanding(kirin):
    root, _ = kirin
    cf = CpuFreq(kirin_topology(), sysfs_root=str(root))
    assert cf._guardian is None
    cf.set_frequency("big", 1210000)
    g = cf._guardian
    assert g is not None and g.poll() is None
    cf.set_frequency("little", 1210000)
    assert cf._guardian is g  # one guardian per CpuFreq, kept up to date
    cf.restore()
    assert cf._guardian is None and g.returncode == 0


@pytest.mark.parametrize("machine,cluster,khz,method", [
    ("kirin970", "big", 1863000, "clamp"),       # fixture has no scaling_setspeed
    ("pixel6", "mid", None, "clamp"),
    ("i7_12700h", "E", 2000000, "clamp"),       # intel_pstate: one policy per cpu
])
def test_on_the_topology_fixtures(tmp_path, machine, cluster, khz, method):
    """CpuFreq on the detected topologies of the shared sysfs fixtures (copied: we write)."""
    import shutil
    from asymo.hw.topology import detect
    src = os.path.join(REPO, "tests", "fixtures", "sysfs", machine)
    if not os.path.isdir(src):
        pytest.skip("topology fixtures not present")
    root = str(tmp_path / machine)
    shutil.copytree(src, root, symlinks=True)
    t = detect(sysfs_root=root)
    cf = CpuFreq(t, sysfs_root=root)
    info = cf.info(cluster)
    assert info.method == method
    khz = khz or cf.available_frequencies(cluster)[1]
    pols = cf.policies(cluster)
    before = [(read(f"{p.path}/scaling_min_freq"), read(f"{p.path}/scaling_max_freq"))
              for p in pols]
    others = [p.path for c in t.clusters if c.name != cluster for p in cf.policies(c.name)]

    def snapshot(paths):
        return {p: sorted((f, read(os.path.join(p, f))) for f in os.listdir(p)) for p in paths}

    others_before = snapshot(others)
    with cf:
        cf.set_frequency(cluster, khz)
        for p in pols:
            assert read(f"{p.path}/scaling_min_freq") == read(f"{p.path}/scaling_max_freq") \
                == str(khz)
        assert snapshot(others) == others_before  # other clusters untouched
    assert [(read(f"{p.path}/scaling_min_freq"), read(f"{p.path}/scaling_max_freq"))
            for p in pols] == before
