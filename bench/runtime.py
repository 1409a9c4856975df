"""Runtime measurements on this host (issue 5): 4 local ranks.

* 16 MiB allgather, allreduce and broadcast busbw (auto algorithm and the named ones),
* 8-byte allreduce latency (target < 100 us),
* multicast broadcast of 64 MiB over loopback: correct, busbw, loss recovered.

Runs ``polycast bench`` for each and prints a table; writes the rows to
bench/results/runtime.json (or --out). Usage::

    python bench/runtime.py [-n 4] [--transport shm|tcp] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from polycast.cli.bench import measure
from polycast.cli.table import print_table
from polycast.errors import PolycastError
from polycast.units import parse_size

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = [
    # (label, collective, algorithms, size, iters, warmup)
    ("16 MiB allgather", "allgather", "auto,ring,mcast", "16MiB", 10, 2),
    ("16 MiB allreduce", "allreduce", "auto,ring,mcast", "16MiB", 10, 2),
    ("16 MiB broadcast", "broadcast", "auto,scatter_ring,mcast", "16MiB", 10, 2),
    ("8 B allreduce latency", "allreduce", "auto,recdoubling,ring", "8", 300, 30),
    ("64 MiB multicast broadcast", "broadcast", "mcast", "64MiB", 4, 1),
]


def bench(nranks: int, coll: str, algos: str, size: str, iters: int, warmup: int,
          transport: str | None, timeout: float) -> list[dict]:
    """One `polycast bench` run (its measure() entry point); [] and a message on failure."""
    try:
        return measure(coll, nranks, algos.split(","), [parse_size(size)], iters=iters,
                       warmup=warmup, transport=transport, timeout_seconds=timeout)
    except PolycastError as exc:
        print(f"  {coll} {algos} {size}: polycast bench failed: {exc}", file=sys.stderr)
        return []


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", type=int, default=4)
    p.add_argument("--transport", choices=("shm", "tcp"), default=None)
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--out", default=os.path.join(HERE, "results", "runtime.json"))
    p.add_argument("--timeout", type=float, default=600.0, help="per case, seconds")
    args = p.parse_args(argv)
    rows = []
    t0 = time.time()
    for label, coll, algos, size, iters, warmup in CASES:
        if args.quick:
            iters, warmup = max(2, iters // 5), max(1, warmup // 2)
        got = bench(args.nranks, coll, algos, size, iters, warmup, args.transport,
                    args.timeout)
        for r in got:
            r["case"] = label
        rows.extend(got)
    print(f"polycast runtime, {args.nranks} local ranks, transport "
          f"{args.transport or 'auto'}, {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f} at the end)")
    print_table("", ["case", "algorithm", "asked", "time (us)", "busbw GB/s", "correct",
                     "recovered"],
                [[r["case"], r["algorithm"], r.get("requested", ""), round(r["time_us"], 1),
                  round(r["busbw"], 3), str(r["correct"]), r.get("recovered_bytes", 0)]
                 for r in rows], right={"time (us)", "busbw GB/s", "recovered"})
    lat = [r for r in rows if r["case"].startswith("8 B")]
    if lat:
        best = min(lat, key=lambda r: r["time_us"])
        print(f"8-byte allreduce latency: best {best['time_us']:.1f} us ({best['algorithm']}); "
              f"target < 100 us: {'met' if best['time_us'] < 100 else 'NOT met'}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"nranks": args.nranks, "transport": args.transport or "auto",
                   "seconds": round(time.time() - t0, 1), "rows": rows}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0 if rows and all(r["correct"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
