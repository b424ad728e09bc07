"""Descriptors of the operations a CNN is built from, and of the major layers of the zoo.

A model is a chain of :class:`Layer` nodes. Each node is a small graph of *steps*:

- :class:`Conv` (convolution, including grouped and depthwise), :class:`Linear` (fully
  connected): the weighted operations, the ones Pipe-it counts as major layers;
- :class:`Pool`, :class:`LRN`, :class:`Flatten`, :class:`Softmax`: the light operations that
  Pipe-it (section III-B) folds into the preceding weighted layer;
- :class:`Concat` (Inception, Fire: branches joined along channels) and :class:`Residual`
  (main path plus shortcut, added): the branching modules that stay single nodes of the chain.

Every step knows its input and output shape per image (``(C, H, W)``, or ``(F,)`` after a
flatten / fully-connected layer), so a node's descriptor (FLOPs, GEMM dimensions) is computed,
never typed in.

GEMM dimensions follow Pipe-it Eq. 3-4: a convolution with output ``Ow x Oh``, filters
``Fw x Fh x Fd`` (``Fd`` = input channels per group) and ``Ofm`` output maps is a GEMM of an
image matrix ``[N x K]`` and a filter matrix ``[K x M]`` with ``N = Ow * Oh``,
``K = Fw * Fh * Fd``, ``M = Ofm``; ``N * K * M`` is its multiply-add count (grouped
convolutions included). asymo keeps NCHW, so what it actually executes per image and group is
the transposed product ``weight[M_g x K] @ col[K x N]``: :meth:`Conv.matmul_shapes` lists those
as NumPy-matmul ``(M, K, N)`` tuples.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = [
    "Conv", "Linear", "Pool", "LRN", "Flatten", "Softmax", "Concat", "Residual", "Layer", "LayerChain",
    "conv_output_size", "pool_output_size", "weighted_steps",
]

ACTIVATIONS = (None, "relu", "relu6")


def conv_output_size(size, kernel, stride, padding, dilation=1):
    """Pipe-it Eq. 3 (with dilation): ``floor((I + 2 Pad - D (F - 1) - 1) / S) + 1``."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def pool_output_size(size, kernel, stride, padding, ceil_mode=False):
    """Pooling output size with torch / Caffe semantics.

    With ``ceil_mode`` the last window may run past the input (Caffe rounds up), but it must
    start inside the input or the left padding, as in ``torch.nn.functional.max_pool2d``.
    """
    span = size + 2 * padding - kernel
    if ceil_mode:
        out = -(-span // stride) + 1
        if (out - 1) * stride >= size + padding:
            out -= 1
    else:
        out = span // stride + 1
    return out


@dataclass(frozen=True)
class Conv:
    """A 2-D convolution (NCHW) with optional bias and fused activation."""

    name: str
    in_shape: tuple
    out_shape: tuple
    kernel: tuple
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    activation: Optional[str] = "relu"
    bias: bool = True

    @property
    def in_channels(self):
        return self.in_shape[0]

    @property
    def out_channels(self):
        return self.out_shape[0]

    @property
    def depthwise(self):
        return self.groups > 1 and self.groups == self.in_channels == self.out_channels

    @property
    def weight_shape(self):
        return (self.out_channels, self.in_channels // self.groups) + tuple(self.kernel)

    @property
    def fan_in(self):
        return (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1]

    @property
    def gemm_dims(self):
        """Pipe-it Eq. 4: ``(N, K, M) = (Ow*Oh, Fw*Fh*Fd, Ofm)``."""
        _, oh, ow = self.out_shape
        return (oh * ow, self.fan_in, self.out_channels)

    @property
    def macs(self):
        n, k, m = self.gemm_dims
        return n * k * m

    @property
    def flops(self):
        return 2 * self.macs

    @property
    def arm_cl_nodes(self):
        """How many nodes ARM-CL builds for this layer (Pipe-it Table I, footnote): a grouped,
        non-depthwise convolution is one node per group."""
        return self.groups if self.groups > 1 and not self.depthwise else 1

    def matmul_shapes(self):
        """NumPy-matmul ``(M, K, N)`` products asymo executes per image for this convolution:
        one ``weight[M/g x K] @ col[K x N]`` per group; none for a depthwise convolution, which
        runs as a direct kernel."""
        if self.depthwise:
            return []
        n, k, m = self.gemm_dims
        return [(m // self.groups, k, n)] * self.groups


@dataclass(frozen=True)
class Linear:
    """A fully-connected layer ``y = x @ W.T + b`` on the flattened input."""

    name: str
    in_shape: tuple
    out_shape: tuple
    activation: Optional[str] = "relu"
    bias: bool = True

    @property
    def in_features(self):
        return self.in_shape[0]

    @property
    def out_features(self):
        return self.out_shape[0]

    @property
    def weight_shape(self):
        """(out_features, in_features), torch's layout: each output is a dot product with one
        contiguous row, the fastest way to stream a weight matrix that does not fit in cache."""
        return (self.out_features, self.in_features)

    @property
    def fan_in(self):
        return self.in_features

    @property
    def gemm_dims(self):
        """Eq. 4 for a fully-connected layer seen as a 1x1 convolution on a 1x1 image."""
        return (1, self.in_features, self.out_features)

    @property
    def macs(self):
        return self.in_features * self.out_features

    @property
    def flops(self):
        return 2 * self.macs

    arm_cl_nodes = 1
    kernel = (1, 1)
    stride = (1, 1)
    padding = (0, 0)
    groups = 1

    def matmul_shapes(self):
        """``weight[out x in] @ x[in x 1]`` per image."""
        return [(self.out_features, self.in_features, 1)]


@dataclass(frozen=True)
class Pool:
    """Max or average pooling; ``kernel=None`` means global (over the whole plane)."""

    kind: str  # "max" | "avg"
    in_shape: tuple
    out_shape: tuple
    kernel: Optional[tuple] = None
    stride: Optional[tuple] = None
    padding: tuple = (0, 0)
    ceil_mode: bool = False
    count_include_pad: bool = True

    @property
    def is_global(self):
        return self.kernel is None


@dataclass(frozen=True)
class LRN:
    """Local response normalisation across channels (AlexNet, GoogLeNet), torch semantics:
    ``b_c = a_c / (k + alpha / size * sum_{c' in window} a_c'^2) ** beta``."""

    in_shape: tuple
    out_shape: tuple
    size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0


@dataclass(frozen=True)
class Flatten:
    in_shape: tuple
    out_shape: tuple


@dataclass(frozen=True)
class Softmax:
    in_shape: tuple
    out_shape: tuple


@dataclass(frozen=True)
class Concat:
    """Branches applied to the same input, outputs joined along channels (Inception, Fire)."""

    branches: tuple  # tuple of tuples of steps
    in_shape: tuple
    out_shape: tuple


@dataclass(frozen=True)
class Residual:
    """``activation(main(x) + shortcut(x))``; an empty shortcut is the identity."""

    main: tuple
    shortcut: tuple
    in_shape: tuple
    out_shape: tuple
    activation: Optional[str] = "relu"


def weighted_steps(steps):
    """The Conv and Linear steps of ``steps`` in execution order (descending into modules)."""
    out = []
    for s in steps:
        if isinstance(s, (Conv, Linear)):
            out.append(s)
        elif isinstance(s, Concat):
            for b in s.branches:
                out.extend(weighted_steps(b))
        elif isinstance(s, Residual):
            out.extend(weighted_steps(s.main))
            out.extend(weighted_steps(s.shortcut))
    return out


@dataclass(frozen=True)
class Layer:
    """One node of a model's chain of major layers (Pipe-it Table I).

    ``kind`` is ``"conv"``, ``"dwconv"``, ``"fc"``, or for a branching module ``"inception"``,
    ``"fire"``, ``"residual"``. ``steps`` is what the node runs, in order; light operations
    that follow a weighted layer (pooling, LRN, flatten, softmax) belong to it, as in Pipe-it.

    For a composite node, ``kernel``, ``stride``, ``padding``, ``groups`` and ``gemm_dims``
    describe its dominant convolution (the one with the most FLOPs); ``gemm_list`` lists the
    Eq. 4 dimensions of all its weighted layers and ``flops`` sums them.
    """

    index: int
    name: str
    kind: str
    input_shape: tuple
    output_shape: tuple
    steps: tuple = field(repr=False)

    @property
    def weighted(self):
        """The Conv / Linear steps of this node, in execution order."""
        return tuple(weighted_steps(self.steps))

    @property
    def dominant(self):
        """The weighted step with the most FLOPs (None for a node without one)."""
        weighted = self.weighted
        return max(weighted, key=lambda s: s.flops) if weighted else None

    def _light(self):
        """The first pooling step: what describes a node without weighted layers."""
        return next((s for s in self.steps if isinstance(s, Pool) and not s.is_global), None)

    @property
    def kernel(self):
        d = self.dominant or self._light()
        return tuple(d.kernel) if d is not None else (1, 1)

    @property
    def stride(self):
        d = self.dominant or self._light()
        return tuple(d.stride) if d is not None else (1, 1)

    @property
    def padding(self):
        d = self.dominant or self._light()
        return tuple(d.padding) if d is not None else (0, 0)

    @property
    def groups(self):
        d = self.dominant
        return d.groups if d is not None else 1

    @property
    def flops(self):
        """FLOPs per image of the weighted layers (multiply-add = 2 FLOPs)."""
        return sum(s.flops for s in self.weighted)

    @property
    def gemm_list(self):
        return [s.gemm_dims for s in self.weighted]

    @property
    def gemm_dims(self):
        d = self.dominant
        return d.gemm_dims if d is not None else (0, 0, 0)

    @property
    def major_count(self):
        """Major layers (ARM-CL weighted nodes) inside this node, as Pipe-it Table I counts."""
        return sum(s.arm_cl_nodes for s in self.weighted)

    def matmul_shapes(self):
        out = []
        for s in self.weighted:
            out.extend(s.matmul_shapes())
        return out

    def describe(self):
        """A JSON-friendly dict of the descriptor."""
        return {
            "index": self.index, "name": self.name, "kind": self.kind,
            "input_shape": list(self.input_shape), "output_shape": list(self.output_shape),
            "kernel": list(self.kernel), "stride": list(self.stride),
            "padding": list(self.padding), "groups": self.groups, "flops": self.flops,
            "gemm_dims": list(self.gemm_dims), "gemm_list": [list(g) for g in self.gemm_list],
            "major_count": self.major_count,
        }


class LayerChain:
    """What a model's ``layers`` (a list of `Layer`) add up to; mixed into both model kinds
    (the zoo's `asymo.models.Model` and `asymo.models.GraphModel`)."""

    def major_count(self):
        """Weighted layers as Pipe-it Table I counts them (ARM-CL nodes)."""
        return sum(layer.major_count for layer in self.layers)

    @property
    def flops(self):
        """FLOPs per image of the weighted layers (multiply-add = 2)."""
        return sum(layer.flops for layer in self.layers)

    def matmul_shapes(self):
        """All NumPy-matmul ``(M, K, N)`` products one image runs, layer by layer, in order."""
        out = []
        for layer in self.layers:
            out.extend(layer.matmul_shapes())
        return out
