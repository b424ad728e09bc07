"""The asymmetry-aware thread pool: one pinned worker per core, tasks split per cluster.

Every parallel operation in asymo, and any user kernel, runs through a `Pool`: a job is
``ntasks`` calls of a C function ``void fn(int64_t task, void *ctx)``; the task ids are split
into one contiguous block per cluster (fastest cluster first) and the pool's policy decides
which worker runs each task (AsyMo, section 4.3):

``"asymo"``
    cluster *c*'s tasks go to the shortest queues of cluster *c*'s workers; an idle worker
    steals from the longest queue of its own cluster, then from slower clusters; a slower
    cluster never steals from a faster one.
``"even"``
    equal static split over all workers, no stealing (OpenMP static, OpenBLAS).
``"shared"``
    one shared atomic counter; every worker takes the next task (ARM Compute Library).
``"steal"``
    equal split, stealing in any direction (pthreadpool).

The baseline policies ignore the per-cluster split (they do not know about clusters) but run
the same tasks, so benchmarks isolate scheduling.

Environment: ``ASYMO_POOL_POLICY`` (policy of the default pool), ``ASYMO_POOL_SPIN_US`` (how
long idle workers spin before sleeping, default 200), ``ASYMO_POOL_QUEUE`` (``mutex`` or
``chaselev`` per-worker queues, for benchmarking), ``ASYMO_TOPOLOGY`` (through
``topology.detect``). C callers use ``csrc/include/asymo/pool.h`` with ``Pool._handle``.

Examples
--------
A user kernel written with Numba, run on the process-wide pool::

    import numpy as np, numba, asymo
    from numba import types

    @numba.cfunc(types.void(types.int64, types.voidptr))
    def square_rows(task, ctx):
        a = numba.carray(ctx, (1000, 256), np.float64)   # ctx: the array's data pointer
        for j in range(256):
            a[task, j] = a[task, j] * a[task, j]

    a = np.random.rand(1000, 256)
    asymo.get_pool().parallel_for(square_rows, 1000, ctx=a)
"""
from __future__ import annotations

import atexit
import dataclasses
import math
import numbers
import os
import re
import threading
import warnings
import weakref

from asymo.hw import environ as _environ
from asymo.runtime.partition import largest_remainder as _largest_remainder
from asymo.runtime.ffi import ffi, lib
from asymo.hw.topology import ENV_VAR as TOPOLOGY_ENV_VAR
from asymo.hw.topology import Topology, detect, parse_spec

__all__ = ["Pool", "POLICIES", "QUEUES", "EVERY_JOB", "get_pool", "reset_default_pool",
           "set_thread_limit", "get_thread_limit", "acquire", "release", "hold",
           "caller_on_fastest"]

#: policy name -> C constant: the C library's ``ASYMO_POLICY_*`` enum, in its order (the
#: one list of policies: the lab's simulator and sweeps read it from here)
POLICIES = dict(sorted(((name[len("ASYMO_POLICY_"):].lower(), getattr(lib, name))
                        for name in dir(lib) if name.startswith("ASYMO_POLICY_")),
                       key=lambda item: item[1]))
#: per-worker queue implementation name -> C constant (None: env ASYMO_POOL_QUEUE, else the
#: one measured faster on this kind of machine, see bench/pool_queues.py)
QUEUES = {"mutex": lib.ASYMO_QUEUE_MUTEX, "chaselev": lib.ASYMO_QUEUE_CHASELEV}
_QUEUE_NAMES = {v: k for k, v in QUEUES.items()}
MAX_CLUSTERS = 8  # asymo_worker_stats.stolen_from_cluster has 8 entries
POLICY_ENV_VAR = "ASYMO_POOL_POLICY"

_ERRORS = {
    lib.ASYMO_EINVAL: (ValueError, "invalid argument"),
    lib.ASYMO_ENOMEM: (MemoryError, "out of memory"),
    lib.ASYMO_ETHREAD: (RuntimeError, "a worker thread could not be started"),
}


def _env_settings():
    """(queue name or None, spin_us or None, caller_helps) from ``ASYMO_POOL_QUEUE``,
    ``ASYMO_POOL_SPIN_US`` and ``ASYMO_POOL_CALLER_HELPS``: defaults of new pools (the C core
    reads no environment; invalid values are ignored)."""
    queue = os.environ.get("ASYMO_POOL_QUEUE")
    spin = re.match(r"\s*([+-]?\d+)", os.environ.get("ASYMO_POOL_SPIN_US", ""))
    spin_us = int(spin.group(1)) if spin and 0 <= int(spin.group(1)) <= 1_000_000 else None
    return (queue if queue in QUEUES else None, spin_us,
            os.environ.get("ASYMO_POOL_CALLER_HELPS") != "0")


def _raise_for(rc, what):
    exc, text = _ERRORS.get(rc, (RuntimeError, f"error code {rc}"))
    raise exc(f"{what}: {text}")


def _affinity():
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return set(range(os.cpu_count() or 1))


