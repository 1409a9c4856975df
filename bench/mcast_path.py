"""Multicast at link speed between real hosts (issue 29): polycast's datagram path against
the raw-socket ceiling, in the lab, every figure beside its peer in the same run.

Parts (``--parts``, default all; root for every part but ``offload``):

* ``recv``    - receive cost: 2 lab hosts (unshaped, MTU 9000); rank 0 broadcasts
                ``--recv-nbytes`` by multicast (paced at ``--recv-gbps``), rank 1's CPU
                (user + system, all threads) per byte received, with the compiled datagram
                path and with the Python path (the configuration's test hook), alternating,
                ``--iters`` calls each. Goal: 30 Gbit/s or more per core, 5x the Python path.
                The root's CPU per byte sent is reported beside it (no goal).
* ``lab4``    - 4 hosts, unshaped links, MTU 9000 and 1500, ``--nbytes`` (64 MiB): multicast
                allgather and broadcast against raw multicast senders/receivers
                (bench/lab_raw.c: sendmmsg + UDP GSO, recvmmsg + UDP GRO, the same batched
                syscalls) moving the same bytes in the same pattern, at their loss-free rate
                (unpaced, then paced below what was received until nothing is lost); ring
                allgather (TCP) against a raw TCP ring. Goal: 0.8x of raw.
* ``oversub`` - 8 hosts on 2 leaves, ranks ``interleave``d (every ring neighbour across the
                uplink), host links unshaped: the uplink is shaped to 1/F
                (``--oversub-factors``, default 4 and 8) of the rate the ring allgather moved
                across it unshaped (in the same run), so the ring needs F times the uplink it
                has, while multicast sends each shard across it once (1/7 of the ring's bytes
                there): the paper's oversubscribed fabric. Two factors, because on a machine
                whose cores all 8 hosts share, multicast is held by the hosts' CPU until the
                uplink binds hard enough. Goal: multicast allgather 2x ring allgather.
* ``offload`` - one host (no root needed): the application's CPU per 16 MiB multicast
                allgather on 4 (and 2) ranks, in-process vs offloaded with registered
                buffers, with the helper and without (bench/offload.py in this run).
* ``fuzz``    - bench/fuzz.py's dgram and dgram-asan targets (100,000 inputs each).

The raw tools are compiled with ``cc`` at bench time (skipped with the reason when there
is none). The machine is shared (2 cores here): the load is written beside every part;
ratios hold better than absolute figures, and the lab is CPU-bound. Prints a goal table and
writes bench/results/mcast_path.json.

    sudo python bench/mcast_path.py [--parts recv,lab4,oversub,offload,fuzz] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

RAW_SOURCE = os.path.join(HERE, "lab_raw.c")
GOALS = {"recv_gbps_per_core": 30.0, "recv_vs_python": 5.0, "vs_raw": 0.8,
         "oversub_mcast_vs_ring": 2.0}


# -- inside a rank ----------------------------------------------------------------------------

def worker(argv: list[str]) -> int:
    import numpy as np

    ap = argparse.ArgumentParser()
    ap.add_argument("--call", action="append", required=True)
    ap.add_argument("--nbytes", type=int, required=True)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--datagrams", default="native")
    args = ap.parse_args(argv)
    import polycast
    # the datagram path's test hook (polycast.config.Hooks.dgram), read once by init
    with polycast.config.override(hooks={"dgram": args.datagrams != "python"}):
        comm = polycast.init()
    P, r = comm.size, comm.rank
    count = args.nbytes // 4 // P * P
    full = (np.arange(count, dtype=np.float32) % 65521) + 1
    recv = np.zeros(count, np.float32)
    out = []
    for spec in args.call:
        coll, algo = spec.split(":")
        secs, cpus, ok = [], [], True
        st0 = vars(comm.stats()).copy()
        for _ in range(args.iters + 1):            # the first call warms up
            recv[:] = 0
            if coll == "broadcast" and r == 0:
                recv[:] = full
            send = full.reshape(P, -1)[r].copy()
            comm.Barrier()
            c0 = _cpu()
            t0 = time.perf_counter()
            if coll == "allgather":
                comm.Allgather(send, recv, algorithm=algo)
            else:
                comm.Bcast(recv, 0, algorithm=algo)
            secs.append(time.perf_counter() - t0)
            cpus.append(_cpu() - c0)
            ok = ok and bool(np.array_equal(recv, full))
        st1 = vars(comm.stats())
        res = {"call": spec, "nbytes": count * 4, "ok": ok, "seconds": secs[1:],
               "cpu_s": cpus[1:], "recovered_bytes": st1["recovered_bytes"]
               - st0["recovered_bytes"],
               "datagram_bytes_in": st1["datagram_bytes_in"] - st0["datagram_bytes_in"],
               "native": comm._driver.mcast.placer is not None}
        every = comm.allgather(res)
        out.append(every)
    if r == 0:
        print("RESULT " + json.dumps(out), flush=True)
    polycast.finalize()
    return 0


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# -- running ranks and raw tools in the lab ------------------------------------------------------

def run_ranks(plan, calls: list[str], nbytes: int, iters: int, datagrams: str,
              pacing_gbps: float | None, where=None, timeout: float = 600) -> list:
    import io

    from polycast.lab import runner
    cmd = [sys.executable, os.path.abspath(__file__), "worker", "--nbytes", str(nbytes),
           "--iters", str(iters), "--datagrams", datagrams] + \
        sum((["--call", c] for c in calls), [])
    env = {"POLYCAST_TIMEOUT": "120",
           "POLYCAST_PACING_GBPS": "" if not pacing_gbps else f"{pacing_gbps:g}"}
    out = io.BytesIO()
    status, _ = runner.run(cmd, name=plan.name, where=where, timeout_s=timeout,
                           extra_env=env, stdout=out, stderr=out)
    text = out.getvalue().decode(errors="replace")
    lines = [ln for ln in text.splitlines() if "RESULT " in ln]
    if status != 0 or not lines:
        raise RuntimeError(f"lab run failed (status {status}):\n{text[-4000:]}")
    return json.loads(lines[-1].split("RESULT ", 1)[1])


def build_raw(tmp: str) -> tuple[str | None, str | None]:
    """(path of the compiled raw tool, None) or (None, why not)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) to build bench/lab_raw.c"
    exe = os.path.join(tmp, "lab_raw")
    p = subprocess.run([cc, "-O2", "-pthread", RAW_SOURCE, "-o", exe], capture_output=True,
                       text=True)
    if p.returncode != 0:
        return None, f"bench/lab_raw.c did not build: {p.stderr[-300:]}"
    return exe, None


