"""The simulator's results and speed (issue 4), on this machine.

    python bench/sim.py [--quick] [--json FILE]

1. 188 nodes on a three-level fat tree of radix-32 switches, 400 Gbit/s, 64 MiB allgather:
   ring vs multicast link bytes (by layer) and time. The paper reports a 2x traffic
   reduction on its 188-node testbed.
2. (The FSDP step, simulated layer by layer at 64, 188 and 1024 ranks, is
   bench/fsdp_pipeline.py's.)
3. Simulator speed: 188-node ring allgather (target < 20 s), 1024-node multicast allgather
   (< 60 s), 1024-node ring allgather (< 120 s), with engine inputs (events) per second.

Prints tables and writes JSON (default bench/results/sim.json). ``--quick`` skips the
1024-node runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time

from polycast.cli.table import print_table
from polycast.sim.simulate import simulate
from polycast.sim.topology import parse_topology

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "sim.json"
TOPO, LINK, SIZE = "fattree:radix=32", "400Gbps", 64 << 20


def traffic_188() -> dict:
    topo = parse_topology(TOPO, 188, link=LINK)
    res = {a: simulate("allgather", a, 188, SIZE, topo) for a in ("ring", "mcast")}
    ring, mcast = res["ring"], res["mcast"]
    layers = sorted(set(ring.link_bytes_by_layer) | set(mcast.link_bytes_by_layer))
    rows = [[r.algorithm, r.time_s * 1e6, r.busbw, r.link_bytes / 1e9]
            + [r.link_bytes_by_layer.get(l, 0) / 1e9 for l in layers] for r in (ring, mcast)]
    rows.append(["ring / mcast", ring.time_s / mcast.time_s, ring.busbw / mcast.busbw,
                 ring.link_bytes / mcast.link_bytes]
                + [ring.link_bytes_by_layer.get(l, 0) / max(1, mcast.link_bytes_by_layer.get(l, 0))
                   for l in layers])
    print_table(f"1. allgather of 64 MiB, 188 nodes, {topo.description} "
                f"({topo.summary().split(': ')[1]}); bytes in GB", 
                ["algorithm", "time (us)", "busbw GB/s", "link GB"] + [f"{l} GB" for l in layers],
                rows)
    print(f"traffic reduction ring/mcast: {ring.link_bytes / mcast.link_bytes:.3f}x "
          f"(paper: 2x on 188 nodes; 2(P-1)/P = {2 * 187 / 188:.3f})\n")
    return {"topology": topo.description, "ring": ring.to_json(), "mcast": mcast.to_json(),
            "traffic_ratio": ring.link_bytes / mcast.link_bytes,
            "time_ratio": ring.time_s / mcast.time_s}


def speed(quick: bool) -> list[dict]:
    cases = [(188, "ring", 20.0)]
    if not quick:
        cases += [(1024, "mcast", 60.0), (1024, "ring", 120.0)]
    out = []
    for P, algo, target in cases:
        r = simulate("allgather", algo, P, SIZE, TOPO, link=LINK)
        out.append({"nodes": P, "algorithm": algo, "wall_s": r.wall_s, "target_s": target,
                    "events": r.events, "events_per_s": r.events_per_s, "flows": r.flows,
                    "sim_time_s": r.time_s, "ok": r.wall_s < target})
    print_table("3. simulator speed: 64 MiB allgather, fat tree radix 32 (events = engine "
                "inputs)", ["nodes", "algorithm", "wall s", "target s", "events",
                            "events/s", "flows", "simulated us", "ok"],
                [[o["nodes"], o["algorithm"], round(o["wall_s"], 2), o["target_s"],
                  o["events"], int(o["events_per_s"]), o["flows"], o["sim_time_s"] * 1e6,
                  "yes" if o["ok"] else "NO"] for o in out])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/sim.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="skip the 1024-node runs")
    p.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the JSON")
    args = p.parse_args(argv)
    result = {"machine": platform.platform(), "python": sys.version.split()[0],
              "traffic_188": traffic_188(),
              "speed": speed(args.quick)}
    path = pathlib.Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
