"""``polycast tune``: what ``auto`` picks, per collective and size, and why.

    polycast tune --nodes 188 --topology fattree:radix=32 --link 400Gbps [--explain] [--json]
    polycast tune -n 4                      # this machine (its calibration profile)
    polycast tune --calibrate [-n 4]        # measure this machine, write the profile
    polycast tune --calibrate --topology leafspine:hosts_per_leaf=16,oversub=4 --nodes 64

Without ``--topology`` the fabric is this machine with ``--nodes`` ranks on it, as a
communicator of that size would see it (the profile ``polycast tune --calibrate`` wrote,
else the built-in model). With ``--topology`` it is the simulated fabric ``polycast sim``
would build.
"""

from __future__ import annotations

import json
import math
import sys
import time

from ..collectives import Collective
from ..errors import InvalidArgument
from ..units import parse_size
from . import checks
from .table import print_table

DEFAULT_COLLECTIVES = "allgather,allreduce,broadcast,reduce_scatter,reduce"


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="show (and calibrate) what auto picks per collective "
                                    "and size, NCCL-style",
                       description=__doc__.splitlines()[0])
    p.add_argument("--nodes", "-n", type=int, default=None,
                   help="ranks (default: 188 with --topology, else 4)")
    p.add_argument("--topology", "-t", default=None,
                   help="a simulated fabric, as polycast sim takes it (default: this machine)")
    p.add_argument("--link", default="400Gbps", help="host link rate with --topology")
    p.add_argument("--collectives", "-c", default=DEFAULT_COLLECTIVES,
                   help=f"comma-separated (default {DEFAULT_COLLECTIVES})")
    p.add_argument("--min", default="1KiB", help="smallest size S (default 1KiB)")
    p.add_argument("--max", default="1GiB", help="largest size S (default 1GiB)")
    p.add_argument("-f", "--step-factor", type=int, default=4,
                   help="multiply the size by this between rows (default 4)")
    p.add_argument("--sizes", default=None, help="comma-separated sizes instead of --min/--max")
    p.add_argument("--explain", action="store_true",
                   help="every candidate's estimate and why the others were left out")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine (or, with --topology, simulate the fabric) "
                        "and write the profile the runtime loads")
    p.add_argument("--profile", default=None,
                   help="profile file (default POLYCAST_PROFILE or ~/.cache/polycast/"
                        "profile.json)")
    p.add_argument("--iters", type=int, default=8, help="--calibrate: timed calls per row")
    p.set_defaults(func=run)


def _sizes(args) -> list[int]:
    if args.sizes:
        sizes = [parse_size(x.strip()) for x in args.sizes.split(",") if x.strip()]
        if not sizes:
            raise InvalidArgument(f"no sizes in {args.sizes!r}")
        return sizes
    lo, hi = parse_size(args.min), parse_size(args.max)
    if lo < 1 or hi < lo:
        raise InvalidArgument(f"need 1 <= --min <= --max, got {args.min} and {args.max}")
    if args.step_factor < 2:
        raise InvalidArgument(f"--step-factor must be >= 2, got {args.step_factor}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= args.step_factor
    return out


def _fabric(args, nodes: int):
    from ..planner import CommShape
    if args.topology:
        from ..planner.fabric import from_topology
        from ..sim.topology import parse_topology
        topo = parse_topology(args.topology, nodes, link=args.link)
        rph = topo.ranks_per_host if nodes % topo.ranks_per_host == 0 else 1
        return from_topology(topo, f"{args.topology} ({topo.description})"), \
            CommShape(nodes, rph)
    from ..planner import profile
    from ..planner.local import local_fabric
    prof = profile.load(args.profile)
    return (local_fabric(single_host=True, multicast=True, symm=True, prof=prof),
            CommShape(nodes, nodes))


def run(args) -> int:
    # Every argument is checked before any work (one line, exit 2).
    colls = [Collective.parse(c) for c in checks.names(args.collectives, "collectives")]
    nodes = args.nodes if args.nodes is not None else (188 if args.topology else 4)
    checks.positive_int("--nodes", nodes)
    checks.positive_int("--iters", args.iters)
    sizes = _sizes(args)
    if args.topology:
        from ..sim.topology import parse_topology
        parse_topology(args.topology, nodes, link=args.link)      # bad topology: exit 2
    if args.profile:
        import os
        os.environ["POLYCAST_PROFILE"] = args.profile
    if args.calibrate:
        return _calibrate(args, nodes)
    fabric, shape = _fabric(args, nodes)
    from ..planner import choose
    from ..planner.choose import size_label
    from ..planner.cost import _fmt_s
    t0 = time.perf_counter()
    choices = []
    for coll in colls:
        for S in sizes:
            if coll is Collective.BARRIER:
                S = 0
            choices.append(choose(coll, _rounded(coll, nodes, S), shape, fabric))
            if coll is Collective.BARRIER:
                break
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"fabric": fabric.describe(), "nodes": nodes, "shape": str(shape),
                          "seconds": wall, "choices": [c.to_json() for c in choices]},
                         indent=1))
        return 0
    print(fabric.describe())
    if args.explain:
        for c in choices:
            print()
            print(c.explain())
        return 0
    rows = []
    for c in choices:
        algbw = c.nbytes / c.estimate_seconds / 1e9 if c.estimate_seconds > 0 else math.inf
        nxt = c.candidates[1] if len(c.candidates) > 1 else None
        rows.append([str(c.collective), size_label(c.nbytes), c.algorithm,
                     c.nchunks, _fmt_s(c.estimate_seconds), f"{algbw:.2f}",
                     f"{algbw * c.collective.busbw_factor(nodes):.2f}",
                     c.candidates[0].bound,
                     f"{nxt.algorithm} x{nxt.seconds / c.estimate_seconds:.2f}" if nxt else "-"])
    print_table(f"polycast tune: auto on {shape} ({len(choices)} choices in {wall:.1f} s)",
                ["collective", "size", "algorithm", "nchunks", "estimate", "algbw GB/s",
                 "busbw GB/s", "bound", "runner-up"], rows,
                right={"size", "nchunks", "estimate", "algbw GB/s", "busbw GB/s"})
    return 0


def _rounded(coll: Collective, nodes: int, S: int) -> int:
    """S rounded down to whole float32 elements per rank (at least one), as bench/sim do."""
    if coll is Collective.BARRIER:
        return 0
    unit = coll.total_elements(nodes, 1) * 4
    return max(unit, S // unit * unit)


def _calibrate(args, nodes: int) -> int:
    from ..planner import profile
    from ..tools import calibrate

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
    path = args.profile or profile.default_path()
    old = profile.load(path, warn=False) or {}
    t0 = time.perf_counter()
    if args.topology:
        from ..sim.topology import parse_topology
        desc = parse_topology(args.topology, max(2, min(nodes, 32)), link=args.link).description
        entry = calibrate.calibrate_modelled(args.topology, nodes, args.link, log=log)
        data = dict(old) if old else {"links": profile.BUILTIN_LINKS,
                                      "symm": profile.BUILTIN_SYMM,
                                      "multicast": profile.BUILTIN_MULTICAST}
        data.setdefault("modelled", {})[desc] = entry
    else:
        data = calibrate.calibrate_local(nodes, iters=args.iters, log=log)
        if old.get("modelled"):
            data["modelled"] = old["modelled"]
    written = profile.save(data, path)
    print(f"polycast tune: wrote {written} ({time.perf_counter() - t0:.0f} s)")
    return 0
