"""The ``asymo`` console script: one parser, one module per subcommand.

Each module in ``SUBCOMMANDS`` defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the default. Only subcommands that work are listed.
"""
from __future__ import annotations

import argparse
import importlib
import os
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
    args = parser.parse_args(argv)
    try:
        rc = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
        return rc
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`asymo info --json | head`): stop quietly, as `cat` does.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return 128 + 13  # the status of a process killed by SIGPIPE, as a shell reports it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
