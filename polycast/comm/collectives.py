"""mpi4py's buffer collectives on numpy arrays: the ``I``-forms post a schedule (or take
the symmetric-memory path on one host) and return a :class:`Request`; the blocking forms
wait on it."""

from __future__ import annotations

import numpy as np

from ..collectives import Collective
from ..errors import InvalidArgument
from ..runtime import symm as _symm
from ..runtime.driver import Request
from .buffers import IN_PLACE, as_array


class BufferCollectives:
    """Mixed into :class:`polycast.Comm`; uses its ``_post``, ``rank`` and ``size``."""

    # -- buffer collectives (non-blocking) ------------------------------------------------
    # The symm path runs a blocking call on the caller's thread and a non-blocking one on
    # the communicator's worker (runtime/symm/queue.py): each collective it takes has one
    # body, told which.
    def Ibcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> Request:
        return self._bcast(buf, root, algorithm, False)

    def _bcast(self, buf, root, algorithm, blocking: bool) -> Request:
        if (isinstance(root, int) and 0 <= root < self.size
                and _symm.auto_staged(self, Collective.BROADCAST, algorithm, buf)):
            req = _symm.staged_bcast(self, buf, root, blocking)
            if req is not None:
                return req
        buf = as_array(buf, "buf")
        return self._post(Collective.BROADCAST, buf if self.rank == root else None, buf,
                          buf.size, root, algorithm=algorithm)

    def Ireduce(self, sendbuf, recvbuf, op="sum", root: int = 0, *,
                algorithm: str | None = None) -> Request:
        if sendbuf is IN_PLACE:
            if self.rank != root:
                raise InvalidArgument("IN_PLACE in Reduce is only valid at the root")
            recvbuf = as_array(recvbuf, "recvbuf")
            sendbuf = recvbuf.copy()
        sendbuf = as_array(sendbuf, "sendbuf")
        if self.rank == root:
            recvbuf = as_array(recvbuf, "recvbuf")
        else:
            recvbuf = None
        return self._post(Collective.REDUCE, sendbuf, recvbuf, sendbuf.size, root, op,
                          algorithm)

    def Iallreduce(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None
                   ) -> Request:
        return self._allreduce(sendbuf, recvbuf, op, algorithm, False)

    def _allreduce(self, sendbuf, recvbuf, op, algorithm, blocking: bool) -> Request:
        path = _symm.route(self, Collective.ALLREDUCE, algorithm, sendbuf, recvbuf,
                           sendbuf is IN_PLACE)
        if path is _symm.SYMM:
            return _symm.allreduce(self, sendbuf, recvbuf, op, sendbuf is IN_PLACE, blocking)
        if path is _symm.STAGED:
            req = _symm.staged_allreduce(self, sendbuf, recvbuf, op, sendbuf is IN_PLACE,
                                         blocking)
            if req is not None:
                return req
        recvbuf = as_array(recvbuf, "recvbuf")
        # In place: the input is copied first, so every algorithm is safe to use.
        sendbuf = recvbuf.copy() if sendbuf is IN_PLACE else as_array(sendbuf, "sendbuf")
        if sendbuf.size != recvbuf.size:
            raise InvalidArgument(f"Allreduce needs equal send and recv sizes, got "
                                  f"{sendbuf.size} and {recvbuf.size}")
        return self._post(Collective.ALLREDUCE, sendbuf, recvbuf, recvbuf.size, 0, op,
                          algorithm)

    def Iallgather(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        return self._allgather(sendbuf, recvbuf, algorithm, False)

    def _allgather(self, sendbuf, recvbuf, algorithm, blocking: bool) -> Request:
        path = _symm.route(self, Collective.ALLGATHER, algorithm, sendbuf, recvbuf,
                           sendbuf is IN_PLACE)
        if path is _symm.SYMM:
            return _symm.allgather(self, sendbuf, recvbuf, sendbuf is IN_PLACE, blocking)
        if path is _symm.STAGED:
            req = _symm.staged_allgather(self, sendbuf, recvbuf, sendbuf is IN_PLACE,
                                         blocking)
            if req is not None:
                return req
        recvbuf = as_array(recvbuf, "recvbuf")
        if recvbuf.size % self.size:
            raise InvalidArgument(f"Allgather recvbuf of {recvbuf.size} elements is not a "
                                  f"multiple of the {self.size} ranks")
        count = recvbuf.size // self.size
        if sendbuf is IN_PLACE:
            sendbuf = recvbuf[self.rank * count:(self.rank + 1) * count].copy()
        sendbuf = as_array(sendbuf, "sendbuf")
        if sendbuf.size != count:
            raise InvalidArgument(f"Allgather: sendbuf has {sendbuf.size} elements, recvbuf "
                                  f"needs {self.size} x {sendbuf.size} = "
                                  f"{self.size * sendbuf.size}, got {recvbuf.size}")
        return self._post(Collective.ALLGATHER, sendbuf, recvbuf, count, 0,
                          algorithm=algorithm)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op="sum", *,
                              algorithm: str | None = None) -> Request:
        return self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, False)

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, algorithm, blocking: bool
                              ) -> Request:
        path = _symm.route(self, Collective.REDUCE_SCATTER, algorithm, sendbuf, recvbuf,
                           sendbuf is IN_PLACE)
        if path is _symm.SYMM:
            return _symm.reduce_scatter(self, sendbuf, recvbuf, op, sendbuf is IN_PLACE,
                                        blocking)
        if path is _symm.STAGED:
            req = _symm.staged_reduce_scatter(self, sendbuf, recvbuf, op,
                                              sendbuf is IN_PLACE, blocking)
            if req is not None:
                return req
        recvbuf = as_array(recvbuf, "recvbuf")
        if sendbuf is IN_PLACE:
            if recvbuf.size % self.size:
                raise InvalidArgument("Reduce_scatter_block IN_PLACE: recvbuf must hold "
                                      f"{self.size} blocks, got {recvbuf.size} elements")
            sendbuf = recvbuf.copy()
            recvbuf = recvbuf[:recvbuf.size // self.size]
        sendbuf = as_array(sendbuf, "sendbuf")
        if sendbuf.size != self.size * recvbuf.size:
            raise InvalidArgument(f"Reduce_scatter_block: sendbuf needs {self.size} x "
                                  f"{recvbuf.size} = {self.size * recvbuf.size} elements, "
                                  f"got {sendbuf.size}")
        return self._post(Collective.REDUCE_SCATTER, sendbuf, recvbuf, recvbuf.size, 0, op,
                          algorithm)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                 ) -> Request:
        after = None
        if recvbuf is IN_PLACE:
            if self.rank != root:
                raise InvalidArgument("IN_PLACE in Scatter is only valid at the root")
            sendbuf = as_array(sendbuf, "sendbuf")
            recvbuf = np.empty(sendbuf.size // self.size, sendbuf.dtype)
        recvbuf = as_array(recvbuf, "recvbuf")
        if self.rank == root:
            sendbuf = as_array(sendbuf, "sendbuf")
            if sendbuf.size != self.size * recvbuf.size:
                raise InvalidArgument(f"Scatter: sendbuf needs {self.size} x {recvbuf.size} "
                                      f"elements, got {sendbuf.size}")
        else:
            sendbuf = None
        return self._post(Collective.SCATTER, sendbuf, recvbuf, recvbuf.size, root,
                          algorithm=algorithm, after=after)

    def Igather(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                ) -> Request:
        if sendbuf is IN_PLACE:
            if self.rank != root:
                raise InvalidArgument("IN_PLACE in Gather is only valid at the root")
            recvbuf = as_array(recvbuf, "recvbuf")
            n = recvbuf.size // self.size
            sendbuf = recvbuf[root * n:(root + 1) * n].copy()
        sendbuf = as_array(sendbuf, "sendbuf")
        if self.rank == root:
            recvbuf = as_array(recvbuf, "recvbuf")
            if recvbuf.size != self.size * sendbuf.size:
                raise InvalidArgument(f"Gather: recvbuf needs {self.size} x {sendbuf.size} "
                                      f"elements, got {recvbuf.size}")
        else:
            recvbuf = None
        return self._post(Collective.GATHER, sendbuf, recvbuf, sendbuf.size, root,
                          algorithm=algorithm)

    def Ialltoall(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        recvbuf = as_array(recvbuf, "recvbuf")
        sendbuf = recvbuf.copy() if sendbuf is IN_PLACE else as_array(sendbuf, "sendbuf")
        if sendbuf.size != recvbuf.size or sendbuf.size % self.size:
            raise InvalidArgument(f"Alltoall needs equal send and recv sizes divisible by "
                                  f"{self.size} ranks, got {sendbuf.size} and {recvbuf.size}")
        return self._post(Collective.ALLTOALL, sendbuf, recvbuf, sendbuf.size // self.size,
                          0, algorithm=algorithm)

    def Ibarrier(self, *, algorithm: str | None = None) -> Request:
        return self._post(Collective.BARRIER, None, None, 0, 0, algorithm=algorithm)

    # -- blocking forms -------------------------------------------------------------------
    def Bcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> None:
        self._bcast(buf, root, algorithm, True).Wait()

    def Reduce(self, sendbuf, recvbuf, op="sum", root: int = 0, **kw) -> None:
        self.Ireduce(sendbuf, recvbuf, op, root, **kw).Wait()

    def Allreduce(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None) -> None:
        self._allreduce(sendbuf, recvbuf, op, algorithm, True).Wait()

    def Allgather(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> None:
        self._allgather(sendbuf, recvbuf, algorithm, True).Wait()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op="sum", *,
                             algorithm: str | None = None) -> None:
        self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, True).Wait()

    def Scatter(self, sendbuf, recvbuf, root: int = 0, **kw) -> None:
        self.Iscatter(sendbuf, recvbuf, root, **kw).Wait()

    def Gather(self, sendbuf, recvbuf, root: int = 0, **kw) -> None:
        self.Igather(sendbuf, recvbuf, root, **kw).Wait()

    def Alltoall(self, sendbuf, recvbuf, **kw) -> None:
        self.Ialltoall(sendbuf, recvbuf, **kw).Wait()

    def Barrier(self, **kw) -> None:
        self.Ibarrier(**kw).Wait()
