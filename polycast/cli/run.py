"""``polycast run -n N script.py ARGS``: start N local ranks (see polycast.tools.launch)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from ..tools import launch
    p = subparsers.add_parser("run", help="start N local ranks of a Python script",
                              description=launch.__doc__.splitlines()[0])
    launch.add_arguments(p)
    p.set_defaults(func=launch.run_from_args)
