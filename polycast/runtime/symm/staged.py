"""``auto`` with ordinary arrays on one host: the input is copied into shared memory and
the collective reads peers' copies (allgather and reduce-scatter write straight into the
user's recvbuf; allreduce reduces its block, then every rank copies every block out, or up
to ONE_SHOT_MAX_NBYTES every rank reduces the whole; broadcast above the slots is
pipelined chunk by chunk).

Where the copies live. A call of up to SLOT_NBYTES per rank uses one of two alternating
*slots* and needs no closing barrier: data published at barrier X (written before it)
goes to slot X & 1 and is read between barriers X and
X + 1. The next writer of that slot publishes at barrier X + 2 or later, so it has passed
barrier X + 1, which every reader reached only once done reading. (Allreduce's reduced
blocks are published at its second barrier, so they go to the other slot.) Larger calls
use the *staging segment*, which keeps a closing barrier; it is made by the first such call
(collective: every rank makes the same call) and replaced by one of the next power of two
when a call needs more; a rank that must grow it first joins a barrier saying so, so ranks
passing different sizes all raise MismatchError. Each ``staged_*`` returns a request, or
None when the call must take the engine (the allocation failed on every rank). Large
allgather, reduce-scatter and allreduce do not stage at all where ranks may read each
other's memory: they read the peers' arrays single-copy (:mod:`.single`).

A slotted call's fixed parts (its descriptor, and the numpy views of every rank's slot it
reads and writes, for either slot) are made once per call shape and kept in
``SymmState.plans`` (:func:`_plan`): a call repeats its shapes, and making P + 1 views and a
descriptor per call was a fifth of a small call's Python."""

from __future__ import annotations

import numpy as np

from ... import debug
from ...collectives import Collective, ReduceOp
from ...errors import CollectiveTimeout, InvalidArgument, PeerLost, PolycastError
from ...memory import apply_avg
from . import single
from .barrier import (K_ALLGATHER, K_ALLREDUCE, K_BCAST, K_REDUCE_SCATTER, PROGRESS,
                      call_sig, compiled)
from .common import (UFUNCS, _allreduce_args, _blocks, _describe, _done_request, _flat,
                     _post, _reduce_scatter_args, _tell_peers, fold_in_rank_order)
from .shared import ONE_SHOT_MAX_NBYTES, Segment, SymmState

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
            st.bar.fast_off()
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


PLANS_MAX = 256         # kept call shapes per communicator (more: start over)

# The compiled helper's codes (_symm_fold.c) for the dtypes and ops it reduces itself.
_DTYPE_CODES = {"<f4": 1, "<f8": 2, "|i1": 3, "<i2": 4, "<i4": 5, "<i8": 6,
                "|u1": 7, "<u2": 8, "<u4": 9, "<u8": 10}
_OP_CODES = {ReduceOp.SUM: 1, ReduceOp.AVG: 1, ReduceOp.PROD: 2, ReduceOp.MIN: 3,
             ReduceOp.MAX: 4}


def _native_codes(st: SymmState, dt, ropt) -> tuple[int, int] | None:
    """``(dtype code, op code)`` of a slotted call the compiled helper runs whole ((0, 0):
    one without a reduction, ``ropt`` None), or None: it runs in numpy (no helper, or a
    dtype or op the helper leaves to numpy, e.g. float min/max)."""
    if st.bar.native is None:
        return None
    if ropt is None:
        return 0, 0
    codes = _DTYPE_CODES.get(dt.str), _OP_CODES.get(ropt)
    return codes if None not in codes and compiled.supports(*codes) else None


def _plan(comm, st: SymmState, key: tuple, nbytes: int, desc: tuple, about: tuple,
          tag: str, views, dt=None, ropt=None):
    """``(what, sig, views, seg, slotted, native)`` of a call of ``nbytes`` a rank
    (``what``: its description from ``about``, ``sig``: its descriptor from ``tag`` and
    ``desc``): for a slotted call made once per ``key`` (the call's shape), with
    ``views(seg, off, other)`` built for both slots (``off``: the byte offset of the slot
    its data is published in, ``other``: of the other slot) and ``native``, the compiled
    helper's codes for it (:func:`_native_codes` of ``dt`` and ``ropt``; None: numpy);
    else made each time, without views (the staging segment may be replaced: the job
    makes them). None: the allocation failed on every rank (the call takes the engine)."""
    plan = st.plans.get(key)
    if plan is not None:
        return plan
    what = _describe(*about)
    got = _place(comm, st, nbytes, desc, what)
    if got is None:
        return None
    seg, slotted = got
    sig = call_sig(tag, *desc[1:], seg.index)
    if not slotted:
        return what, sig, None, seg, False, None
    half = st.slot_nbytes
    plan = (what, sig, (views(seg, 0, half), views(seg, half, 0)), seg, True,
            _native_codes(st, dt, ropt))
    if len(st.plans) >= PLANS_MAX:
        st.plans.clear()
    st.plans[key] = plan
    return plan


