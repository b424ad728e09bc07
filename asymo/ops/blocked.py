"""Convolutions in the blocked-channel layout (NCHW8c, ``asymo/conv.h``), for a model's plan.

An image of C channels (a multiple of 8) is held as C / 8 blocks, each a plane of pixels of 8
channels, so a pixel's 8 channels are one AVX2 vector: ONNX Runtime's MLAS and oneDNN keep
convolution chains in such layouts. A 1x1 convolution then reads each pixel's channels as
contiguous vectors and stores whole vectors (the NCHW kernels read one cache line per channel
plane and transpose their tiles), and a depthwise 3x3 one wastes no lanes on narrow planes.

Two kinds of layer run so (`blocked_kind`): 1x1 stride-1 convolutions and depthwise 3x3 ones
(stride 1 or 2, padding at most 1), float32, channels multiples of 8, where the convolution
kernels are AVX2 or AVX-512. `asymo.models.graph_model` decides which tensors of a model keep
the layout and binds the steps here (`bind_blocked_conv`, `bind_reorder`); nothing in the
public API takes blocked arrays.
"""
from __future__ import annotations

import numpy as np

from asymo.runtime.ffi import ffi, lib
from asymo.runtime.partition import split_blocks
from asymo.runtime.tasks import (ACTIVATION_CODES, TASK_IDLE, TASKS_PER_WORKER, task_fn,
                                 tasks_call)

__all__ = ["BLOCK", "blocked_kind", "PackedBlockedWeight", "bind_blocked_conv",
           "bind_reorder", "planar_input_ok"]

BLOCK = lib.ASYMO_BLOCK
_REORDER_TASK = task_fn("asymo_reorder_task")
_POINTWISE_TASK = task_fn("asymo_pointwise_blocked_task")
_DEPTHWISE_TASK = task_fn("asymo_depthwise_blocked_task")


def blocked_kind(xshape, wshape, stride, pads, dilation, groups, activation):
    """"pointwise" or "depthwise" when the layer can run in the blocked layout here, else
    None. ``pads``: (pad_h, pad_w), symmetric."""
    if not lib.asymo_blocked_supported() or activation not in ACTIVATION_CODES:
        return None
    c, k = xshape[1], wshape[0]
    if c % BLOCK or k % BLOCK or tuple(dilation) != (1, 1):
        return None
    if (tuple(wshape[2:]) == (1, 1) and groups == 1 and tuple(stride) == (1, 1)
            and tuple(pads) == (0, 0)):
        return "pointwise"
    if (tuple(wshape[2:]) == (3, 3) and groups == c == k and wshape[1] == 1
            and stride[0] == stride[1] and stride[0] in (1, 2)
            and all(0 <= p <= 1 for p in pads)):
        return "depthwise"
    return None


class PackedBlockedWeight:
    """A layer's weights packed once for the blocked kernels (shared by a model's instances)."""

    __slots__ = ("kind", "data", "channels", "out_channels")

    def __init__(self, kind, weight):
        w = np.ascontiguousarray(weight, np.float32)
        if (kind not in ("pointwise", "depthwise") or w.ndim != 4 or w.shape[0] % BLOCK
                or (kind == "pointwise" and (w.shape[2:] != (1, 1) or w.shape[1] % BLOCK))
                or (kind == "depthwise" and w.shape[1:] != (1, 3, 3))):
            raise ValueError(f"no blocked {kind} layer has weights of shape {w.shape}")
        self.kind = kind
        self.out_channels = w.shape[0]
        if kind == "pointwise":
            self.channels = w.shape[1]
            self.data = np.empty(lib.asymo_pointwise_blocked_packed_size(
                self.channels, self.out_channels), np.float32)
            lib.asymo_pointwise_blocked_pack(ffi.from_buffer("float[]", w), self.channels,
                                             self.out_channels,
                                             ffi.from_buffer("float[]", self.data))
        else:
            self.channels = w.shape[0]
            self.data = np.empty(self.channels * 9, np.float32)
            lib.asymo_depthwise_blocked_pack(ffi.from_buffer("float[]", w), self.channels,
                                             ffi.from_buffer("float[]", self.data))
        self.data.setflags(write=False)


