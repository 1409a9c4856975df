"""Rank script for tests/test_mismatch.py: the last rank calls each collective differently
(collective, size, dtype, op, root, algorithm; on the engine, multicast and symmetric-memory
paths), then skips one. Every case must raise on every rank within the timeout and leave
the communicator usable: a correct allreduce follows each. Prints ``MISMATCH {json}``."""

from __future__ import annotations

import json
import time

import numpy as np

import polycast
from polycast.errors import PolycastError


def cases(comm):
    odd = comm.rank == comm.size - 1
    f32 = lambda n: np.ones(n, np.float32)                      # noqa: E731
    out = lambda n, dt=np.float32: np.empty(n, dt)              # noqa: E731
    P = comm.size
    return [
        ("collective", lambda: comm.Allgather(f32(25), out(25 * P), algorithm="ring")
         if odd else comm.Allreduce(f32(100), out(100), algorithm="ring")),
        ("size", lambda: comm.Allreduce(f32(101 if odd else 100), out(101 if odd else 100),
                                        algorithm="ring")),
        ("dtype", lambda: comm.Allreduce(np.ones(50, np.float64), out(50, np.float64),
                                         algorithm="ring") if odd else
         comm.Allreduce(f32(100), out(100), algorithm="ring")),
        ("op", lambda: comm.Allreduce(f32(100), out(100), op="max" if odd else "sum",
                                      algorithm="ring")),
        ("root", lambda: comm.Bcast(f32(100), root=1 if odd else 0, algorithm="binomial")),
        ("algorithm", lambda: comm.Allreduce(f32(100), out(100),
                                             algorithm="dbtree" if odd else "ring")),
        ("mcast size", lambda: comm.Allgather(f32(300 if odd else 299),
                                              out((300 if odd else 299) * P),
                                              algorithm="mcast")),
        ("mcast vs ring", lambda: comm.Allgather(f32(64), out(64 * P),
                                                 algorithm="ring" if odd else "mcast")),
        ("symm size", lambda: comm.Allreduce(f32(1001 if odd else 1000),
                                             out(1001 if odd else 1000))),
    ]


def main() -> None:
    comm = polycast.init()
    report = []
    for name, call in cases(comm):
        t0 = time.monotonic()
        try:
            call()
            err = None
        except PolycastError as exc:
            err = f"{type(exc).__name__}: {exc}"
        try:
            ok_after = check_usable(comm)
        except PolycastError as exc:
            print(f"not usable after {name}: {exc}", flush=True)
            ok_after = False
        report.append({"case": name, "error": err, "seconds": time.monotonic() - t0,
                       "usable_after": ok_after})
    # Skipping a collective: the last rank goes straight to the barrier.
    t0 = time.monotonic()
    try:
        if comm.rank != comm.size - 1:
            comm.Allreduce(np.ones(10, np.float32), np.empty(10, np.float32),
                           algorithm="ring")
        comm.Barrier()
        err = None
    except PolycastError as exc:
        err = f"{type(exc).__name__}: {exc}"
    report.append({"case": "skip", "error": err, "seconds": time.monotonic() - t0})
    print("MISMATCH " + json.dumps({"rank": comm.rank, "cases": report}), flush=True)


def check_usable(comm) -> bool:
    x = np.full(10, comm.rank + 1, np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y, algorithm="ring")
    return bool((y == comm.size * (comm.size + 1) / 2).all())


if __name__ == "__main__":
    main()
