"""``polycast sim``: run collectives, an FSDP step or a sweep on the simulated network.

    polycast sim allgather --algo ring --nodes 188 --size 64MiB --topology fattree:radix=32
    polycast sim allgather --compare ring,mcast --nodes 188 --json
    polycast sim fsdp --model llama2-7b --nodes 188 --ag mcast --rs innet [--compare]
    polycast sim sweep --collective allgather --algos ring,mcast --nodes 16,64 --sizes 1MiB,64MiB
    polycast sim sweep --algos mcast --link 100Gbps,400Gbps,1.6Tbps --nic 'bf3-dpa;host-python'
"""

from __future__ import annotations

import argparse
import json
import sys

from ..algorithms import get
from ..collectives import Collective
from ..schedule.vector import VECTOR, check_counts
from ..errors import InvalidArgument, UnknownName
from ..units import format_size, parse_size
from . import checks
from .table import print_table


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", "-n", type=int, default=8, help="ranks P (default 8)")
    p.add_argument("--topology", "-t", default="fattree:radix=32",
                   help="switch | leafspine:hosts_per_leaf=16,oversub=2 | fattree:radix=32, "
                        "each with optional ,ranks_per_host=8,nvlink=3600Gbps,nics=8,"
                        "latency=250ns,switch_latency=300ns (default fattree:radix=32)")
    p.add_argument("--link", default="400Gbps", help="host link rate (default 400Gbps)")
    p.add_argument("--framing", default=None, metavar="tcp|udp|ib|none",
                   help="per-packet headers on every link (default tcp: Ethernet+IPv4+TCP "
                        "messages and UDP datagrams, MTU 9000; none: the ideal link); "
                        "the topology's framing= and mtu= override it")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


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