def _small(st: SymmState, key: tuple | None, kind: int, coll: str, plan: tuple,
           root: int = 0, avg_over: int = 0) -> tuple:
    """The entry of a slotted call the compiled helper runs whole: ``(kind, coll, what,
    sig, codes, root, avg_over)``, ``kind`` a barrier.K_*, ``avg_over`` the ranks an AVG sum
    is divided by afterwards (0: not AVG). Kept in ``st.small`` under ``key`` (the call's
    shape as the comm layer hands it over: a repeated call finds it before any other work,
    see :func:`_run_small`) unless ``key`` is None (arrays the comm layer's would not be)."""
    what, sig, _, _, _, codes = plan
    entry = (kind, coll, what, sig, codes, root, avg_over)
    if key is not None:
        if len(st.small) >= PLANS_MAX:
            st.small.clear()
        st.small[key] = entry
        if kind in _FAST_KINDS and not avg_over:
            _keep_fast(st, key, entry)
    return entry


_FAST_KINDS = {K_ALLREDUCE: Collective.ALLREDUCE, K_BCAST: Collective.BROADCAST,
               K_ALLGATHER: Collective.ALLGATHER, K_REDUCE_SCATTER: Collective.REDUCE_SCATTER}


def _keep_fast(st: SymmState, key: tuple, entry: tuple, cma: bool = False) -> None:
    """Hand a kept call shape to the compiled helper's one-call fast path
    (``Comm.Allreduce`` -> the dispatch -> ``Barrier.call``, and Bcast, Allgather and
    Reduce_scatter_block alike (not in place: those two keep the Python path), with their
    I-variants; no Python between; see _symm_fast.c): the next such call is checked there, from
    the arrays, and run whole. ``cma``: a single-copy Allgather or Bcast (:mod:`.single`,
    blocking calls only), whose choice of single copy (:func:`.single.wanted`, which asks
    how many cores the rank may use) is kept with the shape, as the planner's answer is.
    Only while this path takes calls without conditions that can change per call: no
    symm_empty arrays (they route by buffer), no broken barrier or refused staging
    (:meth:`.barrier.EpochBarrier.fast_off` is called when either happens)."""
    bar, comm = st.bar, st.comm
    native = bar.native
    if (native is None or bar.broken or st.nuser or st.auto_refused or st.growing
            or st.slots is None and not cma):
        return
    kind, _, what, sig, codes, root, _ = entry
    nbytes = key[1] * key[2].itemsize
    try:
        if not native.armed:
            from ...buffers import IN_PLACE
            q = st.queue
            native.arm(np.ndarray, IN_PLACE, q._run_lock.acquire, q._run_lock.release,
                       q._jobs, bar.policy.c_args)
            if comm.config.debug_level >= debug.INFO:
                debug.info(comm.rank, "symm: repeated calls of a kept shape (small ones; "
                           "large Allgather and Bcast single-copy) take the compiled "
                           "one-call path")
        if cma:
            native.set_pids(st.pids)
            native.add(kind, nbytes, key[2], None, int(root), sig, 0, 0, what, True)
        elif kind == K_BCAST:
            native.add(kind, nbytes, key[2], None, int(root), sig, 0, 0, what)
        elif key[-1]:               # in place: allreduce only
            if kind == K_ALLREDUCE:
                native.add(kind, nbytes, key[2], key[3], 1, sig, *codes, what)
        else:
            native.add(kind, nbytes, key[2], None if kind == K_ALLGATHER else key[3], 0,
                       sig, *codes, what)
    except (TypeError, ValueError):     # e.g. an op given as an object: the Python path
        return
    bar.fast = native


