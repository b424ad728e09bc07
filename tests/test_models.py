"""The layer zoo: chain structure against Pipe-it Table I, descriptors against Eq. 3-4 and the
literature, forward passes against the direct reference and torch."""
import os
import threading

import numpy as np
import pytest

import asymo
import asymo.models
from asymo.models import reference
from asymo.models.spec import Conv
from asymo.models.torch_backend import torch_available, torch_forward

needs_torch = pytest.mark.skipif(not torch_available(), reason="torch is not installed")

NAMES = ["alexnet", "googlenet", "mobilenet_v1", "resnet50", "squeezenet", "vgg16"]
# nodes of the chain: modules (Inception, Fire, bottleneck) are single nodes
CHAIN_LENGTHS = {"alexnet": 8, "googlenet": 13, "mobilenet_v1": 28, "resnet50": 18,
                 "squeezenet": 10, "vgg16": 16}
# Pipe-it Table I, "Major" column (VGG-16 is not in the table: 13 conv + 3 FC)
TABLE_I = {"alexnet": 11, "googlenet": 58, "mobilenet_v1": 28, "resnet50": 54,
           "squeezenet": 26, "vgg16": 16}
# multiply-adds per image from the literature: AlexNet (grouped, 227) 724M; GoogLeNet 1.55G
# and VGG-16 15.3G (MobileNet paper, Table 8); MobileNet V1 569M (ibid.); ResNet-50 v1.5
# 4.09G (torchvision); SqueezeNet v1.0 at 227: 837M (Iandola et al.'s released model).
PUBLISHED_MACS = {"alexnet": 724e6, "googlenet": 1550e6, "mobilenet_v1": 569e6,
                  "resnet50": 4.09e9, "squeezenet": 837e6, "vgg16": 15.3e9}
# small inputs that keep every layer of each network valid (for the slow reference)
SMALL = {"alexnet": 67, "googlenet": 32, "mobilenet_v1": 64, "resnet50": 32,
         "squeezenet": 51, "vgg16": 32}


def _images(model, n=1, seed=1):
    return np.random.default_rng(seed).standard_normal((n,) + model.input_shape) \
        .astype(np.float32)


def _assert_close(y, ref, rtol=2e-5):
    scale = float(np.max(np.abs(ref)))
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=rtol * scale)


def test_names_and_lazy_attribute():
    assert asymo.models.names() == NAMES
    assert "models" in dir(asymo) and "conv2d" in dir(asymo)
    with pytest.raises(ValueError, match="unknown model 'lenet'"):
        asymo.models.get("lenet")
    with pytest.raises(ValueError, match="seed"):
        asymo.models.get("resnet50", seed=-1)
    with pytest.raises(ValueError, match="use a larger image_size"):
        asymo.models.get("vgg16", image_size=16)


@pytest.mark.parametrize("name", NAMES)
def test_chain_and_table_i_counts(name):
    m = asymo.models.get(name)
    assert len(m.layers) == CHAIN_LENGTHS[name]
    assert m.major_count() == TABLE_I[name]
    assert m.layers[0].input_shape == m.input_shape
    assert m.output_shape == (1000,)
    for i, layer in enumerate(m.layers):
        assert layer.index == i
        if i:
            assert layer.input_shape == m.layers[i - 1].output_shape
        assert layer.kind in {"conv", "dwconv", "fc", "inception", "fire", "residual"}
    kinds = [layer.kind for layer in m.layers]
    expected = {"googlenet": ("inception", 9), "squeezenet": ("fire", 8),
                "resnet50": ("residual", 16), "mobilenet_v1": ("dwconv", 13)}
    if name in expected:
        kind, count = expected[name]
        assert kinds.count(kind) == count


