"""Single-copy collectives on one host: ranks read each other's arrays with
process_vm_readv (runtime/transport/cma.py) instead of staging them through shared memory.

Above the slots (and from SINGLE_COPY_MIN_NBYTES a rank when every rank has
a core of its own), when every rank may read every other's memory
(``SymmState.single_copy``: the probes the shm rings made at connect time, agreed in the
state's first allgather), the ``auto`` allgather, reduce-scatter, allreduce and broadcast
of :mod:`.staged` do not stage at all: each rank publishes the address of its array in its
control block (ADDR, ADDR2), and after the opening barrier every rank copies what it needs
straight from the peers' arrays (the kernel's one copy, without the GIL). The closing
barrier keeps every source untouched until its readers are done. The staged form copies
each byte twice (in, then out) and holds as many barriers. A dead owner makes the read fail
with ESRCH, raised as PeerLost: never a read of freed memory, never a hang. the cma=0 test hook
turns it off (then everything stages). A repeated blocking allgather or broadcast of one
shape runs whole in the compiled helper (_symm_single.c; kept by
staged._keep_fast with this module's descriptors, so ranks on either side agree): the
Python around the copies and the barriers is gone.

Broadcast shares the copying out: the root, which would only wait, writes the last 1/P of
every other rank's buffer (process_vm_writev: the kernel grants it on the same terms as
the read; where some rank's C library lacks it, every rank stages) while each of them
reads the rest from the root's array, so every rank copies
(P-1)/P of the message once, all at the same time; it was faster than the staged forms
it replaces (pipelined above the slots) at 2 and 4 ranks when it landed. Readers alone,
the root idle, were slower than the pipeline at 4 ranks, and within the slots at 4 ranks
the slotted form stays faster, so those stay.
"""

from __future__ import annotations

import errno

import numpy as np

from ...collectives import ReduceOp
from ...memory import apply_avg
from ..transport import cma
from .barrier import ADDR, ADDR2, _cores, call_sig, copy_error
from .common import UFUNCS, _blocks, _describe, _post
from .shared import SymmState

# Single copy from this many bytes a rank even within the slots, when every rank
# has a core of its own: it takes one barrier more there, which costs a scheduling round
# when ranks share cores. Same minutes, ranks at RT priority, single-copy vs slots:
# 2 ranks, allgather 1 MiB (512 KiB a rank) 100 vs 115 us, 256 KiB 35.7 vs 33 us;
# reduce-scatter 1 MiB 114 vs 154 us; allreduce 1 MiB 207 vs 224 us. 4 ranks on 2 cores:
# reduce-scatter 1 MiB 480-500 vs 404-415 us, allreduce 1 MiB 735-951 vs 622-631 us,
# allgather 4 MiB 1057-1116 vs 902-906 us.
SINGLE_COPY_MIN_NBYTES = 512 << 10
# Reduce-scatter reads peers' blocks this much at a time (and reduces it while in cache).
SINGLE_COPY_CHUNK_NBYTES = 256 << 10


def wanted(st: SymmState, nbytes: int) -> bool:
    """Whether a call of ``nbytes`` a rank reads its peers' arrays directly (every rank
    able to read every other; above the slots, or from SINGLE_COPY_MIN_NBYTES when every
    rank has a core: the same answer on every rank of one host)."""
    return st.single_copy and (nbytes > st.slot_nbytes or nbytes >= SINGLE_COPY_MIN_NBYTES
                               and st.size <= _cores())


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def bcast_wanted(st: SymmState, nbytes: int) -> bool:
    """Whether a broadcast of ``nbytes`` goes single copy (:func:`bcast`): as
    :func:`wanted`, and every rank able to write too (agreed in the state's first
    allgather, so every rank answers alike)."""
    return st.single_copy_writes and wanted(st, nbytes)


