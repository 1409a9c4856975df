"""``polycast sim COLLECTIVE``: one collective (or several algorithms of it side by side) on
the simulated network, as a table, JSON, a Chrome trace or a figure."""

from __future__ import annotations

import argparse
import json
import time

from ...algorithms import get
from ...collectives import Collective
from ...errors import InvalidArgument, UnknownName
from ...schedule.vector import VECTOR, check_counts
from .. import checks
from ..table import print_table
from .common import (add_common, gib, key_values, print_stats, process_stats, progress,
                     size_text)


def add_parser(ssub) -> None:
    for coll in Collective:
        c = ssub.add_parser(coll.value, help=f"simulate one {coll.value}")
        add_common(c)
        c.add_argument("--algo", "-a", default=None,
                       help="algorithm, or auto (the planner's choice for this size, ranks "
                            "and topology); default: the first registered (polycast algos)")
        c.add_argument("--compare", default=None,
                       help="comma-separated algorithms to run side by side, with ratios "
                            "(auto allowed)")
        c.add_argument("--size", "-s", default="64MiB",
                       help="nccl-tests size S (total buffer; default 64MiB)")
        c.add_argument("--dtype", default="float32")
        c.add_argument("--root", type=int, default=0)
        c.add_argument("--nchunks", type=int, default=None,
                       help="pipelining chunks per part (default 1; auto: the planner's)")
        c.add_argument("--channels", type=int, default=1)
        c.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                       help="algorithm option (e.g. roots=4); repeatable")
        if coll in VECTOR:
            c.add_argument("--counts", default=None, metavar="C0,C1,..." + (
                ";..." if coll is Collective.ALLTOALL else ""),
                help="the vector form (MPI's " + coll.value + "v): elements per rank "
                     + ("(rows i: what rank i sends each rank, separated by ';')"
                        if coll is Collective.ALLTOALL else "")
                     + "; --size is then ignored")
        c.add_argument("--loss", type=float, default=0.0,
                       help="probability that a datagram is lost at a receiver (seeded)")
        c.add_argument("--seed", type=int, default=0)
        c.add_argument("--nic", default=None, metavar="bf3-dpa|host-python|host-native|PARAMS",
                       help="receivers process multicast chunks at this NIC's rate behind a "
                            "bounded queue and drop the excess (the protocol recovers): a "
                            "preset, a preset with changes (bf3-dpa:cores=8) or "
                            "clock=1.8GHz,cores=16,threads=16,cycles=590,chunk=4KiB,queue=1024;"
                            " see polycast nic")
        c.add_argument("--placement", default="linear",
                       help="linear (rank r in slot r) or random (seeded shuffle)")
        c.add_argument("--host-gbps", type=float, default=None,
                       help="host model: each rank sends and receives at most this many "
                            "Gbit/s, shared by its flows (default: hosts keep up with links)")
        c.add_argument("--host-latency", default="0",
                       help="host model: software time per message, e.g. 20us (default 0)")
        c.add_argument("--path", default="auto", choices=("auto", "engine", "fast"),
                       help="auto (default): the fast path where its checks pass, else the "
                            "engines; engine: always step the engines (the reference); fast: "
                            "fail where the fast path cannot run (docs/simulator.md)")
        c.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (Perfetto)")
        c.add_argument("--plot", metavar="FILE", help="write a figure (png/pdf/svg)")
        c.set_defaults(func=run_collective, collective=coll.value)


def _counts(coll, text: str, nodes: int):
    """--counts: "1,2,3" (or rows "1,2;3,4" for alltoall), checked for ``nodes`` ranks."""
    try:
        rows = [[int(x) for x in row.split(",")] for row in text.split(";")]
    except ValueError:
        raise InvalidArgument(f"--counts must be integers separated by ',' (rows by ';'), "
                              f"got {text!r}") from None
    counts = rows if coll is Collective.ALLTOALL else rows[0]
    if coll is not Collective.ALLTOALL and len(rows) != 1:
        raise InvalidArgument(f"--counts for {coll} is one row of {nodes} integers")
    return check_counts(coll, nodes, counts)

