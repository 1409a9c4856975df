"""Rank script of bench/soak.py (run under ``polycast run``): ``--calls`` mixed collectives
of random collective, algorithm (multicast ones included), size, root, op and dtype, posted
in batches of 1..``--outstanding`` non-blocking calls then ``Waitall``; every result checked
exactly against polycast.reference. Every rank draws the same sequence from ``--seed``.
Prints one ``SOAK {json}`` line: calls, failures, seconds, resident memory and open file
descriptors after the warm-up (every collective x algorithm once, and the
planner's choice at the largest sizes), half-way and at the end, faults injected and packets dropped here."""

from __future__ import annotations

import argparse
import ctypes
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


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                                               "hblkhd", "usmblks", "fsmblks", "uordblks",
                                               "fordblks", "keepcost")]


def malloc_bytes() -> dict:
    """glibc's view of the heap (mallinfo2): bytes in use, free in its arenas, mmapped."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _Mallinfo2
    m = fn()
    return {"in_use": m.uordblks + m.hblkhd, "arena_free": m.fordblks, "mmapped": m.hblkhd,
            "arena": m.arena}


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


class TorchPath:
    """The same draws through torch.distributed on polycast groups: ``auto`` (the default
    group) and an engine group (ring all-reduce, multicast all-gather...), torch's call for
    each collective (scan/exscan have none: drawn again)."""

    def __init__(self, P: int, r: int) -> None:
        import torch
        import torch.distributed as dist
        import polycast.torch as pt
        self.torch, self.dist = torch, dist
        dist.init_process_group("polycast")
        self.groups = {None: dist.group.WORLD,
                       "engine": dist.new_group(backend="polycast", pg_options=pt.Options(
                           allreduce="ring", allgather="mcast", reduce_scatter="ring",
                           broadcast="binomial"))}
        self.comm = self.groups[None].comm
        self.P, self.r = P, r
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "max": R.MAX, "min": R.MIN}

    def draw(self, rng, mcast, max_count):
        while True:
            d = draw(rng, self.P, mcast, max_count)
            if d[0] not in (Collective.SCAN, Collective.EXSCAN):
                return d

    def post(self, coll, algo, send, recv, root, op):
        """Post one call (async_op): -> (work, finish) where finish() returns the array
        to compare with the reference (None where this rank gets nothing)."""
        torch, dist = self.torch, self.dist
        g = self.groups["engine" if algo is not None else None]
        P, r = self.P, self.r
        t = torch.from_numpy(send)
        C = Collective
        if coll is C.ALLREDUCE:
            return dist.all_reduce(t, self.ops[op], group=g, async_op=True), lambda: send
        if coll is C.BROADCAST:
            return dist.broadcast(t, root, group=g, async_op=True), lambda: send
        if coll is C.REDUCE:
            w = dist.reduce(t, root, self.ops[op], group=g, async_op=True)
            return w, (lambda: send) if r == root else (lambda: None)
        if coll is C.ALLGATHER:
            out = torch.from_numpy(recv)
            return dist.all_gather_into_tensor(out, t, group=g, async_op=True), lambda: recv
        if coll is C.REDUCE_SCATTER:
            out = torch.from_numpy(recv)
            return dist.reduce_scatter_tensor(out, t, self.ops[op], group=g,
                                              async_op=True), lambda: recv
        if coll is C.ALLTOALL:
            out = torch.from_numpy(recv)
            return dist.all_to_all_single(out, t, group=g, async_op=True), lambda: recv
        if coll is C.GATHER:
            outs = list(torch.from_numpy(recv).chunk(P)) if r == root else None
            return dist.gather(t, outs, root, group=g, async_op=True), \
                (lambda: recv) if r == root else (lambda: None)
        if coll is C.SCATTER:
            out = torch.from_numpy(recv)
            ins = list(t.chunk(P)) if r == root else None
            return dist.scatter(out, ins, root, group=g, async_op=True), lambda: recv
        if coll is C.BARRIER:
            return dist.barrier(group=g, async_op=True), lambda: recv
        raise AssertionError(coll)

    def close(self) -> None:
        self.dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--outstanding", type=int, default=8)
    ap.add_argument("--max-count", type=int, default=65_536, help="elements")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--path", choices=("numpy", "torch"), default="numpy",
                    help="Comm's methods, or torch.distributed on polycast groups")
    ap.add_argument("--sample-every", type=int, default=0,
                    help="record resident memory every N calls (0: start, mid, end only)")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="trace Python allocations from the warm-up on; report the lines "
                         "that grew most between half-way and the end")
    args = ap.parse_args()
    torch_path = None
    if args.path == "torch":
        torch_path = TorchPath(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]))
        comm = torch_path.comm
    else:
        comm = polycast.init()
    P, r = comm.size, comm.rank
    rng = random.Random(args.seed)
    mcast = comm.mcast_error is None
    failures: list[str] = []
    done = 0
    # Warm-up: every collective x algorithm once, so what is opened lazily (connections,
    # multicast groups, scratch) is open before the first measurement.
    warmed = 0
    # (the torch path's engine group is a communicator of its own: warmed alike)
    comms = [comm] + ([torch_path.groups["engine"].comm] if torch_path is not None else [])
    for coll in Collective:
        for algo in supported(coll, P):
            if mcast or not get(coll, algo).multicast:
                count = 0 if coll is Collective.BARRIER else P
                recv = np.zeros(coll.buffer_counts(P, count)[1], np.float32)
                send = np.ones(coll.buffer_counts(P, count)[0], np.float32)
                if coll in (Collective.REDUCE, Collective.GATHER) and r != 0:
                    recv = None
                for c in comms:
                    call(c, coll, send, recv, 0, "sum", algo)
                    warmed += 1
        # the planner's choice at the largest sizes (symmetric memory's slabs by size class)
        for count in ([0] if coll is Collective.BARRIER else
                      sorted({P, args.max_count // 16 or 1, args.max_count})):
            nsend, nrecv = coll.buffer_counts(P, count)
            recv = np.zeros(nrecv, np.float64) if coll not in (
                Collective.REDUCE, Collective.GATHER) or r == 0 else None
            call(comm, coll, np.ones(nsend, np.float64), recv, 0, "sum", None)
            warmed += 1
    if args.tracemalloc:
        import tracemalloc
        tracemalloc.start(8)
    series = None          # opened before the first count of descriptors
    if os.environ.get("SOAK_SERIES_DIR"):
        series = open(os.path.join(os.environ["SOAK_SERIES_DIR"],
                                   f"{args.path}-rank-{r}.jsonl"), "w")
    start = {"rss_bytes": rss_bytes(), "fds": open_fds(), "calls": 0, "t": time.monotonic()}
    samples = [(0, start["rss_bytes"], 0.0, malloc_bytes())]
    mid = None
    snap_mid = None
    t0 = time.monotonic()
    batches = 0
    while done < args.calls:
        k = min(rng.randint(1, args.outstanding), args.calls - done)
        calls = []
        for i in range(k):
            if torch_path is not None:
                coll, algo, count, root, op, dtype = torch_path.draw(rng, mcast,
                                                                      args.max_count)
            else:
                coll, algo, count, root, op, dtype = draw(rng, P, mcast, args.max_count)
            seed = done + i
            inputs = make_inputs(coll, P, count, dtype, root=root, seed=seed, op=op)
            expect = reference(coll, inputs, root=root, op=op)
            _, nrecv = coll.buffer_counts(P, count)
            recv = np.full(nrecv, 99, dtype=dtype)
            if coll in (Collective.REDUCE, Collective.GATHER) and r != root:
                recv = None
            name = f"#{seed} {coll}/{algo or 'auto'}/n{count}/root{root}/{op}/{dtype}"
            if torch_path is not None:
                work, result = torch_path.post(coll, algo, inputs[r].copy(), recv, root, op)
                calls.append((name, result, expect[r], work))
            else:
                req = call(comm, coll, inputs[r].copy(), recv, root, op, algo,
                           blocking=False)
                calls.append((name, lambda recv=recv: recv, expect[r], req))
        if torch_path is not None:
            for c in calls:
                c[3].wait()
        else:
            Request.Waitall([c[3] for c in calls])
        for name, result, want, _ in calls:
            got = result()
            if want is not None and (got is None or not np.array_equal(got, want)):
                failures.append(name)
        prev = done
        done += k
        batches += 1
        if args.sample_every and done // args.sample_every != prev // args.sample_every:
            samples.append((done, rss_bytes(), time.monotonic() - t0, malloc_bytes()))
            if series is not None:           # as it goes: a run cut short keeps its curve
                series.write(json.dumps(samples[-1]) + "\n")
                series.flush()
        if mid is None and done >= args.calls // 2:
            mid = {"rss_bytes": rss_bytes(), "fds": open_fds()}
            if args.tracemalloc:
                snap_mid = tracemalloc.take_snapshot()
    comm.Barrier()
    t1 = time.monotonic()
    samples.append((done, rss_bytes(), t1 - t0, malloc_bytes()))
    grew = []
    if args.tracemalloc:
        snap = tracemalloc.take_snapshot()
        diffs = snap.compare_to(snap_mid, "traceback")
        traced_growth = sum(stat.size_diff for stat in diffs)
        for stat in diffs[:8]:
            grew.append({"bytes": stat.size_diff, "count": stat.count_diff,
                         # the innermost frames (a traceback lists the oldest first)
                         "where": [f"{f.filename}:{f.lineno}" for f in stat.traceback][-5:]})
        traced = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    faults = comm._driver.mcast.faults if comm._driver.mcast is not None else None
    st = comm.stats()
    print("SOAK " + json.dumps({
        "rank": r, "path": args.path, "calls": done, "batches": batches,
        "failed": failures[:20], "nfailed": len(failures), "seconds": t1 - t0,
        "calls_per_s": done / max(t1 - t0, 1e-9), "warmup_calls": warmed,
        "rss_start": start["rss_bytes"], "rss_mid": mid["rss_bytes"], "rss_end": rss_bytes(),
        "fds_start": start["fds"], "fds_mid": mid["fds"], "fds_end": open_fds(),
        "samples": samples, "grew": grew,
        "traced_bytes": traced if args.tracemalloc else None,
        "traced_growth_second_half": traced_growth if args.tracemalloc else None,
        "mcast": mcast,
        "faults": faults.counts if faults else None, "drops": dict(st.drops),
        "recovered_bytes": getattr(st, "recovered_bytes", 0),
        # how large engine messages went: RTS/CTS, or pulled (held unread while early)
        "rts": st.rts_out, "pulled": st.pull_out, "pull_held": st.pull_held}), flush=True)
    if torch_path is not None:
        torch_path.close()
    else:
        polycast.finalize()


if __name__ == "__main__":
    main()
