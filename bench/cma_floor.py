"""Where a large collective's time goes on one host (engine or auto path), against the copy floor.

    python bench/cma_floor.py [--ranks 4,2] [--sizes 16MiB,4MiB] [--algos direct,recdoubling,ring]
                              [--collective allgather] [--iters 20] [--realtime] [--json FILE]

``--algos`` may name ``auto``: the default path (on one host the symm path, whose large calls
read, and for a broadcast also write, the peers' arrays with the same kernel copy).

Large DATA between ranks of one host goes single-copy (runtime/transport/cma.py: a descriptor in the
shm ring, the receiver reads the sender's memory with ``process_vm_readv``, then
acknowledges); messages up to 1 MiB (the eager limit between shm ranks, in calls of up to
8 MiB) go through the rings instead, so sizes whose messages are larger show the reads. Two parts, both printed as tables and written to JSON (default
bench/results/cma_floor.json):

* **ceilings** -- what this machine's copies cost with nothing else running: one process
  reading another's array with ``cma.read`` (``process_vm_readv``, GIL released) and a
  ``memcpy`` (``np.copyto``), 4 MiB and 12 MiB, best of several; then 2 readers at once
  (one per core) to show whether the cores share a bandwidth limit.
* **split** -- per case (ranks x size x algorithm, POLYCAST_SYMM=0: the engine's schedule;
  ``auto``: the symm path), ranks launched here time every call and split its CPU
  (``time.process_time``) into ``read`` (thread CPU inside ``cma.read``/``cma.write``: the
  single-copy reads, and a symm broadcast root's writes), ``copy`` (``Buffers.copy``: the
  engine's own block's local copy; the symm path copies inline, so its own copy is in
  ``rest``) and ``rest`` (Python: engine, driver, rings, barriers, waiting; a reduction's
  ufunc), and count the frames each rank handled (none on the symm path). Medians over the
  timed calls, averaged over ranks. ``busy`` = ranks x CPU / wall: 2 on this 2-core machine
  means CPU-bound. ``floor`` = the wall if every rank did only its copies at the ceiling
  rates, spread over min(ranks, cores) cores: no engine, no protocol, no waiting.

The ranks wrap those functions for timing (a few us per call); use the split for
where the time goes, and ``polycast bench`` / ``bench/peers.py`` for the busbw figures.
``auto``'s calls are split on its Python path: the compiled helper, which runs a repeated
large allgather or broadcast whole (same copies, no Python between), is turned off for
each timed call, as the wrappers could not see inside it. So are the engine's: the ranks run
with the replay=0 test hook (POLYCAST_TEST_HOOKS), as the compiled replay (runtime/driver/_replay.c) runs a repeated call of
pulled DATA whole, its reads included; compare with ``bench/peers.py`` for what the replay
saves.
``--realtime`` runs the ranks at ``chrt -r 1`` (root): the machine's other load stays out.
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
MARKER = "CMAFLOOR"


# -- ceilings ----------------------------------------------------------------------------
def _hold(nbytes: int, conn) -> None:
    """A child holding an array for others to read; reports (pid, address), waits."""
    import numpy as np

    from polycast.runtime.transport import cma
    a = np.full(nbytes, 7, np.uint8)
    conn.send((os.getpid(), cma.address_of(a)))
    conn.recv()


def _read_rates(holders, nbytes: int, reps: int, conn=None) -> dict:
    """Best seconds to read ``nbytes`` from every holder in turn, and to memcpy as much."""
    import numpy as np

    from polycast.runtime.transport import cma
    total = nbytes * len(holders)
    dst = np.zeros(total, np.uint8)
    base = cma.address_of(dst)
    src, loc = np.ones(total, np.uint8), np.zeros(total, np.uint8)
    best_read = best_copy = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for i, (pid, addr) in enumerate(holders):
            cma.read(pid, [(base + i * nbytes, nbytes)], [(addr, nbytes)])
        t1 = time.perf_counter()
        np.copyto(loc, src)
        t2 = time.perf_counter()
        best_read, best_copy = min(best_read, t1 - t0), min(best_copy, t2 - t1)
    out = {"nbytes": total, "read_s": best_read, "memcpy_s": best_copy}
    if conn is not None:
        conn.send(out)
    return out


def ceilings(reps: int = 15) -> list[dict]:
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    rows = []
    shard = 4 << 20
    pipes, kids = [], []
    for _ in range(3):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_hold, args=(shard, b))
        p.start()
        pipes.append(a)
        kids.append(p)
    try:
        holders = [a.recv() for a in pipes]
        for n in (1, 3):            # 4 MiB (one shard) and 12 MiB (a 4-rank allgather's)
            r = _read_rates(holders[:n], shard, reps)
            rows.append({"case": f"1 reader, {n * 4} MiB", **r})
        # two readers at once, each 12 MiB (one per core)
        conns, readers = [], []
        for _ in range(2):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_read_rates, args=(holders, shard, reps, b))
            p.start()
            conns.append(a)
            readers.append(p)
        got = [a.recv() for a in conns]
        for p in readers:
            p.join(30)
        rows.append({"case": "2 readers at once, 12 MiB each", "nbytes": got[0]["nbytes"],
                     "read_s": max(g["read_s"] for g in got),
                     "memcpy_s": max(g["memcpy_s"] for g in got)})
    finally:
        for a in pipes:
            a.send(None)
        for p in kids:
            p.join(10)
            if p.is_alive():
                p.kill()
    for r in rows:
        r["read_gbps"] = r["nbytes"] / r["read_s"] / 1e9
        r["memcpy_gbps"] = r["nbytes"] / r["memcpy_s"] / 1e9
    return rows


# -- the split (runs in every rank) --------------------------------------------------------
def _rank(args) -> None:
    sys.path.insert(0, REPO)
    import numpy as np

    import polycast
    from polycast import memory
    from polycast.collectives import Collective
    from polycast.runtime.transport import cma
    from polycast.runtime.driver import peers
    from polycast.units import parse_size

    acc = {"read": 0.0, "copy": 0.0, "frames": 0}

    def timed(cls, name, key):
        fn = getattr(cls, name)

        def wrapper(*a, **k):
            c = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                acc[key] += time.thread_time() - c
        setattr(cls, name, wrapper)

    # Every single-copy read (the engine's RemotePayload and the symm path call these).
    timed(cma, "read", "read")
    if hasattr(cma, "write"):                        # a symm broadcast root's share
        timed(cma, "write", "read")
    timed(memory.Buffers, "copy", "copy")
    frame = peers.PeerIO._frame

    def counted(self, *a, **k):
        acc["frames"] += 1
        return frame(self, *a, **k)
    peers.PeerIO._frame = counted

    world = polycast.init()
    # Explicit algorithms on a communicator without symmetric memory (POLYCAST_SYMM=0: the
    # engine's schedules); auto on the world (the default path).
    world.Barrier()                 # (every rank makes the child in the same order)
    engine = world._make_child(world._child_id("engine"), list(world.members),
                               world.config.replace(symm=False))
    P, r = world.size, world.rank
    coll = Collective(args.collective)
    rows = []
    for size in args.sizes.split(","):
        nbytes = parse_size(size)
        count = max(1, nbytes // 4 // (P if coll is Collective.ALLGATHER else 1))
        nsend, nrecv = coll.buffer_counts(P, count)
        send = np.full(nsend, r + 1, np.float32)
        recv = np.zeros(nrecv, np.float32)
        if coll is Collective.BROADCAST and r == 0:
            recv[:] = 1.0               # the root's data, in place
        for algo in args.algos.split(","):
            how = None if algo == "auto" else algo
            comm = world if algo == "auto" else engine

            def once():
                if algo == "auto":
                    # The compiled helper runs a repeated large allgather or broadcast whole,
                    # copies and barriers, where these wrappers cannot time its parts: each
                    # timed call is made to take the Python path, which does the same copies.
                    st = comm._dispatch.symm
                    if st is not None:
                        st.bar.fast_off()
                if coll is Collective.ALLGATHER:
                    comm.Allgather(send, recv, algorithm=how)
                elif coll is Collective.BROADCAST:
                    comm.Bcast(recv, 0, algorithm=how)
                else:
                    comm.Allreduce(send, recv, algorithm=how)
            for _ in range(3):
                once()
            comm.Barrier()
            calls = []
            for _ in range(args.iters):
                acc.update(read=0.0, copy=0.0, frames=0)
                c0, t0 = time.process_time(), time.perf_counter()
                once()
                calls.append((time.perf_counter() - t0, time.process_time() - c0,
                              acc["read"], acc["copy"], acc["frames"]))
            med = [statistics.median(c[i] for c in calls) for i in range(5)]
            got = comm.allgather(med)
            if coll is Collective.ALLGATHER:
                ok = all(np.all(recv[p * count:(p + 1) * count] == p + 1) for p in range(P))
            elif coll is Collective.BROADCAST:
                ok = bool(np.all(recv == 1.0))
            else:
                ok = bool(np.all(recv == P * (P + 1) / 2))
            oks = comm.allgather(bool(ok))
            if r == 0:
                avg = [sum(g[i] for g in got) / P for i in range(5)]
                rows.append({"ranks": P, "size": size, "nbytes": nbytes, "algorithm": algo,
                             "collective": coll.value, "wall_s": max(g[0] for g in got),
                             "cpu_s": avg[1], "read_s": avg[2], "copy_s": avg[3],
                             "frames": avg[4], "correct": all(oks)})
    if r == 0:
        print(MARKER, json.dumps(rows), flush=True)
    comm.Barrier()


def _floor(row: dict, rates: dict, cores: int) -> float:
    """Seconds a call would take doing only its copies at the ceiling rates."""
    P, S = row["ranks"], row["nbytes"]
    if row["collective"] == "allgather":
        read_b, copy_b = S * (P - 1) / P, S / P          # per rank
    elif row["collective"] == "broadcast":
        read_b, copy_b = S * (P - 1) / P, 0.0            # averaged over ranks
    else:
        read_b, copy_b = 2 * S * (P - 1) / P, S           # ring allreduce, roughly
    per_rank = read_b / rates["read_bps"] + copy_b / rates["memcpy_bps"]
    return per_rank * P / min(P, cores)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="4,2")
    p.add_argument("--sizes", default="16MiB,4MiB")
    p.add_argument("--algos", default="direct,recdoubling,ring")
    p.add_argument("--collective", default="allgather",
                   choices=("allgather", "broadcast", "allreduce"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--realtime", action="store_true",
                   help="run the ranks at real-time round-robin priority 1 (chrt -r 1; root)")
    p.add_argument("--no-ceilings", action="store_true")
    p.add_argument("--json", default=os.path.join(HERE, "results", "cma_floor.json"))
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank:
        _rank(args)
        return 0
    sys.path.insert(0, REPO)
    from polycast.runtime.transport import cma
    why = cma.disabled_reason()
    if why:
        print(f"single-copy is off here ({why}): nothing to measure", file=sys.stderr)
        return 2
    from rank_jobs import realtime_prefix, run_ranks
    prefix = realtime_prefix(p) if args.realtime else []
    cores = os.cpu_count() or 1
    load = os.getloadavg()
    ceil = []
    if not args.no_ceilings:
        policy = os.sched_getscheduler(0), os.sched_getparam(0)
        if args.realtime:           # the readers fork from here and inherit it
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        try:
            ceil = ceilings()
        except OSError as exc:      # ptrace permission refused (Yama, seccomp, containers)
            print(f"process_vm_readv refused here ({exc}): nothing to measure",
                  file=sys.stderr)
            return 2
        finally:
            os.sched_setscheduler(0, policy[0], policy[1])
    if ceil:
        print(f"copy ceilings, best of 15 (load average {load[0]:.2f})")
        print(f"{'case':<34}{'process_vm_readv':>18}{'memcpy':>14}")
        for c in ceil:
            print(f"{c['case']:<34}{c['read_s'] * 1e6:>9.0f} us {c['read_gbps']:>5.1f}"
                  f"{c['memcpy_s'] * 1e6:>7.0f} us {c['memcpy_gbps']:>5.1f}  (GB/s)")
        big = ceil[1]
        rates = {"read_bps": big["nbytes"] / big["read_s"],
                 "memcpy_bps": big["nbytes"] / big["memcpy_s"]}
    else:
        rates = None
    rows = []
    for P in [int(x) for x in args.ranks.split(",")]:
        cmd = prefix + [sys.executable, os.path.abspath(__file__), "--rank", "--sizes",
                        args.sizes, "--algos", args.algos, "--collective", args.collective,
                        "--iters", str(args.iters)]
        got = run_ranks(cmd, P, f"bcma{os.getpid()}_{P}", MARKER, args.timeout, REPO,
                        extra_env={"POLYCAST_TEST_HOOKS": "replay=0"})
        if got is None:
            return 1
        rows += got
    print(f"\n{args.collective}, engine path (POLYCAST_SYMM=0; auto: the default path), per "
          f"call and rank, medians of "
          f"{args.iters} calls (us){' at chrt -r 1' if prefix else ''}; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'ranks':>5} {'size':>6} {'algorithm':<12}{'wall':>7}{'busbw':>7}{'cpu':>7}"
          f"{'read':>7}{'copy':>7}{'rest':>7}{'frames':>7}{'busy':>6}{'floor':>7}")
    for row in rows:
        P = row["ranks"]
        factor = {"allgather": (P - 1) / P, "broadcast": 1.0}.get(row["collective"],
                                                                   2 * (P - 1) / P)
        row["busbw_gbps"] = row["nbytes"] / row["wall_s"] / 1e9 * factor
        row["rest_s"] = row["cpu_s"] - row["read_s"] - row["copy_s"]
        row["busy_cores"] = P * row["cpu_s"] / row["wall_s"]
        row["floor_s"] = _floor(row, rates, cores) if rates else None
        fl = f"{row['floor_s'] * 1e6:>7.0f}" if rates else f"{'-':>7}"
        print(f"{P:>5} {row['size']:>6} {row['algorithm']:<12}{row['wall_s'] * 1e6:>7.0f}"
              f"{row['busbw_gbps']:>7.2f}{row['cpu_s'] * 1e6:>7.0f}{row['read_s'] * 1e6:>7.0f}"
              f"{row['copy_s'] * 1e6:>7.0f}{row['rest_s'] * 1e6:>7.0f}{row['frames']:>7.1f}"
              f"{row['busy_cores']:>6.2f}{fl}{'' if row['correct'] else '  WRONG DATA'}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"load_average": load, "cores": cores, "ceilings": ceil, "rows": rows}, fh,
                  indent=1)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
