"""Rank script of bench/soak.py (run under ``polycast run``): ``--calls`` mixed collectives
of random collective, algorithm (multicast ones included), size, root, op and dtype, posted
in batches of 1..``--outstanding`` non-blocking calls then ``Waitall``; every result checked
exactly against polycast.reference. Every rank draws the same sequence from ``--seed``.
Prints one ``SOAK {json}`` line: calls, failures, seconds, resident memory and open file
descriptors after the warm-up (every collective x algorithm once, and the
planner's choice at the largest sizes), half-way and at the end, faults injected and packets dropped here."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import numpy as np

import polycast
from polycast import Request
from polycast.algorithms import get, supported
from polycast.collectives import Collective
from polycast.reference import make_inputs, reference
from polycast.tools.selftest import call

OPS = ("sum", "max", "min")
DTYPES = ("float32", "int32", "float64")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def draw(rng: random.Random, P: int, mcast: bool, max_count: int):
    coll = rng.choice(list(Collective))
    algos = [a for a in supported(coll, P) if mcast or not get(coll, a).multicast]
    multicast = [a for a in algos if get(coll, a).multicast]
    if multicast and rng.random() < 0.4:        # the path the faults hit: weigh it up
        algo = rng.choice(multicast)
    else:
        algo = rng.choice(algos + [None])                       # None: the planner's choice
    count = 0 if coll is Collective.BARRIER else \
        max(1, int(math.exp(rng.uniform(0, math.log(max_count)))))
    root = rng.randrange(P) if coll.rooted else 0
    op = rng.choice(OPS) if coll.has_op else "sum"
    dtype = rng.choice(DTYPES)
    return coll, algo, count, root, op, dtype


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--outstanding", type=int, default=8)
    ap.add_argument("--max-count", type=int, default=65_536, help="elements")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    comm = polycast.init()
    P, r = comm.size, comm.rank
    rng = random.Random(args.seed)
    mcast = comm.mcast_error is None
    failures: list[str] = []
    done = 0
    # Warm-up: every collective x algorithm once, so what is opened lazily (connections,
    # multicast groups, scratch) is open before the first measurement.
    warmed = 0
    for coll in Collective:
        for algo in supported(coll, P):
            if mcast or not get(coll, algo).multicast:
                count = 0 if coll is Collective.BARRIER else P
                recv = np.zeros(coll.buffer_counts(P, count)[1], np.float32)
                send = np.ones(coll.buffer_counts(P, count)[0], np.float32)
                if coll in (Collective.REDUCE, Collective.GATHER) and r != 0:
                    recv = None
                call(comm, coll, send, recv, 0, "sum", algo)
                warmed += 1
        # the planner's choice at the largest sizes (symmetric memory's slabs by size class)
        for count in ([0] if coll is Collective.BARRIER else
                      sorted({P, args.max_count // 16 or 1, args.max_count})):
            nsend, nrecv = coll.buffer_counts(P, count)
            recv = np.zeros(nrecv, np.float64) if coll not in (
                Collective.REDUCE, Collective.GATHER) or r == 0 else None
            call(comm, coll, np.ones(nsend, np.float64), recv, 0, "sum", None)
            warmed += 1
    start = {"rss_bytes": rss_bytes(), "fds": open_fds(), "calls": 0, "t": time.monotonic()}
    mid = None
    t0 = time.monotonic()
    batches = 0
    while done < args.calls:
        k = min(rng.randint(1, args.outstanding), args.calls - done)
        calls = []
        for i in range(k):
            coll, algo, count, root, op, dtype = draw(rng, P, mcast, args.max_count)
            seed = done + i
            inputs = make_inputs(coll, P, count, dtype, root=root, seed=seed, op=op)
            expect = reference(coll, inputs, root=root, op=op)
            _, nrecv = coll.buffer_counts(P, count)
            recv = np.full(nrecv, 99, dtype=dtype)
            if coll in (Collective.REDUCE, Collective.GATHER) and r != root:
                recv = None
            req = call(comm, coll, inputs[r].copy(), recv, root, op, algo, blocking=False)
            calls.append((f"#{seed} {coll}/{algo or 'auto'}/n{count}/root{root}/{op}/{dtype}",
                          recv, expect[r], req))
        Request.Waitall([c[3] for c in calls])
        for name, recv, want, _ in calls:
            if want is not None and not np.array_equal(recv, want):
                failures.append(name)
        done += k
        batches += 1
        if mid is None and done >= args.calls // 2:
            mid = {"rss_bytes": rss_bytes(), "fds": open_fds()}
    comm.Barrier()
    t1 = time.monotonic()
    faults = comm._driver.mcast.faults if comm._driver.mcast is not None else None
    st = comm.stats()
    print("SOAK " + json.dumps({
        "rank": r, "calls": done, "batches": batches, "failed": failures[:20],
        "nfailed": len(failures), "seconds": t1 - t0,
        "calls_per_s": done / max(t1 - t0, 1e-9), "warmup_calls": warmed,
        "rss_start": start["rss_bytes"], "rss_mid": mid["rss_bytes"], "rss_end": rss_bytes(),
        "fds_start": start["fds"], "fds_mid": mid["fds"], "fds_end": open_fds(),
        "mcast": mcast,
        "faults": faults.counts if faults else None, "drops": dict(st.drops),
        "recovered_bytes": getattr(st, "recovered_bytes", 0),
        # how large engine messages went: RTS/CTS, or pulled (held unread while early)
        "rts": st.rts_out, "pulled": st.pull_out, "pull_held": st.pull_held}), flush=True)
    polycast.finalize()


if __name__ == "__main__":
    main()