def _run_small(comm, st: SymmState, entry: tuple, src, dst, blocking: bool):
    """Run a :func:`_small` entry's call on ``src`` and ``dst`` (the arrays the comm layer
    checked): on this thread when blocking, else queued; returns the request."""
    kind, coll, what, sig, codes, root, avg_over = entry
    bar = st.bar

    def job():
        bar.run_small(kind, sig, what, src, dst, root, *codes)
        if avg_over:
            apply_avg(dst, avg_over)
    if blocking:
        st.queue.run_now(job)
        return st.done.get(coll) or _done_request(st, coll)
    return _post(comm, st, coll, job, False, True)


def _offset(st: SymmState, slotted: bool, ahead: int = 1) -> int:
    """Byte offset of the slot for data published at barrier epoch + ``ahead`` (0 in the
    staging segment). Called inside the job, where the epoch is the previous call's."""
    return ((st.bar.epoch + ahead) & 1) * st.slot_nbytes if slotted else 0


def staged_allgather(st: SymmState, sendbuf, recvbuf, in_place: bool,
                     blocking: bool = True):
    """``auto`` allgather of ordinary arrays: this rank's block is copied into shared
    memory, whence every peer reads it straight into its own recvbuf (no copy out).
    Returns the request, or None when the call must take the engine."""
    comm = st.comm
    key = (K_ALLGATHER, recvbuf.size, recvbuf.dtype, in_place)
    entry = st.small.get(key) if type(recvbuf) is np.ndarray else None
    if entry is not None:           # (in place, the comm layer's sendbuf is our block)
        return _run_small(comm, st, entry, sendbuf, recvbuf, blocking)
    P, r = comm.size, comm.rank
    try:
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
    except InvalidArgument:
        _tell_peers(st, "allgather")
        raise
    dt = recv.dtype
    out = recv.reshape(P, n)
    if single.wanted(st, n * dt.itemsize):
        if blocking and not in_place and recv is recvbuf and src is sendbuf:
            # (the helper runs blocking calls only: an I-variant would re-add it each time)
            _keep_fast(st, key, (K_ALLGATHER, "allgather", *single.allgather_sig(n, dt),
                                 (0, 0), 0, 0), cma=True)
        return single.allgather(comm, st, src, out, n, in_place, blocking)
    plan = _plan(comm, st, ("allgather", n, dt), n * dt.itemsize, ("allgather", n, dt.str),
                 ("allgather", n, dt), "allgather-staged",
                 lambda seg, off, _: [seg.view(p, off, n, dt) for p in range(P)])
    if plan is None:
        return None
    what, sig, views, seg, slotted, native = plan
    if native is not None:
        keep = recv is recvbuf and (sendbuf is src or in_place)
        entry = _small(st, key if keep else None, K_ALLGATHER, "allgather", plan)
        return _run_small(comm, st, entry, src, recv, blocking)

    def job():
        if slotted:
            v = views[(st.bar.epoch + 1) & 1]     # published at the next epoch
        else:
            v = [seg.view(p, 0, n, dt) for p in range(P)]
        v[r][...] = src
        if not in_place:
            out[r] = src            # (nobody reads our recvbuf: done while peers arrive)
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        for i in range(1, P):
            p = (r + i) % P
            out[p] = v[p]
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "allgather", job, blocking, slotted)


