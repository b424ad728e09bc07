"""The pool's C core under ThreadSanitizer: concurrent submitters, both queue kinds, every
policy, nested jobs and cluster-local jobs; every task must run exactly once, no data race."""
import glob
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc")
POOL_SOURCES = sorted(glob.glob(os.path.join(CSRC, "pool", "*.c")))
INCLUDES = [f"-I{os.path.join(CSRC, 'include')}", f"-I{CSRC}"]


@pytest.fixture(scope="module")
def stress_binary(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    out = str(tmp_path_factory.mktemp("tsan") / "pool_stress")
    cmd = [cc, "-O1", "-g", "-fsanitize=thread", "-std=gnu11", "-pthread", *INCLUDES,
           os.path.join(HERE, "c", "pool_stress.c"), *POOL_SOURCES, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build with -fsanitize=thread: {r.stderr[-300:]}")
    probe = subprocess.run([out, "0", "0", "1"], capture_output=True, text=True, timeout=60)
    if "FATAL: ThreadSanitizer" in probe.stderr:  # e.g. unsupported memory layout
        pytest.skip(f"ThreadSanitizer cannot run here: {probe.stderr[-200:]}")
    return out


@pytest.mark.parametrize("queue", [0, 1], ids=["mutex", "chaselev"])
@pytest.mark.parametrize("policy", [0, 1, 2, 3], ids=["asymo", "even", "shared", "steal"])
def test_stress_under_tsan(stress_binary, queue, policy):
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    r = subprocess.run([stress_binary, str(queue), str(policy), "60"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING: ThreadSanitizer" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.startswith("ok ")


def _build_on_cpus_0_1(tmp_path_factory, name, flags):
    """tests/c/NAME.c with the pool's sources, built with ``flags`` (a sanitizer the compiler
    lacks: skip); needs cpus 0 and 1."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs cpus 0 and 1")
    out = str(tmp_path_factory.mktemp(name) / name)
    cmd = [cc, *flags, "-std=gnu11", "-pthread", *INCLUDES,
           os.path.join(HERE, "c", f"{name}.c"), *POOL_SOURCES, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and any(f.startswith("-fsanitize") for f in flags):
        pytest.skip(f"cannot build with {flags}: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def migrate_binary(tmp_path_factory):
    return _build_on_cpus_0_1(tmp_path_factory, "pool_migrate", ["-O2"])


@pytest.mark.parametrize("policy", [0, 3], ids=["asymo", "steal"])
def test_submitter_moved_between_cores_never_strands_a_range(migrate_binary, policy):
    # Before the fix a range the helping submitter stole into a sleeping worker's queue was
    # left there when the submitter moved to the other core: the job hung within ~1e5 jobs.
    r = subprocess.run([migrate_binary, str(policy), "150000"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ok 150000 jobs")


def _backup_counts(stdout):
    # "ok N jobs, B backups, S superseded, E early, T stalled"
    words = stdout.replace(",", "").split()
    return int(words[3]), int(words[5]), int(words[7]), int(words[9])


@pytest.mark.parametrize("queue", [0, 1], ids=["mutex", "chaselev"])
@pytest.mark.parametrize("submitters", [1, 2])
def test_backup_tasks_return_early_and_the_fence_waits(tmp_path_factory, queue, submitters):
    # Worker 1 stops 20 ms in one task of every third job (when it gets one): the job returns
    # with the late copy still running (early), every output there; the fence then waits for
    # the copy.
    binary = _build_on_cpus_0_1(tmp_path_factory, "pool_backup", ["-O2", "-Wall", "-Werror"])
    r = subprocess.run([binary, str(queue), str(submitters), "90"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    backups, superseded, early, stalled = _backup_counts(r.stdout)
    # a backup takes the late task and the ones its worker had taken but not begun
    assert backups >= superseded >= early > 0
    if submitters == 1:  # (two submitters on one core: only the one acting as its worker backs up)
        # most stops end after their job returned (a 20 ms margin for a loaded machine)
        assert early >= stalled // 2


@pytest.mark.parametrize("sanitizer", ["thread", "address"])
def test_backup_tasks_under_sanitizers(tmp_path_factory, sanitizer):
    # a late copy touching the job (on its submitter's stack) after the job returned, or the
    # context after the fence let it go, is what these two catch
    binary = _build_on_cpus_0_1(tmp_path_factory, "pool_backup",
                                ["-O1", "-g", f"-fsanitize={sanitizer}"])
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66",
               ASAN_OPTIONS="detect_stack_use_after_return=1")
    r = subprocess.run([binary, "0", "2", "60"], capture_output=True, text=True, timeout=120,
                       env=env)
    if "FATAL: ThreadSanitizer" in r.stderr:
        pytest.skip(f"ThreadSanitizer cannot run here: {r.stderr[-200:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING:" not in r.stderr, r.stderr[-3000:]
    assert _backup_counts(r.stdout)[0] > 0
