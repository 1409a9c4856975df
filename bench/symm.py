"""Symmetric memory vs ring on one host (issue 5, build item 2): busbw of 16 MiB allgather,
reduce-scatter and allreduce with ``algorithm="symm"`` (peers read each other's
``comm.symm_empty`` arrays) beside ``ring`` (the engine's schedule over the shm rings).

Sizes follow nccl-tests (S = the larger per-rank buffer, busbw = S/t x factor); the time
is the slowest rank's average over ``--iters`` back-to-back calls after a barrier. Each row
is checked exactly against numpy once. Usage::

    python bench/symm.py [-n 4] [--size 16MiB,8] [--iters 10]

Rows: ``symm`` (the arrays come from comm.symm_empty), ``auto`` (ordinary arrays, default
algorithm: polycast stages them itself), ``staged`` (ordinary arrays, copied by this script
into a symmetric one per call), ``ring`` (the engine's ring).

Small sizes (below 64 KiB) run 30x the iterations: they measure latency.

``--floor`` measures instead what an 8-byte ``auto`` call costs (issue 9: the per-call floor
of the staged path): per call, the slowest rank's wall time, the CPU time of a rank (mean),
and how the compiled helper's barrier waits went (polls, sched_yields and futex sleeps per
call and rank; "n/a" when the Python barrier runs), for blocking calls and ``I...().Wait()``::

    python bench/symm.py --floor [-n 4] [--iters 3000]

Prints a table and writes the rows to bench/results/symm.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
COLLS = ("allgather", "reduce_scatter", "allreduce")
# "staged": the user's arrays are ordinary ones; each call copies the input into a symmetric
# array first (and, for allreduce, the result out): what an automatic symm path for plain
# buffers would cost.
# "auto": ordinary arrays with the default algorithm, which on one host takes the staged
# symm path inside polycast (one copy in; runtime/symm.py staged_*).
ALGOS = ("symm", "auto", "staged", "ring")


def _floor_rows(comm, iters: int) -> list[dict]:
    """8-byte auto calls: wall, CPU and barrier waits per call (see --floor)."""
    from polycast.runtime.symm.barrier import compiled
    P = comm.size
    s, d, g = np.ones(2, np.float32), np.empty(2, np.float32), np.empty(2 * P, np.float32)
    calls = {"Allreduce": lambda: comm.Allreduce(s, d),
             "Iallreduce.Wait": lambda: comm.Iallreduce(s, d).Wait(),
             "Bcast": lambda: comm.Bcast(d, 0),
             "Allgather": lambda: comm.Allgather(s[:1], g[:P])}
    rows = []
    for name, fn in calls.items():
        for _ in range(200):
            fn()
        comm.Barrier()
        w0 = compiled.stats() if compiled is not None else None
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(iters):
            fn()
        got = np.array([time.perf_counter() - t0, time.process_time() - c0, 0, 0, 0, 0])
        if w0 is not None:
            w1 = compiled.stats()
            got[2:] = [w1[k] - w0[k] for k in ("waits", "polls", "yields", "sleeps")]
        most, total = np.empty_like(got), np.empty_like(got)
        comm.Allreduce(got, most, op="max")
        comm.Allreduce(got, total, op="sum")
        per = total / P / iters
        rows.append({"call": name, "nranks": P, "time_us": most[0] / iters * 1e6,
                     "cpu_us": per[1] * 1e6,
                     "waits": per[2] if w0 is not None else None, "polls": per[3],
                     "yields": per[4], "sleeps": per[5]})
    return rows


def _rank(args) -> None:
    sys.path.insert(0, REPO)
    import polycast
    if args.floor:
        comm = polycast.init()
        rows = _floor_rows(comm, args.iters)
        if comm.rank == 0:
            print("SYMMROWS " + json.dumps(rows), flush=True)
        comm.Barrier()
        polycast.finalize()
        return
    from polycast.collectives import Collective
    from polycast.units import parse_size
    comm = polycast.init()
    P, r = comm.size, comm.rank
    rows = []
    for S, cname, algo in [(parse_size(t), c, a) for t in args.size.split(",")
                           for c in COLLS for a in ALGOS]:
        coll = Collective.parse(cname)
        n = max(P, S // 4 - (S // 4) % P)          # float32 elements of the big buffer
        iters = args.iters * (30 if S < 1 << 16 else 1)
        alloc = comm.symm_empty if algo == "symm" else (lambda k, dt: np.empty(k, dt))
        how = {"ring": "ring", "auto": None}.get(algo, "symm")
        stage = comm.symm_empty(n, np.float32) if algo == "staged" else None
        if coll is Collective.ALLGATHER:
            send, recv = alloc(n // P, np.float32), np.empty(n, np.float32)
            send[:] = r + 1
            if stage is None:
                fn = lambda: comm.Allgather(send, recv, algorithm=how)   # noqa: E731
            else:
                def fn():
                    stage[:n // P] = send
                    comm.Allgather(stage[:n // P], recv, algorithm=how)
            want = np.repeat(np.arange(1, P + 1, dtype=np.float32), n // P)
        elif coll is Collective.REDUCE_SCATTER:
            send, recv = alloc(n, np.float32), np.empty(n // P, np.float32)
            send[:] = r + 1
            if stage is None:
                fn = lambda: comm.Reduce_scatter_block(send, recv, algorithm=how)  # noqa
            else:
                def fn():
                    stage[:] = send
                    comm.Reduce_scatter_block(stage, recv, algorithm=how)
            want = np.full(n // P, P * (P + 1) / 2, np.float32)
        else:
            send, recv = alloc(n, np.float32), alloc(n, np.float32)
            send[:] = r + 1
            if stage is None:
                fn = lambda: comm.Allreduce(send, recv, algorithm=how)   # noqa: E731
            else:
                def fn():
                    comm.Allreduce(send, stage, algorithm=how)    # copies send in first
                    recv[:] = stage
            want = np.full(n, P * (P + 1) / 2, np.float32)
        recv[:] = 0
        fn()
        ok = np.array([np.array_equal(recv, want)], np.int32)
        for _ in range(args.warmup * (iters // args.iters)):
            fn()
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t = np.array([(time.perf_counter() - t0) / iters])
        comm.Allreduce(polycast.IN_PLACE, t, op="max")
        comm.Allreduce(polycast.IN_PLACE, ok, op="min")
        nbytes = n * 4
        algbw = nbytes / t[0] / 1e9
        rows.append({"collective": cname, "algorithm": algo, "nranks": P,
                     "nbytes": nbytes, "time_us": t[0] * 1e6, "algbw": algbw,
                     "busbw": algbw * coll.busbw_factor(P), "correct": bool(ok[0])})
    if r == 0:
        print("SYMMROWS " + json.dumps(rows), flush=True)
    comm.Barrier()
    polycast.finalize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", type=int, default=4)
    p.add_argument("--size", default="16MiB,8", help="comma-separated sizes (nccl-tests S)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results", "symm.json"))
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--floor", action="store_true",
                   help="the per-call floor of 8-byte auto calls (see the module doc)")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.floor and args.iters == 10:
        args.iters = 3000
    if args.rank:
        _rank(args)
        return 0
    sys.path.insert(0, REPO)
    from rank_jobs import run_ranks
    cmd = [sys.executable, os.path.abspath(__file__), "--rank", "--size", args.size,
           "--iters", str(args.iters), "--warmup", str(args.warmup)]
    if args.floor:
        cmd.append("--floor")
    rows = run_ranks(cmd, args.nranks, f"bsymm{os.getpid()}", "SYMMROWS", args.timeout, REPO)
    if rows is None:
        return 1
    if args.floor:
        print(f"8-byte auto calls, {args.nranks} ranks, {args.iters} calls; per call: "
              "slowest rank's wall, a rank's CPU, its barrier waits (compiled helper)")
        print(f"{'call':<18}{'wall us':>9}{'CPU us':>9}{'waits':>8}{'polls':>8}{'yields':>8}"
              f"{'sleeps':>8}")
        for row in rows:
            w = (f"{row['waits']:>8.2f}{row['polls']:>8.2f}{row['yields']:>8.2f}"
                 f"{row['sleeps']:>8.3f}" if row["waits"] is not None else f"{'n/a':>8}")
            print(f"{row['call']:<18}{row['time_us']:>9.1f}{row['cpu_us']:>9.1f}{w}")
        out = args.out.replace("symm.json", "symm-floor.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as fh:
            json.dump(rows, fh, indent=1)
        return 0
    print(f"{'collective':<16}{'algo':<8}{'ranks':>6}{'bytes':>11}{'time us':>11}"
          f"{'algbw':>8}{'busbw':>8}  ok")
    for row in rows:
        print(f"{row['collective']:<16}{row['algorithm']:<8}{row['nranks']:>6}"
              f"{row['nbytes']:>11}{row['time_us']:>11.0f}{row['algbw']:>8.2f}"
              f"{row['busbw']:>8.2f}  {'yes' if row['correct'] else 'NO'}")
    for nbytes in sorted({row["nbytes"] for row in rows}, reverse=True):
        for cname in COLLS:
            by = {row["algorithm"]: row["time_us"] for row in rows
                  if row["collective"] == cname and row["nbytes"] == nbytes}
            if by.get("symm"):
                print(f"{cname} {nbytes} B: symm is {by['ring'] / by['symm']:.2f}x faster "
                      f"than ring (auto: {by['ring'] / by['auto']:.2f}x, "
                      f"staged: {by['ring'] / by['staged']:.2f}x)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)
    return 0 if all(row["correct"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