def _is_integral(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


#: `asymo_pool_fence`'s job number for "every job so far" (``Pool.fence()``'s default)
EVERY_JOB = (1 << 64) - 1


def _check_spin(name, value):
    """``value`` as an int, or a ValueError naming the setting ``name``: a spin time in
    [0, 1000000] microseconds."""
    if not _is_integral(value) or not 0 <= value <= 1_000_000:
        raise ValueError(f"{name} must be an integer in [0, 1000000], not {value!r}")
    return int(value)


def _as_task_fn(fn):
    """Coerce ``fn`` to a C ``asymo_task_fn``; raise ValueError/TypeError naming the problem."""
    hint = ("pass a C function `void fn(int64_t task, void *ctx)`: a cffi function pointer, "
            "a Numba @cfunc(types.void(types.int64, types.voidptr)) (or its .address), "
            "or an integer address")
    if fn is None:
        raise ValueError(f"fn is None; {hint}")
    if isinstance(fn, ffi.CData):
        ft = t = ffi.typeof(fn)  # cffi's ctype of a function pointer has kind "function"
        if t.kind != "function":
            raise TypeError(f"fn is a cffi {t.cname!r}, not a function pointer; {hint}")
        # (the task number is a 64-bit integer: a double of the same size gets garbage)
        if (ft.result.kind != "void" or len(ft.args) != 2 or ft.args[0].kind != "primitive"
                or ffi.sizeof(ft.args[0]) != 8 or ft.args[1].kind != "pointer"
                or ft.args[0].cname in ("double", "float")):
            raise TypeError(f"fn has C type {t.cname!r}; expected void(*)(int64_t, void *)")
        if fn == ffi.NULL:
            raise ValueError("fn is a NULL function pointer")
        return ffi.cast("asymo_task_fn", fn)
    if type(fn).__module__.startswith("numba") and hasattr(fn, "address"):
        sig = getattr(fn, "_sig", None)
        if sig is not None:
            args, ret = tuple(sig.args), sig.return_type
            ok = (len(args) == 2 and str(ret) in ("none", "void")
                  and str(args[0]) in ("int64", "intp", "uint64")
                  and (str(args[1]) in ("void*", "voidptr") or str(args[1]).startswith("*")
                       or "Pointer" in type(args[1]).__name__))
            if not ok:
                raise TypeError(f"Numba cfunc has signature {sig}; expected "
                                "void(int64, voidptr)")
        fn = fn.address
    elif type(fn).__name__ == "builtin_function_or_method" and hasattr(lib, getattr(fn, "__name__", "")):
        return ffi.cast("asymo_task_fn", fn)  # a function of asymo's own C core
    elif hasattr(fn, "_objects") and hasattr(fn, "argtypes"):  # a ctypes function pointer
        import ctypes
        args = getattr(fn, "argtypes", None)

        def int64(t):  # a 64-bit integer type (c_int64, c_size_t, ... are aliases of these)
            return getattr(t, "_type_", None) in ("q", "Q", "l", "L") and ctypes.sizeof(t) == 8

        def pointer(t):
            return t is ctypes.c_void_p or (isinstance(t, type)
                                            and issubclass(t, ctypes._Pointer))

        # (no argtypes: an unprototyped function, taken at its word)
        prototyped_ok = args is None or (len(args) == 2 and int64(args[0])
                                         and pointer(args[1]))
        if not prototyped_ok or getattr(fn, "restype", None) is not None:
            raise TypeError(f"fn is a ctypes function of argtypes {args} and restype "
                            f"{getattr(fn, 'restype', None)}; expected void(*)(int64_t, void *)")
        fn = ctypes.cast(fn, ctypes.c_void_p).value or 0
    if _is_integral(fn):
        if fn == 0:
            raise ValueError("fn is a NULL function pointer (address 0)")
        if fn < 0:
            raise ValueError(f"fn address {fn} is negative")
        if fn >= _ADDRESS_LIMIT:
            raise ValueError(f"fn address {fn:#x} does not fit in a pointer")
        return ffi.cast("asymo_task_fn", int(fn))
    if callable(fn):
        raise TypeError(f"fn is a Python callable ({type(fn).__name__}); {hint}. Python "
                        "functions can be wrapped with numba.cfunc or ffi.callback.")
    raise TypeError(f"fn has type {type(fn).__name__}; {hint}")


def _as_ctx(ctx):
    """Coerce ``ctx`` to ``void *``: None, an integer address, a cffi pointer, or an array."""
    if ctx is None:
        return ffi.NULL
    if isinstance(ctx, ffi.CData):
        kind = ffi.typeof(ctx).kind
        if kind not in ("pointer", "array"):
            raise TypeError(f"ctx is a cffi {ffi.typeof(ctx).cname!r}; expected a pointer")
        return ffi.cast("void *", ctx)
    if not _is_integral(ctx):
        try:
            return ffi.from_buffer(ctx)  # fast for contiguous arrays and buffers
        except (TypeError, ValueError, BufferError):
            pass
        iface = getattr(ctx, "__array_interface__", None)  # a strided view: its data pointer
        if iface is None:
            raise TypeError(
                f"ctx has type {type(ctx).__name__}; expected None, an integer address, a "
                "cffi pointer, a NumPy array or a buffer")
        return ffi.cast("void *", iface["data"][0])
    if ctx < 0:
        raise ValueError(f"ctx address {ctx} is negative")
    if ctx >= _ADDRESS_LIMIT:  # ffi.cast would silently keep only the low bits
        raise ValueError(f"ctx address {ctx:#x} does not fit in a pointer")
    return ffi.cast("void *", int(ctx))


_ADDRESS_LIMIT = 1 << (8 * ffi.sizeof("void *"))
_NTASKS_LIMIT = 1 << 63  # the C side counts tasks in int64_t


class Pool:
    """A pool of pinned workers, one per core of ``topology``.

    Parameters
    ----------
    topology : Topology, str or None
        The cores to use, grouped into clusters fastest first. None: ``asymo.hw.topology.detect()``
        (which honours ``ASYMO_TOPOLOGY``); a string is an explicit topology spec such as
        ``"big:0@1.0,little:1@0.5"`` (taken as given, not filtered by the affinity mask).
    policy : {"asymo", "even", "shared", "steal"}
        Scheduling policy (see the module docstring).
    spin_us : int, optional
        How long an idle worker looks for work before it sleeps (default 200 us, or env
        ``ASYMO_POOL_SPIN_US``).
    submit_spin_us : int, optional
        How long a thread that submitted a job and has nothing left to run polls the job
        before it sleeps (default 1000 us; see `submit_spin_us`).
    queue : {"mutex", "chaselev"} or None
        Per-worker queue implementation; None uses env ``ASYMO_POOL_QUEUE`` or the default
        (the faster one measured by ``bench/pool_queues.py``). For benchmarking.

    Notes
    -----
    A core that cannot be pinned (not in the process's affinity mask, or absent) gives a
    ``RuntimeWarning`` and an unpinned worker. Use the pool as a context manager, or call
    `close`, to stop its threads; pools are also closed at interpreter exit.
    """

    def __init__(self, topology=None, policy="asymo", *, spin_us=None, submit_spin_us=None,
                 queue=None):
        if _deferred:
            _drain_deferred()
        if topology is None:
            topology = detect()
        elif isinstance(topology, str):
            topology = parse_spec(topology)  # explicit: cpus outside the mask become unpinned workers
        elif not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, an override spec string or None, "
                            f"not {type(topology).__name__}")
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {sorted(POLICIES)}")
        if queue is not None and (not isinstance(queue, str) or queue not in QUEUES):
            raise ValueError(f"unknown queue {queue!r}; expected one of {sorted(QUEUES)}")
        if spin_us is not None:
            _check_spin("spin_us", spin_us)
        if submit_spin_us is not None:
            _check_spin("submit_spin_us", submit_spin_us)
        if topology.nclusters > MAX_CLUSTERS:
            raise ValueError(f"topology has {topology.nclusters} clusters; the pool supports "
                             f"at most {MAX_CLUSTERS}")
        self._topology = topology
        self._policy = policy
        cpus, clusters = [], []
        for ci, cl in enumerate(topology.clusters):
            for cpu in cl.cpus:
                cpus.append(int(cpu))
                clusters.append(ci)
        self._cpus = tuple(cpus)
        self._worker_cluster = tuple(clusters)
        err = ffi.new("int *")
        env_queue, env_spin_us, env_caller_helps = _env_settings()  # the C core reads no env
        handle = lib.asymo_pool_create(
            len(cpus), ffi.new("int[]", cpus), ffi.new("int[]", clusters), topology.nclusters,
            POLICIES[policy], QUEUES.get(queue or env_queue, lib.ASYMO_QUEUE_DEFAULT), err)
        if handle == ffi.NULL:
            _raise_for(err[0], "asymo.Pool could not be created")
        self._handle = handle
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inflight = 0  # holds (jobs and reads of the C handle) under way, all threads
        self._split_cache = {}
        self._fastest = None  # fastest_cluster_pool(), made on first use
        self._closed = False  # no new holds (but the holders of the moment may go on)
        self._retired = False  # destroy the handle when the last holder leaves
        self._dead = False  # the C handle is destroyed
        self._finalizer = weakref.finalize(self, _destroy_handle, handle)
        self._finalizer.atexit = False  # _close_all_at_exit closes it, after in-flight jobs
        _live_pools.add(self)
        if spin_us is None:
            spin_us = env_spin_us
        if spin_us is not None:
            self.spin_us = spin_us
        if submit_spin_us is not None:
            self.submit_spin_us = submit_spin_us
        if not env_caller_helps:
            lib.asymo_pool_set_caller_helps(handle, 0)
        self._own_limit = len(cpus)  # `limit` as set on this pool; threadpoolctl's cap apart
        if _global_limit is not None:  # a cap on: it holds for new pools too
            self._apply_limit()
        unpinned = [s.cpu for s in self._raw_stats() if s.cpu >= 0 and not s.pinned]
        if unpinned:
            warnings.warn(
                f"asymo.Pool: could not pin workers to cpu(s) {unpinned} (not in this "
                f"process's affinity mask {sorted(_affinity())}, or not present); they run "
                "unpinned", RuntimeWarning, stacklevel=2)

    def fastest_cluster_pool(self):
        """A pool of this pool's fastest cluster alone (same policy and spin times), made on
        first use and closed with this pool; this pool itself when it has one cluster.

        Its workers are pinned to the same cpus as this pool's fastest-cluster workers (and
        sleep when idle): a caller runs a job on one pool or the other, as
        `asymo.from_onnx` models do when the slower clusters do not pay (see
        ``GraphModel.cluster_choice``).
        """
        if self.nclusters == 1:
            return self
        spin_us, submit_spin_us = self.spin_us, self.submit_spin_us  # (not under the lock)
        with self._lock:
            self._check_open()
            sub = self._fastest
            if sub is None or sub.closed:
                top = self._topology
                fast = top.clusters[0]
                sub_top = dataclasses.replace(
                    top, clusters=(fast,),
                    emulated={c: v for c, v in top.emulated.items() if c in fast.cpus})
                sub = self._fastest = Pool(sub_top, self._policy, spin_us=spin_us,
                                           submit_spin_us=submit_spin_us)
        return sub

    # -- description ------------------------------------------------------------------------
    @property
    def topology(self):
        """The `Topology` the workers were created from."""
        return self._topology

    @property
    def policy(self):
        """The scheduling policy name."""
        return self._policy

    @property
    def queue(self):
        """The per-worker queue implementation ("mutex" or "chaselev")."""
        return _QUEUE_NAMES[self._call(lib.asymo_pool_queue)]

    @property
    def nworkers(self):
        """Number of workers (one per cpu of the topology)."""
        return len(self._cpus)

    @property
    def nclusters(self):
        return self._topology.nclusters

    @property
    def cpus(self):
        """The cpu of each worker, in worker order (fastest cluster first)."""
        return self._cpus

    @property
    def worker_cluster(self):
        """The cluster index of each worker."""
        return self._worker_cluster

    @property
    def closed(self):
        return self._closed

    @property
    def limit(self):
        """Number of workers that take tasks; the rest stay idle. Setting it sets this pool's
        own limit; threadpoolctl's cap (`set_thread_limit`), while one is on, lowers what
        takes effect, and when it ends the pool's own limit does again."""
        return self._call(lib.asymo_pool_get_limit)

    @limit.setter
    def limit(self, value):
        self._check_open()
        if value is None:
            value = self.nworkers
        if not _is_integral(value) or value < 1:
            raise ValueError(f"limit must be a positive integer or None, not {value!r}")
        self._own_limit = int(min(value, self.nworkers))
        self._apply_limit()

    def _apply_limit(self):
        """Set the C pool's limit: this pool's own, under threadpoolctl's cap."""
        cap = self.nworkers if _global_limit is None else _global_limit
        self._call(lib.asymo_pool_set_limit, min(self._own_limit, cap))

    @property
    def spin_us(self):
        """How long (microseconds) an idle worker looks for work before sleeping."""
        return self._call(lib.asymo_pool_get_spin_us)

    @spin_us.setter
    def spin_us(self, value):
        self._check_open()
        self._call(lib.asymo_pool_set_spin_us, _check_spin("spin_us", value))

    @property
    def submit_spin_us(self):
        """How long (microseconds) a thread that submitted a job polls it, once it has nothing
        left to run, before it sleeps until the job ends (default 1000).

        A job's last tasks may end on other cores well after the submitter ran out of work
        (a network's convolution ends with one worker's tail of tens to hundreds of
        microseconds); a sleeping submitter is woken by a futex and a reschedule on its core,
        and the next job starts that much later. Polling takes no core from the pool: the
        submitter runs the work of the worker on its core, or yields to that worker's thread
        while it runs some. Lower it to hand an idle submitter's core back sooner (to other
        processes, or to save energy); docs/pool.md has the measured effect."""
        return self._call(lib.asymo_pool_get_submit_spin_us)

    @submit_spin_us.setter
    def submit_spin_us(self, value):
        self._check_open()
        self._call(lib.asymo_pool_set_submit_spin_us, _check_spin("submit_spin_us", value))

    @property
    def caller_helps(self):
        """Whether a thread that submits a job runs queued work while it waits (default True).

        It then acts as the worker pinned to the core it is on: takes that worker's queued
        tasks and steals exactly as that worker would, under its identity (so
        ``asymo_pool_current_worker()`` and per-worker scratch stay right; never two threads
        act as one worker). A job then need not wait for a context switch to the worker that
        shares the submitter's core (pthreadpool's caller is its thread 0 for the same
        reason). False: the submitter only waits and every task runs on a pool thread (env
        ``ASYMO_POOL_CALLER_HELPS=0`` makes that the default of new pools)."""
        return bool(self._call(lib.asymo_pool_get_caller_helps))

    @caller_helps.setter
    def caller_helps(self, value):
        self._check_open()
        if value not in (True, False):  # bool, or 0 / 1 (numpy booleans compare equal)
            raise ValueError(f"caller_helps must be True or False, not {value!r}")
        self._call(lib.asymo_pool_set_caller_helps, int(bool(value)))

    @property
    def caller_to_fastest(self):
        """Whether a thread that submits a job from a core of a slower cluster moves to the
        fastest cluster's cores for the job (default True; a no-op on one-cluster pools).

        Only within the thread's own affinity mask, restored before the call returns: a thread
        pinned to a slower cluster (a pipeline stage) stays. On a slower core the submitter's
        help and the wake-up at the end of every job are slower, and a core that stops (one
        slowed by `asymo.lab.emulate`) holds every job up until it runs again; AsyMo keeps its
        submitting thread on a big core for the same reason. Once moved, the thread usually
        stays on the fast core, so later calls pay only a cheap check of the current cpu."""
        return bool(self._call(lib.asymo_pool_get_caller_to_fastest))

    @caller_to_fastest.setter
    def caller_to_fastest(self, value):
        self._check_open()
        if value not in (True, False):
            raise ValueError(f"caller_to_fastest must be True or False, not {value!r}")
        self._call(lib.asymo_pool_set_caller_to_fastest, int(bool(value)))

    def active_workers_per_cluster(self):
        """Workers per cluster that take tasks under the current `limit`."""
        limit = self.limit
        counts = [0] * self.nclusters
        for i, c in enumerate(self._worker_cluster):
            if i < limit:
                counts[c] += 1
        return tuple(counts)

    def __repr__(self):
        state = "closed" if self._closed else f"{self.nworkers} workers"
        return (f"<asymo.Pool policy={self._policy!r} {state} "
                f"topology={self._topology.to_spec()!r}>")

    # -- work -------------------------------------------------------------------------------
    def split_weights(self):
        """The default split ratio, one weight per cluster: its capacity x its active
        workers (`active_workers_per_cluster`)."""
        active = self.active_workers_per_cluster()
        return tuple(cl.capacity * a for cl, a in zip(self._topology.clusters, active))

    def split_counts(self, ntasks, split=None):
        """Per-cluster task counts for a job of ``ntasks`` tasks.

        Parameters
        ----------
        ntasks : int
        split : sequence of int, sequence of float, or None
            Integers are the counts themselves (one per cluster, summing to ``ntasks``);
            floats are a ratio (one non-negative weight per cluster); None is the default
            ratio: cluster capacity x number of active workers.

        Returns
        -------
        tuple of int
        """
        ntasks = self._check_ntasks(ntasks)
        nc = self.nclusters
        if split is None:
            return tuple(_largest_remainder(ntasks, self.split_weights()))
        if isinstance(split, (str, bytes)) or not hasattr(split, "__len__"):
            raise TypeError(f"split must be a sequence (one entry per cluster) or None, "
                            f"not {type(split).__name__}")
        split = list(split)
        if any(isinstance(x, (bool, str, bytes)) or type(x).__name__ in ("bool", "bool_")
               for x in split):
            raise TypeError(f"split entries must be numbers (integer counts or float "
                            f"weights), not {split!r}")
        if len(split) != nc:
            raise ValueError(f"split has {len(split)} entries but the pool has {nc} "
                             f"cluster(s) ({', '.join(c.name for c in self._topology.clusters)})")
        if all(_is_integral(x) for x in split):
            counts = [int(x) for x in split]
            if any(c < 0 for c in counts):
                raise ValueError(f"split counts must be >= 0, got {counts}")
            if sum(counts) != ntasks:
                raise ValueError(f"split counts {counts} sum to {sum(counts)} but ntasks is "
                                 f"{ntasks} (pass floats for a ratio)")
            return tuple(counts)
        try:
            weights = [float(x) for x in split]
        except (TypeError, ValueError):
            raise TypeError(f"split entries must be numbers, got {split!r}") from None
        if any(not math.isfinite(w) or w < 0 for w in weights):
            raise ValueError(f"split ratio entries must be finite and >= 0, got {weights}")
        if sum(weights) <= 0:
            raise ValueError(f"split ratio {weights} has no positive entry")
        return tuple(_largest_remainder(ntasks, weights))

    def parallel_for(self, fn, ntasks, ctx=None, split=None):
        """Run ``fn(task, ctx)`` for every task in ``range(ntasks)`` and wait for all of them.

        Parameters
        ----------
        fn : cffi function pointer, Numba ``@cfunc``, or int
            A C function ``void fn(int64_t task, void *ctx)`` (a Numba cfunc object or its
            ``.address`` both work). It is called from the pool's threads, concurrently.
        ntasks : int
            Number of tasks (>= 0).
        ctx : None, int, cffi pointer, NumPy array or buffer
            Passed to every call as ``void *`` (for an array: its data pointer). The caller
            keeps it alive; the call returns only when all tasks have finished.
        split : sequence of int, sequence of float, or None
            How many tasks each cluster gets (see `split_counts`): tasks ``[0, counts[0])``
            belong to cluster 0 (the fastest), the next ``counts[1]`` to cluster 1, ...

        Notes
        -----
        The calling thread waits with the GIL released. A ``parallel_for`` issued from inside
        a task runs inline on the calling worker. Several threads may submit at once. An
        exception raised by a Python ``ffi.callback`` task cannot propagate (cffi prints it and
        the task counts as done): prefer Numba or C kernels.
        """
        if _deferred:  # pools dropped on a worker: their threads stop here
            _drain_deferred()
        hit = _task_fn_cache.get(id(fn))
        if hit is not None and hit[0] is fn:
            cfn = hit[1]
        else:
            cfn = _as_task_fn(fn)
            if len(_task_fn_cache) >= 256:
                _task_fn_cache.clear()
            _task_fn_cache[id(fn)] = (fn, cfn)  # holding fn keeps its id from being reused
        if type(ntasks) is not int or not 0 <= ntasks < _NTASKS_LIMIT:
            ntasks = self._check_ntasks(ntasks)
        cctx = ffi.NULL if ctx is None else _as_ctx(ctx)
        # Hold the pool before touching the C handle: close() (from any thread) waits for
        # the holders before freeing it.
        self._acquire("parallel_for on a closed Pool")
        try:
            self._run(cfn, cctx, ntasks, split)
        finally:
            self._release()

    def _run(self, cfn, cctx, ntasks, split):
        if split is None:
            # the default split depends only on ntasks and the thread limit: cache it
            key = (ntasks, lib.asymo_pool_get_limit(self._handle))
            counts = self._split_cache.get(key)
            if counts is None:
                counts = ffi.new("int64_t[]", self.split_counts(ntasks))
                if len(self._split_cache) >= 256:
                    self._split_cache.clear()
                self._split_cache[key] = counts  # read-only for C: safe to share
        else:
            counts = ffi.new("int64_t[]", self.split_counts(ntasks, split))
        rc = lib.asymo_pool_run(self._handle, cfn, cctx, ntasks, counts, 0)
        if rc != lib.ASYMO_OK:
            _raise_for(rc, "parallel_for failed")

    # -- instrumentation -------------------------------------------------------------------
    def _raw_stats(self):
        out = ffi.new("asymo_worker_stats[]", self.nworkers)
        self._call(lib.asymo_pool_stats, out, self.nworkers)
        return out

    def stats(self):
        """Per-worker and per-cluster counters since creation or the last `reset_stats`.

        Returns
        -------
        dict
            ``{"policy", "nworkers", "limit", "workers": [...], "clusters": [...]}``; each
            worker has ``cpu``, ``cluster`` (index), ``cluster_name``, ``pinned``,
            ``tasks_run``, ``tasks_stolen``, ``stolen_from`` (victim cluster name -> tasks),
            ``steals`` (steal operations), ``tasks_inline`` (nested jobs run inline),
            ``busy_s`` (time inside tasks), ``sleeps``, ``tasks_caller`` (of
            ``tasks_run``, those a submitting thread ran as this worker; see
            `caller_helps`), ``tasks_backup`` (of ``tasks_run``, backups of tasks another
            worker was late with) and ``tasks_superseded`` (tasks it finished after a backup
            had; see `fence`); each cluster the sums.
        """
        names = [c.name for c in self._topology.clusters]
        workers = []
        for i, s in enumerate(self._raw_stats()):
            workers.append({
                "worker": i,
                "cpu": s.cpu,
                "cluster": s.cluster,
                "cluster_name": names[s.cluster],
                "pinned": bool(s.pinned),
                "tasks_run": s.tasks_run,
                "tasks_stolen": s.tasks_stolen,
                "stolen_from": {names[c]: s.stolen_from_cluster[c]
                                for c in range(len(names)) if s.stolen_from_cluster[c]},
                "steals": s.steals,
                "tasks_inline": s.tasks_inline,
                "busy_s": s.busy_ns * 1e-9,
                "sleeps": s.sleeps,
                "tasks_caller": s.tasks_caller,
                "tasks_backup": s.tasks_backup,
                "tasks_superseded": s.tasks_superseded,
            })
        clusters = []
        for ci, name in enumerate(names):
            mine = [w for w in workers if w["cluster"] == ci]
            stolen_from = {}
            for w in mine:
                for k, v in w["stolen_from"].items():
                    stolen_from[k] = stolen_from.get(k, 0) + v
            clusters.append({
                "cluster": ci, "name": name, "workers": len(mine),
                "tasks_run": sum(w["tasks_run"] for w in mine),
                "tasks_stolen": sum(w["tasks_stolen"] for w in mine),
                "stolen_from": stolen_from,
                "busy_s": sum(w["busy_s"] for w in mine),
                "tasks_caller": sum(w["tasks_caller"] for w in mine),
                "tasks_backup": sum(w["tasks_backup"] for w in mine),
                "tasks_superseded": sum(w["tasks_superseded"] for w in mine),
            })
        return {"policy": self._policy, "nworkers": self.nworkers, "limit": self.limit,
                "workers": workers, "clusters": clusters}

    def fence(self, job=None):
        """Wait until no worker still runs a task that a backup superseded (a job run with
        ``ASYMO_RUN_BACKUP``, whose late copies outlive the job) of job number ``job`` or
        lower (default: of every job so far). Returns the number of the last job submitted
        when called.

        The model runner calls it between nodes, so a late copy never meets memory that is
        reused (docs/pool.md, "Backup tasks").
        """
        if job is not None and (not _is_integral(job) or not 0 <= job < EVERY_JOB):
            raise ValueError(f"fence: job must be a job number (an int >= 0) or None, not "
                             f"{job!r}")
        return int(self._call(lib.asymo_pool_fence, EVERY_JOB if job is None else int(job)))

    def reset_stats(self):
        """Zero the counters reported by `stats`."""
        self._call(lib.asymo_pool_reset_stats)

    # -- lifecycle --------------------------------------------------------------------------
    # Every use of the C handle (a job of any kind: parallel_for, matmul, conv2d, the Numba
    # backend, a read of a setting) holds the pool: `_acquire` counts it, `_release` uncounts
    # it, and the handle is destroyed only when nobody holds it. A thread may hold a pool
    # several times (a conv2d's GEMMs run inside the conv2d's hold); once the pool is closed
    # only a thread that already holds it may hold it again, so a job that began before
    # `close` runs to its end. asymo.matmul's C fast path keeps its own count of the calls
    # running on a pool (csrc/python/matmul_fast.c) and waits for them in `_destroy_handle`.
    def _acquire(self, closed_message="operation on a closed Pool"):
        held = getattr(_tls, "held", None)
        if held is None:
            held = _tls.held = {}
        n = held.get(self, 0)
        lock = self._lock  # (a bare Lock: `with self._cond` costs twice as much)
        lock.acquire()
        if self._closed and (self._dead or not n):
            lock.release()
            raise ValueError(closed_message)
        self._inflight += 1
        lock.release()
        held[self] = n + 1

    def _release(self):
        held = getattr(_tls, "held", None)
        n = 0 if held is None else held.get(self, 0)
        if n > 1:
            held[self] = n - 1
        elif n == 1:
            del held[self]
        with self._lock:
            if self._inflight > 0:
                self._inflight -= 1
            if self._inflight or not self._closed:
                return
            self._cond.notify_all()  # close() waits for the last holder
            if self._retired and not self._dead:
                self._destroy_locked()

    def _call(self, fn, *args):
        """``fn(handle, *args)`` with the pool held (a closed pool: ValueError)."""
        self._acquire()
        try:
            return fn(self._handle, *args)
        finally:
            self._release()

    def _destroy_locked(self):
        # under self._cond, with nobody holding the pool
        self._dead = True
        self._finalizer()
        _live_pools.discard(self)
        if self._fastest is not None:
            self._fastest._retire()  # its own lock; its running jobs finish first

    def close(self):
        """Stop the workers, after the jobs running on the pool finish. Idempotent.

        Raises
        ------
        RuntimeError
            When called from one of the pool's own tasks, or by a thread that is itself
            running a job on this pool (waiting for that job would never end).
        """
        if self._dead:
            return
        if lib.asymo_pool_current() == self._handle:
            raise RuntimeError("a Pool cannot be closed from one of its own tasks")
        held = getattr(_tls, "held", None)
        if held and held.get(self):
            raise RuntimeError("a Pool cannot be closed by a thread that is running a job on "
                               "it")
        with self._cond:
            self._closed = True
            while self._inflight and not self._dead:
                self._cond.wait()
            if not self._dead:
                self._destroy_locked()

    def _retire(self):
        """Close the pool without waiting: the jobs running on it go on, the handle is
        destroyed when the last of them ends (a replaced default pool)."""
        with self._cond:
            self._closed = True
            self._retired = True
            if not self._inflight and not self._dead:
                self._destroy_locked()

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._closed:
            raise ValueError("operation on a closed Pool")

    @staticmethod
    def _check_ntasks(ntasks):
        if not _is_integral(ntasks):
            raise TypeError(f"ntasks must be an integer, not {type(ntasks).__name__}")
        ntasks = int(ntasks)
        if ntasks < 0:
            raise ValueError(f"ntasks must be >= 0, got {ntasks}")
        if ntasks >= _NTASKS_LIMIT:
            raise ValueError(f"ntasks {ntasks} does not fit in int64")
        return ntasks


