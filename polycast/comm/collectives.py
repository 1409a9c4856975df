"""mpi4py's buffer collectives. Each method hands one call description -- the collective's
:class:`~polycast.dispatch.Form`, its buffers, op or root, algorithm, blocking or not -- to
the communicator's dispatch (:mod:`polycast.dispatch.call`), which runs it on the path that
takes it: a kept compiled call, symmetric memory on one host, or an engine schedule. The
``I``-forms return a :class:`Request`; the blocking forms return once the call is done.

A collective's Form says how it takes each path: how its arguments are checked (buffers and
specs: :mod:`polycast.buffers`; ops: :mod:`polycast.ops`) and how it is posted. Every
argument is checked before anything moves. A check that fails on one rank fails the call on
every rank: this rank raises InvalidArgument and still takes the call's turn
(:meth:`CommCore._refused`), so the others raise InvalidArgument naming it and every rank's
next call matches. Aliased arguments (``Allreduce(x, x)``, ``Alltoall(y, y)``, an Allgather
sendbuf that is the rank's own block of recvbuf) are taken as ``IN_PLACE``, as MPI-4's
bindings do for identical buffers; buffers that only partly overlap are refused.
"""

from __future__ import annotations

import numpy as np

from .. import ops as _ops
from ..buffers import IN_PLACE, check_disjoint, message, same_memory
from ..collectives import Collective
from ..dispatch import Form, methods
from ..errors import InvalidArgument
from ..runtime import symm as _symm
from ..runtime.symm.barrier import K_ALLGATHER, K_ALLREDUCE, K_BCAST, K_REDUCE_SCATTER


def _in_place(send, recv, call: str) -> bool:
    """Whether ``send`` is ``recv`` itself (taken as IN_PLACE); partly overlapping
    buffers are an error."""
    if same_memory(send, recv):
        return True
    check_disjoint(send, recv, call)
    return False


def _root_ok(root, size: int) -> bool:
    return isinstance(root, (int, np.integer)) and 0 <= root < size


def _op(comm, send, recv, op):
    opx = _ops.get(op)
    return send, opx, opx.builtin          # (user ops take the engine)


def _unrouted(comm, send, recv, opr):
    return send, opr, False


# -- broadcast ---------------------------------------------------------------------------
def _bcast_prepare(comm, send, recv, root):
    return send, root, _root_ok(root, comm.size)


def _bcast_check(comm, send, buf, root):
    root = comm._check_root(root)
    return message(buf, "buf", writable=comm.rank != root), root


def _bcast_engine(comm, args, algorithm):
    b, root = args
    return comm._post(Collective.BROADCAST, b if comm.rank == root else None, b, b.size, root,
                      algorithm=algorithm)


BCAST = Form(Collective.BROADCAST, "Bcast", _bcast_prepare, _bcast_check, _bcast_engine,
             staged=lambda st, a, blocking: _symm.staged_bcast(st, a[0], a[1], blocking),
             fast=K_BCAST, keeps=True, key_type=int, keeps_send=False)


# -- reduce ------------------------------------------------------------------------------
def _reduce_check(comm, sendbuf, recvbuf, op_root):
    opx, root = op_root                 # (prepare checked them)
    recv = None
    if comm.rank == root:
        recv = message(recvbuf, "recvbuf", writable=True)
    if sendbuf is IN_PLACE:
        if comm.rank != root:
            raise InvalidArgument("IN_PLACE in Reduce is only valid at the root")
        send = recv.copy()
    else:
        send = message(sendbuf, "sendbuf")
        if recv is not None and _in_place(send, recv, "Reduce"):
            send = recv.copy()
    if not opx.commute:
        opx.check(send.dtype, "Reduce: ")
    return send, recv, opx, root


def _reduce_engine(comm, args, algorithm):
    send, recv, opx, root = args
    if opx.commute:
        return comm._post(Collective.REDUCE, send, recv, send.size, root, opx.name, algorithm)
    return lambda: comm._ordered_reduce(send, recv, opx, root)     # its own calls refuse


def _reduce_prepare(comm, send, recv, op_root):
    op, root = op_root
    root = comm._check_root(root)
    return send, (_ops.get(op), root), False


REDUCE = Form(Collective.REDUCE, "Reduce", _reduce_prepare, _reduce_check, _reduce_engine)


# -- allreduce ---------------------------------------------------------------------------
def _allreduce_check(comm, sendbuf, recvbuf, opx):
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
    return recv, send, in_place, opx


def _allreduce_engine(comm, args, algorithm):
    recv, send, in_place, opx = args
    if in_place:        # the input is copied first, so every algorithm is safe to use
        send = recv.copy()
    if opx.commute:
        return comm._post(Collective.ALLREDUCE, send, recv, recv.size, 0, opx.name, algorithm)
    return lambda: comm._ordered_allreduce(send, recv, opx)


ALLREDUCE = Form(
    Collective.ALLREDUCE, "Allreduce", _op, _allreduce_check, _allreduce_engine,
    symm=lambda d, s, r, opx, in_place, blocking: _symm.allreduce(
        d.comm, d.symm, s, r, opx.name, in_place, blocking),
    staged=lambda st, a, blocking: _symm.staged_allreduce(st, a[1], a[0], a[3].name, a[2],
                                                         blocking),
    fast=K_ALLREDUCE, keeps=True, key_type=str)


