"""Non-blocking collectives do not block (issue 10's "Iallreduce of 64 MiB with auto on one
host spends 47 ms in the call and 0 ms in Wait"): an ``I``-call returns a request that is
still pending while a peer is held back, on the symm path ``auto`` takes on one host and on
the engine path; several outstanding calls, mixed with blocking ones and engine ones,
complete with the right data in posting order whatever order they are waited in.

The peer is held back by a file rank 0 creates only after it checked its request: the
request cannot have completed by then, whatever the machine's load (no timing assertion).

This file is also the rank program: ``python tests/test_nonblocking.py``.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

OK = "NONBLOCKING OK"


def _rank_main() -> int:
    import polycast
    from polycast import Request

    comm = polycast.init()
    P, r = comm.size, comm.rank
    gates = os.environ["NB_GATES"]
    failures: list[str] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        if not ok:
            failures.append(name)
            print(f"FAIL {name} {detail}", flush=True)

    def held_back(name: str, post, finish) -> None:
        """Rank 0 posts; the others call only once rank 0 has looked at its request."""
        flag = os.path.join(gates, name)
        if r == 0:
            req = post()
            check(f"{name}/pending", not req.Test(), "complete before the peers called")
            open(flag, "w").close()
            req.Wait()
        else:
            deadline = time.monotonic() + 30
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.001)
            post().Wait()
        finish()

    n = 1 << 16                                  # 256 KiB of float32: above one-shot
    x = np.full(n, r + 1, np.float32)
    total = P * (P + 1) / 2
    for label, algo, bcast_algo in (("auto", None, None), ("engine", "ring", "binomial")):
        y = np.empty(n, np.float32)
        comm.Allreduce(x, y, algorithm=algo)      # the symm state and staging are made once
        y[:] = 0
        held_back(f"{label}-allreduce", lambda: comm.Iallreduce(x, y, algorithm=algo),
                  lambda: check(f"{label}-allreduce/data", bool((y == total).all())))
        g = np.empty(P * 1000, np.float32)
        held_back(f"{label}-allgather",
                  lambda: comm.Iallgather(np.full(1000, r, np.float32), g, algorithm=algo),
                  lambda: check(f"{label}-allgather/data", bool(
                      (g.reshape(P, -1) == np.arange(P)[:, None]).all())))
        b = np.full(5000, r, np.float64)
        # The root may finish once its data left: rank 0 (held back from) receives it.
        held_back(f"{label}-bcast", lambda: comm.Ibcast(b, P - 1, algorithm=bcast_algo),
                  lambda: check(f"{label}-bcast/data", bool((b == P - 1).all())))
        rs = np.empty(1000, np.float32)
        held_back(f"{label}-reduce-scatter",
                  lambda: comm.Ireduce_scatter_block(np.ones(P * 1000, np.float32), rs,
                                                     algorithm=algo),
                  lambda: check(f"{label}-reduce-scatter/data", bool((rs == P).all())))

    # A done-callback fires without anyone waiting: from the symm worker (auto) and from
    # the progress thread (engine).
    import threading
    for label, algo in (("auto", None), ("engine", "ring")):
        fired = threading.Event()
        y = np.empty(n, np.float32)
        req = comm.Iallreduce(x, y, algorithm=algo)
        req.add_done_callback(lambda _r: fired.set())
        check(f"{label}-callback/fired", fired.wait(30))
        req.Wait()
        check(f"{label}-callback/data", bool((y == total).all()))

    # Several outstanding calls of both paths and blocking ones between them: data right,
    # waited in reverse order.
    outs = [np.empty(n, np.float32) for _ in range(3)]
    reqs = [comm.Iallreduce(x * (i + 1), outs[i]) for i in range(2)]
    reqs.append(comm.Ibarrier())
    b = np.full(100, r, np.int64)
    comm.Bcast(b, root=P - 1)
    reqs.append(comm.Iallreduce(x * 3, outs[2]))
    g = np.empty(P * 10, np.float32)
    comm.Allgather(np.full(10, r, np.float32), g)
    Request.Waitall(list(reversed(reqs)))
    for i in range(3):
        check(f"mixed/allreduce{i}", bool((outs[i] == total * (i + 1)).all()))
    check("mixed/bcast", bool((b == P - 1).all()))
    check("mixed/allgather", bool((g.reshape(P, -1) == np.arange(P)[:, None]).all()))
    print(OK if not failures else f"FAILED {failures}", flush=True)
    polycast.finalize()
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(_rank_main())


# -- the tests (pytest) ------------------------------------------------------------------------

import pytest  # noqa: E402

from test_runtime_helpers import spawn_ranks  # noqa: E402

HERE = os.path.relpath(os.path.abspath(__file__), os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.parametrize("nranks", [2, 3])
def test_nonblocking_calls_are_pending_while_a_peer_is_held_back(nranks, tmp_path):
    results = spawn_ranks(nranks, [HERE], env={"POLYCAST_TIMEOUT": "30",
                                               "NB_GATES": str(tmp_path)}, timeout=120)
    for res in results:
        assert res.returncode == 0 and OK in res.out, (
            f"rank {res.rank} exit {res.returncode}\n{res.out[-3000:]}\n{res.err[-3000:]}")


def test_done_callback_runs_once_at_completion_or_at_once():
    import threading

    from polycast.errors import PolycastError
    from polycast.runtime.driver import Request

    seen = []
    req = Request(1, 0, "test request", 5.0)
    req.add_done_callback(lambda r: seen.append(("first", r.error)))
    assert seen == []
    err = PolycastError("boom")
    threading.Thread(target=req._finish, args=(err,)).start()
    deadline = __import__("time").monotonic() + 5
    while not seen and __import__("time").monotonic() < deadline:
        pass
    assert seen == [("first", err)]
    req.add_done_callback(lambda r: seen.append(("late", r.error)))   # already done: now
    assert seen == [("first", err), ("late", err)]
    with pytest.raises(PolycastError, match="boom"):
        req.Wait()

    # A raising callback is reported, and the others still run.
    ok = Request(2, 0, "test request", 5.0)
    ok.add_done_callback(lambda r: 1 / 0)
    ok.add_done_callback(lambda r: seen.append("after"))
    with pytest.warns(RuntimeWarning, match="done-callback"):
        ok._finish()
    assert seen[-1] == "after" and ok.Test()
