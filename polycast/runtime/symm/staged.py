"""``auto`` with ordinary arrays on one host: the input is copied into the communicator's
staging segment and the collective reads peers' staging segments (allgather and
reduce-scatter write straight into the user's recvbuf; allreduce reduces its block in
place, then copies every block out, or up to ONE_SHOT_MAX_NBYTES takes one barrier with
its input in one of two alternating slots of a small segment; broadcast is pipelined in
BCAST_CHUNK_NBYTES chunks). The staging segment is made by the first such call
(collective: every rank makes the same call) and replaced by one of the next power of two
when a call needs more; a rank that must grow it first joins a barrier saying so, so ranks
passing different sizes all raise MismatchError. Each ``staged_*`` returns a request, or
None when the call must take the engine (the staging allocation failed on every rank)."""

from __future__ import annotations

from ...collectives import ReduceOp
from ...errors import CollectiveTimeout, InvalidArgument, PeerLost, PolycastError
from ...memory import apply_avg
from .barrier import PROGRESS, call_sig
from .common import (UFUNCS, _allreduce_args, _blocks, _describe, _flat, _post,
                     _reduce_scatter_args, _telling_peers)
from .direct import allgather, reduce_scatter
from .shared import ONE_SHOT_MAX_NBYTES, Segment, SymmState, state

BCAST_CHUNK_NBYTES = 256 << 10   # 4 ranks, 16 MiB: 128K 4.1, 256K 4.7, 512K 3.5, 1M 4.5 GB/s
STAGE_MIN_NBYTES = 4096


def _stage(comm, st: SymmState, nbytes: int, desc: tuple, what: str) -> Segment | None:
    """The staging segment, with room for ``nbytes``. Growth is decided from the call's
    size, which every rank shares: each rank that needs more joins a barrier first whose
    descriptor says so, so ranks whose sizes differ (some growing, some not) all raise
    MismatchError there instead of some allocating while others wait. The new size is the
    next power of two (at least STAGE_MIN_NBYTES), so a series of growing calls allocates
    O(log) times. None: the allocation failed on every rank (the call takes the engine)."""
    seg = st.stage
    if seg is not None and nbytes <= seg.nbytes:
        return seg
    need = max(STAGE_MIN_NBYTES, 1 << max(0, nbytes - 1).bit_length())

    def grow():
        # After the calls queued before this one (they use the segment being replaced).
        st.bar.check_sigs(st.bar.barrier(call_sig("grow", need, *desc), what), what)
        try:
            return st.grow_stage(need)
        except (PeerLost, CollectiveTimeout) as exc:
            st.bar.broken = f"{type(exc).__name__}: {exc}"
            raise
        except PolycastError as exc:        # every rank raised it (the reports are shared)
            st.auto_refused = f"staging buffer of {need} bytes: {exc}"
            return None
    return st.queue.run_now(grow)


def staged_allgather(comm, sendbuf, recvbuf, in_place: bool, blocking: bool = True):
    """``auto`` allgather of ordinary arrays: this rank's block is copied into the staging
    segment, whence every peer reads it straight into its own recvbuf (no copy out).
    Returns the request, or None when the call must take the engine."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "allgather"):
        recv = _flat(recvbuf, "recvbuf")
        if recv.size % P:
            raise InvalidArgument(f"Allgather recvbuf of {recv.size} elements is not a "
                                  f"multiple of the {P} ranks")
        n = recv.size // P
        src = recv[r * n:(r + 1) * n] if in_place else _flat(sendbuf, "sendbuf")
        if src.size != n:
            raise InvalidArgument(f"Allgather: sendbuf has {src.size} elements, recvbuf "
                                  f"needs {P} x {src.size} = {P * src.size}, got {recv.size}")
        if src.dtype != recv.dtype:
            raise InvalidArgument(f"Allgather: sendbuf dtype {src.dtype} and recvbuf dtype "
                                  f"{recv.dtype} must match")
    dt = recv.dtype
    seg = _stage(comm, st, n * dt.itemsize, ("allgather", n, dt.str),
                 _describe("allgather", n, dt))
    if seg is None:
        return None
    stage = seg.view(r, 0, n, dt)

    def copy_in():
        stage[...] = src
    return allgather(comm, stage, recv, False, blocking, copy_in)


def staged_reduce_scatter(comm, sendbuf, recvbuf, op, in_place: bool,
                          blocking: bool = True):
    """``auto`` reduce-scatter of ordinary arrays: the input is copied into the staging
    segment; each rank reduces its block from every peer's copy into its recvbuf."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "reduce_scatter"):
        recv, src, n, ropt = _reduce_scatter_args(sendbuf, recvbuf, op, in_place, P)
        out = recv[:n] if in_place else recv
    dt = recv.dtype
    seg = _stage(comm, st, P * n * dt.itemsize, ("reduce_scatter", n, dt.str, ropt.value),
                 _describe("reduce_scatter", n, dt, ropt.value))
    if seg is None:
        return None
    stage = seg.view(r, 0, P * n, dt)

    def copy_in():
        stage[...] = src
    return reduce_scatter(comm, stage, out, ropt, False, blocking, copy_in)