def raw_mcast(exe: str, plan, senders: int, nbytes_each: int, dgram: int, gbps: float,
              timeout_s: float = 60) -> list[dict]:
    """Every host runs the raw multicast tool at once; returns their JSON lines."""
    group, port = "239.255.77.7", 31777
    procs = [subprocess.Popen(["ip", "netns", "exec", plan.host_ns(k), exe, "mcast", str(k),
                               str(plan.hosts), str(senders), group, str(port), plan.addr(k),
                               str(nbytes_each), str(dgram), f"{gbps:g}", str(timeout_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(plan.hosts)]
    return [_raw_result(p, timeout_s) for p in procs]


def raw_tcp_ring(exe: str, plan, nbytes: int, timeout_s: float = 60) -> list[dict]:
    port = 31888
    procs = [subprocess.Popen(["ip", "netns", "exec", plan.host_ns(k), exe, "tcpring", str(k),
                               str(plan.hosts), str(port), plan.addr((k + 1) % plan.hosts),
                               str(port), str(nbytes), str(timeout_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(plan.hosts)]
    return [_raw_result(p, timeout_s) for p in procs]


def _raw_result(p: subprocess.Popen, timeout_s: float) -> dict:
    try:
        out, err = p.communicate(timeout=timeout_s + 30)
    except subprocess.TimeoutExpired:
        p.kill()                                        # our own child, by pid
        out, err = p.communicate()
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"raw tool failed ({p.returncode}): {err[-500:]}") from None


def raw_mcast_lossfree(exe: str, plan, senders: int, nbytes_each: int, dgram: int,
                       tries: int = 5) -> dict:
    """The raw multicast pattern at its loss-free rate: unpaced first, then paced at 0.85x
    the slowest receiver's rate until no receiver lost a datagram (at most ``tries``)."""
    gbps, attempts = 0.0, []
    for _ in range(tries):
        res = raw_mcast(exe, plan, senders, nbytes_each, dgram, gbps)
        lost = sum(r["lost_datagrams"] for r in res)
        secs = max(r["seconds"] for r in res)
        got = max(r["received_bytes"] for r in res)
        attempts.append({"pace_gbps": gbps, "lost_datagrams": lost, "seconds": secs})
        if lost == 0:
            return {"seconds": secs, "pace_gbps": gbps, "attempts": attempts,
                    "receive_gbps": got * 8 / max(secs, 1e-6) / 1e9,
                    "cpu_receive_s": [r["cpu_receive_s"] for r in res],
                    "gro_buffers": sum(r["gro_buffers"] for r in res), "gso": res[0]["gso"]}
        rate = got * 8 / max(secs, 1e-6) / 1e9 / max(1, senders - (senders > 1))
        gbps = 0.85 * (rate if gbps == 0 else min(gbps, rate))
    return {"seconds": None, "pace_gbps": gbps, "attempts": attempts,
            "error": "lost datagrams at every rate tried"}


# -- the parts ------------------------------------------------------------------------------------

def part_recv(args, say) -> dict:
    """Receiver CPU per byte, compiled vs Python path, alternating in one lab."""
    from polycast.lab import LabPlan, netns
    plan = LabPlan.parse(name=f"{args.name}r", hosts=2, leaves=1, link="none", mtu=9000)
    netns.up(plan)
    rows = {"native": [], "python": []}
    try:
        for rep in range(args.reps):
            for dg in ("native", "python"):
                res = run_ranks(plan, ["broadcast:mcast"], args.recv_nbytes, args.iters, dg,
                                args.recv_gbps)[0]
                tx, rx = res[0], res[1]
                rows[dg].append({"cpu_s": sum(rx["cpu_s"]), "root_cpu_s": sum(tx["cpu_s"]),
                                 "bytes": rx["nbytes"] * len(rx["cpu_s"]),
                                 "seconds": rx["seconds"], "ok": all(r["ok"] for r in res),
                                 "native": rx["native"], "recovered_bytes": rx["recovered_bytes"],
                                 "datagram_bytes_in": rx["datagram_bytes_in"]})
                say(f"  recv {dg:6s} rep {rep}: {_gbps_per_core(rows[dg][-1]):.2f} Gbit/s per "
                    f"core (receiver cpu {rows[dg][-1]['cpu_s']:.3f} s for "
                    f"{rows[dg][-1]['bytes'] / 2**20:.0f} MiB; root "
                    f"{_gbps_per_core(rows[dg][-1], 'root_cpu_s'):.2f}), wall "
                    f"{statistics.median(rx['seconds']) * 1e3:.0f} ms per call")
    finally:
        netns.down(plan.name)
    best = {dg: max(_gbps_per_core(r) for r in rs) for dg, rs in rows.items()}
    root = {dg: max(_gbps_per_core(r, "root_cpu_s") for r in rs) for dg, rs in rows.items()}
    return {"rows": rows, "gbps_per_core": best, "root_gbps_per_core": root,
            "vs_python": best["native"] / best["python"] if best["python"] else None,
            "datagram_nbytes": 9000 - 28 - 44, "pace_gbps": args.recv_gbps}


def _gbps_per_core(row: dict, cpu: str = "cpu_s") -> float:
    return row["bytes"] * 8 / row[cpu] / 1e9 if row[cpu] > 0 else 0.0


def part_lab4(args, exe: str | None, why: str | None, say) -> dict:
    from polycast.lab import LabPlan, netns
    out = {}
    N = args.nbytes
    for mtu in args.mtus:
        plan = LabPlan.parse(name=f"{args.name}f", hosts=4, leaves=1, link="none", mtu=mtu)
        netns.up(plan)
        try:
            P = plan.hosts
            dgram = mtu - 28                                   # one frame, as polycast's
            row: dict = {"mtu": mtu}
            if exe is not None:
                ag = raw_mcast_lossfree(exe, plan, P, N // P, dgram)
                bc = raw_mcast_lossfree(exe, plan, 1, N, dgram)
                ring = raw_tcp_ring(exe, plan, N * (P - 1) // P)
                row["raw"] = {"allgather": ag, "broadcast": bc,
                              "tcp_ring": {"seconds": max(r["seconds"] for r in ring),
                                           "ok": all(r["received_bytes"] == N * (P - 1) // P
                                                     for r in ring)}}
                # the raw senders' loss-free pace (0: unpaced lost nothing)
                pace = {"allgather": ag.get("pace_gbps"), "broadcast": bc.get("pace_gbps")}
            else:
                row["raw"] = {"skipped": why}
                pace = {"allgather": 0, "broadcast": 0}
            got = {}
            for call in ("allgather:mcast", "broadcast:mcast", "allgather:ring"):
                coll = call.split(":")[0]
                # multicast under the raw run's condition: unpaced when raw lost nothing
                # unpaced, else the same load on a receiver (P-1 raw senders at once,
                # polycast's allgather 2 streams at once)
                p = pace.get(coll) if call.endswith("mcast") else None
                per_stream = (p * (P - 1) / 2 if coll == "allgather" else p) if p else None
                res = run_ranks(plan, [call], N, args.iters, "native", per_stream)[0]
                secs = statistics.median(max(r["seconds"][i] for r in res)
                                         for i in range(args.iters))
                got[call] = {"seconds": secs, "ok": all(r["ok"] for r in res),
                             "algbw_gbps": N * 8 / secs / 1e9, "pace_gbps": per_stream,
                             "recovered_bytes": sum(r["recovered_bytes"] for r in res)}
            row["polycast"] = got
            if exe is not None:
                pairs = {"allgather:mcast": ag.get("seconds"), "broadcast:mcast": bc.get("seconds"),
                         "allgather:ring": row["raw"]["tcp_ring"]["seconds"]}
                row["vs_raw"] = {c: (pairs[c] / got[c]["seconds"]) if pairs[c] else None
                                 for c in pairs}
            for c, g in got.items():
                say(f"  lab4 MTU {mtu} {c:16s} {g['algbw_gbps']:.2f} Gbit/s algbw"
                    + (f", {row['vs_raw'][c]:.2f}x raw" if exe and row['vs_raw'][c] else ""))
        finally:
            netns.down(plan.name)
        out[str(mtu)] = row
    return out


def part_oversub(args, say) -> dict:
    from polycast.lab import LabPlan, netns
    N = args.oversub_nbytes
    plan = LabPlan.parse(name=f"{args.name}o", hosts=8, leaves=2, link="none", mtu=9000)
    netns.up(plan)
    try:
        from polycast.lab import counters
        # 1. unshaped: what a ring allgather moves across the uplink, and how fast
        before = counters.read(plan)
        ring0 = run_ranks(plan, ["allgather:ring"], N, args.iters, "native", None,
                          where="interleave")[0]
        moved = counters.diff(counters.read(plan), before)
        up_bytes = moved.nbytes["leaf0->spine"] / (args.iters + 1)
        t_ring0 = statistics.median(max(r["seconds"][i] for r in ring0)
                                    for i in range(args.iters))
        need_bps = up_bytes * 8 / t_ring0
        say(f"  oversub: unshaped ring allgather moved {up_bytes / 2**20:.1f} MiB up leaf0's "
            f"uplink per call in {t_ring0 * 1e3:.0f} ms ({need_bps / 1e9:.2f} Gbit/s)")
        rows = []
        for factor in args.oversub_factors:
            uplink_bps = max(1e6, need_bps / factor)
            cur = netns.reshape_uplinks(plan.name, uplink_bps)
            got = {}
            for call in ("allgather:ring", "allgather:mcast"):
                # two streams at once may cross one uplink direction: each at half of it
                pace = uplink_bps / 1e9 / 2 if call.endswith("mcast") else None
                res = run_ranks(cur, [call], N, args.iters, "native", pace,
                                where="interleave")[0]
                secs = statistics.median(max(r["seconds"][i] for r in res)
                                         for i in range(args.iters))
                got[call] = {"seconds": secs, "ok": all(r["ok"] for r in res),
                             "algbw_gbps": N * 8 / secs / 1e9, "pace_gbps": pace,
                             "recovered_bytes": sum(r["recovered_bytes"] for r in res)}
                say(f"  oversub 1/{factor:g}, uplink {uplink_bps / 1e9:.3f} Gbit/s: {call:16s} "
                    f"{secs * 1e3:.0f} ms ({got[call]['algbw_gbps']:.3f} Gbit/s algbw)")
            rows.append({"factor": factor, "uplink_gbps": uplink_bps / 1e9, "calls": got,
                         "mcast_vs_ring": got["allgather:ring"]["seconds"]
                         / got["allgather:mcast"]["seconds"]})
    finally:
        netns.down(plan.name)
    return {"nbytes": N, "unshaped_ring_s": t_ring0, "ring_uplink_bytes": up_bytes,
            "ring_needs_uplink_gbps": need_bps / 1e9, "rows": rows}


def part_offload(args, say) -> dict:
    sys.path.insert(0, HERE)
    import offload as ob
    ns = argparse.Namespace(size=16 << 20, calls=args.offload_calls, seconds=0.5, mtu=0)
    rows = []
    for P in args.offload_ranks:
        for dg in ("native", "python"):
            for mode, workers in (("thread", 0), ("offload", 1)):
                row = ob.summarize(P, mode, workers, False,
                                   ob.run_job(P, mode, workers, False, ns, dg), dg)
                rows.append(row)
                say(f"  offload P={P} {dg:6s} {mode:7s}: app cpu "
                    f"{row['app_cpu_ms_per_call']:.2f} ms per 16 MiB allgather")
    ratio = {}
    for P in args.offload_ranks:
        for dg in ("native", "python"):
            t = next(r for r in rows if (r["nranks"], r["datagrams"], r["mode"]) == (P, dg, "thread"))
            o = next(r for r in rows if (r["nranks"], r["datagrams"], r["mode"]) == (P, dg, "offload"))
            ratio[f"P={P},{dg}"] = t["app_cpu_ms_per_call"] / o["app_cpu_ms_per_call"]
    return {"rows": rows, "thread_over_offload_app_cpu": ratio}


def part_fuzz(args, say) -> dict:
    out = os.path.join(tempfile.gettempdir(), f"polycast-fuzz-{os.getpid()}.json")
    p = subprocess.run([sys.executable, os.path.join(HERE, "fuzz.py"), "--targets",
                        "dgram,dgram-asan", "--inputs", str(args.fuzz_inputs), "--out", out],
                       capture_output=True, text=True, timeout=7200)
    say("  " + "\n  ".join(p.stdout.strip().splitlines()[:3]))
    try:
        with open(out) as fh:
            doc = json.load(fh)
    finally:
        if os.path.exists(out):
            os.unlink(out)
    return {"status": p.returncode, "results": doc["results"]}


# -- the table ---------------------------------------------------------------------------------

def goal_rows(doc: dict) -> list[list[str]]:
    rows = []
    r = doc.get("recv")
    if r:
        n, py = r["gbps_per_core"]["native"], r["gbps_per_core"]["python"]
        rows.append(["receive CPU per byte, 8.9 KB datagrams", f"{n:.1f} Gbit/s per core",
                     f">= {GOALS['recv_gbps_per_core']:g}", _met(n >= GOALS["recv_gbps_per_core"])])
        rows.append(["  vs the Python path, same run", f"{r['vs_python']:.1f}x ({py:.1f} Gbit/s)",
                     f">= {GOALS['recv_vs_python']:g}x", _met(r["vs_python"] >= GOALS["recv_vs_python"])])
        if "root_gbps_per_core" in r:
            tn, tp = r["root_gbps_per_core"]["native"], r["root_gbps_per_core"]["python"]
            rows.append(["  the root's CPU per byte sent (no goal)",
                         f"{tn:.1f} Gbit/s per core, {tn / tp:.1f}x Python ({tp:.1f})" if tp
                         else f"{tn:.1f} Gbit/s per core", "", ""])
    for mtu, row in (doc.get("lab4") or {}).items():
        for call, v in (row.get("vs_raw") or {}).items():
            peer = "raw TCP ring" if call.endswith("ring") else "raw multicast"
            rows.append([f"lab 4 hosts MTU {mtu}: {call} / {peer}",
                         "-" if v is None else f"{v:.2f}x", f">= {GOALS['vs_raw']:g}x",
                         "-" if v is None else _met(v >= GOALS["vs_raw"])])
        if "skipped" in row.get("raw", {}):
            rows.append([f"lab 4 hosts MTU {mtu}: raw ceiling", row["raw"]["skipped"], "", "skipped"])
    o = doc.get("oversub")
    for row in (o or {}).get("rows", []):
        rows.append([f"8 hosts 2 leaves, interleave, uplink {row['uplink_gbps']:.3f} Gbit/s "
                     f"(1/{row['factor']:g} of the ring's need): mcast / ring allgather",
                     f"{row['mcast_vs_ring']:.2f}x",
                     f">= {GOALS['oversub_mcast_vs_ring']:g}x",
                     _met(row["mcast_vs_ring"] >= GOALS["oversub_mcast_vs_ring"])])
    off = doc.get("offload")
    if off:
        for k, v in off["thread_over_offload_app_cpu"].items():
            rows.append([f"offload app CPU, in-process / offloaded ({k})", f"{v:.1f}x lower",
                         "(today 9.8-25x)", "-"])
    f = doc.get("fuzz")
    if f:
        for t, res in f["results"].items():
            rows.append([f"fuzz {t}", f"{res.get('inputs')} inputs: {res.get('status')}",
                         "no crash, no write outside", _met(f["status"] == 0)])
    return rows


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python bench/mcast_path.py")
    ap.add_argument("--parts", default="recv,lab4,oversub,offload,fuzz")
    ap.add_argument("--nbytes", default="64MiB", help="lab4: collective size")
    ap.add_argument("--mtus", default="9000,1500")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="recv: alternations")
    ap.add_argument("--recv-nbytes", default="64MiB")
    ap.add_argument("--recv-gbps", type=float, default=2.0,
                    help="recv: the root's pacing (Gbit/s); the receiver must keep up")
    ap.add_argument("--oversub-nbytes", default="16MiB")
    ap.add_argument("--oversub-factors", default="4,8",
                    help="oversub: the uplink gets 1/F of what the unshaped ring moved, for "
                         "each F")
    ap.add_argument("--offload-ranks", default="4,2")
    ap.add_argument("--offload-calls", type=int, default=8)
    ap.add_argument("--fuzz-inputs", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 iteration")
    ap.add_argument("--name", default="pcpath")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "mcast_path.json"))
    args = ap.parse_args()

    from polycast.lab import netns
    from polycast.units import parse_size
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if args.quick:
        args.nbytes, args.recv_nbytes, args.oversub_nbytes = "8MiB", "8MiB", "4MiB"
        args.iters, args.reps, args.fuzz_inputs, args.offload_calls = 1, 1, 4000, 3
    args.nbytes, args.recv_nbytes = parse_size(args.nbytes), parse_size(args.recv_nbytes)
    args.oversub_nbytes = parse_size(args.oversub_nbytes)
    args.mtus = [int(x) for x in args.mtus.split(",")]
    args.offload_ranks = [int(x) for x in args.offload_ranks.split(",")]
    args.oversub_factors = [float(x) for x in args.oversub_factors.split(",")]
    reason = netns.unavailable_reason()
    if reason and set(parts) & {"recv", "lab4", "oversub"}:
        print(f"bench/mcast_path.py: lab parts skipped: {reason}", file=sys.stderr)
        parts = [p for p in parts if p not in ("recv", "lab4", "oversub")]

    def say(text: str) -> None:
        print(text, flush=True)
    doc: dict = {"bench": "mcast_path", "command": "python bench/mcast_path.py " + " ".join(sys.argv[1:]),
                 "goals": GOALS, "cpus": os.cpu_count(), "load": {}}
    with tempfile.TemporaryDirectory(prefix="polycast-raw-") as tmp:
        exe, why = build_raw(tmp) if {"lab4"} & set(parts) else (None, None)
        for part in parts:
            load0 = os.getloadavg()
            t0 = time.monotonic()
            say(f"{part} (load {load0[0]:.1f})")
            if part == "recv":
                doc["recv"] = part_recv(args, say)
            elif part == "lab4":
                doc["lab4"] = part_lab4(args, exe, why, say)
            elif part == "oversub":
                doc["oversub"] = part_oversub(args, say)
            elif part == "offload":
                doc["offload"] = part_offload(args, say)
            elif part == "fuzz":
                doc["fuzz"] = part_fuzz(args, say)
            else:
                ap.error(f"unknown part {part!r}")
            doc["load"][part] = {"before": load0[0], "after": os.getloadavg()[0],
                                 "seconds": round(time.monotonic() - t0, 1)}
    rows = goal_rows(doc)
    doc["table"] = rows
    widths = [max(len(r[i]) for r in rows + [["goal", "measured", "target", ""]]) for i in range(4)]
    print()
    for r in [["goal", "measured", "target", ""]] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("load per part: " + ", ".join(f"{k} {v['before']:.1f}->{v['after']:.1f}"
                                        for k, v in doc["load"].items())
          + f" ({os.cpu_count()} cores, shared)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker(sys.argv[2:]))
    sys.exit(main())