def run_collective(args: argparse.Namespace) -> int:
    from ...algorithms import algorithms
    from ...sim.simulate import PLACEMENTS, algorithm_options, simulate
    from ...sim.topology import parse_topology
    coll = Collective.parse(args.collective)
    if args.compare:
        names = checks.names(args.compare, "algorithms")
    elif args.algo:
        names = [args.algo]
    else:
        names = [algorithms(coll)[0].name]
    checks.positive_int("--nodes", args.nodes)
    if args.nchunks is not None:
        checks.positive_int("--nchunks", args.nchunks)
    checks.positive_int("--channels", args.channels)
    checks.probability("--loss", args.loss)
    checks.root(coll, args.root, args.nodes)
    if args.placement not in PLACEMENTS:
        raise UnknownName("placement", args.placement, PLACEMENTS)
    checks.algorithm_names(coll, names, args.nodes, allow_auto=True)
    options = checks.algorithm_options(coll, [n for n in names if n != "auto"],
                                       key_values(args.opt))
    if getattr(args, "counts", None):
        options["counts"] = _counts(coll, args.counts, args.nodes)
    checks.output_path(args.trace, "--trace", (".json",))
    checks.output_path(args.plot, "--plot", (".png", ".pdf", ".svg"))
    from ...sim.topology import parse_seconds
    host_latency_s = parse_seconds(args.host_latency)
    if args.host_gbps is not None and not args.host_gbps > 0:
        raise InvalidArgument(f"--host-gbps must be > 0, got {args.host_gbps:g}")
    nic = None
    if args.nic is not None:
        from ...models.nic import parse_nic
        nic = parse_nic(args.nic)
    notes: list[str] = []
    _, nbytes = checks.sized(coll, args.nodes, args.size, args.dtype, notes)
    topo = parse_topology(args.topology, args.nodes, link=args.link, framing=args.framing)
    auto = None
    if "auto" in names:
        from ...planner import choose_on_topology
        choice = choose_on_topology(coll, nbytes, topo, args.root, host_gbps=args.host_gbps,
                                    host_latency_s=host_latency_s)
        auto = (choice.algorithm, choice.nchunks)
        if "counts" in options and "counts" not in get(coll, auto[0]).options:
            raise InvalidArgument(f"auto chose {coll} {auto[0]}, which has no vector form "
                                  "(--counts): name an algorithm that has one (polycast algos)")
        if not args.json:
            notes.append(f"auto: {choice.algorithm}"
                         + (f" nchunks {choice.nchunks}" if choice.nchunks > 1 else "")
                         + f" ({'; '.join(choice.reasons[1:])})")
    for name in names:
        name, k = (auto[0], args.nchunks or auto[1]) if name == "auto" else \
            (name, args.nchunks or 1)
        checks.schedule_fits(coll, name, args.nodes, k, args.channels,
                             compact=args.path != "engine" and not args.loss and nic is None
                             and not (args.trace or args.plot),
                             **algorithm_options(coll, name, topo, {
                                 o: v for o, v in options.items()
                                 if o in get(coll, name).options}))
    checks.print_notes("sim", notes)
    record = bool(args.trace or args.plot)
    if args.path == "fast":
        from ...sim.fast import static_refusal
        why = static_refusal(loss=args.loss, nic=nic, record=record)
        if why:
            raise InvalidArgument(f"--path fast: {why} (use --path auto or engine)")
    results = []
    cpu0 = time.process_time()
    for name in names:
        nchunks, label = args.nchunks or 1, None
        opts = options
        if name == "auto":
            name, nchunks, label = auto[0], args.nchunks or auto[1], f"auto({auto[0]})"
            opts = {k: v for k, v in options.items() if k in get(coll, name).options}
        with progress(f"simulating {coll} {name} on {args.nodes} ranks", args.json):
            r = simulate(coll, name, args.nodes, nbytes, topo, dtype=args.dtype,
                         root=args.root, nchunks=nchunks, channels=args.channels,
                         options=opts, loss=args.loss, seed=args.seed, record=record,
                         placement=args.placement, nic=nic, host_gbps=args.host_gbps,
                         host_latency_s=host_latency_s, path=args.path)
        if label:
            r.algorithm = label
        results.append(r)
    if args.trace:
        from ...sim.trace import write_chrome_trace
        write_chrome_trace(args.trace, results)
    if args.plot:
        from ...sim.plots import plot_results
        plot_results(results, args.plot)
    stats = process_stats(cpu0) if args.stats else None
    if args.json:
        objs = [r.to_json() for r in results]
        if stats:
            for o in objs:
                o["stats"] = stats
        print(json.dumps(objs if args.compare else objs[0], indent=1))
        return 0
    print(topo.summary())
    layers = [l for l in ("intra-host", "host-leaf", "leaf-spine", "spine-core")
              if any(l in r.link_bytes_by_layer for r in results)]
    cols = ["algorithm", "nodes", "size", "time (us)", "algbw GB/s", "busbw GB/s",
            "link bytes"] + [f"{l}" for l in layers] + ["events", "wall s", "path"]
    rows = []
    for r in results:
        rows.append([r.algorithm, r.nodes, size_text(r.nbytes), r.time_s * 1e6, r.algbw,
                     r.busbw, gib(r.link_bytes)]
                    + [gib(r.link_bytes_by_layer.get(l, 0)) for l in layers]
                    + [r.events, round(r.wall_s, 2),
                       f"fast ({r.fast_mode})" if r.path == "fast" else "engine"])
        if r.nic:
            print(f"{r.algorithm}: NIC {r.nic} ({r.nic_gbps:.1f} Gbit/s): "
                  f"{r.nic_dropped_datagrams} datagram receptions dropped "
                  f"({r.nic_dropped_nbytes} B), {r.recovered_nbytes} B recovered, peak "
                  f"queue {r.nic_peak_queue_nbytes} B")
        if r.loss:
            print(f"{r.algorithm}: loss {r.loss:g}: {r.lost_datagrams} datagram receptions "
                  f"lost ({r.lost_nbytes} B), {r.recovered_nbytes} B recovered")
    print_table(f"{coll} on {args.nodes} ranks (link bytes in GiB)", cols, rows,
                right=set(cols) - {"algorithm", "size", "path"})
    if len(results) > 1:
        base = results[0]
        ratio_rows = [[f"{base.algorithm} / {r.algorithm}", base.time_s / r.time_s,
                       base.link_bytes / r.link_bytes if r.link_bytes else float("nan")]
                      for r in results[1:]]
        print_table("ratios", ["", "time", "link bytes"], ratio_rows)
    if stats:
        for r in results:
            print(f"{r.algorithm}: {r.wall_s:.2f} s wall simulating, {r.events} events "
                  f"({r.path}{' ' + r.fast_mode if r.fast_mode else ''})")
        print_stats(stats)
    return 0
