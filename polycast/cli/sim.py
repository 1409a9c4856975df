"""``polycast sim``: run collectives, an FSDP step or a sweep on the simulated network.

    polycast sim allgather --algo ring --nodes 188 --size 64MiB --topology fattree:radix=32
    polycast sim allgather --compare ring,mcast --nodes 188 --json
    polycast sim fsdp --model llama2-7b --nodes 64 --ag mcast --rs innet [--compare] [--plot F]
    polycast sim fsdp --model llama3-405b --nodes 1024 --shard 64 --ag mcast --rs innet
    polycast sim workload traces/llama --nodes 16 --algo allgather=mcast
    polycast sim sweep --collective allgather --algos ring,mcast --nodes 16,64 --sizes 1MiB,64MiB
    polycast sim sweep --algos mcast --link 100Gbps,400Gbps,1.6Tbps --nic 'bf3-dpa;host-python'
"""

from __future__ import annotations

import argparse
import json
import sys
import time

_T0 = time.perf_counter()

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
    ssub = p.add_subparsers(dest="what", metavar="COLLECTIVE|fsdp|workload|sweep")
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
        c.add_argument("--path", default="auto", choices=("auto", "engine", "fast"),
                       help="auto (default): the fast path where its checks pass, else the "
                            "engines; engine: always step the engines (the reference); fast: "
                            "fail where the fast path cannot run (docs/simulator.md)")
        c.add_argument("--stats", action="store_true",
                       help="print the simulation's wall and CPU time, events and peak memory")
        c.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (Perfetto)")
        c.add_argument("--plot", metavar="FILE", help="write a figure (png/pdf/svg)")
        c.set_defaults(func=run_collective, collective=coll.value)
    f = ssub.add_parser("fsdp", help="one FSDP or HSDP training step, simulated layer by "
                                     "layer",
                        description="Simulate one training step of a model wrapped per block "
                                    "with FSDP2 (or HSDP with --shard): every layer's "
                                    "allgathers, reduce-scatters and compute are nodes of one "
                                    "simulation on the real engines (docs/pipeline.md).")
    _common(f)
    f.set_defaults(nodes=64)
    f.add_argument("--model", default="llama2-7b",
                   help="model preset: " + ", ".join(_model_names()) + " (default llama2-7b)")
    f.add_argument("--ag", default="ring", help="allgather algorithm (ring | mcast | ...)")
    f.add_argument("--rs", default="ring", help="reduce-scatter algorithm (ring | innet | ...)")
    f.add_argument("--ar", default="ring", help="HSDP: the replica allreduce's algorithm")
    f.add_argument("--shard", type=int, default=None,
                   help="HSDP: shard each block over groups of this many consecutive ranks "
                        "and allreduce gradients across the groups (default: FSDP over all)")
    f.add_argument("--layers", type=int, default=None, help="override the preset's blocks")
    f.add_argument("--layer-bytes", default=None,
                   help="override a block's parameter bytes (e.g. 400MB; no root unit then)")
    f.add_argument("--compute-per-layer", default=None,
                   help="forward compute per block (e.g. 4ms; backward is twice it); "
                        "default 2 x params x tokens / tflops (+ attention with --seq)")
    f.add_argument("--tokens", type=int, default=4096, help="tokens per rank per step")
    f.add_argument("--seq", type=int, default=None,
                   help="sequence length: adds attention's FLOPs (default: matmuls only)")
    f.add_argument("--tflops", type=float, default=400.0,
                   help="effective TFLOP/s per rank (default 400)")
    f.add_argument("--optimizer", default=None, metavar="TIME",
                   help="optimizer step time (default: Adam over the rank's shard, "
                        "memory-bound at 2 TB/s)")
    f.add_argument("--roots", type=int, default=None,
                   help="multicast streams at a time (default: every rank of the group)")
    f.add_argument("--compare", action="store_true",
                   help="the four rows ring/mcast x ring/innet of specs/measures.md, with the "
                        "composed formula's step beside the simulated one")
    f.add_argument("--no-memo", dest="memo", action="store_false",
                   help="simulate every block (default: blocks b, b+1, b+2 and the checked "
                        "period of the repeated blocks)")
    f.add_argument("--nic", default=None, metavar="bf3-dpa|host-python|host-native|PARAMS",
                   help="receivers behind this NIC's rate and bounded queue, as sim "
                        "COLLECTIVE --nic (default: receivers keep up)")
    f.add_argument("--trace", metavar="FILE",
                   help="write a Perfetto timeline (JSON) of a few ranks; every block simulated")
    f.add_argument("--plot", metavar="FILE",
                   help="draw rank 0's timeline, ring/ring beside the asked rows (png/pdf/svg)")
    f.add_argument("--write-chakra", metavar="DIR",
                   help="also write the step as Chakra execution traces DIR/fsdp.<rank>.et "
                        "(the chakra extra)")
    f.set_defaults(func=run_fsdp)
    k = ssub.add_parser("workload", help="run Chakra execution traces (PREFIX.<rank>.et)",
                        description="Simulate a workload given as MLCommons Chakra execution "
                                    "traces, one per rank as ASTRA-sim names them "
                                    "(PREFIX.0.et, PREFIX.1.et, ...): compute, collective and "
                                    "send/recv nodes with their dependencies, collectives on "
                                    "the real engines (the chakra extra).")
    k.add_argument("prefix", metavar="PREFIX", help="the traces' common prefix")
    _common(k)
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
                             compact=args.path != "engine" and not args.loss and nic is None
                             and not (args.trace or args.plot),
                             **algorithm_options(coll, name, topo, {
                                 o: v for o, v in options.items()
                                 if o in get(coll, name).options}))
    checks.print_notes("sim", notes)
    record = bool(args.trace or args.plot)
    if args.path == "fast":
        from ..sim.fast import static_refusal
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
        from ..sim.trace import write_chrome_trace
        write_chrome_trace(args.trace, results)
    if args.plot:
        from ..sim.plots import plot_results
        plot_results(results, args.plot)
    stats = _stats(cpu0) if args.stats else None
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
        rows.append([r.algorithm, r.nodes, _size(r.nbytes), r.time_s * 1e6, r.algbw,
                     r.busbw, _gib(r.link_bytes)]
                    + [_gib(r.link_bytes_by_layer.get(l, 0)) for l in layers]
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
        print(f"stats: {stats['wall_s']:.2f} s wall, {stats['cpu_s']:.2f} s CPU, "
              f"peak memory {stats['peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


def _stats(cpu0: float) -> dict:
    """Wall (since the process started), CPU and peak resident memory of this process."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": time.perf_counter() - _T0, "cpu_s": time.process_time(),
            "cpu_s_simulating": time.process_time() - cpu0,
            "peak_rss_bytes": ru.ru_maxrss * 1024}


class progress:
    """A spinner with the elapsed time on stderr (rich), shown only when the work takes
    longer than ``after_s`` and stderr is a terminal; silent with --json."""

    def __init__(self, what: str, quiet: bool = False, after_s: float = 2.0) -> None:
        self.what, self.quiet, self.after_s = what, quiet, after_s
        self._timer = self._live = None

    def __enter__(self):
        if self.quiet or not sys.stderr.isatty():
            return self
        import threading
        self._timer = threading.Timer(self.after_s, self._show)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _show(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        except ImportError:
            return
        p = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                     console=Console(stderr=True), transient=True)
        p.add_task(self.what, total=None)
        p.start()
        self._live = p

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._live is not None:
            self._live.stop()


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


def _model_names() -> list[str]:
    from ..workload.models import MODELS
    return list(MODELS)


def _ms(x) -> float | str:
    return "" if x is None else x * 1e3


def run_fsdp(args: argparse.Namespace) -> int:
    from ..sim.fsdp import COMPARE_ROWS, compare_fsdp, simulate_fsdp
    from ..sim.pipeline import representative_ranks
    from ..sim.topology import parse_topology
    from ..workload.models import get_model
    checks.positive_int("--nodes", args.nodes)
    if args.roots is not None:
        checks.positive_int("--roots", args.roots)
    if args.layers is not None:
        checks.positive_int("--layers", args.layers)
    for opt in ("tokens", "seq"):
        if getattr(args, opt) is not None:
            checks.positive_int(f"--{opt}", getattr(args, opt))
    if args.shard is not None:
        checks.positive_int("--shard", args.shard)
        if args.nodes % args.shard:
            raise InvalidArgument(f"--shard {args.shard} must divide --nodes {args.nodes}")
    if args.model:
        get_model(args.model)
    shard = args.shard or args.nodes
    if not args.compare:
        checks.algorithm_names(Collective.ALLGATHER, [args.ag], shard)
        checks.algorithm_names(Collective.REDUCE_SCATTER, [args.rs], shard)
    if args.shard and args.shard < args.nodes:
        checks.algorithm_names(Collective.ALLREDUCE, [args.ar], args.nodes // args.shard)
    checks.output_path(args.trace, "--trace", (".json",))
    checks.output_path(args.plot, "--plot", (".png", ".pdf", ".svg"))
    if args.write_chakra:
        from ..workload.chakra import require_chakra
        require_chakra()
        checks.output_dir(args.write_chakra, "--write-chakra")
    topo = parse_topology(args.topology, args.nodes, link=args.link, framing=args.framing)
    nic = None
    if args.nic is not None:
        from ..models.nic import parse_nic
        nic = parse_nic(args.nic)
        if args.shard and args.shard < args.nodes and (args.compare or get(
                Collective.ALLGATHER, args.ag).multicast):
            raise InvalidArgument("--nic covers multicast on the world communicator only, "
                                  "not HSDP's shard groups (--shard)")
    timeline = bool(args.trace or args.plot)
    kw = dict(layers=args.layers,
              layer_bytes=parse_size(args.layer_bytes) if args.layer_bytes else None,
              compute_per_layer_s=(_seconds(args.compute_per_layer)
                                   if args.compute_per_layer else None),
              optimizer_s=_seconds(args.optimizer) if args.optimizer else None,
              tokens_per_rank=args.tokens, seq=args.seq, tflops=args.tflops,
              roots=args.roots, nic=nic, shard=args.shard, ar=args.ar, memo=args.memo,
              record_ranks=representative_ranks(args.nodes) if timeline else None)
    model = args.model if args.model else None
    if args.compare:
        results = compare_fsdp(model, args.nodes, topology=topo, **kw)
    else:
        rows = [(args.ag, args.rs)]
        if args.plot and rows[0] != COMPARE_ROWS[0]:
            rows.insert(0, COMPARE_ROWS[0])         # the baseline beside the asked row
        results = [simulate_fsdp(model, args.nodes, ag=a, rs=r, topology=topo, **kw)
                   for a, r in rows]
    runs = [(f"{r.ag}/{r.rs}" + (f"/{r.ar}" if r.ar else ""), r.pipeline) for r in results]
    if args.trace:
        from ..sim.timeline import write_trace
        write_trace(args.trace, runs)
    if args.plot:
        from ..sim.timeline import plot_timelines
        r0 = results[0]
        plot_timelines(runs, args.plot, title=(
            f"{r0.model}, {r0.nodes} ranks" + (f" (HSDP, shards of {r0.shard})"
                                               if r0.replicas > 1 else "")
            + f", {topo.description}: one training step"))
    if args.write_chakra:
        from ..workload.chakra import write_chakra
        from ..workload.fsdp import build_fsdp
        for r in results:
            w, _ = build_fsdp(r.spec)
            prefix = write_chakra(w, args.write_chakra, _chakra_name(r, len(results)))
            print(f"wrote {prefix}.0.et .. {prefix}.{w.nranks - 1}.et; simulate it with: "
                  f"polycast sim workload {prefix} -n {args.nodes} -t '{args.topology}' "
                  f"--link {args.link}", file=sys.stderr)
    if args.json:
        objs = [r.to_json() for r in results]
        print(json.dumps(objs if len(objs) > 1 else objs[0], indent=1))
        return 0
    _print_fsdp(topo, results, args.compare)
    return 0


def _chakra_name(r, n: int) -> str:
    return "fsdp" if n == 1 else f"fsdp-{r.ag}-{r.rs}"


def _print_fsdp(topo, results, compare: bool) -> None:
    r0 = results[0]
    N = r0.layer_nbytes
    B = topo.host_link_bw
    kind = (f"HSDP {r0.model}: shards of {r0.shard}, {r0.replicas} replicas"
            if r0.replicas > 1 else f"FSDP {r0.model}")
    print(f"{topo.summary()}\n{kind}: {r0.layers} blocks of {N / 1e6:.1f} MB, compute "
          f"{r0.compute_fwd_s * 1e3:.2f} ms fwd + {r0.compute_bwd_s * 1e3:.2f} ms bwd per "
          f"block, head {r0.head_fwd_s * 1e3:.2f} ms, optimizer {r0.optimizer_s * 1e3:.2f} ms;"
          f" N/B = {N / B * 1e3:.3f} ms")
    if r0.nic is not None:
        print(f"receivers' NIC {r0.nic}: {r0.nic_gbps:.1f} Gbit/s")
    cols = ["allgather", "reduce-scatter"] + (["allreduce"] if r0.replicas > 1 else []) + [
        "step (ms)"] + (["formula (ms)", "diff %"] if compare else []) + [
        "bubble %", "exposed fwd (ms)", "exposed bwd (ms)", "bwd/block (N/B)"] + (
        ["formula (N/B)", "sent/rank (N)", "recv/rank (N)"] if compare else []) + [
        "traffic (GB)", "wall s"]
    rows = []
    for r in results:
        row = [r.ag, r.rs] + ([r.ar] if r0.replicas > 1 else []) + [r.step_s * 1e3]
        if compare:
            d = r.formula_diff_pct
            row += [_ms(r.formula_step_s), "" if d is None else round(d, 1)]
        row += [r.bubble_pct, r.exposed_s.get("forward", 0.0) * 1e3,
                r.exposed_s.get("backward", 0.0) * 1e3,
                "" if r.window_over_n_b is None else r.window_over_n_b]
        if compare:
            row += ["" if r.formula_window_over_n_b is None else r.formula_window_over_n_b,
                    "" if r.sent_per_rank_nbytes is None else r.sent_per_rank_nbytes / N,
                    "" if r.recv_per_rank_nbytes is None else r.recv_per_rank_nbytes / N]
        row += [r.step_link_bytes / 1e9, round(r.wall_s, 1)]
        rows.append(row)
    print_table("one training step, simulated layer by layer" + (
        " (formula: the composed model of earlier versions, docs/pipeline.md)" if compare
        else ""), cols, rows)
    layers = [l for l in ("intra-host", "host-leaf", "leaf-spine", "spine-core")
              if any(l in r.link_bytes_by_layer for r in results)]
    print_table("bytes per link layer, one step (GB)", ["allgather", "reduce-scatter"] + layers,
                [[r.ag, r.rs] + [r.link_bytes_by_layer.get(l, 0) / 1e9 for l in layers]
                 for r in results])
    if not compare:
        r = results[-1]
        phases = sorted({p for c in r.rank_classes for p in c["exposed_s"]})
        print_table(f"{r.ag}/{r.rs}: ranks by class", ["ranks", "count", "end (ms)",
                                                         "compute (ms)"]
                    + [f"exposed {p} (ms)" for p in phases],
                    [[c["ranks"][:40], c["count"], c["end_s"] * 1e3, c["compute_s"] * 1e3]
                     + [c["exposed_s"].get(p, 0.0) * 1e3 for p in phases]
                     for c in r.rank_classes[:8]])
    memo = results[-1].memo
    if memo and memo.get("period_s") is not None:
        print(f"memo: blocks {memo['blocks_simulated']} simulated; the repeated blocks' "
              f"period ({memo['period_s'] * 1e3:.3f} ms) checked affine; --no-memo "
              "simulates all of them", file=sys.stderr)


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
        out.setdefault(str(Collective.parse(coll.strip())), {}).update(_options([rest]))
    return out


def run_workload_cmd(args: argparse.Namespace) -> int:
    from ..sim.pipeline import representative_ranks, run_workload
    from ..sim.topology import parse_topology
    from ..workload.chakra import read_chakra, trace_files
    from ..workload.graph import validate
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
    res = run_workload(w, topo, algorithms=algos, options=opts,
                       record_ranks=representative_ranks(w.nranks) if timeline else None)
    runs = [(w.name, res)]
    if args.trace:
        from ..sim.timeline import write_trace
        write_trace(args.trace, runs)
    if args.plot:
        from ..sim.timeline import plot_timelines
        plot_timelines(runs, args.plot, title=f"{args.prefix}: {w.nranks} ranks, "
                                              f"{topo.description}")
    if args.json:
        print(json.dumps(res.to_json(), indent=1))
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