@pytest.mark.parametrize("name", NAMES)
def test_flops_match_published_and_gemm_dims(name):
    m = asymo.models.get(name)
    assert m.flops / 2 == pytest.approx(PUBLISHED_MACS[name], rel=0.03)
    total = 0
    for layer in m.layers:
        # Eq. 4: N*K*M multiply-adds per weighted layer
        assert layer.flops == 2 * sum(n * k * mm for n, k, mm in layer.gemm_list)
        assert layer.gemm_dims in layer.gemm_list
        for step in layer.weighted:
            if isinstance(step, Conv):
                _, oh, ow = step.out_shape
                n, k, mm = step.gemm_dims
                assert (n, k, mm) == (oh * ow, step.kernel[0] * step.kernel[1]
                                      * step.in_channels // step.groups, step.out_channels)
                # Eq. 3
                h = step.in_shape[1]
                assert oh == (h - step.kernel[0] + 2 * step.padding[0]) // step.stride[0] + 1
                if step.depthwise:
                    total += step.flops
        total += sum(2 * mm * k * n for mm, k, n in layer.matmul_shapes())
    # everything that is not depthwise runs as the listed matmuls
    assert total == m.flops
    assert len(m.matmul_shapes()) == sum(len(layer.matmul_shapes()) for layer in m.layers)


def test_known_descriptors():
    r = asymo.models.get("resnet50")
    assert r.layers[0].gemm_dims == (112 * 112, 7 * 7 * 3, 64)
    assert (r.layers[0].kernel, r.layers[0].stride, r.layers[0].padding) == ((7, 7), (2, 2),
                                                                            (3, 3))
    res3a = r.layers[4]
    assert res3a.name == "res3a" and res3a.kind == "residual"
    assert res3a.input_shape == (256, 56, 56) and res3a.output_shape == (512, 28, 28)
    assert res3a.gemm_dims == (28 * 28, 3 * 3 * 128, 128) and res3a.stride == (2, 2)
    assert len(res3a.gemm_list) == 4  # three convolutions + the projection shortcut
    assert r.layers[-1].gemm_dims == (1, 2048, 1000)
    assert r.layers[-1].matmul_shapes() == [(1000, 2048, 1)]  # weight[out x in] @ x

    mb = asymo.models.get("mobilenet_v1")
    dw = mb.layers[1]
    assert dw.kind == "dwconv" and dw.groups == 32
    assert dw.gemm_dims == (112 * 112, 9, 32) and dw.matmul_shapes() == []
    assert mb.layers[2].matmul_shapes() == [(64, 32, 112 * 112)]

    a = asymo.models.get("alexnet")
    assert a.layers[1].groups == 2 and a.layers[1].major_count == 2
    assert a.layers[1].gemm_dims == (27 * 27, 5 * 5 * 48, 256)
    assert a.layers[1].matmul_shapes() == [(128, 1200, 729)] * 2

    g = asymo.models.get("googlenet")
    i3a = g.layers[3]
    assert i3a.name == "inception_3a" and i3a.output_shape == (256, 28, 28)
    assert i3a.major_count == 6 and len(i3a.gemm_list) == 6
    assert g.layers[4].output_shape == (480, 14, 14)  # 3b, with the max pool after it

    s = asymo.models.get("squeezenet")
    assert s.layers[1].gemm_list == [(55 * 55, 96, 16), (55 * 55, 16, 64), (55 * 55, 144, 64)]
    d = s.layers[1].describe()
    assert d["kind"] == "fire" and d["major_count"] == 3 and d["output_shape"] == [128, 55, 55]
    assert "res2a" in r.summary()


@pytest.mark.parametrize("name", NAMES)
def test_small_models_match_reference(name):
    m = asymo.models.get(name, image_size=SMALL[name])
    x = _images(m, n=2)
    last = len(m.layers) - 1
    # the activations before the classifier carry the comparison; then the classifier alone
    # (the reference result feeds both, so errors do not compound), then the whole model
    pre, ref_pre = m.run_layers(x, 0, last - 1), reference.forward(m, x, 0, last - 1)
    _assert_close(pre, ref_pre)
    ref_out = reference.forward(m, ref_pre.astype(np.float32), last, last)
    _assert_close(m.run_layers(ref_pre.astype(np.float32), last, last), ref_out)
    _assert_close(m.run_layers(pre, last, last), ref_out)


@pytest.mark.parametrize("name", ["mobilenet_v1", "squeezenet"])
def test_full_size_models_match_reference(name):
    m = asymo.models.get(name)
    x = _images(m)
    _assert_close(m.run(x), reference.forward(m, x))


@needs_torch
@pytest.mark.parametrize("name", ["alexnet", "googlenet", "mobilenet_v1", "resnet50",
                                  "squeezenet"])
def test_full_size_models_match_torch(name):
    m = asymo.models.get(name)
    x = _images(m)
    last = len(m.layers) - 1
    pre, ref_pre = m.run_layers(x, 0, last - 1), torch_forward(m, x, 0, last - 1)
    _assert_close(pre, ref_pre, rtol=1e-4)
    _assert_close(m.run_layers(pre, last, last), torch_forward(m, ref_pre, last, last),
                  rtol=1e-4)


@needs_torch
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("ASYMO_SLOW_TESTS"),
                    reason="550 MB of weights; set ASYMO_SLOW_TESTS=1 to run")
