"""FSDP and HSDP training steps, simulated layer by layer (issue 27's measure).

    python bench/fsdp_pipeline.py [--models llama2-7b,llama2-70b,llama3-405b]
        [--nodes 64,188,1024] [--rows ring/ring,mcast/ring,ring/innet,mcast/innet]
        [--hsdp 1024:64] [--budget-events 4e7] [--json FILE]

For each model, rank count and row (allgather ring|mcast x reduce-scatter ring|innet), one
``simulate_fsdp`` step on a radix-32 fat tree at 400 Gbit/s (the default framing), with the
memo of repeated blocks (polycast/sim/fsdp.py): step time, bubble %, exposed communication
forward and backward, the backward time per block in N/B, traffic per step (all links and
per layer), and the simulation's own cost (events, wall and CPU seconds, peak memory, load
average). ``--hsdp NODES:SHARD`` adds HSDP rows at NODES ranks with shard groups of SHARD.

The engine-driven simulator costs about one Python event per message and per datagram at
each receiver, so a case is estimated before it runs (events per block from its group
sizes and shard bytes); cases over ``--budget-events`` are listed as pending -- they wait
on the simulator's fast path (issue 26) -- rather than run for hours. The table ends with
the paper's claim as these runs see it: mcast/innet against ring/ring, step and traffic.

Prints tables and writes JSON (default bench/results/fsdp_pipeline.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import resource
import sys
import time

from polycast.cli.table import print_table
from polycast.sim.fsdp import simulate_fsdp
from polycast.sim.topology import parse_topology
from polycast.workload.models import get_model

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "fsdp_pipeline.json"
TOPO, LINK = "fattree:radix=32", "400Gbps"
ROWS = ("ring/ring", "mcast/ring", "ring/innet", "mcast/innet")
DGRAM = 65000                 # the engine's largest datagram (the simulator's default)
MEMO_BLOCKS = 2 + 3 + 4       # blocks the memo simulates (when the period checks out)


def estimate_events(model: str, nodes: int, shard: int, ag: str, rs: str) -> float:
    """Engine inputs of one memoised step, roughly: per block two allgathers and a
    reduce-scatter (and the replica allreduce), per message two inputs, per datagram one at
    each receiver; the root unit counted as its share of bytes."""
    m = get_model(model)
    G, groups = shard, nodes // shard
    R = nodes // shard
    p2p = 2 * G * (G - 1) * groups                   # a ring's or a direct exchange's
    units = MEMO_BLOCKS + 3 * m.root_params / m.block_params
    per_block_bytes = m.block_params * 2
    if ag == "mcast":
        ag_ev = G * (G - 1) * math.ceil(per_block_bytes / G / DGRAM) * groups
    else:
        ag_ev = p2p
    rs_ev = p2p
    ar_ev = 2 * 2 * (R - 1) * R * G if R > 1 else 0
    return units * (2 * ag_ev + rs_ev + ar_ev)


def run_case(model: str, nodes: int, shard: int | None, ag: str, rs: str, topo) -> dict:
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter()
    r = simulate_fsdp(model, nodes, ag=ag, rs=rs, shard=shard, topology=topo)
    wall = time.perf_counter() - wall
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    out = r.to_json()
    out.update(wall_s=wall, cpu_s=cpu, peak_rss_mib=ru1.ru_maxrss / 1024,
               load=os.getloadavg()[0])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama2-7b,llama2-70b,llama3-405b")
    p.add_argument("--nodes", default="64,188,1024")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--hsdp", default="1024:64", help="NODES:SHARD[,...] HSDP cases ('' none)")
    p.add_argument("--budget-events", type=float, default=4e7,
                   help="skip (as pending) cases estimated above this many engine inputs")
    p.add_argument("--json", default=str(DEFAULT_JSON))
    args = p.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    rows = [tuple(r.split("/")) for r in args.rows.split(",") if r.strip()]
    cases = [(m, int(n), None) for n in args.nodes.split(",") if n.strip() for m in models]
    for item in filter(None, (x.strip() for x in args.hsdp.split(","))):
        n, _, s = item.partition(":")
        cases += [(m, int(n), int(s)) for m in models]
    results, pending = [], []
    topos: dict = {}
    todo = sorted(((estimate_events(m, n, s or n, ag, rs), m, n, s, ag, rs)
                   for m, n, s in cases for ag, rs in rows), key=lambda c: c[0])
    for est, model, nodes, shard, ag, rs in todo:             # the cheapest first
        key = dict(model=model, nodes=nodes, shard=shard, ag=ag, rs=rs,
                   estimated_events=est)
        if est > args.budget_events:
            pending.append(key)
            print(f"pending: {model} {nodes} ranks{f' HSDP {shard}' if shard else ''} "
                  f"{ag}/{rs}: ~{est / 1e6:.0f} M engine inputs", file=sys.stderr)
            continue
        topo = topos.get(nodes)
        if topo is None:
            topo = topos[nodes] = parse_topology(TOPO, nodes, link=LINK)
        print(f"running {model} {nodes} ranks{f' HSDP {shard}' if shard else ''} "
              f"{ag}/{rs} (~{est / 1e6:.2f} M engine inputs)", file=sys.stderr, flush=True)
        res = run_case(model, nodes, shard, ag, rs, topo)
        res["estimated_events"] = est
        results.append(res)
        _write(args.json, results, pending)          # a long run leaves what it finished
        print(f"  step {res['step_s'] * 1e3:.1f} ms, bubble {res['bubble_pct']:.1f} %, "
              f"{res['events'] / 1e6:.2f} M events, {res['cpu_s']:.0f} s CPU, "
              f"{res['wall_s']:.0f} s wall, load {res['load']:.1f}", file=sys.stderr, flush=True)
    order = {r: i for i, r in enumerate(rows)}
    results.sort(key=lambda r: (models.index(r["model"]), r["nodes"], -(r["shard"] or 0),
                                order[(r["ag"], r["rs"])]))
    cols = ["model", "ranks", "shard", "allgather", "reduce-scatter", "step (ms)", "bubble %",
            "exp fwd (ms)", "exp bwd (ms)", "bwd/block (N/B)", "traffic (GB)",
            "spine+core (GB)", "events (M)", "wall s", "cpu s", "load"]
    print_table(f"one training step, simulated layer by layer ({TOPO}, {LINK})", cols, [
        [r["model"], r["nodes"], r["shard"], r["ag"], r["rs"], r["step_s"] * 1e3,
         r["bubble_pct"], r["exposed_s"].get("forward", 0) * 1e3,
         r["exposed_s"].get("backward", 0) * 1e3, r["window_over_n_b"] or "",
         r["step_link_bytes"] / 1e9,
         (r["link_bytes_by_layer"].get("leaf-spine", 0)
          + r["link_bytes_by_layer"].get("spine-core", 0)) / 1e9,
         r["events"] / 1e6, round(r["wall_s"], 1), round(r["cpu_s"], 1), round(r["load"], 1)]
        for r in results])
    claims = []
    by = {(r["model"], r["nodes"], r["shard"], r["ag"], r["rs"]): r for r in results}
    for (m, n, s, ag, rs), r in by.items():
        base = by.get((m, n, s, "ring", "ring"))
        if (ag, rs) == ("ring", "ring") or base is None:
            continue
        claims.append([m, n, s, f"{ag}/{rs}", base["step_s"] / r["step_s"],
                       base["step_link_bytes"] / r["step_link_bytes"],
                       base["bubble_pct"], r["bubble_pct"],
                       base["exposed_s"].get("backward", 0) * 1e3,
                       r["exposed_s"].get("backward", 0) * 1e3])
    if claims:
        print_table("the paper's claim as simulated: against ring/ring", [
            "model", "ranks", "shard", "row", "step speed-up", "traffic reduction",
            "ring bubble %", "row bubble %", "ring exp bwd (ms)", "row exp bwd (ms)"], claims)
    if pending:
        print_table("pending: over the event budget (waits on the simulator's fast path)",
                    ["model", "ranks", "shard", "row", "est. engine inputs (M)"],
                    [[k["model"], k["nodes"], k["shard"], f"{k['ag']}/{k['rs']}",
                      round(k["estimated_events"] / 1e6)] for k in pending])
    print(f"\nwrote {_write(args.json, results, pending)}")
    return 0


def _write(where: str, results: list, pending: list) -> pathlib.Path:
    path = pathlib.Path(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": platform.platform(), "python": sys.version.split()[0],
                                "topology": TOPO, "link": LINK, "results": results,
                                "pending": pending}, indent=1))
    return path


if __name__ == "__main__":
    sys.exit(main())