def _destroy_handle(handle):
    if lib.asymo_pool_current() != ffi.NULL:
        # Collected on a pool worker (e.g. the last reference dropped inside a Python task):
        # joining from there could deadlock; finish on an ordinary thread instead.
        for hook in _destroy_hooks:
            hook(handle, False)
        _deferred.append(handle)
        return
    _destroy_now(handle)
    _drain_deferred()


def _destroy_now(handle):
    """Run the destroy hooks (waiting for the calls using ``handle``), then destroy it."""
    for hook in _destroy_hooks:
        hook(handle, True)
    lib.asymo_pool_destroy(handle)


def _drain_deferred():
    """Destroy the pools whose last reference went on a pool worker (`_destroy_handle`), from
    an ordinary thread: when another pool is destroyed, a pool is made or the default pool
    is asked for (their worker threads lived on until then)."""
    if not _deferred or lib.asymo_pool_current() != ffi.NULL:
        return
    while _deferred:
        try:
            handle = _deferred.pop()
        except IndexError:  # another thread took the last one
            return
        _destroy_now(handle)


_deferred = []
_tls = threading.local()  # .held: {pool: times this thread holds it}
#: ``hook(handle, wait)`` runs before a pool's C handle is destroyed (wait=False: stop using
#: it; wait=True: also wait for the calls using it); asymo.matmul's fast path registers here
_destroy_hooks = []
_task_fn_cache = {}  # id(fn) -> (fn, C function pointer)
_live_pools = weakref.WeakSet()
_global_limit = None  # threadpoolctl's cap, applied to every pool (under its own limit)

