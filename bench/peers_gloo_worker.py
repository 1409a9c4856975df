"""The torch.distributed gloo peer of bench/peers.py: starts P local ranks with
torch.multiprocessing on 127.0.0.1 and runs the plan on each.

Usage: python bench/peers_gloo_worker.py NRANKS PORT PLAN_JSON OUT_JSONL

Each rank uses ``all_gather_single`` / ``all_gather_into_tensor`` (falling back to
``all_gather`` into a list when this torch lacks both), ``all_reduce`` (SUM) and ``broadcast`` on float32 CPU tensors
that share memory with numpy arrays; rank 0 appends one JSON line per case to OUT_JSONL
(see peers_common for how it is timed and checked).
"""

from __future__ import annotations

import datetime
import os
import sys

import numpy as np

import peers_common as pc

SENTINEL = -1.0


def _reduce_scatter_call(dist, recv, send):
    """The flat-input reduce-scatter, ``reduce_scatter_tensor`` (torch 2.13 warns it is
    deprecated; the warning is silenced so it does not drown the bench's output)."""
    import warnings
    warnings.filterwarnings("ignore", message=".*reduce_scatter_tensor.*deprecated")
    return lambda: dist.reduce_scatter_tensor(recv, send, op=dist.ReduceOp.SUM)


def _allgather_call(dist, recv, send, count):
    """The flat-output allgather this torch offers (``all_gather_single`` since 2.13,
    ``all_gather_into_tensor`` before), else ``all_gather`` into views of ``recv``."""
    for name in ("all_gather_single", "all_gather_into_tensor"):
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        try:
            fn(recv, send)
        except (RuntimeError, NotImplementedError):
            continue
        return lambda: fn(recv, send)
    parts = list(recv.split(count))
    return lambda: dist.all_gather(parts, send)


def rank_main(rank: int, size: int, port: int, plan: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    # Loopback only: gloo would otherwise pick the interface the hostname resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=60))
    cases, warmup = pc.load_plan(plan)

    def prepare(case: pc.Case):
        send_np = pc.send_data(case.collective, rank, case.count, size)
        send = torch.from_numpy(send_np)
        if case.collective == "allgather":
            recv = torch.full((size * case.count,), SENTINEL, dtype=torch.float32)
            call = _allgather_call(dist, recv, send, case.count)
            recv.fill_(SENTINEL)
        elif case.collective == "allreduce":
            # all_reduce is in place: copy the input in each call, as an out-of-place
            # allreduce (MPI's, nccl-tests') does; a count-element copy is cheap next to it.
            recv = torch.full((case.count,), SENTINEL, dtype=torch.float32)
            def call():
                recv.copy_(send)
                dist.all_reduce(recv, op=dist.ReduceOp.SUM)
        elif case.collective == "broadcast":
            recv = send.clone() if rank == pc.ROOT else torch.full(
                (case.count,), SENTINEL, dtype=torch.float32)
            def call(): dist.broadcast(recv, src=pc.ROOT)
        elif case.collective == "reduce_scatter":
            recv = torch.full((case.count,), SENTINEL, dtype=torch.float32)
            call = _reduce_scatter_call(dist, recv, send)
        else:
            raise ValueError(f"unknown collective {case.collective!r}; "
                             f"valid: {', '.join(pc.COLLECTIVES)}")

        def reset():
            if not (case.collective == "broadcast" and rank == pc.ROOT):
                recv.fill_(SENTINEL)
        return call, (lambda: recv.numpy()), reset

    def reduce_scalar(x: float, op) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return float(t.item())

    def barrier():
        dist.barrier()

    for case in cases:
        row = pc.measure(case, rank, size, prepare, barrier,
                         lambda x: reduce_scalar(x, dist.ReduceOp.MAX),
                         lambda x: reduce_scalar(x, dist.ReduceOp.MIN), warmup)
        if rank == 0:
            pc.append_row(out, row, peer="gloo", algorithm="gloo", nranks=size,
                          library=f"torch {torch.__version__} gloo")
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp
    size, port, plan, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    mp.spawn(rank_main, args=(size, port, plan, out), nprocs=size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
