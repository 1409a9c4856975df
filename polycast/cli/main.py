"""The ``polycast`` command line. Each subcommand lives in its own module of this package
with ``add_parser(subparsers)`` that registers it and sets ``func(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from ..version import __version__
from ..errors import PolycastError
from .checks import Parser

# In the order `polycast --help` lists them.
COMMANDS = ("demo", "tree", "algos", "sim", "nic", "bench", "tune", "run", "lab", "doctor",
            "config")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="polycast",
        description="Collective communication with reliable multicast: real runs, "
                    "verified schedules and datacenter simulation.")
    parser.add_argument("--version", action="version", version=f"polycast {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in COMMANDS:
        modname = f"polycast.cli.{name}"
        if importlib.util.find_spec(modname) is None:
            continue
        importlib.import_module(modname).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PolycastError as exc:
        print(f"polycast {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:      # `polycast algos | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
