"""The rank side of ``polycast bench`` (one process per rank, started by the launcher).

Rank 0 prints one ``BENCHROW <json>`` line per (size, algorithm) and ``BENCHPROGRESS i n``
lines (``auto`` rows say what the planner ran: ``auto(symm)``, ``auto(ring)``); the parent (:mod:`polycast.cli.bench`) turns them into the table.

Timing follows nccl-tests: ``warmup`` untimed calls, a barrier, ``iters`` calls back to
back; the time is the slowest rank's average. The calls are the blocking ones
(``Allreduce``, ``Bcast``, ...), as an MPI program and the MPI peers of ``bench/peers.py``
make them; ``--nonblocking`` times ``Iallreduce(...).Wait()`` and the like instead (the row
says which in ``calls``). The correctness check runs one more call on
the reference inputs (:func:`polycast.reference.make_inputs`) and compares exactly on every
rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from .. import comm as pcomm
from ..collectives import Collective
from ..errors import PolycastError
from ..reference import make_inputs, reference
from .selftest import blocking_call, call


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], max(1, lo)
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def count_for(coll: Collective, nranks: int, nbytes: int, itemsize: int) -> int:
    """Per-call ``count`` whose nccl-tests size S (total_elements x itemsize) is ``nbytes``."""
    if coll is Collective.BARRIER:
        return 0
    per = coll.total_elements(nranks, 1)
    return max(1, nbytes // (itemsize * per))


def measure(comm, coll: Collective, algo: str | None, count: int, dtype: str, op: str,
            root: int, iters: int, warmup: int, check: bool, nonblocking: bool = False
            ) -> dict:
    P, r = comm.size, comm.rank
    dt = np.dtype(dtype)
    inputs = make_inputs(coll, P, count, dtype, root=root, op=op) if check else None
    nsend, nrecv = coll.buffer_counts(P, count)
    send = inputs[r].copy() if check else np.ones(nsend, dt)
    recv = np.zeros(nrecv, dt)
    if coll in (Collective.REDUCE, Collective.GATHER) and r != root:
        recv = None
    if coll is Collective.BARRIER:
        send = recv = None
    # Under auto the planner may send ordinary arrays through symmetric memory (staged):
    # call with auto and label the row with what it runs, e.g. "auto(symm)", "auto(ring)".
    nbytes = coll.total_elements(P, count) * dt.itemsize
    staged = algo is None and comm.takes_symm(coll, dt, nbytes=nbytes)
    name = comm.choose_algorithm(coll, nbytes, algo)
    name = "auto(symm)" if staged else (f"auto({name})" if algo is None else name)
    how = algo
    st0 = comm.stats()
    rec0 = st0.recovered_bytes if st0 is not None else 0
    drops0 = st0.dropped if st0 is not None else 0
    if coll is Collective.BROADCAST and r == root:
        # Bcast works in place and only reads the root's buffer: fill it once, as
        # nccl-tests and the MPI peers do (a copy per call added a full-size memcpy to
        # every root's time that no peer pays). The check below uses its own buffers.
        recv[...] = send

    if nonblocking:
        def once():
            if coll is Collective.BROADCAST:
                comm.Ibcast(recv, root, algorithm=how).Wait()
            else:
                call(comm, coll, send, recv, root, op, how)
    else:
        once = blocking_call(comm, coll, send, recv, root, op, how)

    for _ in range(warmup):
        once()
    comm.Barrier()
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    elapsed = (time.perf_counter() - t0) / max(1, iters)
    # CPU seconds of this process (every thread) per call: what a call costs the machine,
    # which holds under other load where wall time does not.
    cpu = (time.process_time() - c0) / max(1, iters)
    times = np.empty(P, np.float64)
    comm.Allgather(np.array([elapsed]), times)
    cpus = np.empty(P, np.float64)
    comm.Allgather(np.array([cpu]), cpus)
    correct = None
    if check:
        expect = reference(coll, inputs, root=root, op=op)
        out = np.full(nrecv, 7, dt) if recv is not None else None
        if coll is Collective.BROADCAST:
            out = inputs[r].copy() if r == root else np.zeros(nrecv, dt)
            comm.Bcast(out, root, algorithm=how)
        else:
            call(comm, coll, inputs[r].copy() if coll is not Collective.BARRIER else None,
                 out, root, op, how)
        ok = expect[r] is None or (out is not None and np.array_equal(out, expect[r]))
        flags = np.empty(P, np.int32)
        comm.Allgather(np.array([1 if ok else 0], np.int32), flags)
        correct = bool(flags.all())
    t = float(times.max())
    S = coll.total_elements(P, count) * dt.itemsize
    algbw = S / t / 1e9 if t > 0 else 0.0
    st1 = comm.stats()
    return {
        "collective": str(coll), "algorithm": name, "nranks": P, "nbytes": S,
        "count": count, "dtype": str(dt), "op": op if coll.has_op else "", "root": root,
        "time_us": t * 1e6, "algbw": algbw, "busbw": algbw * coll.busbw_factor(P),
        "cpu_us": float(cpus.mean()) * 1e6,
        "correct": correct, "iters": iters,
        "calls": "nonblocking" if nonblocking else "blocking",
        "transport": ",".join(sorted(set(comm.transports().values()))) or "self",
        "recovered_bytes": (st1.recovered_bytes - rec0) if st1 is not None else 0,
        "dropped": (st1.dropped - drops0) if st1 is not None else 0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polycast.tools.bench_rank")
    p.add_argument("collective")
    p.add_argument("--algo", default="auto")
    p.add_argument("--sizes", required=True, help="comma-separated byte sizes")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--nonblocking", action="store_true",
                   help="time I-variant + Wait instead of the blocking call")
    args = p.parse_args(argv)
    coll = Collective.parse(args.collective)
    comm = pcomm.init()
    algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    sizes = [int(s) for s in args.sizes.split(",")]
    itemsize = np.dtype(args.dtype).itemsize
    total, i = len(sizes) * len(algos), 0
    for nbytes in sizes:
        for algo in algos:
            count = count_for(coll, comm.size, nbytes, itemsize)
            # Fewer iterations for big buffers keep long sweeps bounded.
            iters = args.iters if nbytes <= (8 << 20) else max(2, args.iters // 4)
            try:
                row = measure(comm, coll, None if algo == "auto" else algo, count, args.dtype,
                              args.op, args.root, iters, args.warmup, not args.no_check,
                              args.nonblocking)
            except PolycastError as exc:
                if comm.rank == 0:
                    print("BENCHERROR " + json.dumps({"algorithm": algo, "nbytes": nbytes,
                                                      "error": str(exc)}), flush=True)
                return 1
            i += 1
            if comm.rank == 0:
                row["requested"] = algo
                print("BENCHROW " + json.dumps(row), flush=True)
                print(f"BENCHPROGRESS {i} {total}", flush=True)
    pcomm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
