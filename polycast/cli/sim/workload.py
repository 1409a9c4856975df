"""``polycast sim workload``: MLCommons Chakra execution traces (PREFIX.<rank>.et) run on the
simulated network, collectives on the real engines."""

from __future__ import annotations

import argparse
import json
import time

from ...collectives import Collective
from ...errors import InvalidArgument
from .. import checks
from ..table import print_table
from .common import add_common, key_values, print_stats, process_stats, progress


def add_parser(ssub) -> None:
    k = ssub.add_parser("workload", help="run Chakra execution traces (PREFIX.<rank>.et)",
                        description="Simulate a workload given as MLCommons Chakra execution "
                                    "traces, one per rank as ASTRA-sim names them "
                                    "(PREFIX.0.et, PREFIX.1.et, ...): compute, collective and "
                                    "send/recv nodes with their dependencies, collectives on "
                                    "the real engines (the chakra extra).")
    k.add_argument("prefix", metavar="PREFIX", help="the traces' common prefix")
    add_common(k)
    k.set_defaults(nodes=None)
    k.add_argument("--algo", "-a", action="append", default=[], metavar="COLL=ALGO",
                   help="algorithm for a collective (allgather=mcast; repeatable or comma-"
                        "separated); default: the trace's own, else the planner's choice")
    k.add_argument("--opt", action="append", default=[], metavar="COLL:KEY=VALUE",
                   help="algorithm option for a collective (allgather:roots=8); repeatable")
    k.add_argument("--comm-groups", metavar="FILE",
                   help="ASTRA-sim's communicator groups JSON ({\"1\": [0, 1, ...]})")
    k.add_argument("--itemsize", type=int, default=None,
                   help="element bytes of the collectives' schedules (default: the trace's "
                        "polycast_itemsize, else 1)")
    k.add_argument("--trace", metavar="FILE", help="write a Perfetto timeline of a few ranks")
    k.add_argument("--plot", metavar="FILE", help="draw rank 0's timeline (png/pdf/svg)")
    k.set_defaults(func=run_workload_cmd)


def _algo_map(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (x.strip() for it in items for x in it.split(",")):
        if not item:
            continue
        coll, eq, algo = item.partition("=")
        if not eq or not coll or not algo:
            raise InvalidArgument(f"--algo wants COLLECTIVE=ALGORITHM, got {item!r}")
        c = Collective.parse(coll.strip())
        if algo.strip() != "auto":
            checks.algorithm_names(c, [algo.strip()])
        out[str(c)] = algo.strip()
    return out


def _opt_map(items: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for item in items:
        coll, colon, rest = item.partition(":")
        if not colon:
            raise InvalidArgument(f"--opt wants COLLECTIVE:KEY=VALUE, got {item!r}")
        out.setdefault(str(Collective.parse(coll.strip())), {}).update(key_values([rest]))
    return out


def run_workload_cmd(args: argparse.Namespace) -> int:
    from ...sim.pipeline import representative_ranks, run_workload
    from ...sim.topology import parse_topology
    from ...workload.chakra import read_chakra, trace_files
    from ...workload.graph import validate
    algos = _algo_map(args.algo)
    opts = _opt_map(args.opt)
    checks.output_path(args.trace, "--trace", (".json",))
    checks.output_path(args.plot, "--plot", (".png", ".pdf", ".svg"))
    if args.itemsize is not None:
        checks.positive_int("--itemsize", args.itemsize)
    if args.nodes is None:
        args.nodes = len(trace_files(args.prefix)) or None
    if args.nodes is not None:
        checks.positive_int("--nodes", args.nodes)
    w = read_chakra(args.prefix, args.nodes, comm_groups=args.comm_groups,
                    itemsize=args.itemsize)
    topo = parse_topology(args.topology, w.nranks, link=args.link, framing=args.framing)
    validate(w, topo.nranks)                    # every bad input before any simulation
    timeline = bool(args.trace or args.plot)
    cpu0 = time.process_time()
    with progress(f"simulating {args.prefix} on {w.nranks} ranks", args.json):
        res = run_workload(w, topo, algorithms=algos, options=opts,
                           record_ranks=representative_ranks(w.nranks) if timeline else None)
    stats = process_stats(cpu0) if args.stats else None
    runs = [(w.name, res)]
    if args.trace:
        from ...sim.timeline import write_trace
        write_trace(args.trace, runs)
    if args.plot:
        from ...sim.timeline import plot_timelines
        plot_timelines(runs, args.plot, title=f"{args.prefix}: {w.nranks} ranks, "
                                              f"{topo.description}")
    if args.json:
        obj = res.to_json()
        if stats:
            obj["stats"] = stats
        print(json.dumps(obj, indent=1))
        return 0
    print(topo.summary())
    nodes = sum(len(p) for p in w.programs)
    print(f"{args.prefix}: {w.nranks} ranks, {nodes} nodes, {res.collectives} collective and "
          f"point-to-point calls; algorithms "
          + "; ".join(f"{c} {'/'.join(a)}" for c, a in sorted(res.algorithms.items())))
    phases = sorted(res.exposed_s)
    print_table("the workload, simulated", ["step (ms)", "compute (ms)", "bubble %"]
                + [f"exposed {p} (ms)" for p in phases] + ["traffic (GB)", "events", "wall s"],
                [[res.step_s * 1e3, res.compute_s * 1e3, res.bubble_pct]
                 + [res.exposed_s[p] * 1e3 for p in phases]
                 + [res.link_bytes / 1e9, res.events, round(res.wall_s, 1)]])
    print_table("ranks by class", ["ranks", "count", "end (ms)", "compute (ms)"]
                + [f"exposed {p} (ms)" for p in phases],
                [[c.ranks[:40], c.count, c.end_s * 1e3, c.compute_s * 1e3]
                 + [c.exposed_s.get(p, 0.0) * 1e3 for p in phases]
                 for c in res.rank_classes[:8]])
    if stats:
        print_stats(stats)
    return 0

