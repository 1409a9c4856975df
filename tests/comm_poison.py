"""A rank program for tests/test_comm_poison.py: every case makes a bad call (on one rank
or all), records what each rank raised, then makes a good call and records its result and
time. Prints one JSON line per case: ``CASE {"name": ..., "error": ..., "next": ...}``."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import polycast
from polycast.collectives import Collective


def attempt(fn):
    try:
        fn()
        return None
    except Exception as exc:            # recorded for the test to judge
        return [type(exc).__name__, str(exc)[:600]]


def timed(fn):
    t0 = time.monotonic()
    try:
        out = fn()
        return {"ok": True, "value": out, "seconds": time.monotonic() - t0}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600],
                "seconds": time.monotonic() - t0}


def main() -> int:
    comm = polycast.init()
    P, r = comm.size, comm.rank
    cases = {}

    def case(name, bad, good):
        cases[name] = {"error": attempt(bad), "next": timed(good)}

    # Gather with a too-small recvbuf on the root only.
    def gather_bad():
        rb = np.zeros(P, np.int64) if r == 0 else None          # needs 2 * P
        comm.Gather(np.array([r, r], np.int64), rb, root=0)

    def gather_good():
        rb = np.zeros(P, np.int64) if r == 0 else None
        comm.Gather(np.array([10 + r], np.int64), rb, root=0)
        return rb.tolist() if r == 0 else None
    case("gather_small_root_recvbuf", gather_bad, gather_good)

    # Bcast where only the root's buffer is bad, on the engine and on the auto path.
    for algo in ("binomial", None):
        def bcast_bad(algo=algo):
            b = np.arange(8, dtype=np.float32)
            comm.Bcast(b[::2] if r == 0 else b[:4], root=0, algorithm=algo)

        def bcast_good(algo=algo):
            b = np.full(4, r, np.float32)
            comm.Bcast(b, root=0, algorithm=algo)
            return b.tolist()
        case(f"bcast_bad_root_buf_{algo or 'auto'}", bcast_bad, bcast_good)

    def allreduce_good():
        y = np.empty(4)
        comm.Allreduce(np.full(4, r + 1.0), y, algorithm="ring")
        return y.tolist()

    # Explicit algorithm: an op the dtype cannot take, a read-only recvbuf.
    case("avg_of_bool_ring",
         lambda: comm.Allreduce(np.ones(4, bool), np.empty(4, bool), op="avg",
                                algorithm="ring"), allreduce_good)

    def readonly():
        y = np.empty(4)
        y.flags.writeable = False
        comm.Allreduce(np.ones(4), y, algorithm="ring")
    case("readonly_recvbuf_ring", readonly, allreduce_good)

    # The same, past every check (as a buggy caller of the internals would): the progress
    # thread must fail the request on every rank and live on.
    def readonly_in_progress_thread():
        y = np.empty(4)
        if r == 1:
            y.flags.writeable = False
        comm._post(Collective.ALLREDUCE, np.ones(4), y, 4, 0, "sum", "ring").Wait()
    case("readonly_past_the_checks", readonly_in_progress_thread, allreduce_good)

    # Aliased buffers are IN_PLACE; partly overlapping ones are refused.
    for algo in ("ring", "recdoubling", "binomial", "rabenseifner", "dbtree"):
        def alias_ar(algo=algo):
            x = np.arange(8, dtype=np.float64) + r
            comm.Allreduce(x, x, algorithm=algo)
            return x.tolist()
        case(f"alias_allreduce_{algo}", lambda: None, alias_ar)
    for algo in ("pairwise", "bruck"):
        def alias_a2a(algo=algo):
            y = np.arange(3 * P, dtype=np.int64) + 100 * r
            comm.Alltoall(y, y, algorithm=algo)
            return y.tolist()
        case(f"alias_alltoall_{algo}", lambda: None, alias_a2a)

    def overlap():
        x = np.zeros(8)
        comm.Allreduce(x[:6], x[2:], algorithm="ring")
    case("overlap_allreduce", overlap, allreduce_good)

    # Object arrays, on one rank only.
    def objects():
        if r == P - 1:
            comm.Allreduce(np.array([1, 2], object), np.empty(2, object))
        else:
            comm.Allreduce(np.ones(2), np.empty(2))
    case("object_dtype_one_rank", objects, allreduce_good)

    # Ranks calling different collectives: every error names both calls.
    def mismatch():
        if r == 0:
            comm.Allgather(np.ones(2), np.empty(2 * P), algorithm="ring")
        else:
            comm.Allreduce(np.ones(2), np.empty(2), algorithm="ring")
    case("mismatch_names_both", mismatch, allreduce_good)

    for name, res in cases.items():
        print("CASE " + json.dumps({"name": name, **res}), flush=True)
    comm.Barrier()
    polycast.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
