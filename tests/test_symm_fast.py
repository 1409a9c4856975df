"""The one-call fast path of a repeated small ``auto`` Allreduce / Bcast / Allgather /
Reduce_scatter_block (and their I-variants) on one host (Comm.Allreduce... -> the compiled
symm helper's Barrier.allreduce..., _symm.c): it runs the calls it keeps (counted by the
helper: ``stats()["fast"]``), refuses everything else to the Python path (an ndarray
subclass, another dtype, size, op, root or in-place form, op objects, an explicit
algorithm, POLYCAST_SYMM / POLYCAST_<COLL>_ALGO set, a queued non-blocking call, in-place
allgather, symm_empty arrays), and a rank that calls differently while
its peers take it makes EVERY rank raise (MismatchError, or InvalidArgument on the rank
whose arguments are bad), never a hang or wrong data. Waits stay bounded (a silent or dead
peer: CollectiveTimeout / PeerLost naming it). Runs compiled, with the Python fallback on
every rank (the native=0 test hook: never armed) and mixed (rank 1 Python).

Run as a rank: ``python tests/test_symm_fast.py --suite fast|hang|death``."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

SUITE_OK = "FAST-SUITE OK"


def _armed(comm) -> bool:
    """Whether the compiled helper keeps this communicator's repeated calls (its dispatch
    hands calls to it first)."""
    st = comm._dispatch.symm
    return st is not None and st.bar.fast is not None


def _rank_main(suite: str) -> int:
    import polycast
    from polycast import IN_PLACE, ReduceOp
    from polycast.errors import (CollectiveTimeout, InvalidArgument, MismatchError, PeerLost,
                                 PolycastError)
    from polycast.runtime.symm import barrier as B

    comm = polycast.init()
    P, r = comm.size, comm.rank
    failures: list[str] = []
    checks = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(name)
            print(f"FAIL {name} {detail}", flush=True)

    def uses() -> int:
        return B.compiled.stats()["fast"] if B.compiled is not None else 0

    native = comm.config.hooks.native and B.compiled is not None

    def counted(name: str, before: int, n: int) -> None:
        """This rank's fast path ran exactly n calls since ``before`` (none in Python)."""
        got = uses() - before
        check(name, got == (n if native else 0), f"fast calls {got}, want "
              f"{n if native else 0}")

    s = np.empty(2, np.float32)
    d = np.empty(2, np.float32)

    def expect(i):
        return np.array([sum(i + q for q in range(P)), sum(i * q for q in range(P))],
                        np.float32)

    def allreduce(i, send=None, recv=None, comm=comm, **kw):
        send = s if send is None else send
        recv = d if recv is None else recv
        send[...] = (i + r, i * r)
        comm.Allreduce(send, recv, **kw)
        return np.array_equal(recv, expect(i))

    # The first call of a shape takes the Python path and keeps it; the rest are one call.
    ok = all(allreduce(i) for i in range(40))
    check("fast/allreduce-exact", ok)
    check("fast/armed", _armed(comm) == native)
    before = uses()
    ok = all(allreduce(i) for i in range(40, 90))
    check("fast/allreduce-exact-fast", ok)
    counted("fast/allreduce-counted", before, 50)

    b = np.zeros(3, np.int64)
    for i in range(20):
        b[...] = i if r == 1 else -1
        comm.Bcast(b, 1)
    before = uses()
    ok = True
    for i in range(30):
        b[...] = 1000 + i if r == 1 else -1
        comm.Bcast(b, 1)
        ok &= bool((b == 1000 + i).all())
    check("fast/bcast-exact", ok)
    counted("fast/bcast-counted", before, 30)

    # Allgather and Reduce_scatter_block (not in place; in place keeps the Python path).
    g_s, g_r = np.empty(2, np.int32), np.empty(2 * P, np.int32)
    rs_s, rs_r = np.empty(3 * P, np.float64), np.empty(3, np.float64)

    def gather_scatter(i):
        g_s[...] = (i, r)
        comm.Allgather(g_s, g_r)
        ok = np.array_equal(g_r, np.array([(i, q) for q in range(P)], np.int32).ravel())
        rs_s[...] = np.arange(3 * P) * (r + 1) + i
        comm.Reduce_scatter_block(rs_s, rs_r)
        want = sum(np.arange(3 * P, dtype=np.float64) * (q + 1) + i for q in range(P))
        return ok and np.array_equal(rs_r, want[3 * r:3 * r + 3])
    check("fast/gather-scatter-first", all(gather_scatter(i) for i in range(3)))
    before = uses()
    check("fast/gather-scatter-exact", all(gather_scatter(i) for i in range(3, 23)))
    counted("fast/gather-scatter-counted", before, 40)
    before = uses()
    inplace = np.empty(2 * P, np.int32)
    for i in range(3):
        inplace[2 * r:2 * r + 2] = (i, r)
        comm.Allgather(IN_PLACE, inplace)
        check("refuse/allgather-in-place-exact", np.array_equal(
            inplace, np.array([(i, q) for q in range(P)], np.int32).ravel()), str(inplace))
    counted("refuse/allgather-in-place", before, 0)

    # In place (IN_PLACE, and the same array as both buffers): kept apart, exact.
    x = np.empty(2, np.float32)
    for i in range(3):
        x[...] = (i + r, i * r)
        comm.Allreduce(IN_PLACE, x)
        check("fast/in-place", np.array_equal(x, expect(i)), str(x))
        x[...] = (i + r, i * r)
        comm.Allreduce(x, x)
        check("fast/aliased", np.array_equal(x, expect(i)), str(x))

    # Refused to the Python path (this rank's count does not move), results exact.
    class Sub(np.ndarray):
        pass
    before = uses()
    check("refuse/ndarray-subclass", allreduce(7, recv=np.empty(2, np.float32).view(Sub)))
    check("refuse/op-object", allreduce(8, op=ReduceOp.SUM))
    check("refuse/explicit-algorithm", allreduce(9, algorithm="ring"))
    from test_runtime_helpers import with_config        # a communicator made with them
    for var, changes in (("POLYCAST_ALLREDUCE_ALGO", {"algorithms": {"allreduce": "ring"}}),
                         ("POLYCAST_SYMM", {"symm": False})):
        other = with_config(comm, **changes)
        check(f"refuse/{var}", allreduce(10, comm=other))
        other.Free()
    counted("refuse/none-counted", before, 0)
    check("refuse/then-fast-again", allreduce(11))
    counted("refuse/fast-again", before, 1)

    # A queued non-blocking call goes first: the blocking one behind it waits its turn.
    s2, d2 = np.empty(2, np.float32), np.empty(2, np.float32)
    s2[...] = (20 + r, 20 * r)
    req = comm.Iallreduce(s2, d2)
    check("queue/blocking-after", allreduce(21))
    req.Wait()
    check("queue/nonblocking-first", np.array_equal(d2, expect(20)), str(d2))

    # The I-variants take it too: done at once when the peers are there within a short
    # spin, else the rest is queued (a late peer here), and Waits in any order are exact.
    before = uses()
    reqs, outs = [], []
    for i in range(50, 60):
        si, di = np.array([i + r, i * r], np.float32), np.empty(2, np.float32)
        if i == 55 and r == P - 1:
            time.sleep(0.05)            # the others' posts find it missing: pending
        reqs.append(comm.Iallreduce(si, di))
        outs.append(di)
    for k in range(len(reqs) - 1, -1, -1):
        reqs[k].Wait()
    check("nonblocking/exact", all(np.array_equal(o, expect(50 + k))
                                   for k, o in enumerate(outs)), str(outs))
    # (each post that finds no call pending or queued, and the run lock free, takes it;
    # after a pending one the posts behind it queue in Python: how many take it depends on
    # when the late rank came and when the worker let go of the lock; the waited loop
    # below counts)
    got = uses() - before
    check("nonblocking/counted", got <= 10 if native else got == 0, f"{got}")
    before = uses()
    for i in range(61, 70):
        si = np.array([i + r, i * r], np.float32)
        comm.Iallreduce(si, d).Wait()
        check("nonblocking/exact-waited", np.array_equal(d, expect(i)), str(d))
        b[...] = i if r == 1 else -1
        comm.Ibcast(b, 1).Wait()
        check("nonblocking/bcast-exact", bool((b == i).all()), str(b))
    # (a post may find the worker still letting go of the run lock after finishing the
    # previous pending call: that one takes the Python path)
    got = uses() - before
    check("nonblocking/waited-counted", 9 <= got <= 18 if native else got == 0, f"{got}")

    # Ranks that call differently while the others take the fast path: every rank raises.
    def every_rank_raises(name, fn, want):
        try:
            fn()
            check(name, False, "returned")
        except want as exc:
            check(name, True)
            return exc
        except PolycastError as exc:
            check(name, False, repr(exc))

    wide64 = np.empty(2, np.float64)
    every_rank_raises("mismatch/dtype",
                      lambda: allreduce(30, send=wide64 if r == 0 else None,
                                        recv=np.empty(2, np.float64) if r == 0 else None),
                      MismatchError)
    check("mismatch/dtype-then-exact", allreduce(31))
    three = np.empty(3, np.float32)
    every_rank_raises("mismatch/size",
                      lambda: comm.Allreduce(three if r == P - 1 else s,
                                             np.empty(3, np.float32) if r == P - 1 else d),
                      MismatchError)
    check("mismatch/size-then-exact", allreduce(32))
    wide = np.empty(4, np.float32)
    every_rank_raises("mismatch/non-contiguous-on-one-rank",
                      lambda: comm.Allreduce(s, wide[::2] if r == 0 else d),
                      InvalidArgument if r == 0 else MismatchError)
    ro = np.empty(2, np.float32)
    ro.flags.writeable = False
    every_rank_raises("mismatch/bad-arguments-on-one-rank",
                      lambda: comm.Allreduce(s, ro if r == 0 else d),
                      InvalidArgument if r == 0 else MismatchError)
    check("mismatch/bad-arguments-then-exact", allreduce(33))
    every_rank_raises("mismatch/nonblocking-size",
                      lambda: comm.Iallreduce(three if r == P - 1 else s,
                                              np.empty(3, np.float32) if r == P - 1 else d
                                              ).Wait(), MismatchError)
    check("mismatch/nonblocking-then-exact", allreduce(34))
    every_rank_raises("mismatch/allgather-size",
                      lambda: comm.Allgather(g_s[:1] if r == 0 else g_s,
                                             g_r[:P] if r == 0 else g_r), MismatchError)
    check("mismatch/allgather-then-exact", gather_scatter(50))
    every_rank_raises("mismatch/reduce-scatter-op",
                      lambda: comm.Reduce_scatter_block(rs_s, rs_r, "max" if r == 1 else
                                                        "sum"), MismatchError)
    check("mismatch/reduce-scatter-then-exact", gather_scatter(51))
    every_rank_raises("mismatch/bcast-root",
                      lambda: comm.Bcast(b, 0 if r == 0 else 1), MismatchError)
    b[...] = 5 if r == 1 else -1
    comm.Bcast(b, 1)
    check("mismatch/bcast-then-exact", bool((b == 5).all()), str(b))

    # Symmetric arrays of the user's own: calls route by buffer, so no more fast path.
    y = comm.symm_empty(2, np.float32)
    check("symm_empty/disarms", not _armed(comm))
    before = uses()
    check("symm_empty/exact", allreduce(40) and allreduce(41, recv=y))
    counted("symm_empty/none-counted", before, 0)

    if suite in ("hang", "death"):
        comm2 = comm.Dup()
        s3, d3 = np.ones(2, np.float32), np.empty(2, np.float32)
        for _ in range(5):
            comm2.Allreduce(s3, d3)
        check(f"{suite}/armed", _armed(comm2) == native)
        if r == P - 1:
            if suite == "death":
                os._exit(17)
            time.sleep(comm.timeout_seconds + 2)
            os._exit(0)
        t0 = time.monotonic()
        want = CollectiveTimeout if suite == "hang" else (PeerLost, CollectiveTimeout)
        exc = every_rank_raises(f"{suite}/raised", lambda: comm2.Allreduce(s3, d3), want)
        dt = time.monotonic() - t0
        check(f"{suite}/names-rank", exc is not None and f"{P - 1}" in str(exc), str(exc))
        check(f"{suite}/in-time", dt < comm.timeout_seconds + 1.5, f"{dt:.1f}s")
        check(f"{suite}/disarmed", not _armed(comm2))
        print(f"{SUITE_OK if not failures else 'FAST-SUITE FAILED'} {checks} checks",
              flush=True)
        os._exit(0 if not failures else 1)

    print(f"{SUITE_OK if not failures else 'FAST-SUITE FAILED'} {checks} checks", flush=True)
    if failures:
        os._exit(1)
    polycast.finalize()
    return 0


