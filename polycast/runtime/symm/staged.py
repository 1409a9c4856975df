"""``auto`` with ordinary arrays on one host: the input is copied into shared memory and
the collective reads peers' copies (allgather and reduce-scatter write straight into the
user's recvbuf; allreduce reduces its block, then every rank copies every block out, or up
to ONE_SHOT_MAX_NBYTES every rank reduces the whole; broadcast above 2 x
BCAST_CHUNK_NBYTES is pipelined chunk by chunk).

Where the copies live. A call of up to SLOT_NBYTES per rank uses one of two alternating
*slots* and needs no closing barrier: data published at barrier X (written before it, or
after it for a pipelined broadcast) goes to slot X & 1 and is read between barriers X and
X + 1. The next writer of that slot publishes at barrier X + 2 or later, so it has passed
barrier X + 1, which every reader reached only once done reading. (Allreduce's reduced
blocks are published at its second barrier, so they go to the other slot.) Larger calls
use the *staging segment*, which keeps a closing barrier; it is made by the first such call
(collective: every rank makes the same call) and replaced by one of the next power of two
when a call needs more; a rank that must grow it first joins a barrier saying so, so ranks
passing different sizes all raise MismatchError. Each ``staged_*`` returns a request, or
None when the call must take the engine (the allocation failed on every rank)."""

from __future__ import annotations

from ...collectives import ReduceOp
from ...errors import CollectiveTimeout, InvalidArgument, PeerLost, PolycastError
from ...memory import apply_avg
from .barrier import PROGRESS, call_sig
from .common import (UFUNCS, _allreduce_args, _blocks, _describe, _flat, _post,
                     _reduce_scatter_args, _telling_peers)
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


def _place(comm, st: SymmState, nbytes: int, desc: tuple, what: str):
    """Where a call of ``nbytes`` per rank stages its data: ``(segment, slotted)``, the
    slots segment for calls up to ``st.slot_nbytes`` (SLOT_NBYTES), else the staging
    segment; None when the allocation failed on every rank."""
    slotted = nbytes <= st.slot_nbytes
    seg = _stage(comm, st, 0 if slotted else nbytes, desc, what)
    if seg is None:
        return None
    return (st.slots if slotted else seg), slotted


def _offset(st: SymmState, slotted: bool, ahead: int = 1) -> int:
    """Byte offset of the slot for data published at barrier epoch + ``ahead`` (0 in the
    staging segment). Called inside the job, where the epoch is the previous call's."""
    return ((st.bar.epoch + ahead) & 1) * st.slot_nbytes if slotted else 0


def staged_allgather(comm, sendbuf, recvbuf, in_place: bool, blocking: bool = True):
    """``auto`` allgather of ordinary arrays: this rank's block is copied into shared
    memory, whence every peer reads it straight into its own recvbuf (no copy out).
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
    what = _describe("allgather", n, dt)
    got = _place(comm, st, n * dt.itemsize, ("allgather", n, dt.str), what)
    if got is None:
        return None
    seg, slotted = got
    sig = call_sig("allgather-staged", n, dt.str, seg.index)

    def job():
        off = _offset(st, slotted)
        seg.view(r, off, n, dt)[...] = src
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        if not in_place:
            recv[r * n:(r + 1) * n] = src
        for i in range(1, P):
            p = (r + i) % P
            recv[p * n:(p + 1) * n] = seg.view(p, off, n, dt)
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "allgather", job, blocking)


def staged_reduce_scatter(comm, sendbuf, recvbuf, op, in_place: bool,
                          blocking: bool = True):
    """``auto`` reduce-scatter of ordinary arrays: the input is copied into shared memory;
    each rank reduces its block from every rank's copy into its recvbuf."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "reduce_scatter"):
        recv, src, n, ropt = _reduce_scatter_args(sendbuf, recvbuf, op, in_place, P)
        out = recv[:n] if in_place else recv
    dt = recv.dtype
    isz = dt.itemsize
    what = _describe("reduce_scatter", n, dt, ropt.value)
    got = _place(comm, st, P * n * isz, ("reduce_scatter", n, dt.str, ropt.value), what)
    if got is None:
        return None
    seg, slotted = got
    ufunc = UFUNCS[ropt]
    sig = call_sig("reduce_scatter-staged", n, dt.str, ropt.value, seg.index)

    def job():
        off = _offset(st, slotted)
        seg.view(r, off, P * n, dt)[...] = src
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        mine = off + r * n * isz
        # Our block first, then the peers' in rotated order (no source read by two).
        ufunc(seg.view(r, mine, n, dt), seg.view((r + 1) % P, mine, n, dt), out=out)
        for i in range(2, P):
            ufunc(out, seg.view((r + i) % P, mine, n, dt), out=out)
        if ropt is ReduceOp.AVG:
            apply_avg(out, P)
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "reduce_scatter", job, blocking)