def add_parser(sub) -> None:
    p = sub.add_parser("sim", help="simulate collectives on a modelled datacenter network",
                       description="Run the real engine, one per rank, on a flow-level "
                                   "network model: any collective and algorithm, an FSDP "
                                   "training step, or a sweep.")
    ssub = p.add_subparsers(dest="what", metavar="COLLECTIVE|fsdp|sweep")
    for coll in Collective:
        c = ssub.add_parser(coll.value, help=f"simulate one {coll.value}")
        _common(c)
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
        c.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (Perfetto)")
        c.add_argument("--plot", metavar="FILE", help="write a figure (png/pdf/svg)")
        c.set_defaults(func=run_collective, collective=coll.value)
    f = ssub.add_parser("fsdp", help="one FSDP training step, communication overlapped "
                                     "with compute")
    _common(f)
    f.set_defaults(nodes=188)
    f.add_argument("--model", default="llama2-7b", help="model preset (default llama2-7b)")
    f.add_argument("--ag", default="ring", help="allgather algorithm (ring | mcast | ...)")
    f.add_argument("--rs", default="ring", help="reduce-scatter algorithm (ring | innet | ...)")
    f.add_argument("--layers", type=int, default=None, help="override the preset's layers")
    f.add_argument("--layer-bytes", default=None, help="override bytes per layer (e.g. 400MB)")
    f.add_argument("--compute-per-layer", default=None,
                   help="forward compute per layer (e.g. 4ms; backward is twice it); "
                        "default 2 x params x tokens / tflops")
    f.add_argument("--tokens", type=int, default=4096, help="tokens per rank per step")
    f.add_argument("--tflops", type=float, default=400.0,
                   help="effective TFLOP/s per rank (default 400)")
    f.add_argument("--roots", type=int, default=None,
                   help="multicast streams at a time (default: every rank)")
    f.add_argument("--compare", action="store_true",
                   help="the four rows ring/mcast x ring/innet of specs/measures.md")
    f.add_argument("--nic", default=None, metavar="bf3-dpa|host-python|host-native|PARAMS",
                   help="receivers behind this NIC's rate and bounded queue, as sim "
                        "COLLECTIVE --nic (default: receivers keep up)")
    f.set_defaults(func=run_fsdp)
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
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _options(items: list[str]) -> dict:
    out = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise InvalidArgument(f"--opt wants KEY=VALUE, got {item!r}")
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def run_collective(args: argparse.Namespace) -> int:
    from ..algorithms import algorithms
    from ..sim.simulate import PLACEMENTS, algorithm_options, simulate
    from ..sim.topology import parse_topology
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
                                       _options(args.opt))
    if getattr(args, "counts", None):
        options["counts"] = _counts(coll, args.counts, args.nodes)
    checks.output_path(args.trace, "--trace", (".json",))
    checks.output_path(args.plot, "--plot", (".png", ".pdf", ".svg"))
    from ..sim.topology import parse_seconds
    host_latency_s = parse_seconds(args.host_latency)
    if args.host_gbps is not None and not args.host_gbps > 0:
        from ..errors import InvalidArgument
        raise InvalidArgument(f"--host-gbps must be > 0, got {args.host_gbps:g}")
    nic = None
    if args.nic is not None:
        from ..models.nic import parse_nic
        nic = parse_nic(args.nic)
    notes: list[str] = []
    _, nbytes = checks.sized(coll, args.nodes, args.size, args.dtype, notes)
    topo = parse_topology(args.topology, args.nodes, link=args.link, framing=args.framing)
    auto = None
    if "auto" in names:
        from ..planner import choose_on_topology
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
                             **algorithm_options(coll, name, topo, {
                                 o: v for o, v in options.items()
                                 if o in get(coll, name).options}))
    checks.print_notes("sim", notes)
    record = bool(args.trace or args.plot)
    results = []
    for name in names:
        nchunks, label = args.nchunks or 1, None
        opts = options
        if name == "auto":
            name, nchunks, label = auto[0], args.nchunks or auto[1], f"auto({auto[0]})"
            opts = {k: v for k, v in options.items() if k in get(coll, name).options}
        r = simulate(coll, name, args.nodes, nbytes, topo, dtype=args.dtype, root=args.root,
                     nchunks=nchunks, channels=args.channels, options=opts,
                     loss=args.loss, seed=args.seed, record=record, placement=args.placement,
                     nic=nic, host_gbps=args.host_gbps, host_latency_s=host_latency_s)
        if label:
            r.algorithm = label
        results.append(r)
    if args.trace:
        from ..sim.trace import write_chrome_trace
        write_chrome_trace(args.trace, results)
    if args.plot:
        from ..sim.plots import plot_results
        plot_results(results, args.plot)
    if args.json:
        objs = [r.to_json() for r in results]
        print(json.dumps(objs if args.compare else objs[0], indent=1))
        return 0
    print(topo.summary())
    layers = [l for l in ("intra-host", "host-leaf", "leaf-spine", "spine-core")
              if any(l in r.link_bytes_by_layer for r in results)]
    cols = ["algorithm", "nodes", "size", "time (us)", "algbw GB/s", "busbw GB/s",
            "link bytes"] + [f"{l}" for l in layers] + ["events", "wall s"]
    rows = []
    for r in results:
        rows.append([r.algorithm, r.nodes, _size(r.nbytes), r.time_s * 1e6, r.algbw,
                     r.busbw, _gib(r.link_bytes)]
                    + [_gib(r.link_bytes_by_layer.get(l, 0)) for l in layers]
                    + [r.events, round(r.wall_s, 2)])
        if r.nic:
            print(f"{r.algorithm}: NIC {r.nic} ({r.nic_gbps:.1f} Gbit/s): "
                  f"{r.nic_dropped_datagrams} datagram receptions dropped "
                  f"({r.nic_dropped_nbytes} B), {r.recovered_nbytes} B recovered, peak "
                  f"queue {r.nic_peak_queue_nbytes} B")
        if r.loss:
            print(f"{r.algorithm}: loss {r.loss:g}: {r.lost_datagrams} datagram receptions "
                  f"lost ({r.lost_nbytes} B), {r.recovered_nbytes} B recovered")
    print_table(f"{coll} on {args.nodes} ranks (link bytes in GiB)", cols, rows,
                right=set(cols) - {"algorithm", "size"})
    if len(results) > 1:
        base = results[0]
        ratio_rows = [[f"{base.algorithm} / {r.algorithm}", base.time_s / r.time_s,
                       base.link_bytes / r.link_bytes if r.link_bytes else float("nan")]
                      for r in results[1:]]
        print_table("ratios", ["", "time", "link bytes"], ratio_rows)
    return 0


