"""Checks the runtime end to end on real processes: every collective and every registered
algorithm against :mod:`polycast.reference`, exact results.

    polycast run -n 4 -m polycast.tools.selftest [--suite all|algos|api|mismatch|death|mcast]

Each rank prints ``FAIL ...`` lines for failed checks and ends with
``SELFTEST <suite> OK <n> checks`` (exit 0) or ``SELFTEST <suite> FAILED <k> of <n>`` (exit 1).
The ``mismatch`` and ``death`` suites check the error paths: a rank calling with a different
size makes every rank raise MismatchError; a rank that dies makes the others raise PeerLost
naming it within the timeout.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback

import numpy as np

from .. import comm as pcomm
from ..algorithms import get, supported
from ..collectives import Collective
from ..errors import CollectiveTimeout, MismatchError, PeerLost, PolycastError
from ..reference import make_inputs, reference


class Checker:
    def __init__(self, comm) -> None:
        self.comm, self.n, self.failed = comm, 0, []
        self.algos: set[tuple[str, str]] = set()     # (collective, algorithm) exercised

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.n += 1
        if not ok:
            self.failed.append(name)
            print(f"FAIL {name} {detail}", flush=True)

    def run(self, name: str, fn) -> None:
        try:
            fn()
        except Exception as exc:           # record and go on: one bad check, one FAIL line
            self.n += 1
            self.failed.append(name)
            print(f"FAIL {name} raised {exc!r}\n{traceback.format_exc()}", flush=True)


# Each collective's blocking buffer method (its I-variant is "I" + the name, lower-cased
# first letter: Iallreduce) and its positional arguments from (send, recv, root, op, rank).
_METHODS = {
    Collective.BROADCAST: ("Bcast", lambda s, r, root, op, me: (r, root)),
    Collective.REDUCE: ("Reduce", lambda s, r, root, op, me: (s, r, op, root)),
    Collective.ALLREDUCE: ("Allreduce", lambda s, r, root, op, me: (s, r, op)),
    Collective.ALLGATHER: ("Allgather", lambda s, r, root, op, me: (s, r)),
    Collective.REDUCE_SCATTER: ("Reduce_scatter_block", lambda s, r, root, op, me: (s, r, op)),
    Collective.SCATTER: ("Scatter", lambda s, r, root, op, me: (s if me == root else None, r,
                                                                 root)),
    Collective.GATHER: ("Gather", lambda s, r, root, op, me: (s, r, root)),
    Collective.ALLTOALL: ("Alltoall", lambda s, r, root, op, me: (s, r)),
    Collective.SCAN: ("Scan", lambda s, r, root, op, me: (s, r, op)),
    Collective.EXSCAN: ("Exscan", lambda s, r, root, op, me: (s, r, op)),
    Collective.BARRIER: ("Barrier", lambda s, r, root, op, me: ()),
}


def call(comm, coll: Collective, send, recv, root: int, op: str, algorithm: str | None,
         blocking: bool = True):
    """``coll``'s I-variant (``Iallreduce``...), waited for when ``blocking``, else its
    request is returned. Broadcast copies ``send`` into the root's ``recv`` first."""
    if coll is Collective.BROADCAST and comm.rank == root:
        recv[...] = send
    name, args = _METHODS[coll]
    req = getattr(comm, "I" + name[0].lower() + name[1:])(
        *args(send, recv, root, op, comm.rank), algorithm=algorithm)
    if blocking:
        req.Wait()
        return None
    return req


def blocking_call(comm, coll: Collective, send, recv, root: int, op: str,
                  algorithm: str | None):
    """A callable that makes the blocking form of :func:`call` (``Allreduce`` rather than
    ``Iallreduce().Wait()``) with these arguments: what an MPI program calls, and what the
    MPI peers of ``bench/peers.py`` time (a bench calls it in its timed loop: nothing
    between it and the method). Bcast leaves the root's buffer as it is (fill it first)."""
    name, args = _METHODS[coll]
    return functools.partial(getattr(comm, name), *args(send, recv, root, op, comm.rank),
                             algorithm=algorithm)


