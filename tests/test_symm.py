"""Symmetric-memory collectives (polycast.runtime.symm) across real processes on one host:
exact allgather, reduce-scatter and allreduce for every op and dtype against
polycast.reference (2, 3 and 4 ranks), in place and under ``auto``; the error paths (a
plain buffer, ranks calling differently, a peer that dies mid-call) and no /dev/shm
leftovers.

This file is also the rank program: ``python tests/test_symm.py --suite all|death``.
"""

from __future__ import annotations

import glob
import os
import sys
import time

import numpy as np

SUITE_OK = "SYMM-SUITE OK"


# -- the rank program ------------------------------------------------------------------------

def _rank_main(suite: str) -> int:
    import polycast
    from polycast.collectives import Collective
    from polycast.errors import (CollectiveTimeout, InvalidArgument, MismatchError, PeerLost,
                                 PolycastError)
    from polycast.reference import DTYPES, make_inputs, reference

    comm = polycast.init()
    P, r = comm.size, comm.rank
    job = comm._driver.world.job_id
    failures: list[str] = []
    checks = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(name)
            print(f"FAIL {name} {detail}", flush=True)

    def leftovers() -> list[str]:
        return glob.glob(f"/dev/shm/polycast-{job}-symm-*")

    if suite == "death":
        x = comm.symm_empty(1000, np.float32)
        out = np.empty(1000 * P, np.float32)
        x[:] = r
        comm.Allgather(x, out, algorithm="symm")       # works while everyone lives
        check("death/before", bool((out.reshape(P, -1) == np.arange(P)[:, None]).all()))
        if r == P - 1:
            os._exit(17)
        t0 = time.monotonic()
        try:
            comm.Allgather(x, out, algorithm="symm")
            check("death/raised", False, "Allgather returned")
        except (PeerLost, CollectiveTimeout) as exc:
            dt = time.monotonic() - t0
            check("death/names-rank", f"rank {P - 1}" in str(exc), str(exc))
            check("death/in-time", dt < comm.timeout_seconds + 1, f"{dt:.1f}s")
            print(f"SYMM-DEATH {type(exc).__name__} after {dt:.2f}s: {exc}", flush=True)
        check("death/no-leftovers", not leftovers(), str(leftovers()))
        print(f"{SUITE_OK if not failures else 'SYMM-SUITE FAILED'} {checks} checks",
              flush=True)
        os._exit(0 if not failures else 1)

    if suite == "hang":
        # The last rank is alive but never calls: the others raise CollectiveTimeout
        # naming it, and the communicator's symm path refuses to go on (epochs disagree).
        x = comm.symm_empty(100, np.float32)
        out = np.empty(100 * P, np.float32)
        if r == P - 1:
            time.sleep(comm.timeout_seconds + 2)
            os._exit(0)
        t0 = time.monotonic()
        try:
            comm.Allgather(x, out, algorithm="symm")
            check("hang/raised", False, "returned")
        except CollectiveTimeout as exc:
            dt = time.monotonic() - t0
            check("hang/names-rank", f"[{P - 1}]" in str(exc), str(exc))
            check("hang/in-time", comm.timeout_seconds - 0.5 < dt < comm.timeout_seconds + 1,
                  f"{dt:.1f}s")
        try:
            comm.Allgather(x, out, algorithm="symm")
            check("hang/unusable", False, "returned")
        except PolycastError as exc:
            check("hang/unusable", "unusable" in str(exc), str(exc))
        print(f"{SUITE_OK if not failures else 'SYMM-SUITE FAILED'} {checks} checks",
              flush=True)
        os._exit(0 if not failures else 1)

    if suite == "alloc-death":
        # The last rank dies right after creating its segment, inside symm_empty: the
        # others raise (bounded) and remove every segment, the dead rank's included.
        import polycast.runtime.symm.segments as segments
        real = segments._open_map

        def dying(path, nbytes, create):
            mm = real(path, nbytes, create)
            if create and r == P - 1 and "-a1-" in path:
                os._exit(17)
            return mm
        segments._open_map = dying
        comm.symm_empty(8, np.float32)                 # the control block: fine
        t0 = time.monotonic()
        try:
            comm.symm_empty(1000, np.float32)
            check("alloc-death/raised", False, "returned")
        except (PeerLost, CollectiveTimeout) as exc:
            check("alloc-death/in-time", time.monotonic() - t0 < comm.timeout_seconds + 1)
            print(f"SYMM-DEATH {type(exc).__name__}: {exc}", flush=True)
        check("alloc-death/no-leftovers", not leftovers(), str(leftovers()))
        print(f"{SUITE_OK if not failures else 'SYMM-SUITE FAILED'} {checks} checks",
              flush=True)
        os._exit(0 if not failures else 1)

    if suite == "auto":
        _auto_suite(comm, check, leftovers)
        print(f"{SUITE_OK if not failures else 'SYMM-SUITE FAILED'} {checks} checks",
              flush=True)
        if failures:
            os._exit(1)
        polycast.finalize()
        return 0

    # Ranks on different hosts (host ids faked on a fresh communicator): symm is refused,
    # naming the requirement, and auto does not pick it.
    import polycast.runtime.symm as symm
    real_host = symm.shared.host_id
    symm.shared.host_id = lambda override="": f"host{r}"
    multi = comm.Dup()
    try:
        multi.symm_empty(4, np.float32)
        check("hosts/raised", False, "returned")
    except InvalidArgument as exc:
        check("hosts/raised", "one host" in str(exc), str(exc))
    symm.shared.host_id = real_host
    try:
        multi.Allgather(np.zeros(2), np.zeros(2 * P), algorithm="symm")
        check("hosts/allgather-raised", False, "returned")
    except InvalidArgument as exc:
        check("hosts/allgather-raised", "one host" in str(exc), str(exc))
    req = multi.Iallgather(np.ones(2), np.zeros(2 * P))
    req.Wait()
    check("hosts/auto-not-symm", "symm" not in req.desc, req.desc)
    multi.Free()

    # A sub-communicator (Split): its own allocations and epochs.
    sub = comm.Split(r % 2)
    s_in = sub.symm_empty(5, np.int64)
    s_in[:] = r
    s_out = np.empty(5 * sub.size, np.int64)
    sub.Allgather(s_in, s_out, algorithm="symm")
    check("split/allgather", np.array_equal(
        s_out, np.repeat(np.arange(r % 2, P, 2), 5)), str(s_out))
    sub.Free()

    # A communicator with no symmetric allocation: symm is refused with the requirement.
    dup = comm.Dup()
    try:
        dup.Allgather(np.zeros(2), np.zeros(2 * P), algorithm="symm")
        check("nosymm/raised", False, "returned")
    except InvalidArgument as exc:
        check("nosymm/raised", "symm_empty" in str(exc), str(exc))
    dup.Free()

    count = 37                       # uneven blocks for allreduce
    for dtype in DTYPES:
        dt = np.dtype(dtype)
        big = comm.symm_empty((P, count), dt)          # reduce-scatter source, P blocks
        one = comm.symm_empty(count, dt)               # allgather source / allreduce
        out = comm.symm_empty(count, dt)               # allreduce destination
        check(f"{dtype}/shape", big.shape == (P, count) and big.dtype == dt)
        # allgather: out of a symmetric sendbuf, and in place
        ins = make_inputs(Collective.ALLGATHER, P, count, dt, seed=1)
        want = reference(Collective.ALLGATHER, ins)[r]
        one[:] = ins[r]
        got = np.full(P * count, 99, dt)
        comm.Allgather(one, got, algorithm="symm")
        check(f"{dtype}/allgather", np.array_equal(got, want))
        big.reshape(-1)[r * count:(r + 1) * count] = ins[r]
        comm.Allgather(polycast.IN_PLACE, big, algorithm="symm")
        check(f"{dtype}/allgather-inplace", np.array_equal(big.reshape(-1), want))
        req = comm.Iallgather(one, got)                 # auto picks symm for symm buffers
        req.Wait()
        check(f"{dtype}/allgather-auto", np.array_equal(got, want) and "symm" in req.desc,
              req.desc)
        big[:] = 99                                     # plain sendbuf, symmetric recvbuf
        req = comm.Iallgather(ins[r].copy(), big)
        req.Wait()
        check(f"{dtype}/allgather-symm-recv", np.array_equal(big.reshape(-1), want)
              and "symm" in req.desc, req.desc)
        for op in ("sum", "prod", "min", "max", "avg"):
            ins = make_inputs(Collective.REDUCE_SCATTER, P, count, dt, seed=2, op=op)
            want = reference(Collective.REDUCE_SCATTER, ins, op=op)[r]
            big.reshape(-1)[:] = ins[r]
            got = np.full(count, 99, dt)
            comm.Reduce_scatter_block(big, got, op=op, algorithm="symm")
            check(f"{dtype}/{op}/reduce_scatter", np.array_equal(got, want),
                  f"{got[:6]} vs {want[:6]}")
            big.reshape(-1)[:] = ins[r]
            comm.Reduce_scatter_block(polycast.IN_PLACE, big, op=op, algorithm="symm")
            check(f"{dtype}/{op}/reduce_scatter-inplace",
                  np.array_equal(big.reshape(-1)[:count], want))
            ins = make_inputs(Collective.ALLREDUCE, P, count, dt, seed=3, op=op)
            want = reference(Collective.ALLREDUCE, ins, op=op)[r]
            one[:] = ins[r]
            out[:] = 99
            comm.Allreduce(one, out, op=op, algorithm="symm")
            check(f"{dtype}/{op}/allreduce", np.array_equal(out, want))
            out[:] = ins[r]
            comm.Allreduce(polycast.IN_PLACE, out, op=op, algorithm="symm")
            check(f"{dtype}/{op}/allreduce-inplace", np.array_equal(out, want))
            out[:] = 99
            req = comm.Iallreduce(ins[r].copy(), out, op=op)   # plain sendbuf, auto
            req.Wait()
            check(f"{dtype}/{op}/allreduce-plainsend", np.array_equal(out, want)
                  and "symm" in req.desc, req.desc)

    # A bigger call (several MiB) to see real data movement, against numpy.
    n = 1 << 18
    src = comm.symm_empty(n, np.float32)
    src[:] = np.arange(n, dtype=np.float32) % 251 + r
    got = np.empty(P * n, np.float32)
    comm.Allgather(src, got, algorithm="symm")
    want = np.concatenate([np.arange(n, dtype=np.float32) % 251 + p for p in range(P)])
    check("big/allgather", np.array_equal(got, want))
    part = np.empty(n // P, np.float32)
    comm.Reduce_scatter_block(src[:P * (n // P)], part, algorithm="symm")
    base = np.arange(n, dtype=np.float32) % 251
    blk = slice(r * (n // P), (r + 1) * (n // P))
    check("big/reduce_scatter", np.array_equal(part, P * base[blk] + sum(range(P))))

    # Error paths. Every rank passes a plain array: each raises InvalidArgument, naming
    # the requirement.
    try:
        comm.Allgather(np.zeros(4, np.float32), np.zeros(4 * P, np.float32),
                       algorithm="symm")
        check("plain/raised", False, "returned")
    except InvalidArgument as exc:
        check("plain/raised", "symm_empty" in str(exc), str(exc))
    # One rank passes a plain array: it raises InvalidArgument, the others MismatchError
    # (at once, not at the timeout).
    a = comm.symm_empty(4, np.float32)
    t0 = time.monotonic()
    try:
        comm.Allgather(np.zeros(4, np.float32) if r == 0 else a,
                       np.zeros(4 * P, np.float32), algorithm="symm")
        check("oneplain/raised", False, "returned")
    except (InvalidArgument, MismatchError) as exc:
        kind = InvalidArgument if r == 0 else MismatchError
        check("oneplain/raised", type(exc) is kind and "symm" in str(exc),
              f"{type(exc).__name__}: {exc}")
        check("oneplain/fast", time.monotonic() - t0 < 5, f"{time.monotonic() - t0:.1f}s")
    # One rank's arguments are wrong (recvbuf size): it raises InvalidArgument, the
    # others MismatchError at once.
    t0 = time.monotonic()
    try:
        comm.Allgather(a, np.zeros(4 * P + (r == P - 1), np.float32), algorithm="symm")
        check("onebad/raised", False, "returned")
    except (InvalidArgument, MismatchError) as exc:
        kind = InvalidArgument if r == P - 1 else MismatchError
        check("onebad/raised", type(exc) is kind, f"{type(exc).__name__}: {exc}")
        check("onebad/fast", time.monotonic() - t0 < 5, f"{time.monotonic() - t0:.1f}s")
    # Ranks calling with different sizes: every rank raises MismatchError.
    big = comm.symm_empty(8, np.float32)
    try:
        k = 2 if r == 0 else 1
        comm.Allgather(big[:k], np.zeros(k * P, np.float32), algorithm="symm")
        check("mismatch/raised", False, "returned")
    except MismatchError as exc:
        check("mismatch/raised", "differently" in str(exc), str(exc))
    # Different shapes to symm_empty: MismatchError everywhere, nothing left in /dev/shm.
    try:
        comm.symm_empty(4 + (r == 1), np.float32)
        check("alloc-mismatch/raised", False, "returned")
    except MismatchError as exc:
        check("alloc-mismatch/raised", "same shape" in str(exc), str(exc))
    # The communicator still works after the errors (epochs stayed in step).
    a[:] = r
    got = np.empty(4 * P, np.float32)
    comm.Allgather(a, got, algorithm="symm")
    check("after-errors/allgather", np.array_equal(got, np.repeat(np.arange(P), 4)))
    # Bad arguments.
    try:
        comm.symm_empty((-1, 2), np.float32)
        check("badshape/raised", False, "returned")
    except InvalidArgument:
        check("badshape/raised", True)
    try:
        comm.Allgather(a, np.zeros(4 * P + 1, np.float32), algorithm="symm")
        check("badsize/raised", False, "returned")
    except InvalidArgument as exc:
        check("badsize/raised", "multiple" in str(exc), str(exc))

    check("no-leftovers", not leftovers(), str(leftovers()))
    comm.Barrier()
    print(f"{SUITE_OK if not failures else 'SYMM-SUITE FAILED'} {checks} checks", flush=True)
    if failures:
        os._exit(1)
    polycast.finalize()
    return 0


def _auto_suite(comm, check, leftovers) -> None:
    """``auto`` with ordinary arrays on one host: the staged symm path (exact results,
    in place, growth of the staging buffer, mismatches, the escape hatch, other hosts)."""
    import polycast
    import polycast.runtime.symm as symm
    from polycast.collectives import Collective
    from polycast.errors import MismatchError
    from polycast.reference import make_inputs, reference

    P, r = comm.size, comm.rank
    sizes = []
    # Small slots, so that the counts below take both forms: calls up to 1 KiB per rank
    # in the two alternating slots (one barrier), larger ones in the staging segment.
    st = comm._dispatch.symm_state(create=True)
    check("auto/slots-not-yet", st.slots is None)
    st.slot_nbytes = 1024
    # Above the slots, allgather reads peers' arrays single-copy where the rings' probes
    # said every rank may (the cma=0 test hook: never; then it stages like the rest).
    from polycast.runtime.transport import cma
    world = comm._driver.world
    may = cma.disabled_reason(None, comm.config.hooks.cma) is None \
        and not world.single_copy_refused
    check("auto/single-copy-as-probed", st.single_copy == may,
          f"single_copy={st.single_copy}, this rank may read its peers: {may}")
    if not comm.config.hooks.cma:
        check("auto/single-copy-off", not st.single_copy)

    def stage_nbytes() -> int:
        st = comm._dispatch.symm
        return st.stage.nbytes if st is not None and st.stage is not None else 0

    # Increasing counts: 0 and 1 element, non-powers of two, and allreduce above
    # ONE_SHOT_MAX_NBYTES (the reduce-scatter + allgather form).
    # Small shapes run three times with new data: a repeated call takes the compiled
    # helper's kept entry (staged._small) straight from the comm layer's arrays.
    for count in (0, 1, 5, 37, 1000, 20001):
        for dtype, rep in [(d, k) for d in ("float32", "int64", "uint8", "float16")
                           for k in range(3 if count in (1, 37) else 1)]:
            dt = np.dtype(dtype)
            tag = f"auto/{dtype}/{count}/{rep}"
            ins = make_inputs(Collective.ALLGATHER, P, count, dt, seed=4 + 10 * rep)
            want = reference(Collective.ALLGATHER, ins)[r]
            got = np.full(P * count, 99, dt)
            req = comm.Iallgather(ins[r].copy(), got)
            req.Wait()
            check(f"{tag}/allgather", np.array_equal(got, want) and "symm" in req.desc,
                  req.desc)
            got[:] = 99
            got[r * count:(r + 1) * count] = ins[r]
            comm.Allgather(polycast.IN_PLACE, got)
            check(f"{tag}/allgather-inplace", np.array_equal(got, want))
            root = count % P
            ins = make_inputs(Collective.BROADCAST, P, count, dt, root=root,
                              seed=5 + 10 * rep)
            want = reference(Collective.BROADCAST, ins, root=root)[r]
            buf = ins[r].copy() if r == root else np.full(count, 99, dt)
            req = comm.Ibcast(buf, root)
            req.Wait()
            check(f"{tag}/bcast", np.array_equal(buf, want) and "symm" in req.desc, req.desc)
            for op in ("sum", "max", "avg"):
                ins = make_inputs(Collective.REDUCE_SCATTER, P, count, dt, seed=6 + 10 * rep,
                                  op=op)
                want = reference(Collective.REDUCE_SCATTER, ins, op=op)[r]
                got = np.full(count, 99, dt)
                req = comm.Ireduce_scatter_block(ins[r].copy(), got, op=op)
                req.Wait()
                check(f"{tag}/{op}/reduce_scatter", np.array_equal(got, want)
                      and "symm" in req.desc, req.desc)
                inout = ins[r].copy()
                comm.Reduce_scatter_block(polycast.IN_PLACE, inout, op=op)
                check(f"{tag}/{op}/reduce_scatter-inplace",
                      np.array_equal(inout[:count], want))
                ins = make_inputs(Collective.ALLREDUCE, P, count, dt, seed=7 + 10 * rep,
                                  op=op)
                want = reference(Collective.ALLREDUCE, ins, op=op)[r]
                got = np.full(count, 99, dt)
                req = comm.Iallreduce(ins[r].copy(), got, op=op)
                req.Wait()
                check(f"{tag}/{op}/allreduce", np.array_equal(got, want)
                      and "symm" in req.desc, req.desc)
                inout = ins[r].copy()
                comm.Allreduce(polycast.IN_PLACE, inout, op=op)
                check(f"{tag}/{op}/allreduce-inplace", np.array_equal(inout, want))
        sizes.append(stage_nbytes())
    st = comm._dispatch.symm
    check("auto/small-kept", bool(st.small) == (st.bar.native is not None),
          f"{len(st.small)} kept, compiled helper {st.bar.native is not None}")
    # The staging buffer grew with the calls, to powers of two covering the largest one,
    # and only the newest is mapped (the old ones were freed), beside the small
    # allreduces' two slots.
    # (reduce-scatter of int64.) With single copy every collective above the slots reads
    # (or writes) the peers' arrays and nothing stages: the buffer never grows.
    need = 20001 * 8 * P
    if comm._dispatch.symm.single_copy:
        check("auto/single-copy-no-growth", len(set(sizes)) == 1 and sizes[0] < need,
              str(sizes))
    else:
        check("auto/grew", sizes == sorted(sizes) and sizes[0] < sizes[-1], str(sizes))
        check("auto/grew-pow2", sizes[-1] >= need and sizes[-1] & (sizes[-1] - 1) == 0
              and sizes[-1] < 2 * need, f"{sizes[-1]} for {need}")
    st = comm._dispatch.symm
    check("auto/one-stage", st.stage in st.segments and st.slots in st.segments
          and len(st.segments) == 2, str(len(st.segments)))

    # Ranks passing different sizes: every rank raises MismatchError, whether the sizes fit
    # the staging buffer or one rank would have to grow it; the communicator goes on.
    for what, k in (("fits", 3 + (r == 0)), ("grows", 3 if r else 1 << 22)):
        for name, call in (
                ("allreduce", lambda: comm.Allreduce(np.ones(k), np.empty(k))),
                ("allgather", lambda: comm.Allgather(np.ones(k), np.empty(k * P))),
                ("reduce_scatter",
                 lambda: comm.Reduce_scatter_block(np.ones(k * P), np.empty(k))),
                ("bcast", lambda: comm.Bcast(np.ones(k), 0))):
            t0 = time.monotonic()
            try:
                call()
                check(f"mismatch-{what}/{name}", False, "returned")
            except MismatchError as exc:
                check(f"mismatch-{what}/{name}", "differently" in str(exc), str(exc))
                check(f"mismatch-{what}/{name}/fast", time.monotonic() - t0 < 5,
                      f"{time.monotonic() - t0:.1f}s")
    out = np.empty(P)
    comm.Allgather(np.array([float(r)]), out)
    check("mismatch/after", np.array_equal(out, np.arange(P, dtype=float)), str(out))
    check("mismatch/no-growth", stage_nbytes() == sizes[-1], str(stage_nbytes()))

    # A broadcast big enough to be pipelined chunk by chunk (a partial last chunk), where
    # single copy is off; where it is allowed, not staged at all: the root writes the last
    # k // P elements of every other rank's buffer while they read the rest (P does not
    # divide k). Counted, so a call that quietly took the pipeline fails here.
    from polycast.runtime.symm import BCAST_CHUNK_NBYTES
    st = comm._dispatch.symm
    k = 3 * BCAST_CHUNK_NBYTES // 8 + 7
    for root, rep in ((P - 1, 0), (0, 1)):
        want = np.arange(k, dtype=np.int64) * 3 + 1 + rep
        buf = want.copy() if r == root else np.zeros(k, np.int64)
        took = st.single_copy_calls["bcast"]
        if rep:
            comm.Bcast(buf, root)
            desc = "symm"
        else:
            req = comm.Ibcast(buf, root)
            req.Wait()
            desc = req.desc
        took = st.single_copy_calls["bcast"] - took
        check(f"auto/bcast-large/{root}", np.array_equal(buf, want) and "symm" in desc,
              desc)
        check(f"auto/bcast-large/{root}/form", took == int(st.single_copy),
              f"{took} single-copy calls, single_copy={st.single_copy}")
    # Ranks naming different roots: every rank raises MismatchError before any copy (the
    # root would write into the others' buffers), and nobody's buffer changed.
    mine = np.full(k, 10.0 + r)
    buf = mine.copy()
    try:
        comm.Bcast(buf, 0 if r == 0 else P - 1)
        check("mismatch-root/bcast-large", False, "returned")
    except MismatchError as exc:
        check("mismatch-root/bcast-large", "differently" in str(exc), str(exc))
    check("mismatch-root/bcast-large/untouched", np.array_equal(buf, mine))
    # A rank whose C library lacks process_vm_writev (faked on rank 1, the root, while a
    # fresh communicator makes its symm state): every rank agrees the broadcast cannot
    # write, and it stages instead, on every rank alike (no mismatch, no hang, exact).
    from polycast.runtime.transport import cma as cma_mod
    real_writev = cma_mod._writev
    if r == 1 % P:
        cma_mod._writev = None
    nowrite = comm.Dup()
    try:
        want = np.arange(k, dtype=np.int64) * 5 - 3
        buf = want.copy() if r == 1 % P else np.zeros(k, np.int64)
        nowrite.Bcast(buf, 1 % P)             # the rank that cannot write is the root
    finally:
        cma_mod._writev = real_writev
    buf2 = want.copy() if r == 1 % P else np.zeros(k, np.int64)
    nowrite.Bcast(buf2, 1 % P)
    st2 = nowrite._dispatch.symm
    check("no-writev/agreed", st2 is not None and not st2.single_copy_writes
          and st2.single_copy_calls["bcast"] == 0 or P == 1,
          f"writes={getattr(st2, 'single_copy_writes', None)}")
    check("no-writev/bcast", np.array_equal(buf, want) and np.array_equal(buf2, want))
    nowrite.Free()

    # POLYCAST_SYMM=0 (a communicator made with it): the engine's schedules, same results.
    from test_runtime_helpers import with_config
    off = with_config(comm, symm=False)
    got = np.empty(3)
    req = off.Iallreduce(np.full(3, r + 1.0), got)
    req.Wait()
    check("env-off/allreduce", "symm" not in req.desc
          and np.array_equal(got, np.full(3, P * (P + 1) / 2)), req.desc)
    got = np.empty(2 * P)
    req = off.Iallgather(np.full(2, float(r)), got)
    req.Wait()
    check("env-off/allgather", "symm" not in req.desc
          and np.array_equal(got, np.repeat(np.arange(P, dtype=float), 2)), req.desc)
    off.Free()
    # An explicit algorithm name is the engine's schedule, as before.
    req = comm.Iallreduce(np.full(3, r + 1.0), got[:3], algorithm="ring")
    req.Wait()
    check("explicit/ring", "symm" not in req.desc, req.desc)

    # Ranks on different hosts (host ids faked for a fresh communicator): the first auto
    # call finds out and every call takes the engine.
    real_host = symm.shared.host_id
    symm.shared.host_id = lambda override="": f"host{r}"
    multi = comm.Dup()
    try:
        got = np.empty(2 * P)
        req = multi.Iallgather(np.full(2, float(r)), got)
        req.Wait()
    finally:
        symm.shared.host_id = real_host
    check("hosts/auto-engine", "symm" not in req.desc
          and np.array_equal(got, np.repeat(np.arange(P, dtype=float), 2)), req.desc)
    got = np.empty(1)
    req = multi.Iallreduce(np.ones(1), got)
    req.Wait()
    check("hosts/auto-engine-again", "symm" not in req.desc and got[0] == P, req.desc)
    multi.Free()
    check("auto/no-leftovers", not leftovers(), str(leftovers()))
    comm.Barrier()


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[sys.argv.index("--suite") + 1]))


# -- the tests (pytest) ------------------------------------------------------------------------

import pytest  # noqa: E402

from test_runtime_helpers import spawn_ranks  # noqa: E402

HERE = os.path.relpath(os.path.abspath(__file__), os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _symm_files() -> set[str]:
    # Only this pytest process's jobs (spawn_ranks names them t<pid><port>): other
    # polycast jobs on the machine make symm segments too (auto does, on one host).
    return set(glob.glob(f"/dev/shm/polycast-t{os.getpid()}*-symm-*"))


@pytest.mark.parametrize("nranks,transport", [(2, "auto"), (3, "auto"), (4, "auto"),
                                               (3, "tcp")])
def test_symm_collectives_exact(nranks, transport):
    """Symmetric memory does not depend on the transport between the ranks (the
    allocation's reports and dead-peer detection travel over it)."""
    before = _symm_files()
    results = spawn_ranks(nranks, [HERE, "--suite", "all"],
                          env={"POLYCAST_TIMEOUT": "20", "POLYCAST_TRANSPORT": transport},
                          timeout=120)
    for res in results:
        assert res.returncode == 0 and SUITE_OK in res.out, (
            f"rank {res.rank} exit {res.returncode}\n{res.out[-3000:]}\n{res.err[-3000:]}")
        n = int(res.out.split(SUITE_OK)[1].split()[0])
        assert n > 7 * 5 * 5, res.out[-500:]           # every dtype x op x variant ran
    assert _symm_files() - before == set()


def test_symm_peer_dying_inside_alloc_leaves_nothing():
    before = _symm_files()
    results = spawn_ranks(3, [HERE, "--suite", "alloc-death"], env={"POLYCAST_TIMEOUT": "8"},
                          timeout=60)
    assert results[2].returncode == 17
    for res in results[:2]:
        assert res.returncode == 0 and SUITE_OK in res.out and "SYMM-DEATH" in res.out, (
            f"rank {res.rank}\n{res.out[-3000:]}\n{res.err[-3000:]}")
    assert _symm_files() - before == set()


def test_symm_silent_peer_times_out():
    results = spawn_ranks(3, [HERE, "--suite", "hang"], env={"POLYCAST_TIMEOUT": "2"},
                          timeout=60)
    for res in results:
        assert res.returncode == 0, f"rank {res.rank}\n{res.out[-3000:]}\n{res.err[-3000:]}"
    for res in results[:2]:
        assert SUITE_OK in res.out, res.out


def test_symm_dead_peer_raises_in_time():
    before = _symm_files()
    results = spawn_ranks(3, [HERE, "--suite", "death"], env={"POLYCAST_TIMEOUT": "8"},
                          timeout=60)
    assert results[2].returncode == 17
    for res in results[:2]:
        assert res.returncode == 0 and SUITE_OK in res.out, (
            f"rank {res.rank}\n{res.out[-3000:]}\n{res.err[-3000:]}")
        assert "SYMM-DEATH" in res.out and "rank 2" in res.out, res.out
    assert _symm_files() - before == set()


def _symm_first_profile(path) -> str:
    """A calibration profile in which symmetric memory costs nothing, so the planner sends
    every ``auto`` call it can there (the suite checks the staged path itself)."""
    from polycast.planner import profile
    zero = {c: {"4": [0.0, 0.0]} for c in ("allgather", "reduce_scatter", "allreduce",
                                          "broadcast")}
    return profile.save({"links": profile.BUILTIN_LINKS, "symm": zero}, str(path))


def _needs_symm_native():
    from polycast.runtime.symm import barrier
    return pytest.mark.skipif(barrier.compiled is None, reason="compiled symm helper not in "
                              f"use: {barrier.compiled_why_not}")


# native: "1" the compiled barrier and small calls where built, "0" the Python fallback on
# every rank (the native=0 test hook), "mixed" the fallback on rank 1 only (same layout).
@pytest.mark.parametrize("nranks,single_copy,native", [
    (2, "1", "1"), (3, "1", "1"), (4, "1", "1"), (3, "0", "1"), (3, "1", "0"),
    pytest.param(3, "1", "mixed", marks=_needs_symm_native())])
def test_symm_auto_staged_plain_arrays(nranks, single_copy, native, tmp_path):
    """``auto`` on one host runs ordinary arrays through a staging symmetric buffer (large
    allgathers single-copy, unless the cma=0 test hook), with the compiled helper, without,
    and with one rank without it."""
    before = _symm_files()
    prof = _symm_first_profile(tmp_path / "profile.json")
    results = spawn_ranks(nranks, [HERE, "--suite", "auto"],
                          env={"POLYCAST_TIMEOUT": "20", "POLYCAST_PROFILE": prof,
                               "POLYCAST_TEST_HOOKS":
                                   f"cma={single_copy},native={int(native != '0')}"},
                          per_rank={1: {"POLYCAST_TEST_HOOKS": f"cma={single_copy},native=0"}}
                          if native == "mixed" else None,
                          timeout=120)
    for res in results:
        assert res.returncode == 0 and SUITE_OK in res.out, (
            f"rank {res.rank} exit {res.returncode}\n{res.out[-3000:]}\n{res.err[-3000:]}")
        n = int(res.out.split(SUITE_OK)[1].split()[0])
        assert n > 6 * 4 * 3 * 4, res.out[-500:]          # every size x dtype x op ran
    assert _symm_files() - before == set()
