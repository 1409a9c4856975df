"""``polycast demo``: a short tour of what polycast does, growing with each capability."""

from __future__ import annotations

import argparse

from ..algorithms import build
from ..collectives import Collective
from ..errors import PolycastError
from ..graph.trees import nccl_dbtree
from ..schedule.traffic import traffic
from ..schedule.verify import verify
from .algos import format_bytes
from .table import print_table


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="a short tour (the default main job)",
                       description="A short tour: NCCL's double binary tree, the traffic of "
                                   "ring against multicast allgather, and what else is built.")
    p.add_argument("--ranks", "-n", type=int, default=8, help="ranks for the tour (default 8)")
    p.add_argument("--local-ranks", type=int, default=4,
                   help="processes for the real run (default 4; 0 skips it)")
    p.add_argument("--sim-nodes", type=int, default=188,
                   help="nodes for the simulated comparison (default 188, as the paper)")
    p.set_defaults(func=run)


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 76 - len(title)))


def run(args: argparse.Namespace) -> int:
    P = args.ranks
    section(f"1. NCCL's double binary tree over {P} ranks (polycast tree --ranks {P})")
    t0, t1 = nccl_dbtree(P)
    for i, t in enumerate((t0, t1)):
        edges = ", ".join(f"{r}->{'/'.join(map(str, t.children(r)))}"
                          for r in t.bfs_order() if t.children(r))
        print(f"tree {i}: root {t.root}, depth {t.depth()}: {edges}")
    interior = [r for r in range(P) if t0.children(r) and t1.children(r)]
    print(f"ranks interior in both trees: {interior or 'none'} "
          "(each rank's links are busy in one tree only)")

    nbytes = 64 << 20
    section(f"2. Allgather of {format_bytes(nbytes)} over {P} ranks: ring vs multicast "
            "(polycast algos)")
    rows, link = [], {}
    for algo in ("ring", "mcast"):
        sched = build(Collective.ALLGATHER, algo, P, nbytes // (4 * P))
        verify(sched)
        t = traffic(sched, itemsize=4)
        link[algo] = t.switch_link_nbytes
        rows.append([algo, format_bytes(t.max_sent), format_bytes(t.max_recv), t.depth,
                     format_bytes(t.switch_link_nbytes), "verified"])
    print_table("", ["algorithm", "sent/rank", "recv/rank", "depth", "1-switch link bytes",
                     "schedule"], rows)
    print(f"multicast sends S instead of (P-1)S per rank and cuts switch traffic by "
          f"{link['ring'] / link['mcast']:.3f}x "
          f"(2(P-1)/P = {2 * (P - 1) / P:.3f})")

    if args.local_ranks > 0:
        real_run(args.local_ranks)
    simulated(args.sim_nodes)
    return 0


def real_run(nranks: int) -> None:
    """The same algorithms for real: local processes, shared memory and UDP multicast on
    the loopback interface, each result compared with numpy's."""
    from .bench import measure
    section(f"3. For real: allgather on {nranks} local processes (polycast bench)")
    try:
        rows = measure("allgather", nranks, ["ring", "mcast"], [1 << 20, 4 << 20], iters=5,
                       warmup=2, timeout_seconds=120)
    except PolycastError as exc:
        print(f"the local run failed: {exc}")
        return
    print_table("", ["size", "algorithm", "time (us)", "busbw (GB/s)", "correct"],
                [[format_bytes(r["nbytes"]), r["algorithm"], round(r["time_us"], 1),
                  round(r["busbw"], 3), "ok" if r["correct"] else "WRONG"] for r in rows])
    print("(on one host, memory bandwidth and the CPU bound both; the win of multicast is "
          "on a network, next section)")


def simulated(nodes: int) -> None:
    """The paper's setting, simulated with the same engine: a fat tree of radix-32
    switches at 400 Gbit/s, then one FSDP step of llama2-7b."""
    from ..sim import simulate, simulate_fsdp
    section(f"4. Simulated: 64 MiB allgather on {nodes} nodes, fat tree radix 32, 400 Gbit/s "
            "(polycast sim)")
    res = {a: simulate("allgather", a, nodes, "64MiB", topology="fattree:radix=32",
                       link="400Gbps") for a in ("ring", "mcast")}
    print_table("", ["algorithm", "time (us)", "busbw (GB/s)", "link bytes (GB)"],
                [[a, round(r.time_s * 1e6, 1), round(r.busbw, 2), round(r.link_bytes / 1e9, 2)]
                 for a, r in res.items()])
    print(f"multicast moves {res['ring'].link_bytes / res['mcast'].link_bytes:.3f}x fewer "
          "bytes over the fabric (the paper: 2x on 188 nodes)")

    fsdp_nodes = min(nodes, 8)
    section(f"5. Simulated FSDP step, llama2-7b (its first 4 blocks) on {fsdp_nodes} nodes, "
            "layer by layer: allgather prefetch beside reduce-scatter (polycast sim fsdp)")
    rows = [simulate_fsdp("llama2-7b", fsdp_nodes, ag=a, rs=r, layers=4,
                          topology="fattree:radix=32", link="400Gbps")
            for a, r in (("ring", "ring"), ("mcast", "innet"))]
    print_table("", ["allgather", "reduce-scatter", "step (ms)", "bubble %",
                     "exposed bwd (ms)", "bwd/block (N/B)", "traffic/step (GB)"],
                [[r.ag, r.rs, round(r.step_s * 1e3, 1), round(r.bubble_pct, 1),
                  round(r.exposed_s.get("backward", 0.0) * 1e3, 1),
                  round(r.window_over_n_b, 2), round(r.step_link_bytes / 1e9, 1)]
                 for r in rows])
    print("multicast allgather + in-network reduce-scatter: a block's backward window takes "
          "about N/B instead of 2N/B, with fewer bytes (polycast sim fsdp --compare: all "
          "four rows, every block, the composed formula beside)")