_default_lock = threading.Lock()
_default_pool = None
_default_built_for = None


# matmul asks for the default pool on every call: its key is read from the raw environment
_environ_data = _environ.DATA
_TOPOLOGY_KEY = os.fsencode(TOPOLOGY_ENV_VAR)
_POLICY_KEY = os.fsencode(POLICY_ENV_VAR)


def _default_key():
    if _environ_data is not None:
        return (_environ_data.get(_TOPOLOGY_KEY), _environ_data.get(_POLICY_KEY))
    return (os.environ.get(TOPOLOGY_ENV_VAR), os.environ.get(POLICY_ENV_VAR))  # pragma: no cover


def get_pool():
    """The process-wide default `Pool` (created on first use from ``topology.detect()``).

    Its policy is ``"asymo"`` unless env ``ASYMO_POOL_POLICY`` names another. When env
    ``ASYMO_TOPOLOGY`` or ``ASYMO_POOL_POLICY`` changed since it was built (the emulator sets
    the former), a new default pool is built and the old one closed.
    """
    global _default_pool, _default_built_for
    pool = _default_pool
    key = _default_key()
    if _deferred:
        _drain_deferred()
    if pool is not None and not pool.closed and key == _default_built_for:
        return pool
    old = None
    with _default_lock:
        if (_default_pool is None or _default_pool.closed
                or _default_built_for != key):
            policy = os.environ.get(POLICY_ENV_VAR) or "asymo"
            if policy not in POLICIES:
                raise ValueError(f"env {POLICY_ENV_VAR}={policy!r} is not a policy; expected "
                                 f"one of {sorted(POLICIES)}")
            old = _default_pool
            _default_pool = Pool(policy=policy)
            _default_built_for = key
        pool = _default_pool
    if old is not None:
        old._retire()  # a job running on it (another thread's) goes on to its end
    return pool