def staged_reduce_scatter(st: SymmState, sendbuf, recvbuf, op, in_place: bool,
                          blocking: bool = True):
    """``auto`` reduce-scatter of ordinary arrays: the input is copied into shared memory;
    each rank reduces its block from every rank's copy into its recvbuf."""
    comm = st.comm
    key = (K_REDUCE_SCATTER, recvbuf.size, recvbuf.dtype, op, in_place)
    entry = st.small.get(key) if type(recvbuf) is np.ndarray else None
    if entry is not None:
        if in_place:
            return _run_small(comm, st, entry, recvbuf, recvbuf[:recvbuf.size // comm.size],
                              blocking)
        return _run_small(comm, st, entry, sendbuf, recvbuf, blocking)
    P, r = comm.size, comm.rank
    try:
        recv, src, n, ropt = _reduce_scatter_args(sendbuf, recvbuf, op, in_place, P)
        out = recv[:n] if in_place else recv
    except InvalidArgument:
        _tell_peers(st, "reduce_scatter")
        raise
    dt = recv.dtype
    isz = dt.itemsize
    if single.wanted(st, P * n * isz):
        return single.reduce_scatter(comm, st, src, out, n, ropt, in_place, blocking)

    def views(seg, off, _):
        # (this rank's whole staging copy, then block r of every rank's copy in the order
        # it is reduced: ours, then the peers' rotated, so no source is read by two)
        mine = off + r * n * isz
        return (seg.view(r, off, P * n, dt),
                [seg.view((r + i) % P, mine, n, dt) for i in range(P)])
    plan = _plan(comm, st, ("reduce_scatter", n, dt, ropt), P * n * isz,
                 ("reduce_scatter", n, dt.str, ropt.value),
                 ("reduce_scatter", n, dt, ropt.value), "reduce_scatter-staged",
                 views, dt, ropt)
    if plan is None:
        return None
    what, sig, vs, seg, slotted, native = plan
    if native is not None:
        keep = recv is recvbuf and (in_place or src is sendbuf)
        entry = _small(st, key if keep else None, K_REDUCE_SCATTER, "reduce_scatter", plan,
                       0, P if ropt is ReduceOp.AVG else 0)
        return _run_small(comm, st, entry, src, out, blocking)
    ufunc = UFUNCS[ropt]

    def job():
        whole, blocks = vs[(st.bar.epoch + 1) & 1] if slotted else views(seg, 0, 0)
        whole[...] = src
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        fold_in_rank_order(ufunc, blocks, out, ropt, P)
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "reduce_scatter", job, blocking, slotted)


def staged_allreduce(st: SymmState, sendbuf, recvbuf, op, in_place: bool,
                     blocking: bool = True):
    """``auto`` allreduce of ordinary arrays: the input is copied into shared memory.
    Up to ONE_SHOT_MAX_NBYTES every rank reduces the whole of every rank's copy, in rank
    order, straight into its recvbuf (one barrier). Above, each rank reduces its block
    from every rank's copy (into the other slot, or in place in its own staging copy,
    where nobody else reads that block then), and after a barrier every rank copies every
    block from its owner into its recvbuf. Either way each element is reduced in one
    order, so every rank holds the same bits."""
    comm = st.comm
    key = (K_ALLREDUCE, recvbuf.size, recvbuf.dtype, op, in_place)
    entry = st.small.get(key) if type(recvbuf) is np.ndarray else None
    if entry is not None:
        return _run_small(comm, st, entry, recvbuf if in_place else sendbuf, recvbuf,
                          blocking)
    P, r = comm.size, comm.rank
    try:
        recv, src, ropt = _allreduce_args(sendbuf, recvbuf, op, in_place)
    except InvalidArgument:
        _tell_peers(st, "allreduce")
        raise
    dt, isz, count = recv.dtype, recv.dtype.itemsize, recv.size
    if single.wanted(st, count * isz):
        return single.allreduce(comm, st, src, recv, ropt, blocking)
    one_shot = count * isz <= ONE_SHOT_MAX_NBYTES

    def one_shot_views(seg, ins, _):        # every rank's whole copy, in rank order
        return [seg.view(p, ins, count, dt) for p in range(P)]

    def two_step_views(seg, ins, outs):
        # (our whole copy; block r of every copy, ours first then rotated; where our
        # reduced block goes; every rank's reduced block, rotated from ours)
        blocks = _blocks(count, P)
        a, b = blocks[r]
        return (seg.view(r, ins, count, dt),
                [seg.view((r + i) % P, ins + a * isz, b - a, dt) for i in range(P)],
                seg.view(r, outs + a * isz, b - a, dt),
                [(blocks[(r + i) % P],
                  seg.view((r + i) % P, outs + blocks[(r + i) % P][0] * isz,
                           blocks[(r + i) % P][1] - blocks[(r + i) % P][0], dt))
                 for i in range(P)])
    plan = _plan(comm, st, ("allreduce", count, dt, ropt), count * isz,
                 ("allreduce", count, dt.str, ropt.value),
                 ("allreduce", count, dt, ropt.value), "allreduce-staged",
                 one_shot_views if one_shot else two_step_views, dt, ropt)
    if plan is None:
        return None
    what, sig, vs, seg, slotted, native = plan
    if native is not None and one_shot:
        keep = recv is recvbuf and (in_place or src is sendbuf)
        entry = _small(st, key if keep else None, K_ALLREDUCE, "allreduce", plan, 0,
                       P if ropt is ReduceOp.AVG else 0)
        return _run_small(comm, st, entry, src, recv, blocking)
    ufunc = UFUNCS[ropt]
    if slotted and one_shot:

        def job():
            v = vs[(st.bar.epoch + 1) & 1]
            v[r][...] = src
            st.bar.check_sigs(st.bar.barrier(sig, what), what)
            # recv is ours alone: reduce straight into it, in rank order (same bits).
            fold_in_rank_order(ufunc, v, recv, ropt, P)
        return _post(comm, st, "allreduce", job, blocking, True)

    def job():
        # Reduced blocks are published at the second barrier: the other slot (or in
        # place in our own staging copy, where nobody else reads our block then).
        whole, mine, acc, outs = (vs[(st.bar.epoch + 1) & 1] if slotted
                                  else two_step_views(seg, 0, 0))
        whole[...] = src
        st.bar.check_sigs(st.bar.barrier(sig, what), what)
        fold_in_rank_order(ufunc, mine, acc, ropt, P)
        st.bar.barrier(0, what)
        for (lo, hi), blk in outs:
            recv[lo:hi] = blk
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "allreduce", job, blocking, slotted)


