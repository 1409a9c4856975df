"""``polycast bench``: nccl-tests-style measurements on local ranks.

    polycast bench -n 4 allgather --algo ring,mcast --min 1KiB --max 64MiB [--json]

Starts the ranks itself (polycast.tools.launch), runs every size (from --min to --max,
times --step-factor) with every algorithm, and prints per row: size, count, dtype,
algorithm, time (us), algbw and busbw (GB/s = 1e9 B/s; busbw = algbw x the nccl-tests
factor of the collective) and whether the result matched polycast.reference exactly.
It times the blocking calls (``Allreduce``, ``Bcast``, ...), as MPI programs and nccl-tests
do; ``--nonblocking`` times ``Iallreduce(...).Wait()`` and the like.
"""

from __future__ import annotations

import json
import sys

from ..collectives import Collective, ReduceOp, parse_dtype
from ..errors import InvalidArgument
from ..tools.bench import measure as _measure
from ..units import format_size, parse_size
from . import checks
from .table import print_table


def _progress_factory(enabled: bool):
    """A progress callback: rich's bar when available, else a plain line on stderr."""
    if not enabled:
        return (lambda done, total: None), (lambda: None)
    try:
        from rich.progress import Progress
    except ImportError:
        def plain(done, total):
            print(f"\rpolycast bench: {done}/{total}", end="" if done < total else "\n",
                  file=sys.stderr, flush=True)
        return plain, (lambda: None)
    prog = Progress(transient=True)
    prog.start()
    task = prog.add_task("benchmark", total=None)

    def update(done, total):
        prog.update(task, completed=done, total=total)
    return update, prog.stop


def _table(rows: list[dict], coll: str, nranks: int) -> None:
    ok = {True: "ok", False: "WRONG", None: "-"}
    cells = [[format_size(r["nbytes"]), r["count"], r["dtype"], r["algorithm"],
              f"{r['time_us']:.1f}", f"{r['algbw']:.3f}", f"{r['busbw']:.3f}", ok[r["correct"]]]
             for r in rows]
    headers = ["size", "count", "type", "algorithm", "time (us)", "algbw (GB/s)",
               "busbw (GB/s)", "correct"]
    calls = rows[0].get("calls", "blocking") if rows else "blocking"
    print_table(f"polycast bench: {coll}, {nranks} ranks, transport "
                f"{rows[0]['transport'] if rows else '?'}, {calls} calls", headers, cells,
                right=set(headers) - {"type", "algorithm"})


def measure(collective, nranks: int, algos: list[str], sizes: list[int], *, iters: int = 20,
            warmup: int = 5, dtype: str = "float32", op: str = "sum", root: int = 0,
            check: bool = True, transport: str | None = None, timeout_seconds: float = 900,
            progress=None, nonblocking: bool = False) -> list[dict]:
    """Check the arguments (one line each, before any rank starts), then launch ``nranks``
    local ranks and measure ``collective`` for every algorithm and size
    (:func:`polycast.tools.bench.measure`: the rows, or PolycastError naming what failed)."""
    coll = Collective.parse(collective)
    checks.positive_int("-n", nranks)
    if not sizes:
        raise InvalidArgument("no sizes to measure")
    checks.positive_int("--iters", iters)
    checks.positive_int("--warmup", warmup, minimum=0)
    ReduceOp.parse(op)
    parse_dtype(dtype)
    checks.root(coll, root, nranks)
    if coll is not Collective.BARRIER:
        checks.sized(coll, nranks, min(sizes), dtype, [])   # rows show the rounded sizes
    checks.algorithm_names(coll, algos, nranks, allow_auto=True)
    for a in algos:
        checks.schedule_fits(coll, a, nranks)
    return _measure(coll, nranks, algos, sizes, iters=iters, warmup=warmup, dtype=dtype, op=op,
                    root=root, check=check, transport=transport,
                    timeout_seconds=timeout_seconds, progress=progress,
                    nonblocking=nonblocking)


def run(args) -> int:
    if args.sizes:
        sizes = [parse_size(x.strip()) for x in args.sizes.split(",") if x.strip()]
    else:
        lo, hi = parse_size(args.min), parse_size(args.max)
        if lo < 1 or hi < lo:
            raise InvalidArgument(f"need 1 <= --min <= --max, got {args.min} and {args.max}")
        checks.positive_int("--step-factor", args.step_factor, minimum=2)
        from ..tools.bench_rank import sizes_between
        sizes = sizes_between(lo, hi, args.step_factor)
    algos = checks.names(args.algo, "algorithms")
    if args.timeout <= 0:
        raise InvalidArgument(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    total = len(sizes) * len(algos)
    update, stop = _progress_factory(not args.json and total >= 4 and sys.stderr.isatty())
    try:
        rows = measure(args.collective, args.nranks, algos, sizes, iters=args.iters,
                       warmup=args.warmup, dtype=args.dtype, op=args.op, root=args.root,
                       check=not args.no_check, transport=args.transport,
                       timeout_seconds=args.timeout, progress=update,
                       nonblocking=args.nonblocking)
    finally:
        stop()
    if args.json:
        print(json.dumps(rows, indent=1))
    elif rows:
        _table(rows, str(Collective.parse(args.collective)), args.nranks)
    return 1 if any(r["correct"] is False for r in rows) else 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure collectives on local ranks "
                              "(nccl-tests style)", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", type=int, default=4, help="local ranks (default 4)")
    p.add_argument("collective", help="allgather, allreduce, broadcast, reduce_scatter, ...")
    p.add_argument("--algo", default="auto",
                   help="comma-separated algorithms (default: auto, the tuner's choice)")
    p.add_argument("--min", default="1KiB", help="smallest size S (default 1KiB)")
    p.add_argument("--max", default="16MiB", help="largest size S (default 16MiB)")
    p.add_argument("-f", "--step-factor", type=int, default=4,
                   help="multiply the size by this between rows (default 4)")
    p.add_argument("--sizes", default=None,
                   help="comma-separated sizes instead of --min/--max, e.g. 8B,64KiB,16MiB")
    p.add_argument("--iters", type=int, default=20,
                   help="timed calls per row (a quarter of them above 8 MiB; default 20)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--transport", choices=("auto", "shm", "tcp"), default=None)
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--nonblocking", action="store_true",
                   help="time Iallreduce(...).Wait() and the like instead of the blocking "
                        "calls (Allreduce, ...), which are the default")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="end the run after this many seconds (default 900)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)
