"""torchvision-style classification networks as plain ``torch.nn`` modules (needs torch).

The torchvision wheel that pairs with the installed torch does not always import (0.28 failed
against torch 2.13.0+cpu), so the tests, ``bench/models.py`` and the demo build the networks
from these definitions, written from the papers and torchvision's documented architectures
(same layer structure and ``state_dict`` keys as torchvision for ResNet, MobileNet V2 and
SqueezeNet): ResNet-18 / 50, MobileNet V2 / V3-small, SqueezeNet 1.1, GoogLeNet (no auxiliary
heads), ShuffleNet V2 x0.5 and a small EfficientNet-style network (MBConv with SiLU and
squeeze-excitation). ``build(name, num_classes=1000, seed=0)`` returns one in eval mode with
seeded random weights and non-trivial BatchNorm statistics.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["NETWORKS", "build", "BENCH_NETWORKS"]


def _bn_conv(cin, cout, k, s=1, p=None, g=1, act=nn.ReLU, eps=1e-5):
    layers = [nn.Conv2d(cin, cout, k, s, k // 2 if p is None else p, groups=g, bias=False),
              nn.BatchNorm2d(cout, eps=eps)]
    if act is not None:
        layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.SiLU)
                      else act())
    return nn.Sequential(*layers)


# ---- ResNet (He et al. 2016; torchvision v1.5: stride in the 3x3) --------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + idt)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + idt)


class ResNet(nn.Module):
    def __init__(self, block, counts, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(block, 64, counts[0], 1)
        self.layer2 = self._layer(block, 128, counts[1], 2)
        self.layer3 = self._layer(block, 256, counts[2], 2)
        self.layer4 = self._layer(block, 512, counts[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _layer(self, block, width, n, stride):
        down = None
        if stride != 1 or self.inplanes != width * block.expansion:
            down = nn.Sequential(nn.Conv2d(self.inplanes, width * block.expansion, 1, stride,
                                           bias=False), nn.BatchNorm2d(width * block.expansion))
        layers = [block(self.inplanes, width, stride, down)]
        self.inplanes = width * block.expansion
        layers += [block(self.inplanes, width) for _ in range(1, n)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---- MobileNet V2 (Sandler et al. 2018) ----------------------------------------------------
class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_bn_conv(cin, hidden, 1, act=nn.ReLU6)]
        layers += [_bn_conv(hidden, hidden, 3, stride, g=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    CFG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, cin = [_bn_conv(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in self.CFG:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_bn_conv(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ---- MobileNet V3 small (Howard et al. 2019): hardswish, squeeze-excitation ----------------
class SqueezeExcite(nn.Module):
    def __init__(self, c, squeeze, gate=nn.Hardsigmoid, act=nn.ReLU):
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.act = act(inplace=True) if act is nn.ReLU else act()
        self.gate = gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


def _make_div(v, d=8):
    return max(d, int(v + d / 2) // d * d)


class MBlockV3(nn.Module):
    def __init__(self, cin, k, exp, cout, se, act, stride):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        layers = [] if exp == cin else [_bn_conv(cin, exp, 1, act=act)]
        layers.append(_bn_conv(exp, exp, k, stride, g=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, _make_div(exp // 4)))
        layers.append(_bn_conv(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV3Small(nn.Module):
    CFG = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
           (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
           (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
           (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
           (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
           (96, 5, 576, 96, True, "HS", 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [_bn_conv(3, 16, 3, 2, act=nn.Hardswish)]
        for cin, k, exp, cout, se, a, s in self.CFG:
            layers.append(MBlockV3(cin, k, exp, cout, se, nn.ReLU if a == "RE" else nn.Hardswish,
                                   s))
        layers.append(_bn_conv(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(inplace=True),
                                        nn.Dropout(0.2), nn.Linear(1024, num_classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# ---- SqueezeNet 1.1 (Iandola et al. 2016) --------------------------------------------------
class Fire(nn.Module):
    def __init__(self, cin, sq, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, sq, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(sq, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(sq, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        mp = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), mp(),
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), mp(),
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), mp(),
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1),
                                        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


# ---- GoogLeNet (Szegedy et al. 2015; torchvision's layout, no auxiliary heads) -------------
def _basic(cin, cout, k, s=1, p=0):
    return _bn_conv(cin, cout, k, s, p, eps=0.001)


class Inception(nn.Module):
    def __init__(self, cin, c1, r3, c3, r5, c5, pp):
        super().__init__()
        self.branch1 = _basic(cin, c1, 1)
        self.branch2 = nn.Sequential(_basic(cin, r3, 1), _basic(r3, c3, 3, p=1))
        self.branch3 = nn.Sequential(_basic(cin, r5, 1), _basic(r5, c5, 3, p=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _basic(cin, pp, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x),
                          self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        mp = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.stem = nn.Sequential(_basic(3, 64, 7, 2, 3), mp(), _basic(64, 64, 1),
                                  _basic(64, 192, 3, p=1), mp())
        cfg = [(192, 64, 96, 128, 16, 32, 32), (256, 128, 128, 192, 32, 96, 64), "pool",
               (480, 192, 96, 208, 16, 48, 64), (512, 160, 112, 224, 24, 64, 64),
               (512, 128, 128, 256, 24, 64, 64), (512, 112, 144, 288, 32, 64, 64),
               (528, 256, 160, 320, 32, 128, 128), "pool2",
               (832, 256, 160, 320, 32, 128, 128), (832, 384, 192, 384, 48, 128, 128)]
        blocks = []
        for c in cfg:
            blocks.append(nn.MaxPool2d(3, 2, ceil_mode=True) if c == "pool" else
                          nn.MaxPool2d(2, 2, ceil_mode=True) if c == "pool2" else Inception(*c))
        self.inception = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x):
        x = self.inception(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.fc(self.dropout(x))


# ---- ShuffleNet V2 x0.5 (Ma et al. 2018): channel split and shuffle -------------------------
def channel_shuffle(x, groups):
    n, c, h, w = x.shape
    x = x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(_bn_conv(cin, cin, 3, stride, g=cin, act=None),
                                         _bn_conv(cin, half, 1))
        else:
            self.branch1 = None
        c = cin if stride > 1 else half
        self.branch2 = nn.Sequential(_bn_conv(c, half, 1), _bn_conv(half, half, 3, stride,
                                                                    g=half, act=None),
                                     _bn_conv(half, half, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.branch2(b)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, num_classes=1000, widths=(24, 48, 96, 192, 1024), repeats=(4, 8, 4)):
        super().__init__()
        self.conv1 = _bn_conv(3, widths[0], 3, 2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], widths[0]
        for n, cout in zip(repeats, widths[1:4]):
            units = [ShuffleUnit(cin, cout, 2)] + [ShuffleUnit(cout, cout, 1)
                                                   for _ in range(n - 1)]
            stages.append(nn.Sequential(*units))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.conv5 = _bn_conv(cin, widths[4], 1)
        self.fc = nn.Linear(widths[4], num_classes)

    def forward(self, x):
        x = self.conv5(self.stages(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))


# ---- EfficientNet-style (Tan & Le 2019): MBConv, SiLU, squeeze-excitation --------------------
class MBConv(nn.Module):
    def __init__(self, cin, cout, k, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_bn_conv(cin, hidden, 1, act=nn.SiLU)]
        layers += [_bn_conv(hidden, hidden, k, stride, g=hidden, act=nn.SiLU),
                   SqueezeExcite(hidden, max(1, cin // 4), gate=nn.Sigmoid, act=nn.SiLU),
                   _bn_conv(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class EfficientNetB0(nn.Module):
    CFG = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
           (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, cin = [_bn_conv(3, 32, 3, 2, act=nn.SiLU)], 32
        for e, k, s, c, n in self.CFG:
            for i in range(n):
                layers.append(MBConv(cin, c, k, s if i == 0 else 1, e))
                cin = c
        layers.append(_bn_conv(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1)
        return self.classifier(x)


NETWORKS = {
    "resnet18": lambda nc: ResNet(BasicBlock, (2, 2, 2, 2), nc),
    "resnet50": lambda nc: ResNet(Bottleneck, (3, 4, 6, 3), nc),
    "mobilenet_v2": MobileNetV2,
    "mobilenet_v3_small": MobileNetV3Small,
    "squeezenet1_1": SqueezeNet11,
    "googlenet": GoogLeNet,
    "shufflenet_v2_x0_5": ShuffleNetV2,
    "efficientnet_b0": EfficientNetB0,
}
#: The networks of issue 19's targets (bench/models.py).
BENCH_NETWORKS = ("resnet18", "resnet50", "mobilenet_v2", "squeezenet1_1", "googlenet")


def build(name, num_classes=1000, *, seed=0):
    """Network ``name`` in eval mode, weights seeded by ``seed`` (BatchNorm running
    statistics randomised too, so folding them is tested)."""
    try:
        ctor = NETWORKS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; known: {sorted(NETWORKS)}") from None
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = ctor(num_classes)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
                mod.weight.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
                mod.bias.copy_(torch.randn(c, generator=gen) * 0.1)
    return m.eval()
