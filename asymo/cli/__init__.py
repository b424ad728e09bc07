"""The ``asymo`` console script: one parser, one module per subcommand.

Each module in ``SUBCOMMANDS`` defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the default. Only subcommands that work are listed.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = [
    "info",
    "dvfs",
    "emulate",
    "plan",
    "pipeline",
    "demo",
    "calibrate",
    "bench",
    "models",
    "run",
]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="asymo",
        description="Asymmetry-aware deep-learning kernels for heterogeneous CPUs "
                    "(big.LITTLE, P-core/E-core).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"asymo.cli.{name}").register(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    if argv is None:
        argv = sys.argv[1:]
    from asymo.cli.bench import normalize_argv

    args = parser.parse_args(normalize_argv(list(argv)))
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