def staged_allreduce(comm, sendbuf, recvbuf, op, in_place: bool, blocking: bool = True):
    """``auto`` allreduce of ordinary arrays: the input is copied into shared memory.
    Up to ONE_SHOT_MAX_NBYTES every rank reduces the whole of every rank's copy, in rank
    order, straight into its recvbuf (one barrier). Above, each rank reduces its block
    from every rank's copy (into the other slot, or in place in its own staging copy,
    where nobody else reads that block then), and after a barrier every rank copies every
    block from its owner into its recvbuf. Either way each element is reduced in one
    order, so every rank holds the same bits."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "allreduce"):
        recv, src, ropt = _allreduce_args(sendbuf, recvbuf, op, in_place)
    dt, isz, count = recv.dtype, recv.dtype.itemsize, recv.size
    what = _describe("allreduce", count, dt, ropt.value)
    got = _place(comm, st, count * isz, ("allreduce", count, dt.str, ropt.value), what)
    if got is None:
        return None
    seg, slotted = got
    ufunc = UFUNCS[ropt]
    sig = call_sig("allreduce-staged", count, dt.str, ropt.value, seg.index)
    if slotted and count * isz <= ONE_SHOT_MAX_NBYTES:

        def job():
            off = _offset(st, True)
            seg.view(r, off, count, dt)[...] = src
            st.bar.check_sigs(st.bar.barrier(sig, what), what)
            # recv is ours alone: reduce straight into it, in rank order (same bits).
            ufunc(seg.view(0, off, count, dt), seg.view(1, off, count, dt), out=recv)
            for p in range(2, P):
                ufunc(recv, seg.view(p, off, count, dt), out=recv)
            if ropt is ReduceOp.AVG:
                apply_avg(recv, P)
        return _post(comm, st, "allreduce", job, blocking)
    blocks = _blocks(count, P)

    def job():
        ins = _offset(st, slotted)
        outs = _offset(st, slotted, 2) if slotted else 0
        seg.view(r, ins, count, dt)[...] = src
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        a, b = blocks[r]
        acc = seg.view(r, outs + a * isz, b - a, dt)
        ufunc(seg.view(r, ins + a * isz, b - a, dt),
              seg.view((r + 1) % P, ins + a * isz, b - a, dt), out=acc)
        for i in range(2, P):
            ufunc(acc, seg.view((r + i) % P, ins + a * isz, b - a, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.bar.barrier(0, what)
        for i in range(P):
            p = (r + i) % P
            a, b = blocks[p]
            recv[a:b] = seg.view(p, outs + a * isz, b - a, dt)
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "allreduce", job, blocking)


def staged_bcast(comm, buf, root: int, blocking: bool = True):
    """``auto`` broadcast of an ordinary array: the root copies it into shared memory;
    after a barrier every other rank copies it out. Above 2 x BCAST_CHUNK_NBYTES it is
    pipelined: the root publishes its progress chunk by chunk in its control block and the
    others copy each chunk as soon as it is there, while it is still in cache."""
    r = comm.rank
    st = state(comm)
    with _telling_peers(comm, "bcast"):
        b = _flat(buf, "buf")
    dt, n = b.dtype, b.size
    nbytes = n * dt.itemsize
    what = _describe("bcast", n, dt, f"root {root}")
    got = _place(comm, st, nbytes, ("bcast", n, dt.str, root), what)
    if got is None:
        return None
    seg, slotted = got
    pipelined = nbytes > 2 * BCAST_CHUNK_NBYTES
    sig = call_sig("bcast", n, dt.str, root, seg.index)

    def job():
        off = _offset(st, slotted)
        if r == root and not pipelined:
            seg.view(r, off, n, dt)[...] = b
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        if pipelined:
            _pipelined_bcast(st, seg, off, b, root, what)
        elif r != root:
            b[...] = seg.view(root, off, n, dt)
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "bcast", job, blocking)


def _pipelined_bcast(st: SymmState, seg: Segment, off: int, b, root: int, what: str):
    """The root stages ``b`` chunk by chunk, publishing its progress; the others copy
    each chunk once it is there. Progress values are (opening epoch << 24) + chunks done:
    larger than any left from an earlier call, the same target on every rank."""
    dt, n = b.dtype, b.size
    step = max(1, BCAST_CHUNK_NBYTES // dt.itemsize)
    base = st.bar.epoch << 24
    try:
        for i in range(-(-n // step)):
            lo, hi = i * step, min(n, (i + 1) * step)
            chunk = seg.view(root, off + lo * dt.itemsize, hi - lo, dt)
            if st.rank == root:
                chunk[...] = b[lo:hi]
                st.bar.publish(PROGRESS, base + i + 1)      # after the data
            else:
                st.bar.wait_for([root], PROGRESS, base + i + 1, what,
                                "did not publish the data")
                b[lo:hi] = chunk
    except (PeerLost, CollectiveTimeout) as exc:
        st.bar.broken = f"{type(exc).__name__}: {exc}"
        raise
