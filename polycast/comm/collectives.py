"""mpi4py's buffer collectives: the ``I``-forms post a schedule (or take the
symmetric-memory path on one host) and return a :class:`Request`; the blocking forms wait
on it.

Every argument is checked before anything moves (buffers and specs: :mod:`.buffers`; ops:
:mod:`polycast.ops`). A check that fails on one rank fails the call on every rank: this
rank raises InvalidArgument and still takes the call's turn (:meth:`CommCore._refused`),
so the others raise InvalidArgument naming it and every rank's next call matches. Aliased
arguments (``Allreduce(x, x)``, ``Alltoall(y, y)``, an Allgather sendbuf that is the rank's
own block of recvbuf) are taken as ``IN_PLACE``, as MPI-4's bindings do for identical
buffers; buffers that only partly overlap are refused.
"""

from __future__ import annotations

import numpy as np

from .. import ops as _ops
from ..collectives import Collective
from ..errors import InvalidArgument
from ..dispatch import routing as _routing
from ..runtime import symm as _symm
from ..runtime.driver import Request
# A rank whose own arguments fail on the symmetric-memory path still joins its opening
# barrier, as "cannot take part", so the peers raise at once (a plain try/except around
# the checks: a context manager cost ~1.5 us a call).
from ..runtime.symm.common import _tell_peers as _symm_tell_peers
from ..buffers import IN_PLACE, check_disjoint, message, same_memory

# Routing asks symmetric memory about "an ordinary array" when a rank's buffer is anything
# else, so every rank takes the same path whatever it passed (bad arguments included).
_PROBE = np.empty(0, np.uint8)


_ALLREDUCE, _ALLGATHER = Collective.ALLREDUCE, Collective.ALLGATHER
_REDUCE_SCATTER, _BCAST, _BARRIER = (Collective.REDUCE_SCATTER, Collective.BROADCAST,
                                     Collective.BARRIER)


def _probe(buf):
    if type(buf) is np.ndarray and not buf.dtype.hasobject:
        return buf
    return _PROBE


def _in_place(send, recv, call: str) -> bool:
    """Whether ``send`` is ``recv`` itself (taken as IN_PLACE); partly overlapping
    buffers are an error."""
    if same_memory(send, recv):
        return True
    check_disjoint(send, recv, call)
    return False


def _root_ok(root, size: int) -> bool:
    return isinstance(root, (int, np.integer)) and 0 <= root < size


