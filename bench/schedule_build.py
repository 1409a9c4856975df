"""How long generating big schedules takes (the simulator builds them for up to 1024 ranks).

    python bench/schedule_build.py [--ranks 1024] [--json bench/results/schedule_build.json]

Prints one row per (collective, algorithm): steps, wall and CPU seconds, CPU microseconds
per step, and the share of CPU spent with the cyclic garbage collector enabled vs not.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from polycast.algorithms.registry import build

CASES = [("allgather", "ring", 1024), ("allgather", "mcast", 1024),
         ("allreduce", "ring", 1 << 20), ("allreduce", "mcast", 1 << 20)]


def measure(coll: str, algo: str, P: int, count: int, gc_on: bool) -> dict:
    if not gc_on:
        gc.disable()
    try:
        t, c = time.perf_counter(), time.process_time()
        s = build(coll, algo, P, count)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    finally:
        gc.enable()
    return {"collective": coll, "algorithm": algo, "nranks": P, "count": count,
            "gc": gc_on, "steps": s.nsteps, "wall_seconds": round(wall, 2),
            "cpu_seconds": round(cpu, 2), "cpu_us_per_step": round(cpu / s.nsteps * 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    print(f"{'collective':<10} {'algorithm':<6} {'gc':<3} {'steps':>9} {'wall s':>7} "
          f"{'cpu s':>7} {'us/step':>8}")
    for coll, algo, count in CASES:
        for gc_on in (True, False):
            row = measure(coll, algo, args.ranks, count, gc_on)
            rows.append(row)
            print(f"{coll:<10} {algo:<6} {'on' if gc_on else 'off':<3} {row['steps']:>9} "
                  f"{row['wall_seconds']:>7} {row['cpu_seconds']:>7} "
                  f"{row['cpu_us_per_step']:>8}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
