"""The rows path of convolutions (asymo/conv.h, conv/conv_rows.c): the pointwise path's
pixel-row micro-kernels over any convolution's taps, the image read in place or from a padded
copy; against float64."""
import numpy as np
import pytest

import asymo
from asymo.models import reference
from asymo.ops import conv as conv_mod
from asymo.ops.conv import conv2d
from asymo.plan.gemm import supported_isas
from _conv_checks import check_layer, input_at_mapping_end


def _available(isa):
    if isa not in supported_isas():
        return False
    with conv_mod.use_kernel_isa(isa):
        return conv_mod._rows_job((1, 64, 9, 9), (32, 64, 3, 3), np.dtype(np.float32), (2, 2),
                                  ((1, 1), (1, 1)), (1, 1), 1, None) is not None


needs_avx512 = pytest.mark.skipif(not _available("avx512"), reason="no AVX-512 rows kernels here")


def _pads(p):
    return ((p[0], p[0]), (p[1], p[1]))


def _reference(x, w, b, stride, pads, act, r):
    ref = reference.conv2d(x.astype(np.float64), w.astype(np.float64),
                           None if b is None else b.astype(np.float64), stride, pads)
    ref = ref + (0 if r is None else r)
    return {None: ref, "relu": np.maximum(ref, 0), "relu6": np.clip(ref, 0, 6)}[act]


def _close(y, ref, k):
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=2e-6 * np.sqrt(k) * scale)


def _plan(pool, xs, ws, stride, pads, act=None, bias=False, res=False):
    return conv_mod._conv_plan(pool, xs, ws, np.dtype(np.float32), stride, pads, (1, 1), 1,
                               act, bias, res)[0]


# (cin, cout, h, w, kernel, stride, pads): stride-2 3x3 with padding on the top and left only
# (even planes) and on all sides (odd), 1x1 stride 2 read in place, 5x5 stride 1 padded, 3x3
# stride 1 unpadded (read in place, windows short of the bottom-right), a 2x3 kernel padded
# on the left and right only, a 7x7 stride-2 layer, a plane narrower than a tile, one of a
# single row, and rows of several tiles whose tasks (and copy's bands) begin inside a row
LAYERS = [
    (32, 40, 14, 14, (3, 3), (2, 2), (1, 1)),
    (29, 64, 13, 11, (3, 3), (2, 2), (1, 1)),
    (256, 96, 13, 14, (1, 1), (2, 2), (0, 0)),
    (12, 50, 11, 9, (5, 5), (1, 1), (2, 2)),
    (30, 33, 10, 12, (3, 3), (1, 1), (0, 0)),
    (20, 48, 9, 10, (2, 3), (2, 2), (0, 1)),
    (8, 70, 23, 19, (7, 7), (2, 2), (3, 3)),
    (40, 31, 5, 3, (3, 3), (1, 1), (1, 1)),
    (64, 40, 1, 30, (1, 3), (2, 2), (0, 1)),
    (24, 60, 7, 25, (3, 3), (1, 1), (1, 1)),
]
EPILOGUES = [(1, True, "relu", False), (2, False, None, True), (1, True, "relu6", True),
             (1, False, "relu6", False)]


def _check(pool, layers, epilogues, rng, panel):
    for cin, cout, h, w, kern, stride, padding in layers:
        pads = _pads(padding)
        for n, bias, act, res in epilogues:
            x = input_at_mapping_end(rng, (n, cin, h, w))
            wt = (rng.standard_normal((cout, cin) + kern) / np.sqrt(cin)).astype(np.float32)
            b = rng.standard_normal(cout).astype(np.float32) if bias else None
            oh = (h + sum(pads[0]) - kern[0]) // stride[0] + 1
            ow = (w + sum(pads[1]) - kern[1]) // stride[1] + 1
            r = rng.standard_normal((n, cout, oh, ow)).astype(np.float32) if res else None
            plan = _plan(pool, x.shape, wt.shape, stride, pads, act, bias, res)
            assert isinstance(plan, conv_mod._RowsConvPlan), (cin, cout, h, w, kern)
            assert plan.job.panel_rows == panel
            k = cin * kern[0] * kern[1]
            # (the bound form twice: the padded copy and panels made again)
            check_layer(pool, x, (wt, asymo.prepack_conv(wt)), b, stride, padding, act, r,
                        lambda y, ref: _close(y, ref, k), bound_calls=2)


