"""One rank of tests/test_replay.py (started by spawn_ranks; POLYCAST_SYMM=0: the engine path).

``python tests/replay_rank.py MODE``; prints ``RESULT <json>`` on success:
* ``calls``: small calls of several collectives, dtypes and ops, blocking and non-blocking;
  every result's bytes (sha256) and this rank's replay counts;
* ``mismatch``: warm calls, then rank 1 calls with another count: every rank raises
  MismatchError, then every rank's next call works;
* ``death``: warm calls, then the last rank exits mid-loop: every other rank raises PeerLost;
* ``timeout``: warm calls, then the last rank waits without calling: the others raise
  the engine's timeout;
* ``late``: pulled allgathers with rank 0 posting late.

With ``REPLAY_WARM=pulled`` the warm calls (and the mismatched one) are allgathers of 1 MiB
a rank: pulled DATA, whose descriptors the helper writes and reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np

import polycast
from polycast.errors import MismatchError, PeerLost, PolycastError


def _counts(comm) -> dict:
    d = comm._driver
    st = d.stats(comm.id)
    cs = d._comms[comm.id]
    return {"replayed": st.replayed, "adopted": st.replay_adopted,
            "stops": cs.replay.counts() if cs.replay is not None else None,
            "off": d.replay_off, "by_case": _BY_CASE, "pull_out": st.pull_out,
            "cma_sent": d.peers.cma_sent, "cma_read": d.peers.cma_read}


def _cases(P: int, r: int):
    """(name, fn returning the result array) per case."""
    def allreduce(n, dtype, op, algo, nonblocking=False):
        x = (np.arange(n) % 7 + r + 1).astype(dtype)

        def f():
            y = np.empty_like(x)
            if nonblocking:
                comm.Iallreduce(x, y, op=op, algorithm=algo).Wait()
            else:
                comm.Allreduce(x, y, op=op, algorithm=algo)
            return y
        return f

    def bcast(n, algo):
        def f():
            y = np.arange(n, dtype=np.float32) if r == 1 else np.zeros(n, np.float32)
            comm.Bcast(y, root=1, algorithm=algo)
            return y
        return f

    def allgather(n, algo, nonblocking=False):
        x = np.full(n, r + 0.5, np.float64)

        def f():
            y = np.empty(n * P, np.float64)
            if nonblocking:
                comm.Iallgather(x, y, algorithm=algo).Wait()
            else:
                comm.Allgather(x, y, algorithm=algo)
            return y
        return f

    def barrier():
        comm.Barrier()
        return np.zeros(1)

    return [
        ("allreduce-f32-sum-8B", allreduce(2, np.float32, "sum", "recdoubling")),
        ("allreduce-f64-prod", allreduce(5, np.float64, "prod", "recdoubling")),
        ("allreduce-i32-min", allreduce(9, np.int32, "min", "recdoubling")),
        ("allreduce-i64-max", allreduce(3, np.int64, "max", "recdoubling")),
        ("allreduce-i32-sum-wrap", lambda: _wrap(P, r)),
        ("allreduce-f32-max-numpy", allreduce(4, np.float32, "max", "recdoubling")),
        ("iallreduce-f32-sum", allreduce(2, np.float32, "sum", "recdoubling", True)),
        ("allreduce-ring-f32", allreduce(8 * P, np.float32, "sum", "ring")),
        ("allreduce-64KiB", allreduce(16384, np.float32, "sum", "recdoubling")),
        ("bcast-binomial", bcast(6, "binomial")),
        ("bcast-64KiB", bcast(16384, "binomial")),
        ("allgather-recdoubling", allgather(3, "recdoubling")),
        ("allgather-ring", allgather(2, "ring")),
        ("iallgather-ring", allgather(2, "ring", True)),
        ("barrier", barrier),
        # Pulled DATA (single-copy descriptors, 1 MiB messages): the helper writes the
        # descriptors and reads the peers' with process_vm_readv.
        ("allgather-pulled-direct", allgather(PULLED_NELEMS, "direct")),
        ("allgather-pulled-ring", allgather(PULLED_NELEMS, "ring")),
        ("iallgather-pulled-direct", allgather(PULLED_NELEMS, "direct", True)),
        ("bcast-pulled-direct", bcast(2 * PULLED_NELEMS, "direct")),
    ]


PULLED_NELEMS = 1 << 17     # float64: 1 MiB, over the single-copy floor (512 KiB)


def _wrap(P, r):
    x = np.full(3, 2**31 - 1 - r, np.int32)
    y = np.empty_like(x)
    comm.Allreduce(x, y, algorithm="recdoubling")
    return y


def calls() -> dict:
    """Each case ``REPLAY_REPS`` times; with ``REPLAY_STEP_LIMITS=k,...`` as many times per
    limit, every replay stopped after k steps (then adopted by the engine)."""
    reps = int(os.environ.get("REPLAY_REPS", "20"))
    limits = [int(k) for k in os.environ.get("REPLAY_STEP_LIMITS", "-1").split(",")]
    rp = comm._driver._comms[comm.id].replay
    out: dict = {}
    by_case: dict = {}      # name -> calls replayed whole
    for limit in limits:
        if rp is not None:
            rp.step_limit = limit
        for name, f in _cases(comm.size, comm.rank):
            h = set(out.get(name, ()))
            before = _counts(comm)["replayed"]
            for _ in range(reps):
                h.add(hashlib.sha256(np.ascontiguousarray(f()).tobytes()).hexdigest())
            out[name] = sorted(h)
            by_case[name] = by_case.get(name, 0) + _counts(comm)["replayed"] - before
    _BY_CASE.update(by_case)
    return out


_BY_CASE: dict = {}


def _warm(n=30):
    """``n`` replayed calls: small allreduces, or with REPLAY_WARM=pulled 1 MiB-a-rank
    allgathers (pulled DATA)."""
    if os.environ.get("REPLAY_WARM") == "pulled":
        x = np.full(PULLED_NELEMS, comm.rank, np.float64)
        y = np.empty(PULLED_NELEMS * comm.size, np.float64)
        for _ in range(n):
            comm.Allgather(x, y, algorithm="direct")
        assert (y.reshape(comm.size, -1)[:, -1] == np.arange(comm.size)).all()
        return
    x = np.ones(2, np.float32)
    y = np.empty_like(x)
    for _ in range(n):
        comm.Allreduce(x, y, algorithm="recdoubling")
    assert y[0] == comm.size


def mismatch() -> dict:
    _warm()
    before = _counts(comm)["replayed"]
    try:
        if os.environ.get("REPLAY_WARM") == "pulled":
            n = PULLED_NELEMS + (comm.rank == 1)
            x = np.ones(n, np.float64)
            comm.Allgather(x, np.empty(n * comm.size), algorithm="direct")
        else:
            n = 3 if comm.rank == 1 else 2
            x = np.ones(n, np.float32)
            comm.Allreduce(x, np.empty_like(x), algorithm="recdoubling")
        raised = "nothing"
    except MismatchError as exc:
        raised = "MismatchError: " + str(exc)[:200]
    _warm(5)
    return {"raised": raised, "warm_replayed": before}


def death() -> dict:
    _warm()
    before = _counts(comm)["replayed"]
    if comm.rank == comm.size - 1:
        os._exit(17)
    t0 = time.monotonic()
    try:
        for _ in range(100000):
            _warm(1)
        raised = "nothing"
    except PeerLost as exc:
        raised = "PeerLost: " + str(exc)[:200]
    return {"raised": raised, "warm_replayed": before, "seconds": time.monotonic() - t0}


def timeout() -> dict:
    """The last rank stays alive but does not call until the others have raised (each
    leaves a file in REPLAY_DONE_DIR), at most 120 s."""
    _warm()
    before = _counts(comm)["replayed"]
    done = os.environ["REPLAY_DONE_DIR"]
    if comm.rank == comm.size - 1:
        end = time.monotonic() + 120
        while time.monotonic() < end and len(os.listdir(done)) < comm.size - 1:
            time.sleep(0.05)
        return {"raised": "waited", "warm_replayed": before}
    try:
        _warm(1)
        raised = "nothing"
    except PeerLost as exc:
        raised = "PeerLost: " + str(exc)[:200]
    except PolycastError as exc:
        raised = f"{type(exc).__name__}: " + str(exc)[:200]
    open(os.path.join(done, f"rank{comm.rank}"), "w").close()
    return {"raised": raised, "warm_replayed": before}


def late() -> dict:
    """Pulled allgathers where rank 0 posts 30 ms after its peers: their descriptors wait
    in its early buffer and its replay reads them from there; the peers' replays wait for
    its descriptors past their bound and the engine adopts their calls, sends written."""
    P = comm.size
    x = np.empty(PULLED_NELEMS, np.float64)
    y = np.empty(PULLED_NELEMS * P, np.float64)
    ok = 0
    for i in range(8):
        if comm.rank == 0:
            time.sleep(0.03)
        x[:] = comm.rank + i
        comm.Allgather(x, y, algorithm="direct")
        ok += bool((y.reshape(P, -1) == np.arange(P)[:, None] + i).all())
    return {"ok": ok, "pull_held": comm._driver.stats(comm.id).pull_held}


if __name__ == "__main__":
    comm = polycast.init()
    mode = sys.argv[1]
    res = {"calls": calls, "mismatch": mismatch, "death": death, "timeout": timeout,
           "late": late}[mode]()
    res["counts"] = _counts(comm)
    print("RESULT " + json.dumps(res), flush=True)
    if mode in ("death", "timeout"):
        os._exit(0)         # a peer is gone: skip the orderly goodbye
    polycast.finalize()
