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


def _rank(args) -> None:
    sys.path.insert(0, REPO)
    import polycast
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
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank:
        _rank(args)
        return 0
    sys.path.insert(0, REPO)
    from rank_jobs import run_ranks
    cmd = [sys.executable, os.path.abspath(__file__), "--rank", "--size", args.size,
           "--iters", str(args.iters), "--warmup", str(args.warmup)]
    rows = run_ranks(cmd, args.nranks, f"bsymm{os.getpid()}", "SYMMROWS", args.timeout, REPO)
    if rows is None:
        return 1
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