@pytest.mark.parametrize("isa, panel", [("avx512", 32), ("avx512", 48), ("avx512", 64),
                                        ("avx2_fma", 8), ("avx2_fma", 16), ("avx2_fma", 24)])
def test_rows_path_against_float64(isa, panel, monkeypatch):
    # every panel width of each ISA's kernels (AVX-512: tiles of 1 to 12, 8 or 6 pixels;
    # AVX2: 1 to 12, 6 or 4; rows cut into even tiles), output channels below, at and past a
    # panel, every epilogue, batches, plain and prepacked weights, on one to two workers of
    # symmetric and asymmetric pools, the copy in tasks of one and of several channels and in
    # the layer's bands of output rows
    if not _available(isa):
        pytest.skip(f"no {isa} rows kernels here")
    monkeypatch.setattr(conv_mod, "POINTWISE_ROWS_PANELS", (panel,))
    monkeypatch.setattr(conv_mod, "POINTWISE_ROWS_PANELS_AVX2", (panel,))
    # (on AVX2 every layer here takes the rows form)
    monkeypatch.setattr(conv_mod, "ROWS_AVX2_MAX_OUT_CHANNELS", 1 << 20)
    monkeypatch.setattr(conv_mod, "ROWS_AVX2_MAX_WEIGHT_BYTES", 1 << 40)
    monkeypatch.setattr(conv_mod, "ROWS_AVX2_MAX_EXPANSION", 1 << 20)
    monkeypatch.setattr(conv_mod, "WINOGRAD", "off")  # (3x3 stride 1 here too)
    rng = np.random.default_rng(50 + panel)
    for spec, copy_bytes, bands in (("c0:0", 32 << 10, True), ("c0:0-1", 1, False),
                                    ("c0:0-1", 32 << 10, True),
                                    ("c0:0@1,c1:1@0.5", 1 << 20, True)):
        monkeypatch.setattr(conv_mod, "ROWS_COPY_TASK_BYTES", copy_bytes)
        monkeypatch.setattr(conv_mod, "ROWS_COPY_BANDS", bands)
        with asymo.Pool(spec) as pool, conv_mod.use_kernel_isa(isa):
            _check(pool, LAYERS, EPILOGUES, rng, panel)


@pytest.mark.skipif(not _available("avx2_fma"), reason="no AVX2 rows kernels here")
def test_rows_form_on_avx2_only_where_it_ran_faster():
    # ROWS_AVX2_*: at most 192 output channels, under 256 KB of weights, 4 outputs per input
    # (the stems and narrow layers of MobileNet V2 and SqueezeNet take it; their expansions,
    # wide layers and classifiers stay GEMMs)
    f32, one, none = np.dtype(np.float32), (1, 1), ((0, 0), (0, 0))
    with conv_mod.use_kernel_isa("avx2_fma"):
        def path(xs, ws, stride=1, pad=0):
            return conv_mod.conv_path(xs, ws, stride, pad, 1, 1)
        assert path((1, 3, 224, 224), (32, 3, 3, 3), 2, 1) == "rows"
        assert path((1, 32, 112, 112), (16, 32, 1, 1)) == "pointwise rows"
        assert path((1, 576, 14, 14), (96, 576, 1, 1)) == "pointwise rows"
        assert path((1, 48, 13, 13), (192, 48, 1, 1)) == "pointwise rows"  # 4 per input
        assert path((1, 16, 112, 112), (96, 16, 1, 1)) == "gemm"  # 6 per input
        assert path((1, 64, 13, 13), (256, 64, 1, 1)) == "gemm"  # 256 channels
        assert path((1, 512, 28, 28), (128, 512, 1, 1)) == "gemm"  # 256 KB
        assert path((1, 512, 13, 13), (1000, 512, 1, 1)) == "gemm"
        assert path((1, 64, 56, 56), (128, 64, 3, 3), 2, 1) == "nchwc"  # 288 KB: not rows
        assert path((1, 16, 28, 28), (32, 16, 5, 5), 1, 2) == "rows"
        pw = conv_mod._pointwise_job((1, 32, 8, 8), (16, 32, 1, 1), f32, one, none, one, 1,
                                     None, False)
        assert pw.form == conv_mod.lib.ASYMO_POINTWISE_ROWS and pw.panel_rows == 16
        assert conv_mod._pointwise_job((1, 32, 8, 8), (24, 32, 1, 1), f32, one, none, one, 1,
                                       None, False).panel_rows == 24
        # a network's 3x3 layers of few input channels (cold weights) stay on Winograd here
        # (ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2; the AVX-512 rows form takes them)
        for c, k, hw in ((16, 64, 55), (32, 128, 27)):
            assert conv_mod.conv_path((1, c, hw, hw), (k, c, 3, 3), padding=1,
                                      activation="relu", cold_weights=True) == "winograd F(4x4)"
        saved = conv_mod.ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2
        try:
            conv_mod.ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2 = 32
            assert conv_mod.conv_path((1, 16, 55, 55), (64, 16, 3, 3), padding=1,
                                      activation="relu", cold_weights=True) == "rows"
        finally:
            conv_mod.ROWS_OVER_WINOGRAD_CHANNELS_COLD_AVX2 = saved


