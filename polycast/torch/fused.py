"""Collective + matmul, micro-pipelined: the decomposition of PyTorch's micro-pipeline
tensor parallelism (``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``).

* ``allgather_matmul(x_shard, w)`` = ``all_gather(x_shard) @ w`` (column-parallel linear
  with sequence-sharded input): each rank's rows are cut into ``nchunks`` chunks; chunk
  i+1's all-gather runs (asynchronously) while chunk i's gathered rows are multiplied.
* ``matmul_reduce_scatter(x, w)`` = ``reduce_scatter(x @ w)`` along rows (row-parallel
  linear): chunk i of every rank's output block is multiplied, then reduce-scattered
  asynchronously while chunk i+1 is multiplied.

Results are those of the unfused pair (the same products, summed in the same collective):
equal for integer-valued data, equal to rounding otherwise (a chunk's matmul may block
its reduction differently). Any process group works (these call torch.distributed with
``async_op=True``); on a polycast group the collectives run on polycast.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import InvalidArgument
from .tensors import check

DEFAULT_NCHUNKS = 4


def _chunks(rows: int, nchunks: int | None) -> list[tuple[int, int]]:
    """(start, stop) row ranges of ``rows`` cut into at most ``nchunks`` near-equal parts."""
    n = DEFAULT_NCHUNKS if nchunks is None else nchunks
    if not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"nchunks must be a positive integer, got {nchunks!r}")
    n = max(1, min(n, rows))
    base, extra = divmod(rows, n)
    out, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _matrices(a: torch.Tensor, w: torch.Tensor, what: str) -> None:
    check(a, f"{what} input")
    check(w, f"{what} weight")
    if a.dim() != 2 or w.dim() != 2:
        raise InvalidArgument(f"{what}: input and weight must be 2-D matrices, got shapes "
                              f"{tuple(a.shape)} and {tuple(w.shape)}")
    if a.shape[1] != w.shape[0]:
        raise InvalidArgument(f"{what}: input {tuple(a.shape)} and weight {tuple(w.shape)} "
                              "do not multiply")
    if a.dtype != w.dtype:
        raise InvalidArgument(f"{what}: input is {a.dtype}, weight is {w.dtype}")


def allgather_matmul(x_shard: torch.Tensor, w: torch.Tensor, group=None, *,
                     nchunks: int | None = None) -> torch.Tensor:
    """``all_gather_into_tensor(x_shard) @ w``: ``x_shard`` is this rank's [m, k] rows
    (every rank the same m), ``w`` a [k, n] weight; returns [P*m, n] with rank p's rows at
    p*m. The all-gather of chunk i+1 overlaps the matmul of chunk i."""
    _matrices(x_shard, w, "allgather_matmul")
    P = dist.get_world_size(group)
    m, k = x_shard.shape
    n = w.shape[1]
    x_shard = x_shard.contiguous()
    y = torch.empty(P, m, n, dtype=w.dtype)
    spans = _chunks(m, nchunks) if m else []
    gathered = [torch.empty(P, b - a, k, dtype=x_shard.dtype) for a, b in spans]

    def start(i: int):
        a, b = spans[i]
        return dist.all_gather_into_tensor(gathered[i], x_shard[a:b], group=group,
                                           async_op=True)
    pending = start(0) if spans else None
    for i, (a, b) in enumerate(spans):
        work = pending
        pending = start(i + 1) if i + 1 < len(spans) else None   # in flight during matmul i
        work.wait()
        for p in range(P):          # rows a:b of rank p's block: contiguous, written in place
            torch.mm(gathered[i][p], w, out=y[p, a:b])
    return y.reshape(P * m, n)


def matmul_reduce_scatter(x: torch.Tensor, w: torch.Tensor, group=None, *,
                          op=dist.ReduceOp.SUM, nchunks: int | None = None) -> torch.Tensor:
    """``reduce_scatter_tensor(x @ w)`` along rows: ``x`` is [P*m, k] (this rank's
    partial input), ``w`` [k, n]; returns this rank's [m, n] rows of the reduced product.
    The reduce-scatter of chunk i overlaps the matmul of chunk i+1."""
    _matrices(x, w, "matmul_reduce_scatter")
    P = dist.get_world_size(group)
    rows, k = x.shape
    if rows % P:
        raise InvalidArgument(f"matmul_reduce_scatter: input has {rows} rows, not a "
                              f"multiple of the group's {P} ranks")
    m, n = rows // P, w.shape[1]
    x3 = x.contiguous().reshape(P, m, k)        # block p: the rows rank p ends up with
    out = torch.empty(m, n, dtype=w.dtype)
    works, keep = [], []
    for a, b in _chunks(m, nchunks) if m else []:
        part = torch.empty(P, b - a, n, dtype=w.dtype)    # chunk a:b of every block
        for p in range(P):
            torch.mm(x3[p, a:b], w, out=part[p])
        piece = out[a:b]
        works.append(dist.reduce_scatter_tensor(piece, part, op=op, group=group,
                                                async_op=True))
        keep.append(part)                       # alive until its reduce-scatter is done
    for work in works:
        work.wait()
    return out
