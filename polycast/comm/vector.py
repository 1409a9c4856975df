"""mpi4py's vector and scan collectives: ``Gatherv, Scatterv, Allgatherv, Alltoallv``,
``Reduce_scatter`` (with ``recvcounts``), ``Scan, Exscan`` and their ``I``-forms.

>>> comm.Allgatherv(x, [out, counts])                      # displs: packed in rank order
>>> comm.Alltoallv([s, scounts], [r, rcounts])
>>> comm.Reduce_scatter(x, y, recvcounts=counts, op="sum")
>>> comm.Scan(x, y, op="sum")                              # y = x_0 + ... + x_rank

How they run. The data moves on **vector schedules**: the algorithms' own programs over
uneven blocks (polycast.schedule.vector; every one verified like the uniform ones), so each
rank sends and receives exactly its counts -- no padding to the largest. The counts are part
of the call's signature, so ranks that pass different counts get a MismatchError on every
rank instead of wrong data. ``auto`` is the planner's choice among the algorithms that have
a vector form (``polycast algos``: the ``counts`` option) -- except that on one host, once
symmetric memory is set up, ``auto`` Allgatherv and Reduce_scatter take the uniform call
padded to the largest count through symmetric memory when the planner estimates it faster
than the exact schedule on the engine (mild skew; they then agree on the counts first).

Where MPI does not give every rank every count, the call first agrees on them (a small
blocking engine Allgather of one row of integers per rank):

* ``Gatherv`` / ``Scatterv``: only the root has the counts; the others know their own;
* ``Alltoallv``: each rank knows its row (what it sends) and column (what it receives);
* ``Reduce_scatter`` without ``recvcounts`` (each rank's recvbuf size is its count).

That agreement also makes counts that disagree (a receiver expecting 3 elements from a
sender that sends 4) raise the same InvalidArgument on every rank before any data moves; a
check only the root can make refuses the data step, which fails it on every rank.
``Allgatherv``, ``Reduce_scatter`` with ``recvcounts``, ``Scan`` and ``Exscan`` need no
agreement: their ``I``-forms post and return at once.

Blocks packed in rank order (the default displacements) are read and written in the
user's arrays directly; other displacements go through a packed temporary, copied out when
the request completes (in ``Wait``/``Test``). ``Scan``/``Exscan`` run the scan schedules
(recursive doubling, or a pipelined chain for large buffers), which combine in rank order
(``incoming op local``, checked by the verifier), so any op -- a non-commutative
``Op.Create`` one too -- gives MPI's result.
"""

from __future__ import annotations

import zlib

import numpy as np

from .. import ops as _ops
from ..algorithms import algorithms, get
from ..collectives import Collective
from ..errors import InvalidArgument
from ..planner import choose
from ..runtime.driver import Request
from ..schedule.vector import total_elements as _vector_elements
from ..dispatch import choice
from ..buffers import IN_PLACE, check_disjoint, dtype_name, message, same_memory, vector


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


def _packed(v) -> np.ndarray:
    """The blocks of vector buffer ``v`` end to end in rank order: the user's array
    itself when they already are, else a packed copy."""
    n = sum(v.counts)
    if v.packed:
        return v.array[:n]
    out = np.empty(n, v.array.dtype)
    pos = 0
    for c, d in zip(v.counts, v.displs):
        out[pos:pos + c] = v.array[d:d + c]
        pos += c
    return out


def _landing(v) -> tuple[np.ndarray, object]:
    """Where a vector output ``v`` is received: (packed array, what to run once the request
    completes -- None when the array is the user's own)."""
    n = sum(v.counts)
    if v.packed:
        return v.array[:n], None
    tmp = np.empty(n, v.array.dtype)

    def unpack():
        pos = 0
        for c, d in zip(v.counts, v.displs):
            if c:
                v.array[d:d + c] = tmp[pos:pos + c]
            pos += c
    return tmp, unpack


def _padded(send: np.ndarray, m: int) -> np.ndarray:
    """``send`` in a zeroed block of ``m`` elements: the uniform schedule's block size."""
    out = np.zeros(m, send.dtype)
    out[:send.size] = send
    return out