# -- allgather ---------------------------------------------------------------------------
def _allgather_prepare(comm, sendbuf, recvbuf, opr):
    if sendbuf is None:
        sendbuf = IN_PLACE                  # mpi4py 4: None is IN_PLACE here
    return sendbuf, None, True


def _allgather_check(comm, sendbuf, recvbuf, _):
    """(recv, send, in place): send is this rank's block of recv when in place."""
    P, r = comm.size, comm.rank
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


def _allgather_engine(comm, args, algorithm):
    recv, send, in_place = args
    if in_place:
        send = send.copy()
    return comm._post(Collective.ALLGATHER, send, recv, send.size, 0, algorithm=algorithm)


ALLGATHER = Form(
    Collective.ALLGATHER, "Allgather", _allgather_prepare, _allgather_check,
    _allgather_engine,
    symm=lambda d, s, r, _, in_place, blocking: _symm.allgather(d.comm, d.symm, s, r,
                                                                in_place, blocking),
    staged=lambda st, a, blocking: _symm.staged_allgather(st, a[1], a[0], a[2], blocking),
    fast=K_ALLGATHER, keeps=True)


# -- reduce-scatter ----------------------------------------------------------------------
def _reduce_scatter_check(comm, sendbuf, recvbuf, opx):
    """(recv, send, in place, op): recv the first block of recvbuf when in place (its P
    blocks are the input)."""
    P = comm.size
    in_place = sendbuf is IN_PLACE
    if in_place:
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
    return recv, send, in_place, opx


def _reduce_scatter_engine(comm, args, algorithm):
    recv, send, in_place, opx = args
    if in_place:
        send = send.copy()
    if opx.commute:
        return comm._post(Collective.REDUCE_SCATTER, send, recv, recv.size, 0, opx.name,
                          algorithm)
    return lambda: comm._ordered_reduce_scatter(send, recv, opx)


def _reduce_scatter_staged(st, args, blocking):
    recv, send, in_place, opx = args
    return _symm.staged_reduce_scatter(st, None if in_place else send,
                                       send if in_place else recv, opx.name, in_place,
                                       blocking)


REDUCE_SCATTER = Form(
    Collective.REDUCE_SCATTER, "Reduce_scatter_block", _op, _reduce_scatter_check,
    _reduce_scatter_engine,
    symm=lambda d, s, r, opx, in_place, blocking: _symm.reduce_scatter(
        d.comm, d.symm, s, r, opx.name, in_place, blocking),
    staged=_reduce_scatter_staged, fast=K_REDUCE_SCATTER, keeps=True, key_type=str)


# -- scatter, gather, alltoall, barrier ----------------------------------------------------
def _scatter_check(comm, sendbuf, recvbuf, root):
    root = comm._check_root(root)
    P = comm.size
    send = None
    if comm.rank == root:
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
    return send, recv, recv.size, root


def _gather_check(comm, sendbuf, recvbuf, root):
    root = comm._check_root(root)
    P = comm.size
    recv = None
    if comm.rank == root:
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
    return send, recv, send.size, root


def _alltoall_check(comm, sendbuf, recvbuf, _):
    P = comm.size
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
    return send, recv, send.size // P, 0


def _posted(coll: Collective):
    def engine(comm, args, algorithm):
        send, recv, count, root = args
        return comm._post(coll, send, recv, count, root, algorithm=algorithm)
    return engine


SCATTER = Form(Collective.SCATTER, "Scatter", _unrouted, _scatter_check,
               _posted(Collective.SCATTER))
GATHER = Form(Collective.GATHER, "Gather", _unrouted, _gather_check,
              _posted(Collective.GATHER))
ALLTOALL = Form(Collective.ALLTOALL, "Alltoall", _unrouted, _alltoall_check,
                _posted(Collective.ALLTOALL))
BARRIER = Form(Collective.BARRIER, "Barrier", _unrouted,
               lambda comm, s, r, opr: (None, None, 0, 0), _posted(Collective.BARRIER),
               keeps=True)


class BufferCollectives:
    """Mixed into :class:`polycast.Comm`: each method is made from its collective's Form
    (:func:`polycast.dispatch.call.methods`): one call handed to ``self._dispatch``."""

    Bcast, Ibcast = methods(BCAST, "buf, root: int = 0", "buf, buf, root")
    Reduce, Ireduce = methods(REDUCE, "sendbuf, recvbuf, op='sum', root: int = 0",
                              "sendbuf, recvbuf, (op, root)")
    Allreduce, Iallreduce = methods(ALLREDUCE, "sendbuf, recvbuf, op='sum'",
                                    "sendbuf, recvbuf, op")
    Allgather, Iallgather = methods(ALLGATHER, "sendbuf, recvbuf", "sendbuf, recvbuf, None")
    Reduce_scatter_block, Ireduce_scatter_block = methods(
        REDUCE_SCATTER, "sendbuf, recvbuf, op='sum'", "sendbuf, recvbuf, op")
    Scatter, Iscatter = methods(SCATTER, "sendbuf, recvbuf, root: int = 0",
                                "sendbuf, recvbuf, root")
    Gather, Igather = methods(GATHER, "sendbuf, recvbuf, root: int = 0",
                              "sendbuf, recvbuf, root")
    Alltoall, Ialltoall = methods(ALLTOALL, "sendbuf, recvbuf", "sendbuf, recvbuf, None")
    Barrier, Ibarrier = methods(BARRIER, "", "None, None, None")