class BufferCollectives:
    """Mixed into :class:`polycast.Comm`; uses its ``_post``, ``_refused``, ``rank`` and
    ``size``."""

    def _i_direct(self, key: tuple, method: str, args: tuple, post, send, recv) -> Request:
        """An I-form on the engine path: the first of ``key``'s kept DirectCalls that takes
        the call returns its Request (done, or adopted by the engine); else ``post()``'s,
        whose shape is kept when the compiled replay ran it whole."""
        if self._direct:
            for dc in self._direct.get(key, ()):
                req = getattr(dc, method)(*args, True)
                if req is not False:
                    return req
        req = post()
        if getattr(req, "replay", None) is not None:
            self._direct_keep(req, key, send, recv)
        return req

    # -- broadcast, reduce ---------------------------------------------------------------
    # The symm path runs a blocking call on the caller's thread and a non-blocking one on
    # the communicator's worker (runtime/symm/queue.py): each collective it takes has one
    # body, told which. On the engine path, the I-forms take kept DirectCalls as the
    # blocking forms do (see "blocking forms" below): a Request, done or adopted.
    def Ibcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> Request:
        fast = self._symm_fast          # (see the blocking forms below)
        if fast is not None and algorithm is None:
            got = fast.bcast(buf, root, True)
            if got is not False:
                return self._symm_state.bar.fast_request(got, "bcast")
        if type(root) is not int:
            return self._bcast(buf, root, algorithm, False)
        return self._i_direct((_BCAST, algorithm, root), "bcast", (buf, root == self.rank),
                              lambda: self._bcast(buf, root, algorithm, False), None, buf)

    def _bcast(self, buf, root, algorithm, blocking: bool) -> Request:
        if _root_ok(root, self.size) and _routing.auto_staged(self, Collective.BROADCAST,
                                                           algorithm, _probe(buf)):
            try:
                b = message(buf, "buf", writable=self.rank != root)
            except InvalidArgument:
                _symm_tell_peers(self, "bcast")
                raise
            req = _symm.staged_bcast(self, b, int(root), blocking)
            if req is not None:
                return req
        try:
            self._check_root(root)
            b = message(buf, "buf", writable=self.rank != root)
            return self._post(Collective.BROADCAST, b if self.rank == root else None, b,
                              b.size, root, algorithm=algorithm)
        except Exception as exc:
            raise self._refused("Bcast", exc)

    def Ireduce(self, sendbuf, recvbuf, op="sum", root: int = 0, *,
                algorithm: str | None = None) -> Request:
        try:
            self._check_root(root)
            opx = _ops.get(op)
            recv = None
            if self.rank == root:
                recv = message(recvbuf, "recvbuf", writable=True)
            if sendbuf is IN_PLACE:
                if self.rank != root:
                    raise InvalidArgument("IN_PLACE in Reduce is only valid at the root")
                send = recv.copy()
            else:
                send = message(sendbuf, "sendbuf")
                if recv is not None and _in_place(send, recv, "Reduce"):
                    send = recv.copy()
            if opx.commute:
                return self._post(Collective.REDUCE, send, recv, send.size, root, opx.name,
                                  algorithm)
            opx.check(send.dtype, "Reduce: ")
        except Exception as exc:
            raise self._refused("Reduce", exc)
        return self._ordered_reduce(send, recv, opx, root)     # its own calls refuse

    def Iallreduce(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None
                   ) -> Request:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.allreduce(sendbuf, recvbuf, op, True)
            if got is not False:
                return self._symm_state.bar.fast_request(got, "allreduce")
        if type(op) is not str:
            return self._allreduce(sendbuf, recvbuf, op, algorithm, False)
        return self._i_direct((_ALLREDUCE, algorithm, op), "allreduce", (sendbuf, recvbuf),
                              lambda: self._allreduce(sendbuf, recvbuf, op, algorithm, False),
                              sendbuf, recvbuf)

    def _allreduce(self, sendbuf, recvbuf, op, algorithm, blocking: bool) -> Request:
        try:
            opx = _ops.get(op)
        except Exception as exc:
            raise self._refused("Allreduce", exc)
        in_place = sendbuf is IN_PLACE
        if opx.builtin:
            path = _routing.route(self, Collective.ALLREDUCE, algorithm, _probe(sendbuf),
                               _probe(recvbuf), in_place)
            if path is _routing.SYMM:
                return _symm.allreduce(self, sendbuf, recvbuf, opx.name, in_place, blocking)
            if path is _routing.STAGED:
                try:
                    recv, send, in_place = self._allreduce_args(sendbuf, recvbuf, opx)
                except InvalidArgument:
                    _symm_tell_peers(self, "allreduce")
                    raise
                req = _symm.staged_allreduce(self, send, recv, opx.name, in_place, blocking)
                if req is not None:
                    return req
        try:
            recv, send, in_place = self._allreduce_args(sendbuf, recvbuf, opx)
            # In place: the input is copied first, so every algorithm is safe to use.
            if in_place:
                send = recv.copy()
            if opx.commute:
                return self._post(Collective.ALLREDUCE, send, recv, recv.size, 0, opx.name,
                                  algorithm)
        except Exception as exc:
            raise self._refused("Allreduce", exc)
        return self._ordered_allreduce(send, recv, opx)

    @staticmethod
    def _allreduce_args(sendbuf, recvbuf, opx):
        recv = message(recvbuf, "recvbuf", writable=True)
        in_place = sendbuf is IN_PLACE
        send = recv if in_place else message(sendbuf, "sendbuf")
        if not in_place and _in_place(send, recv, "Allreduce"):
            send, in_place = recv, True
        if send.size != recv.size:
            raise InvalidArgument(f"Allreduce needs equal send and recv sizes, got "
                                  f"{send.size} and {recv.size}")
        if send.dtype != recv.dtype:
            raise InvalidArgument(f"Allreduce: sendbuf dtype {send.dtype} and recvbuf "
                                  f"dtype {recv.dtype} must match")
        opx.check(recv.dtype, "Allreduce: ")
        return recv, send, in_place

    # -- allgather, reduce-scatter -------------------------------------------------------
    def Iallgather(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.allgather(sendbuf, recvbuf, True)
            if got is not False:
                return self._symm_state.bar.fast_request(got, "allgather")
        return self._i_direct((_ALLGATHER, algorithm, None), "allgather", (sendbuf, recvbuf),
                              lambda: self._allgather(sendbuf, recvbuf, algorithm, False),
                              sendbuf, recvbuf)

    def _allgather(self, sendbuf, recvbuf, algorithm, blocking: bool) -> Request:
        if sendbuf is None:
            sendbuf = IN_PLACE                  # mpi4py 4: None is IN_PLACE here
        in_place = sendbuf is IN_PLACE
        path = _routing.route(self, Collective.ALLGATHER, algorithm, _probe(sendbuf),
                           _probe(recvbuf), in_place)
        if path is _routing.SYMM:
            return _symm.allgather(self, sendbuf, recvbuf, in_place, blocking)
        if path is _routing.STAGED:
            try:
                recv, send, in_place = self._allgather_args(sendbuf, recvbuf)
            except InvalidArgument:
                _symm_tell_peers(self, "allgather")
                raise
            req = _symm.staged_allgather(self, send, recv, in_place, blocking)
            if req is not None:
                return req
        try:
            recv, send, in_place = self._allgather_args(sendbuf, recvbuf)
            if in_place:
                send = send.copy()
            return self._post(Collective.ALLGATHER, send, recv, send.size, 0,
                              algorithm=algorithm)
        except Exception as exc:
            raise self._refused("Allgather", exc)

    def _allgather_args(self, sendbuf, recvbuf):
        """(recv, send, in place): send is this rank's block of recv when in place."""
        P, r = self.size, self.rank
        recv = message(recvbuf, "recvbuf", blocks=P, writable=True)
        n = recv.size // P
        mine = recv[r * n:(r + 1) * n]
        if sendbuf is IN_PLACE:
            return recv, mine, True
        send = message(sendbuf, "sendbuf")
        if same_memory(send, mine):
            return recv, mine, True
        check_disjoint(send, recv, "Allgather")
        if send.size != n:
            raise InvalidArgument(f"Allgather: sendbuf has {send.size} elements, recvbuf "
                                  f"needs {P} x {send.size} = {P * send.size}, got "
                                  f"{recv.size}")
        if send.dtype != recv.dtype:
            raise InvalidArgument(f"Allgather: sendbuf is {send.dtype}, recvbuf "
                                  f"{recv.dtype}: they must match")
        return recv, send, False

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op="sum", *,
                              algorithm: str | None = None) -> Request:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.reduce_scatter(sendbuf, recvbuf, op, True)
            if got is not False:
                return self._symm_state.bar.fast_request(got, "reduce_scatter")
        if type(op) is not str:
            return self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, False)
        return self._i_direct(
            (_REDUCE_SCATTER, algorithm, op), "reduce_scatter", (sendbuf, recvbuf),
            lambda: self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, False),
            sendbuf, recvbuf)

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, algorithm, blocking: bool
                              ) -> Request:
        try:
            opx = _ops.get(op)
        except Exception as exc:
            raise self._refused("Reduce_scatter_block", exc)
        in_place = sendbuf is IN_PLACE
        if opx.builtin:
            path = _routing.route(self, Collective.REDUCE_SCATTER, algorithm, _probe(sendbuf),
                               _probe(recvbuf), in_place)
            if path is _routing.SYMM:
                return _symm.reduce_scatter(self, sendbuf, recvbuf, opx.name, in_place,
                                            blocking)
            if path is _routing.STAGED:
                try:
                    recv, send = self._reduce_scatter_args(sendbuf, recvbuf, opx)
                except InvalidArgument:
                    _symm_tell_peers(self, "reduce_scatter")
                    raise
                req = _symm.staged_reduce_scatter(self, None if in_place else send,
                                                  recv if not in_place else send,
                                                  opx.name, in_place, blocking)
                if req is not None:
                    return req
        try:
            recv, send = self._reduce_scatter_args(sendbuf, recvbuf, opx)
            if in_place:
                send = send.copy()
            if opx.commute:
                return self._post(Collective.REDUCE_SCATTER, send, recv, recv.size, 0,
                                  opx.name, algorithm)
        except Exception as exc:
            raise self._refused("Reduce_scatter_block", exc)
        return self._ordered_reduce_scatter(send, recv, opx)

    def _reduce_scatter_args(self, sendbuf, recvbuf, opx):
        """(recv, send): recv the first block of recvbuf when in place (its P blocks are
        the input)."""
        P = self.size
        if sendbuf is IN_PLACE:
            full = message(recvbuf, "recvbuf", blocks=P, writable=True)
            send, recv = full, full[:full.size // P]
        else:
            recv = message(recvbuf, "recvbuf", writable=True)
            send = message(sendbuf, "sendbuf")
            check_disjoint(send, recv, "Reduce_scatter_block")
            if send.size != P * recv.size:
                raise InvalidArgument(f"Reduce_scatter_block: sendbuf needs {P} x "
                                      f"{recv.size} = {P * recv.size} elements, got "
                                      f"{send.size}")
            if send.dtype != recv.dtype:
                raise InvalidArgument(f"Reduce_scatter_block: sendbuf dtype {send.dtype} "
                                      f"and recvbuf dtype {recv.dtype} must match")
        opx.check(recv.dtype, "Reduce_scatter_block: ")
        return recv, send

    # -- scatter, gather, alltoall -------------------------------------------------------
    def Iscatter(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                 ) -> Request:
        try:
            self._check_root(root)
            P = self.size
            send = None
            if self.rank == root:
                send = message(sendbuf, "sendbuf", blocks=P)
                n = send.size // P
                if recvbuf is IN_PLACE or recvbuf is None:     # mpi4py 4: None too
                    recv = np.empty(n, send.dtype)      # the root's block stays put
                else:
                    recv = message(recvbuf, "recvbuf", writable=True)
                    if same_memory(recv, send[root * n:(root + 1) * n]):
                        recv = np.empty(n, send.dtype)
                    else:
                        check_disjoint(send, recv, "Scatter")
                    if send.size != P * recv.size:
                        raise InvalidArgument(f"Scatter: sendbuf needs {P} x {recv.size} "
                                              f"elements, got {send.size}")
            else:
                if recvbuf is IN_PLACE:
                    raise InvalidArgument("IN_PLACE in Scatter is only valid at the root")
                recv = message(recvbuf, "recvbuf", writable=True)
            return self._post(Collective.SCATTER, send, recv, recv.size, root,
                              algorithm=algorithm)
        except Exception as exc:
            raise self._refused("Scatter", exc)

    def Igather(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                ) -> Request:
        try:
            self._check_root(root)
            P = self.size
            recv = None
            if self.rank == root:
                recv = message(recvbuf, "recvbuf", blocks=P, writable=True)
                n = recv.size // P
                mine = recv[root * n:(root + 1) * n]
                if sendbuf is IN_PLACE or sendbuf is None:     # mpi4py 4: None too
                    send = mine.copy()
                else:
                    send = message(sendbuf, "sendbuf")
                    if same_memory(send, mine):
                        send = mine.copy()
                    else:
                        check_disjoint(send, recv, "Gather")
                if recv.size != P * send.size:
                    raise InvalidArgument(f"Gather: recvbuf needs {P} x {send.size} "
                                          f"elements, got {recv.size}")
            else:
                if sendbuf is IN_PLACE:
                    raise InvalidArgument("IN_PLACE in Gather is only valid at the root")
                send = message(sendbuf, "sendbuf")
            return self._post(Collective.GATHER, send, recv, send.size, root,
                              algorithm=algorithm)
        except Exception as exc:
            raise self._refused("Gather", exc)

    def Ialltoall(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        try:
            P = self.size
            recv = message(recvbuf, "recvbuf", blocks=P, writable=True)
            if sendbuf is IN_PLACE:
                send = recv.copy()
            else:
                send = message(sendbuf, "sendbuf", blocks=P)
                if _in_place(send, recv, "Alltoall"):
                    send = recv.copy()
            if send.size != recv.size:
                raise InvalidArgument(f"Alltoall needs equal send and recv sizes divisible "
                                      f"by {P} ranks, got {send.size} and {recv.size}")
            return self._post(Collective.ALLTOALL, send, recv, send.size // P, 0,
                              algorithm=algorithm)
        except Exception as exc:
            raise self._refused("Alltoall", exc)

    def Ibarrier(self, *, algorithm: str | None = None) -> Request:
        return self._i_direct((_BARRIER, algorithm, None), "barrier", (),
                              lambda: self._ibarrier(algorithm), None, None)

    def _ibarrier(self, algorithm) -> Request:
        try:
            return self._post(Collective.BARRIER, None, None, 0, 0, algorithm=algorithm)
        except Exception as exc:
            raise self._refused("Barrier", exc)

    # -- blocking forms -------------------------------------------------------------------
    # A repeated small Allreduce / Bcast / Allgather / Reduce_scatter_block on one host is
    # ONE call into the symm path's compiled helper (``_symm_fast``, kept once the Python
    # path ran the same call shape): it checks the arrays themselves and answers False for
    # anything it does not keep, and then the call takes the Python path, which checks and
    # raises as always. The I-variants take it too: copied in and published at once, done
    # when the peers are there within a short spin, else the rest is queued
    # (EpochBarrier.fast_request).
    #
    # On the engine path, a repeated small call the compiled replay ran whole goes straight
    # back there (``_direct``: DirectCalls by collective, algorithm and op or root, kept by
    # _direct_keep; runtime/driver/direct.py), with no Request or registration; one that
    # does not fit what is kept answers False, having done nothing.
    _symm_fast = None

    def Bcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> None:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.bcast(buf, root)
            if got is True:
                return
            if got is not False:
                return self._symm_state.bar.fast_rest(got)
        if self._direct and type(root) is int:
            for dc in self._direct.get((_BCAST, algorithm, root), ()):
                if dc.bcast(buf, root == self.rank):
                    return
        req = self._bcast(buf, root, algorithm, True)
        req.Wait()
        if getattr(req, "replay", None) is not None:
            self._direct_keep(req, (_BCAST, algorithm, root), None, buf)

    def Reduce(self, sendbuf, recvbuf, op="sum", root: int = 0, **kw) -> None:
        self.Ireduce(sendbuf, recvbuf, op, root, **kw).Wait()

    def Allreduce(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None) -> None:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.allreduce(sendbuf, recvbuf, op)
            if got is True:
                return
            if got is not False:
                return self._symm_state.bar.fast_rest(got)
        if self._direct and type(op) is str:
            for dc in self._direct.get((_ALLREDUCE, algorithm, op), ()):
                if dc.allreduce(sendbuf, recvbuf):
                    return
        req = self._allreduce(sendbuf, recvbuf, op, algorithm, True)
        req.Wait()
        if getattr(req, "replay", None) is not None and type(op) is str:
            self._direct_keep(req, (_ALLREDUCE, algorithm, op), sendbuf, recvbuf)

    def Allgather(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> None:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.allgather(sendbuf, recvbuf)
            if got is True:
                return
            if got is not False:
                return self._symm_state.bar.fast_rest(got)
        if self._direct:
            for dc in self._direct.get((_ALLGATHER, algorithm, None), ()):
                if dc.allgather(sendbuf, recvbuf):
                    return
        req = self._allgather(sendbuf, recvbuf, algorithm, True)
        req.Wait()
        if getattr(req, "replay", None) is not None:
            self._direct_keep(req, (_ALLGATHER, algorithm, None), sendbuf, recvbuf)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op="sum", *,
                             algorithm: str | None = None) -> None:
        fast = self._symm_fast
        if fast is not None and algorithm is None:
            got = fast.reduce_scatter(sendbuf, recvbuf, op)
            if got is True:
                return
            if got is not False:
                return self._symm_state.bar.fast_rest(got)
        if self._direct and type(op) is str:
            for dc in self._direct.get((_REDUCE_SCATTER, algorithm, op), ()):
                if dc.reduce_scatter(sendbuf, recvbuf):
                    return
        req = self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, True)
        req.Wait()
        if getattr(req, "replay", None) is not None and type(op) is str:
            self._direct_keep(req, (_REDUCE_SCATTER, algorithm, op), sendbuf, recvbuf)

    def Scatter(self, sendbuf, recvbuf, root: int = 0, **kw) -> None:
        self.Iscatter(sendbuf, recvbuf, root, **kw).Wait()

    def Gather(self, sendbuf, recvbuf, root: int = 0, **kw) -> None:
        self.Igather(sendbuf, recvbuf, root, **kw).Wait()

    def Alltoall(self, sendbuf, recvbuf, **kw) -> None:
        self.Ialltoall(sendbuf, recvbuf, **kw).Wait()

    def Barrier(self, *, algorithm: str | None = None) -> None:
        if self._direct:
            for dc in self._direct.get((_BARRIER, algorithm, None), ()):
                if dc.barrier():
                    return
        req = self._ibarrier(algorithm)
        req.Wait()
        if req.replay is not None:
            self._direct_keep(req, (_BARRIER, algorithm, None), None, None)
