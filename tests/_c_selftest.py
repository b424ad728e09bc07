"""Build one of tests/c/*_selftest.c with the C files of asymo._native and run it: natively,
or for AArch64 under qemu-user (the NEON kernels) when the cross tool chain is installed."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
sys.path.insert(0, CSRC)
from build_native import native_sources  # noqa: E402  (the C files of asymo._native)


CFLAGS = ("-O2", "-std=gnu11", "-pthread", "-I", os.path.join(CSRC, "include"), "-I", CSRC)
_objects = {}  # compiler -> the runtime's object files, compiled once per test session


def _finish(proc):
    text, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, text)


def _runtime_objects(cc):
    """The runtime's C files compiled by ``cc``, once per session and as many at a time as
    there are cpus (every self-test links the same objects; compiling them in each test's one
    command was most of the suite's time)."""
    if cc not in _objects:
        out = tempfile.mkdtemp(prefix="asymo-selftest-")
        atexit.register(shutil.rmtree, out, True)
        jobs, objs = [], []
        for i, src in enumerate(native_sources()):
            obj = os.path.join(out, f"{i}_{os.path.basename(src)[:-2]}.o")
            objs.append(obj)
            jobs.append([cc, *CFLAGS, "-c", src, "-o", obj])
        running, width = [], os.cpu_count() or 1
        for cmd in jobs:
            if len(running) >= width:
                _finish(running.pop(0))
            running.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True))
        for proc in running:
            _finish(proc)
        _objects[cc] = objs
    return _objects[cc]


def build_and_run(name, cc, tmp_path, runner=(), extra=()):
    """Compile tests/c/``name``.c, link it with the runtime's objects, run it, check it ends
    in OK."""
    exe = str(tmp_path / name)
    subprocess.run([cc, *CFLAGS, *extra, os.path.join(ROOT, "tests", "c", name + ".c"),
                    *_runtime_objects(cc), "-lm", "-o", exe],
                   check=True, capture_output=True, text=True, timeout=300)
    res = subprocess.run([*runner, exe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("OK"), res.stdout
    return res.stdout


def run_native(name, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return build_and_run(name, cc, tmp_path)


def run_under_qemu(name, tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 (`make test` installs them "
                    "as root: apt-get install gcc-aarch64-linux-gnu qemu-user)")
    return build_and_run(name, cc, tmp_path, runner=(qemu,), extra=("-static",))
