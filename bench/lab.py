"""Ring against multicast on an emulated leaf-spine cluster, beside the simulator's
prediction for the same network (issues 12 and 29).

A lab of 8 hosts on 2 leaves (``polycast lab``: namespaces, bridges, tbf-shaped veths),
host links at ``--link`` (default 100 Mbit/s, MTU 9000), uplinks first 1:1, then 4:1
oversubscribed (reshaped in place). For each oversubscription, each number of ranks per
host (``--ranks-per-host``, default 1; ``lab run --ranks-per-host R``: R consecutive ranks
per host) and each placement of nodes on hosts (``linear``: ring neighbours share a leaf;
``interleave``: alternate leaves, as a topology-blind scheduler may place them) it runs,
``--iters`` times each:

* one rank per host: allgather: ring, mcast;  broadcast (root 0): chain (the pipelined
  ring), mcast;  FSDP: an allgather (ring or mcast) and a ring reduce-scatter of the same
  size posted together and waited together (one layer's prefetch beside the previous
  layer's gradients);
* several ranks per host, the hierarchical algorithms (NCCL's chain inside a host, a ring,
  tree or multicast across hosts) beside the flat ones: allgather: ring, hring, ring2d,
  mcast, hmcast;  allreduce: ring, hring, ring2d, hdbtree, hmcast;  broadcast: hdbtree,
  hmcast.

Each row: time (median iteration, slowest rank), busbw (nccl-tests; FSDP: the two
collectives' bus bytes over the time), bytes per link layer from the kernel's counters
(between counter marks around the iterations, per iteration), the CPU the ranks used and
the machine's load over the row, and the simulator's prediction for the same topology
(``ranks_per_host=R``: the lab's hosts with R rank slots joined at the rate measured
between two ranks of one host in the same run), rates, placement, schedule (algorithm,
chunks) and pacing, with the error.

Multicast is paced at host link / roots, as the simulator's engines are (roots = 2 streams
at a time for allgather and allreduce, 1 for broadcast).

    sudo python bench/lab.py [--link 100Mbps] [--nbytes 8MiB] [--iters 3] [--quick]
    sudo python bench/lab.py --ranks-per-host 2,4 --hosts 4 --oversub 1

Prints the table and writes bench/results/lab.json. Root only; the lab is removed at the
end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

CALLS_PACED_BY_2 = ["allgather:ring", "allgather:mcast", "fsdp:ring", "fsdp:mcast"]
CALLS_PACED_BY_1 = ["broadcast:chain", "broadcast:mcast"]
# Several ranks per host: the hierarchical algorithms beside the flat ones.
HIER_PACED_BY_2 = ["allgather:ring", "allgather:hring", "allgather:ring2d", "allgather:mcast",
                   "allgather:hmcast", "allreduce:ring", "allreduce:hring", "allreduce:ring2d",
                   "allreduce:hdbtree", "allreduce:hmcast"]
HIER_PACED_BY_1 = ["broadcast:hdbtree", "broadcast:hmcast"]
INTRA_PROBE_NBYTES = 8 << 20


# -- the rank program ----------------------------------------------------------------------

def worker(argv: list[str]) -> int:
    import numpy as np

    import polycast
    from polycast.collectives import Collective
    from polycast.lab.marks import mark

    ap = argparse.ArgumentParser()
    ap.add_argument("--call", action="append", required=True)
    ap.add_argument("--nbytes", type=int, required=True)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args(argv)
    comm = polycast.init()
    P, r = comm.size, comm.rank
    count = args.nbytes // 4 // P * P
    full = (np.arange(count, dtype=np.float32) % 65521) + 1
    # One small message's time, host to host, measured apart from the rows: a barrier
    # (dissemination) is ceil(log2 P) rounds of one message each way.
    for _ in range(5):
        comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(20):
        comm.Barrier()
    rounds = max(1, (P - 1).bit_length())
    msg_lat = max(comm.allgather((time.perf_counter() - t0) / 20 / rounds))
    intra_bps = comm.bcast(_intra_host_bps(comm, np) if r < 2 else None, 0)
    out = []
    for spec in args.call:
        coll, algo = spec.split(":")
        if coll == "allgather":
            send, recv = full.reshape(P, -1)[r].copy(), np.zeros(count, np.float32)
        elif coll == "allreduce":
            send, recv = full.copy(), np.zeros(count, np.float32)
        elif coll == "broadcast":
            buf = full.copy() if r == 0 else np.zeros(count, np.float32)
        else:                                          # fsdp: allgather + reduce-scatter
            send, recv = full.reshape(P, -1)[r].copy(), np.zeros(count, np.float32)
            gsend, grecv = full.copy(), np.zeros(count // P, np.float32)
        comm.Barrier()
        mark(comm, f"begin {spec}")
        secs, cpu, ok = [], time.process_time(), True
        st0 = vars(comm.stats()).copy()
        for _ in range(args.iters):
            comm.Barrier()
            t0 = time.perf_counter()
            if coll == "allgather":
                comm.Allgather(send, recv, algorithm=algo)
            elif coll == "allreduce":
                comm.Allreduce(send, recv, "sum", algorithm=algo)
            elif coll == "broadcast":
                comm.Bcast(buf, 0, algorithm=algo)
            else:
                reqs = [comm.Iallgather(send, recv, algorithm=algo),
                        comm.Ireduce_scatter_block(gsend, grecv, "sum", algorithm="ring")]
                for q in reqs:
                    q.Wait()
            secs.append(time.perf_counter() - t0)
            if coll == "broadcast":
                ok = ok and bool(np.array_equal(buf, full))
            elif coll == "allreduce":      # small integers: every order of sums is exact
                ok = ok and bool(np.array_equal(recv, full * P))
            else:
                ok = ok and bool(np.array_equal(recv, full))
            if coll == "fsdp":
                ok = ok and bool(np.array_equal(
                    grecv, full.reshape(P, -1)[r] * P))
        cpu = time.process_time() - cpu
        st1 = vars(comm.stats())
        mark(comm, f"end {spec}")
        # The schedules this call ran (the simulator runs the same ones).
        scheds = []
        if coll in ("allgather", "fsdp"):
            scheds.append(("allgather", algo, count // P, 0, count * 4))
        if coll == "broadcast":
            scheds.append(("broadcast", algo, count, 0, count * 4))
        if coll == "allreduce":
            scheds.append(("allreduce", algo, count, 0, count * 4))
        if coll == "fsdp":
            scheds.append(("reduce_scatter", "ring", count // P, 0, count * 4))
        built = [(c, a, cnt, rt, comm._schedule(Collective.parse(c), a, cnt, rt, tot).options)
                 for c, a, cnt, rt, tot in scheds]
        worst = comm.allgather(secs)
        oks = comm.allgather(ok)
        cpus = comm.allgather(cpu)
        recovered = comm.allgather(st1["recovered_bytes"] - st0["recovered_bytes"])
        out.append({"call": spec, "nbytes": count * 4, "ok": all(oks),
                    "seconds": [max(w[i] for w in worst) for i in range(args.iters)],
                    "rank_cpu_s": sum(cpus), "recovered_bytes": sum(recovered),
                    "schedules": built})
    if r == 0:
        print("RESULT " + json.dumps({"calls": out, "message_latency_s": msg_lat,
                                      "intra_host_bps": intra_bps}), flush=True)
    polycast.finalize()
    return 0


def _intra_host_bps(comm, np) -> float | None:
    """Ranks 0 and 1 (the first node's first two ranks, when they share a host) time an
    8 MiB exchange over their shared-memory rings: the simulator's intra-host rate."""
    import os
    if int(os.environ.get("POLYCAST_LOCAL_SIZE", "1")) < 2:
        return None
    buf = np.zeros(INTRA_PROBE_NBYTES // 4, np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)
        else:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)
        best = min(best, (time.perf_counter() - t0) / 2)
    return INTRA_PROBE_NBYTES * 8 / best


# -- the simulator's prediction ----------------------------------------------------------------

def predict(plan, nodes: list[int], R: int, call: dict, pacing_gbps: float, model: dict,
            intra_host_bps: float | None = None) -> dict:
    """Simulate the call's schedules on the lab's topology (R rank slots per host, node g's
    ranks on host ``nodes[g]``); time and bytes per layer."""
    from polycast.algorithms import build
    from polycast.sim.driver import SimConfig, Simulation
    from polycast.sim.simulate import make_result
    from polycast.collectives import Collective
    from polycast.schedule.guard import with_barrier
    topo = plan.sim_topology(ranks_per_host=R, intra_host_bps=intra_host_bps,
                             **model.get("topology", {}))
    P = len(nodes) * R
    slots = tuple(nodes[r // R] * R + r % R for r in range(P))
    eng = {"line_rate_gbps": plan.link_bps / 1e9, "pacing_gbps": pacing_gbps}
    cfg = SimConfig(engine=eng, placement=slots, **model.get("sim", {}))
    sim = Simulation(topo, cfg)
    reqs = []
    for c, a, cnt, rt, opts in call["schedules"]:
        opts = dict(opts)
        agreed = opts.pop("agreed", False)      # the runtime's entry barrier (schedule/guard)
        sched = build(c, a, P, cnt, root=rt, **opts)
        if agreed:
            sched = with_barrier(sched)
        reqs.append(sim.post(sched, 4))
    sim.run()
    res = make_result(sim, reqs, Collective.parse(call["schedules"][0][0]),
                      call["call"], call["nbytes"], 0.0)
    return {"time_s": res.time_s, "link_bytes_by_layer": res.link_bytes_by_layer}


# -- the orchestration ------------------------------------------------------------------------

def busbw_gbps(call: str, nbytes: int, P: int, seconds: float) -> float:
    coll = call.split(":")[0]
    factor = {"allgather": (P - 1) / P, "broadcast": 1.0, "fsdp": 2 * (P - 1) / P,
              "allreduce": 2 * (P - 1) / P}[coll]
    return nbytes * factor / seconds * 8 / 1e9


def run_group(plan, where: str, calls: list[str], nbytes: int, iters: int,
              pacing_gbps: float, timeout: float, R: int = 1) -> list[dict]:
    import io

    from polycast.lab import counters, runner
    place = runner.placement(plan, where, None, R)
    cmd = [sys.executable, os.path.abspath(__file__), "worker", "--nbytes", str(nbytes),
           "--iters", str(iters)] + sum((["--call", c] for c in calls), [])
    out = io.BytesIO()
    status, marks = runner.run(cmd, name=plan.name, where=list(place.nodes), timeout_s=timeout,
                               ranks_per_host=R,
                               extra_env={"POLYCAST_PACING_GBPS": f"{pacing_gbps:g}",
                                          "POLYCAST_TIMEOUT": "60"},
                               marks=True, stdout=out, stderr=out, prefix=True)
    text = out.getvalue().decode(errors="replace")
    lines = [ln for ln in text.splitlines() if "RESULT " in ln]
    if status != 0 or not lines:
        raise SystemExit(f"lab run failed (status {status}):\n{text[-4000:]}")
    doc = json.loads(lines[-1].split("RESULT ", 1)[1])
    results = doc["calls"]
    rows = []
    for i, res in enumerate(results):
        (lb, sb, _), (le, se, _) = marks[2 * i], marks[2 * i + 1]
        assert lb == f"begin {res['call']}" and le == f"end {res['call']}", (lb, le)
        moved = counters.diff(se, sb)
        secs = statistics.median(res["seconds"])
        wall = sum(res["seconds"])
        rows.append({**res, "placement": where, "nodes": list(place.nodes), "ranks_per_host": R,
                     "hosts": place.hosts, "pacing_gbps": pacing_gbps,
                     "intra_host_bps": doc.get("intra_host_bps"),
                     "seconds_median": secs,
                     "busbw_gbps": busbw_gbps(res["call"], res["nbytes"], place.nranks, secs),
                     "link_bytes_by_layer": {k: v / iters for k, v in
                                             counters.by_layer(plan, moved).items()},
                     "queue_drops": sum(moved.drops.values()) / iters,
                     "message_latency_s": doc["message_latency_s"],
                     "ranks_cpu_cores": res["rank_cpu_s"] / wall if wall else 0.0,
                     "machine_busy_cores": se.busy_cores(sb)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(prog="python bench/lab.py")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--leaves", type=int, default=2)
    ap.add_argument("--link", default="100Mbps")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--nbytes", default="8MiB")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--oversub", default="1,4", help="uplink oversubscriptions to run")
    ap.add_argument("--placement", default="linear,interleave")
    ap.add_argument("--ranks-per-host", default="1",
                    help="ranks per host to run, e.g. 1,2,4 (R > 1: the hierarchical "
                         "algorithms)")
    ap.add_argument("--quick", action="store_true", help="2 MiB, 2 iterations")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--name", default="pcbench")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "lab.json"))
    args = ap.parse_args()

    from polycast.lab import LabPlan, netns
    from polycast.units import parse_size
    reason = netns.unavailable_reason()
    if reason:
        print(f"bench/lab.py: cannot run: {reason}", file=sys.stderr)
        return 2
    nbytes = parse_size("2MiB" if args.quick else args.nbytes)
    iters = 2 if args.quick else args.iters
    plan = LabPlan.parse(name=args.name, hosts=args.hosts, leaves=args.leaves,
                         link=args.link, mtu=args.mtu)
    oversubs = [float(x) for x in args.oversub.split(",")]
    placements = args.placement.split(",")
    rphs = [int(x) for x in args.ranks_per_host.split(",")]
    link_gbps = plan.link_bps / 1e9
    t_start = time.monotonic()
    rows = []
    load0 = os.getloadavg()
    netns.up(plan)
    try:
        for ov in oversubs:
            cur = netns.reshape_uplinks(plan.name, plan.link_bps * plan.hosts_per_leaf / ov)
            for R, where in ((R, w) for R in rphs for w in placements):
                groups = (((CALLS_PACED_BY_2, 2), (CALLS_PACED_BY_1, 1)) if R == 1 else
                          ((HIER_PACED_BY_2, 2), (HIER_PACED_BY_1, 1)))
                for calls, roots in groups:
                    got = run_group(cur, where, calls, nbytes, iters, link_gbps / roots,
                                    args.timeout, R)
                    for row in got:
                        row["oversub"] = ov
                        sim = (cur, row["nodes"], R, row, row["pacing_gbps"])
                        ideal = predict(*sim, {}, row["intra_host_bps"])
                        model = {"sim": {"host_latency_s": row["message_latency_s"]}}
                        pred = predict(*sim, model, row["intra_host_bps"])
                        row["sim_ideal_time_s"] = ideal["time_s"]
                        row["sim_ideal_error"] = ideal["time_s"] / row["seconds_median"] - 1
                        row["sim_time_s"] = pred["time_s"]
                        row["sim_link_bytes_by_layer"] = pred["link_bytes_by_layer"]
                        row["sim_error"] = pred["time_s"] / row["seconds_median"] - 1
                        print(_line(row), flush=True)
                    rows += got
    finally:
        netns.down(plan.name)
    doc = {"plan": plan.to_json(), "nbytes": nbytes, "iters": iters,
           "model": "sim: lab topology, shaped rates, same placement, schedules and pacing; "
                    "'ideal' = ideal hosts; 'sim' adds host_latency_s = the small-message "
                    "latency measured by barriers at the start of each run",
           "loadavg_before": load0, "loadavg_after": os.getloadavg(),
           "wall_s": time.monotonic() - t_start, "rows": rows}
    summary = _summary(rows, plan)
    doc["summary"] = summary
    print("\n" + "\n".join(summary["lines"]))
    print(f"load average before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f} "
          f"(2 cores, shared machine)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out}")
    return 0 if all(r["ok"] for r in rows) else 1


HEADER = (f"{'oversub':>7} {'R':>2} {'placement':10} {'call':17} {'ok':3} {'ms':>8} "
          f"{'busbw Mb/s':>10} "
          f"{'host-leaf MB':>12} {'leaf-spine MB':>13} {'ideal ms':>8} {'err':>6} "
          f"{'sim ms':>8} {'err':>6} {'recov MB':>8} {'qdrops':>6} {'cpu ranks/machine':>17}")


def _line(r: dict) -> str:
    lb = r["link_bytes_by_layer"]
    if not getattr(_line, "said", False):
        print(HEADER + "\n" + "-" * len(HEADER))
        _line.said = True
    return (f"{r['oversub']:>5g}:1 {r['ranks_per_host']:>2} {r['placement']:10} {r['call']:17} "
            f"{'yes' if r['ok'] else 'NO':3} {r['seconds_median'] * 1e3:8.1f} "
            f"{r['busbw_gbps'] * 1e3:10.1f} {lb.get('host-leaf', 0) / 1e6:12.2f} "
            f"{lb.get('leaf-spine', 0) / 1e6:13.2f} {r['sim_ideal_time_s'] * 1e3:8.1f} "
            f"{r['sim_ideal_error'] * 100:5.1f}% {r['sim_time_s'] * 1e3:8.1f} "
            f"{r['sim_error'] * 100:5.1f}% {r['recovered_bytes'] / 1e6 / len(r['seconds']):8.2f} "
            f"{r['queue_drops']:6.0f} "
            f"{r['ranks_cpu_cores']:8.2f}/{r['machine_busy_cores']:.2f}")


def _summary(rows: list[dict], plan) -> dict:
    lines, out = [], {"ratios": [], "speedups": [], "misses": []}
    key = {(r["oversub"], r["ranks_per_host"], r["placement"], r["call"]): r for r in rows}
    for (ov, R, where, call), r in key.items():
        if call not in ("allgather:mcast", "allgather:hmcast"):
            continue
        ring = key.get((ov, R, where, "allgather:ring" if call == "allgather:mcast"
                        else "allgather:hring"))
        if ring is None:
            continue
        tot = lambda d: sum(d.values())                                      # noqa: E731
        lab_ratio = tot(ring["link_bytes_by_layer"]) / tot(r["link_bytes_by_layer"])
        ideal = tot(ring["sim_link_bytes_by_layer"]) / tot(r["sim_link_bytes_by_layer"])
        off = lab_ratio / ideal - 1
        speed = ring["seconds_median"] / r["seconds_median"]
        pair = f"{ring['call'].split(':')[1]}/{call.split(':')[1]}"
        out["ratios"].append({"oversub": ov, "ranks_per_host": R, "placement": where,
                              "pair": pair, "lab": lab_ratio, "ideal": ideal, "off": off})
        out["speedups"].append({"oversub": ov, "ranks_per_host": R, "placement": where,
                                "pair": pair, "speedup": speed})
        lines.append(f"allgather {ov:g}:1 R={R} {where:10}: network bytes {pair} "
                     f"{lab_ratio:.3f} (ideal for this topology and placement {ideal:.3f}, "
                     f"{off * 100:+.1f}%{'' if abs(off) <= 0.02 else ' MISS >2%'}); "
                     f"{call.split(':')[1]} {speed:.2f}x faster")
    n = len(rows)
    ideal_ok = sum(abs(r["sim_ideal_error"]) <= 0.15 for r in rows)
    for r in rows:
        if abs(r["sim_error"]) > 0.15:
            out["misses"].append((r["oversub"], r["ranks_per_host"], r["placement"], r["call"],
                                  r["sim_error"], r["recovered_bytes"] / len(r["seconds"]),
                                  r["queue_drops"]))
    lat = sorted(r["message_latency_s"] for r in rows)
    lines.append(f"small-message latency measured per run: {lat[0] * 1e3:.2f}..{lat[-1] * 1e3:.2f} ms")
    intra = sorted({r["intra_host_bps"] for r in rows if r.get("intra_host_bps")})
    if intra:
        lines.append(f"rate between two ranks of one host (the simulator's intra-host links), "
                     f"measured per run: {intra[0] / 1e9:.2f}..{intra[-1] / 1e9:.2f} Gbit/s")
    lines.append(f"simulator within 15%: {ideal_ok} of {n} rows with ideal hosts, "
                 f"{n - len(out['misses'])} of {n} with the measured host latency"
                 + ("" if not out["misses"] else "; misses: " + ", ".join(
                     f"{ov:g}:1 R={R} {w} {c} {e * 100:+.0f}% (lab recovered {rb / 1e6:.2f} MB "
                     f"per call, {qd:.0f} queue drops{': switch buffer overflow' if qd else ''})"
                     for ov, R, w, c, e, rb, qd in out["misses"])))
    out["lines"] = lines
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker(sys.argv[2:]))
    sys.exit(main())
