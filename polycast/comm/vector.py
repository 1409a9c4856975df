"""mpi4py's vector and scan collectives: ``Gatherv, Scatterv, Allgatherv, Alltoallv``,
``Reduce_scatter`` (with ``recvcounts``), ``Scan, Exscan`` and their ``I``-forms.

>>> comm.Allgatherv(x, [out, counts])                      # displs: packed in rank order
>>> comm.Alltoallv([s, scounts], [r, rcounts])
>>> comm.Reduce_scatter(x, y, recvcounts=counts, op="sum")
>>> comm.Scan(x, y, op="sum")                              # y = x_0 + ... + x_rank

How they run. Each call first agrees on its counts: a small blocking Allgather of one row
of integers per rank (its own counts, or a CRC of the counts it was given), so every rank
sees the same table and

* counts that disagree between ranks (a receiver expecting 3 elements from a sender that
  sends 4, ranks passing different ``counts``) raise the same InvalidArgument on every
  rank before any data moves; a check only the root can make (Gatherv, Scatterv) refuses
  the data step, which fails it on every rank naming the root's reason;
* the data moves with the uniform collective (Allgather, Gather, Scatter, Alltoall,
  Reduce_scatter_block) on blocks padded to the largest count — the engine's verified
  schedules, every algorithm and the symmetric-memory path, unchanged. When every count is
  the same and the buffers are packed, the user's arrays are used directly (no padding, no
  copies); otherwise the data goes through padded temporaries and is copied out when the
  request completes (in ``Wait``/``Test``). The padding costs ``P * max(counts) /
  sum(counts)`` times the bytes of an exact schedule: small for FSDP's uneven shards, large
  for very skewed Alltoallv (MoE-style) traffic.

``Scan``/``Exscan`` gather every rank's input (Allgather) and fold the prefix locally in
rank order, so any op (non-commutative user ops too) gives MPI's result; it moves ``P``
times the data of a recursive-doubling scan. The count agreement and the scan's gather go
through the engine (not symmetric memory) because that is where a refusing rank takes its
turn; the data steps of the other calls may take any path, since after the agreement either
every rank raises or the only refusals left are of engine-only calls (Gather, Scatter,
Alltoall). The ``I``-forms of all these post the data
step and return; the count agreement before it waits for the peers to reach the call.
"""

from __future__ import annotations

import zlib

import numpy as np

from .. import ops as _ops
from ..collectives import Collective
from ..errors import InvalidArgument
from ..runtime.driver import Request
from .buffers import IN_PLACE, check_disjoint, message, same_memory, vector
from .ordered import fold


def _crc(counts) -> int:
    return zlib.crc32(np.asarray(counts, np.int64).tobytes())


def _then(req: Request, fn) -> Request:
    """Run ``fn`` when the request is finished by its waiter (after its own last step)."""
    prev = req.on_done

    def done():
        res = prev() if prev is not None else None
        fn()
        return res
    req.on_done = done
    return req


def _pad(v, P: int, m: int, dtype) -> np.ndarray:
    """The blocks of vector buffer ``v`` laid out ``m`` elements apart (zeros between)."""
    out = np.zeros(P * m, dtype)
    for i in range(P):
        c, d = v.counts[i], v.displs[i]
        out[i * m:i * m + c] = v.array[d:d + c]
    return out


def _unpad(tmp: np.ndarray, v, P: int, m: int, skip: int | None = None) -> None:
    for i in range(P):
        c, d = v.counts[i], v.displs[i]
        if i != skip and c:
            v.array[d:d + c] = tmp[i * m:i * m + c]


