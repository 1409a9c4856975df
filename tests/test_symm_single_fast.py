"""The compiled helper's single-copy calls: a repeated large ``auto`` Allgather or Bcast on
one host (single.py's protocol: publish the array's address, opening barrier, copies with
process_vm_readv / writev, closing barrier) run whole in _symm_single.c once the Python
path ran the same shape (counted by the helper: ``stats()["single"]``). Checked with new data on
every call: exact results, broadcast roots whose count P does not divide, the refusals
(I-variants, an explicit algorithm, POLYCAST_SYMM=0), ranks calling differently (every
rank raises MismatchError and nothing is written), a late rank and waits left to Python
at either barrier (``single_pending_open`` / ``_close``), a compiled rank beside a Python
one (mixed) and a dead peer (PeerLost in bounded time).

Run as a rank: ``python tests/test_symm_single_fast.py --suite single|death``."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

SUITE_OK = "SINGLE-SUITE OK"
NO_SINGLE = "NO-SINGLE-COPY"
# 1.25 MiB of float32 a rank: above the slots (SLOT_NBYTES, 1 MiB), so single copy on any
# number of cores.
N = (5 << 18) // 4


def _armed(comm) -> bool:
    """Whether the compiled helper keeps this communicator's repeated calls (its dispatch
    hands calls to it first)."""
    st = comm._dispatch.symm
    return st is not None and st.bar.fast is not None


def _rank_main(suite: str) -> int:
    import polycast
    from polycast.errors import CollectiveTimeout, MismatchError, PeerLost, PolycastError
    from polycast.runtime.symm import barrier as B

    comm = polycast.init()
    P, r = comm.size, comm.rank
    failures: list[str] = []
    checks = 0
    native = comm.config.hooks.native and B.compiled is not None

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(name)
            print(f"FAIL {name} {detail}", flush=True)

    def stat(key: str) -> int:
        return B.compiled.stats()[key] if B.compiled is not None else 0

    def counted(name: str, before: int, n: int) -> None:
        got = stat("single") - before
        check(name, got == (n if native else 0), f"single-copy calls {got}, want "
              f"{n if native else 0}")

    send, recv = np.empty(N, np.float32), np.empty(P * N, np.float32)

    def allgather(i: int, c=None, **kw) -> bool:
        send[...] = i * 100 + r
        send[-1] = -i - r
        recv[...] = -1
        (c or comm).Allgather(send, recv, **kw)
        blocks = recv.reshape(P, N)
        return all((blocks[p, :-1] == i * 100 + p).all() and blocks[p, -1] == -i - p
                   for p in range(P))

    check("first/exact", allgather(0))
    st = comm._dispatch.symm
    if st is None or not st.single_copy:
        print(f"{NO_SINGLE} {getattr(st, 'usable_reason', None) or 'CMA not allowed here'}",
              flush=True)
        polycast.finalize()
        return 0

    if suite == "death":
        comm2 = comm.Dup()
        for i in range(3):
            check("death/warm", allgather(i, comm2))
        check("death/armed", _armed(comm2) == native)
        if r == P - 1:
            os._exit(17)
        t0 = time.monotonic()
        try:
            allgather(9, comm2)
            check("death/raised", False, "returned")
        except (PeerLost, CollectiveTimeout) as exc:
            check("death/names-rank", f"{P - 1}" in str(exc), str(exc))
        dt = time.monotonic() - t0
        check("death/in-time", dt < comm.timeout_seconds + 1.5, f"{dt:.1f}s")
        check("death/disarmed", not _armed(comm2))
        print(f"{SUITE_OK if not failures else 'SINGLE-SUITE FAILED'} {checks} checks",
              flush=True)
        os._exit(0 if not failures else 1)

    # Kept after the first call: the rest run whole in the helper.
    before = stat("single")
    check("allgather/exact", all(allgather(i) for i in range(1, 21)))
    counted("allgather/counted", before, 20)

    # Broadcast from two roots; k elements, which P does not divide, so the root's tail
    # (written into the others) and the readers' head (read from the root) meet mid-array.
    k = 3 * (1 << 18) + 7
    for root in (0, P - 1):
        buf = np.empty(k, np.int64)
        first = None
        for i in range(11):
            want = np.arange(k, dtype=np.int64) * 3 + i
            buf[...] = want if r == root else -1
            if i == 1:
                first = stat("single")
            comm.Bcast(buf, root)
            check(f"bcast/{root}/exact", np.array_equal(buf, want), f"call {i}")
        counted(f"bcast/{root}/counted", first, 10)

    # Refused to the Python path (counts do not move), exact.
    before = stat("single")
    req_send = np.full(N, 7.0 + r, np.float32)
    out = np.empty(P * N, np.float32)
    comm.Iallgather(req_send, out).Wait()
    check("refuse/nonblocking", np.array_equal(out.reshape(P, N)[:, 0],
                                               7.0 + np.arange(P, dtype=np.float32)))
    check("refuse/explicit-algorithm", allgather(30, algorithm="ring"))
    from test_runtime_helpers import with_config
    off = with_config(comm, symm=False)         # POLYCAST_SYMM=0: the engine's schedules
    check("refuse/POLYCAST_SYMM=0", allgather(31, off))
    off.Free()
    counted("refuse/none-counted", before, 0)
    before = stat("single")
    check("refuse/then-fast-again", allgather(32))
    counted("refuse/fast-again", before, 1)

    # Ranks that call differently while the others run in the helper: every rank raises
    # MismatchError, and nothing crossed between them.
    def every_rank_raises(name, fn):
        try:
            fn()
            check(name, False, "returned")
        except MismatchError as exc:
            check(name, "differently" in str(exc), str(exc))
        except PolycastError as exc:
            check(name, False, repr(exc))

    short = N - 4
    every_rank_raises("mismatch/allgather-size", lambda: comm.Allgather(
        send[:short] if r == 0 else send, recv[:P * short] if r == 0 else recv))
    check("mismatch/allgather-then-exact", allgather(40))
    mine = np.full(k, 10 + r, np.int64)
    buf = mine.copy()
    every_rank_raises("mismatch/bcast-root", lambda: comm.Bcast(buf, 0 if r == 0 else P - 1))
    check("mismatch/bcast-untouched", np.array_equal(buf, mine))
    before = stat("single")
    check("mismatch/then-fast", allgather(41))
    counted("mismatch/then-fast-counted", before, 1)

    # No spin and no yields (a new communicator's barrier, made so): every wait for a peer
    # not there yet goes back to barrier.py's loop, at the opening barrier (a late rank) or
    # the closing one (the broadcast's root writes P - 1 tails while the others read one
    # head each, so they wait for it there). Exact, and both counted somewhere.
    policy_of = B.wait_policy
    B.wait_policy = lambda cfg, *host: policy_of(cfg, *host).passive()
    try:
        comm3 = comm.Dup()
        allgather(50, comm3)
    finally:
        B.wait_policy = policy_of
    opened, closed = stat("single_pending_open"), stat("single_pending_close")
    ok = True
    buf = np.empty(k, np.int64)
    for i in range(51, 71):
        if r == P - 1 and i % 5 == 0:
            time.sleep(0.03)
        ok &= allgather(i, comm3)
        want = np.arange(k, dtype=np.int64) - i
        buf[...] = want if r == 0 else 0
        comm3.Bcast(buf, 0)
        ok &= np.array_equal(buf, want)
    check("pending/exact", ok)
    print("PENDING " + json.dumps({"open": stat("single_pending_open") - opened,
                                   "close": stat("single_pending_close") - closed}),
          flush=True)
    comm3.Free()

    print(f"{SUITE_OK if not failures else 'SINGLE-SUITE FAILED'} {checks} checks",
          flush=True)
    if failures:
        os._exit(1)
    polycast.finalize()
    return 0


if __name__ == "__main__" and "--suite" in sys.argv:
    sys.exit(_rank_main(sys.argv[sys.argv.index("--suite") + 1]))


# -- the tests (pytest) ------------------------------------------------------------------------

import pytest  # noqa: E402

from test_symm_fast import _needs_symm_native, _run as _run_script  # noqa: E402

HERE = os.path.relpath(os.path.abspath(__file__), os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _run(nranks, suite, tmp_path, native="1", timeout_s="10"):
    return _run_script(nranks, suite, tmp_path, native, timeout_s, script=HERE)


def _ok(res, min_checks: int = 40) -> None:
    if NO_SINGLE in res.out:
        pytest.skip("single copy is not allowed between processes here (process_vm_readv "
                    "refused): " + res.out.split(NO_SINGLE)[1].splitlines()[0].strip())
    assert res.returncode == 0 and SUITE_OK in res.out, (
        f"rank {res.rank} exit {res.returncode}\n{res.out[-3000:]}\n{res.err[-3000:]}")
    assert int(res.out.split(SUITE_OK)[1].split()[0]) >= min_checks, res.out[-500:]


def _pending(results) -> dict:
    total = {"open": 0, "close": 0}
    for res in results:
        got = json.loads(res.out.split("PENDING ")[1].splitlines()[0])
        for key in total:
            total[key] += got[key]
    return total


@pytest.mark.parametrize("nranks,native", [
    pytest.param(2, "1", marks=_needs_symm_native()),
    pytest.param(3, "1", marks=_needs_symm_native()),
    pytest.param(3, "mixed", marks=_needs_symm_native())])
def test_single_copy_calls_run_whole_in_the_helper(nranks, native, tmp_path):
    results = _run(nranks, "single", tmp_path, native)
    for res in results:
        _ok(res)
    pending = _pending(results)
    # (a rank that sleeps before five of the calls is waited for at the opening barrier;
    # the broadcasts' root, at the closing one)
    assert pending["open"] > 0 and pending["close"] > 0, pending


@_needs_symm_native()
def test_single_copy_call_with_a_dead_peer_raises_in_time(tmp_path):
    results = _run(3, "death", tmp_path, timeout_s="3")
    assert results[2].returncode == 17
    for res in results[:2]:
        _ok(res, 8)
