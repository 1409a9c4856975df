"""``polycast sim sweep``: a grid of sizes x nodes x algorithms x topologies x links x NICs,
run on local processes or a Ray cluster."""

from __future__ import annotations

import argparse
import json
import sys

from ...algorithms import get
from ...collectives import Collective
from ...errors import InvalidArgument
from ...units import parse_size
from .. import checks
from ..table import print_table


def add_parser(ssub) -> None:
    w = ssub.add_parser("sweep", help="a grid of sizes x nodes x algorithms x topologies")
    w.add_argument("--collective", "-c", default="allgather")
    w.add_argument("--algos", default="ring,mcast", help="comma-separated algorithms")
    w.add_argument("--nodes", default="8,16", help="comma-separated node counts")
    w.add_argument("--sizes", default="1MiB,64MiB", help="comma-separated sizes")
    w.add_argument("--topologies", default="fattree:radix=32",
                   help="semicolon-separated --topology strings")
    w.add_argument("--link", default="400Gbps",
                   help="comma-separated host link rates (default 400Gbps)")
    w.add_argument("--framing", default=None, metavar="tcp|udp|ib|none",
                   help="per-packet headers (default tcp; see sim COLLECTIVE --framing)")
    w.add_argument("--nic", default="none", metavar="NIC[;NIC...]",
                   help="semicolon-separated receiver NICs, as sim COLLECTIVE --nic "
                        "(bf3-dpa, host-python, host-native, bf3-dpa:cores=8, PARAMS) or none (receivers "
                        "keep up; the default)")
    w.add_argument("--workers", type=int, default=None,
                   help="local processes (default: the CPU count)")
    w.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster (the `ray` extra); ADDRESS or auto")
    w.add_argument("--out", default=None, help="write the table to FILE.csv or FILE.json")
    w.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w.set_defaults(func=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    from ...sim.sweep import NO_NIC, grid, run_grid, write_table
    from ...sim.topology import parse_topology
    coll = Collective.parse(args.collective)
    try:
        nodes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        raise InvalidArgument(f"--nodes wants comma-separated integers, got {args.nodes!r}") \
            from None
    for n in nodes:
        checks.positive_int("--nodes", n)
    if args.workers is not None:
        checks.positive_int("--workers", args.workers)
    sizes = [parse_size(x.strip()) for x in args.sizes.split(",") if x.strip()]
    topologies = [t.strip() for t in args.topologies.split(";") if t.strip()]
    algos = checks.algorithm_names(coll, checks.names(args.algos, "algorithms"))
    checks.output_path(args.out, "--out", (".csv", ".json"))
    links = checks.names(args.link, "link rates")
    nics = _nics(args.nic)
    for t in topologies:        # syntax and names; capacity per node count is per point
        for link in links:
            parse_topology(t, min(nodes or [1]), link=link, framing=args.framing)
    for n in nodes:
        for a in algos:
            if get(coll, a).unsupported_reason(n) is None:
                checks.schedule_fits(coll, a, n)
    points = grid(args.collective, algos, nodes, sizes, topologies, links, nics,
                  framing=args.framing)
    rows = run_grid(points, workers=args.workers, ray=args.ray)
    if args.out:
        write_table(rows, args.out)
    if args.json:
        print(json.dumps(rows, indent=1))
        return _sweep_status(rows)
    cols = ["collective", "algorithm", "nodes", "nbytes", "topology", "link", "time_s",
            "busbw", "link_bytes", "error"]
    if nics != [NO_NIC]:
        cols[6:6] = ["nic"]
        cols[-1:-1] = ["nic_dropped_nbytes", "recovered_nbytes"]
    print_table(f"sweep: {len(rows)} runs", cols,
                [[r.get(c, "") for c in cols] for r in rows])
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return _sweep_status(rows)


def _nics(text: str) -> list[str]:
    """``--nic`` of a sweep: each spec checked now (one line, exit 2), kept as given."""
    from ...models.nic import parse_nic
    from ...sim.sweep import NO_NIC
    out = [t.strip() for t in text.split(";") if t.strip()]
    if not out:
        raise InvalidArgument(f"--nic: no NIC in {text!r} (give none for receivers that "
                              "keep up)")
    for spec in out:
        if spec != NO_NIC:
            parse_nic(spec)
    return out


def _sweep_status(rows: list[dict]) -> int:
    """1 when some points could not run (their rows carry the error), else 0."""
    failed = sum(1 for r in rows if r.get("error"))
    if failed:
        print(f"polycast sim sweep: {failed} of {len(rows)} points could not run (see their "
              "error column)", file=sys.stderr)
    return 1 if failed else 0