def _own_block(sendbuf, rv, r: int, call: str) -> np.ndarray:
    """This rank's input to a gathering call whose output is vector buffer ``rv``:
    ``sendbuf``, or its own block of ``rv`` for IN_PLACE (or the very same memory)."""
    lo = rv.displs[r]
    mine = rv.array[lo:lo + rv.counts[r]]
    if sendbuf is IN_PLACE:
        return mine
    send = message(sendbuf, "sendbuf")
    if not same_memory(send, mine):
        check_disjoint(send, rv.array, call)
    if send.dtype != rv.array.dtype:
        raise InvalidArgument(f"{call}: sendbuf is {send.dtype}, recvbuf "
                              f"{rv.array.dtype}: they must match")
    return send


def _padded(send: np.ndarray, m: int, dtype=None) -> np.ndarray:
    """``send`` in a zeroed block of ``m`` elements: the uniform schedule's block size."""
    out = np.zeros(m, send.dtype if dtype is None else dtype)
    out[:send.size] = send
    return out


def _uniform(v, m: int) -> bool:
    """Every block ``m`` long and packed: the array can be used as it is."""
    return all(c == m for c in v.counts) and v.packed


class VectorCollectives:
    """Mixed into :class:`polycast.Comm`; uses its buffer collectives, ``_refused``,
    ``_check_root``, ``rank`` and ``size``."""

    # -- the count agreement ----------------------------------------------------------
    def _table(self, call: str, row_of) -> np.ndarray:
        """Every rank's row (``row_of()``: this rank's checked arguments as integers, the
        same length on every rank) as a (P, L) table. A failing check refuses the call on
        every rank."""
        try:
            row = np.asarray(row_of(), np.int64)
        except Exception as exc:
            raise self._refused(call, exc)
        table = np.empty(self.size * row.size, np.int64)
        # Through the engine, always: a refusal is the engine's turn-taking, which the
        # symmetric-memory path does not see.
        self._post(Collective.ALLGATHER, row, table, row.size).Wait()
        return table.reshape(self.size, row.size)

    def _empty_done(self, call: str) -> Request:
        return self._done(f"{call} of no elements")

    # -- Allgatherv --------------------------------------------------------------------
    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        """``recvbuf`` is ``[buf, counts]`` or ``[buf, counts, displs]`` (mpi4py's
        forms) on every rank; ``sendbuf`` has ``counts[rank]`` elements, or is
        IN_PLACE (this rank's block of recvbuf is its input)."""
        P, r, call = self.size, self.rank, "Allgatherv"
        a = {}

        def row():
            rv = a["rv"] = vector(recvbuf, "recvbuf", P, writable=True)
            send = _own_block(sendbuf, rv, r, call)
            if send.size != rv.counts[r]:
                raise InvalidArgument(f"{call}: sendbuf has {send.size} elements, but "
                                      f"counts[{r}] is {rv.counts[r]}")
            a["send"] = send
            return [_crc(rv.counts), send.size]
        t = self._table(call, row)
        rv, send = a["rv"], a["send"]
        if len(set(t[:, 0].tolist())) != 1:
            raise InvalidArgument(f"{call}: ranks passed different counts (rank {r}: "
                                  f"{list(rv.counts)}); every rank must pass the same")
        m = max(rv.counts)
        if m == 0:
            return self._empty_done(call)
        if _uniform(rv, m):                      # Iallgather takes the aliased block
            return self.Iallgather(send, rv.array[:P * m])
        tmp_send = _padded(send, m, rv.array.dtype)
        tmp = np.empty(P * m, rv.array.dtype)
        return _then(self.Iallgather(tmp_send, tmp), lambda: _unpad(tmp, rv, P, m))

    # -- Gatherv, Scatterv ----------------------------------------------------------------
    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        """``recvbuf`` (``[buf, counts(, displs)]``) matters at the root only; IN_PLACE as
        sendbuf at the root keeps its block where it is."""
        P, r, call = self.size, self.rank, "Gatherv"
        a = {}

        def row():
            a["root"] = rt = self._check_root(root)
            rv = None
            if r == rt:
                rv = vector(recvbuf, "recvbuf", P, writable=True)
                send = _own_block(sendbuf, rv, r, call)
            else:
                if sendbuf is IN_PLACE:
                    raise InvalidArgument(f"IN_PLACE in {call} is only valid at the root")
                send = message(sendbuf, "sendbuf")
            a["rv"], a["send"] = rv, send
            return [send.size, send.dtype.itemsize]
        t = self._table(call, row)
        rt, rv, send = a["root"], a["rv"], a["send"]
        sizes = t[:, 0].tolist()
        m = max(sizes)
        if len(set(t[:, 1].tolist())) != 1:
            raise InvalidArgument(f"{call}: ranks send elements of different sizes "
                                  f"(itemsize per rank: {t[:, 1].tolist()})")
        try:
            if r == rt and list(rv.counts) != sizes:
                raise InvalidArgument(f"{call}: the root's counts {list(rv.counts)} do not "
                                      f"match what the ranks send {sizes}")
        except Exception as exc:
            raise self._refused(call, exc)
        if m == 0:
            return self._empty_done(call)
        if r != rt:
            return self.Igather(_padded(send, m), None, rt)
        if _uniform(rv, m):                      # Igather takes the aliased block
            return self.Igather(send, rv.array[:P * m], rt)
        tmp_send = _padded(send, m)
        tmp = np.empty(P * m, rv.array.dtype)
        return _then(self.Igather(tmp_send, tmp, rt), lambda: _unpad(tmp, rv, P, m))

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        """``sendbuf`` (``[buf, counts(, displs)]``) matters at the root only; IN_PLACE as
        recvbuf at the root leaves its block where it is."""
        P, r, call = self.size, self.rank, "Scatterv"
        a = {}

        def row():
            a["root"] = rt = self._check_root(root)
            sv = None
            if r == rt:
                sv = vector(sendbuf, "sendbuf", P)
                if recvbuf is IN_PLACE:
                    recv = None
                    n = sv.counts[r]
                else:
                    recv = message(recvbuf, "recvbuf", writable=True)
                    lo = sv.displs[r]
                    if same_memory(recv, sv.array[lo:lo + sv.counts[r]]):
                        recv = None
                    else:
                        check_disjoint(sv.array, recv, call)
                        if recv.dtype != sv.array.dtype:
                            raise InvalidArgument(f"{call}: sendbuf is {sv.array.dtype}, "
                                                  f"recvbuf {recv.dtype}: they must match")
                    n = sv.counts[r] if recv is None else recv.size
            else:
                if recvbuf is IN_PLACE:
                    raise InvalidArgument(f"IN_PLACE in {call} is only valid at the root")
                recv = message(recvbuf, "recvbuf", writable=True)
                n = recv.size
            a["sv"], a["recv"] = sv, recv
            return [n]
        t = self._table(call, row)
        rt, sv, recv = a["root"], a["sv"], a["recv"]
        sizes = t[:, 0].tolist()
        m = max(sizes)
        try:
            if r == rt and list(sv.counts) != sizes:
                raise InvalidArgument(f"{call}: the root's counts {list(sv.counts)} do not "
                                      f"match what the ranks receive {sizes}")
        except Exception as exc:
            raise self._refused(call, exc)
        if m == 0:
            return self._empty_done(call)
        if r == rt:
            send = sv.array[:P * m] if _uniform(sv, m) else _pad(sv, P, m, sv.array.dtype)
            tmp = np.empty(m, sv.array.dtype)
            out = recv
            return _then(self.Iscatter(send, tmp, rt),
                         lambda: out is not None and out.__setitem__(slice(None), tmp[:out.size]))
        tmp = np.empty(m, recv.dtype)
        return _then(self.Iscatter(None, tmp, rt),
                     lambda: recv.__setitem__(slice(None), tmp[:recv.size]))

    # -- Alltoallv -------------------------------------------------------------------
    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        """``[sbuf, scounts(, sdispls)]`` and ``[rbuf, rcounts(, rdispls)]``; IN_PLACE as
        sendbuf: recvbuf's blocks are the input (its counts both ways)."""
        P, r, call = self.size, self.rank, "Alltoallv"
        a = {}

        def row():
            rv = vector(recvbuf, "recvbuf", P, writable=True)
            if sendbuf is IN_PLACE:
                sv = rv
            else:
                sv = vector(sendbuf, "sendbuf", P)
                if same_memory(sv.array, rv.array) and sv.counts == rv.counts \
                        and sv.displs == rv.displs:
                    sv = rv
                else:
                    check_disjoint(sv.array, rv.array, call)
                if sv.array.dtype != rv.array.dtype:
                    raise InvalidArgument(f"{call}: sendbuf is {sv.array.dtype}, recvbuf "
                                          f"{rv.array.dtype}: they must match")
            a["sv"], a["rv"] = sv, rv
            return list(sv.counts)
        t = self._table(call, row)                 # t[j, i]: what rank j sends to rank i
        sv, rv = a["sv"], a["rv"]
        expect = t[:, r].tolist()
        try:
            if list(rv.counts) != expect:
                raise InvalidArgument(f"{call}: rank {r} expects counts {list(rv.counts)} "
                                      f"but the ranks send it {expect}")
        except Exception as exc:
            raise self._refused(call, exc)
        m = int(t.max())
        if m == 0:
            return self._empty_done(call)
        dt = rv.array.dtype
        if sv is not rv and _uniform(sv, m) and _uniform(rv, m):
            return self.Ialltoall(sv.array[:P * m], rv.array[:P * m])
        send = _pad(sv, P, m, dt)                  # a copy: safe in place too
        tmp = np.empty(P * m, dt)
        return _then(self.Ialltoall(send, tmp), lambda: _unpad(tmp, rv, P, m))

    # -- Reduce_scatter with counts -------------------------------------------------------
    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op="sum") -> Request:
        """Rank ``i`` gets the reduction of elements ``[sum(counts[:i]), sum(counts[:i+1]))``
        of every rank's sendbuf. ``recvcounts`` None: each rank's recvbuf size. IN_PLACE:
        recvbuf holds the input and gets the result in its first ``counts[rank]``."""
        P, r, call = self.size, self.rank, "Reduce_scatter"
        a = {}

        def row():
            opx = a["op"] = _ops.get(op)
            if sendbuf is IN_PLACE:
                full = message(recvbuf, "recvbuf", writable=True)
                send, recv = full, None
            else:
                recv = message(recvbuf, "recvbuf", writable=True)
                send = message(sendbuf, "sendbuf")
                check_disjoint(send, recv, call)
                if send.dtype != recv.dtype:
                    raise InvalidArgument(f"{call}: sendbuf dtype {send.dtype} and recvbuf "
                                          f"dtype {recv.dtype} must match")
            opx.check(send.dtype, f"{call}: ")
            counts = None
            if recvcounts is not None:
                counts = vector([send, recvcounts], "recvcounts", P).counts
                if recv is not None and recv.size < counts[r]:
                    raise InvalidArgument(f"{call}: recvbuf has {recv.size} elements, "
                                          f"recvcounts[{r}] is {counts[r]}")
            elif recv is None:
                raise InvalidArgument(f"{call}: IN_PLACE needs recvcounts")
            a["send"], a["recv"], a["counts"] = send, recv, counts
            mine = counts[r] if counts is not None else recv.size
            return [_crc(counts) if counts is not None else -1, mine, send.size]
        t = self._table(call, row)
        send, recv, counts, opx = a["send"], a["recv"], a["counts"], a["op"]
        if counts is None:
            counts = tuple(t[:, 1].tolist())
        if len(set(t[:, 0].tolist())) != 1 or t[:, 1].tolist() != list(counts):
            raise InvalidArgument(f"{call}: ranks disagree on recvcounts (rank {r}: "
                                  f"{list(counts)}, the ranks' own: {t[:, 1].tolist()})")
        if set(t[:, 2].tolist()) != {sum(counts)}:
            raise InvalidArgument(f"{call}: every sendbuf needs sum(recvcounts) = "
                                  f"{sum(counts)} elements, got {t[:, 2].tolist()}")
        m = max(counts)
        if m == 0:
            return self._empty_done(call)
        out = recv if recv is not None else send[:counts[r]]
        if all(c == m for c in counts) and recv is not None:
            return self.Ireduce_scatter_block(send, recv[:m], opx)
        offs = np.cumsum((0,) + tuple(counts))
        tmp_send = np.zeros(P * m, send.dtype)
        for i in range(P):
            tmp_send[i * m:i * m + counts[i]] = send[offs[i]:offs[i + 1]]
        tmp = np.empty(m, send.dtype)
        n = counts[r]
        return _then(self.Ireduce_scatter_block(tmp_send, tmp, opx),
                     lambda: out[:n].__setitem__(slice(None), tmp[:n]))

    # -- Scan, Exscan ---------------------------------------------------------------------
    def _scan(self, sendbuf, recvbuf, op, exclusive: bool) -> Request:
        P, r = self.size, self.rank
        call = "Exscan" if exclusive else "Scan"
        try:
            opx = _ops.get(op)
            if opx.name == "avg":
                raise InvalidArgument(f"{call}: op avg is not defined for a scan (MPI has "
                                      "none); scan with sum and divide by rank + 1")
            recv = message(recvbuf, "recvbuf", writable=True)
            send = recv.copy() if sendbuf is IN_PLACE else message(sendbuf, "sendbuf")
            if sendbuf is not IN_PLACE and same_memory(send, recv):
                send = recv.copy()
            elif sendbuf is not IN_PLACE:
                check_disjoint(send, recv, call)
            if send.size != recv.size or send.dtype != recv.dtype:
                raise InvalidArgument(f"{call}: sendbuf ({send.size} x {send.dtype}) and "
                                      f"recvbuf ({recv.size} x {recv.dtype}) must match")
            opx.check(recv.dtype, f"{call}: ")
            n = send.size
            every = np.empty(P * n, send.dtype)
        except Exception as exc:
            raise self._refused(call, exc)
        # Through the engine (as _table): a rank refused above took its turn there.
        req = self._post(Collective.ALLGATHER, send, every, n)
        upto = r if exclusive else r + 1

        def fold_prefix():
            if upto == 0 or n == 0:
                return                       # Exscan: rank 0's recvbuf is left as it was
            parts = [every[i * n:(i + 1) * n] for i in range(upto)]
            if opx.fn is not None:
                fold(parts, opx, recv)
                return
            acc = parts[0].copy()
            for x in parts[1:]:
                opx.combine(acc, x, acc)
            recv[...] = acc
        return _then(req, fold_prefix)

    def Iscan(self, sendbuf, recvbuf, op="sum") -> Request:
        return self._scan(sendbuf, recvbuf, op, False)

    def Iexscan(self, sendbuf, recvbuf, op="sum") -> Request:
        return self._scan(sendbuf, recvbuf, op, True)

    # -- blocking forms -------------------------------------------------------------------
    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self.Iallgatherv(sendbuf, recvbuf).Wait()

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igatherv(sendbuf, recvbuf, root).Wait()

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatterv(sendbuf, recvbuf, root).Wait()

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self.Ialltoallv(sendbuf, recvbuf).Wait()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op="sum") -> None:
        self.Ireduce_scatter(sendbuf, recvbuf, recvcounts, op).Wait()

    def Scan(self, sendbuf, recvbuf, op="sum") -> None:
        self.Iscan(sendbuf, recvbuf, op).Wait()

    def Exscan(self, sendbuf, recvbuf, op="sum") -> None:
        self.Iexscan(sendbuf, recvbuf, op).Wait()
