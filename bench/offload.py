"""What share of the host does a collective cost, progressed in-process or offloaded?
(issue 11: the application's CPU per 16 MiB multicast allgather on 4 ranks down at least
5x with offload, and more compute done while allgathers stream.)

    python bench/offload.py [-n 2,4] [--size 16MiB] [--workers 1,2,4] [--calls 8]
                            [--seconds 1.5] [--mtu BYTES] [--datagrams native,python]
                            [--json FILE]

For each datagram path (``--datagrams``: the compiled helper, the Python path, or both in
the same run), each rank count and mode — ``thread`` (in-process progress), ``offload`` with 1, 2, 4
receive workers and registered buffers (``comm.empty``), and ``offload`` with 1 worker and
ordinary arrays (``staged``: copied into registered memory and back) — one job runs
``--calls`` blocking ``Allgather(algorithm="mcast")`` of ``--size`` bytes in total (the
recvbuf), then a compute loop alone and beside a stream of ``Iallgather``:

* ``app cpu ms``: CPU seconds (``time.process_time``: every thread of the rank's process)
  per allgather, mean over ranks; ``wall ms`` per allgather;
* ``offload cpu ms``: CPU of the offload process plus its workers per allgather (the work
  moved off the application: on a SmartNIC it would leave the host);
* ``chunks/s/worker``: chunks the workers placed per CPU second of theirs (a chunk placed
  into 3 local ranks counts 3), the rate one worker sustains; ``wall`` the same per wall
  second while the allgathers ran;
* ``compute``: 128x128 float64 matmuls per second over all ranks, alone and while
  allgathers stream (``Iallgather`` then units until ``Test()``); ``kept`` = with/alone,
  and allgathers done per second meanwhile.

The machine is shared and has 2 cores (4 ranks are oversubscribed): compare rows of one
run; ``uptime`` load is recorded. Writes bench/results/offload.json (``rows``, and
``chunks_per_s_per_worker``: the measured receive rate the NIC model's host-python preset
can use).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GOAL_CPU_RATIO = 5.0


def _nbytes(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "b": 1}
    t = text.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[:-len(u)]) * m)
    return int(t)


# -- inside a rank ----------------------------------------------------------------------------
def rank_main(argv) -> int:
    import numpy as np

    import polycast
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode")
    ap.add_argument("--staged", action="store_true")
    ap.add_argument("--size", type=int)
    ap.add_argument("--calls", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--datagrams", default="native")
    a = ap.parse_args(argv)
    # the datagram path's test hook (polycast.config.Hooks.dgram; same-run comparison)
    with polycast.config.override(hooks={"dgram": a.datagrams != "python"}):
        comm = polycast.init(progress="offload" if a.mode == "offload" else "thread")
    r, P = comm.rank, comm.size
    count = a.size // 4 // P
    registered = a.mode == "offload" and not a.staged
    alloc = comm.empty if registered else np.empty
    send = alloc(count, np.float32)
    recv = alloc(count * P, np.float32)
    send[:] = r
    for _ in range(2):
        comm.Allgather(send, recv, algorithm="mcast")
    assert np.all(recv.reshape(P, -1) == np.arange(P, dtype=np.float32)[:, None])
    reporter = a.mode == "offload" and r == 0
    drv = comm._driver
    comm.Barrier()
    s0 = drv.offload_stats() if reporter else None
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(a.calls):
        comm.Allgather(send, recv, algorithm="mcast")
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    s1 = drv.offload_stats() if reporter else None
    comm.Barrier()

    # compute alone, then beside a stream of allgathers (every rank at once)
    m = np.random.default_rng(r).random((128, 128))

    def unit():
        m @ m
    comm.Barrier()
    n_alone, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        unit()
        n_alone += 1
    alone_s = time.perf_counter() - t0
    comm.Barrier()
    n_with = n_gathers = 0
    t0 = time.perf_counter()
    stop = comm.allreduce(t0) / P + a.seconds      # the same end on every rank (about)
    while True:
        req = comm.Iallgather(send, recv, algorithm="mcast")
        while not req.Test():
            unit()
            n_with += 1
        n_gathers += 1
        if comm.allreduce(int(time.perf_counter() > stop), op="max"):
            break
    with_s = time.perf_counter() - t0
    res = {"rank": r, "cpu_s": cpu, "wall_s": wall, "calls": a.calls,
           "units_alone_per_s": n_alone / alone_s, "units_with_per_s": n_with / with_s,
           "gathers_per_s": n_gathers / with_s}
    if reporter:
        res["offload"] = _offload_delta(s0, s1)
    print("RESULT " + json.dumps(res), flush=True)
    polycast.finalize()
    return 0


def _offload_delta(s0: dict, s1: dict) -> dict:
    workers = []
    for w0, w1 in zip(s0["workers"], s1["workers"]):
        workers.append({"cpu_s": w1["cpu_s"] - w0["cpu_s"],
                        "placed": w1["placed"] - w0["placed"],
                        "placed_nbytes": w1["placed_nbytes"] - w0["placed_nbytes"],
                        "datagrams": w1["datagrams"] - w0["datagrams"]})
    return {"server_cpu_s": s1["cpu_s"] - s0["cpu_s"], "workers": workers}


# -- the driver of the benchmark ----------------------------------------------------------
def run_job(P: int, mode: str, workers: int, staged: bool, args,
            datagrams: str = "native") -> list[dict]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               POLYCAST_OFFLOAD_WORKERS=str(workers))
    if args.mtu:
        env["POLYCAST_MTU"] = str(args.mtu)
    cmd = [sys.executable, "-m", "polycast.tools.launch", "-n", str(P), "--timeout", "300",
           os.path.abspath(__file__), "--rank", "--mode", mode, "--size", str(args.size),
           "--calls", str(args.calls), "--seconds", str(args.seconds),
           "--datagrams", datagrams]
    if staged:
        cmd.append("--staged")
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
    results = []
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            results.append(json.loads(line.split("RESULT ", 1)[1]))
    if out.returncode != 0 or len(results) != P:
        raise SystemExit(f"{mode} P={P} failed ({out.returncode}):\n{out.stdout[-3000:]}\n"
                         f"{out.stderr[-3000:]}")
    return results


def summarize(P: int, mode: str, workers: int, staged: bool, results: list[dict],
              datagrams: str = "native") -> dict:
    calls = results[0]["calls"]
    row = {"nranks": P, "mode": mode, "workers": workers if mode == "offload" else 0,
           "datagrams": datagrams,
           "buffers": "staged" if staged else ("registered" if mode == "offload" else "numpy"),
           "app_cpu_ms_per_call": 1e3 * sum(r["cpu_s"] for r in results) / len(results) / calls,
           "wall_ms_per_call": 1e3 * max(r["wall_s"] for r in results) / calls,
           "compute_alone_per_s": sum(r["units_alone_per_s"] for r in results),
           "compute_with_per_s": sum(r["units_with_per_s"] for r in results),
           "gathers_per_s": min(r["gathers_per_s"] for r in results)}
    row["compute_kept"] = row["compute_with_per_s"] / row["compute_alone_per_s"]
    off = next((r["offload"] for r in results if "offload" in r), None)
    if off is not None:
        wall = max(r["wall_s"] for r in results)
        cpu = off["server_cpu_s"] + sum(w["cpu_s"] for w in off["workers"])
        row["offload_cpu_ms_per_call"] = 1e3 * cpu / calls
        row["chunks_per_s_per_worker"] = [w["placed"] / w["cpu_s"] if w["cpu_s"] > 0 else None
                                          for w in off["workers"]]
        row["chunks_per_wall_s_per_worker"] = [w["placed"] / wall for w in off["workers"]]
        row["chunk_nbytes"] = (off["workers"][0]["placed_nbytes"] / off["workers"][0]["placed"]
                               if off["workers"] and off["workers"][0]["placed"] else None)
    return row


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rank":
        return rank_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", default="2,4", help="rank counts (default 2,4)")
    ap.add_argument("--size", default="16MiB", help="allgather recvbuf bytes (default 16MiB)")
    ap.add_argument("--workers", default="1,2,4", help="offload worker counts")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.5, help="each compute phase")
    ap.add_argument("--mtu", type=int, default=0, help="datagram payload bytes (default: "
                    "the job's, 60000 on one host)")
    ap.add_argument("--datagrams", default="native",
                    help="datagram paths to run: native (the compiled helper, where built), "
                         "python, or both: native,python")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "offload.json"))
    args = ap.parse_args(argv)
    args.size = _nbytes(args.size)
    load0 = os.getloadavg()
    rows = []
    for P in [int(x) for x in args.n.split(",")]:
        plan = [("thread", 0, False)] + [("offload", int(w), False)
                                         for w in args.workers.split(",")]
        plan.append(("offload", 1, True))
        for dg in args.datagrams.split(","):
            for mode, workers, staged in plan:
                row = summarize(P, mode, workers, staged,
                                run_job(P, mode, workers, staged, args, dg), dg)
                rows.append(row)
                print(_line(row), flush=True)
    load1 = os.getloadavg()
    for P, dg in {(r["nranks"], r["datagrams"]) for r in rows}:
        base = next(r for r in rows if r["nranks"] == P and r["mode"] == "thread"
                    and r["datagrams"] == dg)
        for r in rows:
            if r["nranks"] == P and r["datagrams"] == dg:
                r["app_cpu_ratio_vs_thread"] = (base["app_cpu_ms_per_call"]
                                                / r["app_cpu_ms_per_call"])
                r["compute_with_vs_thread"] = (r["compute_with_per_s"]
                                               / base["compute_with_per_s"])
    _table(rows)
    per_worker = {}
    for r in rows:
        if r["mode"] == "offload" and r["buffers"] == "registered":
            rates = [x for x in r.get("chunks_per_s_per_worker") or [] if x]
            if rates:
                per_worker[f"P={r['nranks']},workers={r['workers']}"] = sum(rates) / len(rates)
    doc = {"bench": "offload", "size_nbytes": args.size, "calls": args.calls,
           "loadavg_before": load0, "loadavg_after": load1, "cpus": os.cpu_count(),
           "goal_app_cpu_ratio": GOAL_CPU_RATIO, "rows": rows,
           "chunks_per_s_per_worker": per_worker,
           "chunk_nbytes": next((r["chunk_nbytes"] for r in rows if r.get("chunk_nbytes")),
                                None)}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.json} (load {load0[0]:.1f} -> {load1[0]:.1f} on "
          f"{os.cpu_count()} cpus)")
    return 0


def _line(r: dict) -> str:
    return (f"P={r['nranks']} {r['datagrams']:6s} {r['mode']:7s} w={r['workers']} "
            f"{r['buffers']:10s} app cpu "
            f"{r['app_cpu_ms_per_call']:.2f} ms/call, wall {r['wall_ms_per_call']:.1f} ms")


def _table(rows: list[dict]) -> None:
    hdr = ["P", "datagrams", "mode", "workers", "buffers", "app cpu ms", "vs thread", "wall ms",
           "offload cpu ms", "chunks/s/worker (cpu)", "(wall)", "compute alone/s",
           "with gathers/s", "kept", "gathers/s"]
    lines = [hdr]
    for r in rows:
        cps = r.get("chunks_per_s_per_worker")
        cpw = r.get("chunks_per_wall_s_per_worker")
        lines.append([
            str(r["nranks"]), r["datagrams"], r["mode"], str(r["workers"]), r["buffers"],
            f"{r['app_cpu_ms_per_call']:.2f}", f"{r['app_cpu_ratio_vs_thread']:.1f}x",
            f"{r['wall_ms_per_call']:.1f}",
            f"{r['offload_cpu_ms_per_call']:.1f}" if "offload_cpu_ms_per_call" in r else "-",
            "/".join(f"{x / 1e3:.0f}k" for x in cps if x) if cps else "-",
            "/".join(f"{x / 1e3:.0f}k" for x in cpw) if cpw else "-",
            f"{r['compute_alone_per_s']:.0f}", f"{r['compute_with_per_s']:.0f}",
            f"{r['compute_kept']:.2f}", f"{r['gathers_per_s']:.1f}"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(hdr))]
    for i, row in enumerate(lines):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    sys.exit(main())