def staged_bcast(st: SymmState, buf, root: int, blocking: bool = True):
    """``auto`` broadcast of an ordinary array: the root copies it into shared memory;
    after a barrier every other rank copies it out. Above the slots it is pipelined: the
    root publishes its progress chunk by chunk in its control block and the others copy
    each chunk as soon as it is there, while it is still in cache. Where single copy is
    allowed (:func:`.single.wanted`) it is not staged at all: :func:`.single.bcast`."""
    comm = st.comm
    r = comm.rank
    key = (K_BCAST, buf.size, buf.dtype, root) if type(buf) is np.ndarray else None
    entry = st.small.get(key)
    if entry is not None:
        if r == root:
            return _run_small(comm, st, entry, buf, None, blocking)
        return _run_small(comm, st, entry, None, buf, blocking)
    try:
        b = _flat(buf, "buf")
    except InvalidArgument:
        _tell_peers(st, "bcast")
        raise
    dt, n = b.dtype, b.size
    nbytes = n * dt.itemsize
    if single.bcast_wanted(st, nbytes):   # no staging: copied root -> ranks by the kernel
        if blocking and b is buf:         # (the helper runs blocking calls only)
            _keep_fast(st, key, (K_BCAST, "bcast", *single.bcast_sig(n, dt, root), (0, 0),
                                 root, 0), cma=True)
        return single.bcast(comm, st, b, root, blocking)
    plan = _plan(comm, st, ("bcast", n, dt, root), nbytes, ("bcast", n, dt.str, root),
                 ("bcast", n, dt, f"root {root}"), "bcast",
                 lambda seg, off, _: seg.view(root, off, n, dt))
    if plan is None:
        return None
    what, sig, vs, seg, slotted, native = plan
    if native is not None:
        entry = _small(st, key if b is buf else None, K_BCAST, "bcast", plan, root)
        src, dst = (b, None) if r == root else (None, b)
        return _run_small(comm, st, entry, src, dst, blocking)
    # Within the slots one barrier and one copy each beat the pipeline's waits per chunk
    # (same minutes, RT priority, 1 MiB: 4 ranks 248 vs 290-340 us, 2 ranks 76 vs 97 us).
    pipelined = not slotted and nbytes > 2 * BCAST_CHUNK_NBYTES

    def job():
        off = _offset(st, slotted)
        if pipelined:
            st.bar.check_sigs(st.bar.barrier(sig, what), what)
            _pipelined_bcast(st, seg, off, b, root, what)
        else:
            v = vs[(st.bar.epoch + 1) & 1] if slotted else seg.view(root, 0, n, dt)
            if r == root:
                v[...] = b
            st.bar.check_sigs(st.bar.barrier(sig, what), what)
            if r != root:
                b[...] = v
        if not slotted:
            st.bar.barrier(0, what)
    return _post(comm, st, "bcast", job, blocking, slotted)


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
