"""Unchanged or fresh input: polycast and MPICH in one invocation, with the input left as it
is between calls (as nccl-tests and bench/peers.py call) and rewritten before every call
(as a training step sends data it has just written).

Usage: python bench/fresh.py [-n 2] [--collectives broadcast,allgather]
                             [--sizes 64KiB,1MiB] [--iters 2000] [--algo NAME] [--json F]

Why: a library that reads the root's pages straight from its process (single copy) finds
them clean in its caches when nobody writes them between calls, and that is what a
back-to-back benchmark measures. Each case runs both ways on both libraries; in ``fresh``
every rank copies its input from a kept array before each call (the broadcast's root its
buffer, every rank its allgather sendbuf), and that copy is inside the timed loop for both
libraries alike. Time per call is the max over ranks of each rank's mean; the outputs are
checked after the timed calls. ``--algo``: a polycast algorithm by name (the engine path);
default ``auto``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers_launch import find_mpiexec, run_bounded  # noqa: E402
from polycast.units import parse_size  # noqa: E402

MODES = ("unchanged", "fresh")


def _worker(lib: str, plan: dict, out: str) -> int:
    if lib == "polycast":
        import polycast
        comm = polycast.init()
        algo = {} if plan["algo"] == "auto" else {"algorithm": plan["algo"]}

        def bcast(b):
            comm.Bcast(b, 0, **algo)

        def allgather(s, r):
            comm.Allgather(s, r, **algo)

        def tmax(x):
            return max(comm.allgather(x))
    else:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD

        def bcast(b):
            comm.Bcast(b, 0)

        def allgather(s, r):
            comm.Allgather(s, r)

        def tmax(x):
            return comm.allreduce(x, op=MPI.MAX)
    P, rank = comm.Get_size(), comm.Get_rank()
    rows = []
    for coll in plan["collectives"]:
        for nbytes in plan["sizes"]:
            for mode in MODES:
                n = nbytes // 4 // (P if coll == "allgather" else 1)
                kept = np.arange(n, dtype=np.float32) + rank * 1000
                if coll == "broadcast":
                    buf = kept.copy() if rank == 0 else np.zeros(n, np.float32)
                    src = buf

                    def call():
                        bcast(buf)
                else:
                    src, out_buf = kept.copy(), np.zeros(P * n, np.float32)

                    def call():
                        allgather(src, out_buf)
                refresh = rank == 0 or coll == "allgather"
                for _ in range(plan["warmup"]):
                    call()
                comm.Barrier()
                fresh = mode == "fresh" and refresh
                t0 = time.perf_counter()
                for _ in range(plan["iters"]):
                    if fresh:
                        src[...] = kept
                    call()
                mean = (time.perf_counter() - t0) / plan["iters"]
                if coll == "broadcast":
                    ok = np.array_equal(buf, np.arange(n, dtype=np.float32))
                else:
                    ok = all(np.array_equal(out_buf[p * n:(p + 1) * n],
                                            np.arange(n, dtype=np.float32) + p * 1000)
                             for p in range(P))
                seconds = tmax(mean)
                bad = tmax(0.0 if ok else 1.0)
                rows.append({"library": lib, "collective": coll, "nbytes": nbytes,
                             "mode": mode, "time_us": seconds * 1e6, "correct": bad == 0.0})
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    if lib == "polycast":
        import polycast
        polycast.finalize()
    return 0


def _launch(lib: str, nranks: int, plan: dict, workdir: str, timeout_s: float) -> list:
    out = os.path.join(workdir, f"{lib}.json")
    args = [str(Path(__file__).resolve()), "--worker", lib, json.dumps(plan), out]
    if lib == "polycast":
        cmd = [sys.executable, "-m", "polycast.cli.main", "run", "-n", str(nranks), *args]
    else:
        mpiexec = find_mpiexec()
        if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
            print("MPICH: not run, mpi4py or mpiexec missing (pip install mpich mpi4py)",
                  file=sys.stderr)
            return []
        cmd = [mpiexec, "-n", str(nranks), sys.executable, *args]
    done = run_bounded(cmd, timeout_s)
    if done.returncode != 0 or not os.path.exists(out):
        print(f"{lib}: failed ({'timed out' if done.timed_out else done.returncode}): "
              f"{done.stderr[-800:]}", file=sys.stderr)
        return []
    return json.loads(Path(out).read_text())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return _worker(argv[1], json.loads(argv[2]), argv[3])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("--collectives", default="broadcast,allgather")
    p.add_argument("--sizes", default="64KiB,1MiB")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--algo", default="auto")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=str(HERE / "results" / "fresh.json"))
    a = p.parse_args(argv)
    plan = {"collectives": a.collectives.split(","), "iters": a.iters, "warmup": a.warmup,
            "sizes": [parse_size(s) for s in a.sizes.split(",")], "algo": a.algo}
    with tempfile.TemporaryDirectory() as tmp:
        rows = (_launch("polycast", a.nranks, plan, tmp, a.timeout)
                + _launch("mpich", a.nranks, plan, tmp, a.timeout))
    got = {(r["library"], r["collective"], r["nbytes"], r["mode"]): r for r in rows}
    print(f"{a.nranks} ranks, polycast {a.algo}; time per call (us), the max over ranks; "
          "fresh: the input rewritten before each call")
    print(f"{'collective':<11}{'size':>9}{'mode':>11}{'polycast':>11}{'MPICH':>11}"
          f"{'MPICH/polycast':>16}")
    for coll in plan["collectives"]:
        for nbytes in plan["sizes"]:
            for mode in MODES:
                pc_, mp = got.get(("polycast", coll, nbytes, mode)), got.get(
                    ("mpich", coll, nbytes, mode))
                cell = [f"{r['time_us']:.2f}" + ("" if r["correct"] else " WRONG")
                        if r else "n/a" for r in (pc_, mp)]
                ratio = f"{mp['time_us'] / pc_['time_us']:.2f}" if pc_ and mp else "n/a"
                print(f"{coll:<11}{nbytes:>9}{mode:>11}{cell[0]:>11}{cell[1]:>11}"
                      f"{ratio:>16}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    Path(a.json).write_text(json.dumps({"command": " ".join(["bench/fresh.py", *argv]),
                                        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                        "nranks": a.nranks, "loadavg": os.getloadavg(),
                                        "rows": rows}, indent=1))
    print(f"wrote {a.json}")
    return 0 if rows and all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
