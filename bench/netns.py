"""What multicast does to the bytes each host sends, on an emulated LAN (issue 5).

H hosts (network namespaces, one rank each) on a bridge, every host link shaped by tbf in
both directions (default 200 Mbit/s). For 8 MiB allgather (ring vs mcast) and broadcast
(scatter_ring, chain vs mcast) it measures time, busbw and the bytes that crossed each
host's link (eth0 counters read inside the namespaces), per call. Root only; the
namespaces are deleted at the end, also on failure. Usage::

    sudo python bench/netns.py [--hosts 4] [--rate-mbit 200] [--nbytes 8MiB] [--iters 3]

Prints a table and writes bench/results/netns.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
import netns  # noqa: E402

WORKER = os.path.join(REPO, "tests", "netns.py")
CALLS = ["allgather:ring", "allgather:mcast",
         "broadcast:scatter_ring", "broadcast:chain", "broadcast:mcast"]


def _nbytes(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


def run(hosts: int, rate_mbit: float, nbytes: int, iters: int, calls: list[str],
        extra_env: dict[str, str], timeout: float) -> list[dict]:
    with netns.lan(hosts, rate_mbit) as net:
        argv = netns.python_argv(WORKER, "worker", "--nbytes", str(nbytes),
                                 "--iters", str(iters))
        for c in calls:
            argv += ["--call", c]
        port = 30000 + (os.getpid() * 7) % 20000
        procs = [net.popen(k, argv, netns.rank_env(k, hosts, port, 0, 1,
                                                   POLYCAST_TIMEOUT=str(timeout),
                                                   **extra_env))
                 for k in range(hosts)]
        results = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=timeout * (len(calls) * iters + 2))
            except subprocess.TimeoutExpired:
                raise SystemExit("a rank overran its bound; namespaces removed")
            line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                raise SystemExit(f"rank failed (exit {p.returncode}):\n{out[-3000:]}")
            results.append(json.loads(line[-1][len("RESULT "):]))
    rows = []
    P = hosts
    for i, spec in enumerate(calls):
        per = [r["calls"][i] for r in sorted(results, key=lambda r: r["rank"])]
        secs = statistics.median(per[0]["seconds"])
        nb = per[0]["nbytes"]
        coll = spec.split(":")[0]
        algbw = nb / secs / 1e9
        busbw = algbw * (P - 1) / P if coll == "allgather" else algbw
        tx = [c["eth0_tx_bytes"] / iters for c in per]
        rx = [c["eth0_rx_bytes"] / iters for c in per]
        rows.append({
            "call": spec, "hosts": P, "rate_mbit": rate_mbit, "nbytes": nb,
            "seconds_median": secs, "seconds": per[0]["seconds"], "busbw_gbps": busbw * 8,
            "busbw_GBps": busbw, "ok": all(c["ok"] for c in per),
            "tx_bytes_per_host": tx, "rx_bytes_per_host": rx,
            "chunk_nbytes": nb // P,
            "recovered_bytes": sum(c["stats"].get("recovered_bytes", 0) for c in per) / iters,
            "recovery_requests": sum(c["stats"].get("recovery_requests", 0)
                                     for c in per) / iters,
            "datagrams_out": sum(c["stats"].get("datagrams_out", 0) for c in per) / iters,
        })
    return rows


def table(rows: list[dict]) -> str:
    mib = float(1 << 20)
    head = (f"{'call':24} {'ok':3} {'ms':>8} {'busbw Mbit/s':>12}  "
            f"{'tx MiB per host (h0..)':28} {'max tx/S':>8} {'recov MiB':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        tx = " ".join(f"{t / mib:5.2f}" for t in r["tx_bytes_per_host"])
        lines.append(f"{r['call']:24} {'yes' if r['ok'] else 'NO':3} "
                     f"{r['seconds_median'] * 1e3:8.1f} {r['busbw_gbps'] * 1e3:12.1f}  "
                     f"{tx:28} {max(r['tx_bytes_per_host']) / r['chunk_nbytes']:8.2f} "
                     f"{r['recovered_bytes'] / mib:9.2f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python bench/netns.py")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate-mbit", type=float, default=200.0)
    ap.add_argument("--nbytes", default="8MiB")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--call", action="append", help=f"default: {' '.join(CALLS)}")
    ap.add_argument("--pacing-gbps", default=None,
                    help="comma-separated POLYCAST_PACING_GBPS settings, one run each; "
                         "'none' = the engine's default (default: none and 0.95 x rate)")
    ap.add_argument("--mtu", type=int, default=None, help="POLYCAST_MTU for the ranks")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "netns.json"))
    args = ap.parse_args()
    reason = netns.unavailable_reason()
    if reason:
        print(f"bench/netns.py: cannot run: {reason}", file=sys.stderr)
        return 2
    pacings = (args.pacing_gbps or f"none,{0.95 * args.rate_mbit / 1e3:g}").split(",")
    t0 = time.monotonic()
    rows: list[dict] = []
    print(f"{args.hosts} hosts, every link tbf {args.rate_mbit:g} Mbit/s both ways, "
          f"{_nbytes(args.nbytes) / (1 << 20):g} MiB, {args.iters} iterations "
          f"(median time; bytes per call), S = nbytes/P = one rank's part")
    for pacing in pacings:
        extra = {}
        if pacing.strip().lower() != "none":
            extra["POLYCAST_PACING_GBPS"] = pacing.strip()
        if args.mtu is not None:
            extra["POLYCAST_MTU"] = str(args.mtu)
        got = run(args.hosts, args.rate_mbit, _nbytes(args.nbytes), args.iters,
                  args.call or CALLS, extra, args.timeout)
        for r in got:
            r["pacing_gbps"] = None if not extra.get("POLYCAST_PACING_GBPS") \
                else float(extra["POLYCAST_PACING_GBPS"])
            r["mtu_nbytes"] = args.mtu
        print(f"\npacing: {pacing.strip()} Gbit/s (POLYCAST_PACING_GBPS)")
        print(table(got))
        ag = {r["call"]: r for r in got}
        if "allgather:ring" in ag and "allgather:mcast" in ag:
            S = ag["allgather:mcast"]["chunk_nbytes"]
            print(f"allgather bytes sent per host: mcast "
                  f"{max(ag['allgather:mcast']['tx_bytes_per_host']) / S:.2f} S, ring "
                  f"{min(ag['allgather:ring']['tx_bytes_per_host']) / S:.2f} S "
                  f"(ideal 1 S vs {args.hosts - 1} S)")
        rows += got
    doc = {"hosts": args.hosts, "rate_mbit": args.rate_mbit, "iters": args.iters,
           "nbytes": _nbytes(args.nbytes), "wall_seconds": time.monotonic() - t0,
           "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