@needs_avx512
def test_rows_path_propagates_nan_and_inf():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 64, 9, 9)).astype(np.float32)
    x[0, 5, 4, 4] = np.nan
    x[0, 6, 0, 8] = np.inf
    w = rng.standard_normal((40, 64, 3, 3)).astype(np.float32)
    with conv_mod.use_kernel_isa("avx512"):
        assert isinstance(_plan(asymo.get_pool(), x.shape, w.shape, (2, 2), ((1, 1), (1, 1))),
                          conv_mod._RowsConvPlan)
        for act in (None, "relu", "relu6"):
            y = conv2d(x, w, None, 2, 1, activation=act)
            ref = _reference(x, w, None, (2, 2), ((1, 1), (1, 1)), act, None)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
            fin = np.isfinite(ref)
            np.testing.assert_allclose(y[fin], ref[fin], rtol=1e-4, atol=1e-3)


@needs_avx512
def test_rows_path_only_where_it_applies(monkeypatch):
    # stride 1 or 2, dilation 1, one group, float32, AVX-512 kernels; the paths before it
    # keep their layers (Winograd's 3x3 stride 1, the
    # indirect stems, the pointwise 1x1 stride 1); "off": the GEMM
    pool = asymo.get_pool()
    with conv_mod.use_kernel_isa("avx512"):
        assert isinstance(_plan(pool, (1, 128, 56, 56), (128, 128, 3, 3), (2, 2),
                                ((1, 1), (1, 1))), conv_mod._RowsConvPlan)
        assert isinstance(_plan(pool, (1, 256, 56, 56), (512, 256, 1, 1), (2, 2),
                                ((0, 0), (0, 0))), conv_mod._RowsConvPlan)
        assert isinstance(_plan(pool, (1, 32, 28, 28), (96, 32, 5, 5), (1, 1),
                                ((2, 2), (2, 2))), conv_mod._RowsConvPlan)
        assert isinstance(_plan(pool, (1, 64, 28, 28), (64, 64, 3, 3), (1, 1),
                                ((1, 1), (1, 1))), conv_mod._WinogradConvPlan)
        # ... but not at 7 x 7 (ROWS_OVER_WINOGRAD_WIDTH)
        assert isinstance(_plan(pool, (1, 64, 7, 7), (64, 64, 3, 3), (1, 1),
                                ((1, 1), (1, 1))), conv_mod._RowsConvPlan)
        assert isinstance(_plan(pool, (1, 64, 8, 8), (64, 64, 3, 3), (1, 1),
                                ((1, 1), (1, 1))), conv_mod._WinogradConvPlan)
        # ... and, where the weights are cold (a network's bound layers), up to 13 x 13
        # (ROWS_OVER_WINOGRAD_WIDTH_COLD) or at any width with at most
        # ROWS_OVER_WINOGRAD_CHANNELS_COLD input channels
        limit = conv_mod.ROWS_OVER_WINOGRAD_CHANNELS_COLD
        for c, k, hw, cold, kind in ((64, 256, 13, False, conv_mod._WinogradConvPlan),
                                     (64, 256, 13, True, conv_mod._RowsConvPlan),
                                     (64, 256, 14, True, conv_mod._WinogradConvPlan),
                                     (limit, 64, 55, True, conv_mod._RowsConvPlan),
                                     (limit, 64, 55, False, conv_mod._WinogradConvPlan),
                                     (limit + 8, 64, 55, True, conv_mod._WinogradConvPlan)):
            plan = conv_mod._conv_plan(pool, (1, c, hw, hw), (k, c, 3, 3),
                                       np.dtype(np.float32), (1, 1), ((1, 1), (1, 1)), (1, 1),
                                       1, "relu", True, False, cold_weights=cold)[0]
            assert isinstance(plan, kind), (c, hw, cold)
            assert conv_mod.conv_path((1, c, hw, hw), (k, c, 3, 3), padding=1,
                                      activation="relu", cold_weights=cold) == (
                "rows" if kind is conv_mod._RowsConvPlan else "winograd F(4x4)")
        # the 7x7 stride-2 stem, which the indirect path takes too: a stem both take runs on
        # the rows path (docs/conv-and-zoo.md)
        assert isinstance(_plan(pool, (1, 3, 224, 224), (64, 3, 7, 7), (2, 2),
                                ((3, 3), (3, 3))), conv_mod._RowsConvPlan)
        assert isinstance(_plan(pool, (1, 64, 28, 28), (64, 64, 1, 1), (1, 1),
                                ((0, 0), (0, 0))), conv_mod._PointwisePlan)
        assert isinstance(_plan(pool, (1, 16, 20, 20), (32, 16, 3, 3), (2, 2),
                                ((1, 1), (1, 1))), conv_mod._RowsConvPlan)  # (144 taps)
        assert isinstance(_plan(pool, (1, 64, 20, 20), (32, 64, 3, 3), (3, 3),
                                ((1, 1), (1, 1))), conv_mod._GemmConvPlan)
        assert conv_mod._rows_job((1, 64, 20, 20), (32, 64, 3, 3), np.dtype(np.float64),
                                  (2, 2), ((1, 1), (1, 1)), (1, 1), 1, None) is None
        assert conv_mod._rows_job((1, 64, 20, 20), (32, 32, 3, 3), np.dtype(np.float32),
                                  (2, 2), ((1, 1), (1, 1)), (1, 1), 2, None) is None
        assert conv_mod._rows_job((1, 64, 20, 20), (32, 64, 3, 3), np.dtype(np.float32),
                                  (2, 2), ((1, 1), (1, 1)), (2, 2), 1, None) is None
        monkeypatch.setattr(conv_mod, "ROWS", "off")
        assert isinstance(_plan(pool, (1, 128, 56, 56), (128, 128, 3, 3), (2, 2),
                                ((1, 1), (1, 1))), conv_mod._GemmConvPlan)
    with conv_mod.use_kernel_isa("avx2_fma"):
        monkeypatch.setattr(conv_mod, "ROWS", "auto")
        assert conv_mod._rows_job((1, 128, 56, 56), (128, 128, 3, 3), np.dtype(np.float32),
                                  (2, 2), ((1, 1), (1, 1)), (1, 1), 1, None) is None


