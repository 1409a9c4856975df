"""Vector collectives: exact vector schedules against the old padded path, in one run.

    python bench/vector.py [-n 2,4] [--kib 1] [--big 1000] [--reps 10] [--json FILE]

Two skewed calls, float32, on ``n`` ranks of one host:

* ``allgatherv``: counts ``[1, 1, ..., big] x kib`` KiB (the last rank's shard is big, as
  FSDP's uneven shards are at worst);
* ``alltoallv``: every rank sends ``kib`` KiB to each rank and ``big x kib`` KiB to the
  last one (a hot expert in MoE routing).

Paths, timed in alternating rounds (so the machine's load hits all alike):

* ``padded``: what Comm did before the vector schedules, step for step: a count agreement
  (a small engine Allgather) and the uniform collective on blocks padded to the largest
  count, copied out after -- with the same engine algorithm (ring / pairwise);
* ``vector``: ``comm.Allgatherv`` / ``comm.Alltoallv`` with that algorithm: the vector
  schedule, exact blocks, no agreement for Allgatherv (Alltoallv keeps it: each rank knows
  only its own row and column of counts);
* ``padded-auto`` / ``vector-auto``: the same with ``auto`` (the padded allgather may take
  the symmetric-memory path on one host, whose bytes the engine does not count; so may
  ``vector-auto``'s Allgatherv when the planner estimates it faster: its label says so).

``bytes`` are what the engines of all ranks sent for one call (EngineStats.message_bytes_out,
agreement included); ``ms`` the slowest rank's median time per call. Each output is
checked. Prints a table (with ``uptime``'s load) and writes JSON (default
bench/results/vector.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ALGO = {"allgatherv": "ring", "alltoallv": "pairwise"}


def _padded_allgatherv(comm, np, send, out, counts, algo):
    """The pre-vector Comm.Allgatherv for uneven counts (agreement, pad, Allgather, unpad)."""
    P, r = comm.size, comm.rank
    comm._table("Allgatherv", lambda: [len(counts), send.size])
    m = max(counts)
    tmp_send = np.zeros(m, send.dtype)
    tmp_send[:send.size] = send
    tmp = np.empty(P * m, send.dtype)
    comm.Iallgather(tmp_send, tmp, algorithm=algo).Wait()
    pos = 0
    for i, c in enumerate(counts):
        out[pos:pos + c] = tmp[i * m:i * m + c]
        pos += c


def _padded_alltoallv(comm, np, send, scounts, recv, rcounts, algo):
    """The pre-vector Comm.Alltoallv (agreement on the rows, pad, Alltoall, unpad)."""
    P = comm.size
    t = comm._table("Alltoallv", lambda: list(scounts))
    m = int(t.max())
    tmp_send = np.zeros(P * m, send.dtype)
    pos = 0
    for i, c in enumerate(scounts):
        tmp_send[i * m:i * m + c] = send[pos:pos + c]
        pos += c
    tmp = np.empty(P * m, send.dtype)
    comm.Ialltoall(tmp_send, tmp, algorithm=algo).Wait()
    pos = 0
    for i, c in enumerate(rcounts):
        recv[pos:pos + c] = tmp[i * m:i * m + c]
        pos += c


def _rank(args) -> None:
    sys.path.insert(0, REPO)
    import numpy as np

    import polycast
    comm = polycast.init()
    P, r = comm.size, comm.rank
    unit = args.kib * 256                       # float32 elements per KiB
    ag_counts = [unit] * (P - 1) + [args.big * unit]
    a2a = [[unit] * (P - 1) + [args.big * unit] for _ in range(P)]      # a2a[i][j]: i -> j
    scounts, rcounts = a2a[r], [a2a[i][r] for i in range(P)]
    ag_send = np.full(ag_counts[r], r + 1, np.float32)
    ag_want = np.concatenate([np.full(c, i + 1, np.float32) for i, c in enumerate(ag_counts)])
    a2a_send = np.concatenate([np.full(c, r * P + j, np.float32)
                               for j, c in enumerate(scounts)])
    a2a_want = np.concatenate([np.full(c, i * P + r, np.float32)
                               for i, c in enumerate(rcounts)])
    ag_out = np.empty(sum(ag_counts), np.float32)
    a2a_out = np.empty(sum(rcounts), np.float32)

    def run(call, path):
        algo = None if path.endswith("auto") else ALGO[call]
        if call == "allgatherv":
            if path.startswith("padded"):
                _padded_allgatherv(comm, np, ag_send, ag_out, ag_counts, algo)
            else:
                comm.Allgatherv(ag_send, [ag_out, ag_counts], algorithm=algo)
            return ag_out, ag_want
        if path.startswith("padded"):
            _padded_alltoallv(comm, np, a2a_send, scounts, a2a_out, rcounts, algo)
        else:
            comm.Alltoallv([a2a_send, scounts], [a2a_out, rcounts], algorithm=algo)
        return a2a_out, a2a_want

    paths = args.paths.split(",")
    rows = []
    for call in ("allgatherv", "alltoallv"):
        times = {p: [] for p in paths}
        nbytes, ok = {}, {}
        for p in paths:                                 # warm up; bytes of one call
            run(call, p)
            comm.Barrier()
            before = comm.stats().message_bytes_out
            out, want = run(call, p)
            sent = comm.stats().message_bytes_out - before
            ok[p] = bool((out == want).all())
            nbytes[p] = comm.allreduce(sent, op="sum")
        for _ in range(args.reps):                      # alternating rounds
            for p in paths:
                out[:] = -1
                comm.Barrier()
                t0 = time.perf_counter()
                out, want = run(call, p)
                times[p].append(time.perf_counter() - t0)
                ok[p] = ok[p] and bool((out == want).all())
        coll = "allgather" if call == "allgatherv" else "alltoall"
        S = 4 * (sum(ag_counts) if call == "allgatherv" else max(sum(scounts), sum(rcounts)))
        from polycast.collectives import Collective
        auto = "%s/%d" % comm._vector_algorithm(Collective.parse(coll), S, None)
        if call == "allgatherv" and comm._padded_symm_wins(Collective.ALLGATHER, ag_counts,
                                                           np.float32):
            auto = "symm,padded"
        for p in paths:
            med = comm.allreduce(statistics.median(times[p]), op="max")
            good = comm.allreduce(int(ok[p]), op="min")
            rows.append({"call": call, "path": p, "nranks": P, "algorithm":
                         (f"auto({auto})" if p == "vector-auto" else "auto")
                         if p.endswith("auto") else ALGO[call],
                         "engine_bytes": int(nbytes[p]), "ms": med * 1e3,
                         "correct": bool(good),
                         "exact_bytes": 4 * (sum(ag_counts) * (P - 1) if call == "allgatherv"
                                             else sum(a2a[i][j] for i in range(P)
                                                      for j in range(P) if i != j))})
    if r == 0:
        print("VECTORROWS " + json.dumps(rows), flush=True)
    comm.Barrier()
    polycast.finalize()


def _launch(args, nranks: int) -> list[dict] | None:
    from rank_jobs import run_ranks
    cmd = [sys.executable, os.path.abspath(__file__), "--rank", "--kib", str(args.kib),
           "--big", str(args.big), "--reps", str(args.reps), "--paths", args.paths]
    return run_ranks(cmd, nranks, f"bvec{os.getpid()}n{nranks}", "VECTORROWS", args.timeout,
                     REPO)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", default="2,4", help="rank counts, comma-separated")
    p.add_argument("--kib", type=int, default=1, help="the small block, KiB")
    p.add_argument("--big", type=int, default=1000, help="the big block, in small blocks")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--paths", default="padded,vector,padded-auto,vector-auto")
    p.add_argument("--json", default=os.path.join(HERE, "results", "vector.json"))
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank:
        _rank(args)
        return 0
    sys.path.insert(0, REPO)
    rows = []
    for n in (int(x) for x in args.nranks.split(",")):
        got = _launch(args, n)
        if got is None:
            return 1
        rows += got
    load = os.getloadavg()
    print(f"skewed vector calls, float32, small block {args.kib} KiB, big {args.big}x "
          f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print(f"{'call':<11}{'P':>3} {'path':<12}{'algo':<20}{'engine bytes':>14}"
          f"{'exact':>12}{'ms':>9}{'vs padded':>11}")
    base = {(r["call"], r["nranks"], r["path"]): r for r in rows
            if r["path"].startswith("padded")}
    for r in rows:
        ref = base[(r["call"], r["nranks"], r["path"].replace("vector", "padded"))]
        speed = ref["ms"] / r["ms"] if r["ms"] else float("nan")
        r["speedup_vs_padded"] = speed
        print(f"{r['call']:<11}{r['nranks']:>3} {r['path']:<12}{r['algorithm']:<20}"
              f"{r['engine_bytes']:>14,}{r['exact_bytes']:>12,}{r['ms']:>9.2f}"
              f"{speed:>10.2f}x{'' if r['correct'] else '  WRONG DATA'}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"load_average": load, "kib": args.kib, "big": args.big, "reps": args.reps,
                   "rows": rows}, fh, indent=1)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