def _check_supported():
    if not lib.asymo_blocked_supported():
        raise RuntimeError("the blocked-layout kernels need AVX2 (the convolution kernels run "
                           f"{ffi.string(lib.asymo_isa_name(lib.asymo_conv_isa())).decode()})")


def _ptr(a):
    return ffi.cast("float *", a.ctypes.data) if a is not None else ffi.NULL


def _image_stride(a, what):
    """Floats between the images of ``a`` (N, C, H, W), float32 with each image contiguous
    (a channel slice of a larger tensor, as a concat's member, is), else ValueError."""
    n, c, h, w = a.shape
    if a.dtype != np.float32 or (n > 0 and a.strides[1:] != (h * w * 4, w * 4, 4)):
        raise ValueError(f"{what}: need float32 images each contiguous, got {a.dtype} of "
                         f"shape {a.shape} with strides {a.strides}")
    return a.strides[0] // 4 if n > 1 else c * h * w


def _call(pool, fn, job, ntasks, backup):
    # (the pool's capacity split; the backup flag only where there are clusters to back up)
    return tasks_call(pool, fn, job, ntasks, None, False, backup and pool.nclusters > 1)


def _tasks_wanted(pool):
    """Tasks a job aims for: one on a single worker, else TASKS_PER_WORKER per worker."""
    return 1 if pool.nworkers <= 1 else TASKS_PER_WORKER * pool.nworkers