def reset_default_pool():
    """Close the default pool; the next `get_pool` builds a new one from the current topology.

    Call it when the topology changes (the emulator does, for example). Jobs already running
    on the old default pool (in any thread) finish on it; its workers stop after the last.
    """
    global _default_pool
    with _default_lock:
        pool, _default_pool = _default_pool, None
    if pool is not None:
        pool._retire()


def acquire(pool=None):
    """Hold ``pool`` (None: the default pool) open until `release`; return it.

    Every asymo operation holds the pool it runs on for its whole length, so closing the pool
    (or replacing the default pool) from another thread waits for it, or lets it finish on the
    old pool, instead of freeing the workers under it.

    Raises
    ------
    ValueError
        ``pool`` is closed (and this thread does not hold it already).
    TypeError
        ``pool`` is not an `asymo.Pool`.
    """
    if pool is None:
        while True:  # the default pool may be replaced between get_pool and the hold
            pool = get_pool()
            try:
                pool._acquire()
            except ValueError:
                continue
            return pool
    if type(pool) is not Pool and not isinstance(pool, Pool):
        raise TypeError(f"pool must be an asymo.Pool or None, not {type(pool).__name__}")
    pool._acquire()
    return pool


def release(pool):
    """Undo one `acquire` of ``pool``."""
    pool._release()