def staged_allreduce(comm, sendbuf, recvbuf, op, in_place: bool, blocking: bool = True):
    """``auto`` allreduce of ordinary arrays: the input is copied into the staging segment.
    Up to ONE_SHOT_MAX_NBYTES every rank reduces the whole of every peer's copy, in rank
    order, straight into its recvbuf (one barrier: the input sits in one of two slots that
    alternate). Above, each rank reduces its block
    in its own staging copy (nobody else reads that block then), and after a barrier every
    rank copies every block from its owner into its recvbuf (three barriers). Either way
    each element is reduced in one order, so every rank holds the same bits."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "allreduce"):
        recv, src, ropt = _allreduce_args(sendbuf, recvbuf, op, in_place)
    dt, isz, count = recv.dtype, recv.dtype.itemsize, recv.size
    what = _describe("allreduce", count, dt, ropt.value)
    seg = _stage(comm, st, count * isz, ("allreduce", count, dt.str, ropt.value), what)
    if seg is None:
        return None
    ufunc = UFUNCS[ropt]
    sig = call_sig("allreduce-staged", count, dt.str, ropt.value, seg.index)
    if count * isz <= ONE_SHOT_MAX_NBYTES:
        small = st.small

        def job():
            # One barrier, no closing one: the input goes to slot (epoch & 1) of the small
            # segment. A peer still reading this slot would be in the call two barriers
            # back, but we passed the barrier after it, which that peer reached only once
            # done.
            off = ((st.bar.epoch + 1) & 1) * ONE_SHOT_MAX_NBYTES
            small.view(r, off, count, dt)[...] = src
            st.bar.check_sigs(st.bar.barrier(sig, what), what)
            # recv is ours alone: reduce straight into it, in rank order (same bits).
            ufunc(small.view(0, off, count, dt), small.view(1, off, count, dt), out=recv)
            for p in range(2, P):
                ufunc(recv, small.view(p, off, count, dt), out=recv)
            if ropt is ReduceOp.AVG:
                apply_avg(recv, P)
        return _post(comm, st, "allreduce", job, blocking)

    def job():
        mine = seg.view(r, 0, count, dt)
        mine[...] = src
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        blocks = _blocks(count, P)
        a, b = blocks[r]
        acc = mine[a:b]
        for i in range(1, P):
            ufunc(acc, seg.view((r + i) % P, a * isz, b - a, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.bar.barrier(0, what)
        for i in range(P):
            p = (r + i) % P
            a, b = blocks[p]
            recv[a:b] = seg.view(p, a * isz, b - a, dt)
        st.bar.barrier(0, what)
    return _post(comm, st, "allreduce", job, blocking)


def staged_bcast(comm, buf, root: int, blocking: bool = True):
    """``auto`` broadcast of an ordinary array: the root copies it into its staging
    segment; after a barrier every other rank copies it out (a second barrier keeps the
    root from overwriting it for the next call while a peer still reads). Above
    2 x BCAST_CHUNK_NBYTES it is pipelined: the root publishes its progress chunk by chunk
    in its control block and the others copy each chunk as soon as it is there, while it
    is still in cache."""
    r = comm.rank
    st = state(comm)
    with _telling_peers(comm, "bcast"):
        b = _flat(buf, "buf")
    dt, n = b.dtype, b.size
    what = _describe("bcast", n, dt, f"root {root}")
    seg = _stage(comm, st, n * dt.itemsize, ("bcast", n, dt.str, root), what)
    if seg is None:
        return None
    nbytes = n * dt.itemsize
    pipelined = nbytes > 2 * BCAST_CHUNK_NBYTES
    sig = call_sig("bcast", n, dt.str, root, seg.index)

    def job():
        if r == root and not pipelined:
            seg.view(r, 0, n, dt)[...] = b
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        if pipelined:
            # Progress values are (opening epoch << 24) + chunks done: larger than any
            # left from an earlier call, the same target on every rank.
            step = max(1, BCAST_CHUNK_NBYTES // dt.itemsize)
            base = st.bar.epoch << 24
            own, nchunks = st.bar.ctrl[r], -(-n // step)
            try:
                for i in range(nchunks):
                    lo, hi = i * step, min(n, (i + 1) * step)
                    if r == root:
                        seg.view(r, lo * dt.itemsize, hi - lo, dt)[...] = b[lo:hi]
                        own[PROGRESS] = base + i + 1      # after the data: TSO
                    else:
                        st.bar.wait_for([root], PROGRESS, base + i + 1, what,
                                        "did not publish the data")
                        b[lo:hi] = seg.view(root, lo * dt.itemsize, hi - lo, dt)
            except (PeerLost, CollectiveTimeout) as exc:
                st.bar.broken = f"{type(exc).__name__}: {exc}"
                raise
        elif r != root:
            b[...] = seg.view(root, 0, n, dt)
        st.bar.barrier(0, what)
    return _post(comm, st, "bcast", job, blocking)
# -- the collectives ------------------------------------------------------------------------
