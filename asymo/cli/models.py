"""``asymo models``: the CNN layer zoo, as chains of major layers (Pipe-it Table I)."""
from __future__ import annotations

import sys

from asymo.cli.options import json_text

_EPILOG = """\
Each model is a chain of nodes: a convolution or FC layer with the pooling / LRN / softmax
after it, or a whole Inception, Fire or residual (bottleneck) module. 'major' counts the
weighted layers inside as Pipe-it Table I does. (N, K, M) are the GEMM dimensions of the
node's dominant convolution, Pipe-it Eq. 4: N = Ow*Oh, K = Fw*Fh*Fd, M = Ofm.

examples:
  asymo models                      # the six networks, one line each
  asymo models resnet50             # its chain, one line per node
  asymo models resnet50 --json      # every node's descriptor
  asymo models vgg16 --image-size 64
"""


def register(sub):
    import argparse
    p = sub.add_parser("models", help="list the CNN zoo or describe one model's layers",
                       description="List the CNN layer zoo (AlexNet, GoogLeNet, MobileNet V1, "
                                   "ResNet-50, SqueezeNet, VGG-16) or show one model's chain "
                                   "of major layers with shapes, FLOPs and GEMM dimensions.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", default=None,
                   help="a zoo model name or an ONNX file (default: list the zoo)")
    p.add_argument("--image-size", type=int, default=None, metavar="PIXELS",
                   help="build the network for a square input of this side")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args):
    import asymo.models as zoo

    if args.name is None:
        rows = []
        for name in zoo.names():
            try:
                m = zoo.get(name, image_size=args.image_size)
            except ValueError as exc:
                print(f"asymo models: {exc}", file=sys.stderr)
                return 2
            rows.append({"name": name, "input_shape": list(m.input_shape),
                         "nodes": len(m.layers), "major_count": m.major_count(),
                         "table_i_major_count": zoo.TABLE_I_MAJOR_COUNTS[name],
                         "gflop": m.flops / 1e9})
        if args.json:
            print(json_text(rows))
            return 0
        print(f"{'model':<13} {'input':<14} {'nodes':>5} {'major':>5} {'GFLOP':>7}")
        for r in rows:
            shape = "x".join(map(str, r["input_shape"]))
            print(f"{r['name']:<13} {shape:<14} {r['nodes']:>5} {r['major_count']:>5} "
                  f"{r['gflop']:>7.2f}")
        return 0
    if args.name.endswith(".onnx"):
        from asymo.cli.run import load_onnx

        m = load_onnx(args.name)[0]
    else:
        try:
            m = zoo.get(args.name, image_size=args.image_size)
        except ValueError as exc:
            print(f"asymo models: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json_text({"name": m.name, "input_shape": list(m.input_shape),
                         "major_count": m.major_count(), "flops": m.flops,
                         "layers": [layer.describe() for layer in m.layers]}))
    else:
        print(m.summary())
    return 0
