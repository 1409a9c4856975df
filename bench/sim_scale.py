"""The simulator at scale (issue 26): every goal row, each in a fresh process.

    python bench/sim_scale.py [--rows NAME,...] [--timeout S] [--path auto|engine|fast]
                              [--json FILE]

Every row runs in its own Python process (so peak RSS is the row's own), with a time limit;
a row that passes it is reported as such. Printed: a table, and the same data as JSON
(default bench/results/sim_scale.json): wall seconds, CPU seconds (user + sys of the row's
process), peak RSS, engine inputs / fast-path events, the path the simulation took, the
simulated time, and the machine's load average before and after each row (the machine is
shared: compare rows of the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "sim_scale.json"
FAT32 = "fattree:radix=32"
GPUS_65K = "fattree:radix=64,ranks_per_host=8,nvlink=3600Gbps,nics=8"
GPUS_1K = "fattree:radix=32,ranks_per_host=8,nvlink=3600Gbps,nics=8"

# name -> (what, kwargs, goal wall seconds, goal peak GiB or None)
ROWS = {
    "ring-1k": ("one", dict(collective="allgather", algorithm="ring", nodes=1024,
                            topology=FAT32), 5, 1),
    "mcast-1k": ("one", dict(collective="allgather", algorithm="mcast", nodes=1024,
                             topology=FAT32), 5, 1),
    "alltoall-1k": ("one", dict(collective="alltoall", algorithm="pairwise", nodes=1024,
                                topology=FAT32), 60, None),
    "ag+rs-1k": ("pair", dict(nodes=1024, topology=FAT32, ag="ring", rs="ring"), 10, None),
    "mcast+rs-1k": ("pair", dict(nodes=1024, topology=FAT32, ag="mcast", rs="ring"), 10,
                    None),
    "hring-1k-gpus": ("one", dict(collective="allgather", algorithm="hring", nodes=1024,
                                  topology=GPUS_1K), None, None),
    "hmcast-1k-gpus": ("one", dict(collective="allgather", algorithm="hmcast", nodes=1024,
                                   topology=GPUS_1K), None, None),
    "ring-8k": ("one", dict(collective="allgather", algorithm="ring", nodes=8192,
                            topology=FAT32), 60, 8),
    "mcast-8k": ("one", dict(collective="allgather", algorithm="mcast", nodes=8192,
                             topology=FAT32), 60, 8),
    "allreduce-ring-8k": ("one", dict(collective="allreduce", algorithm="ring", nodes=8192,
                                      topology=FAT32), 60, 8),
    "allreduce-dbtree-8k": ("one", dict(collective="allreduce", algorithm="dbtree",
                                        nodes=8192, topology=FAT32), 60, 8),
    "ring-2k": ("one", dict(collective="allgather", algorithm="ring", nodes=2048,
                            topology=FAT32), None, 8),
    "mcast-2k": ("one", dict(collective="allgather", algorithm="mcast", nodes=2048,
                             topology=FAT32), None, 8),
    "hring-64k-gpus": ("one", dict(collective="allgather", algorithm="hring", nodes=65536,
                                   topology=GPUS_65K), 600, 16),
    "hmcast-64k-gpus": ("one", dict(collective="allgather", algorithm="hmcast", nodes=65536,
                                    topology=GPUS_65K), 600, 16),
}
SIZE, LINK = 64 << 20, "400Gbps"


def _rusage() -> tuple[float, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024


def run_row(name: str, path: str) -> dict:
    """One row, in this process (the child side)."""
    what, kw, _, _ = ROWS[name]
    t0 = time.perf_counter()
    cpu0, _ = _rusage()
    out: dict = {"row": name}
    if what == "one":
        from polycast.sim.simulate import simulate
        extra = {} if path == "auto" else {"path": path}
        r = simulate(kw["collective"], kw["algorithm"], kw["nodes"], SIZE, kw["topology"],
                     link=LINK, **extra)
        out.update(sim_time_s=r.time_s, events=r.events, link_bytes=r.link_bytes,
                   path=getattr(r, "path", "engine"), fast_mode=getattr(r, "fast_mode", ""))
    else:
        from polycast.algorithms import build
        from polycast.sim import SimConfig, Simulation
        from polycast.sim.simulate import algorithm_options, count_for, resolve_topology
        from polycast.sim.driver import pacing_gbps_for
        from polycast.collectives import Collective
        P = kw["nodes"]
        topo = resolve_topology(kw["topology"], P, LINK)
        scheds = []
        for coll, algo in (("allgather", kw["ag"]), ("reduce_scatter", kw["rs"])):
            c = Collective.parse(coll)
            scheds.append(build(c, algo, P, count_for(c, P, SIZE, 4),
                                compact=path != "engine",
                                **algorithm_options(c, algo, topo, {})))
        link_gbps = topo.host_link_bw * 8 / 1e9
        eng = {"line_rate_gbps": link_gbps, "pacing_gbps": pacing_gbps_for(scheds, link_gbps,
                                                                      topo.framing)}
        cfg = SimConfig(engine=eng)
        if path != "auto":
            cfg.path = path
        sim = Simulation(topo, cfg)
        reqs = [sim.post(s, 4) for s in scheds]
        sim.run()
        out.update(sim_time_s=max(sim.completion_time(r) for r in reqs), events=sim.events,
                   link_bytes=int(round(float(sim.net.link_bytes.sum()))),
                   path=getattr(sim, "path", "engine"), fast_mode=getattr(sim, "fast_mode", ""))
    cpu1, rss = _rusage()
    out.update(wall_s=time.perf_counter() - t0, cpu_s=cpu1 - cpu0, peak_rss_bytes=rss)
    return out


def spawn(name: str, path: str, timeout: float) -> dict:
    """Run one row in a fresh process; its own figures, or why there are none."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    cmd = [sys.executable, __file__, "--child", name, "--path", path]
    # the goal rows' memory budget is 8-16 GiB: let schedules use the row's (default 4;
    # 8 for rows without one)
    env = {**os.environ, "POLYCAST_MAX_SCHEDULE_GIB": os.environ.get(
        "POLYCAST_MAX_SCHEDULE_GIB", str(ROWS[name][3] or 8))}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"row": name, "error": f"not done in {timeout:.0f} s (killed)",
                "wall_s": time.perf_counter() - t0, "load": [load0, os.getloadavg()[0]]}
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return {"row": name, "error": err[:300], "wall_s": time.perf_counter() - t0,
                "load": [load0, os.getloadavg()[0]]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["load"] = [load0, os.getloadavg()[0]]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/sim_scale.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=None, help="comma-separated rows (default: all): "
                    + ", ".join(ROWS))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per row")
    ap.add_argument("--path", default="auto", choices=("auto", "engine", "fast"))
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_row(args.child, args.path)))
        return 0
    from polycast.cli.table import print_table
    names = args.rows.split(",") if args.rows else list(ROWS)
    for n in names:
        if n not in ROWS:
            print(f"bench/sim_scale.py: unknown row {n!r}; rows: {', '.join(ROWS)}",
                  file=sys.stderr)
            return 2
    results = []
    for n in names:
        r = spawn(n, args.path, args.timeout)
        _, _, goal_s, goal_gib = ROWS[n]
        r["goal_s"], r["goal_gib"] = goal_s, goal_gib
        ok = "error" not in r and (goal_s is None or r["wall_s"] < goal_s) and \
            (goal_gib is None or r["peak_rss_bytes"] < goal_gib * 2**30)
        r["met"] = ok if (goal_s or goal_gib) else None
        results.append(r)
        print(f"  {n}: " + (r.get("error") or f"{r['wall_s']:.1f} s wall, "
                                               f"{r['cpu_s']:.1f} s CPU"),
              file=sys.stderr, flush=True)
    rows = []
    for r in results:
        goal = " ".join(x for x in (f"<{r['goal_s']}s" if r["goal_s"] else "",
                                    f"<{r['goal_gib']}GiB" if r["goal_gib"] else "") if x)
        if "error" in r:
            rows.append([r["row"], "-", "-", "-", "-", "-", "-",
                         f"{r['load'][0]:.1f}/{r['load'][1]:.1f}", goal or "-",
                         r["error"][:60]])
            continue
        path = r.get("path", "?") + (f" {r['fast_mode']}" if r.get("fast_mode") else "")
        rows.append([r["row"], path, round(r["wall_s"], 2), round(r["cpu_s"], 2),
                     round(r["peak_rss_bytes"] / 2**30, 2), r["events"],
                     round(r["sim_time_s"] * 1e3, 4), f"{r['load'][0]:.1f}/{r['load'][1]:.1f}",
                     goal or "-", {True: "yes", False: "NO", None: "-"}[r["met"]]])
    print_table(f"the simulator at scale: 64 MiB, {LINK}, path {args.path}",
                ["row", "path", "wall s", "CPU s", "peak GiB", "events", "simulated ms",
                 "load", "goal", "met"], rows,
                right={"wall s", "CPU s", "peak GiB", "events", "simulated ms"})
    doc = {"machine": platform.platform(), "python": sys.version.split()[0],
           "path": args.path, "size_nbytes": SIZE, "link": LINK, "rows": results}
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
