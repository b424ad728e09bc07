"""Winograd convolution for 3x3, stride-1 layers (float32): weight transforms and plans.

F(m x m, 3 x 3) computes an m x m output tile from a (m + 2)^2 input patch with (m + 2)^2
multiplications per input channel instead of 9 m^2: 2.25x fewer for m = 2, 4x for m = 4. The
price is rounding: the transforms multiply by up to 8 (m = 4) before the products are summed,
so the error grows with m (measured bounds in docs/winograd.md and tests/test_winograd.py).

- `transform_weights(w, m)`: U = G g G^T per filter, computed in float64 and rounded once,
  packed into the micro-kernel's panel layout (csrc/include/asymo/winograd.h);
- `weights_for(w, m)`: the same through a cache keyed on the array's identity and a
  fingerprint of its contents (so an array changed in place is transformed again), or held by
  an `asymo.PackedConvWeight`, whose weights cannot change;
- `WinogradPlan`: the task geometry of one layer shape on one pool, decided once.

The task (csrc/conv/winograd.c) transforms its tiles' input, runs the (m + 2)^2 GEMMs and
transforms the output back with bias, residual and activation: one pool job per convolution,
the transforms on the cluster that consumes them.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from asymo.plan import split_cost as _split_cost
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.tasks import ACTIVATION_CODES, DTYPE_CODES, task_fn

__all__ = ["transform_weights", "weights_for", "WinogradPlan", "PackedConvWeight",
           "prepack_conv"]

MR = int(lib.ASYMO_WINO_MR)
NR = int(lib.ASYMO_WINO_NR)

# G (alpha x 3) of F(2x2, 3x3) and F(4x4, 3x3) (interpolation points 0, +-1 and 0, +-1, +-2)
_G = {
    2: np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]),
    4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
}
# B^T and A^T, for the NumPy reference (the C kernel has them unrolled)
BT = {
    2: np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
    4: np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float),
}
AT = {
    2: np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float),
    4: np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], float),
}
G = _G


def transform_weights(weight, m):
    """The transformed weights of ``weight`` (K x C x 3 x 3) for F(m x m, 3 x 3), packed.

    Returns a float32 array of shape ``((m + 2)**2, Kp // MR, C, MR)`` (``Kp``: K rounded up
    to a multiple of MR, the extra rows zero): element ``[xi, p, c, r]`` is position ``xi`` of
    ``G g G^T`` for output channel ``p * MR + r`` and input channel ``c``.
    """
    if m not in _G:
        raise ValueError(f"Winograd tile must be 2 or 4, got {m!r}")
    w = np.asarray(weight)
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise ValueError(f"Winograd needs K x C x 3 x 3 weights, got shape {w.shape}")
    k, c = w.shape[:2]
    g = _G[m]
    alpha = m + 2
    u = np.einsum("ai,kcij,bj->abkc", g, w.astype(np.float64), g, optimize=True)
    u = u.reshape(alpha * alpha, k, c)
    kp = -(-k // MR) * MR
    packed = np.zeros((alpha * alpha, kp, c), np.float32)
    packed[:, :k] = u
    return np.ascontiguousarray(
        packed.reshape(alpha * alpha, kp // MR, MR, c).transpose(0, 1, 3, 2))


class PackedConvWeight:
    """Convolution weights prepared once, for a layer whose weights do not change (a model's):
    pass it to `asymo.conv2d` in place of the weight array. It holds a read-only copy of the
    weights and the transforms each path needs, made on first use and kept.

    Parameters
    ----------
    weight : ndarray, shape (Cout, C / groups, kh, kw)
        float32 or float64 filters.
    copy : bool
        Copy the weights (default). ``copy=False`` keeps a read-only C-contiguous array as it
        is, for an owner that never changes it (a model's weights); other arrays are copied.
    """

    def __init__(self, weight, *, copy=True):
        w = weight
        if (copy or not isinstance(w, np.ndarray) or w.flags.writeable
                or not w.flags.c_contiguous or not w.dtype.isnative):
            w = np.array(weight, copy=True, order="C")
        if w.ndim != 4:
            raise ValueError(f"PackedConvWeight: expected a 4-D weight (Cout, C/groups, kh, "
                             f"kw), got shape {w.shape}")
        if w.dtype not in DTYPE_CODES:
            raise TypeError(f"PackedConvWeight: weight must be float32 or float64, got "
                            f"dtype {w.dtype}")
        if w.flags.writeable:
            w.flags.writeable = False
        self.array = w
        self._transforms = {}
        self._lock = threading.Lock()

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)

    def gemm_a(self):
        """The weights as the GEMM's packed A operand (``asymo.prepack`` of the
        ``Cout x (C * kh * kw)`` matrix, made once): the 1x1 and im2col paths of a one-group
        convolution then skip packing the weights on every call."""
        pa = self._transforms.get("gemm")
        if pa is None:
            with self._lock:
                pa = self._transforms.get("gemm")
                if pa is None:
                    from asymo.ops.packed import prepack

                    pa = self._transforms["gemm"] = prepack(
                        self.array.reshape(self.array.shape[0], -1), side="a")
        return pa

    def pointwise_panels(self, mr=16):
        """The weights of a float32 layer as the pointwise and rows paths' micro-panels of
        ``mr`` output channels, over all of a filter's taps (``asymo_conv_pack_panels``, the C
        packer the paths' prepare jobs run; made once per ``mr``)."""
        key = ("pointwise", mr)
        a = self._transforms.get(key)
        if a is None:
            with self._lock:
                a = self._transforms.get(key)
                if a is None:
                    m, k = self.array.shape[0], self.array[0].size
                    a = np.empty(-(-m // mr) * mr * k, np.float32)
                    lib.asymo_conv_pack_panels(ffi.from_buffer("float[]", self.array), m, k,
                                               mr, ffi.from_buffer("float[]", a))
                    self._transforms[key] = a
        return a

    def blocked_panels(self):
        """The weights of a float32 layer packed for the dense blocked-layout kernel
        (``asymo_dense_blocked_pack``, the C packer the path's prepare job runs; made once)."""
        a = self._transforms.get("blocked")
        if a is None:
            with self._lock:
                a = self._transforms.get("blocked")
                if a is None:
                    cout, c, kh, kw = self.array.shape
                    job = ffi.new("asymo_dense_blocked_job *")
                    job.geom.channels, job.geom.kernel_h, job.geom.kernel_w = c, kh, kw
                    job.out_channels = cout
                    a = np.empty(lib.asymo_dense_blocked_packed_size(job), np.float32)
                    lib.asymo_dense_blocked_pack(job, ffi.from_buffer("float[]", self.array),
                                                 ffi.from_buffer("float[]", a))
                    self._transforms["blocked"] = a
        return a

    def winograd(self, m):
        """The packed Winograd transform for tile ``m`` (made once)."""
        u = self._transforms.get(m)
        if u is None:
            with self._lock:
                u = self._transforms.get(m)
                if u is None:
                    u = self._transforms[m] = transform_weights(self.array, m)
        return u

    def __repr__(self):
        return f"PackedConvWeight(shape={self.shape}, dtype={self.dtype})"


def prepack_conv(weight, *, copy=True):
    """``PackedConvWeight(weight, copy=copy)``: weights transformed once and reused on every
    call."""
    return PackedConvWeight(weight, copy=copy)


# ---- cache of transforms for plain arrays ---------------------------------------------------

_CACHE_MAX = 64
_cache = {}            # id(array) -> [weakref, (ptr, shape, strides), fingerprint, {m: U}]
_cache_lock = threading.Lock()


def fingerprint(a):
    """64-bit fingerprint of a C-contiguous array's bytes (csrc asymo_fingerprint)."""
    return int(lib.asymo_fingerprint(ffi.from_buffer(a), a.nbytes))


def weights_for(weight, m):
    """The packed Winograd transform of ``weight`` (an ndarray, C-contiguous float32, or a
    `PackedConvWeight`), from a cache: computed again only when the array is new or its
    contents changed since (checked by a fingerprint of its bytes on every call)."""
    if isinstance(weight, PackedConvWeight):
        return weight.winograd(m)
    key = id(weight)
    where = (weight.__array_interface__["data"][0], weight.shape, weight.strides)
    fp = fingerprint(weight)
    entry = _cache.get(key)
    if entry is not None and entry[0]() is weight and entry[1] == where and entry[2] == fp:
        u = entry[3].get(m)
        if u is None:
            u = entry[3][m] = transform_weights(weight, m)
        return u
    u = transform_weights(weight, m)
    try:
        ref = weakref.ref(weight, lambda _r, key=key: _drop(key, _r))
    except TypeError:
        return u
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.pop(next(iter(_cache)))
        _cache[key] = [ref, where, fp, {m: u}]
    return u


def _drop(key, ref):
    with _cache_lock:
        entry = _cache.get(key)
        if entry is not None and entry[0] is ref:
            del _cache[key]


# ---- plans ------------------------------------------------------------------------------------

# Tasks per worker to aim for: tile blocks (load balance, and stealing room on an asymmetric
# pool), and channel blocks, which cost more: each transforms its tiles' input again
# (docs/winograd.md has the measurements).
TASKS_PER_WORKER = 4
CHANNEL_TASKS_PER_WORKER = 1
# On a pool of several clusters, a job with few tasks is cut into more channel blocks (up to
# 4x) when, split by capacity, a slower cluster would finish more than this much after an
# ideal split: two tasks on a fast core and a half-speed one give each one, and the job takes
# as long as on the fast core alone (ResNet's 7x7 layers, docs/tuning.md). A job that
# rounds to the fastest cluster alone is left so: a small share on a slowed core measured
# slower under the emulator (GoogLeNet's 7x7 layers with core 1 at a third).
SPLIT_BALANCE_TOLERANCE = 0.15


def _split_lateness(pool, ntasks):
    """``(late, cluster)``: how much later than an ideal capacity split (1.0: on time) the
    last cluster finishes a job of ``ntasks`` equal tasks split by ``pool.split_counts``, and
    which cluster that is (0: the fastest)."""
    rates = pool.split_weights()
    counts = pool.split_counts(ntasks)
    finish, last = max((cnt / r, -i) for i, (cnt, r) in enumerate(zip(counts, rates)) if cnt)
    return finish * sum(rates) / ntasks, -last


class WinogradPlan:
    """One layer shape's Winograd job on one pool: tile size, task blocks, cluster split.

    Parameters
    ----------
    pool : asymo.Pool
    xshape : (N, C, H, W)
    wshape : (K, C, 3, 3)
    pads : ((top, bottom), (left, right))
    tile : 2 or 4
        Output tile size m of F(m x m, 3 x 3).
    activation : None, "relu" or "relu6"
    method : 0 (Winograd) or 1 (the task's direct fallback loop, for tests)
    """

    def __init__(self, pool, xshape, wshape, pads, tile, activation, method=0):
        n, c, h, w = xshape
        k = wshape[0]
        oh = h + sum(pads[0]) - 2
        ow = w + sum(pads[1]) - 2
        self.tile = tile
        job = self.job = ffi.new("asymo_winograd_job *")
        g = job.geom
        g.channels, g.height, g.width = c, h, w
        g.kernel_h = g.kernel_w = 3
        g.stride_h = g.stride_w = g.dilation_h = g.dilation_w = 1
        g.pad_h, g.pad_w = pads[0][0], pads[1][0]
        g.out_h, g.out_w = oh, ow
        job.dtype = DTYPE_CODES[np.dtype(np.float32)]
        job.activation = ACTIVATION_CODES[activation]
        job.tile = tile
        job.batch = n
        job.out_channels = k
        job.x_image_stride = c * h * w
        job.k_padded = -(-k // MR) * MR
        job.y_image_stride = k * oh * ow
        job.residual_image_stride = k * oh * ow
        th, tw = -(-oh // tile), -(-ow // tile)
        job.tiles_h, job.tiles_w = th, tw
        ntiles = th * tw
        workers = max(1, pool.nworkers)
        want = TASKS_PER_WORKER * workers
        # Tile blocks: wider blocks reuse each transformed-weight panel over more tiles (the
        # panels stream from L2 / L3); keep enough blocks to feed the workers.
        tb = NR
        while (tb < 4 * NR and n * -(-ntiles // (2 * tb)) >= want
               and (tile + 2) ** 2 * c * 2 * tb * 4 <= (1 << 20)):
            tb *= 2
        job.tiles_per_task = tb
        job.tile_blocks = -(-ntiles // tb)
        # Channel blocks: only as many as the workers need (each block transforms its tiles'
        # input again; one worker needs none), at least 4 panels each.
        kpanels = -(-k // MR)
        blocks = n * int(job.tile_blocks)
        want_k = CHANNEL_TASKS_PER_WORKER * workers if workers > 1 else 1
        kmax = kpanels // 4 if kpanels >= 8 else 1
        kb = max(1, min(-(-want_k // blocks), kmax))
        flops = 2.0 * n * k * c * (tile + 2) ** 2 * ntiles
        fastest = _split_cost.pool_fastest_only(pool, flops, "depthwise")
        if pool.nclusters > 1 and not fastest:
            late, who = _split_lateness(pool, blocks * kb)
            if late > 1 + SPLIT_BALANCE_TOLERANCE and who > 0:
                for more in range(kb + 1, min(kmax, 4 * kb) + 1):
                    if _split_lateness(pool, blocks * more)[0] <= 1 + SPLIT_BALANCE_TOLERANCE:
                        kb = more
                        break
        per = -(-kpanels // kb) * MR
        job.k_per_block = per
        job.k_blocks = -(-k // per)
        job.method = method
        self.ntasks = n * int(job.tile_blocks) * int(job.k_blocks)
        if pool.nclusters <= 1:
            self.counts = None
        else:
            split = [1.0] + [0.0] * (pool.nclusters - 1) if fastest else None
            self.counts = ffi.new("int64_t[]", pool.split_counts(self.ntasks, split))
        self.inline = self.ntasks == 1 and flops < 2e5


WINOGRAD_TASK = task_fn("asymo_winograd_task")
