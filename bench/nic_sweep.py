"""Where does a NIC (or a Python host) stop keeping up? The simulated multicast allgather
over link speeds, with the receivers behind the bf3-dpa and host-python NIC models
(``polycast sim --nic``) and, as the reference, receivers that keep up with any link.

For each link rate: the allgather's time, its ratio to the reference, and the bytes the
receive queues dropped and the engines' protocol recovered (summed over ranks, and as a
share of what the ranks received). Writes a table, bench/results/nic_sweep.json and a plot
(time and recovered share vs link rate). Simulated time is deterministic: the machine's
load changes only the wall time. Usage::

    python bench/nic_sweep.py [--nodes 16] [--size 256MiB] [--links 5,10,...,3200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from polycast.cli.table import print_table  # noqa: E402
from polycast.models.nic import parse_nic  # noqa: E402
from polycast.sim.simulate import simulate  # noqa: E402
from polycast.units import parse_size  # noqa: E402

LINKS_GBPS = (5, 10, 25, 100, 200, 400, 800, 1600, 3200)
NICS = ("bf3-dpa", "host-python")


def sweep(nodes: int, size: int, links, nics, topology: str, algo: str = "mcast") -> list[dict]:
    rows = []
    for gbps in links:
        link = f"{gbps}Gbps"
        ref = None
        for nic in (None, *nics):
            wall = time.perf_counter()
            r = simulate("allgather", algo, nodes, size, topology, link=link, nic=nic)
            wall = time.perf_counter() - wall
            if nic is None:
                ref = r
            received = r.nbytes * (nodes - 1) // nodes * nodes        # over every rank
            model = parse_nic(nic) if nic else None
            rows.append({
                "link_gbps": gbps, "nic": nic or "none (keeps up)",
                "nic_gbps": r.nic_gbps, "model_keeps_up":
                    None if model is None else model.size_for(gbps * 1e9).keeps_up,
                "time_s": r.time_s, "time_vs_ideal": r.time_s / ref.time_s,
                "algbw": r.algbw, "dropped_nbytes": r.nic_dropped_nbytes,
                "recovered_nbytes": r.recovered_nbytes,
                "recovered_share": r.recovered_nbytes / received,
                "peak_queue_nbytes": r.nic_peak_queue_nbytes, "wall_s": wall})
    return rows


def plot(rows: list[dict], path: str, title: str) -> None:
    from polycast.sim.plots import _plt
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
    for i, nic in enumerate(dict.fromkeys(r["nic"] for r in rows)):
        rs = [r for r in rows if r["nic"] == nic]
        x = [r["link_gbps"] for r in rs]
        color = "grey" if rs[0]["nic_gbps"] is None else f"C{i}"
        a1.plot(x, [r["time_s"] * 1e3 for r in rs], "o-", label=nic, color=color)
        if rs[0]["nic_gbps"]:
            a2.plot(x, [100 * r["recovered_share"] for r in rs], "o-", label=nic, color=color)
            for ax in (a1, a2):
                ax.axvline(rs[0]["nic_gbps"], linestyle=":", linewidth=1, color=color)
    for ax in (a1, a2):
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Gbit/s); dotted: the NIC model's receive rate")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    a1.set_yscale("log")
    a1.set_ylabel("allgather time (ms)")
    a1.set_title("time vs link rate")
    a2.set_ylabel("recovered bytes (% of bytes received)")
    a2.set_title("bytes the receive queues dropped and the protocol recovered")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--size", default="256MiB", help="allgather size S (default 256MiB, "
                    "beyond host-python's 64 MiB receive queue)")
    ap.add_argument("--links", default=",".join(map(str, LINKS_GBPS)),
                    help="comma-separated link rates in Gbit/s")
    ap.add_argument("--nics", default=",".join(NICS), help="comma-separated --nic values")
    ap.add_argument("--topology", default="switch")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "nic_sweep.json"))
    ap.add_argument("--plot", default=os.path.join(HERE, "results", "nic_sweep.png"))
    args = ap.parse_args(argv)
    size = parse_size(args.size)
    links = [float(x) for x in args.links.split(",") if x.strip()]
    links = [int(x) if x == int(x) else x for x in links]
    nics = [n.strip() for n in args.nics.split(",") if n.strip()]
    for n in nics:
        parse_nic(n)                                    # bad input before any work
    if args.nodes < 2 or size <= 0 or not links or min(links) <= 0:
        ap.error("--nodes >= 2, --size > 0 and link rates > 0")
    rows = sweep(args.nodes, size, links, nics, args.topology)
    title = (f"multicast allgather, {args.nodes} ranks, {args.size}, {args.topology}: "
             "receivers behind NIC models (polycast sim --nic)")
    cols = ["link Gbit/s", "nic", "NIC Gbit/s", "model keeps up", "time ms", "x ideal",
            "dropped MB", "recovered MB", "recovered %", "peak queue MiB", "wall s"]
    print_table(title, cols, [[
        r["link_gbps"], r["nic"], "-" if r["nic_gbps"] is None else round(r["nic_gbps"], 1),
        "-" if r["model_keeps_up"] is None else ("yes" if r["model_keeps_up"] else "NO"),
        r["time_s"] * 1e3, r["time_vs_ideal"], r["dropped_nbytes"] / 1e6,
        r["recovered_nbytes"] / 1e6, 100 * r["recovered_share"],
        r["peak_queue_nbytes"] / 2**20, round(r["wall_s"], 2)] for r in rows])
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"bench": "nic_sweep", "nodes": args.nodes, "size": size,
                   "topology": args.topology, "rows": rows}, fh, indent=1)
    print(f"wrote {args.json}")
    try:
        plot(rows, args.plot, title)
        print(f"wrote {args.plot}")
    except Exception as exc:          # matplotlib missing: the table and JSON still stand
        print(f"no plot: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
