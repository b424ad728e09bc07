"""The six CNNs of the zoo as chains of major layers (Pipe-it Table I; AsyMo section 6).

Each network is the classic inference graph (dropout removed, batch normalisation folded into
the convolution bias, auxiliary classifiers dropped):

=============  =====================================================  ======  ======  =========
name           source                                                  input   chain   Table I
=============  =====================================================  ======  ======  =========
alexnet        Krizhevsky et al. 2012, BVLC Caffe (groups=2, LRN)      227     8       11
googlenet      Szegedy et al. 2015, BVLC Caffe (5x5 branches, LRN)     224     13      58
mobilenet_v1   Howard et al. 2017, width 1.0 (ReLU6, BN folded)        224     28      28
resnet50       He et al. 2016, v1.5 (stride in the 3x3), BN folded     224     18      54
squeezenet     Iandola et al. 2016, v1.0                               227     10      26
vgg16          Simonyan & Zisserman 2015, configuration D              224     16      (16)
=============  =====================================================  ======  ======  =========

"chain" is the number of nodes (``len(model.layers)``): Inception, Fire and residual
(bottleneck) modules are single nodes, and pooling / LRN / softmax belong to the weighted layer
before them (Pipe-it III-B). "Table I" is the major-layer count Pipe-it reports for ARM-CL, which
counts the convolutions inside modules and makes each group of AlexNet's three grouped
convolutions a node; ``model.major_count()`` reproduces it. Pipe-it lists ResNet-50's
"4 residual blocks" (the four stages); the chain here uses the 16 bottleneck units inside them,
the finest split points without a branch.

``image_size`` builds the same network for a smaller (or larger) square input; the final
average pool of GoogLeNet, MobileNet, ResNet-50 and SqueezeNet is global (as it is at the default
size), and the first fully-connected layer of AlexNet and VGG-16 takes whatever the convolutions
produce. Sizes for which a layer would have no output raise ``ValueError``.
"""
from __future__ import annotations

from asymo.models.spec import (
    LRN, Concat, Conv, Flatten, Layer, Linear, Pool, Residual, Softmax, conv_output_size,
    pool_output_size,
)

__all__ = ["BUILDERS", "DEFAULT_SIZES", "TABLE_I_MAJOR_COUNTS", "build_layers"]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class _Steps:
    """Builds a sequence of steps from an input shape, tracking the current shape."""

    def __init__(self, shape, where):
        self.shape = tuple(shape)
        self.steps = []
        self.where = where

    def _check(self, what, shape):
        if any(d < 1 for d in shape):
            raise ValueError(f"{self.where}: {what} has no output for input shape "
                             f"{self.shape} (output {shape}); use a larger image_size")

    def conv(self, name, cout, k, s=1, p=0, g=1, act="relu", d=1):
        c, h, w = self.shape
        k, s, p, d = _pair(k), _pair(s), _pair(p), _pair(d)
        out = (cout, conv_output_size(h, k[0], s[0], p[0], d[0]),
               conv_output_size(w, k[1], s[1], p[1], d[1]))
        self._check(f"convolution {name}", out)
        self.steps.append(Conv(name=name, in_shape=self.shape, out_shape=out, kernel=k,
                               stride=s, padding=p, dilation=d, groups=g, activation=act))
        self.shape = out
        return self

    def _pool(self, kind, k, s, p=0, ceil=False):
        c, h, w = self.shape
        k, s, p = _pair(k), _pair(s), _pair(p)
        out = (c, pool_output_size(h, k[0], s[0], p[0], ceil),
               pool_output_size(w, k[1], s[1], p[1], ceil))
        self._check(f"{kind} pool", out)
        self.steps.append(Pool(kind=kind, in_shape=self.shape, out_shape=out, kernel=k,
                               stride=s, padding=p, ceil_mode=ceil))
        self.shape = out
        return self

    def maxpool(self, k, s, p=0, ceil=False):
        return self._pool("max", k, s, p, ceil)

    def global_avgpool(self):
        out = (self.shape[0], 1, 1)
        self.steps.append(Pool(kind="avg", in_shape=self.shape, out_shape=out))
        self.shape = out
        return self

    def lrn(self, size=5, alpha=1e-4, beta=0.75, k=1.0):
        self.steps.append(LRN(in_shape=self.shape, out_shape=self.shape, size=size,
                              alpha=alpha, beta=beta, k=k))
        return self

    def flatten(self):
        out = (self.shape[0] * self.shape[1] * self.shape[2],)
        self.steps.append(Flatten(in_shape=self.shape, out_shape=out))
        self.shape = out
        return self

    def linear(self, name, out_features, act="relu"):
        if len(self.shape) != 1:
            self.flatten()
        out = (out_features,)
        self.steps.append(Linear(name=name, in_shape=self.shape, out_shape=out,
                                 activation=act))
        self.shape = out
        return self

    def softmax(self):
        self.steps.append(Softmax(in_shape=self.shape, out_shape=self.shape))
        return self

    def concat(self, *branch_builders):
        outs = []
        for build in branch_builders:
            b = _Steps(self.shape, self.where)
            build(b)
            outs.append(b)
        hw = {b.shape[1:] for b in outs}
        if len(hw) != 1:  # pragma: no cover - a zoo definition error
            raise ValueError(f"{self.where}: branch outputs differ in size: {hw}")
        out = (sum(b.shape[0] for b in outs),) + outs[0].shape[1:]
        self.steps.append(Concat(branches=tuple(tuple(b.steps) for b in outs),
                                 in_shape=self.shape, out_shape=out))
        self.shape = out
        return self

    def residual(self, main, shortcut=None, act="relu"):
        m = _Steps(self.shape, self.where)
        main(m)
        sc = _Steps(self.shape, self.where)
        if shortcut is not None:
            shortcut(sc)
        if m.shape != sc.shape:  # pragma: no cover - a zoo definition error
            raise ValueError(f"{self.where}: residual shapes differ: {m.shape} vs {sc.shape}")
        self.steps.append(Residual(main=tuple(m.steps), shortcut=tuple(sc.steps),
                                   in_shape=self.shape, out_shape=m.shape, activation=act))
        self.shape = m.shape
        return self


