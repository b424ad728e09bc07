"""``asymo.conv2d``: 2-D convolution with the semantics of ``torch.nn.functional.conv2d``.

How it runs (NCHW, per image and group), the first path that takes a layer (each path's
rule is with its settings below; measurements in docs/conv-and-zoo.md):

- a depthwise convolution (one input channel per group) runs a direct C kernel: a pool task
  is a block of 16 channels (one vector lane each) and output rows, bias and activation fused;
- a 3x3 stride-2 layer of at most 3 input channels (a stem), the direct path (`DIRECT`);
- 3x3 stride-1 layers of planes at most ROWS_OVER_WINOGRAD_WIDTH wide (a network's layers:
  ROWS_OVER_WINOGRAD_WIDTH_COLD, or any width with at most ROWS_OVER_WINOGRAD_CHANNELS_COLD
  input channels), the rows path (below); wider ones, Winograd F(2x2) or F(4x4)
  (`WINOGRAD`, docs/winograd.md);
- 1x1 stride-1 unpadded layers, the pointwise path in place: runs of 16 pixels or tiles of
  pixel rows against micro-panels of the weights (`POINTWISE`);
- other float32 layers of one group, dilation 1 and stride 1 or 2, the rows path: the same
  pixel-row micro-kernels over the layer's taps, the image read in place or from a padded
  copy (`ROWS`);
- other float32 layers of one group, dilation 1, stride 1 or 2, channels in multiples of 8
  and more than one tap, where the convolution kernels run AVX2, the NCHWc path: the image
  reordered into a padded NCHW8c copy, tiles of output blocks by pixels of a row reading
  each pixel's 8 channels as one vector (`NCHWC`);
- layers of at most INDIRECT_MAX_CHANNELS input channels (stems) that the rows path does not
  take, the indirect path: the image split into stride-phase planes read in place by a GEMM
  micro-kernel (`INDIRECT`);
- any other convolution is a GEMM: a 1x1 stride-1 one on the image itself
  (``weight[Cout x Cin] @ x[Cin x H*W]``), the others ``weight[Cout/groups x K] @ col[K x N]``
  (``K = Cin/groups * kh * kw``, ``N = OH * OW``) with the column matrix never written: the
  GEMM's tasks pack their B panels straight from the image (implicit im2col,
  ``asymo_im2col_pack_b``), on the cluster that consumes them, so a convolution is one pool
  job (plus the epilogue). When the GEMM plan
  does not pack B (skinny shapes) it falls back to explicit im2col + GEMM: the C im2col
  kernel writes the column matrix as pool tasks, the columns each cluster will consume
  produced by that cluster's tasks, then ``weight @ col`` lands in the output, which is
  already NCHW. The column matrix is produced and consumed in chunks
  of output rows (about COL_CHUNK_COLUMNS columns), so it stays in cache;
- bias, ReLU / ReLU6 and a residual are fused into every path's kernels, or applied by the
  GEMM to each block of the output right after its last K panel.

Everything that depends only on the shapes and the pool (GEMM plans, task splits, job
geometry) is computed once and cached per pool. On top of that each thread keeps the native
calls of the last `CALL_CACHE_SIZE` call signatures it ran on plain NumPy arrays (shapes,
strides, dtypes, the arguments, the pool: `_call_signature`): a call with a known signature
skips the argument checks and planning, checks only what its signature does not fix (the
output's flags, overlaps, the pool's limit, the plan still cached) and points the calls'
structs at its arrays. Nothing is cached by the arrays' identity or contents: weights changed
in place between calls are read (and packed) again.
"""
from __future__ import annotations

import math
import numbers
import threading
import weakref

import numpy as np

from asymo.ops import winograd as _winograd
from asymo.ops.tensors import as_array, out_array, tensor_result, torch_of
from asymo.ops.winograd import PackedConvWeight, prepack_conv
from asymo.plan import gemm as _gemm_plans
from asymo.plan import split_cost as _split_cost
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.memory import empty_aligned, empty_result
from asymo.runtime.partition import even_block_size as _even_block_size, \
    split_blocks as _split_blocks
from asymo.runtime.pool import Pool as _Pool
from asymo.runtime.pool import acquire as _acquire_pool
from asymo.runtime.pool import hold as _hold
from asymo.runtime.tasks import (ACTIVATION_CODES, DTYPE_CODES, INLINE_BYTES, TASK_IDLE,
                                 TASKS_PER_WORKER, BoundJobs, run_calls, task_fn, workspace)
from asymo.runtime.tasks import task_counts as _task_counts
from asymo.runtime.tasks import tasks_call as _tasks_call

__all__ = ["conv2d", "conv_output_shape", "conv_path", "kernel_isa", "use_kernel_isa",
           "PackedConvWeight", "prepack_conv"]

# The column matrix is built and multiplied in chunks of whole output rows, about
# COL_CHUNK_COLUMNS columns each (enough for the GEMM to amortise packing the weights, few
# enough to stay in the last-level cache), and never more than COL_CHUNK_BYTES.
COL_CHUNK_COLUMNS = 8192
COL_CHUNK_BYTES = 32 << 20
# How a convolution that needs im2col feeds its GEMM: "implicit" packs the GEMM's B panels
# straight from the image (csrc/conv.c asymo_im2col_pack_b: no column matrix, no separate
# im2col pass, one pool job per convolution); "explicit" writes the column matrix with im2col
# tasks, chunk by chunk, then multiplies it; "auto" decides per layer (`_explicit_im2col`).
# Implicit needs a GEMM plan that packs B (the "mm" kind split along M or N) and the C
# backend; otherwise the explicit path runs.
IM2COL_METHOD = "auto"
# Implicit im2col: the GEMM packs all of B's panels of one job; cut the job into chunks of
# output rows only when that packed copy would exceed this.
IMPLICIT_CHUNK_BYTES = 128 << 20
# Small jobs run on the fastest cluster alone when the pool has several and the slower
# clusters' share saves less than their sync and tail cost: asymo.plan.split_cost decides, for
# matmul and convolutions alike ("depthwise": FLOPs, "epilogue": bytes of output).
# (tasks per worker and their evenness: asymo.runtime.tasks.TASKS_PER_WORKER, TASK_IDLE)
# Depthwise kernel: 0 = the best for the layer (the direct 3x3 row kernel where it applies,
# else the channel-interleaved vector kernel), 1 = plain per-plane loop (the kernel's own
# fallback when scratch memory is short), 2 = the channel-interleaved kernel for every layer
# (1 and 2 selectable here to test them).
DEPTHWISE_METHOD = 0
# 3x3 stride-1 layers (float32, one group): "auto" picks Winograd F(4x4, 3x3) or F(2x2, 3x3)
# by the rule in _winograd_tile, 2 or 4 forces that tile wherever Winograd applies, "off"
# runs them as GEMMs. Outputs smaller than WINOGRAD_F4_MIN_SIZE on a side use F(2x2) (a 4x4
# tile wastes more of a small plane), fewer channels than WINOGRAD_MIN_CHANNELS the GEMM;
# see _winograd_tile for the rule on large weights (measured: docs/winograd.md).
WINOGRAD = "auto"
WINOGRAD_F4_MIN_SIZE = 8
WINOGRAD_MIN_CHANNELS = 8
WINOGRAD_F4_MAX_WEIGHT_BYTES = 4 << 20
# Winograd task: 0 = transforms + GEMMs, 1 = the task's direct fallback loop (for tests).
WINOGRAD_METHOD = 0
# Layers with at most INDIRECT_MAX_CHANNELS input channels (a CNN's stem: 3), float32, one
# group, stride 1 or 2, dilation 1, no residual: "auto" runs them as indirect convolutions
# (stride-phase planes of the image read in place by the micro-kernel, asymo/conv.h) where
# the CPU has the kernel, the convolution GEMMs run AVX2 and the rows path (`ROWS`) does not
# take the layer (its pixel-row kernels ran ResNet's and GoogLeNet's 7x7 stems faster);
# "off": as GEMMs. Measured: docs/conv-and-zoo.md.
INDIRECT = "auto"
INDIRECT_MAX_CHANNELS = 4
# 3x3 stride-2 layers of at most 3 input channels (MobileNet's, SqueezeNet's stems), float32,
# one group, dilation 1, no residual: "auto" runs them as direct convolutions where the
# convolution kernels run AVX-512 (16 output pixels a vector, their 27 tap vectors read from
# the image rows once for every output channel, asymo/conv.h); "off": by the paths below.
# Measured: docs/conv-and-zoo.md.
DIRECT = "auto"
# ... and at least this many taps (channels x kernel): a 3x3 stem's 27 are too few to repay
# the extra job and the micro-kernel's per-tile cost (measured even with the packing GEMM).
# With the 16-row AVX-512 kernel a 3x3 stem alone ran 1.3-1.45x faster than its GEMM, but
# inside MobileNet V2 and SqueezeNet it ran no faster (SqueezeNet's slower, and the layers
# after it too): docs/conv-and-zoo.md.
INDIRECT_MIN_TAPS = 64
# Where the convolution kernels run AVX-512: the 16-row indirect micro-kernel (bias and
# activation fused, no padded rows for 32 / 64 output channels); False: the 6-row AVX2 one.
INDIRECT_WIDE = True
# ... in tasks of whole output rows, at most about this many FLOPs each (docs/tuning.md; the
# pointwise path's runs of pixels too)
INDIRECT_TASK_FLOPS = 8e6
# Pointwise layers (1x1, stride 1, no padding, one group, float32) run in place where the
# convolution kernels run AVX-512 (asymo/conv.h; "off": as GEMMs), in one of two forms:
# - planes of at most POINTWISE_ROWS_MAX_PIXELS pixels, with at least
#   POINTWISE_ROWS_MIN_CHANNELS input channels, in the rows form: tiles of up to 12
#   pixels (each input value broadcast) by 32, 48 or 64 output channels (vector lanes; the
#   width among POINTWISE_ROWS_PANELS that pads the fewest channels), transposed into the
#   output. No pixel lane is padded (a 7 x 7 plane is 49 rows, not 64 lanes) and no B panel
#   is packed.
# - larger planes with a multiple of 16 output channels, at most POINTWISE_MAX_OUT_CHANNELS of
#   them, at most POINTWISE_MAX_WEIGHT_BYTES of weights and at most POINTWISE_MAX_RUN_WASTE of
#   their pixels' 16-wide runs past the image, in the runs form (the 16-row indirect
#   micro-kernel reads runs of 16 pixels where they are). What it saves is mostly the GEMM's
#   packing of B, whose share falls as the rows of A that reuse a packed panel grow; every
#   run reads all the weights, so with more the GEMM's blocking pays again.
# - planes of any size with at least POINTWISE_ROWS_ANY_PLANE_CHANNELS input channels also
#   in the rows form, where its last panel pads at most an eighth of the output channels: with
#   that many multiply-adds per output value the transposed store is a small share, and the
#   runs form's 16 x 16 tile or the GEMM's packing cost more (docs/tuning.md).
# Both fuse bias, shortcut and activation. Measured: docs/conv-and-zoo.md.
POINTWISE = "auto"
POINTWISE_ROWS_MAX_PIXELS = 256
POINTWISE_ROWS_MIN_CHANNELS = 64
POINTWISE_ROWS_PANELS = (64, 48, 32)
# Where the convolution kernels run AVX2 (no runs form there), pointwise layers and the other
# layers of the rows path (below) take the rows form, in panels of POINTWISE_ROWS_PANELS_AVX2
# output channels, when they have at most ROWS_AVX2_MAX_OUT_CHANNELS output channels, at most
# ROWS_AVX2_MAX_WEIGHT_BYTES of weights, and at most ROWS_AVX2_MAX_EXPANSION output channels
# per input value of a pixel (channels x taps); the others run as GEMMs. Wider layers and
# expansions of few channels ran faster as GEMMs: docs/conv-and-zoo.md.
POINTWISE_ROWS_PANELS_AVX2 = (24, 16, 8)
ROWS_AVX2_MAX_OUT_CHANNELS = 192
ROWS_AVX2_MAX_WEIGHT_BYTES = 256 << 10
ROWS_AVX2_MAX_EXPANSION = 4
POINTWISE_ROWS_ANY_PLANE_CHANNELS = 192
POINTWISE_MAX_OUT_CHANNELS = 256
POINTWISE_MAX_WEIGHT_BYTES = 128 << 10
POINTWISE_MAX_RUN_WASTE = 0.125
# Other float32 convolutions of one group, dilation 1 and stride 1 or 2 run in the pointwise
# path's rows form over their taps where the convolution kernels run AVX-512 (asymo/conv.h:
# the image read in place, or a zero-padded copy of it when the windows reach past it; "off":
# as GEMMs): ResNet's stride-2 3x3 and 1x1 layers, GoogLeNet's 5x5 layers, whose GEMM packs B
# from the image for every call. Layers the paths above take (Winograd, indirect, pointwise)
# stay there, but for ROWS_OVER_WINOGRAD_WIDTH. Measured: docs/conv-and-zoo.md.
ROWS = "auto"
# ... in panels of output channels whose kernel's tiles are at least this many pixels where
# another panel width allows (a 7-pixel row is two tiles of 3 and 4 pixels with 64-channel
# panels, whose weights are then read once per 3.5 pixels; one of 7 with 32-channel ones)
ROWS_MIN_TILE = 5
# ... and layers Winograd would take whose output rows are at most this many pixels wide (at
# 7 x 7 Winograd's 2 x 2 tiles pad the plane to 8 x 8 and its transforms outweigh its saving)
ROWS_OVER_WINOGRAD_WIDTH = 7
# ... or at most this many where the weights are cold at every call, as in a network
# (`bind_conv2d(cold_weights=True)`, what a model binds): Winograd's transformed weights,
# 1.8-4x the weights, are read again from memory each time and its small plane reuses them
# over few tiles, while the rows path reads the weights themselves (SqueezeNet's 13 x 13
# layers; alone and warm Winograd ran them in half the time). Measured: docs/tuning.md.
ROWS_OVER_WINOGRAD_WIDTH_COLD = 13
# ... or of any width where the weights are cold and a group has at most this many input
# channels: with few channels Winograd's time goes to its transforms, whose scratch passes
# through L2, and lost most where the host halves a core's cache bandwidth (SqueezeNet's
# 16- and 32-channel 3x3 layers). Measured: docs/tuning.md.
ROWS_OVER_WINOGRAD_CHANNELS_COLD = 32
# ... where the convolution kernels run AVX2: their rows form's narrower panels
# (POINTWISE_ROWS_PANELS_AVX2) read each input value for fewer output channels, and Winograd
# ran those layers faster in networks (SqueezeNet on a Zen 3: docs/tuning.md)
ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2 = 0
# ... the padded copy in tasks of about this many bytes (not tuned: a copy is a few percent
# of its layer)
ROWS_COPY_TASK_BYTES = 32 << 10
# ... or, where the layer's tasks are bands of output rows, by the same bands (each worker then
# reads mostly the rows it copied; docs/tuning.md)
ROWS_COPY_BANDS = True
# Where the convolution kernels run AVX2, float32 layers of one group, dilation 1, stride 1
# or 2, input and output channels multiples of 8 and more than one tap, that the paths above
# leave to the GEMM (ResNet's stride-2 3x3 layers, whose GEMM packs B from the image once per
# tap), run through the blocked layout (asymo/conv.h, asymo_dense_blocked_job): the image
# reordered into a zero-padded NCHW8c copy, then tiles of up to 24 output channels by 4 pixels
# of a row, each pixel's 8 input channels one vector, stored to the NCHW output with bias,
# shortcut and activation ("off": as GEMMs) ...
NCHWC = "auto"
# ... unless their weights outweigh their image more than this many times (the stride-2 3x3
# layers into 7 x 7 planes, which ran slower than their GEMMs). Measured: docs/conv-and-zoo.md.
NCHWC_MAX_WEIGHT_RATIO = 8


