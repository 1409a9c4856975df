"""One rank of the MPICH peer of bench/peers.py; started by ``mpiexec -n P``.

Usage: mpiexec -n 4 python bench/peers_mpi_worker.py PLAN_JSON OUT_JSONL

Runs every case of the plan with mpi4py's buffer methods (``Allgather``, ``Allreduce``,
``Bcast`` on float32 numpy arrays, MPICH's default algorithm selection) and rank 0 appends
one JSON line per case to OUT_JSONL (see peers_common for how it is timed and checked).
"""

from __future__ import annotations

import sys

import numpy as np

import peers_common as pc

SENTINEL = -1.0


def main(argv: list[str]) -> int:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cases, warmup = pc.load_plan(argv[0])
    out = argv[1]
    library = MPI.Get_library_version().splitlines()[0].strip()

    def prepare(case: pc.Case):
        send = pc.send_data(case.collective, rank, case.count, size)
        if case.collective == "allgather":
            recv = np.full(size * case.count, SENTINEL, dtype=pc.DTYPE)
            def call(): comm.Allgather(send, recv)
        elif case.collective == "allreduce":
            recv = np.full(case.count, SENTINEL, dtype=pc.DTYPE)
            def call(): comm.Allreduce(send, recv, op=MPI.SUM)
        elif case.collective == "broadcast":
            # In place, as MPI_Bcast is: the root's buffer holds its data, the others'
            # the sentinel until the call fills them.
            recv = send.copy() if rank == pc.ROOT else np.full(case.count, SENTINEL, pc.DTYPE)
            def call(): comm.Bcast(recv, root=pc.ROOT)
        elif case.collective == "reduce_scatter":
            recv = np.full(case.count, SENTINEL, dtype=pc.DTYPE)
            def call(): comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
        else:
            raise ValueError(f"unknown collective {case.collective!r}; "
                             f"valid: {', '.join(pc.COLLECTIVES)}")

        def reset():
            if not (case.collective == "broadcast" and rank == pc.ROOT):
                recv.fill(SENTINEL)
        return call, (lambda: recv), reset

    def reduce_scalar(x: float, op) -> float:
        return float(comm.allreduce(float(x), op=op))

    for case in cases:
        row = pc.measure(case, rank, size, prepare, comm.Barrier,
                         lambda x: reduce_scalar(x, MPI.MAX),
                         lambda x: reduce_scalar(x, MPI.MIN), warmup)
        if rank == 0:
            pc.append_row(out, row, peer="mpich", algorithm="mpich default",
                          nranks=size, library=library)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