class hold:
    """Context manager: ``with hold(pool) as p:`` holds ``p`` (see `acquire`) for the block."""

    __slots__ = ("_arg", "_pool")

    def __init__(self, pool=None):
        self._arg = pool
        self._pool = None

    def __enter__(self):
        self._pool = acquire(self._arg)
        return self._pool

    def __exit__(self, *exc):
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._release()


class caller_on_fastest:
    """Context manager: the calling thread runs on ``pool``'s fastest cluster for the block,
    its affinity restored after (on every exit path).

    A sequence of jobs (a model's inference) has serial work between them, done by the caller,
    and the caller helps run each job as the worker of the core it is on: on a slower core
    both take longer, and on a core that is stopped (a core slowed by `asymo.lab.emulate`)
    every job waits for it. AsyMo keeps that thread on a big core. Nothing changes when the
    pool has one cluster, or when the thread may not run on the fastest cluster's cpus.
    """

    __slots__ = ("_pool", "_saved")

    def __init__(self, pool):
        self._pool = pool
        self._saved = None

    def __enter__(self):
        pool = self._pool
        if pool.nclusters < 2:
            return pool
        try:
            now = os.sched_getaffinity(0)
            fast = now & {int(c) for c in pool.topology.clusters[0].cpus}
            if fast and fast != now:
                os.sched_setaffinity(0, fast)
                self._saved = now
        except (AttributeError, OSError):  # pragma: no cover - non-Linux, or a cgroup limit
            self._saved = None
        return pool

    def __exit__(self, *exc):
        saved, self._saved = self._saved, None
        if saved is not None:
            os.sched_setaffinity(0, saved)