def test_full_size_vgg16_matches_torch():
    m = asymo.models.get("vgg16")
    x = _images(m)
    _assert_close(m.run(x), torch_forward(m, x), rtol=1e-4)


def test_run_layers_composes_into_run():
    m = asymo.models.get("resnet50", image_size=64)
    x = _images(m, n=2)
    full = m.run(x)
    a = m.run_layers(x, 0, 6)
    assert a.shape == (2,) + m.layers[6].output_shape
    b = m.run_layers(a, 7, 12)
    c = m.run_layers(b, 13, len(m.layers) - 1)
    np.testing.assert_array_equal(c, full)
    single = m.run(x[0])
    assert single.shape == (1000,)
    _assert_close(single, full[0])
    np.testing.assert_allclose(full.sum(axis=1), 1.0, rtol=1e-5)


def test_bad_inputs():
    m = asymo.models.get("squeezenet", image_size=67)
    x = _images(m)
    with pytest.raises(ValueError, match=r"\(3, 67, 67\)"):
        m.run(x[:, :, :60])
    with pytest.raises(ValueError, match=r"\(96, 15, 15\)"):
        m.run_layers(x, 1, 2)
    with pytest.raises(IndexError, match="out of range"):
        m.run_layers(x, 0, 10)
    with pytest.raises(ValueError, match="after"):
        m.run_layers(x, 3, 2)
    with pytest.raises(TypeError, match="int"):
        m.run_layers(x, 0.0, 2)
    with pytest.raises(TypeError, match="numeric"):
        m.run(np.full((1,) + m.input_shape, "a"))
    with pytest.raises(ValueError, match="empty batch"):
        m.run(x[:0])


def test_weights_are_seeded_read_only_and_shared():
    a = asymo.models.get("mobilenet_v1", seed=3, image_size=32)
    b = asymo.models.get("mobilenet_v1", seed=3, image_size=32)
    c = asymo.models.get("mobilenet_v1", seed=4, image_size=32)
    step = a.layers[2].weighted[0]
    wa, ba = a.parameters(step)
    np.testing.assert_array_equal(wa, b.parameters(step)[0])
    assert not np.array_equal(wa, c.parameters(step)[0])
    assert wa.dtype == np.float32 and wa.shape == (64, 32, 1, 1)
    fc = a.layers[-1].weighted[0]
    assert a.parameters(fc)[0].shape == (1000, 1024)  # (out_features, in_features)
    assert not wa.flags.writeable and not ba.flags.writeable
    with pytest.raises(ValueError):
        wa[0, 0, 0, 0] = 1.0
    assert a.parameters(step)[0] is wa  # the same array on every call


def test_concurrent_runs_share_weights_and_agree():
    m = asymo.models.get("googlenet", image_size=64)
    x = _images(m, n=1)
    results = {}

    def work(i):
        results[i] = m.run(x)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        np.testing.assert_array_equal(results[i], results[0])
    np.testing.assert_array_equal(m.run(x), results[0])
