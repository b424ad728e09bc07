"""The NCHWc path of convolutions (asymo/conv.h asymo_dense_blocked_job, conv/blocked.c): the
image reordered into a zero-padded NCHW8c copy, tiles of output blocks by pixels of a row,
stored to the NCHW output; against float64."""
import numpy as np
import pytest

import asymo
from asymo.models import reference
from asymo.ops import conv as conv_mod
from asymo.ops.conv import conv2d
from asymo.plan.gemm import supported_isas
from _conv_checks import check_layer, input_at_mapping_end

pytestmark = pytest.mark.skipif(
    "avx2_fma" not in supported_isas() or not conv_mod.lib.asymo_blocked_supported(),
    reason="no AVX2 blocked-layout kernels here")


def _plan(pool, xs, ws, stride, pads, act=None, bias=False, res=False):
    return conv_mod._conv_plan(pool, xs, ws, np.dtype(np.float32), stride, pads, (1, 1), 1,
                               act, bias, res)[0]


@pytest.fixture
def nchwc_everywhere(monkeypatch):
    """The path for every layer it can run (not only those the paths before it leave and
    whose weights do not outweigh their image), with the AVX2 kernels."""
    monkeypatch.setattr(conv_mod, "ROWS", "off")
    monkeypatch.setattr(conv_mod, "WINOGRAD", "off")
    monkeypatch.setattr(conv_mod, "NCHWC_MAX_WEIGHT_RATIO", 1 << 40)
    with conv_mod.use_kernel_isa("avx2_fma"):
        yield


# (cin, cout, h, w, kernel, stride, padding): ResNet's stride-2 3x3 layers (even planes:
# the last window short of the bottom-right padding) and an odd plane; output channels of
# one, two and three blocks and groups of two (40: 3 + 2) and four blocks (a remainder of
# one: 2 + 2); input channels in parts (64 x 9 taps is past a part's weights); 5x5 stride 1,
# a 2x3 kernel padded on the left and right only, 7x7 stride 2, unpadded 3x3 stride 1, a
# plane narrower than a tile, a single row, and rows wider than a run (segments)
LAYERS = [
    (64, 128, 14, 14, (3, 3), (2, 2), (1, 1)),
    (16, 24, 13, 11, (3, 3), (2, 2), (1, 1)),
    (8, 8, 9, 9, (3, 3), (2, 2), (1, 1)),
    (24, 16, 10, 10, (3, 3), (1, 1), (1, 1)),
    (32, 40, 12, 12, (3, 3), (2, 2), (1, 1)),
    (8, 32, 11, 9, (5, 5), (1, 1), (2, 2)),
    (16, 48, 9, 10, (2, 3), (2, 2), (0, 1)),
    (8, 16, 23, 19, (7, 7), (2, 2), (3, 3)),
    (16, 24, 10, 12, (3, 3), (1, 1), (0, 0)),
    (40, 16, 5, 3, (3, 3), (1, 1), (1, 1)),
    (16, 8, 1, 30, (1, 3), (2, 2), (0, 1)),
    (8, 24, 3, 300, (3, 3), (1, 1), (1, 1)),
]
EPILOGUES = [(1, True, "relu", False), (2, False, None, True), (1, True, "relu6", True),
             (1, False, "relu6", False)]


def _close(y, ref, k):
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=2e-6 * np.sqrt(k) * scale)


def test_nchwc_path_against_float64(nchwc_everywhere):
    # every tile width (rows cut into even tiles of 1 to 12, 6 or 4 pixels), every group
    # size, parts and segments, every epilogue, batches, plain and prepacked weights, on one
    # and two workers of symmetric and asymmetric pools, the copy in tasks of one and of
    # several blocks
    rng = np.random.default_rng(61)
    for spec, copy_bytes in (("c0:0", 32 << 10), ("c0:0-1", 1), ("c0:0@1,c1:1@0.5", 1 << 20)):
        with asymo.Pool(spec) as pool:
            conv_mod.ROWS_COPY_TASK_BYTES = copy_bytes
            for cin, cout, h, w, kern, stride, padding in LAYERS:
                pads = ((padding[0],) * 2, (padding[1],) * 2)
                for n, bias, act, res in EPILOGUES:
                    x = input_at_mapping_end(rng, (n, cin, h, w))
                    wt = (rng.standard_normal((cout, cin) + kern) / np.sqrt(cin)).astype(
                        np.float32)
                    b = rng.standard_normal(cout).astype(np.float32) if bias else None
                    oh = (h + 2 * padding[0] - kern[0]) // stride[0] + 1
                    ow = (w + 2 * padding[1] - kern[1]) // stride[1] + 1
                    r = rng.standard_normal((n, cout, oh, ow)).astype(np.float32) \
                        if res else None
                    plan = _plan(pool, x.shape, wt.shape, stride, pads, act, bias, res)
                    assert isinstance(plan, conv_mod._NchwcConvPlan), (cin, cout, h, w, kern)
                    k = cin * kern[0] * kern[1]
                    check_layer(pool, x, (wt, asymo.prepack_conv(wt)), b, stride, padding,
                                act, r, lambda y, ref: _close(y, ref, k), bound_calls=2)


