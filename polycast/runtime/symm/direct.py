"""The collectives on the user's symmetric arrays (``comm.symm_empty``): ``algorithm="symm"``,
or ``auto`` when the buffers peers read are symmetric. They *pull*: allgather copies
block p straight out of peer p's mapped buffer; reduce-scatter reduces block r of every
peer's buffer into its result (in-place ufuncs reading the peer's memory); at step i rank
r reads peer (r + i) mod P, so no source is contended. Allreduce is reduce-scatter into the
owner's block of a symmetric ``recvbuf``, then allgather of those blocks (each block is
reduced once, so every rank holds the same bits); up to ONE_SHOT_MAX_NBYTES it is one-shot
(every rank reduces the whole buffer, in rank order). Barriers come before reading (inputs
ready) and after (nobody still reads a buffer its owner may now overwrite)."""

from __future__ import annotations

import numpy as np

from ...collectives import ReduceOp
from ...errors import InvalidArgument
from ...memory import apply_avg
from .barrier import call_sig
from .common import (UFUNCS, _allreduce_args, _blocks, _describe, _flat, _post,
                     _reduce_scatter_args, _require, _telling_peers, fold_in_rank_order)
from .shared import ONE_SHOT_MAX_NBYTES


def allgather(comm, st, sendbuf, recvbuf, in_place: bool, blocking: bool = True,
              before=None):
    """Rank r's block p of ``recvbuf`` = peer p's ``sendbuf`` (or, in place, peer p's block
    p of its symmetric ``recvbuf``). ``before``: run first in the job (the staged path's
    copy in)."""
    P, r = comm.size, comm.rank
    with _telling_peers(st, "allgather"):
        recv = _flat(recvbuf, "recvbuf")
        if recv.size % P:
            raise InvalidArgument(f"Allgather recvbuf of {recv.size} elements is not a "
                                  f"multiple of the {P} ranks")
        n = recv.size // P
        src = recv[r * n:(r + 1) * n] if in_place else _flat(sendbuf, "sendbuf")
        plain = None
        if (not in_place and st is not None and st.find(src) is None
                and st.find(recv) is not None and src.size == n and src.dtype == recv.dtype):
            # A plain sendbuf, a symmetric recvbuf: our block goes in first (in the job:
            # a job queued before this one may still be read from it), then in place.
            plain, src, in_place = src, recv[r * n:(r + 1) * n], True
        if src.size != n:
            raise InvalidArgument(f"Allgather: sendbuf has {src.size} elements, recvbuf "
                                  f"needs {P} x {src.size} = {P * src.size}, got {recv.size}")
        if src.dtype != recv.dtype:
            raise InvalidArgument(f"Allgather: sendbuf is {src.dtype}, recvbuf {recv.dtype}: "
                                  "they must match")
        # In place, the whole recvbuf is symmetric and peer p's block p is read from it.
        st, (seg, off) = _require(comm, st, "allgather", recv if in_place else src,
                                  "recvbuf (IN_PLACE)" if in_place else "sendbuf")
    what = _describe("allgather", n, recv.dtype)
    step = n * recv.dtype.itemsize if in_place else 0
    sig = call_sig("allgather", n, recv.dtype.str, seg.index, off, in_place)

    def job():
        if before is not None:
            before()
        if plain is not None:
            recv[r * n:(r + 1) * n] = plain
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        if not in_place:
            recv[r * n:(r + 1) * n] = src
        for i in range(1, P):
            p = (r + i) % P
            recv[p * n:(p + 1) * n] = seg.view(p, off + p * step, n, recv.dtype)
        st.bar.barrier(0, what)
    return _post(comm, st, "allgather", job, blocking)


