"""Overhead of a parallel job on asymo's pool, against starting threads per job and Numba prange.

Run under the benchmark lock (the machine is shared):

    flock /tmp/asymo-bench.lock python3 bench/pool_overhead.py

Every figure is a median over repeats, measured side by side in one run:

* empty job: ``ntasks`` = number of workers, the task does nothing (C ``asymo_task_noop``):
  - ``pool.parallel_for``: the Python API (argument checks, split, GIL released in C);
  - ``asymo_pool_run`` called directly through cffi with prepared arguments (the C path that
    GEMM and other C callers use);
  - the same size with a body that cannot be optimised away (``out[i] = i``): the pool running
    a Numba cfunc, and a Numba ``prange`` loop (an empty ``prange`` body is compiled away);
  - starting and joining one pthread per worker for each job (C pthreads, created through
    cffi, running a Numba cfunc start routine), and Python ``threading.Thread`` per job;
* per-task cost: ``ntasks`` tiny tasks (``out[i] = i``) as a Numba cfunc on the pool, against
  a Numba ``@njit(parallel=True)`` ``prange`` loop with the same body over the same range.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numba  # noqa: E402
from numba import njit, prange, types  # noqa: E402

import asymo  # noqa: E402
import asymo.runtime.pool  # noqa: E402
from asymo.runtime.ffi import ffi, lib  # noqa: E402


def timeit(fn, number, repeat):
    """Median seconds per call of ``fn`` (``number`` calls per sample, ``repeat`` samples)."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


@numba.cfunc(types.void(types.int64, types.voidptr))
def write_index(task, ctx):
    out = numba.carray(ctx, (task + 1,), np.float64)
    out[task] = task


@njit(parallel=True)
def prange_write_index(out):
    for i in prange(out.size):
        out[i] = i


@numba.cfunc(types.voidptr(types.voidptr))
def thread_start(arg):
    return arg  # an empty task: the thread does nothing but start and finish


import cffi  # noqa: E402

_pthread_ffi = cffi.FFI()
_pthread_ffi.cdef("""
    typedef unsigned long pthread_t;
    int pthread_create(pthread_t *thread, const void *attr, void *(*start)(void *), void *arg);
    int pthread_join(pthread_t thread, void **retval);
""")
_libc = _pthread_ffi.dlopen(None)


def pthreads_per_job(nthreads):
    start = _pthread_ffi.cast("void *(*)(void *)", thread_start.address)
    tids = _pthread_ffi.new("pthread_t[]", nthreads)

    def job():
        for i in range(nthreads):
            if _libc.pthread_create(tids + i, _pthread_ffi.NULL, start, _pthread_ffi.NULL):
                raise OSError("pthread_create failed")
        for i in range(nthreads):
            _libc.pthread_join(tids[i], _pthread_ffi.NULL)
    return job


def python_threads_per_job(nthreads):
    def job():
        threads = [threading.Thread(target=lib.asymo_task_noop, args=(i, ffi.NULL))
                   for i in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return job


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default=None,
                    help="topology override spec (default: asymo.hw.topology.detect())")
    ap.add_argument("--policy", default="asymo", choices=sorted(asymo.runtime.pool.POLICIES))
    ap.add_argument("--queue", default=None, choices=sorted(asymo.runtime.pool.QUEUES))
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=400, help="jobs per sample (empty-job test)")
    ap.add_argument("--sizes", default="1000,100000,1000000",
                    help="task counts for the per-task comparison with prange")
    args = ap.parse_args(argv)

    pool = asymo.Pool(args.topology, policy=args.policy, queue=args.queue)
    n = pool.nworkers
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    print(f"machine: {platform.machine()} {platform.processor() or ''} "
          f"usable cpus {sorted(os.sched_getaffinity(0))}, python {platform.python_version()}, "
          f"numba {numba.__version__} ({numba.config.THREADING_LAYER} layer, "
          f"{numba.get_num_threads()} threads)")
    print(f"pool: {pool.nworkers} workers on cpus {list(pool.cpus)}, policy {pool.policy}, "
          f"queue {pool.queue}, spin {pool.spin_us} us, topology {pool.topology.to_spec()}")
    print(f"emulation: {os.environ.get('ASYMO_EMULATED') or 'none'}; "
          f"medians over {args.repeat} repeats; load average {os.getloadavg()[0]:.2f}")
    print()

    noop = ffi.addressof(lib, "asymo_task_noop")
    counts = ffi.new("int64_t[]", pool.split_counts(n))
    handle = pool._handle

    def c_job():
        lib.asymo_pool_run(handle, noop, ffi.NULL, n, counts, 0)

    def py_job():
        pool.parallel_for(noop, n)

    fresh = pthreads_per_job(n)
    pyfresh = python_threads_per_job(n)

    small = np.zeros(n, np.float64)

    def prange_job():
        prange_write_index(small)

    def py_numba_job():
        pool.parallel_for(write_index, n, ctx=small)

    for f in (c_job, py_job, fresh, pyfresh, prange_job, py_numba_job):  # warm up, compile
        f()

    rows = []
    for name, fn, number in [
        ("pool, C call (asymo_pool_run)", c_job, args.jobs),
        ("pool, Python (parallel_for)", py_job, args.jobs),
        ("pool, Python, cfunc out[i] = i", py_numba_job, args.jobs),
        ("Numba prange, out[i] = i", prange_job, args.jobs),
        ("pthread_create/join per job", fresh, max(args.jobs // 10, 10)),
        ("threading.Thread per job", pyfresh, max(args.jobs // 10, 10)),
    ]:
        rows.append((name, timeit(fn, number, args.repeat)))
        time.sleep(0.01)  # let spinning threads (ours, OpenMP's) go idle between rows
    base = rows[0][1]
    print(f"Empty job ({n} tasks, one per worker): median time per job")
    for name, t in rows:
        print(f"  {name:32s} {t * 1e6:9.2f} us   {t / base:7.1f}x the pool's C call")
    print()

    print("Tiny tasks (out[i] = i): pool calling a Numba cfunc once per task vs a Numba prange")
    print("loop whose body is compiled inline (and vectorised): the cost of the pool's")
    print("per-task function call, which matters only for tasks of a few nanoseconds")
    print(f"  {'ntasks':>9s} {'pool (ms)':>10s} {'ns/task':>8s} {'prange (ms)':>12s} "
          f"{'ns/task':>8s} {'pool/prange':>12s}")
    for size in [int(s) for s in args.sizes.split(",") if s]:
        out = np.zeros(size, np.float64)
        prange_write_index(out)  # compile
        pool.parallel_for(write_index, size, ctx=out)
        assert out[-1] == size - 1
        number = max(1, 200_000 // max(size, 1))
        samples_pool, samples_pr = [], []
        for _ in range(args.repeat):  # alternate blocks so drift hits both alike
            samples_pool.append(timeit(lambda: pool.parallel_for(write_index, size, ctx=out),
                                       number, 1))
            time.sleep(0.002)
            samples_pr.append(timeit(lambda: prange_write_index(out), number, 1))
            time.sleep(0.002)
        tp, tr = statistics.median(samples_pool), statistics.median(samples_pr)
        print(f"  {size:9d} {tp * 1e3:10.3f} {tp / size * 1e9:8.2f} {tr * 1e3:12.3f} "
              f"{tr / size * 1e9:8.2f} {tp / tr:12.2f}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