def kernel_isa():
    """Name of the ISA variant the convolution and pooling kernels run ("avx512", ...)."""
    return ffi.string(lib.asymo_isa_name(lib.asymo_conv_isa())).decode()


class use_kernel_isa:
    """Context manager: run the convolution and pooling kernels with one ISA variant
    ("portable", "avx2_fma", "avx512"; the CPU must support it), for tests and benchmarks.
    Not thread-safe: it changes a process-wide setting."""

    def __init__(self, name):
        codes = {ffi.string(lib.asymo_isa_name(i)).decode(): i for i in range(4)}
        if name not in codes:
            raise ValueError(f"unknown ISA {name!r}; known: {sorted(codes)}")
        self.code = codes[name]
        self.name = name

    def __enter__(self):
        if lib.asymo_conv_set_isa(self.code) != 0:
            raise ValueError(f"this CPU or build cannot run the {self.name!r} kernels")
        return self

    def __exit__(self, *exc):
        lib.asymo_conv_set_isa(-1)


def _as_float_array(a, name):
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    if not a.dtype.isnative and a.dtype.newbyteorder("=") in DTYPE_CODES:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype not in DTYPE_CODES:
        raise TypeError(f"conv2d: {name} must be float32 or float64, got dtype {a.dtype}")
    return a


def _pair(v, name, minimum, what="conv2d"):
    """``(int, int)`` from an int or a sequence of one or two ints; anything else (a string,
    bytes, floats, bools) is a TypeError, as in torch (no silent truncation of 1.9 to 1).
    ``what`` names the operation in the messages."""
    if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
        pair = (int(v), int(v))
    else:
        if (isinstance(v, (str, bytes, bytearray, memoryview)) or not hasattr(v, "__len__")
                or not hasattr(v, "__iter__")):
            raise TypeError(f"{what}: {name} must be an int or a pair of ints, got {v!r}")
        items = tuple(v)
        if not all(isinstance(e, numbers.Integral) and not isinstance(e, (bool, np.bool_))
                   for e in items):
            raise TypeError(f"{what}: {name} must be an int or a pair of ints, got {v!r}")
        pair = tuple(int(e) for e in items)
        if len(pair) == 1:
            pair = pair * 2
        if len(pair) != 2:
            raise ValueError(f"{what}: {name} must be an int or a pair of ints, got {v!r}")
    if min(pair) < minimum:
        raise ValueError(f"{what}: {name} must be >= {minimum}, got {v!r}")
    return pair


