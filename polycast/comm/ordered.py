"""Reductions with a non-commutative user op, applied in rank order as MPI guarantees.

The engine's schedules combine contributions in whatever order the data meets (ring,
tree, recursive halving), which is right for commutative ops only. For an op made with
``Op.Create(fn, commute=False)`` the communicator moves the inputs with a plain collective
(allgather, gather or alltoall) and folds them here in rank order: ``x_0 op x_1 op ... op
x_{P-1}``, each step ``fn(invec=x_i, inoutvec=acc)`` from the highest rank down, as MPI
implementations do. It costs P times the memory and the data of one input per rank; the
``I``-forms complete before they return.
"""

from __future__ import annotations

import numpy as np

from .. import ops as _ops
from ..runtime.driver import Request


def fold(parts, opx: _ops.Op, out: np.ndarray) -> None:
    """``out = parts[0] op parts[1] op ... op parts[-1]`` in that order."""
    acc = np.array(parts[-1], copy=True)
    for x in reversed(parts[:-1]):
        res = opx.fn(x, acc, acc.dtype)
        if res is not None and res is not acc:
            acc[...] = res
    out[...] = acc


class OrderedReductions:
    """Mixed into :class:`polycast.Comm`; uses its buffer collectives."""

    def _done(self, what: str) -> Request:
        req = Request(0, self.id, f"rank {self.rank}: {what} (complete on return)",
                      self.timeout_seconds)
        req._finish()
        return req

    def _ordered_allreduce(self, send: np.ndarray, recv: np.ndarray, opx) -> Request:
        P, n = self.size, send.size
        every = np.empty(P * n, send.dtype)
        self.Allgather(send, every)
        fold([every[i * n:(i + 1) * n] for i in range(P)], opx, recv)
        return self._done(f"allreduce with {opx.name} in rank order")

    def _ordered_reduce(self, send: np.ndarray, recv, opx, root: int) -> Request:
        P, n = self.size, send.size
        every = np.empty(P * n, send.dtype) if self.rank == root else None
        self.Gather(send, every, root)
        if self.rank == root:
            fold([every[i * n:(i + 1) * n] for i in range(P)], opx, recv)
        return self._done(f"reduce with {opx.name} in rank order")

    def _ordered_reduce_scatter(self, send: np.ndarray, recv: np.ndarray, opx) -> Request:
        P, n = self.size, recv.size
        mine = np.empty(P * n, send.dtype)        # block p: rank p's block for this rank
        self.Alltoall(send, mine)
        fold([mine[i * n:(i + 1) * n] for i in range(P)], opx, recv)
        return self._done(f"reduce_scatter with {opx.name} in rank order")
