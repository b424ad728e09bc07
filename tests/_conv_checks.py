"""What the tests of an in-place convolution path check for every layer: the input at the
very end of an anonymous mapping (a load past it faults), the output a channel slice of a
larger array (its neighbours untouched), and the bound form (a model's node); each against
the float64 reference."""
import mmap

import numpy as np

import asymo
from asymo.models import reference
from asymo.ops import conv as conv_mod
from asymo.ops.conv import conv2d


def input_at_mapping_end(rng, shape):
    """A float32 array of ``shape`` (standard normal) ending where its mapping ends."""
    nbytes = int(np.prod(shape)) * 4
    buf = mmap.mmap(-1, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
    x = np.frombuffer(buf, np.float32, offset=len(buf) - nbytes).reshape(shape)
    x[...] = rng.standard_normal(shape)
    return x


def check_layer(pool, x, weights, b, stride, padding, act, r, close, *, bound_calls=1):
    """``conv2d`` into a channel slice of a NaN-filled array and the bound form (called
    ``bound_calls`` times), for each of ``weights`` (the same filters, plain or prepacked),
    with bias ``b``, activation ``act`` and shortcut ``r``; ``close(y, ref)`` compares."""
    w0 = weights[0]
    ref = reference.conv2d(x.astype(np.float64), np.asarray(w0, np.float64),
                           None if b is None else b.astype(np.float64), stride, padding)
    ref = ref + (0 if r is None else r)
    ref = {None: ref, "relu": np.maximum(ref, 0), "relu6": np.clip(ref, 0, 6)}[act]
    n, cout = ref.shape[:2]
    for weight in weights:
        big = np.full((n, cout + 3) + ref.shape[2:], np.nan, np.float32)
        y = conv2d(x, weight, b, stride, padding, activation=act, residual=r,
                   out=big[:, 2:2 + cout], pool=pool)
        close(y, ref)
        assert np.isnan(big[:, :2]).all() and np.isnan(big[:, 2 + cout:]).all()
        out = np.full(ref.shape, np.nan, np.float32)
        bound = conv_mod.bind_conv2d(x, weight, b, stride, padding, activation=act,
                                     residual=r, out=out, pool=pool)
        with asymo.runtime.pool.hold(pool):
            for _ in range(bound_calls):
                bound()
        close(out, ref)