class _Chain:
    """Collects the nodes of a model; ``node(kind, name)`` starts a node at the current shape."""

    def __init__(self, model, input_shape):
        self.model = model
        self.input_shape = tuple(input_shape)
        self.layers = []
        self._open = None
        self._kind_name = None

    def _close(self):
        if self._open is not None:
            kind, name = self._kind_name
            start = self.layers[-1].output_shape if self.layers else self.input_shape
            self.layers.append(Layer(index=len(self.layers), name=name, kind=kind,
                                     input_shape=start, output_shape=self._open.shape,
                                     steps=tuple(self._open.steps)))
            self._open = None

    def node(self, kind, name):
        self._close()
        start = self.layers[-1].output_shape if self.layers else self.input_shape
        self._open = _Steps(start, f"{self.model}/{name}")
        self._kind_name = (kind, name)
        return self._open

    def done(self):
        self._close()
        return tuple(self.layers)


def _alexnet(size):
    net = _Chain("alexnet", (3, size, size))
    net.node("conv", "conv1").conv("conv1", 96, 11, s=4).lrn(5, 1e-4, 0.75, 1.0).maxpool(3, 2)
    net.node("conv", "conv2").conv("conv2", 256, 5, p=2, g=2).lrn(5, 1e-4, 0.75, 1.0) \
        .maxpool(3, 2)
    net.node("conv", "conv3").conv("conv3", 384, 3, p=1)
    net.node("conv", "conv4").conv("conv4", 384, 3, p=1, g=2)
    net.node("conv", "conv5").conv("conv5", 256, 3, p=1, g=2).maxpool(3, 2)
    net.node("fc", "fc6").linear("fc6", 4096)
    net.node("fc", "fc7").linear("fc7", 4096)
    net.node("fc", "fc8").linear("fc8", 1000, act=None).softmax()
    return net.done()


# GoogLeNet Inception modules: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection)
_INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _inception(b, tag, cfg):
    c1, r3, c3, r5, c5, pp = cfg
    p = f"inception_{tag}"
    b.concat(
        lambda s: s.conv(f"{p}/1x1", c1, 1),
        lambda s: s.conv(f"{p}/3x3_reduce", r3, 1).conv(f"{p}/3x3", c3, 3, p=1),
        lambda s: s.conv(f"{p}/5x5_reduce", r5, 1).conv(f"{p}/5x5", c5, 5, p=2),
        lambda s: s.maxpool(3, 1, 1, ceil=True).conv(f"{p}/pool_proj", pp, 1),
    )
    return b


def _googlenet(size):
    net = _Chain("googlenet", (3, size, size))
    net.node("conv", "conv1/7x7_s2").conv("conv1/7x7_s2", 64, 7, s=2, p=3) \
        .maxpool(3, 2, ceil=True).lrn(5, 1e-4, 0.75, 1.0)
    net.node("conv", "conv2/3x3_reduce").conv("conv2/3x3_reduce", 64, 1)
    net.node("conv", "conv2/3x3").conv("conv2/3x3", 192, 3, p=1).lrn(5, 1e-4, 0.75, 1.0) \
        .maxpool(3, 2, ceil=True)
    for tag, cfg in _INCEPTION.items():
        b = _inception(net.node("inception", f"inception_{tag}"), tag, cfg)
        if tag in ("3b", "4e"):
            b.maxpool(3, 2, ceil=True)
        if tag == "5b":
            b.global_avgpool().flatten()
    net.node("fc", "loss3/classifier").linear("loss3/classifier", 1000, act=None).softmax()
    return net.done()


# MobileNet V1 depthwise-separable blocks: (pointwise output channels, depthwise stride)
_MOBILENET = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1),
              (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]