if __name__ == "__main__" and "--suite" in sys.argv:
    sys.exit(_rank_main(sys.argv[sys.argv.index("--suite") + 1]))


# -- the tests (pytest) ------------------------------------------------------------------------

import pytest  # noqa: E402

from test_runtime_helpers import spawn_ranks  # noqa: E402

HERE = os.path.relpath(os.path.abspath(__file__), os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _needs_symm_native():
    from polycast.runtime.symm import barrier
    return pytest.mark.skipif(barrier.compiled is None, reason="compiled symm helper not in "
                              f"use: {barrier.compiled_why_not}")


def _profile(tmp_path) -> str:
    """A calibration profile in which symmetric memory costs nothing: every auto call
    the symm path can take goes there (as on this machine at these sizes)."""
    from polycast.planner import profile
    zero = {c: {"4": [0.0, 0.0]} for c in ("allgather", "reduce_scatter", "allreduce",
                                          "broadcast")}
    return profile.save({"links": profile.BUILTIN_LINKS, "symm": zero},
                        str(tmp_path / "profile.json"))


def _run(nranks, suite, tmp_path, native="1", timeout_s="10", script=HERE):
    """``script --suite suite`` as ``nranks`` ranks (``native`` "mixed": rank 1 in Python)."""
    results = spawn_ranks(nranks, [script, "--suite", suite],
                          env={"POLYCAST_TIMEOUT": timeout_s, "POLYCAST_PROFILE": _profile(
                              tmp_path), "POLYCAST_TEST_HOOKS": f"native={int(native != '0')}"},
                          per_rank={1: {"POLYCAST_TEST_HOOKS": "native=0"}} if native == "mixed"
                          else None,
                          timeout=120)
    return results


def _ok(res) -> None:
    assert res.returncode == 0 and SUITE_OK in res.out, (
        f"rank {res.rank} exit {res.returncode}\n{res.out[-3000:]}\n{res.err[-3000:]}")
    assert int(res.out.split(SUITE_OK)[1].split()[0]) >= 30, res.out[-500:]


@pytest.mark.parametrize("nranks,native", [
    pytest.param(2, "1", marks=_needs_symm_native()),
    pytest.param(3, "1", marks=_needs_symm_native()),
    (3, "0"),
    pytest.param(3, "mixed", marks=_needs_symm_native())])
def test_fast_path_runs_kept_calls_and_refuses_the_rest(nranks, native, tmp_path):
    for res in _run(nranks, "fast", tmp_path, native):
        _ok(res)


@pytest.mark.parametrize("suite", ["hang", "death"])
@_needs_symm_native()
def test_fast_path_waits_are_bounded(suite, tmp_path):
    results = _run(3, suite, tmp_path, timeout_s="3")
    assert results[2].returncode == (17 if suite == "death" else 0)
    for res in results[:2]:
        _ok(res)