def reduce_scatter(comm, st, sendbuf, recvbuf, op, in_place: bool,
                   blocking: bool = True, before=None):
    """Rank r's ``recvbuf`` = op over every peer's block r of its symmetric ``sendbuf``
    (in place: of its symmetric ``recvbuf``, the result landing in its first block).
    ``before``: run first in the job (the staged path's copy in)."""
    P, r = comm.size, comm.rank
    with _telling_peers(st, "reduce_scatter"):
        recv, src, n, ropt = _reduce_scatter_args(sendbuf, recvbuf, op, in_place, P)
        st, (seg, off) = _require(comm, st, "reduce_scatter", src,
                                  "recvbuf (IN_PLACE)" if in_place else "sendbuf")
    dt = recv.dtype
    ufunc = UFUNCS[ropt]
    what = _describe("reduce_scatter", n, dt, ropt.value)
    mine = off + r * n * dt.itemsize
    sig = call_sig("reduce_scatter", n, dt.str, ropt.value, seg.index, off, in_place)

    def job():
        if before is not None:
            before()
        # In place, peers read our block 0 until the closing barrier: reduce aside first.
        acc = np.empty(n, dt) if in_place else recv
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        # The first step reads our block and the next peer's at once (no copy pass).
        first = seg.view(r, mine, n, dt)
        if P == 1:
            np.copyto(acc, first)
        for i in range(1, P):
            ufunc(first if i == 1 else acc, seg.view((r + i) % P, mine, n, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.bar.barrier(0, what)
        if in_place:
            recv[:n] = acc
    return _post(comm, st, "reduce_scatter", job, blocking)


def allreduce(comm, st, sendbuf, recvbuf, op, in_place: bool, blocking: bool = True):
    """Reduce-scatter into the owner's block of the symmetric ``recvbuf``, then allgather
    the blocks from their owners (one-shot up to ONE_SHOT_MAX_NBYTES). A non-symmetric
    ``sendbuf`` is first copied into ``recvbuf`` (then it runs in place)."""
    P, r = comm.size, comm.rank
    with _telling_peers(st, "allreduce"):
        recv, src, ropt = _allreduce_args(sendbuf, recvbuf, op, in_place)
        rloc = st.find(recv) if st is not None else None
        sloc = rloc if in_place else (st.find(src) if st is not None else None)
        plain = None
        if not in_place and rloc is not None and sloc is None:
            # A plain sendbuf: one local copy into the symmetric recvbuf (in the job, when
            # the calls before it ended with their barrier), then in place.
            plain, src, in_place, sloc = src, recv, True, rloc
        st, (sseg, soff) = _require(comm, st, "allreduce", src,
                                    "recvbuf (IN_PLACE)" if in_place else "sendbuf", sloc)
        if rloc is None:
            raise InvalidArgument("algorithm='symm' for allreduce needs recvbuf to be (part "
                                  "of) an array from comm.symm_empty() too: peers read the "
                                  "reduced blocks from it; got an ordinary array")
    rseg, roff = rloc
    dt, isz, count = recv.dtype, recv.dtype.itemsize, recv.size
    ufunc = UFUNCS[ropt]
    what = _describe("allreduce", count, dt, ropt.value)
    sig = call_sig("allreduce", count, dt.str, ropt.value, sseg.index, soff, rseg.index, roff,
                   in_place)

    def job():
        if plain is not None:
            recv[...] = plain
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        if P == 1:
            recv[...] = src
            st.bar.barrier(0, what)
            return
        if recv.nbytes <= ONE_SHOT_MAX_NBYTES:
            # Small: every rank reduces the whole buffer from every peer (one barrier less;
            # rank order, so every rank gets the reference's bits), aside first since
            # peers still read our buffer.
            acc = np.empty(count, dt)
            fold_in_rank_order(ufunc, [sseg.view(p, soff, count, dt) for p in range(P)], acc,
                               ropt, P)
            st.bar.barrier(0, what)
            recv[...] = acc
            return
        blocks = _blocks(count, P)
        a, b = blocks[r]
        acc = recv[a:b]       # our block of recv: only we read it in this phase
        first = src[a:b]      # the first step reads ours and the next peer's (no copy)
        for i in range(1, P):
            ufunc(first if i == 1 else acc,
                  sseg.view((r + i) % P, soff + a * isz, b - a, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.bar.barrier(0, what)
        for i in range(1, P):
            p = (r + i) % P
            a, b = blocks[p]
            recv[a:b] = rseg.view(p, roff + a * isz, b - a, dt)
        st.bar.barrier(0, what)
    return _post(comm, st, "allreduce", job, blocking)