def _resolve_padding(padding, kernel, stride, dilation):
    """((top, bottom), (left, right)) for an int, a pair, "valid" or "same"."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0), (0, 0))
        if padding == "same":
            if stride != (1, 1):
                raise ValueError("conv2d: padding='same' is not supported for strided "
                                 f"convolutions (stride={stride})")
            pads = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                pads.append((total // 2, total - total // 2))
            return tuple(pads)
        raise ValueError(f"conv2d: padding must be 'valid', 'same', an int or a pair, "
                         f"got {padding!r}")
    ph, pw = _pair(padding, "padding", 0)
    return ((ph, ph), (pw, pw))


def conv_output_shape(input_hw, kernel, stride=1, padding=0, dilation=1):
    """Output ``(OH, OW)`` of a convolution (Pipe-it Eq. 3 with dilation)."""
    kernel = _pair(kernel, "kernel", 1)
    stride = _pair(stride, "stride", 1)
    dilation = _pair(dilation, "dilation", 1)
    pads = _resolve_padding(padding, kernel, stride, dilation)
    return tuple((size + p0 + p1 - d * (k - 1) - 1) // s + 1
                 for size, (p0, p1), k, s, d in zip(input_hw, pads, kernel, stride, dilation))


def _geometry(geom, channels, h, w, kernel, stride, pads, dilation, oh, ow):
    geom.channels, geom.height, geom.width = channels, h, w
    geom.kernel_h, geom.kernel_w = kernel
    geom.stride_h, geom.stride_w = stride
    geom.pad_h, geom.pad_w = pads[0][0], pads[1][0]
    geom.dilation_h, geom.dilation_w = dilation
    geom.out_h, geom.out_w = oh, ow


def _ptr(a):
    """Data pointer of an array (contiguous arrays through the buffer protocol: ~5x faster
    than ``a.ctypes``)."""
    if a.flags.c_contiguous:
        return ffi.cast("void *", ffi.from_buffer(a))
    return ffi.cast("void *", a.ctypes.data)


def _conv2d_torch(torch, x, weight, bias, stride, padding, dilation, groups, activation,
                  residual, out, pool):
    args = [as_array(torch, a, "conv2d", n) for a, n in
            ((x, "input"), (weight, "weight"), (bias, "bias"), (residual, "residual"))]
    res = conv2d(*args[:3], stride, padding, dilation, groups, activation=activation,
                 residual=args[3], out=out_array(torch, out, "conv2d"), pool=pool)
    return tensor_result(torch, res, out)


def _even_blocks(n, nblocks):
    nblocks = max(1, min(int(nblocks), int(n)))
    return [n * i // nblocks for i in range(nblocks + 1)]


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           activation=None, residual=None, out=None, pool=None):
    """2-D convolution over NCHW images (``torch.nn.functional.conv2d`` semantics).

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W) or (C, H, W)
        float32 or float64 images (unbatched ``(C, H, W)`` gives an unbatched result).
    weight : ndarray, shape (Cout, C / groups, kh, kw), or PackedConvWeight
        Filters, same dtype as ``x``. A `PackedConvWeight` (`asymo.prepack_conv`) keeps the
        transforms of weights that do not change (a model's) instead of checking a cache.
    bias : ndarray, shape (Cout,), optional
    stride, dilation : int or (int, int)
    padding : int, (int, int), "valid" or "same"
        Zero padding on both sides; "same" (stride 1 only) pads so the output has the input's
        size, the extra row / column at the bottom / right for even kernels, as torch does.
    groups : int
        Input and output channels are split into ``groups`` independent convolutions;
        ``groups == C`` with one filter per input channel is a depthwise convolution.
    activation : None, "relu" or "relu6"
        Applied to ``conv + bias (+ residual)``, fused into the same pass.
    residual : ndarray, optional
        An array of the output's shape and dtype added before the activation (a ResNet
        shortcut): ``activation(conv(x) + bias + residual)`` in one pass.
    out : ndarray, optional
        Where to write the result (shape and dtype of the result).
    pool : asymo.Pool, optional
        The pool to run on (default: ``asymo.get_pool()``).

    Returns
    -------
    ndarray, shape (N, Cout, OH, OW) or (Cout, OH, OW)
        A torch tensor when any argument is one (CPU float32 / float64 tensors are read
        without a copy; tensors that require grad are detached: asymo is inference-only,
        and the result has no autograd history). ``out`` may then be a tensor too.

    Raises
    ------
    TypeError
        Non-float dtypes, or ``x``, ``weight`` and ``bias`` of different dtypes.
    ValueError
        Wrong ranks, channel / group mismatches, kernel larger than the padded input, bad
        stride / padding / dilation, wrong ``out``.
    """
    sig = _call_signature(x, weight, bias, stride, padding, dilation, groups, activation,
                          residual, out, pool)
    if sig is not None:
        y = _cached_conv2d(sig, x, weight, bias, residual, out, pool)
        if y is not None:
            return y
    else:
        torch = torch_of(x, weight, bias, residual, out)
        if torch is not None:
            return _conv2d_torch(torch, x, weight, bias, stride, padding, dilation, groups,
                                 activation, residual, out, pool)
    c = _prepare(x, weight, bias, stride, padding, dilation, groups, activation, residual,
                 out)
    if c.empty:
        return c.y
    # held for the whole convolution (several pool jobs): closing or replacing the pool in
    # another thread waits for it, or lets it finish on the old pool
    with _hold(pool) as pool:
        settings = _plan_settings()
        limit = lib.asymo_pool_get_limit(pool._handle)
        plan, plan_key = c.plan_for(pool, settings, limit)
        calls = _NativeCalls(plan, c.xb, c.b, c.target, c.residual, pool,
                             prepacked=c.packed is not None)
        keep = calls.fill(c.xb, c.w, c.packed, c.b, c.target, c.residual)
        run_calls(calls.calls, "conv2d")
        del keep
        if sig is not None and _in_place(c, x, c.packed.array if c.packed is not None
                                         else weight, bias, residual, out):
            _cache_call(sig, calls, plan, plan_key, pool, limit, settings, c.y)
    if not c.direct:
        c.yb[...] = c.target
    return c.y


class _Checked:
    """A validated convolution call: C-contiguous operands and the arrays it writes."""

    __slots__ = ("xb", "w", "b", "packed", "residual", "y", "yb", "target", "direct",
                 "empty", "stride", "pads", "dilation", "groups", "activation")

    def plan_for(self, pool, settings=None, limit=None, cold_weights=False):
        """``(plan, its key in the plan cache)`` for this call on ``pool``."""
        return _conv_plan(pool, self.xb.shape, self.w.shape, self.xb.dtype, self.stride,
                          self.pads, self.dilation, self.groups, self.activation,
                          self.b is not None, self.residual is not None, settings, limit,
                          cold_weights)


def _prepare(x, weight, bias, stride, padding, dilation, groups, activation, residual, out,
             residual_in_place=False):
    """Check a conv2d call's arguments (the errors conv2d documents) and return a `_Checked`.
    A residual overlapping the output is copied first, unless ``residual_in_place`` and it is
    the output itself (`_same_array`: a bound call whose kernels read each shortcut value
    just before they write the output there)."""
    x = _as_float_array(x, "input")
    packed = None
    if isinstance(weight, PackedConvWeight):
        packed, weight = weight, weight.array
    weight = _as_float_array(weight, "weight")
    if x.ndim not in (3, 4):
        raise ValueError(f"conv2d: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, "
                         f"got input of shape {x.shape}")
    if weight.ndim != 4:
        raise ValueError(f"conv2d: expected a 4-D weight (Cout, C/groups, kh, kw), got weight "
                         f"of shape {weight.shape}")
    if x.dtype != weight.dtype:
        raise TypeError(f"conv2d: input ({x.dtype}) and weight ({weight.dtype}) must have the "
                        "same dtype")
    dtype = x.dtype
    if bias is not None:
        bias = _as_float_array(bias, "bias")
        if bias.dtype != dtype:
            raise TypeError(f"conv2d: bias ({bias.dtype}) must have the input's dtype ({dtype})")
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"conv2d: bias of shape {bias.shape} does not match weight of "
                             f"shape {weight.shape} (expected ({weight.shape[0]},))")
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"conv2d: activation must be None, 'relu' or 'relu6', "
                         f"got {activation!r}")
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"conv2d: groups must be a positive int, got {groups!r}")
    groups = int(groups)

    unbatched = x.ndim == 3
    xb = x[None] if unbatched else x
    n, c, h, w = xb.shape
    cout, cin_g, kh, kw = weight.shape
    if cin_g * groups != c:
        raise ValueError(f"conv2d: input of shape {x.shape} has {c} channels, but weight of "
                         f"shape {weight.shape} with groups={groups} expects "
                         f"{cin_g * groups} channels")
    if cout % groups != 0:
        raise ValueError(f"conv2d: weight of shape {weight.shape} has {cout} output channels, "
                         f"not divisible by groups={groups}")
    if min(cout, kh, kw) < 1:
        raise ValueError(f"conv2d: weight of shape {weight.shape} is empty")
    stride = _pair(stride, "stride", 1)
    dilation = _pair(dilation, "dilation", 1)
    pads = _resolve_padding(padding, (kh, kw), stride, dilation)
    eff_h, eff_w = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
    padded = (h + sum(pads[0]), w + sum(pads[1]))
    if eff_h > padded[0] or eff_w > padded[1]:
        raise ValueError(f"conv2d: kernel ({eff_h}x{eff_w} with dilation {dilation}) is "
                         f"larger than the padded input ({padded[0]}x{padded[1]}) for input "
                         f"of shape {x.shape} and weight of shape {weight.shape}")
    oh = (padded[0] - eff_h) // stride[0] + 1
    ow = (padded[1] - eff_w) // stride[1] + 1

    # no input channels: torch returns an empty result with no channels (not zeros + bias)
    shape = (n, cout if c else 0, oh, ow)
    y = _check_out(out, shape[1:] if unbatched else shape, dtype)
    if residual is not None:
        residual = _as_float_array(residual, "residual")
        if residual.shape != y.shape or residual.dtype != dtype:
            raise ValueError(f"conv2d: residual of shape {residual.shape} and dtype "
                             f"{residual.dtype} does not match the output ({y.shape}, {dtype})")
        if np.may_share_memory(residual, y) and not (residual_in_place
                                                     and _same_array(residual, y)):
            residual = residual.copy()
        residual = np.ascontiguousarray(residual[None] if unbatched else residual)
    yb = y[None] if unbatched else y
    r = _Checked()
    r.y, r.yb, r.empty = y, yb, n == 0 or c == 0
    if r.empty:
        return r

    # Images must be C-contiguous for the kernels; output images too (else use a temporary).
    xb = np.ascontiguousarray(xb)
    w_c = np.ascontiguousarray(weight)
    b_c = None if bias is None else np.ascontiguousarray(bias)
    direct = (yb.flags.c_contiguous
              or (all(yb[i].flags.c_contiguous for i in range(n))
                  and yb.strides[0] % yb.itemsize == 0))
    # an output that overlaps an operand (out=x) would be read after it is written: compute
    # through a temporary then, as matmul does (may_share_memory: bounds only, no false
    # negative)
    if direct and (np.may_share_memory(yb, xb) or np.may_share_memory(yb, w_c)
                   or (b_c is not None and np.may_share_memory(yb, b_c))):
        direct = False
    target = yb if direct else empty_result(shape, dtype)

    r.xb, r.w, r.b, r.packed, r.residual = xb, w_c, b_c, packed, residual
    r.target, r.direct = target, direct
    r.stride, r.pads, r.dilation, r.groups = stride, pads, dilation, groups
    r.activation = activation
    return r


def _check_out(out, shape, dtype):
    if out is None:
        return empty_result(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"conv2d: out must be a numpy array, got {type(out).__name__}")
    if out.shape != tuple(shape):
        raise ValueError(f"conv2d: out has shape {out.shape}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"conv2d: out has dtype {out.dtype}, expected {dtype}")
    if not out.flags.writeable:
        raise ValueError("conv2d: out is read-only")
    return out


# ---- plans: everything decided once per (shape, pool) ------------------------------------

_PLAN_CACHE_MAX = 512
_plan_cache = weakref.WeakKeyDictionary()  # pool -> {key: plan}
_plan_lock = threading.Lock()


def _forget_plans():
    """Drop every cached convolution plan. They hold GEMM plans, so they go whenever
    `asymo.plan.gemm` clears its cache (a new block chooser, a calibration loaded): the next
    call plans again with the new rule."""
    with _plan_lock:
        _plan_cache.clear()


_gemm_plans.on_plans_cleared(_forget_plans)


def _conv_path(xshape, wshape, dtype, stride, pads, dilation, groups, activation,
               has_residual, cold_weights=False):
    """The path a convolution of these shapes takes (the module docstring's order), as
    ``(name, what its plan is built from)``: "depthwise" (None), "direct" (its job),
    "winograd" (the tile), "indirect", "pointwise", "rows", "nchwc" (their jobs) or "gemm"
    (None). ``cold_weights``: see `bind_conv2d`."""
    c = xshape[1]
    cin_g = wshape[1]
    tile = _winograd_tile(xshape, wshape, dtype, stride, pads, dilation, groups)
    rows = _rows_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation)
    narrow = ROWS_OVER_WINOGRAD_WIDTH_COLD if cold_weights else ROWS_OVER_WINOGRAD_WIDTH
    few = (ROWS_OVER_WINOGRAD_CHANNELS_COLD if kernel_isa() == "avx512"
           else ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2)
    if tile and rows is not None and (rows.geom.out_w <= narrow or (
            cold_weights and cin_g <= few)):
        tile = 0  # (ROWS_OVER_WINOGRAD_WIDTH[_COLD], ROWS_OVER_WINOGRAD_CHANNELS_COLD[_AVX2])
    if cin_g == 1 and groups == c:
        return "depthwise", None
    if (job := _direct_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation,
                           has_residual)) is not None:
        return "direct", job
    if tile:
        return "winograd", tile
    if (job := _pointwise_job(xshape, wshape, dtype, stride, pads, dilation, groups,
                              activation, has_residual)) is not None:
        return "pointwise", job
    if rows is not None:
        return "rows", rows
    if (job := _nchwc_job(xshape, wshape, dtype, stride, pads, dilation, groups,
                            activation)) is not None:
        return "nchwc", job
    if (job := _indirect_job(xshape, wshape, dtype, stride, pads, dilation, groups,
                             activation, has_residual)) is not None:
        return "indirect", job
    return "gemm", None


def conv_path(xshape, wshape, stride=1, padding=0, dilation=1, groups=1, *,
              activation=None, residual=False, dtype=np.float32, cold_weights=False):
    """The kernel path ``conv2d`` takes for a float input of shape ``xshape`` and weights of
    shape ``wshape`` with these arguments on this machine (its ISA and the module's
    settings), as a label: "depthwise", "direct", "winograd F(2x2)" / "F(4x4)", "indirect",
    "pointwise" (+ its form, "rows" or "runs"), "rows", "nchwc" or "gemm". The module
    docstring says which layers each takes. ``cold_weights=True``: the path of a call bound
    with `bind_conv2d(cold_weights=True)`, as a model's layers are.
    """
    xshape, wshape = tuple(int(v) for v in xshape), tuple(int(v) for v in wshape)
    if len(xshape) != 4 or len(wshape) != 4:
        raise ValueError(f"conv_path: NCHW input and OIHW weight shapes, got {xshape} and "
                         f"{wshape}")
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"conv_path: activation must be one of {list(ACTIVATION_CODES)}, got "
                         f"{activation!r}")
    stride, dilation = _pair(stride, "stride", 1), _pair(dilation, "dilation", 1)
    pads = _resolve_padding(padding, wshape[2:], stride, dilation)
    path, arg = _conv_path(xshape, wshape, np.dtype(dtype), stride, pads, dilation,
                           int(groups), activation, bool(residual), bool(cold_weights))
    if path == "winograd":
        return f"winograd F({arg}x{arg})"
    if path == "pointwise":
        form = "rows" if arg.form == lib.ASYMO_POINTWISE_ROWS else "runs"
        return f"pointwise {form}"
    return path


def _conv_plan(pool, xshape, wshape, dtype, stride, pads, dilation, groups, activation,
               has_bias, has_residual, settings=None, limit=None, cold_weights=False):
    # (settings, limit: `_plan_settings()` and the pool's limit when the caller has them;
    # cold_weights: see bind_conv2d) Returns (plan, its key in the plan cache).
    key = (xshape, wshape, dtype.num, stride, pads, dilation, groups, activation, has_bias,
           has_residual, _plan_settings() if settings is None else settings,
           pool.limit if limit is None else limit, cold_weights)
    plan = _cached_plan(pool, key)
    if plan is not None:
        return plan, key
    path, arg = _conv_path(xshape, wshape, dtype, stride, pads, dilation, groups, activation,
                           has_residual, cold_weights)
    if path == "depthwise":
        plan = _DepthwisePlan(pool, xshape, wshape, dtype, stride, pads, dilation, activation,
                              has_residual)
    elif path == "direct":
        plan = _DirectPlan(pool, arg)
    elif path == "winograd":
        plan = _WinogradConvPlan(pool, xshape, wshape, pads, arg, activation)
    elif path == "indirect":
        plan = _IndirectConvPlan(pool, arg)
    elif path == "pointwise":
        plan = _PointwisePlan(pool, arg)
    elif path == "rows":
        plan = _RowsConvPlan(pool, arg)
    elif path == "nchwc":
        plan = _NchwcConvPlan(pool, arg)
    else:
        plan = _GemmConvPlan(pool, xshape, wshape, dtype, stride, pads, dilation, groups,
                             activation, has_bias, has_residual)
    with _plan_lock:
        try:
            per_pool = _plan_cache.setdefault(pool, {})
        except TypeError:
            return plan, key
        if len(per_pool) >= _PLAN_CACHE_MAX:
            per_pool.clear()
        per_pool[key] = plan
    return plan, key


def _cached_plan(pool, key):
    """The plan cached for ``key`` on ``pool``, or None."""
    try:
        per_pool = _plan_cache.get(pool)
    except TypeError:  # a pool object that cannot be weakly referenced: no caching
        return None
    return None if per_pool is None else per_pool.get(key)


def _bias_act_plan(pool, channels, plane, dtype, activation):
    """(job template, ntasks, (inline, per-cluster counts or None)) for y = act(y + bias +
    residual) over one image."""
    job = ffi.new("asymo_bias_act_job *")
    job.dtype = DTYPE_CODES[dtype]
    job.activation = ACTIVATION_CODES[activation]
    job.batch = 1
    job.channels = channels
    job.plane_size = plane
    job.image_stride = channels * plane
    job.residual_image_stride = 0
    # at least ~16 KB per task: below that the pool's overhead dominates the pass
    min_channels = max(1, (16384 // dtype.itemsize) // max(plane, 1))
    per = max(min_channels, _even_block_size(channels, TASKS_PER_WORKER * pool.nworkers,
                                             pool.nworkers, tolerance=TASK_IDLE))
    job.channels_per_task = per
    job.channel_blocks = -(-channels // per)
    nbytes = channels * plane * dtype.itemsize
    inline = nbytes < INLINE_BYTES
    fastest = _split_cost.pool_fastest_only(pool, nbytes, "epilogue")
    counts = _task_counts(pool, int(job.channel_blocks), fastest_only=fastest)
    return job, int(job.channel_blocks), (inline, counts)


def _winograd_tile(xshape, wshape, dtype, stride, pads, dilation, groups):
    """The Winograd tile size m for this layer (2 or 4), or 0 for another path.

    Winograd F(m x m, 3 x 3) runs float32 3x3 layers with stride 1, dilation 1 and one group
    (pads of at most 2, so every output tile reads the padded plane), when WINOGRAD allows."""
    if (WINOGRAD == "off" or dtype != np.float32 or tuple(wshape[2:]) != (3, 3)
            or stride != (1, 1) or dilation != (1, 1) or groups != 1
            or max(max(p) for p in pads) > 2):
        return 0
    if WINOGRAD in (2, 4):
        return WINOGRAD
    _, c, h, w = xshape
    k = wshape[0]
    oh, ow = h + sum(pads[0]) - 2, w + sum(pads[1]) - 2
    if c < WINOGRAD_MIN_CHANNELS or k < WINOGRAD_MIN_CHANNELS:
        return 0
    if min(oh, ow) < WINOGRAD_F4_MIN_SIZE:
        return 2
    # F(4x4) streams 36 C x K weight panels per block of 16 tiles: when they outgrow the
    # caches and the plane has few 4x4 tiles, F(2x2)'s 16 panels over more tiles win.
    tiles4 = -(-oh // 4) * -(-ow // 4)
    if 36 * c * k * 4 > WINOGRAD_F4_MAX_WEIGHT_BYTES and tiles4 <= 16:
        return 2
    return 4


class _WinogradConvPlan:
    """Winograd F(m x m, 3 x 3) (asymo.ops.winograd): one pool job per call, the transforms,
    GEMMs, bias, residual and activation inside each task."""

    # whether each task writes its outputs once, with their final values (the pool may then
    # run a late task again: ASYMO_RUN_BACKUP, bind_conv2d(backup=True))
    writes_once = True

    def __init__(self, pool, xshape, wshape, pads, tile, activation):
        self.tile = tile
        self.plan = _winograd.WinogradPlan(pool, xshape, wshape, pads, tile, activation,
                                           method=WINOGRAD_METHOD)


def _units_per_task(pool, units, flops):
    """Units of work (output rows, runs of pixels) per task of an indirect or pointwise job:
    TASKS_PER_WORKER tasks per worker at least, each of at most about INDIRECT_TASK_FLOPS. A
    job ends with its last task, and a small last task is one that a slower (or stopped) core
    finishes soon or a faster one steals before it starts."""
    per = max(1, min(units // (TASKS_PER_WORKER * pool.nworkers),
                     int(INDIRECT_TASK_FLOPS * units // flops)))
    return _even_block_size(units, -(-units // per), pool.nworkers, tolerance=TASK_IDLE)


def _direct_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation,
                has_residual):
    """The job template of a direct stride-2 convolution for this layer (`DIRECT`), or
    None."""
    if (DIRECT == "off" or dtype != np.float32 or groups != 1 or has_residual
            or xshape[1] > lib.ASYMO_DIRECT_MAX_CHANNELS or tuple(wshape[2:]) != (3, 3)
            or stride != (2, 2) or dilation != (1, 1) or kernel_isa() != "avx512"):
        return None
    job = _layer_job("asymo_conv_direct_job *", xshape, wshape, stride, pads, dilation,
                     activation)
    return job if lib.asymo_conv_direct_supported(job) else None


def _layer_job(ctype, xshape, wshape, stride, pads, dilation, activation):
    """A new job struct of C type ``ctype`` holding the layer's geometry, activation and
    output channels."""
    n, c, h, w = xshape
    cout, _cin_g, kh, kw = wshape
    oh, ow = _out_hw(h, w, kh, kw, stride, pads, dilation)
    job = ffi.new(ctype)
    _geometry(job.geom, c, h, w, (kh, kw), stride, pads, dilation, oh, ow)
    job.activation = ACTIVATION_CODES[activation]
    job.out_channels = cout
    return job


class _DirectPlan:
    """Direct stride-2 convolution of few input channels (asymo/conv.h): per image, one job
    whose tasks are blocks of output rows, every output channel, bias and activation fused.
    Nothing is prepared: the kernel reads the image and the weights as they are."""

    writes_once = True  # (see _WinogradConvPlan)

    def __init__(self, pool, job):
        self.job = job
        self.ntasks, self.counts, _fastest = _row_tasks(pool, job)


def _row_tasks(pool, job):
    """Split a job whose tasks are blocks of whole output rows (every output channel): sets
    ``job.rows_per_task``; returns the task count, the per-cluster counts and whether the job
    stays on the fastest cluster."""
    g = job.geom
    oh = int(g.out_h)
    flops = 2.0 * job.out_channels * oh * g.out_w * g.channels * g.kernel_h * g.kernel_w
    job.rows_per_task = rows = _units_per_task(pool, oh, flops)
    ntasks = -(-oh // rows)
    fastest = _split_cost.pool_fastest_only(pool, flops, "mm")
    return ntasks, _task_counts(pool, ntasks, fastest_only=fastest), fastest


def _indirect_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation,
                  has_residual):
    """The job template of an indirect convolution for this layer (`INDIRECT`), or None."""
    c, (kh, kw) = xshape[1], wshape[2:]
    if (INDIRECT == "off" or dtype != np.float32 or groups != 1 or has_residual
            or c > INDIRECT_MAX_CHANNELS or c * kh * kw < INDIRECT_MIN_TAPS
            or stride not in ((1, 1), (2, 2)) or dilation != (1, 1)):
        return None
    wide = bool(INDIRECT_WIDE) and kernel_isa() == "avx512"
    from asymo.plan.gemm import best_isa

    if best_isa() != "avx2_fma":  # (the kernel is AVX2's tile; AVX-512 GEMMs are wider)
        return None
    job = _layer_job("asymo_conv_indirect_job *", xshape, wshape, stride, pads, dilation,
                     activation)
    job.wide = wide
    return job if lib.asymo_conv_indirect_supported(job) else None


def _tap_offsets(job, taps, fill):
    """The job's per-tap input offsets (``taps`` entries, computed by the C ``fill``), made
    once per plan; the job template, and the per-call copies of it, point at them. Keep the
    array while they do."""
    offsets = ffi.new("int64_t[]", int(taps))
    fill(job, offsets)
    job.offsets = offsets
    return offsets


class _IndirectConvPlan:
    """Indirect convolution (asymo/conv.h): per image, a job that splits the padded image into
    stride-phase planes and packs the weights (into scratch), then one whose tasks are blocks
    of output rows, bias and activation fused."""

    def __init__(self, pool, job):
        g = job.geom
        self.job = job
        # (see _WinogradConvPlan) the narrow form's tasks write the output, then add the bias
        # and activation over it
        self.writes_once = bool(job.wide)
        # the taps' B rows in the phase planes
        self.offsets = _tap_offsets(job, g.channels * g.kernel_h * g.kernel_w,
                                    lib.asymo_conv_indirect_offsets)
        self.scratch_elems = int(lib.asymo_conv_indirect_scratch(job))
        self.nprep = int(lib.asymo_conv_indirect_prepare_tasks(job))
        self.ntasks, self.counts, fastest = _row_tasks(pool, job)
        self.prep_counts = _task_counts(pool, self.nprep, fastest_only=fastest)


def _rows_panels(isa):
    """The rows form's panel widths for the convolution kernels' ISA."""
    return POINTWISE_ROWS_PANELS if isa == "avx512" else POINTWISE_ROWS_PANELS_AVX2


def _rows_on_avx2(cout, k):
    """Whether a layer of ``cout`` output channels and ``k`` input values per output pixel
    (channels x taps) takes the rows form where the kernels run AVX2 (ROWS_AVX2_*)."""
    return (cout <= ROWS_AVX2_MAX_OUT_CHANNELS and 4 * cout * k < ROWS_AVX2_MAX_WEIGHT_BYTES
            and cout <= ROWS_AVX2_MAX_EXPANSION * k)


def rows_form_small_plane(xshape):
    """Whether the AVX-512 rows form takes a 1x1 layer with an NCHW input of ``xshape`` for
    its small plane (`POINTWISE_ROWS_MAX_PIXELS`, `POINTWISE_ROWS_MIN_CHANNELS`)."""
    return (xshape[2] * xshape[3] <= POINTWISE_ROWS_MAX_PIXELS
            and xshape[1] >= POINTWISE_ROWS_MIN_CHANNELS)


def _pointwise_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation,
                   has_residual):
    """The job template of an in-place pointwise convolution for this layer (`POINTWISE`), or
    None."""
    n, c, h, w = xshape
    cout, cin_g, kh, kw = wshape
    isa = kernel_isa()
    if (POINTWISE == "off" or dtype != np.float32 or groups != 1
            or (kh, kw) != (1, 1) or stride != (1, 1) or pads != ((0, 0), (0, 0))
            or dilation != (1, 1) or isa not in ("avx512", "avx2_fma")):
        return None
    job = ffi.new("asymo_conv_pointwise_job *")
    job.channels, job.out_channels, job.pixels = c, cout, h * w
    job.activation = ACTIVATION_CODES[activation]
    # the rows form's panel width: the fewest padded channels in the last panel; the widest
    # panel among equals
    panel = min(_rows_panels(isa), key=lambda cb: (-cout % cb, -cb))
    if isa != "avx512":
        if not _rows_on_avx2(cout, c):
            return None
        job.form = lib.ASYMO_POINTWISE_ROWS
        job.panel_rows = panel
    elif (rows_form_small_plane(xshape)
            or (c >= POINTWISE_ROWS_ANY_PLANE_CHANNELS and 8 * (-cout % panel) <= cout)):
        job.form = lib.ASYMO_POINTWISE_ROWS
        job.panel_rows = panel
    elif (cout % 16 or cout > POINTWISE_MAX_OUT_CHANNELS
            or cout * c * 4 > POINTWISE_MAX_WEIGHT_BYTES
            or -(-h * w // 16) * 16 > (1 + POINTWISE_MAX_RUN_WASTE) * h * w):
        return None
    else:
        job.form = lib.ASYMO_POINTWISE_RUNS
        job.panel_rows = 16
    return job if lib.asymo_conv_pointwise_supported(job) else None


class _PointwisePlan:
    """In-place pointwise convolution (asymo/conv.h): per image, unless a PackedConvWeight
    brings the weights' micro-panels, a one-task job that packs them into scratch; then one
    whose tasks are runs of pixels with every output channel (runs form) or panels of output
    channels by tiles of pixels (rows form)."""

    writes_once = True  # (see _WinogradConvPlan)

    def __init__(self, pool, job):
        self.job = job
        self.offsets = None
        self.scratch_elems = int(lib.asymo_conv_pointwise_scratch(job))
        flops = 2.0 * job.out_channels * job.channels * job.pixels
        if job.form == lib.ASYMO_POINTWISE_ROWS:
            job.panels_per_task, job.tiles_per_task = _panel_tile_split(
                pool, -(-int(job.out_channels) // int(job.panel_rows)),
                int(lib.asymo_conv_pointwise_tiles(job)), flops,
                job.out_channels >= job.pixels)
        else:
            self.offsets = _tap_offsets(job, job.channels, lib.asymo_conv_pointwise_offsets)
            job.runs_per_task = _units_per_task(pool, -(-int(job.pixels) // 16), flops)
        self.ntasks = int(lib.asymo_conv_pointwise_tasks(job))
        fastest = _split_cost.pool_fastest_only(pool, flops, "mm")
        self.counts = _task_counts(pool, self.ntasks, fastest_only=fastest)
        self.prep_counts = _task_counts(pool, 1, fastest_only=True)
        self.nprep = 1


def _panel_tile_split(pool, panels, tiles, flops, by_panels):
    """(panels per task, tiles per task) of a rows-form job: the larger operand split, so each
    core reads only its share of it -- the weights (``by_panels``: a 7 x 7 layer's weights
    outweigh its image) or the image (tiles) -- the other only as far as needed for the tasks
    wanted, and the task count evened out over the workers."""
    want = max(TASKS_PER_WORKER * pool.nworkers, int(flops // INDIRECT_TASK_FLOPS))
    split, other = (panels, tiles) if by_panels else (tiles, panels)
    per, per_other = _split_blocks(split, other, want, pool.nworkers, tolerance=TASK_IDLE)
    return (per, per_other) if by_panels else (per_other, per)


def _prepare_split(pool, ntasks, fastest):
    """A prepare job's (tasks, per-cluster counts) by whether the weights come prepacked: the
    job template's apack is NULL, so its ``ntasks`` include the one packing them."""
    n = int(ntasks)
    return {False: (n, _task_counts(pool, n, fastest_only=fastest)),
            True: (n - 1, _task_counts(pool, n - 1, fastest_only=fastest))}


def _rows_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation):
    """The job template of a rows-form convolution for this layer (`ROWS`), or None."""
    isa = kernel_isa()
    if (ROWS == "off" or dtype != np.float32 or groups != 1 or dilation != (1, 1)
            or stride not in ((1, 1), (2, 2)) or isa not in ("avx512", "avx2_fma")):
        return None
    panels = _rows_panels(isa)
    if isa != "avx512" and not _rows_on_avx2(int(wshape[0]), math.prod(wshape[1:])):
        return None
    job = _layer_job("asymo_conv_rows_job *", xshape, wshape, stride, pads, dilation,
                     activation)
    cout, oh, ow = int(wshape[0]), int(job.geom.out_h), int(job.geom.out_w)
    small = {}  # panel width -> whether a row's tiles (even to a pixel) are under ROWS_MIN_TILE
    for cb in panels:
        job.panel_rows = cb  # (the kernel family, and so a tile's most pixels, follows it)
        small[cb] = ow // max(1, int(lib.asymo_conv_rows_tiles(job)) // oh) < ROWS_MIN_TILE
    # the fewest padded channels in the last panel; then whole tiles; the widest among equals
    job.panel_rows = min(panels, key=lambda cb: (-cout % cb, small[cb], -cb))
    return job if lib.asymo_conv_rows_supported(job) else None


