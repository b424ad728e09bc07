"""2-D max and average pooling on NCHW arrays (``torch.nn.functional.max_pool2d`` /
``avg_pool2d`` semantics), run as pool tasks over image planes by a C kernel."""
from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from asymo.ops.conv import CALL_CACHE_SIZE, _geometry, _int_pair, _pair, _ptr, remember_call
from asymo.ops.tensors import as_array, out_array, tensor_result, torch_of
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.memory import empty_result
from asymo.runtime.partition import even_block_size as _even_block_size
from asymo.runtime.pool import hold as _hold
from asymo.runtime.tasks import (DTYPE_CODES, INLINE_BYTES, TASK_IDLE, TASKS_PER_WORKER,
                                 BoundJobs, run_tasks, task_fn)
from asymo.runtime.tasks import tasks_call as _tasks_call

__all__ = ["max_pool2d", "avg_pool2d", "pool_output_size", "bind_pool2d"]


def pool_output_size(size, kernel, stride, padding, ceil_mode=False):
    """Output length along one axis (torch rule: a ceil-mode window must start inside the
    input or the left padding)."""
    span = size + 2 * padding - kernel
    if ceil_mode:
        out = -(-span // stride) + 1
        if (out - 1) * stride >= size + padding:
            out -= 1
    else:
        out = span // stride + 1
    return out


# A call's job struct, kept per thread for a repeated signature (a model runs the same pools
# on every inference): a repeat sets only the arrays' addresses and the task split.
_local = threading.local()  # .entries: {signature: _Call} (conv.remember_call)
_TASK = None


class _Call:
    """A validated pooling call of one signature: its job (geometry set), output shape, and
    its task split on the pool it last ran on."""

    __slots__ = ("job", "shape", "planes", "min_planes", "inline", "busy", "_split")

    def __init__(self, job, shape, planes, min_planes, inline):
        self.job, self.shape, self.planes, self.min_planes = job, shape, planes, min_planes
        self.inline = inline  # too small to wake the workers for
        self.busy = False  # running: a re-entrant call (a signal handler) takes its own job
        self._split = None

    def split(self, pool):
        """``(planes per task, tasks, per-cluster counts or NULL)`` on ``pool``, which the
        caller holds: made once per pool and thread limit (the counts are the pool's capacity
        split over its active workers)."""
        limit = lib.asymo_pool_get_limit(pool._handle)
        s = self._split
        if s is None or s[0]() is not pool or s[1] != limit:
            per = max(self.min_planes, _even_block_size(
                self.planes, TASKS_PER_WORKER * pool.nworkers, pool.nworkers,
                tolerance=TASK_IDLE))
            ntasks = -(-self.planes // per)
            counts = ffi.NULL if pool.nclusters == 1 else ffi.new(
                "int64_t[]", pool.split_counts(ntasks))
            s = self._split = (weakref.ref(pool), limit, per, ntasks, counts)
        return s[2:]

    def run(self, x, y, pool):
        job = self.job
        job.x = _ptr(x)
        job.y = _ptr(y)
        per, ntasks, counts = self.split(pool)
        job.planes_per_task = per
        run_tasks(pool, _TASK, job, ntasks, counts, inline=self.inline)


def _int_or_pair(v):
    # exact types: 2.0 and True equal 2 and 1 as keys but are errors
    return type(v) is int or _int_pair(v)


def _signature(kind, x, kernel, stride, padding, ceil_mode, count_include_pad):
    """The key of a call in the per-thread cache, or None for calls that always take the
    checked path (arguments of other types, an input that is not a C-contiguous array)."""
    if (type(x) is not np.ndarray or not x.flags.c_contiguous or not _int_or_pair(kernel)
            or not (stride is None or _int_or_pair(stride)) or not _int_or_pair(padding)
            or type(ceil_mode) is not bool or type(count_include_pad) is not bool):
        return None
    return (kind, x.shape, x.dtype, kernel, stride, padding, ceil_mode, count_include_pad)


def _pool2d(kind, x, kernel, stride, padding, ceil_mode, count_include_pad, out, pool):
    key = _signature(kind, x, kernel, stride, padding, ceil_mode, count_include_pad)
    if key is not None:
        entries = getattr(_local, "entries", None)
        call = None if entries is None else entries.get(key)
        if call is not None and not call.busy and (
                out is None or (type(out) is np.ndarray and out.shape == call.shape
                                and out.dtype == x.dtype and out.flags.c_contiguous
                                and out.flags.writeable
                                and not np.may_share_memory(out, x))):
            y = empty_result(call.shape, x.dtype) if out is None else out
            call.busy = True
            try:
                with _hold(pool) as pool:
                    call.run(x, y, pool)
            finally:
                call.busy = False
            return y
    return _checked_pool2d(kind, x, kernel, stride, padding, ceil_mode, count_include_pad, out,
                           pool, key)


def _flag(v):
    """Whether ``v`` is a bool (or 0 / 1), as torch's boolean pooling arguments take."""
    return isinstance(v, (bool, np.bool_)) or (type(v) is int and v in (0, 1))


def _checked_pool2d(kind, x, kernel, stride, padding, ceil_mode, count_include_pad, out, pool,
                    key):
    if not _flag(count_include_pad):
        raise TypeError(f"{kind}_pool2d: count_include_pad must be a bool, got "
                        f"{count_include_pad!r}")
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    kernel, stride, padding, h, w, oh, ow, shape = _check(kind, x, kernel, stride, padding,
                                                          ceil_mode, out)
    if out is None:
        y = empty_result(shape, x.dtype)
    else:
        # an output overlapping the input (out=x) would be read after it is written
        y = out if out.flags.c_contiguous and not np.may_share_memory(out, x) \
            else empty_result(shape, x.dtype)
    call = _new_call(kind, x, h, w, kernel, stride, padding, oh, ow, count_include_pad, shape)
    if call.planes == 0:
        return y
    xc = np.ascontiguousarray(x)
    with _hold(pool) as pool:  # see asymo.runtime.pool.acquire
        call.run(xc, y, pool)
    if key is not None:
        remember_call(_local, key, call, CALL_CACHE_SIZE)
    if out is not None and y is not out:
        out[...] = y
        return out
    return y


def _check(kind, x, kernel, stride, padding, ceil_mode, out):
    """The argument checks of a pooling call (``x`` an ndarray); returns the kernel, stride
    and padding pairs, the input and output plane sizes and the output shape."""
    name = f"{kind}_pool2d"
    if not _flag(ceil_mode):
        raise TypeError(f"{name}: ceil_mode must be a bool, got {ceil_mode!r}")
    if x.dtype not in DTYPE_CODES:
        raise TypeError(f"{name}: input must be float32 or float64, got dtype {x.dtype}")
    if x.ndim not in (3, 4):
        raise ValueError(f"{name}: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got "
                         f"input of shape {x.shape}")
    kernel = _pair(kernel, "kernel_size", 1, name)
    stride = kernel if stride is None else _pair(stride, "stride", 1, name)
    padding = _pair(padding, "padding", 0, name)
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        raise ValueError(f"{name}: padding {padding} must be at most half the kernel size "
                         f"{kernel}")
    h, w = x.shape[-2:]
    oh = pool_output_size(h, kernel[0], stride[0], padding[0], ceil_mode)
    ow = pool_output_size(w, kernel[1], stride[1], padding[1], ceil_mode)
    if oh < 1 or ow < 1:
        raise ValueError(f"{name}: kernel {kernel} with padding {padding} is larger than the "
                         f"input of shape {x.shape}")
    shape = x.shape[:-2] + (oh, ow)
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{name}: out must be a numpy array, got {type(out).__name__}")
        if not out.flags.writeable:
            raise ValueError(f"{name}: out is read-only")
        if out.shape != shape or out.dtype != x.dtype:
            raise ValueError(f"{name}: out must have shape {shape} and dtype {x.dtype}, got "
                             f"{out.shape} {out.dtype}")
    return kernel, stride, padding, h, w, oh, ow, shape


def _new_call(kind, x, h, w, kernel, stride, padding, oh, ow, count_include_pad, shape):
    global _TASK
    if _TASK is None:
        _TASK = task_fn("asymo_pool2d_task")
    job = ffi.new("asymo_pool2d_job *")
    _geometry(job.geom, 1, h, w, kernel, stride, ((padding[0],) * 2, (padding[1],) * 2),
              (1, 1), oh, ow)
    job.dtype = DTYPE_CODES[x.dtype]
    job.kind = 0 if kind == "max" else 1
    job.count_include_pad = bool(count_include_pad)
    planes = math.prod(x.shape[:-2])
    job.nplanes = planes
    # whole planes per task, at least ~16 KB of input each, ~4 tasks per worker
    min_planes = max(1, (16384 // x.itemsize) // max(h * w, 1))
    return _Call(job, shape, planes, min_planes, x.nbytes < INLINE_BYTES)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, *,
               out=None, pool=None):
    """Max pooling over the last two axes of a (N, C, H, W) or (C, H, W) array, with the
    arguments of ``torch.nn.functional.max_pool2d`` in its order.

    ``stride`` defaults to ``kernel_size``; padding counts as -infinity; ``dilation`` must be
    1 (dilated pooling is not supported). A torch tensor in gives a torch tensor out (CPU,
    float32 or float64; detached: asymo is inference-only).
    """
    # (the common dilation=1 costs the cached call no check)
    if not (type(dilation) is int and dilation == 1) and \
            _pair(dilation, "dilation", 1, "max_pool2d") != (1, 1):
        raise ValueError(f"max_pool2d: dilation {dilation!r} is not supported (only 1)")
    torch = torch_of(x, out)
    if torch is not None:
        return _pool2d_torch(torch, "max", x, kernel_size, stride, padding, ceil_mode, True,
                             out, pool)
    return _pool2d("max", x, kernel_size, stride, padding, ceil_mode, True, out, pool)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, *, out=None, pool=None):
    """Average pooling over the last two axes of a (N, C, H, W) or (C, H, W) array, with the
    arguments of ``torch.nn.functional.avg_pool2d`` in its order (no ``divisor_override``).
    A torch tensor in gives a torch tensor out."""
    torch = torch_of(x, out)
    if torch is not None:
        return _pool2d_torch(torch, "avg", x, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, out, pool)
    return _pool2d("avg", x, kernel_size, stride, padding, ceil_mode, count_include_pad, out,
                   pool)


def _pool2d_torch(torch, kind, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                  out, pool):
    what = f"{kind}_pool2d"
    xa = as_array(torch, x, what, "input")
    res = _pool2d(kind, xa, kernel_size, stride, padding, ceil_mode, count_include_pad,
                  out_array(torch, out, what), pool)
    return tensor_result(torch, res, out)


def bind_pool2d(kind, x, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, *, out, pool):
    """Bind ``max_pool2d`` (``kind="max"``) / ``avg_pool2d`` (``"avg"``) of ``x`` into ``out``
    on ``pool`` once; returns a function of no arguments that recomputes ``out`` from the
    current contents of ``x`` (an `asymo.runtime.tasks.BoundJobs` where the kernel takes the
    arrays in place: its ``calls`` let a model run the job in a sequence).

    For a model's fixed arena arrays: the job struct, the task split and the two addresses are
    set here, so a call is one C call. Inside a network the per-call Python of the unbound
    entry (signature, cache look-up, hold, task split: ~10 us warm) ran with its objects
    evicted by the layers before it and cost 40-80 us (MobileNet V2's GlobalAveragePool:
    16 us alone, 41-76 us in the network; docs/pooling.md). Arrays the kernel cannot use in
    place (a non-contiguous input or output, an output overlapping the input) are bound to
    the unbound call: correct, just without the saving.
    """
    if kind not in ("max", "avg"):
        raise ValueError(f"bind_pool2d: kind must be 'max' or 'avg', got {kind!r}")
    if pool is None:
        raise ValueError("bind_pool2d: pool is required (the pool the calls run on)")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"bind_pool2d: out must be a numpy array, got {type(out).__name__}")
    fn = max_pool2d if kind == "max" else avg_pool2d
    extra = {} if kind == "max" else {"count_include_pad": count_include_pad}

    def fallback():
        fn(x, kernel_size, stride, padding, ceil_mode=ceil_mode, out=out, pool=pool, **extra)

    if type(x) is not np.ndarray:
        return fallback
    # the checks and errors of the unbound call, once (nothing is computed here: a model binds
    # its steps after its input is written, and out may share the arena with that input)
    kernel, stride, padding, h, w, oh, ow, shape = _check(kind, x, kernel_size, stride,
                                                          padding, ceil_mode, out)
    if not x.flags.c_contiguous or not out.flags.c_contiguous or np.may_share_memory(out, x):
        return fallback
    call = _new_call(kind, x, h, w, kernel, stride, padding, oh, ow, bool(count_include_pad),
                     out.shape)
    if call.planes == 0:
        return lambda: None
    job = call.job
    job.x = _ptr(x)
    job.y = _ptr(out)
    job.planes_per_task, ntasks, counts = call.split(pool)
    # (keep: alive as long as the bound call; args hold the job and counts)
    return BoundJobs([_tasks_call(pool, _TASK, job, ntasks, counts, call.inline)],
                     (x, out, call), f"a bound {kind} pooling call")