def _chunks(pool, units, least=1):
    """How many parts to cut ``units`` (pixels, rows) into: `_tasks_wanted`, of at least
    ``least`` units each."""
    return max(1, min(_tasks_wanted(pool), units // least))


def bind_reorder(src, dst, to_blocked, pool, backup=False):
    """Calls that reorder ``src`` (N, C, H, W) into ``dst`` (the same number of floats, NCHW8c
    when ``to_blocked``) or back, image by image: ``[(fn, args)]`` and what they point at.
    ``backup``: on a pool of several clusters a late task may be run again elsewhere and the
    call return without it (every task writes its outputs once; the caller fences, as
    `asymo.ops.conv.bind_conv2d` says)."""
    _check_supported()
    if src.size != dst.size or src.ndim != 4 or src.shape[1] % BLOCK:
        raise ValueError(f"reorder: {src.shape} -> {dst.shape}: need two arrays of one "
                         f"NCHW size, channels a multiple of {BLOCK}")
    n, c = src.shape[0], src.shape[1]
    pixels = int(np.prod(src.shape[2:]))
    chunk = -(-pixels // _chunks(pool, pixels, 64))
    # (either side may be a concat's channel slice: its images lie a whole tensor apart)
    xs = _image_stride(src, "reorder source")
    ys = _image_stride(dst.reshape(src.shape) if dst.flags.c_contiguous else dst,
                       "reorder destination")
    calls, keep = [], [src, dst]
    for i in range(n):
        job = ffi.new("asymo_reorder_job *", {
            "channels": c, "pixels": pixels, "to_blocked": int(bool(to_blocked)),
            "x": _ptr(src) + i * xs, "y": _ptr(dst) + i * ys,
            "chunk_pixels": chunk})
        calls.append(_call(pool, _REORDER_TASK, job, lib.asymo_reorder_tasks(job), backup))
        keep.append(job)
    return calls, keep


def _pointwise_split(job, pool, groups, pixels):
    """Pixels first (chunks of at least 12: a tile), then groups of output blocks; but a
    layer with more bytes of weights than of activations (the 7 x 7 layers of a CNN) is cut
    by groups first, its pixels only as far as needed to share the tasks out evenly (seven
    groups on two workers: fourteen tasks, not seven; `split_blocks`, as the rows paths cut
    theirs), its tasks group-major (workers given contiguous ranges of tasks share only the
    weights of the groups where their ranges meet)."""
    weights = job.channels * job.out_channels
    if weights > (job.channels + job.out_channels) * pixels:
        job.groups_per_task, job.chunk_pixels = split_blocks(
            groups, pixels, _tasks_wanted(pool), pool.nworkers, tolerance=TASK_IDLE)
        job.groups_outer = 1
    else:
        chunks = _chunks(pool, pixels, 12)
        job.chunk_pixels = -(-pixels // chunks)
        gtasks = max(1, min(groups, -(-_tasks_wanted(pool) // chunks)))
        job.groups_per_task = -(-groups // gtasks)
        job.groups_outer = 0
    return int(lib.asymo_pointwise_blocked_tasks(job))


def planar_input_ok(kind, xshape):
    """Whether a layer of ``kind`` can read an NCHW input itself (`bind_blocked_conv`'s
    ``x_planar``): a depthwise one on rows of at most ASYMO_DW_BLOCKED_PLANAR_MAX_WIDTH."""
    return kind == "depthwise" and xshape[3] <= lib.ASYMO_DW_BLOCKED_PLANAR_MAX_WIDTH


def bind_blocked_conv(x, packed, bias, residual, y, *, stride, pads, activation, pool,
                      backup=False, x_planar=False):
    """Calls computing ``y = act(conv(x) + bias + residual)`` in the blocked layout (x, y and
    residual: arrays of the layer's NCHW shapes whose memory holds NCHW8c data; with
    ``x_planar``, x holds NCHW data, `planar_input_ok`), image by image: ``[(fn, args)]`` and
    what they point at (``backup``: as `bind_reorder`)."""
    _check_supported()
    if x_planar and not planar_input_ok(packed.kind, x.shape):
        raise ValueError(f"a {packed.kind} layer of input {x.shape} cannot read NCHW input")
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    if (c != packed.channels or y.shape[:2] != (n, packed.out_channels)
            or (packed.kind == "pointwise" and (oh, ow) != (h, w))
            or (residual is not None and residual.shape != y.shape)
            or any(a is not None and (a.dtype != np.float32 or not a.flags.c_contiguous)
                   for a in (x, y, residual, bias))
            or (bias is not None and bias.shape != (packed.out_channels,))):
        raise ValueError(f"blocked {packed.kind} layer: input {x.shape}, output {y.shape}, "
                         f"weights {packed.channels} -> {packed.out_channels}: the arrays do "
                         "not fit the layer (C-contiguous float32 of its shapes)")
    act = ACTIVATION_CODES[activation]
    calls, keep = [], [x, packed, bias, residual, y]
    for i in range(n):
        xi = _ptr(x) + i * c * h * w
        yi = _ptr(y) + i * packed.out_channels * oh * ow
        ri = _ptr(residual) + i * packed.out_channels * oh * ow if residual is not None \
            else ffi.NULL
        if packed.kind == "pointwise":
            job = ffi.new("asymo_pointwise_blocked_job *", {
                "channels": c, "out_channels": packed.out_channels, "pixels": h * w,
                "activation": act, "x": xi, "weight": _ptr(packed.data),
                "bias": _ptr(bias), "residual": ri, "y": yi})
            ntasks = _pointwise_split(job, pool,
                                      lib.asymo_pointwise_blocked_groups(packed.out_channels),
                                      h * w)
            call = _call(pool, _POINTWISE_TASK, job, ntasks, backup)
        else:
            job = ffi.new("asymo_depthwise_blocked_job *")
            g = job.geom
            g.channels, g.height, g.width = c, h, w
            g.kernel_h = g.kernel_w = 3
            g.stride_h = g.stride_w = stride[0]
            g.pad_h, g.pad_w = pads
            g.dilation_h = g.dilation_w = 1
            g.out_h, g.out_w = oh, ow
            job.activation, job.x, job.weight = act, xi, _ptr(packed.data)
            job.bias, job.residual, job.y = _ptr(bias), ri, yi
            job.x_planar = int(bool(x_planar))
            if not lib.asymo_depthwise_blocked_supported(job):
                raise ValueError(f"no blocked depthwise kernel for {x.shape} -> {y.shape}")
            blocks = c // BLOCK
            rows = _chunks(pool, oh)
            job.rows_per_task = -(-oh // rows)
            job.blocks_per_task = -(-blocks // max(1, min(blocks,
                                                          -(-_tasks_wanted(pool) // rows))))
            call = _call(pool, _DEPTHWISE_TASK, job, lib.asymo_depthwise_blocked_tasks(job),
                         backup)
        calls.append(call)
        keep.append(job)
    return calls, keep