def _size(nbytes: int) -> str:
    """Exact units when they divide, else MiB to two decimals (sizes round to elements)."""
    text = format_size(nbytes)
    return text if not text.endswith("B") or text[-2] == "i" or nbytes < 1024 \
        else f"{nbytes / 2**20:.2f}MiB"


def _gib(n: int) -> float:
    return round(n / 2**30, 3)


def _seconds(text):
    from ..sim.topology import parse_seconds
    return parse_seconds(text)


def run_fsdp(args: argparse.Namespace) -> int:
    from ..sim.fsdp import compare_fsdp, simulate_fsdp
    from ..sim.topology import parse_topology
    checks.positive_int("--nodes", args.nodes)
    if args.roots is not None:
        checks.positive_int("--roots", args.roots)
    if not args.compare:
        checks.algorithm_names(Collective.ALLGATHER, [args.ag], args.nodes)
        checks.algorithm_names(Collective.REDUCE_SCATTER, [args.rs], args.nodes)
    topo = parse_topology(args.topology, args.nodes, link=args.link, framing=args.framing)
    nic = None
    if args.nic is not None:
        from ..models.nic import parse_nic
        nic = parse_nic(args.nic)
    kw = dict(layers=args.layers,
              layer_bytes=parse_size(args.layer_bytes) if args.layer_bytes else None,
              compute_per_layer_s=(_seconds(args.compute_per_layer)
                                   if args.compute_per_layer else None),
              tokens_per_rank=args.tokens, tflops=args.tflops, roots=args.roots, nic=nic)
    if args.compare:
        results = compare_fsdp(args.model, args.nodes, topology=topo, **kw)
    else:
        results = [simulate_fsdp(args.model, args.nodes, ag=args.ag, rs=args.rs,
                                 topology=topo, **kw)]
    if args.json:
        objs = [r.to_json() for r in results]
        print(json.dumps(objs if args.compare else objs[0], indent=1))
        return 0
    r0 = results[0]
    N = r0.layer_nbytes
    B = topo.host_link_bw
    print(f"{topo.summary()}\nFSDP {r0.model}: {r0.layers} layers of {N / 1e6:.1f} MB, "
          f"compute {r0.compute_fwd_s * 1e3:.2f} ms fwd + {r0.compute_bwd_s * 1e3:.2f} ms bwd "
          f"per layer; N/B = {N / B * 1e3:.3f} ms")
    if nic is not None:
        print(f"receivers' NIC {r0.nic}: {r0.nic_gbps:.1f} Gbit/s, queue "
              f"{nic.queue_chunks} x {format_size(nic.chunk_nbytes)}")
    cols = ["allgather", "reduce-scatter", "sent/rank (N)", "recv/rank (N)",
            "window (N/B)", "step (ms)", "bubble (ms)", "bubble %", "traffic/step (GB)"]
    rows = [[r.ag, r.rs, r.sent_per_rank_nbytes / N, r.recv_per_rank_nbytes / N,
             r.window_over_n_b, r.step_s * 1e3, r.bubble_s * 1e3,
             100 * r.bubble_s / r.step_s, r.step_link_bytes / 1e9] for r in results]
    if nic is not None:
        cols += ["NIC dropped/step (GB)", "recovered/step (GB)"]
        for row, r in zip(rows, results):
            row += [r.step_nic_dropped_nbytes / 1e9, r.step_recovered_nbytes / 1e9]
    print_table("one layer's allgather overlapped with the previous layer's reduce-scatter "
                "(simulated)", cols, rows)
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    from ..sim.sweep import NO_NIC, grid, run_grid, write_table
    from ..sim.topology import parse_topology
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
    from ..models.nic import parse_nic
    from ..sim.sweep import NO_NIC
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