def one(ck: Checker, coll: Collective, algo: str | None, count: int, root: int = 0,
        op: str = "sum", dtype: str = "float32", seed: int = 0) -> None:
    comm = ck.comm
    P, r = comm.size, comm.rank
    inputs = make_inputs(coll, P, count, dtype, root=root, seed=seed, op=op)
    expect = reference(coll, inputs, root=root, op=op)
    _, nrecv = coll.buffer_counts(P, count)
    recv = np.full(nrecv, 99, dtype=dtype) if expect[r] is not None or \
        coll in (Collective.BROADCAST, Collective.EXSCAN) else None
    if coll in (Collective.REDUCE, Collective.GATHER) and r != root:
        recv = None
    name = f"{coll}/{algo or 'auto'}/P{P}/n{count}/root{root}/{op}/{dtype}"
    if algo:
        ck.algos.add((str(coll), algo))

    def go():
        call(comm, coll, inputs[r].copy(), recv, root, op, algo)
        if expect[r] is not None:
            ck.check(name, recv is not None and np.array_equal(recv, expect[r]),
                     f"got {recv[:8] if recv is not None else None} want {expect[r][:8]}")
        else:
            ck.check(name, True)
    ck.run(name, go)


def suite_algos(ck: Checker) -> None:
    comm = ck.comm
    P = comm.size
    for coll in Collective:
        for algo in supported(coll, P):
            a = get(coll, algo)
            if a.multicast and comm.mcast_error:
                continue
            roots = sorted({0, P - 1}) if coll.rooted else [0]
            counts = [0] if coll is Collective.BARRIER else [1, 1000]
            for count in counts:
                for root in roots:
                    one(ck, coll, algo, count, root)
            if coll.has_op:
                one(ck, coll, algo, 33, 0, op="max", dtype="int32")
                one(ck, coll, algo, 33, P - 1 if coll.rooted else 0,
                    op="prod" if coll.ordered else "avg", dtype="float64")   # scans: no avg


