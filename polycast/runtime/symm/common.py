"""What the symm collectives share: argument checks (raised on every rank: a rank with bad
arguments still joins the opening barrier as "cannot take part"), block bounds, the
reduction ufuncs and the completed request an ``I``-variant returns."""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from ...collectives import ReduceOp
from ...errors import InvalidArgument, PolycastError
from ...memory import apply_avg
from ..driver import Request
from .barrier import BAD_SIG

UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
          ReduceOp.MAX: np.maximum, ReduceOp.AVG: np.add}


def _blocks(n: int, P: int) -> list[tuple[int, int]]:
    return [(i * n // P, (i + 1) * n // P) for i in range(P)]


def fold_in_rank_order(ufunc, blocks, out: np.ndarray, ropt: ReduceOp, P: int) -> None:
    """out = blocks[0] op blocks[1] op ... op blocks[P-1], combined in rank order so every rank
    computes the same bits; AVG then divides by P."""
    ufunc(blocks[0], blocks[1], out=out)
    for p in range(2, P):
        ufunc(out, blocks[p], out=out)
    if ropt is ReduceOp.AVG:
        apply_avg(out, P)


def _flat(buf, what: str) -> np.ndarray:
    if not isinstance(buf, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    return buf if buf.ndim == 1 else buf.reshape(-1)


def _require(comm, st, coll: str, src, what: str, loc=None):
    """The state and (segment, offset) of ``src``; a clear InvalidArgument otherwise
    (``st``: the communicator's symmetric state, or None)."""
    if st is None:
        raise InvalidArgument(f"algorithm='symm' for {coll} needs {what} allocated with "
                              "comm.symm_empty(shape, dtype) on every rank; this "
                              "communicator has no symmetric allocation")
    if st.usable_reason:
        raise InvalidArgument(f"algorithm='symm' for {coll}: {st.usable_reason}")
    if comm._freed:
        raise InvalidArgument(f"{comm!r} was freed")
    loc = loc or st.find(src)
    if loc is None:
        raise InvalidArgument(f"algorithm='symm' for {coll} needs {what} to be (a "
                              "contiguous part of) an array from comm.symm_empty(), at the "
                              "same offset on every rank; got an ordinary array")
    return st, loc


def _tell_peers(st, coll: str) -> None:
    """A local argument error still takes part in the opening barrier (with BAD_SIG), so
    peers that called correctly raise MismatchError at once instead of waiting for the
    timeout (and every rank's epoch stays in step). Call it (``st``: the communicator's
    symmetric state, or None), then raise the error."""
    if st is not None and st.bar.ctrl is not None and not st.bar.broken \
            and not st.comm._freed:
        try:
            st.queue.run_now(lambda: st.bar.barrier(BAD_SIG, f"symm {coll}"))
        except PolycastError:
            pass


@contextlib.contextmanager
def _telling_peers(st, coll: str):
    """:func:`_tell_peers` around a block that checks arguments (a plain ``try`` is
    cheaper on the per-call path: the staged collectives use that)."""
    try:
        yield
    except InvalidArgument:
        _tell_peers(st, coll)
        raise


def _post(comm, st, coll: str, job, blocking: bool, small: bool = False) -> Request:
    """Run a collective's ``job`` in posting order (:mod:`.queue`): on this thread when the
    call blocks, else on the communicator's worker (``small``: a slotted job, which need not
    wake it: see the queue); returns the request."""
    if blocking:
        st.queue.run_now(job)
        return st.done.get(coll) or _done_request(st, coll)
    req = Request(0, comm.id, lambda: f"rank {comm.rank}: symm {coll}", comm.timeout_seconds)
    return st.queue.submit(job, req, small=small)


def _done_request(st, coll: str):
    """The request a blocking call returns: already complete (one per communicator and
    collective, made once: a fresh one cost 4 of a small call's ~30 us)."""
    comm = st.comm
    req = st.done.get(coll)
    if req is None:
        req = st.done[coll] = Request(0, comm.id, f"rank {comm.rank}: symm {coll} "
                                                  "(complete on return)", comm.timeout_seconds)
        req._finish()
    return req


@functools.lru_cache(maxsize=64)
def _describe(coll: str, count: int, dtype: np.dtype, op: str = "") -> str:
    # Only for messages; cached because str(dtype) is slow Python code in numpy.
    return f"symm {coll} of {count} x {dtype}" + (f" ({op})" if op else "")


_OPS = {o.value: o for o in ReduceOp}


def _op(op) -> ReduceOp:
    got = _OPS.get(op) if isinstance(op, str) else None
    return got or ReduceOp.parse(op if op is not None else "sum")



def _reduce_scatter_args(sendbuf, recvbuf, op, in_place: bool, P: int):
    """(recv, src, n, op) of a Reduce_scatter_block, n the block size, checked alike on
    both paths (in place: the input is recvbuf's P blocks)."""
    recv = _flat(recvbuf, "recvbuf")
    ropt = _op(op)
    if in_place:
        if recv.size % P:
            raise InvalidArgument("Reduce_scatter_block IN_PLACE: recvbuf must hold "
                                  f"{P} blocks, got {recv.size} elements")
        src, n = recv, recv.size // P
    else:
        src, n = _flat(sendbuf, "sendbuf"), recv.size
        if src.size != P * n:
            raise InvalidArgument(f"Reduce_scatter_block: sendbuf needs {P} x {n} = "
                                  f"{P * n} elements, got {src.size}")
    if src.dtype != recv.dtype:
        raise InvalidArgument(f"Reduce_scatter_block: sendbuf dtype {src.dtype} and "
                              f"recvbuf dtype {recv.dtype} must match")
    return recv, src, n, ropt


def _allreduce_args(sendbuf, recvbuf, op, in_place: bool):
    """(recv, src, op) of an Allreduce, flattened and checked alike on both paths."""
    recv = _flat(recvbuf, "recvbuf")
    ropt = _op(op)
    src = recv if in_place else _flat(sendbuf, "sendbuf")
    if src.size != recv.size:
        raise InvalidArgument(f"Allreduce needs equal send and recv sizes, got "
                              f"{src.size} and {recv.size}")
    if src.dtype != recv.dtype:
        raise InvalidArgument(f"Allreduce: sendbuf dtype {src.dtype} and recvbuf dtype "
                              f"{recv.dtype} must match")
    return recv, src, ropt
