"""``polycast algos``: every algorithm per collective, with the traffic its schedule makes."""

from __future__ import annotations

import argparse
import json

from ..algorithms import algorithms, build
from ..algorithms.estimate import CHECK_ABOVE_RANKS, TooLarge, estimate, limit_nbytes
from ..collectives import Collective, parse_dtype
from ..errors import InvalidArgument, PolycastError
from ..schedule.traffic import traffic
from ..units import format_size
from . import checks
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


def _options(algo, nranks: int, ranks_per_host: int) -> dict:
    if not algo.hierarchical:
        return {}
    return {"hosts": nranks // ranks_per_host, "ranks_per_host": ranks_per_host}


def rows_for(collective: Collective, nranks: int, count: int, nbytes: int, nchunks: int,
             ranks_per_host: int, itemsize: int) -> list[dict]:
    out = []
    for algo in algorithms(collective):
        opts = _options(algo, nranks, ranks_per_host)
        row = {"collective": str(collective), "algorithm": algo.name, "nranks": nranks,
               "nbytes": nbytes, "multicast": algo.multicast,
               "vector": "counts" in algo.options}
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


def _refuse_too_large(colls: list[Collective], args: argparse.Namespace) -> None:
    """One error for every schedule that would not fit in memory, before building any."""
    limit = limit_nbytes()
    over = []
    for c in colls:
        for algo in algorithms(c):
            if algo.unsupported_reason(args.ranks) is None and args.ranks > CHECK_ABOVE_RANKS:
                est = estimate(c, algo.name, args.ranks, args.nchunks,
                               **_options(algo, args.ranks, args.ranks_per_host))
                if est is not None and est.nbytes > limit:
                    over.append(est)
    if not over:
        return
    worst = max(over, key=lambda e: e.nbytes)
    fits = [str(c) for c in colls if all(e.collective != str(c) for e in over)]
    raise TooLarge(
        f"{len(over)} schedules at {args.ranks:,} ranks would not fit the limit of "
        f"{limit / 2**30:g} GiB (POLYCAST_MAX_SCHEDULE_GIB), the largest {worst.collective} "
        f"{worst.algorithm} at ~{worst.steps:.2g} steps; cheaper: --ranks "
        f"{min(e.max_ranks(limit) for e in over)} or less"
        + (f", or only -c {' -c '.join(fits)}" if fits else ""))


def run(args: argparse.Namespace) -> int:
    checks.positive_int("--ranks", args.ranks)
    checks.positive_int("--nchunks", args.nchunks)
    checks.positive_int("--ranks-per-host", args.ranks_per_host)
    if args.ranks % args.ranks_per_host:
        raise InvalidArgument(f"--ranks-per-host {args.ranks_per_host} does not divide "
                              f"--ranks {args.ranks}")
    itemsize = parse_dtype(args.dtype).itemsize
    colls = [Collective.parse(c) for c in args.collective] if args.collective else list(Collective)
    _refuse_too_large(colls, args)
    notes: list[str] = []
    sizes = {c: checks.sized(c, args.ranks, args.size, args.dtype, notes) for c in colls}
    checks.print_notes("algos", notes)
    results = []
    for c in colls:
        count, nbytes = sizes[c]
        results.extend(rows_for(c, args.ranks, count, nbytes, args.nchunks,
                                args.ranks_per_host, itemsize))
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
                         ", ".join(n for n, on in (("multicast", r["multicast"]),
                                                   ("vector", r["vector"])) if on)])
        print_table(f"{c}  P={P}  S={format_size(sizes[c][1])}",
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
