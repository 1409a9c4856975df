"""``polycast config``: the effective settings and where each came from.

    polycast config              # every POLYCAST_* parameter: value, source
    polycast config --set        # only the ones set (environment or test hooks)
    polycast config --json
    polycast config --markdown   # docs/configuration.md: every parameter, generated

Reads the environment as a job started now would (polycast.config): a bad value is the
same one-line error init() would raise, an unknown POLYCAST_* name the same warning.
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="the effective POLYCAST_* settings and where each "
                       "came from", description=__doc__.splitlines()[0])
    p.add_argument("--set", action="store_true", help="only the variables that are set")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--markdown", action="store_true",
                   help="print the reference of every parameter (docs/configuration.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..config import current, markdown
    from .table import print_table
    if args.markdown:
        print(markdown(), end="")
        return 0
    rows = current().settings()
    if args.set:
        rows = [r for r in rows if r[2] != "default"]
    if args.json:
        print(json.dumps([{"variable": v, "value": x, "source": s} for v, x, s in rows],
                         indent=1))
    else:
        print_table("polycast config", ["variable", "value", "source"],
                    [list(r) for r in rows])
    return 0