@needs_avx512
def test_rows_path_panel_width_keeps_tiles_whole():
    # the fewest padded channels first; then tiles of at least ROWS_MIN_TILE pixels (a
    # 7-pixel row: one tile of 7 with 32-channel panels, not 3 + 4 with 64-channel ones);
    # the widest panel among equals
    with conv_mod.use_kernel_isa("avx512"):
        def width(xs, ws, s, p):
            return int(conv_mod._rows_job(xs, ws, np.dtype(np.float32), (s, s), ((p, p),) * 2,
                                          (1, 1), 1, None).panel_rows)

        assert width((1, 512, 14, 14), (512, 512, 3, 3), 2, 1) == 32   # 7 wide
        assert width((1, 256, 28, 28), (256, 256, 3, 3), 2, 1) == 32   # 14 wide: 3 x 4-5
        assert width((1, 128, 56, 56), (128, 128, 3, 3), 2, 1) == 64   # 28 wide: 5 x 5-6
        assert width((1, 32, 28, 28), (96, 32, 5, 5), 1, 2) == 48      # 96 = 2 x 48


@needs_avx512
def test_rows_path_tasks_and_copy(monkeypatch):
    # the padded copy only where the windows reach past the image; task counts cover every
    # panel and tile; the copy in the layer's bands of output rows where its tasks are such
    # bands (one task per band: task t of both jobs on the same worker), else in tasks of
    # about ROWS_COPY_TASK_BYTES
    pool = asymo.Pool("c0:0-1")
    try:
        with conv_mod.use_kernel_isa("avx512"):
            for bands in (True, False):
                monkeypatch.setattr(conv_mod, "ROWS_COPY_BANDS", bands)
                p = _plan(pool, (1, 128, 56, 56), (128, 128, 3, 3), (2, 2), ((1, 1), (1, 1)))
                assert conv_mod.lib.asymo_conv_rows_padded(p.job)
                assert p.prepare[False][0] == p.prepare[True][0] + 1
                panels = -(-128 // int(p.job.panel_rows))
                assert int(p.job.panels_per_task) >= panels  # tasks are bands of rows
                assert p.prepare[True][0] == (p.ntasks if bands
                                              else -(-128 // int(p.job.copy_channels)))
                assert p.ntasks % 2 == 0 and p.ntasks >= 8
                assert p.prepare[True][1] == p.counts or not bands
            # tasks split by panels (a 7 x 7 layer's weights outweigh its image): by channels
            monkeypatch.setattr(conv_mod, "ROWS_COPY_BANDS", True)
            p = _plan(pool, (1, 256, 14, 14), (512, 256, 3, 3), (2, 2), ((1, 1), (1, 1)))
            assert int(p.job.panels_per_task) < -(-512 // int(p.job.panel_rows))
            assert p.prepare[True][0] == -(-256 // int(p.job.copy_channels))
            q = _plan(pool, (1, 256, 56, 56), (512, 256, 1, 1), (2, 2), ((0, 0), (0, 0)))
            assert not conv_mod.lib.asymo_conv_rows_padded(q.job)
            assert q.prepare[False][0] == 1 and q.prepare[True][0] == 0
            j = q.job
            tiles = int(conv_mod.lib.asymo_conv_rows_tiles(j))
            assert int(j.panel_rows) == 64 and tiles == 28 * -(-28 // 6)
            assert q.ntasks == (-(-512 // 64 // j.panels_per_task)
                                * -(-tiles // j.tiles_per_task))
    finally:
        pool.close()


@needs_avx512
def test_network_layers_of_small_planes_take_the_rows_path():
    # a model binds its layers with cold weights: a 3x3 layer of a 13 x 13 plane runs the
    # rows path there, Winograd when called alone, and both give torch's result
    torch = pytest.importorskip("torch")
    from asymo.models.torch_loader import export_onnx_bytes

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(48, 64, 1), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 192, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 48, 13, 13)
    with conv_mod.use_kernel_isa("avx512"):
        model = asymo.from_onnx(export_onnx_bytes(net, x))
        kinds = [k for k in model.plan().kernels.values() if k.startswith("conv2d")]
        assert len(kinds) == 2 and kinds[1] == "conv2d:rows"
        with torch.no_grad():
            ref = net(x).numpy()
        pool = asymo.get_pool()
        np.testing.assert_allclose(model(x.numpy(), pool=pool), ref, rtol=1e-4, atol=1e-4)
        # the plan the model bound (not only its label)
        bound = [p for key, p in conv_mod._plan_cache.get(pool, {}).items()
                 if key[0] == (1, 64, 13, 13) and key[-1]]
        assert bound and all(isinstance(p, conv_mod._RowsConvPlan) for p in bound)
        w = net[2].weight.detach().numpy()
        assert conv_mod.conv_path((1, 64, 13, 13), w.shape, padding=1) == "winograd F(4x4)"
