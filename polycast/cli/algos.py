"""``polycast algos``: every algorithm per collective, with the traffic its schedule makes."""

from __future__ import annotations

import argparse
import json

from ..algorithms import algorithms, build
from ..collectives import Collective, count_for_nbytes, parse_dtype
from ..errors import InvalidArgument, PolycastError
from ..schedule.traffic import traffic
from ..units import format_size, parse_size
from .table import print_table


def add_parser(sub) -> None:
    p = sub.add_parser(
        "algos", help="list algorithms with their per-rank traffic",
        description="Every registered algorithm per collective, with the bytes each rank "
                    "sends and receives, message steps and dependency depth, all counted "
                    "from the algorithm's schedule (not from formulas).")
    p.add_argument("--ranks", "-n", type=int, default=8, help="number of ranks P (default 8)")
    p.add_argument("--size", default="64MiB",
                   help="nccl-tests size S: the total buffer (for allgather: P shards of S/P; "
                        "default 64MiB)")
    p.add_argument("--collective", "-c", action="append",
                   help="only this collective (repeatable); default all")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--nchunks", type=int, default=1, help="pipelining chunks per part")
    p.add_argument("--ranks-per-host", type=int, default=1,
                   help="ranks per host for the hierarchical algorithms (default 1)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of tables")
    p.set_defaults(func=run)


def rows_for(collective: Collective, nranks: int, nbytes: int, itemsize: int, nchunks: int,
             ranks_per_host: int) -> list[dict]:
    count = count_for_nbytes(collective, nranks, nbytes, itemsize)
    out = []
    for algo in algorithms(collective):
        opts = {}
        if algo.hierarchical:
            if nranks % ranks_per_host:
                raise InvalidArgument(f"--ranks-per-host {ranks_per_host} does not divide "
                                      f"--ranks {nranks}")
            opts = {"hosts": nranks // ranks_per_host, "ranks_per_host": ranks_per_host}
        row = {"collective": str(collective), "algorithm": algo.name, "nranks": nranks,
               "nbytes": nbytes, "multicast": algo.multicast}
        try:
            sched = build(collective, algo.name, nranks, count, nchunks=nchunks, **opts)
            t = traffic(sched, itemsize)
            row["multicast"] = sched.uses_multicast
        except PolycastError as exc:
            row["unsupported"] = str(exc).split(";")[0]
            out.append(row)
            continue
        row.update(max_sent_nbytes=t.max_sent, max_recv_nbytes=t.max_recv, steps=t.steps,
                   depth=t.depth, messages=t.messages, multicasts=t.multicasts,
                   switch_link_nbytes=t.switch_link_nbytes)
        out.append(row)
    return out


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        raise InvalidArgument(f"--ranks must be >= 1, got {args.ranks}")
    itemsize = parse_dtype(args.dtype).itemsize
    nbytes = parse_size(args.size)
    colls = [Collective.parse(c) for c in args.collective] if args.collective else list(Collective)
    results = []
    for c in colls:
        results.extend(rows_for(c, args.ranks, nbytes, itemsize, args.nchunks,
                                args.ranks_per_host))
    if args.json:
        print(json.dumps(results))
        return 0
    P = args.ranks
    for c in colls:
        rows = []
        for r in (r for r in results if r["collective"] == str(c)):
            if "unsupported" in r:
                rows.append([r["algorithm"], "-", "-", "-", "-", "-", r["unsupported"]])
                continue
            rows.append([r["algorithm"], format_bytes(r["max_sent_nbytes"]),
                         format_bytes(r["max_recv_nbytes"]), r["steps"], r["depth"],
                         format_bytes(r["switch_link_nbytes"]),
                         "multicast" if r["multicast"] else ""])
        print_table(f"{c}  P={P}  S={format_size(nbytes)}",
                    ["algorithm", "sent/rank", "recv/rank", "steps", "depth",
                     "1-switch link bytes", "note"], rows,
                    right={"sent/rank", "recv/rank", "steps", "depth", "1-switch link bytes"})
        print()
    return 0


def format_bytes(n: int) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult:
            return f"{n / mult:.2f} {unit}"
    return f"{n} B"