def _unpad(tmp: np.ndarray, v, m: int) -> None:
    """Rank i's block of uniform ``tmp`` (blocks ``m`` apart) into vector buffer ``v``."""
    for i, (c, d) in enumerate(zip(v.counts, v.displs)):
        if c:
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

    # -- posting a vector schedule ------------------------------------------------------
    def _vector_algorithm(self, coll: Collective, nbytes: int, algorithm: str | None
                          ) -> tuple[str, int]:
        """(algorithm, nchunks) of a vector call of ``nbytes`` (S): the one asked for, which
        must have a vector form, or the planner's choice among those that have one."""
        name = (algorithm or self.config.algorithm(coll) or "auto").lower()
        if name != "auto":
            if "counts" not in get(coll, name).options:
                raise InvalidArgument(
                    f"{coll} algorithm {name!r} has no vector form; those that have one: "
                    f"{', '.join(a.name for a in algorithms(coll) if 'counts' in a.options)}")
            return name, choice.pipeline_nchunks(self, coll, name, nbytes)
        return self._vector_plan(coll, nbytes)[:2]

    def _vector_plan(self, coll: Collective, nbytes: int) -> tuple[str, int, float]:
        """The planner's (algorithm, nchunks, estimated seconds) among the algorithms with
        a vector form, per power-of-two size class (as choice.plan: every rank the same)."""
        cache = self._dispatch.plans.vector
        k = nbytes.bit_length()
        key = (coll, k, self.mcast_error is None)
        hit = cache.get(key)
        if hit is None:
            only = tuple(a.name for a in algorithms(coll) if "counts" in a.options)
            rep = 0 if nbytes == 0 else (3 << (k - 2) if k >= 2 else nbytes)
            c = choose(coll, rep, choice.shape(self), choice.fabric(self, False), only=only)
            hit = cache[key] = (c.algorithm, c.nchunks, c.estimate_seconds)
        return hit

    def _padded_symm_wins(self, coll: Collective, counts, dtype) -> bool:
        """Under ``auto`` on one host: whether the uniform call padded to the largest count
        through symmetric memory beats the exact vector schedule on the engine, by the
        planner's estimates (mild skew, as FSDP's shards: usually; a 1000x skew: not).
        Only once an earlier call has set symmetric memory up: asking must not be a
        collective step, since a rank whose arguments failed is not here to take it. The
        padded path then agrees on the counts first through the engine, where such a
        rank's refusal is seen (the symmetric-memory path does not see it)."""
        if (self.config.algorithm(coll) or "auto") != "auto" \
                or self._dispatch.symm is None:
            return False
        P, it = self.size, np.dtype(dtype).itemsize
        padded = P * max(counts) * it
        if not padded or not self.takes_symm(coll, dtype, nbytes=padded):
            return False
        symm = choice.plan(self, coll, padded, symm=True)
        return symm.algorithm == "symm" and \
            symm.estimate_seconds < self._vector_plan(coll, sum(counts) * it)[2]

    def _post_v(self, coll: Collective, send, recv, counts, root: int = 0, op=None,
                algorithm: str | None = None, after=None) -> Request:
        """Post the vector schedule of ``coll`` for ``counts`` (polycast.schedule.vector)
        with this rank's packed ``send``/``recv`` (None where it has none)."""
        if self._freed:
            raise InvalidArgument(f"{self!r} was freed")
        P = self.size
        opname = _ops.get(op if op is not None else "sum").name if coll.has_op else ""
        dt = (send if send is not None else recv).dtype
        nbytes = _vector_elements(coll, P, counts) * dt.itemsize
        algo, nchunks = self._vector_algorithm(coll, nbytes, algorithm)
        d = self._dispatch
        sched = d.schedule(coll, algo, 0, root, nchunks, counts)
        return d.post_built(sched, send, recv, dt.itemsize, dtype_name(dt), opname, after)

    # -- Allgatherv --------------------------------------------------------------------
    def Iallgatherv(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        """``recvbuf`` is ``[buf, counts]`` or ``[buf, counts, displs]`` (mpi4py's
        forms) on every rank; ``sendbuf`` has ``counts[rank]`` elements, or is
        IN_PLACE (this rank's block of recvbuf is its input). Every rank has the counts:
        no agreement, the vector schedule is posted at once (but see the module docstring
        for ``auto`` on one host)."""
        P, r, call = self.size, self.rank, "Allgatherv"
        try:
            rv = vector(recvbuf, "recvbuf", P, writable=True)
            send = _own_block(sendbuf, rv, r, call)
            if send.size != rv.counts[r]:
                raise InvalidArgument(f"{call}: sendbuf has {send.size} elements, but "
                                      f"counts[{r}] is {rv.counts[r]}")
            if max(rv.counts) == 0:
                return self._empty_done(call)
            symm = algorithm is None and self._padded_symm_wins(
                Collective.ALLGATHER, rv.counts, rv.array.dtype)
            if not symm:
                recv, after = _landing(rv)
                if after is not None and send.size and np.may_share_memory(send, rv.array):
                    send = send.copy()          # IN_PLACE in a buffer with gaps
                return self._post_v(Collective.ALLGATHER, send, recv, tuple(rv.counts),
                                    algorithm=algorithm, after=after)
        except Exception as exc:
            raise self._refused(call, exc)
        t = self._table(call, lambda: [_crc(rv.counts)])
        if len(set(t[:, 0].tolist())) != 1:
            raise InvalidArgument(f"{call}: ranks passed different counts (rank {r}: "
                                  f"{list(rv.counts)}); every rank must pass the same")
        m = max(rv.counts)
        tmp = np.empty(P * m, rv.array.dtype)
        return _then(self.Iallgather(_padded(send, m), tmp), lambda: _unpad(tmp, rv, m))

    # -- Gatherv, Scatterv ----------------------------------------------------------------
    def Igatherv(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                 ) -> Request:
        """``recvbuf`` (``[buf, counts(, displs)]``) matters at the root only; IN_PLACE as
        sendbuf at the root keeps its block where it is. Only the root has the counts:
        they are agreed first (see the module docstring)."""
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
        sizes = tuple(t[:, 0].tolist())
        if len(set(t[:, 1].tolist())) != 1:
            raise InvalidArgument(f"{call}: ranks send elements of different sizes "
                                  f"(itemsize per rank: {t[:, 1].tolist()})")
        try:
            if r == rt and tuple(rv.counts) != sizes:
                raise InvalidArgument(f"{call}: the root's counts {list(rv.counts)} do not "
                                      f"match what the ranks send {list(sizes)}")
            if max(sizes) == 0:
                return self._empty_done(call)
            if r != rt:
                return self._post_v(Collective.GATHER, send, None, sizes, rt,
                                    algorithm=algorithm)
            recv, after = _landing(rv)
            if after is not None and send.size and np.may_share_memory(send, rv.array):
                send = send.copy()
            return self._post_v(Collective.GATHER, send, recv, sizes, rt,
                                algorithm=algorithm, after=after)
        except Exception as exc:
            raise self._refused(call, exc)

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                  ) -> Request:
        """``sendbuf`` (``[buf, counts(, displs)]``) matters at the root only; IN_PLACE as
        recvbuf at the root leaves its block where it is. Only the root has the counts:
        they are agreed first."""
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
        sizes = tuple(t[:, 0].tolist())
        try:
            if r == rt and tuple(sv.counts) != sizes:
                raise InvalidArgument(f"{call}: the root's counts {list(sv.counts)} do not "
                                      f"match what the ranks receive {list(sizes)}")
            if max(sizes) == 0:
                return self._empty_done(call)
            if r != rt:
                return self._post_v(Collective.SCATTER, None, recv, sizes, rt,
                                    algorithm=algorithm)
            if recv is None:                # IN_PLACE: its own block stays where it is
                recv = np.empty(sizes[r], sv.array.dtype)
            return self._post_v(Collective.SCATTER, _packed(sv), recv, sizes, rt,
                                algorithm=algorithm)
        except Exception as exc:
            raise self._refused(call, exc)

    # -- Alltoallv -------------------------------------------------------------------
    def Ialltoallv(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        """``[sbuf, scounts(, sdispls)]`` and ``[rbuf, rcounts(, rdispls)]``; IN_PLACE as
        sendbuf: recvbuf's blocks are the input (its counts both ways). Each rank knows
        only its own row and column of the counts: they are agreed first."""
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
            if int(t.max()) == 0:
                return self._empty_done(call)
            counts = tuple(tuple(row) for row in t.tolist())
            send = _packed(sv)
            if sv is rv and rv.packed:
                send = send.copy()              # in place: the input is read as it lands
            recv, after = _landing(rv)
            return self._post_v(Collective.ALLTOALL, send, recv, counts,
                                algorithm=algorithm, after=after)
        except Exception as exc:
            raise self._refused(call, exc)

    # -- Reduce_scatter with counts -------------------------------------------------------
    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op="sum", *,
                        algorithm: str | None = None) -> Request:
        """Rank ``i`` gets the reduction of elements ``[sum(counts[:i]), sum(counts[:i+1]))``
        of every rank's sendbuf. ``recvcounts`` None: each rank's recvbuf size (agreed
        first). IN_PLACE: recvbuf holds the input and gets the result in its first
        ``counts[rank]``. A non-commutative op runs on the uniform schedule in rank order
        (padded to the largest count)."""
        P, r, call = self.size, self.rank, "Reduce_scatter"
        a = {}

        def checked():
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
                if send.size != sum(counts):
                    raise InvalidArgument(f"{call}: sendbuf needs sum(recvcounts) = "
                                          f"{sum(counts)} elements, got {send.size}")
            elif recv is None:
                raise InvalidArgument(f"{call}: IN_PLACE needs recvcounts")
            a["send"], a["recv"], a["counts"] = send, recv, counts
            mine = counts[r] if counts is not None else recv.size
            return [_crc(counts) if counts is not None else -1, mine, send.size]

        def exact(counts) -> bool:
            """The vector schedule (else: the uniform one, padded; for non-commutative
            ops, whose ordered path it has, or when symmetric memory wins under auto)."""
            opx = a["op"]
            return opx.commute and not (algorithm is None and opx.builtin and
                                        self._padded_symm_wins(Collective.REDUCE_SCATTER,
                                                               counts, a["send"].dtype))

        def post(counts):
            send, recv, opx = a["send"], a["recv"], a["op"]
            n = counts[r]
            if recv is None:                # IN_PLACE: the input is read meanwhile
                out, send = send[:n], send.copy()
            else:
                out = recv[:n]
            return self._post_v(Collective.REDUCE_SCATTER, send, out, counts,
                                op=opx.name, algorithm=algorithm)

        if recvcounts is not None:          # every rank has the counts: no agreement
            try:
                checked()
                counts = tuple(a["counts"])
                if max(counts) == 0:
                    return self._empty_done(call)
                if exact(counts):
                    return post(counts)
            except Exception as exc:
                raise self._refused(call, exc)
        t = self._table(call, checked)
        send, recv, counts, opx = a["send"], a["recv"], a["counts"], a["op"]
        if counts is None:
            counts = tuple(t[:, 1].tolist())
        counts = tuple(counts)
        if len(set(t[:, 0].tolist())) != 1 or t[:, 1].tolist() != list(counts):
            raise InvalidArgument(f"{call}: ranks disagree on recvcounts (rank {r}: "
                                  f"{list(counts)}, the ranks' own: {t[:, 1].tolist()})")
        if set(t[:, 2].tolist()) != {sum(counts)}:
            raise InvalidArgument(f"{call}: every sendbuf needs sum(recvcounts) = "
                                  f"{sum(counts)} elements, got {t[:, 2].tolist()}")
        m = max(counts)
        if m == 0:
            return self._empty_done(call)
        if recvcounts is None and exact(counts):
            try:
                return post(counts)
            except Exception as exc:
                raise self._refused(call, exc)
        out = recv if recv is not None else send[:counts[r]]
        n = counts[r]
        offs = np.cumsum((0,) + counts)
        tmp_send = np.zeros(P * m, send.dtype)
        for i in range(P):
            tmp_send[i * m:i * m + counts[i]] = send[offs[i]:offs[i + 1]]
        tmp = np.empty(m, send.dtype)
        return _then(self.Ireduce_scatter_block(tmp_send, tmp, opx),
                     lambda: out[:n].__setitem__(slice(None), tmp[:n]))

    # -- Scan, Exscan ---------------------------------------------------------------------
    def _scan(self, sendbuf, recvbuf, op, exclusive: bool, algorithm: str | None) -> Request:
        coll = Collective.EXSCAN if exclusive else Collective.SCAN
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
            # The scan schedules combine in rank order (incoming op local, verified), so
            # any op runs on them, non-commutative user ops too (polycast.algorithms.scan).
            return self._post(coll, send, recv, send.size, 0, opx.name, algorithm)
        except Exception as exc:
            raise self._refused(call, exc)

    def Iscan(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None) -> Request:
        return self._scan(sendbuf, recvbuf, op, False, algorithm)

    def Iexscan(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None
                ) -> Request:
        return self._scan(sendbuf, recvbuf, op, True, algorithm)

    # -- blocking forms -------------------------------------------------------------------
    def Allgatherv(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> None:
        self.Iallgatherv(sendbuf, recvbuf, algorithm=algorithm).Wait()

    def Gatherv(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                ) -> None:
        self.Igatherv(sendbuf, recvbuf, root, algorithm=algorithm).Wait()

    def Scatterv(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                 ) -> None:
        self.Iscatterv(sendbuf, recvbuf, root, algorithm=algorithm).Wait()

    def Alltoallv(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> None:
        self.Ialltoallv(sendbuf, recvbuf, algorithm=algorithm).Wait()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op="sum", *,
                       algorithm: str | None = None) -> None:
        self.Ireduce_scatter(sendbuf, recvbuf, recvcounts, op, algorithm=algorithm).Wait()

    def Scan(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None) -> None:
        self.Iscan(sendbuf, recvbuf, op, algorithm=algorithm).Wait()

    def Exscan(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None) -> None:
        self.Iexscan(sendbuf, recvbuf, op, algorithm=algorithm).Wait()