def _mobilenet_v1(size):
    net = _Chain("mobilenet_v1", (3, size, size))
    net.node("conv", "conv1").conv("conv1", 32, 3, s=2, p=1, act="relu6")
    for i, (cout, stride) in enumerate(_MOBILENET, start=2):
        dw = net.node("dwconv", f"conv{i}_dw")
        c = dw.shape[0]
        dw.conv(f"conv{i}_dw", c, 3, s=stride, p=1, g=c, act="relu6")
        pw = net.node("conv", f"conv{i}_pw").conv(f"conv{i}_pw", cout, 1, act="relu6")
        if i == len(_MOBILENET) + 1:
            pw.global_avgpool().flatten()
    net.node("fc", "fc").linear("fc", 1000, act=None).softmax()
    return net.done()


def _bottleneck(b, name, width, stride, project):
    def main(s):
        s.conv(f"{name}/branch2a", width, 1)
        s.conv(f"{name}/branch2b", width, 3, s=stride, p=1)
        s.conv(f"{name}/branch2c", 4 * width, 1, act=None)

    def shortcut(s):
        s.conv(f"{name}/branch1", 4 * width, 1, s=stride, act=None)

    return b.residual(main, shortcut if project else None, act="relu")


def _resnet50(size):
    net = _Chain("resnet50", (3, size, size))
    net.node("conv", "conv1").conv("conv1", 64, 7, s=2, p=3).maxpool(3, 2, 1)
    stages = [(2, 64, 3, 1), (3, 128, 4, 2), (4, 256, 6, 2), (5, 512, 3, 2)]
    for stage, width, blocks, stride in stages:
        for i in range(blocks):
            name = f"res{stage}{'abcdef'[i]}"
            b = _bottleneck(net.node("residual", name), name, width,
                            stride if i == 0 else 1, project=(i == 0))
            if stage == 5 and i == blocks - 1:
                b.global_avgpool().flatten()
    net.node("fc", "fc1000").linear("fc1000", 1000, act=None).softmax()
    return net.done()


# SqueezeNet v1.0 Fire modules: (squeeze 1x1, expand 1x1, expand 3x3)
_FIRE = {2: (16, 64, 64), 3: (16, 64, 64), 4: (32, 128, 128), 5: (32, 128, 128),
         6: (48, 192, 192), 7: (48, 192, 192), 8: (64, 256, 256), 9: (64, 256, 256)}


def _squeezenet(size):
    net = _Chain("squeezenet", (3, size, size))
    net.node("conv", "conv1").conv("conv1", 96, 7, s=2).maxpool(3, 2, ceil=True)
    for i, (sq, e1, e3) in _FIRE.items():
        p = f"fire{i}"
        b = net.node("fire", p).conv(f"{p}/squeeze1x1", sq, 1)
        b.concat(lambda s, p=p, e1=e1: s.conv(f"{p}/expand1x1", e1, 1),
                 lambda s, p=p, e3=e3: s.conv(f"{p}/expand3x3", e3, 3, p=1))
        if i in (4, 8):
            b.maxpool(3, 2, ceil=True)
    net.node("conv", "conv10").conv("conv10", 1000, 1).global_avgpool().flatten().softmax()
    return net.done()


def _vgg16(size):
    net = _Chain("vgg16", (3, size, size))
    cfg = [(1, 64, 2), (2, 128, 2), (3, 256, 3), (4, 512, 3), (5, 512, 3)]
    for block, width, n in cfg:
        for i in range(1, n + 1):
            b = net.node("conv", f"conv{block}_{i}").conv(f"conv{block}_{i}", width, 3, p=1)
            if i == n:
                b.maxpool(2, 2)
    net.node("fc", "fc6").linear("fc6", 4096)
    net.node("fc", "fc7").linear("fc7", 4096)
    net.node("fc", "fc8").linear("fc8", 1000, act=None).softmax()
    return net.done()


BUILDERS = {
    "alexnet": _alexnet,
    "googlenet": _googlenet,
    "mobilenet_v1": _mobilenet_v1,
    "resnet50": _resnet50,
    "squeezenet": _squeezenet,
    "vgg16": _vgg16,
}

DEFAULT_SIZES = {"alexnet": 227, "googlenet": 224, "mobilenet_v1": 224, "resnet50": 224,
                 "squeezenet": 227, "vgg16": 224}

# Pipe-it Table I "Major" node counts (VGG-16 is not in the table: 13 conv + 3 FC).
TABLE_I_MAJOR_COUNTS = {"alexnet": 11, "googlenet": 58, "mobilenet_v1": 28, "resnet50": 54,
                        "squeezenet": 26, "vgg16": 16}


def build_layers(name, image_size=None):
    """The chain of :class:`Layer` nodes of model ``name`` for a square input."""
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(BUILDERS)}") from None
    size = DEFAULT_SIZES[name] if image_size is None else image_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    return builder(size)