def _read_peer(st: SymmState, p: int, dst, addr: int, what: str, write: bool = False
               ) -> None:
    """Copy ``dst.nbytes`` bytes at ``addr`` in rank ``p``'s memory into ``dst``
    (``write``: ``dst``'s bytes to there instead). A peer gone is PeerLost, and the
    barrier is marked broken so the other ranks' next wait fails too."""
    if not dst.nbytes:
        return
    try:
        (cma.write if write else cma.read)(st.pids[p], [(_address(dst), dst.nbytes)],
                                           [(addr, dst.nbytes)])
    except OSError as exc:
        err = copy_error(st.rank, p, what, exc.errno or errno.EIO, write)
        st.bar.broken = f"{type(err).__name__}: {err}"
        raise err from None


def _reduce_from_peers(st: SymmState, ufunc, ropt, mine, acc, addrs: list, what: str) -> None:
    """``acc`` = ``mine`` combined with the same range of every peer's array (``addrs[p]``:
    where it starts in rank p), peers in the staged form's order (r+1, r+2, ...).

    The first peer's range is read straight into ``acc`` (one process_vm_readv) and ``mine``
    added to it in one ufunc call, when ``acc`` is not ``mine`` itself; further peers (and
    the in-place case) are read a chunk at a time into a buffer of our own and reduced
    while in cache: reading the first peer straight is faster than in chunks (fewer
    passes, no per-chunk calls). It also takes the GIL twice instead of twice per chunk: a
    worker running an overlapped job beside pure-Python compute waits up to the switch
    interval for every take, so 256 takes per 32 MiB starved the collective."""
    P, r, n = st.size, st.rank, acc.size
    first = 1
    if P > 1 and n and not np.may_share_memory(mine, acc):
        p = (r + 1) % P
        _read_peer(st, p, acc, addrs[p], what)
        ufunc(mine, acc, out=acc)
        first = 2
    if first < P:
        tmp = np.empty(min(max(1, n), max(1, SINGLE_COPY_CHUNK_NBYTES // acc.itemsize)),
                       acc.dtype)
        isz = acc.itemsize
        for lo in range(0, n, tmp.size):
            hi = min(n, lo + tmp.size)
            a, t = acc[lo:hi], tmp[:hi - lo]
            for i in range(first, P):
                p = (r + i) % P
                _read_peer(st, p, t, addrs[p] + lo * isz, what)
                ufunc(mine[lo:hi] if i == 1 else a, t, out=a)
    if ropt is ReduceOp.AVG:
        apply_avg(acc, P)


# A call's (description, descriptor): the compiled helper keeps the same ones for the calls
# it repeats (staged._keep_fast), so a rank there and a rank here agree.
def allgather_sig(n: int, dt) -> tuple[str, int]:
    return _describe("allgather", n, dt), call_sig("allgather-single-copy", n, dt.str)


def bcast_sig(n: int, dt, root: int) -> tuple[str, int]:
    return _describe("bcast", n, dt), call_sig("bcast-single-copy", n, dt.str, root)


def allgather(comm, st: SymmState, src, out, n: int, in_place: bool, blocking: bool):
    """Allgather: every rank reads every peer's block from the peer's sendbuf (or its
    block of recvbuf, in place) straight into its recvbuf ``out`` (P x n)."""
    P, r = comm.size, comm.rank
    dt = src.dtype
    what, sig = allgather_sig(n, dt)
    ctrl = st.bar.ctrl

    def job():
        ctrl[r][ADDR] = _address(src)                   # published by the barrier
        if not in_place:
            out[r] = src            # (nobody reads our recvbuf: done while peers arrive)
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        st.single_copy_calls["allgather"] += 1
        for i in range(1, P):
            p = (r + i) % P
            _read_peer(st, p, out[p], int(ctrl[p][ADDR]), what)
        st.bar.barrier(0, what)                         # our block is read: free again
    return _post(comm, st, "allgather", job, blocking)


def bcast(comm, st: SymmState, b, root: int, blocking: bool):
    """Broadcast ``b`` from ``root``, the copying shared (see the module docstring): after
    the opening barrier (which checks every rank's call, so a mismatched one writes
    nothing) the root writes the last ``n // P`` elements of every other rank's ``b``
    while each of them reads the first ``n - n // P`` from the root's. The closing
    barrier keeps both ends' arrays in the call until every copy is done."""
    P, r = comm.size, comm.rank
    dt, n = b.dtype, b.size
    isz = dt.itemsize
    cut = n - n // P
    what, sig = bcast_sig(n, dt, root)
    ctrl = st.bar.ctrl

    def job():
        ctrl[r][ADDR] = _address(b)                     # published by the barrier
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        st.single_copy_calls["bcast"] += 1
        if r == root:
            tail = b[cut:]
            for i in range(1, P):
                p = (r + i) % P
                _read_peer(st, p, tail, int(ctrl[p][ADDR]) + cut * isz, what, write=True)
        else:
            _read_peer(st, root, b[:cut], int(ctrl[root][ADDR]), what)
        st.bar.barrier(0, what)         # every copy done: the root's b and ours are free
    return _post(comm, st, "bcast", job, blocking)


def reduce_scatter(comm, st: SymmState, src, out, n: int, ropt, in_place: bool,
                   blocking: bool):
    """Reduce-scatter reading block r of every peer's sendbuf straight from it, a chunk at a
    time into a buffer of our own (so the chunk is reduced while in cache), in the staged
    form's order (ours, then the peers rotated). In place, our own sendbuf is read by peers
    until the closing barrier, so the result goes to a buffer of its own first."""
    P, r = comm.size, comm.rank
    dt = src.dtype
    isz = dt.itemsize
    what = _describe("reduce_scatter", n, dt, ropt.value)
    sig = call_sig("reduce_scatter-single-copy", n, dt.str, ropt.value)
    ufunc = UFUNCS[ropt]
    ctrl = st.bar.ctrl

    def job():
        acc = np.empty(n, dt) if in_place else out
        ctrl[r][ADDR] = _address(src)                   # published by the barrier
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        st.single_copy_calls["reduce_scatter"] += 1
        _reduce_from_peers(st, ufunc, ropt, src[r * n:(r + 1) * n], acc,
                           [int(ctrl[p][ADDR]) + r * n * isz for p in range(P)], what)
        st.bar.barrier(0, what)                         # our sendbuf is read: free again
        if in_place:
            out[...] = acc
    return _post(comm, st, "reduce_scatter", job, blocking)


def allreduce(comm, st: SymmState, src, recv, ropt, blocking: bool):
    """Allreduce as a single-copy reduce-scatter into our block of recvbuf (read from the
    peers' sendbufs a chunk at a time, reduced while in cache), then a single-copy
    allgather of the reduced blocks from the peers' recvbufs: three barriers, each byte
    copied once each way, by the kernel. In place is safe: our block of the input is read
    by us alone, and the others' blocks of recvbuf are written only after the middle
    barrier, when nobody reads the input any more. Each block is reduced by its owner
    alone, so every rank holds the same bits."""
    P, r = comm.size, comm.rank
    dt, count = recv.dtype, recv.size
    isz = dt.itemsize
    blocks = _blocks(count, P)
    a, b = blocks[r]
    what = _describe("allreduce", count, dt, ropt.value)
    sig = call_sig("allreduce-single-copy", count, dt.str, ropt.value)
    ufunc = UFUNCS[ropt]
    ctrl = st.bar.ctrl

    def job():
        ctrl[r][ADDR] = _address(src)                   # published by the barrier
        ctrl[r][ADDR2] = _address(recv)
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        st.single_copy_calls["allreduce"] += 1
        _reduce_from_peers(st, ufunc, ropt, src[a:b], recv[a:b],
                           [int(ctrl[p][ADDR]) + a * isz for p in range(P)], what)
        st.bar.barrier(0, what)                         # every block reduced
        for i in range(1, P):
            p = (r + i) % P
            lo, hi = blocks[p]
            _read_peer(st, p, recv[lo:hi], int(ctrl[p][ADDR2]) + lo * isz, what)
        st.bar.barrier(0, what)                         # our block is read: free again
    return _post(comm, st, "allreduce", job, blocking)