class _RowsConvPlan:
    """A convolution in the rows form over its taps (asymo/conv.h): per image, a job that
    copies the image padded (when the windows reach past it) and, unless a PackedConvWeight
    brings them, packs the weights' micro-panels; then one whose tasks are panels of output
    channels by tiles of output pixels, bias, shortcut and activation fused."""

    writes_once = True  # (see _WinogradConvPlan)

    def __init__(self, pool, job):
        g = job.geom
        self.job = job
        self.offsets = _tap_offsets(job, g.channels * g.kernel_h * g.kernel_w,
                                    lib.asymo_conv_rows_offsets)
        job.copy_channels = max(1, ROWS_COPY_TASK_BYTES // (4 * lib.asymo_conv_rows_plane(job)))
        job.copy_bands = bool(ROWS_COPY_BANDS)
        self.scratch_elems = int(lib.asymo_conv_rows_scratch(job))
        k = int(g.channels * g.kernel_h * g.kernel_w)
        pixels = int(g.out_h * g.out_w)
        flops = 2.0 * job.out_channels * k * pixels
        job.panels_per_task, job.tiles_per_task = _panel_tile_split(
            pool, -(-int(job.out_channels) // int(job.panel_rows)),
            int(lib.asymo_conv_rows_tiles(job)), flops, job.out_channels >= pixels)
        self.ntasks = int(lib.asymo_conv_rows_tasks(job))
        fastest = _split_cost.pool_fastest_only(pool, flops, "mm")
        self.counts = _task_counts(pool, self.ntasks, fastest_only=fastest)
        self.prepare = _prepare_split(pool, lib.asymo_conv_rows_prepare_tasks(job), fastest)


def _nchwc_job(xshape, wshape, dtype, stride, pads, dilation, groups, activation):
    """The job template of a dense convolution through the blocked layout for this layer
    (`NCHWC`), or None."""
    c, (cout, _cin_g, kh, kw) = xshape[1], wshape
    if (NCHWC == "off" or dtype != np.float32 or groups != 1 or dilation != (1, 1)
            or c % 8 or cout % 8 or kh * kw == 1
            or cout * kh * kw > NCHWC_MAX_WEIGHT_RATIO * math.prod(xshape[2:])
            or kernel_isa() != "avx2_fma"):
        return None
    job = _layer_job("asymo_dense_blocked_job *", xshape, wshape, stride, pads, dilation,
                     activation)
    return job if lib.asymo_dense_blocked_supported(job) else None


class _NchwcConvPlan:
    """A dense convolution through the blocked layout (asymo/conv.h): per image, a job that
    copies the image into a padded NCHW8c copy and, unless a PackedConvWeight brings them,
    packs the weights; then one whose tasks are rows of the output by groups of three output
    blocks, bias, shortcut and activation fused."""

    writes_once = True  # (see _WinogradConvPlan)

    def __init__(self, pool, job):
        g = job.geom
        self.job = job
        job.copy_blocks = max(1, ROWS_COPY_TASK_BYTES // (4 * lib.asymo_dense_blocked_plane(job)))
        self.scratch_elems = int(lib.asymo_dense_blocked_scratch(job))
        pixels = int(g.out_h * g.out_w)
        k = int(g.channels * g.kernel_h * g.kernel_w)
        flops = 2.0 * job.out_channels * k * pixels
        # groups of output blocks first, rows only as far as needed for the tasks wanted: a
        # task's runs of several rows read each part's weights from L1 once per run
        # (docs/conv-and-zoo.md, "The NCHWc path")
        job.groups_per_task, job.rows_per_task = _panel_tile_split(
            pool, int(lib.asymo_pointwise_blocked_groups(job.out_channels)), int(g.out_h),
            flops, True)
        self.ntasks = int(lib.asymo_dense_blocked_tasks(job))
        fastest = _split_cost.pool_fastest_only(pool, flops, "mm")
        self.counts = _task_counts(pool, self.ntasks, fastest_only=fastest)
        self.prepare = _prepare_split(pool, lib.asymo_dense_blocked_prepare_tasks(job),
                                      fastest)


class _DepthwisePlan:
    """Direct depthwise kernel; bias, residual and activation fused into its tasks."""

    def __init__(self, pool, xshape, wshape, dtype, stride, pads, dilation, activation,
                 has_residual):
        # (see _WinogradConvPlan) with a residual, kernels other than the 3x3 one write
        # conv + bias, then add it
        self.writes_once = not has_residual
        n, c, h, w = xshape
        cout, _, kh, kw = wshape
        oh, ow = _out_hw(h, w, kh, kw, stride, pads, dilation)
        job = self.job = ffi.new("asymo_dwconv_job *")
        _geometry(job.geom, c, h, w, (kh, kw), stride, pads, dilation, oh, ow)
        job.dtype = DTYPE_CODES[dtype]
        job.activation = ACTIVATION_CODES[activation]
        job.batch = n
        job.out_channels = cout
        job.method = DEPTHWISE_METHOD
        # tasks: image x block of ASYMO_DW_LANES channels x block of rows; split rows only as
        # far as needed for TASKS_PER_WORKER tasks per worker, >= ~64K multiply-adds per task
        lanes = lib.ASYMO_DW_LANES
        blocks = n * -(-cout // lanes)
        want = TASKS_PER_WORKER * pool.nworkers
        row_blocks = max(1, min(oh, -(-want // blocks)))
        min_rows = -(-65536 // max(1, lanes * ow * kh * kw))
        rows = max(min_rows, _even_block_size(oh, row_blocks, pool.nworkers, fixed=blocks,
                                               tolerance=TASK_IDLE))
        job.rows_per_task = rows
        self.ntasks = blocks * -(-oh // rows)
        itemsize = dtype.itemsize
        self.inline = (n * c * h * w + n * cout * oh * ow) * itemsize < INLINE_BYTES
        flops = 2.0 * n * cout * oh * ow * kh * kw
        fastest = _split_cost.pool_fastest_only(pool, flops, "depthwise")
        self.counts = _task_counts(pool, self.ntasks, fastest_only=fastest)
        self.plane = cout * oh * ow


class _GemmConvPlan:
    """im2col (or the image itself for 1x1 stride-1) + GEMM per image and group, in chunks of
    output rows, with the bias / activation / residual epilogue in the GEMM's store (or a
    pass per image when a product is not the packed MM kind)."""

    writes_once = False  # (see _WinogradConvPlan) the GEMM adds each K block into C

    def __init__(self, pool, xshape, wshape, dtype, stride, pads, dilation, groups,
                 activation, has_bias, has_residual):
        self._plan_products(pool, xshape, wshape, dtype, stride, pads, dilation, groups,
                            activation, has_bias, has_residual)
        # bias, shortcut and activation in the GEMM's store of each block of C (no second
        # pass over the output) when every product runs the packed MM kernels
        if self.pointwise:
            gemms = [self.gemm_plan]
        else:
            gemms = [ch[2] for ch in (self.implicit if self.implicit is not None
                                      else self.chunks)]
        self.fused_epilogue = self.epilogue is not None and all(
            gp.kind == "mm" and gp.split_dim in ("M", "N") and gp.nbatch == 1 for gp in gemms)
        self.fused_activation = ACTIVATION_CODES[activation] if self.fused_epilogue else 0

    def _plan_products(self, pool, xshape, wshape, dtype, stride, pads, dilation, groups,
                       activation, has_bias, has_residual):
        from asymo.ops.conv_gemm import plan_conv_gemm

        n, c, h, w = xshape
        cout, cin_g, kh, kw = wshape
        oh, ow = _out_hw(h, w, kh, kw, stride, pads, dilation)
        self.groups, self.cin_g, self.cout_g = groups, cin_g, cout // groups
        self.k = k = cin_g * kh * kw
        self.ncols = oh * ow
        self.pointwise = (kh, kw) == (1, 1) and stride == (1, 1) and pads == ((0, 0), (0, 0))
        self.epilogue = None
        self.implicit = None
        if has_bias or activation is not None or has_residual:
            self.epilogue = _bias_act_plan(pool, cout, oh * ow, dtype, activation)
        if self.pointwise:
            self.gemm_plan = plan_conv_gemm(self.cout_g, k, self.ncols, dtype, pool,
                                            packs_b=True)
            return
        job = self.job = ffi.new("asymo_im2col_job *")
        _geometry(job.geom, cin_g, h, w, (kh, kw), stride, pads, dilation, oh, ow)
        job.dtype = DTYPE_CODES[dtype]
        explicit = IM2COL_METHOD == "explicit" or (
            IM2COL_METHOD == "auto" and _explicit_im2col(kh, kw, stride, dilation))
        if not explicit:
            self.implicit = _implicit_chunks(pool, self.cout_g, k, oh, ow, dtype)
            if self.implicit is not None:
                # everything about the GEMM but the pointers and the chunk width
                args = self.gemm_args = ffi.new("asymo_gemm_args *")
                args.dtype = DTYPE_CODES[dtype]
                args.m, args.k = self.cout_g, k
                args.rsa, args.csa = k, 1
                args.rsc, args.csc = self.ncols, 1
                args.nbatch = 1
                args.pack_b = _IM2COL_PACK_B
                return
        rows = _chunk_rows(oh, ow, k, dtype.itemsize)
        self.col_elems = k * rows * ow
        self.chunks = []
        plans = {}
        for r0 in range(0, oh, rows):
            n0, n1 = r0 * ow, min(oh, r0 + rows) * ow
            width = n1 - n0
            gp = plans.get(width)
            if gp is None:
                gp = plans[width] = plan_conv_gemm(self.cout_g, k, width, dtype, pool)
            self.chunks.append((n0, n1, gp) + _im2col_split(pool, gp, k, n0, n1, dtype))


def _explicit_im2col(kh, kw, stride, dilation):
    """Whether the "auto" im2col method writes a column matrix for this layer (measured on
    the development machine, docs/winograd.md):

    * strided 1x1 layers (ResNet's downsampling shortcuts): each row of a packed B sliver is
      another channel's plane, a cache miss per row once the image outgrows L2, where the
      column matrix is one subsampling pass in memory order, then a plain GEMM;
    * stride-1 kernels of 5x5 and up: a column row is one shifted copy of the image, while
      packed slivers cross output rows (14- and 28-wide planes) and take the packer's slow
      path, K = 25 C rows per sliver.
    Everything else packs its B panels straight from the image.
    """
    if (kh, kw) == (1, 1):
        return stride != (1, 1)
    return stride == (1, 1) and dilation == (1, 1) and kh * kw >= 25


def _implicit_chunks(pool, m, k, oh, ow, dtype):
    """[(n0, n1, gemm plan, serial)] for implicit im2col: chunks of whole output rows whose
    packed B stays under IMPLICIT_CHUNK_BYTES; None when a chunk's GEMM plan does not pack B
    (then the explicit path runs)."""
    from asymo.ops import matmul as _gemm_mod
    from asymo.ops.conv_gemm import plan_conv_gemm

    if _gemm_mod._default_backend != "c":
        return None
    rows = max(1, min(oh, IMPLICIT_CHUNK_BYTES // max(1, k * ow * dtype.itemsize)))
    nchunks = -(-oh // rows)
    rows = -(-oh // nchunks)
    chunks, plans = [], {}
    for r0 in range(0, oh, rows):
        n0, n1 = r0 * ow, min(oh, r0 + rows) * ow
        gp = plans.get(n1 - n0)
        if gp is None:
            gp = plans[n1 - n0] = plan_conv_gemm(m, k, n1 - n0, dtype, pool, packs_b=True)
        if gp.kind != "mm" or gp.split_dim not in ("M", "N") or gp.nbatch != 1:
            return None
        chunks.append((n0, n1, gp, pool is None))
    return chunks


def _chunk_rows(oh, ow, k, itemsize):
    """Output rows per im2col + GEMM chunk: the rows split evenly into chunks of about
    COL_CHUNK_COLUMNS columns, each at most COL_CHUNK_BYTES (but at least one row)."""
    nchunks = max(1, round(oh * ow / COL_CHUNK_COLUMNS))
    rows = -(-oh // nchunks)
    return max(1, min(rows, COL_CHUNK_BYTES // (k * ow * itemsize)))


def _out_hw(h, w, kh, kw, stride, pads, dilation):
    oh = (h + sum(pads[0]) - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + sum(pads[1]) - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return oh, ow


def _im2col_split(pool, gemm_plan, k, n0, n1, dtype):
    """Tasks for im2col of columns [n0, n1): each cluster produces the columns its GEMM
    consumes. Returns (bounds, ncolblocks, nrowblocks, counts, ntasks, inline), the arrays as
    cffi data."""
    from asymo.ops.conv_gemm import column_split

    ranges = column_split(gemm_plan, n1 - n0, pool)
    active = pool.active_workers_per_cluster()
    # Column blocks at least 256 wide (tasks writing a few columns of the same rows would
    # share cache lines); then split the K rows too until there are about TASKS_PER_WORKER
    # tasks per worker, each writing >= ~16 KB.
    min_cols = 256
    col_blocks = []
    for cluster, (start, stop) in enumerate(ranges):
        width = stop - start
        if width <= 0:
            col_blocks.append([])
            continue
        nb = max(1, min(TASKS_PER_WORKER * max(1, active[cluster]), width // min_cols))
        edges = _even_blocks(width, nb)
        col_blocks.append([n0 + start + e for e in edges[1:]])
    ncol = sum(len(b) for b in col_blocks)
    want = TASKS_PER_WORKER * max(1, sum(active))
    nrow = max(1, min(-(-want // ncol), k // 8,
                      (k * (n1 - n0) * dtype.itemsize) // (16384 * ncol)))
    bounds = [n0]
    counts = []
    for blocks in col_blocks:
        bounds.extend(blocks)
        counts.append(len(blocks) * nrow)
    inline = k * (n1 - n0) * dtype.itemsize < INLINE_BYTES
    return (ffi.new("int64_t[]", bounds), ncol, nrow, ffi.new("int64_t[]", counts),
            ncol * nrow, inline)



# ---- native calls: built once per plan and array layout, pointed at arrays per call ------

# where a pointer field of a native struct points: an operand of the call, plus a byte offset
_X, _W, _B, _Y, _R, _COL, _U = range(7)


def _base(a):
    """``char *`` to the first element of ``a``: contiguous arrays through the buffer
    protocol (~5x faster than ``a.ctypes``). Keep it while the pointer is used."""
    try:
        return ffi.from_buffer("char[]", a)
    except ValueError:  # not C-contiguous (an output that is a channel slice)
        return ffi.cast("char *", a.ctypes.data)


def _gemm_call(handle, args, plan):
    # a plan may run in the calling thread on some cpus (serial_cpus): decided per call
    return lib.asymo_gemm(ffi.NULL if plan.in_caller() else handle, args, plan.cdata())


class _NativeCalls:
    """The native calls that run one plan on one pool for one layout of the arrays (shapes,
    dtype, the output's and residual's strides), as ``(function, args)`` pairs returning a
    status code. Everything but the arrays' addresses is set once; `fill` points the structs
    at a call's arrays. Used once by a conv2d call that misses the call cache, kept by a
    `BoundConv2d` and by the call cache (`_cached_conv2d`), which keeps each thread's apart:
    the structs are rewritten by every fill.
    """

    __slots__ = ("calls", "_slots", "_sources", "_apacked", "_panel_jobs", "_packed",
                 "_keep", "_col_elems", "_col", "_dtype", "_tile", "_plan", "_backup")

    def __init__(self, plan, x, b, y, residual, pool, *, bound=False, prepacked=False,
                 backup=False):
        # backup: the plan's jobs are submitted with ASYMO_RUN_BACKUP where its tasks write
        # each output once (plan.writes_once; the caller fences: `bind_conv2d`)
        self._backup = backup and plan.writes_once
        # the plan owns C data the calls point at (column bounds, task counts, GEMM plans):
        # it lives as long as they do, whatever the plan cache evicts
        self._plan = plan
        self.calls, self._slots, self._apacked, self._keep = [], [], [], []
        self._panel_jobs = []
        self._packed = None
        self._col_elems, self._col, self._dtype = 0, None, x.dtype
        self._tile = 0
        has_bias = b is not None
        if isinstance(plan, _DepthwisePlan):
            self._depthwise(plan, has_bias, y, residual, pool)
        elif isinstance(plan, _WinogradConvPlan):
            self._winograd(plan, has_bias, y, residual, pool)
        elif isinstance(plan, _DirectPlan):
            self._prepared_jobs(plan, "asymo_conv_direct_job *", None, False, _DIRECT_TASK, x,
                                has_bias, y, None, pool)
        elif isinstance(plan, _IndirectConvPlan):
            self._prepared_jobs(plan, "asymo_conv_indirect_job *", _INDIRECT_PREPARE_TASK,
                                False, _INDIRECT_TASK, x, has_bias, y, None, pool)
        elif isinstance(plan, _PointwisePlan):
            # weights of a PackedConvWeight (``prepacked``; fill points the jobs at its panels)
            # need no prepare job; plain ones are packed by one, in the calling thread
            self._panel_jobs = self._prepared_jobs(
                plan, "asymo_conv_pointwise_job *",
                None if prepacked else _POINTWISE_PREPARE_TASK, True, _POINTWISE_TASK, x,
                has_bias, y, residual, pool)
        elif isinstance(plan, _RowsConvPlan):
            # the same weights' panels; the prepare job copies the image padded (on the pool),
            # and packs plain weights in its last task
            nprep, counts = plan.prepare[prepacked]
            self._panel_jobs = self._prepared_jobs(
                plan, "asymo_conv_rows_job *", _ROWS_PREPARE_TASK if nprep else None, False,
                _ROWS_TASK, x, has_bias, y, residual, pool, nprep=nprep, prep_counts=counts)
        elif isinstance(plan, _NchwcConvPlan):
            # the prepare job copies the image (on the pool), and packs plain weights in its
            # last task
            nprep, counts = plan.prepare[prepacked]
            self._panel_jobs = self._prepared_jobs(
                plan, "asymo_dense_blocked_job *", _NCHWC_PREPARE_TASK, False, _NCHWC_TASK,
                x, has_bias, y, residual, pool, nprep=nprep, prep_counts=counts)
        else:
            self._gemm(plan, x, has_bias, y, residual, pool)
        if self._col_elems and bound:
            self._col = empty_aligned(self._col_elems, x.dtype)  # a bound call owns its own
        self._sources = sorted({src for _s, _f, src, _o in self._slots})

    def _at(self, struct, field, src, offset=0):
        self._slots.append((struct, field, src, offset))

    def fill(self, x, w, packed, b, y, residual):
        """Point the calls at these arrays (of the layout they were built for); returns what
        must stay alive while they run."""
        arrays = [x, w, b, y, residual, None, None]
        if self._col_elems:
            arrays[_COL] = (self._col if self._col is not None
                            else workspace(self._col_elems, self._dtype))
        if self._tile:
            # the transform: kept by a PackedConvWeight, else from the fingerprinted cache
            arrays[_U] = _winograd.weights_for(w if packed is None else packed, self._tile)
        bases = arrays[:]  # (the arrays stay alive with their pointers)
        for src in self._sources:
            try:  # (_base, inline: this runs on every cached call)
                bases[src] = ffi.from_buffer("char[]", arrays[src])
            except ValueError:
                bases[src] = _base(arrays[src])
        for struct, field, src, offset in self._slots:
            setattr(struct, field, bases[src] + offset if offset else bases[src])
        if (packed is not None and (self._apacked or self._panel_jobs)
                and (self._packed is None or self._packed() is not packed)):
            # the weights' packed panels (the GEMM's A, asymo.prepack; the pointwise and rows
            # paths'), made once per PackedConvWeight (which never changes: set again only
            # for another one); otherwise the GEMM packs them per call, and a pointwise or
            # rows call's calls were made with a prepare job that packs them (calls are
            # cached per weight type)
            if self._apacked:
                pa = packed.gemm_a()
                for args, gp in self._apacked:
                    args.a_packed = pa.cdata_for(gp)
            if self._panel_jobs:
                panels = ffi.from_buffer(
                    packed.blocked_panels() if isinstance(self._plan, _NchwcConvPlan)
                    else packed.pointwise_panels(int(self._panel_jobs[0].panel_rows)))
                for job in self._panel_jobs:
                    job.apack = panels
            self._packed = weakref.ref(packed)
        return arrays, bases

    def _depthwise(self, plan, has_bias, y, residual, pool):
        job = ffi.new("asymo_dwconv_job *", plan.job[0])
        self._keep.append(job)
        self._at(job, "x", _X)
        self._at(job, "weight", _W)
        if has_bias:
            self._at(job, "bias", _B)
        self._at(job, "y", _Y)
        job.y_image_stride = y.strides[0] // y.itemsize if y.shape[0] > 1 else plan.plane
        if residual is not None:  # C-contiguous (_prepare made it so); added inside the tasks
            self._at(job, "residual", _R)
            job.residual_image_stride = plan.plane
        self.calls.append(_tasks_call(pool, _DWCONV_TASK, job, plan.ntasks, plan.counts,
                                      plan.inline, self._backup))

    def _winograd(self, plan, has_bias, y, residual, pool):
        wp = plan.plan
        self._tile = plan.tile
        job = ffi.new("asymo_winograd_job *", wp.job[0])
        self._keep.append(job)
        for field, src in (("x", _X), ("u", _U), ("weight", _W), ("y", _Y)):
            self._at(job, field, src)
        if has_bias:
            self._at(job, "bias", _B)
        if residual is not None:
            self._at(job, "residual", _R)
        if y.shape[0] > 1:
            job.y_image_stride = y.strides[0] // y.itemsize
        self.calls.append(_tasks_call(pool, _winograd.WINOGRAD_TASK, job, wp.ntasks,
                                      wp.counts, wp.inline, self._backup))

    def _prepared_jobs(self, plan, ctype, prepare, prep_inline, task, x, has_bias, y, residual,
                       pool, *, nprep=None, prep_counts=None):
        """The direct, indirect, pointwise and rows paths' calls: per image a job that fills
        the scratch (packed weights, phase planes, a padded image: a bound call's own, else
        the thread's workspace, the _COL slot; none when ``prepare`` is None) in ``nprep``
        tasks (default: the plan's), then the plan's tasks. Returns the per-image jobs."""
        if prepare is not None and nprep is None:
            nprep, prep_counts = plan.nprep, plan.prep_counts
        if prepare is not None:
            self._col_elems = plan.scratch_elems
        n, c, h, w = x.shape
        # backups: not where images share the scratch (a late task of one image would read
        # the next one's)
        backup = self._backup and (n == 1 or prepare is None)
        jobs = []
        for i in range(n):
            job = ffi.new(ctype, plan.job[0])
            self._keep.append(job)
            jobs.append(job)
            self._at(job, "x", _X, i * c * h * w * x.itemsize)
            self._at(job, "weight", _W)
            if has_bias:
                self._at(job, "bias", _B)
            self._at(job, "y", _Y, i * y.strides[0])
            if residual is not None:  # C-contiguous (_prepare made it so)
                self._at(job, "residual", _R, i * residual.strides[0])
            if prepare is not None:
                self._at(job, "scratch", _COL)
                self.calls.append(_tasks_call(pool, prepare, job, nprep, prep_counts,
                                              prep_inline, backup))
            self.calls.append(_tasks_call(pool, task, job, plan.ntasks, plan.counts, False,
                                          backup))
        return jobs

    def _gemm_args(self, template, m, k, n, rsb, rsc):
        if template is None:
            g = ffi.new("asymo_gemm_args *")
            g.dtype = DTYPE_CODES[self._dtype]
            g.m, g.k, g.n = m, k, n
            g.rsa, g.csa = k, 1
            g.rsb, g.csb = rsb, 1
            g.rsc, g.csc = rsc, 1
            g.nbatch = 1
        else:
            g = ffi.new("asymo_gemm_args *", template[0])
            g.n = n
        self._keep.append(g)
        return g

    def _gemm(self, plan, x, has_bias, y, residual, pool):
        handle = pool._handle
        n, c, h, w = x.shape
        es = x.itemsize
        cin_g, cout_g, groups, ncols, k = plan.cin_g, plan.cout_g, plan.groups, plan.ncols, plan.k
        fused, act = plan.fused_epilogue, plan.fused_activation
        # a PackedConvWeight's packed A panels serve one-group products of the packed MM kind
        packs_a = groups == 1

        def operands(args, gp, i, g, n0, bsrc, boff):
            # A: the weights of group g (or their packed panels); B: the image or the column
            # matrix (None: packed straight from the image); C: output rows of group g,
            # columns n0.. of image i
            self._at(args, "a", _W, g * cout_g * k * es)
            if bsrc is not None:
                self._at(args, "b", bsrc, boff)
            self._at(args, "c", _Y, i * y.strides[0] + (g * cout_g * ncols + n0) * es)
            if packs_a and gp.kind == "mm" and gp.split_dim != "batch":
                self._apacked.append((args, gp))
            if fused:
                if has_bias:
                    self._at(args, "row_bias", _B, g * cout_g * es)
                if residual is not None:
                    self._at(args, "residual", _R, i * residual.strides[0]
                             + (g * cout_g * ncols + n0) * es)
                    args.rs_residual = ncols
                args.activation = act

        for i in range(n):
            for g in range(groups):
                xoff = (i * c + g * cin_g) * h * w * es
                if plan.pointwise:
                    gp = plan.gemm_plan
                    args = self._gemm_args(None, cout_g, k, ncols, ncols, ncols)
                    operands(args, gp, i, g, 0, _X, xoff)
                    self.calls.append((_gemm_call, (handle, args, gp)))
                elif plan.implicit is not None:
                    for n0, n1, gp, serial in plan.implicit:
                        job = ffi.new("asymo_im2col_job *", plan.job[0])
                        self._keep.append(job)
                        self._at(job, "x", _X, xoff)
                        job.col_offset = n0
                        args = self._gemm_args(plan.gemm_args, cout_g, k, n1 - n0, 0, ncols)
                        args.pack_b_ctx = job
                        operands(args, gp, i, g, n0, None, 0)
                        self.calls.append((_gemm_call, (ffi.NULL if serial else handle, args,
                                                        gp)))
                else:
                    # the column matrix: a bound call's own, else the thread's workspace
                    self._col_elems = plan.col_elems
                    for n0, n1, gp, bounds, ncol, nrow, counts, ntasks, inline in plan.chunks:
                        job = ffi.new("asymo_im2col_job *", plan.job[0])
                        self._keep.append(job)
                        self._at(job, "x", _X, xoff)
                        self._at(job, "col", _COL)
                        job.ldcol = n1 - n0
                        job.col_offset = n0
                        job.col_bounds = bounds
                        job.ncolblocks = ncol
                        job.nrowblocks = nrow
                        args = self._gemm_args(None, cout_g, k, n1 - n0, n1 - n0, ncols)
                        operands(args, gp, i, g, n0, _COL, 0)
                        self.calls.append(_tasks_call(pool, _IM2COL_TASK, job, ntasks, counts,
                                                      inline))
                        self.calls.append((_gemm_call, (handle, args, gp)))
        if not fused and plan.epilogue is not None:
            self._epilogue(plan.epilogue, pool, y, has_bias, residual)

    def _epilogue(self, plan_epilogue, pool, y, has_bias, residual):
        """The epilogue pass over every image of ``y`` as one pool job (a task is a block of
        one image's channels; the per-image task split scaled by the batch)."""
        template, ntasks, (inline, counts) = plan_epilogue
        n = y.shape[0]
        job = ffi.new("asymo_bias_act_job *", template[0])
        self._keep.append(job)
        job.batch = n
        self._at(job, "y", _Y)
        job.image_stride = y.strides[0] // y.itemsize
        if has_bias:
            self._at(job, "bias", _B)
        if residual is not None:
            self._at(job, "residual", _R)
            job.residual_image_stride = residual.strides[0] // residual.itemsize
        if counts is not None and n > 1:
            counts = ffi.new("int64_t[]", [int(c) * n for c in counts])
            self._keep.append(counts)
        self.calls.append(_tasks_call(pool, _BIAS_ACT_TASK, job, ntasks * n, counts,
                                      inline and n == 1))

class BoundConv2d(BoundJobs):
    """A convolution bound to fixed arrays and one pool: checked, planned and its weights
    packed once (`bind_conv2d`); a call runs the kernels with no Python work between them
    (`asymo.runtime.tasks.BoundJobs`), or ``fallback`` (the unbound call) where the kernels
    cannot use the arrays in place.

    The arrays it was bound to must stay as they are (same memory, shapes and strides; the
    input's and residual's *contents* change between calls, the weights' never). A call must
    hold the pool (`asymo.runtime.pool.hold`), as a model's inference does.
    """

    __slots__ = ("_fallback",)

    def __init__(self, calls, keep, fallback=None):
        super().__init__(calls, keep, "conv2d")
        self._fallback = fallback

    def __call__(self):
        if self._fallback is not None:
            self._fallback()
            return
        super().__call__()

    @property
    def calls(self):
        """`BoundJobs.calls`; None for a call bound to the fallback."""
        return None if self._fallback is not None else super().calls


def bind_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
                activation=None, residual=None, out, pool, backup=False, cold_weights=False):
    """Bind ``conv2d(x, weight, bias, ..., out=out, pool=pool)`` once; returns a
    `BoundConv2d` whose calls recompute ``out`` from the current contents of ``x`` (and
    ``residual``).

    ``weight`` is a `PackedConvWeight` or an array (packed here); NumPy arrays only. Calls
    whose arrays the kernels cannot use in place (a non-contiguous input, an output or
    residual that overlaps an operand, ...) are bound to `conv2d` itself: correct, just
    without the saving.

    ``backup=True`` lets the pool run a late task again on another core and return without
    waiting for it (`asymo.runtime.pool.Pool.fence`, docs/pool.md): a call may then leave a
    task running that still reads ``x``, ``residual`` and the call's scratch and writes
    ``out`` (the same values). The caller must fence the pool before it changes or frees
    any of them, as a model's runner does between nodes.

    ``cold_weights=True`` says the weights will have left the caches between calls (the
    layer is one of a network's): the plan then takes the rows path over Winograd on narrow
    planes (`ROWS_OVER_WINOGRAD_WIDTH_COLD`) and on layers of few input channels
    (`ROWS_OVER_WINOGRAD_CHANNELS_COLD`).

    ``residual`` may be ``out`` itself (the same array: a network's shortcut that dies at this
    layer, `asymo.models.graph_model.RESIDUAL_IN_PLACE`): where the plan's kernels write each
    output once, reading the shortcut there just before, the layer adds it in place and backs
    no task up whatever ``backup`` says (a late copy would read the sum); elsewhere a call
    copies it first.
    """
    packed = weight if isinstance(weight, PackedConvWeight) else PackedConvWeight(weight)
    alias = (residual is not None and isinstance(residual, np.ndarray)
             and isinstance(out, np.ndarray) and _same_array(residual, out))
    # the checks and errors of conv2d, once
    c = _prepare(x, packed, bias, stride, padding, dilation, groups, activation, residual, out,
                 residual_in_place=alias)

    def fallback():
        conv2d(x, packed, bias, stride, padding, dilation, groups, activation=activation,
               residual=residual, out=out, pool=pool)

    if c.empty:
        return BoundConv2d([], [], fallback=lambda: None)
    if pool is None or not _in_place(c, x, packed.array, bias, residual, out, alias):
        return BoundConv2d([], [c], fallback=fallback)
    plan = c.plan_for(pool, cold_weights=cold_weights)[0]
    if alias and not plan.writes_once:
        return BoundConv2d([], [c], fallback=fallback)
    backup = backup and not alias
    calls = _NativeCalls(plan, c.xb, c.b, c.target, c.residual, pool, bound=True,
                         prepacked=True, backup=backup)
    keep = [x, packed, bias, residual, out, c, calls,
            calls.fill(c.xb, c.w, packed, c.b, c.target, c.residual)]
    return BoundConv2d(calls.calls, keep)


def _in_place(c, x, weight_array, bias, residual, out, residual_in_place=False):
    """Whether the checked call ``c`` runs its kernels on the caller's own arrays (``x``,
    ``weight_array``, ``bias``, ``residual``, ``out`` or a new output): no copy of an operand,
    no temporary output. A bound call, and a conv2d call from the call cache, then need only
    the arrays' addresses. With ``residual_in_place`` the residual may be the output itself."""
    return (c.direct and c.xb.flags.c_contiguous and np.shares_memory(c.xb, x)
            and c.w is weight_array
            and (bias is None or np.shares_memory(c.b, bias))
            and (residual is None or (np.shares_memory(c.residual, residual)
                                      and (not np.may_share_memory(residual, c.y)
                                           or (residual_in_place
                                               and _same_array(residual, c.y))))))


def _same_array(a, b):
    """Whether ``a`` and ``b`` are the same C-contiguous memory viewed the same way."""
    return (a.shape == b.shape and a.dtype == b.dtype and a.flags.c_contiguous
            and b.flags.c_contiguous and a.ctypes.data == b.ctypes.data)


# ---- the call cache: conv2d's path for a call signature it has seen ------------------------

#: signatures each thread keeps (the oldest dropped first)
CALL_CACHE_SIZE = 32
_call_local = threading.local()  # .entries: {signature: _CachedCall}


def _plan_settings():
    """The module settings (and the emulator's period) a plan depends on: part of the plan
    cache's key and checked by the call cache."""
    return (DEPTHWISE_METHOD, WINOGRAD, WINOGRAD_METHOD, WINOGRAD_F4_MIN_SIZE,
            WINOGRAD_MIN_CHANNELS, WINOGRAD_F4_MAX_WEIGHT_BYTES, COL_CHUNK_BYTES,
            COL_CHUNK_COLUMNS, IM2COL_METHOD, IMPLICIT_CHUNK_BYTES, DIRECT, INDIRECT,
            INDIRECT_MAX_CHANNELS, INDIRECT_MIN_TAPS, INDIRECT_WIDE, POINTWISE,
            POINTWISE_ROWS_MAX_PIXELS, POINTWISE_ROWS_MIN_CHANNELS, POINTWISE_ROWS_PANELS,
            POINTWISE_ROWS_PANELS_AVX2, ROWS_AVX2_MAX_OUT_CHANNELS, ROWS_AVX2_MAX_WEIGHT_BYTES,
            ROWS_AVX2_MAX_EXPANSION,
            POINTWISE_ROWS_ANY_PLANE_CHANNELS, POINTWISE_MAX_OUT_CHANNELS,
            POINTWISE_MAX_WEIGHT_BYTES, POINTWISE_MAX_RUN_WASTE, ROWS, ROWS_MIN_TILE,
            ROWS_OVER_WINOGRAD_WIDTH, ROWS_OVER_WINOGRAD_WIDTH_COLD,
            ROWS_OVER_WINOGRAD_CHANNELS_COLD, ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2,
            ROWS_COPY_TASK_BYTES, ROWS_COPY_BANDS,
            NCHWC, NCHWC_MAX_WEIGHT_RATIO, TASKS_PER_WORKER, TASK_IDLE,
            _split_cost.emulated_period())


def _int_pair(v):
    # a pair of ints as given (exact types: (True, 1) or (np.int64(1), 1) would compare equal
    # to (1, 1) in a key but are checked differently)
    return type(v) is tuple and len(v) == 2 and type(v[0]) is int and type(v[1]) is int


def _array_signature(a):
    """(shape, strides, dtype) of an ndarray (exact type), None for None, False otherwise."""
    if a is None:
        return None
    if type(a) is np.ndarray:
        return (a.shape, a.strides, a.dtype)
    return False


def _call_signature(x, weight, bias, stride, padding, dilation, groups, activation, residual,
                    out, pool):
    """The call cache's key for a conv2d call on plain NumPy arrays, or None (the call is
    checked and planned in full). Everything conv2d's checks depend on but the arrays'
    addresses and the output's flags: shapes, strides, dtypes, the arguments (of exact
    types; an int stands for itself, not for True or 1.0), which optional operands are
    given, the pool."""
    wt = type(weight)
    if type(x) is not np.ndarray or (wt is not np.ndarray and wt is not PackedConvWeight):
        return None
    w = weight if wt is np.ndarray else weight.array
    bs = None if bias is None else _array_signature(bias)
    rs = None if residual is None else _array_signature(residual)
    os_ = None if out is None else _array_signature(out)
    if (bs is False or rs is False or os_ is False or type(groups) is not int
            or (type(stride) is not int and not _int_pair(stride))
            or (type(dilation) is not int and not _int_pair(dilation))
            or (type(padding) is not int and type(padding) is not str
                and not _int_pair(padding))
            or (activation is not None and type(activation) is not str)):
        return None
    return (x.shape, x.strides, x.dtype, wt, w.shape, w.strides, w.dtype, bs, rs, os_,
            stride, padding, dilation, groups, activation, None if pool is None else id(pool))


class _CachedCall:
    """A call signature's native calls and plan on one pool (with the pool's limit and the
    plan settings they were made under) and the shape of its result."""

    __slots__ = ("calls", "plan", "plan_key", "pool", "limit", "settings", "shape", "dtype",
                 "busy")


def _cached_conv2d(sig, x, weight, bias, residual, out, pool):
    """conv2d's result from the call cache, or None when the cache cannot serve this call
    (then the full path runs, checks everything and may add the signature)."""
    entries = getattr(_call_local, "entries", None)
    e = None if entries is None else entries.get(sig)
    if e is None or e.busy:  # busy: a re-entrant call (a signal handler) on this thread
        return None
    w = weight.array if type(weight) is PackedConvWeight else weight
    if out is not None:
        # (what the full path copies, or computes through a temporary, for this call)
        if (not out.flags.writeable or np.may_share_memory(out, x)
                or np.may_share_memory(out, w)
                or (bias is not None and np.may_share_memory(out, bias))
                or (residual is not None and np.may_share_memory(out, residual))):
            return None
    if type(pool) is _Pool:
        pool._acquire()
    else:
        pool = _acquire_pool(pool)  # the default pool (or the type error)
    try:
        # valid while its plan is: the same pool, limit and settings, and the plan still in
        # the plan cache (which may have been emptied since)
        if (e.pool() is not pool or lib.asymo_pool_get_limit(pool._handle) != e.limit
                or _plan_settings() != e.settings
                or _cached_plan(pool, e.plan_key) is not e.plan):
            return None
        y = empty_result(e.shape, e.dtype) if out is None else out
        e.busy = True
        try:
            keep = e.calls.fill(x, w, None if w is weight else weight, bias, y, residual)
            run_calls(e.calls.calls, "conv2d")
        finally:
            e.busy = False
        del keep
    finally:
        pool._release()
    return y


def remember_call(local, sig, entry, size):
    """Keep ``entry`` for call signature ``sig`` in the calling thread's cache ``local`` (a
    ``threading.local``; ``local.entries``), dropping the oldest signatures beyond ``size``.
    The call caches of conv2d and of pooling."""
    entries = getattr(local, "entries", None)
    if entries is None:
        entries = local.entries = {}
    entries.pop(sig, None)
    while len(entries) >= size:
        del entries[next(iter(entries))]
    entries[sig] = entry


def _cache_call(sig, calls, plan, plan_key, pool, limit, settings, y):
    e = _CachedCall()
    e.calls, e.plan, e.plan_key = calls, plan, plan_key
    e.pool, e.limit, e.settings = weakref.ref(pool), limit, settings
    e.shape, e.dtype, e.busy = y.shape, y.dtype, False
    remember_call(_call_local, sig, e, CALL_CACHE_SIZE)


def clear_call_cache():
    """Forget the calling thread's cached conv2d call signatures (tests, benchmarks)."""
    _call_local.entries = {}


_IM2COL_TASK = task_fn("asymo_im2col_task")
_IM2COL_PACK_B = task_fn("asymo_im2col_pack_b")
_DWCONV_TASK = task_fn("asymo_dwconv_task")
_BIAS_ACT_TASK = task_fn("asymo_bias_act_task")
_INDIRECT_PREPARE_TASK = task_fn("asymo_conv_indirect_prepare_task")
_INDIRECT_TASK = task_fn("asymo_conv_indirect_task")
_DIRECT_TASK = task_fn("asymo_conv_direct_task")
_POINTWISE_PREPARE_TASK = task_fn("asymo_conv_pointwise_prepare_task")
_POINTWISE_TASK = task_fn("asymo_conv_pointwise_task")
_ROWS_PREPARE_TASK = task_fn("asymo_conv_rows_prepare_task")
_ROWS_TASK = task_fn("asymo_conv_rows_task")
_NCHWC_PREPARE_TASK = task_fn("asymo_dense_blocked_prepare_task")
_NCHWC_TASK = task_fn("asymo_dense_blocked_task")
