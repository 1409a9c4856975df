"""The planner's checks (issue 13): is ``auto`` within 10 % of the best algorithm?

    python bench/tune.py sim   [--quick] [--workers N] [--nodes ...] [--sizes ...]
    python bench/tune.py local [--nranks 4] [--repeat 3] [--sizes ...]

``sim``: on a grid of sizes, node counts and two topologies (a radix-32 fat tree and a
4:1 leaf-spine of 16 hosts per leaf, 400 Gbit/s), every algorithm each collective has at
that node count is simulated -- at the pipelining depth the planner gives it -- and the
simulated time of the planner's choice is compared with the fastest. Runs are cached in
bench/results/tune_sims.jsonl (keyed by everything a run depends on), so the grid can be
grown or re-judged without re-simulating. Prints one table per collective and the share
of cells within 10 %, and writes bench/results/tune_sim.json.

``local``: ``polycast bench`` on this machine, for allgather, allreduce, broadcast and
reduce_scatter: auto and every algorithm, in the same run, repeated (the machine is shared:
each repeat measures every algorithm back to back, the ratio auto / best is taken per
repeat and the median reported, with the load average). Writes bench/results/tune_local.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

from polycast.cli.table import print_table
from polycast.units import format_size, parse_size

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
TOPOLOGIES = ("fattree:radix=32", "leafspine:hosts_per_leaf=16,oversub=4")
COLLECTIVES = ("allgather", "allreduce", "broadcast", "reduce_scatter")
# 1 KiB .. 1 GiB by 32x, 2 .. 1024 nodes; the full grid is every combination.
SIZES = "1KiB,32KiB,1MiB,32MiB,1GiB"
NODES = "2,8,32,128,512,1024"
QUICK_NODES, QUICK_SIZES = "4,16,64", "1KiB,1MiB,64MiB"


def _cpu_s() -> float:
    """CPU seconds (user + sys) of this process and its finished children (the workers)."""
    import resource
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                 resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_sim(args) -> int:
    from polycast.tools.plancheck import Cell, run_cells
    nodes = [int(x) for x in (args.nodes or (QUICK_NODES if args.quick else NODES)).split(",")]
    sizes = [parse_size(x) for x in (args.sizes or (QUICK_SIZES if args.quick
                                                    else SIZES)).split(",")]
    colls = args.collectives.split(",")
    cells = [Cell(c, n, s, t) for c in colls for t in TOPOLOGIES for n in nodes for s in sizes]
    cache = args.cache or str(RESULTS / "tune_sims.jsonl")
    RESULTS.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    cpu0 = _cpu_s()

    def progress(done, total, dt):
        if done == total or done % 10 == 0:
            print(f"  {done}/{total} points run ({time.perf_counter() - t0:.0f} s, "
                  f"load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    counts: dict = {}
    verdicts = run_cells(cells, workers=args.workers, cache=cache, progress=progress,
                         counts=counts, prune=not args.no_prune)
    wall = time.perf_counter() - t0
    modes = ", ".join(f"{n} {m}" for m, n in sorted(counts.get("modes", {}).items()))
    print(f"{counts.get('simulated', 0)} points simulated now ({modes or 'none'}; "
          f"{counts.get('failed', 0)} failed), {counts.get('cached', 0)} read from the cache "
          f"({cache}), {counts.get('pruned', 0)} not simulated: their lower bound is above "
          "their cell's best")
    ok = sum(v.ok for v in verdicts)
    for coll in colls:
        rows = [[v.cell.topology.split(":")[0], v.cell.nodes, format_size(v.cell.nbytes),
                 v.choice, v.best, f"{v.ratio:.3f}", "ok" if v.ok else "MISS",
                 f"{v.estimate_s / v.choice_s:.2f}" if v.choice_s else "-",
                 " ".join(sorted(v.pruned)) or "-"]
                for v in verdicts if v.cell.collective == coll]
        print_table(f"{coll}: auto (the planner's choice) against the best simulated "
                    "algorithm", ["topology", "nodes", "size", "auto", "best",
                                  "auto/best", "within 10%", "estimate/sim",
                                  "bound above best"], rows,
                    right={"nodes", "size", "auto/best", "estimate/sim"})
    for v in verdicts:
        for label, why in v.failed.items():
            print(f"FAILED {v.cell.collective} {v.cell.topology} {v.cell.nodes} "
                  f"{format_size(v.cell.nbytes)} {label}: {why}")
    share = ok / len(verdicts)
    print(f"\n{ok} of {len(verdicts)} cells within 10 % of the best ({100 * share:.1f} %; "
          f"target >= 95 %); {wall:.0f} s wall, {_cpu_s() - cpu0:.0f} s CPU "
          f"(this process and its workers), load {os.getloadavg()[0]:.1f}")
    out = {"cells": len(verdicts), "within_10pct": ok, "share": share, "wall_s": wall,
           "cpu_s": _cpu_s() - cpu0,
           "points_simulated": counts.get("simulated"), "points_cached": counts.get("cached"),
           "points_pruned": counts.get("pruned"), "points_failed": counts.get("failed"),
           "modes": counts.get("modes"),
           "load": os.getloadavg(), "nodes": nodes, "sizes": sizes,
           "topologies": list(TOPOLOGIES), "collectives": colls,
           "verdicts": [{"collective": v.cell.collective, "nodes": v.cell.nodes,
                         "nbytes": v.cell.nbytes, "topology": v.cell.topology,
                         "auto": v.choice, "auto_s": v.choice_s, "best": v.best,
                         "best_s": v.best_s, "ratio": v.ratio, "estimate_s": v.estimate_s,
                         "times": v.times, "pruned_lower_bounds": v.pruned,
                         "failed": v.failed} for v in verdicts]}
    path = pathlib.Path(args.json or RESULTS / "tune_sim.json")
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0 if share >= 0.95 else 1


def run_local(args) -> int:
    from polycast.algorithms import supported
    from polycast.cli.bench import measure
    sizes = [parse_size(x) for x in args.sizes.split(",")]
    colls = args.collectives.split(",")
    load0 = os.getloadavg()
    per: dict = {}
    t0 = time.perf_counter()
    for rep in range(args.repeat):
        for coll in colls:
            algos = ["auto"] + [a for a in supported(coll, args.nranks)
                                if a not in ("innet",)]
            rows = measure(coll, args.nranks, algos, sizes, iters=args.iters, warmup=3,
                           check=False, timeout_seconds=1800)
            for r in rows:
                key = (coll, r["nbytes"])
                per.setdefault(key, []).append(r)
            print(f"  repeat {rep + 1}/{args.repeat} {coll}: {len(rows)} rows "
                  f"({time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f})",
                  file=sys.stderr, flush=True)
    table, out, worst = [], [], 0.0
    for (coll, nbytes), rows in sorted(per.items()):
        ratios, bests, autos = [], [], []
        for rep in range(args.repeat):
            mine = [r for r in rows[rep * (len(rows) // args.repeat):
                                     (rep + 1) * (len(rows) // args.repeat)]]
            auto = [r for r in mine if r["requested"] == "auto"]
            others = [r for r in mine if r["requested"] != "auto"]
            if not auto or not others:
                continue
            best = min(others, key=lambda r: r["time_us"])
            # auto runs one of the others (or symm, which no other row runs): the best of
            # the run is the faster of the algorithms and auto itself.
            ratios.append(auto[0]["time_us"] / min(best["time_us"], auto[0]["time_us"]))
            bests.append(best["algorithm"])
            autos.append(auto[0]["algorithm"])
        med = statistics.median(ratios)
        worst = max(worst, med)
        table.append([coll, format_size(nbytes), ",".join(sorted(set(autos))),
                      ",".join(sorted(set(bests))), f"{med:.3f}",
                      " ".join(f"{x:.2f}" for x in ratios), "ok" if med <= 1.10 else "MISS"])
        out.append({"collective": coll, "nbytes": nbytes, "auto": autos, "best": bests,
                    "ratios": ratios, "median": med})
    load1 = os.getloadavg()
    print_table(f"polycast bench, {args.nranks} ranks: auto against the best engine "
                f"algorithm of the same repeat (load {load0[0]:.1f} -> {load1[0]:.1f})",
                ["collective", "size", "auto ran", "best other", "median auto/best",
                 "per repeat", "within 10%"], table,
                right={"size", "median auto/best"})
    path = pathlib.Path(args.json or RESULTS / "tune_local.json")
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps({"nranks": args.nranks, "repeat": args.repeat,
                                "load_before": load0, "load_after": load1,
                                "wall_s": time.perf_counter() - t0, "cells": out}, indent=1))
    print(f"wrote {path}")
    return 0 if worst <= 1.10 else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sim", help="the simulated grid")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--nodes", default=None, help=f"default {NODES}")
    s.add_argument("--sizes", default=None, help=f"default {SIZES}")
    s.add_argument("--collectives", default=",".join(COLLECTIVES))
    s.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="local processes simulating at once (default: one per core)")
    s.add_argument("--no-prune", action="store_true",
                   help="simulate every candidate, even those whose lower bound is above "
                        "their cell's best simulated time")
    s.add_argument("--json", default=None)
    s.add_argument("--cache", default=None,
                   help="JSON-lines cache of simulated points (default "
                        "bench/results/tune_sims.jsonl; a new file: every point simulated)")
    s.set_defaults(func=run_sim)
    lo = sub.add_parser("local", help="polycast bench on this machine")
    lo.add_argument("--nranks", type=int, default=4)
    lo.add_argument("--repeat", type=int, default=3)
    lo.add_argument("--iters", type=int, default=10)
    lo.add_argument("--sizes", default="1KiB,16KiB,256KiB,4MiB,16MiB")
    lo.add_argument("--collectives", default=",".join(COLLECTIVES))
    lo.add_argument("--json", default=None)
    lo.set_defaults(func=run_local)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