def test_nchwc_path_propagates_nan_and_inf(nchwc_everywhere):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 64, 9, 9)).astype(np.float32)
    x[0, 5, 4, 4] = np.nan
    x[0, 6, 0, 8] = np.inf
    w = rng.standard_normal((40, 64, 3, 3)).astype(np.float32)
    assert conv_mod.conv_path(x.shape, w.shape, 2, 1) == "nchwc"
    for act in (None, "relu", "relu6"):
        y = conv2d(x, w, None, 2, 1, activation=act)
        ref = reference.conv2d(x.astype(np.float64), w.astype(np.float64), None, (2, 2),
                               ((1, 1), (1, 1)))
        ref = {None: ref, "relu": np.maximum(ref, 0), "relu6": np.clip(ref, 0, 6)}[act]
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(y[fin], ref[fin], rtol=1e-4, atol=1e-3)


def test_nchwc_path_only_where_it_applies(monkeypatch):
    # on AVX2: ResNet's stride-2 3x3 layers into 28 x 28 and 14 x 14 planes; not into 7 x 7
    # ones (weights 23x the image: NCHWC_MAX_WEIGHT_RATIO), not 1x1 layers, channels not in
    # multiples of 8, groups, dilation, stride 3, float64; the paths before it keep their
    # layers; "off": the GEMM
    with conv_mod.use_kernel_isa("avx2_fma"):
        def path(xs, ws, stride=1, pad=0, dilation=1, groups=1):
            return conv_mod.conv_path(xs, ws, stride, pad, dilation, groups)
        assert path((1, 128, 56, 56), (128, 128, 3, 3), 2, 1) == "nchwc"
        assert path((1, 64, 56, 56), (128, 64, 3, 3), 2, 1) == "nchwc"
        assert path((1, 256, 28, 28), (256, 256, 3, 3), 2, 1) == "nchwc"
        assert path((1, 512, 14, 14), (512, 512, 3, 3), 2, 1) == "gemm"
        assert path((1, 256, 56, 56), (512, 256, 1, 1), 2) == "gemm"
        assert path((1, 1024, 14, 14), (256, 1024, 1, 1)) == "gemm"
        assert path((1, 124, 28, 28), (128, 124, 3, 3), 2, 1) == "gemm"
        assert path((1, 128, 28, 28), (124, 128, 3, 3), 2, 1) == "gemm"
        assert path((1, 128, 28, 28), (128, 64, 3, 3), 2, 1, groups=2) == "gemm"
        assert path((1, 128, 28, 28), (128, 128, 3, 3), 1, 2, dilation=2) == "gemm"
        assert path((1, 128, 28, 28), (128, 128, 3, 3), 3, 1) == "gemm"
        assert path((1, 64, 28, 28), (64, 64, 3, 3), 1, 1).startswith("winograd")
        assert path((1, 3, 224, 224), (32, 3, 3, 3), 2, 1) == "rows"
        assert conv_mod._nchwc_job((1, 128, 56, 56), (128, 128, 3, 3), np.dtype(np.float64),
                                   (2, 2), ((1, 1), (1, 1)), (1, 1), 1, None) is None
        monkeypatch.setattr(conv_mod, "NCHWC", "off")
        assert path((1, 128, 56, 56), (128, 128, 3, 3), 2, 1) == "gemm"
    if "avx512" in supported_isas():
        monkeypatch.setattr(conv_mod, "NCHWC", "auto")
        with conv_mod.use_kernel_isa("avx512"):  # (the rows path's AVX-512 kernels there)
            assert conv_mod.conv_path((1, 128, 56, 56), (128, 128, 3, 3), 2, 1) == "rows"


def test_nchwc_path_tasks_copy_and_scratch():
    # the copy in tasks of about ROWS_COPY_TASK_BYTES of input blocks, plus one packing plain
    # weights; tasks cover every row and group; scratch holds the padded copy (every window's
    # extent) and, for plain weights, the packed ones
    pool = asymo.Pool("c0:0-1")
    try:
        with conv_mod.use_kernel_isa("avx2_fma"):
            p = _plan(pool, (1, 128, 56, 56), (128, 128, 3, 3), (2, 2), ((1, 1), (1, 1)))
            j = p.job
            assert isinstance(p, conv_mod._NchwcConvPlan)
            assert p.prepare[False][0] == p.prepare[True][0] + 1
            assert p.prepare[True][0] == -(-16 // int(j.copy_blocks))
            plane = -(-57 * 57 * 8 // 16) * 16  # (27 * 2 + 3 rows and columns; 64-byte blocks)
            assert int(conv_mod.lib.asymo_dense_blocked_plane(j)) == plane
            assert int(j.copy_blocks) == max(1, conv_mod.ROWS_COPY_TASK_BYTES // (4 * plane))
            assert p.scratch_elems == 16 * plane + 128 * 128 * 9
            groups = int(conv_mod.lib.asymo_pointwise_blocked_groups(128))
            assert p.ntasks == (-(-28 // int(j.rows_per_task))
                                * -(-groups // int(j.groups_per_task)))
            assert p.ntasks % 2 == 0 and p.ntasks >= 8
    finally:
        pool.close()