def set_thread_limit(limit):
    """Cap every pool (existing and future) at ``limit`` active workers; None removes the cap.

    This is what ``threadpoolctl.threadpool_limits(n, user_api="asymo")`` calls. Capped
    workers take no tasks; the per-cluster split follows the remaining active workers.
    """
    global _global_limit
    if limit is not None and (not _is_integral(limit) or limit < 1):
        raise ValueError(f"thread limit must be a positive integer or None, not {limit!r}")
    pools = [p for p in list(_live_pools) if not p.closed]
    widest = max([p.nworkers for p in pools] + [_machine_cpus()])
    # threadpoolctl restores by setting what get_thread_limit read: the full width, no cap
    new = None if limit is None or limit >= widest else int(limit)
    if new is None and _global_limit is None:
        return  # no cap before or after: each pool keeps its own `limit`
    _global_limit = new
    for pool in pools:
        try:
            pool._apply_limit()  # its own limit, under the cap (none: its own again)
        except ValueError:  # closed meanwhile
            pass


def _machine_cpus():
    """The machine's cpu count (a pool of one worker per cpu). Not ``topology.detect()``,
    which reads sysfs and warns about an override that the caller's current affinity
    excludes (threadpoolctl asks while a benchmark pins it to one core)."""
    return os.cpu_count() or 1


def get_thread_limit():
    """The most workers any pool may use: the cap, else the widest of the open pools and the
    machine's cpus (`_machine_cpus`) -- the width `set_thread_limit` reads as no cap, so
    threadpoolctl, restoring what it read here, restores no cap. (With only narrower pools
    open, the widest pool's width would have come back as a cap on every later pool.) This is
    threadpoolctl's ``num_threads``."""
    if _global_limit is not None:
        return _global_limit
    return max([p.nworkers for p in list(_live_pools) if not p.closed] + [_machine_cpus()])


@atexit.register
def _close_all_at_exit():
    for pool in list(_live_pools):
        try:
            pool.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _after_fork_in_child():
    # Threads that held these locks do not exist in the child. The C side has already reset
    # every pool (pthread_atfork); workers restart on the first job.
    global _default_lock
    _default_lock = threading.Lock()
    held = getattr(_tls, "held", None) or {}  # the forking thread's holds go on in the child
    for pool in list(_live_pools):
        pool._lock = threading.Lock()
        pool._cond = threading.Condition(pool._lock)
        pool._inflight = held.get(pool, 0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