def suite_api(ck: Checker) -> None:
    comm = ck.comm
    P, r = comm.size, comm.rank
    # auto choices at small and large sizes (the large ones are pipelined)
    for coll in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.BROADCAST,
                 Collective.REDUCE_SCATTER):
        one(ck, coll, None, 5)
        one(ck, coll, None, 300_000 if coll is not Collective.ALLGATHER else 300_000 // P)

    # in place
    def inplace():
        x = np.arange(10, dtype=np.int64) * (r + 1)
        comm.Allreduce(pcomm.IN_PLACE, x)
        ck.check("inplace/allreduce", np.array_equal(
            x, np.arange(10) * sum(i + 1 for i in range(P))))
        g = np.zeros(3 * P, np.int32)
        g[3 * r:3 * r + 3] = r
        comm.Allgather(pcomm.IN_PLACE, g)
        ck.check("inplace/allgather", np.array_equal(g, np.repeat(np.arange(P), 3)))
        rs = np.ones(2 * P, np.float32) * (r + 1)
        comm.Reduce_scatter_block(pcomm.IN_PLACE, rs)
        ck.check("inplace/reduce_scatter", np.all(rs[:2] == sum(i + 1 for i in range(P))))
        red = np.ones(4, np.float64) * r
        if r == 0:
            comm.Reduce(pcomm.IN_PLACE, red, root=0)
            ck.check("inplace/reduce", np.all(red == sum(range(P))))
        else:
            comm.Reduce(red, None, root=0)
        gat = np.zeros(2 * P, np.int64)
        if r == P - 1:
            gat[2 * r:2 * r + 2] = r
            comm.Gather(pcomm.IN_PLACE, gat, root=P - 1)
            ck.check("inplace/gather", np.array_equal(gat, np.repeat(np.arange(P), 2)))
        else:
            comm.Gather(np.full(2, r, np.int64), None, root=P - 1)
        a2a = np.arange(P * 2, dtype=np.int32) + 100 * r
        comm.Alltoall(pcomm.IN_PLACE, a2a)
        want = np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * p for p in range(P)])
        ck.check("inplace/alltoall", np.array_equal(a2a, want))
    ck.run("inplace", inplace)

    # several outstanding non-blocking requests
    def nonblocking():
        reqs, outs = [], []
        for i in range(6):
            x = np.full(1000 + i, r + i, np.float32)
            y = np.empty_like(x)
            reqs.append(comm.Iallreduce(x, y))
            outs.append((y, sum(k + i for k in range(P))))
            g = np.empty(P * 7, np.int32)
            reqs.append(comm.Iallgather(np.full(7, r * 10 + i, np.int32), g))
            outs.append((g, None, i))
        pcomm.Request.Waitall(reqs)
        for item in outs:
            if len(item) == 2:
                y, want = item
                ck.check("nonblocking/allreduce", np.all(y == want))
            else:
                g, _, i = item
                ck.check("nonblocking/allgather",
                         np.array_equal(g, np.repeat(np.arange(P) * 10 + i, 7)))
        b = np.zeros(5, np.float64)
        if r == 0:
            b[:] = 7
        req = comm.Ibcast(b, 0)
        t0 = time.monotonic()
        while not req.Test():
            if time.monotonic() - t0 > 30:
                raise CollectiveTimeout("Test() never became true")
            time.sleep(0.0005)
        ck.check("nonblocking/test", np.all(b == 7))
    ck.run("nonblocking", nonblocking)

    # big outstanding requests at once: rings fill with early messages, nothing deadlocks
    def big_outstanding():
        n = 1 << 21
        xs = [np.full(n, r + k, np.float32) for k in range(3)]
        ys = [np.empty(n, np.float32) for _ in range(3)]
        reqs = [comm.Iallreduce(x, y, algorithm="ring") for x, y in zip(xs, ys)]
        g = np.empty(P * (n // 4), np.float32)
        reqs.append(comm.Iallgather(np.full(n // 4, r, np.float32), g, algorithm="ring"))
        pcomm.Request.Waitall(reqs)
        for k, y in enumerate(ys):
            ck.check("big/allreduce", bool(np.all(y == sum(i + k for i in range(P)))))
        ck.check("big/allgather", np.array_equal(g, np.repeat(np.arange(P, dtype=np.float32),
                                                              n // 4)))
    ck.run("big-outstanding", big_outstanding)

    # objects
    def objects():
        obj = comm.bcast({"a": [1, 2], "r": r} if r == 0 else None, root=0)
        ck.check("obj/bcast", obj == {"a": [1, 2], "r": 0})
        ck.check("obj/allgather", comm.allgather(("x" * r, r)) == [("x" * i, i)
                                                                   for i in range(P)])
        g = comm.gather(r * r, root=P - 1)
        ck.check("obj/gather", g == ([i * i for i in range(P)] if r == P - 1 else None))
        s = comm.scatter([f"item{i}" for i in range(P)] if r == 0 else None, root=0)
        ck.check("obj/scatter", s == f"item{r}")
        ck.check("obj/allreduce", comm.allreduce(r + 1) == P * (P + 1) // 2)
        ck.check("obj/allreduce-max", comm.allreduce(r, op="max") == P - 1)
    ck.run("objects", objects)

    # communicators
    def comms():
        sub = comm.Split(color=r % 2, key=-r)
        want_members = sorted([i for i in range(P) if i % 2 == r % 2], reverse=True)
        ck.check("split/size", sub.size == len(want_members))
        ck.check("split/rank", sub.rank == want_members.index(r))
        x = np.array([r], np.int64)
        y = np.empty(1, np.int64)
        sub.Allreduce(x, y)
        ck.check("split/allreduce", int(y[0]) == sum(want_members), f"{y}")
        g = np.empty(sub.size, np.int64)
        sub.Allgather(x, g)
        ck.check("split/allgather-order", list(g) == want_members, f"{g}")
        dup = comm.Dup()
        ck.check("dup/ids", dup.id != comm.id and dup.size == P and dup.rank == r)
        z = np.empty(1, np.int64)
        # interleave the two communicators: matching is per communicator
        r1 = dup.Iallreduce(x, z)
        comm.Allreduce(x, y)
        r1.Wait()
        ck.check("dup/allreduce", int(z[0]) == sum(range(P)) == int(y[0]))
        none = comm.Split(color=pcomm.UNDEFINED if r == 0 else 1)
        ck.check("split/undefined", (none is None) if r == 0 else (none.size == P - 1))
        with dup:
            dup.Barrier()
        sub.Free()
    ck.run("comms", comms)

    # local argument errors never reach the wire
    def badargs():
        try:
            comm.Allgather(np.zeros(3, np.float32), np.zeros(3 * P + 1, np.float32))
            ck.check("badargs/size", False, "no error")
        except ValueError as exc:
            ck.check("badargs/size", "multiple" in str(exc) or "needs" in str(exc), str(exc))
        try:
            comm.Allreduce(np.zeros(3, np.float32), np.zeros(3, np.float64))
            ck.check("badargs/dtype", False, "no error")
        except ValueError as exc:
            ck.check("badargs/dtype", "dtype" in str(exc), str(exc))
        try:
            comm.Allreduce(np.zeros(3), np.zeros(3), algorithm="nope")
            ck.check("badargs/algo", False, "no error")
        except ValueError as exc:
            ck.check("badargs/algo", "ring" in str(exc), str(exc))
        comm.Barrier()      # everyone still in step
        ck.check("badargs/after", True)
    ck.run("badargs", badargs)


def suite_mismatch(ck: Checker) -> None:
    comm = ck.comm
    r = comm.rank
    n = 100 + (1 if r == comm.size - 1 else 0)      # the last rank disagrees on the size
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    try:
        comm.Allreduce(x, y, algorithm="ring")
        ck.check("mismatch/raised", False, "Allreduce returned")
    except MismatchError as exc:
        ck.check("mismatch/raised", True)
        print(f"MISMATCH {exc}", flush=True)
    except PolycastError as exc:
        ck.check("mismatch/raised", False, f"{type(exc).__name__}: {exc}")


def suite_death(ck: Checker) -> None:
    comm = ck.comm
    P, r = comm.size, comm.rank
    victim = P - 1
    comm.Barrier()
    if r == victim:
        # its last barrier message may still be in its send queue when its Barrier returns
        # (a send completes once handed to the transport): let it leave, or a peer still
        # waiting on it sees the death in the barrier instead of in the call below
        time.sleep(0.3)
        os._exit(17)            # dies without a word: no goodbye, no flush
    x = np.ones(10, np.float32)
    y = np.empty_like(x)
    t0 = time.monotonic()
    try:
        comm.Allreduce(x, y, algorithm="ring")
        ck.check("death/raised", False, "Allreduce returned")
    except PeerLost as exc:
        dt = time.monotonic() - t0
        ck.check("death/raised", exc.rank == victim or f"rank {victim}" in str(exc), str(exc))
        ck.check("death/in-time", dt < comm.timeout_seconds, f"{dt:.1f}s")
        print(f"PEERLOST {exc.rank} after {dt:.2f}s: {exc}", flush=True)
    except PolycastError as exc:
        # A rank whose own neighbours were alive learns of the death through an ABORT
        ck.check("death/raised", f"rank {victim}" in str(exc), f"{type(exc).__name__}: {exc}")
        print(f"PEERLOST-INDIRECT {type(exc).__name__}: {exc}", flush=True)


def suite_mcast(ck: Checker) -> None:
    """Every multicast algorithm of every collective, exact results, sizes from one element
    to many datagrams, first and last root; multicast must work here (no skipping). Ends
    with one ``MCAST_STATS {json}`` line: this rank's engine counters over the suite (so a
    caller injecting loss can check the recovery ran)."""
    comm = ck.comm
    P = comm.size
    ck.check("mcast/available", comm.mcast_error is None, str(comm.mcast_error))
    before = vars(comm.stats()).copy()
    for coll in Collective:
        for algo in supported(coll, P):
            if not get(coll, algo).multicast:
                continue
            roots = sorted({0, P - 1}) if coll.rooted else [0]
            for count in (1, 1000, 250_000):
                for root in roots:
                    one(ck, coll, algo, count, root)
            if coll.has_op:
                one(ck, coll, algo, 33, 0, op="max", dtype="int32")
    after = vars(comm.stats())
    print("MCAST_STATS " + json.dumps({k: after[k] - v for k, v in before.items()
                                       if isinstance(v, int) and isinstance(after.get(k), int)}),
          flush=True)


def _single_copy(comm) -> str:
    """Messages this rank sent/read single-copy (runtime/transport/cma.py); "-" when its driver
    has no peers of its own (an offload client)."""
    peers = getattr(comm._driver, "peers", None)
    return f"{peers.cma_sent}/{peers.cma_read}" if peers is not None else "-"


SUITES = {"algos": [suite_algos], "api": [suite_api], "all": [suite_algos, suite_api],
          "mismatch": [suite_mismatch], "death": [suite_death], "mcast": [suite_mcast]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polycast.tools.selftest")
    p.add_argument("--suite", choices=sorted(SUITES), default="all")
    args = p.parse_args(argv)
    comm = pcomm.init()
    ck = Checker(comm)
    t0 = time.monotonic()
    for fn in SUITES[args.suite]:
        fn(ck)
    dt = time.monotonic() - t0
    if ck.failed:
        print(f"SELFTEST {args.suite} FAILED {len(ck.failed)} of {ck.n}", flush=True)
        os._exit(1)     # the peers may be stuck on our behalf: do not wait for them
    if args.suite not in ("death",):
        comm.Barrier()
    print(f"SELFTEST {args.suite} OK {ck.n} checks in {dt:.1f}s "
          f"transports={','.join(sorted(set(comm.transports().values())))} "
          f"mcast={'no' if comm.mcast_error else 'yes'} algos={len(ck.algos)} "
          f"single_copy={_single_copy(comm)}", flush=True)
    if args.suite == "death":
        os._exit(0)     # the world lost a rank: skip the goodbye round
    pcomm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
