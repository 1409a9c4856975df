"""One rank of tests/test_direct.py (started by spawn_ranks; POLYCAST_SYMM=0: the engine path).

``python tests/direct_rank.py MODE``; prints ``RESULT <json>`` on success. Every call's data
is new (seeded by case, call and rank, so every rank computes every rank's input and the
expected result with numpy); ``bad`` lists the calls whose result was wrong.

* ``counted``: repeated blocking Allreduce / Allgather / Reduce_scatter_block / Bcast (root
  1) / Barrier with explicit algorithms and with ``algorithm=None``: per case, the calls,
  and the DirectCalls' ``whole`` and ``adopted`` counts;
* ``args``: after warm direct calls, arguments that do not fit what is kept (another size
  or dtype, IN_PLACE, aliased, 2-D, read-only, non-contiguous, overlapping; on every rank or
  on one rank only), each followed by a normal call;
* ``kept``: what a key keeps after aliased and Fortran-ordered calls of the kept count;
* ``env``: a variable the memo depends on changed mid-run (POLYCAST_NCHUNKS,
  POLYCAST_DEBUG, POLYCAST_ALLREDUCE_ALGO, POLYCAST_SYMM), then put back;
* ``mismatch``: warm direct calls, then rank 1 calls with another count;
* ``adopt``: the replay stopped after 1, 2, 3 steps: calls begun direct, finished by the
  engine;
* ``death``: warm direct calls, then the last rank exits mid-loop (exit status 17);
* ``dup``: a Dup'd communicator's DirectCalls, then Free;
* ``mixed``: direct calls among outstanding requests, and from two threads at once;
* ``late``: rank 1 late by 50 ms before a call: did its call run direct?

With DIRECT_NONBLOCKING=1 every collective call is its I-variant followed by Wait.

Every wait is bounded: the collectives by POLYCAST_TIMEOUT, the loops by their counts
(``death``'s also by time), the threads by join timeouts.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

import polycast
from polycast.collectives import Collective
from polycast.errors import MismatchError, PeerLost, PolycastError

AR, AG, RS, BC, BA = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER,
                      Collective.BROADCAST, Collective.BARRIER)
_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


# -- helpers ------------------------------------------------------------------------------
def _kept(c, key) -> list:
    return list(c._dispatch.direct.get(key, ()))


def _whole(c, key) -> int:
    return sum(dc.whole for dc in _kept(c, key))


def _adopted(c, key) -> int:
    return sum(dc.adopted for dc in _kept(c, key))


def _taken(c, key) -> int:
    """Calls the kept DirectCalls took: run whole, or begun and adopted by the engine (a
    peer late by more than the replay's wait bound, as on a loaded machine)."""
    return _whole(c, key) + _adopted(c, key)


def _agreed(c, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (so every rank leaves a loop after as many
    calls): an Allreduce of its own key (int32 min, ring), not one a test counts."""
    got = np.empty(1, np.int32)
    c.Allreduce(np.array([int(bool(ok))], np.int32), got, op="min", algorithm="ring")
    return bool(got[0])


def _data(seed, rank, n, dtype):
    """Rank ``rank``'s input of the call seeded ``seed`` (a tuple)."""
    rng = np.random.default_rng([*seed, rank])
    dt = np.dtype(dtype)
    if dt.kind == "f":
        if dt == np.float64:
            return rng.uniform(0.5, 1.5, n).astype(dt)       # products stay tame
        return rng.standard_normal(n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


def _reduce(arrs, op):
    out = arrs[0].copy()
    with np.errstate(over="ignore"):
        for a in arrs[1:]:
            out = _UFUNC[op](out, a)
    return out


def _same(got, want) -> bool:
    got = np.asarray(got).reshape(-1)
    want = np.asarray(want).reshape(-1)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind == "f":
        return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))
    return bool(np.array_equal(got, want))


def _err(exc) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


class Calls:
    """One case's calls: ``call(i)`` runs call i with new data and checks its result."""

    def __init__(self, c, bad: list):
        self.c, self.bad = c, bad
        self.P, self.r = c.size, c.rank
        # DIRECT_NONBLOCKING=1: every call is its I-variant, then Wait
        self.nonblocking = os.environ.get("DIRECT_NONBLOCKING") == "1"

    def _do(self, name: str, *args, **kw) -> None:
        """Comm.<name>(...), or Comm.I<name lowercased first>(...).Wait(): a request the
        direct path made is done (or finished by Wait), and a second Wait returns at once."""
        if not self.nonblocking:
            getattr(self.c, name)(*args, **kw)
            return
        req = getattr(self.c, "I" + name[0].lower() + name[1:])(*args, **kw)
        if req.Wait() is not True or req.Test() is not True or req.Wait() is not True:
            self.bad.append([name, "a finished request does not say so"])

    def allreduce(self, tag, n, dtype, op, algo, i, send=None, recv=None):
        P, r = self.P, self.r
        seed = (hash_tag(tag), i)
        ins = [_data(seed, k, n, dtype) for k in range(P)]
        x = ins[r] if send is None else send
        if send is not None:
            send[...] = ins[r].reshape(send.shape)
        y = np.empty(n, dtype) if recv is None else recv
        self._do("Allreduce", x, y, op=op, algorithm=algo)
        self.check(tag, i, y, _reduce(ins, op))

    def allgather(self, tag, n, dtype, algo, i):
        P, r = self.P, self.r
        ins = [_data((hash_tag(tag), i), k, n, dtype) for k in range(P)]
        y = np.empty(n * P, dtype)
        self._do("Allgather", ins[r], y, algorithm=algo)
        self.check(tag, i, y, np.concatenate(ins))

    def reduce_scatter(self, tag, n, dtype, op, algo, i):
        P, r = self.P, self.r
        ins = [_data((hash_tag(tag), i), k, n * P, dtype) for k in range(P)]
        y = np.empty(n, dtype)
        self._do("Reduce_scatter_block", ins[r], y, op=op, algorithm=algo)
        self.check(tag, i, y, _reduce(ins, op)[r * n:(r + 1) * n])

    def bcast(self, tag, n, dtype, root, algo, i):
        want = _data((hash_tag(tag), i), root, n, dtype)
        y = want.copy() if self.r == root else np.zeros(n, dtype)
        self._do("Bcast", y, root=root, algorithm=algo)
        self.check(tag, i, y, want)

    def barrier(self, tag, algo, i, where):
        """Each rank leaves a file before barrier i; after it, every rank's must be there."""
        open(os.path.join(where, f"{tag}-{i}-{self.r}"), "w").close()
        self._do("Barrier", algorithm=algo)
        missing = [k for k in range(self.P)
                   if not os.path.exists(os.path.join(where, f"{tag}-{i}-{k}"))]
        if missing:
            self.bad.append([tag, i, f"after the barrier ranks {missing} had not reached it"])

    def check(self, tag, i, got, want):
        if not _same(got, want):
            self.bad.append([tag, i, f"got {np.asarray(got).reshape(-1)[:8].tolist()} "
                                     f"want {np.asarray(want).reshape(-1)[:8].tolist()}"])


def hash_tag(tag: str) -> int:
    """A seed part per case name, the same in every process (not Python's hash())."""
    return sum((k + 1) * ord(ch) for k, ch in enumerate(tag))


# -- modes -------------------------------------------------------------------------------
def counted() -> dict:
    reps = int(os.environ.get("DIRECT_REPS", "40"))
    where = os.environ["DIRECT_DIR"]
    bad: list = []
    k = Calls(comm, bad)
    cases = [
        ("ar-f32-sum-recdoubling", (AR, "recdoubling", "sum"),
         lambda i: k.allreduce("ar-f32-sum-recdoubling", 5, np.float32, "sum", "recdoubling", i)),
        ("ar-i64-max-recdoubling", (AR, "recdoubling", "max"),
         lambda i: k.allreduce("ar-i64-max-recdoubling", 7, np.int64, "max", "recdoubling", i)),
        ("ar-i64-min-ring", (AR, "ring", "min"),
         lambda i: k.allreduce("ar-i64-min-ring", 3 * comm.size, np.int64, "min", "ring", i)),
        ("ar-f64-prod-binomial", (AR, "binomial", "prod"),
         lambda i: k.allreduce("ar-f64-prod-binomial", 4, np.float64, "prod", "binomial", i)),
        ("ar-i32-sum-wrap-recdoubling", (AR, "recdoubling", "sum"),
         lambda i: k.allreduce("ar-i32-sum-wrap-recdoubling", 3, np.int32, "sum",
                               "recdoubling", i)),
        ("ag-f32-recdoubling", (AG, "recdoubling", None),
         lambda i: k.allgather("ag-f32-recdoubling", 3, np.float32, "recdoubling", i)),
        ("ag-i64-ring", (AG, "ring", None),
         lambda i: k.allgather("ag-i64-ring", 2, np.int64, "ring", i)),
        ("rs-f32-sum-ring", (RS, "ring", "sum"),
         lambda i: k.reduce_scatter("rs-f32-sum-ring", 2, np.float32, "sum", "ring", i)),
        ("rs-i64-sum-rechalving", (RS, "rechalving", "sum"),
         lambda i: k.reduce_scatter("rs-i64-sum-rechalving", 3, np.int64, "sum",
                                    "rechalving", i)),
        ("bc-f64-root1-binomial", (BC, "binomial", 1),
         lambda i: k.bcast("bc-f64-root1-binomial", 6, np.float64, 1, "binomial", i)),
        ("bc-i32-root1-chain", (BC, "chain", 1),
         lambda i: k.bcast("bc-i32-root1-chain", 5, np.int32, 1, "chain", i)),
        ("barrier-dissemination", (BA, "dissemination", None),
         lambda i: k.barrier("barrier-dissemination", "dissemination", i, where)),
        # algorithm=None (POLYCAST_SYMM=0: the planner's engine schedule)
        ("auto-ar-f32-sum", (AR, None, "sum"),
         lambda i: k.allreduce("auto-ar-f32-sum", 4, np.float32, "sum", None, i)),
        ("auto-ag-i64", (AG, None, None),
         lambda i: k.allgather("auto-ag-i64", 2, np.int64, None, i)),
        ("auto-rs-f32-sum", (RS, None, "sum"),
         lambda i: k.reduce_scatter("auto-rs-f32-sum", 2, np.float32, "sum", None, i)),
        ("auto-bc-f32-root1", (BC, None, 1),
         lambda i: k.bcast("auto-bc-f32-root1", 3, np.float32, 1, None, i)),
        ("auto-barrier", (BA, None, None),
         lambda i: k.barrier("auto-barrier", None, i, where)),
    ]
    out = {}
    for name, key, f in cases:
        w0, a0 = _whole(comm, key), _adopted(comm, key)
        for i in range(reps):
            f(i)
        out[name] = {"calls": reps, "whole": _whole(comm, key) - w0,
                     "adopted": _adopted(comm, key) - a0, "kept": len(_kept(comm, key))}
    return {"cases": out, "bad": bad}


KEY = (AR, "recdoubling", "sum")


def _dc(c, key, n, dtype):
    """The DirectCall kept for ``key`` with recv of ``n`` elements of ``dtype``, or None."""
    for dc in _kept(c, key):
        if dc.nrecv == n and dc.dtype == np.dtype(dtype):
            return dc
    return None


def _step(steps, name, key, n, dtype, warm, odd, reps=1):
    """Warm direct calls of ``key`` (n elements of dtype), then ``odd(j)`` ``reps`` times
    (stopping at the first error), then warm calls again: what the odd call did (``ok`` or
    the error), whether the DirectCall the warm calls use ran it (``direct``, ``adopted``),
    and how the next calls went."""
    warm(5)
    # until the kept DirectCall runs the warm calls (a rank late once may take the full
    # path for a while: see test_direct's test of zero-length frames held early)
    for _ in range(40):
        dc = _dc(comm, key, n, dtype)
        w0 = dc.whole if dc is not None else None
        warm(1)
        if _agreed(comm, dc is not None and dc.whole > w0):
            break
    dc = _dc(comm, key, n, dtype)
    w0, a0 = (dc.whole, dc.adopted) if dc is not None else (None, None)
    got = "ok"
    try:
        for j in range(reps):
            odd(j)
    except PolycastError as exc:
        got = _err(exc)
    rec = {"got": got, "kept_before": w0,
           "direct": None if dc is None else dc.whole - w0,
           "adopted": None if dc is None else dc.adopted - a0, "after": "ok"}
    try:
        warm(3)                 # the next calls: correct on every rank
    except PolycastError as exc:
        rec["after"] = _err(exc)
    steps[name] = rec


def args() -> dict:
    """After warm direct calls (Allreduce float32 sum recdoubling of 4 elements, Allgather
    ring, Bcast binomial root 1), calls whose arguments do not fit what is kept, on every
    rank or on one rank only (the others make the ordinary call)."""
    P, r = comm.size, comm.rank
    bad: list = []
    k = Calls(comm, bad)
    n = 4
    steps: dict = {}
    seq = [0]

    def nxt():
        seq[0] += 1
        return seq[0]

    def warm(m):
        for _ in range(m):
            k.allreduce("warm", n, np.float32, "sum", "recdoubling", nxt())

    def step(name, odd, only=None, reps=1):
        def run(j):
            if only is None or r == only:
                odd(nxt())
            else:
                k.allreduce(name, n, np.float32, "sum", "recdoubling", nxt())
        nb = len(bad)
        _step(steps, name, KEY, n, np.float32, warm, run, reps)
        steps[name]["bad"] = bad[nb:]

    def other_size(i):
        k.allreduce("size6", 6, np.float32, "sum", "recdoubling", i)

    def other_dtype(i):
        k.allreduce("f64", n, np.float64, "sum", "recdoubling", i)

    def in_place(i):
        ins = [_data((7, i), q, n, np.float32) for q in range(P)]
        y = ins[r].copy()
        comm.Allreduce(polycast.IN_PLACE, y, algorithm="recdoubling")
        k.check("in_place", i, y, _reduce(ins, "sum"))

    def aliased(i):
        ins = [_data((8, i), q, n, np.float32) for q in range(P)]
        y = ins[r].copy()
        comm.Allreduce(y, y, algorithm="recdoubling")
        k.check("aliased", i, y, _reduce(ins, "sum"))

    def two_d(i):
        k.allreduce("2d", n, np.float32, "sum", "recdoubling", i,
                    send=np.empty((2, 2), np.float32), recv=np.empty((2, 2), np.float32))

    def fortran(i):
        ins = [_data((9, i), q, n, np.float32).reshape(2, 2) for q in range(P)]
        x = np.asfortranarray(ins[r])
        y = np.asfortranarray(np.zeros((2, 2), np.float32))
        comm.Allreduce(x, y, algorithm="recdoubling")
        k.check("fortran", i, y, _reduce(ins, "sum"))

    def read_only_send(i):
        ins = [_data((10, i), q, n, np.float32) for q in range(P)]
        x = ins[r].copy()
        x.flags.writeable = False
        y = np.empty(n, np.float32)
        comm.Allreduce(x, y, algorithm="recdoubling")
        k.check("read_only_send", i, y, _reduce(ins, "sum"))

    def read_only_recv(i):
        y = np.empty(n, np.float32)
        y.flags.writeable = False
        comm.Allreduce(np.ones(n, np.float32), y, algorithm="recdoubling")

    def non_contiguous(i):
        comm.Allreduce(np.ones(2 * n, np.float32)[::2], np.empty(n, np.float32),
                       algorithm="recdoubling")

    def overlap(i):
        buf = np.ones(n + 2, np.float32)
        comm.Allreduce(buf[:n], buf[2:], algorithm="recdoubling")

    # calls that work (the kept DirectCall must not run the first four, two_d and
    # read_only_send fit it)
    for name, f in (("other_size", other_size), ("other_dtype", other_dtype),
                    ("in_place", in_place), ("aliased", aliased), ("fortran", fortran),
                    ("two_d", two_d), ("read_only_send", read_only_send)):
        step(name, f, reps=3)
    # calls every rank, or one rank, must refuse
    step("read_only_recv_one_rank", read_only_recv, only=1)
    step("read_only_recv_every_rank", read_only_recv)
    step("non_contiguous_one_rank", non_contiguous, only=1)
    step("non_contiguous_every_rank", non_contiguous)
    step("overlap_one_rank", overlap, only=1)
    step("overlap_every_rank", overlap)

    # Allgather ring: the sendbuf is the next rank's block of recvbuf (partly overlapping)
    def ag_warm(m):
        for _ in range(m):
            k.allgather("ag-warm", 2, np.float32, "ring", nxt())

    def ag_overlap(j):
        y = np.zeros(2 * P, np.float32)
        other = (r + 1) % P
        comm.Allgather(y[2 * other:2 * other + 2], y, algorithm="ring")

    nb = len(bad)
    _step(steps, "allgather_overlap", (AG, "ring", None), 2 * P, np.float32, ag_warm,
          ag_overlap)
    steps["allgather_overlap"]["bad"] = bad[nb:]

    # Bcast root 1: a read-only buffer on rank 2 only (a receiver must write it)
    def bc_warm(m):
        for _ in range(m):
            k.bcast("bc-warm", 3, np.float64, 1, "binomial", nxt())

    def bc_read_only(j):
        y = np.full(3, 5.0) if r == 1 else np.zeros(3)
        if r == 2:
            y.flags.writeable = False
        comm.Bcast(y, root=1, algorithm="binomial")

    nb = len(bad)
    _step(steps, "bcast_read_only_rank2", (BC, "binomial", 1), 3, np.float64, bc_warm,
          bc_read_only)
    steps["bcast_read_only_rank2"]["bad"] = bad[nb:]
    return {"steps": steps, "bad": bad}


def kept() -> dict:
    """What a key keeps after calls the kept DirectCall cannot take but the full path's
    replay runs whole: aliased ``Allreduce(z, z)`` and Fortran-ordered 2-D arrays."""
    r = comm.rank
    bad: list = []
    k = Calls(comm, bad)
    n = 6
    for i in range(40):
        k.allreduce("kept", n, np.float32, "sum", "recdoubling", i)
        orig = _dc(comm, KEY, n, np.float32)
        if _agreed(comm, orig is not None and orig.whole >= 2):
            break
    res = {"before": [[dc.nsend, dc.nrecv, str(dc.dtype)] for dc in _kept(comm, KEY)]}
    for i in range(4):
        z = _data((11, i), r, n, np.float32)
        comm.Allreduce(z, z, algorithm="recdoubling")
    for i in range(2):
        comm.Allreduce(np.asfortranarray(np.ones((2, 3), np.float32)),
                       np.asfortranarray(np.empty((2, 3), np.float32)), algorithm="recdoubling")
    res["after"] = [[dc.nsend, dc.nrecv, str(dc.dtype)] for dc in _kept(comm, KEY)]
    res["orig_still_kept"] = any(dc is orig for dc in _kept(comm, KEY))
    res["bad"] = bad
    return res


def _live(c, key, run):
    """The DirectCall of ``key`` that runs the calls ``run()`` makes: tried until one ran
    a call on every rank (at most 10 times), else None."""
    for _ in range(10):
        before = {id(dc): dc.whole for dc in _kept(c, key)}
        run()
        live = [dc for dc in _kept(c, key) if dc.whole > before.get(id(dc), dc.whole)]
        if _agreed(c, bool(live)):
            return live[0]
    return None


def env() -> dict:
    """Per phase: warm calls, the DirectCall that runs them; the variable set on every
    rank for ``m`` calls (their log lines, if any, on stderr between PHASE markers), then
    unset. The communicator's settings were read when it was made, so the kept call runs
    them all. Then a communicator made with POLYCAST_DEBUG=TRACE: every call logged, none
    kept."""
    bad: list = []
    k = Calls(comm, bad)
    n = 4
    i = [0]
    out: dict = {}

    def calls(m, algo, c=None):
        kk = k if c is None else Calls(c, bad)
        for _ in range(m):
            i[0] += 1
            kk.allreduce("env", n, np.float32, "sum", algo, i[0])

    def phase(name, var, value, algo="recdoubling", m=5):
        key = (AR, algo, "sum")
        calls(8, algo)
        dc = _live(comm, key, lambda: calls(1, algo))
        w0 = dc.whole if dc is not None else None
        a0 = dc.adopted if dc is not None else None
        nb = len(bad)
        print(f"PHASE {name} begin", file=sys.stderr, flush=True)
        old = os.environ.get(var)
        os.environ[var] = value
        try:
            calls(m, algo)
        finally:
            if old is None:
                del os.environ[var]
            else:
                os.environ[var] = old
        print(f"PHASE {name} end", file=sys.stderr, flush=True)
        w1 = dc.whole if dc is not None else None
        a1 = dc.adopted if dc is not None else None
        calls(m, algo)
        w2 = dc.whole if dc is not None else None
        a2 = dc.adopted if dc is not None else None
        out[name] = {"calls": m, "kept_before": w0,
                     # calls the DirectCall took: run whole, or begun and adopted
                     "while_set": None if w0 is None else w1 - w0 + a1 - a0,
                     "after_unset": None if w0 is None else w2 - w1 + a2 - a1,
                     "bad": bad[nb:]}

    phase("nchunks", "POLYCAST_NCHUNKS", "2")
    phase("debug_trace", "POLYCAST_DEBUG", "TRACE")
    phase("debug_info", "POLYCAST_DEBUG", "INFO")
    phase("algo_var_explicit", "POLYCAST_ALLREDUCE_ALGO", "ring")
    phase("algo_var_auto", "POLYCAST_ALLREDUCE_ALGO", "ring", algo=None)
    phase("symm_var_auto", "POLYCAST_SYMM", "1", algo=None)
    from test_runtime_helpers import with_config
    traced = with_config(comm, debug="TRACE")
    m = 6
    print("PHASE traced_comm begin", file=sys.stderr, flush=True)
    calls(m, "recdoubling", traced)
    print("PHASE traced_comm end", file=sys.stderr, flush=True)
    out["traced_comm"] = {"calls": m, "kept": len(traced._dispatch.direct)}
    traced.Free()
    return {"phases": out, "bad": bad}


def mismatch() -> dict:
    bad: list = []
    k = Calls(comm, bad)
    for i in range(20):
        k.allreduce("mm", 2, np.float32, "sum", "recdoubling", i)
    before = _whole(comm, KEY)
    n = 3 if comm.rank == 1 else 2
    x = np.ones(n, np.float32)
    t0 = time.monotonic()
    try:
        comm.Allreduce(x, np.empty_like(x), algorithm="recdoubling")
        raised = "nothing"
    except MismatchError as exc:
        raised = "MismatchError: " + str(exc)[:200]
    except PolycastError as exc:
        raised = _err(exc)
    took = time.monotonic() - t0
    nb = len(bad)
    w1 = _whole(comm, KEY)
    after = "ok"
    try:
        for i in range(20, 30):
            k.allreduce("mm", 2, np.float32, "sum", "recdoubling", i)
    except PolycastError as exc:
        after = _err(exc)
    return {"raised": raised, "seconds": took, "warm_whole": before, "after": after,
            "after_bad": bad[nb:], "after_whole": _whole(comm, KEY) - w1, "bad": bad}


def adopt() -> dict:
    """Warm direct calls, then the replay's step limit 1, 2, 3 on every rank: each call is
    begun by a DirectCall and finished by the engine."""
    bad: list = []
    k = Calls(comm, bad)
    where = os.environ["DIRECT_DIR"]
    rp = comm._driver._comms[comm.id].replay
    cases = [
        ("allreduce", KEY,
         lambda i: k.allreduce("adopt", 4, np.int64, "sum", "recdoubling", i)),
        ("allgather", (AG, "ring", None),
         lambda i: k.allgather("adopt-ag", 2, np.float64, "ring", i)),
        ("reduce_scatter", (RS, "ring", "sum"),
         lambda i: k.reduce_scatter("adopt-rs", 2, np.float32, "sum", "ring", i)),
        ("bcast", (BC, "binomial", 1),
         lambda i: k.bcast("adopt-bc", 3, np.int32, 1, "binomial", i)),
        ("barrier", (BA, "dissemination", None),
         lambda i: k.barrier("adopt-ba", "dissemination", i, where)),
    ]
    i = 0
    for _ in range(6):
        i += 1
        for _, _, f in cases:
            f(i)
    for _ in range(40):         # until every case ran direct on every rank
        if _agreed(comm, all(_whole(comm, key) > 0 for _, key, _ in cases)):
            break
        i += 1
        for _, _, f in cases:
            f(i)
    out: dict = {"kept_before": {name: _whole(comm, key) for name, key, _ in cases},
                 "limits": {}}
    for limit in (1, 2, 3):
        rp.step_limit = limit
        a0 = {name: (_adopted(comm, key), _whole(comm, key)) for name, key, _ in cases}
        nb = len(bad)
        for _ in range(6):
            i += 1
            for _, _, f in cases:
                f(i)
        out["limits"][str(limit)] = {
            name: {"adopted": _adopted(comm, key) - a0[name][0],
                   "whole": _whole(comm, key) - a0[name][1]} for name, key, _ in cases}
        out["limits"][str(limit)]["bad"] = bad[nb:]
    rp.step_limit = -1
    w0 = {name: _whole(comm, key) for name, key, _ in cases}
    for _ in range(6):
        i += 1
        for _, _, f in cases:
            f(i)
    out["whole_after"] = {name: _whole(comm, key) - w0[name] for name, key, _ in cases}
    out["bad"] = bad
    return out


def death() -> dict:
    bad: list = []
    k = Calls(comm, bad)
    for i in range(20):
        k.allreduce("death", 2, np.float32, "sum", "recdoubling", i)
    before = _whole(comm, KEY)
    victim = comm.size - 1
    t0 = time.monotonic()
    raised = "nothing"
    try:
        for i in range(20, 100000):
            if comm.rank == victim and i == 25:
                os._exit(17)                    # mid-loop, after a few more direct calls
            k.allreduce("death", 2, np.float32, "sum", "recdoubling", i)
            if time.monotonic() - t0 > 40:
                break                           # bounded even if nothing is raised
    except PeerLost as exc:
        raised = "PeerLost: " + str(exc)[:200]
    except PolycastError as exc:
        raised = _err(exc)
    return {"raised": raised, "warm_whole": before, "seconds": time.monotonic() - t0,
            "bad": bad}


def late() -> dict:
    """Warm direct calls, then episodes: rank 1 sleeps 50 ms before a call, so its peers'
    frames of that call are there (held early) before it calls; was the late rank's call
    run direct? Barrier (zero-length frames only) and Bcast from root 0 (its entry
    barrier's frames are zero-length), then Allreduce (no zero-length frame) to compare."""
    bad: list = []
    k = Calls(comm, bad)
    where = os.environ["DIRECT_DIR"]
    episodes = int(os.environ.get("DIRECT_EPISODES", "6"))
    cases = [("barrier", (BA, "dissemination", None),
              lambda i: k.barrier("late-ba", "dissemination", i, where)),
             ("bcast", (BC, "binomial", 0),
              lambda i: k.bcast("late-bc", 3, np.float64, 0, "binomial", i)),
             ("allreduce", KEY,
              lambda i: k.allreduce("late-ar", 2, np.float32, "sum", "recdoubling", i))]
    out: dict = {}
    i = 0
    for name, key, f in cases:
        for _ in range(8):
            i += 1
            f(i)
        ran = []
        for _ in range(episodes):
            for _ in range(3):
                i += 1
                f(i)
            w0, a0 = _whole(comm, key), _adopted(comm, key)
            if comm.rank == 1:
                time.sleep(0.05)
            i += 1
            f(i)
            ran.append([_whole(comm, key) - w0, _adopted(comm, key) - a0])
        out[name] = ran
    return {"late": out, "bad": bad}


def dup() -> dict:
    bad: list = []
    k = Calls(comm, bad)
    d = comm.Dup()
    kd = Calls(d, bad)
    for i in range(10):
        k.allreduce("dup-w", 3, np.float32, "sum", "recdoubling", i)
    w_world = _taken(comm, KEY)
    for i in range(10):
        kd.allreduce("dup-d", 3, np.float32, "sum", "recdoubling", i)
    res = {"dup_id": d.id, "world_id": comm.id,
           "world_whole_while_dup": _taken(comm, KEY) - w_world,
           "dup_whole": _taken(d, KEY),
           "dup_kept_cs": [dc.cs.id for dc in _kept(d, KEY)],
           "world_kept_cs": [dc.cs.id for dc in _kept(comm, KEY)],
           "shared": any(a is b for a in _kept(d, KEY) for b in _kept(comm, KEY))}
    # interleaved: each communicator's own DirectCall runs its own calls
    w0, d0 = _taken(comm, KEY), _taken(d, KEY)
    for i in range(10, 20):
        k.allreduce("dup-w", 3, np.float32, "sum", "recdoubling", i)
        kd.allreduce("dup-d", 3, np.float32, "sum", "recdoubling", i)
    res["interleaved"] = [_taken(comm, KEY) - w0, _taken(d, KEY) - d0]
    d.Free()
    res["dup_direct_after_free"] = len(d._dispatch.direct)
    try:
        d.Allreduce(np.ones(3, np.float32), np.empty(3, np.float32), algorithm="recdoubling")
        res["call_after_free"] = "ok"
    except PolycastError as exc:
        res["call_after_free"] = _err(exc)
    # the world communicator still direct and right
    w0 = _taken(comm, KEY)
    for i in range(20, 30):
        k.allreduce("dup-w", 3, np.float32, "sum", "recdoubling", i)
    res["world_after_free"] = _taken(comm, KEY) - w0
    # a second Dup, made after the first was freed, starts with nothing kept
    d2 = comm.Dup()
    res["dup2_direct_new"] = len(d2._dispatch.direct)
    k2 = Calls(d2, bad)
    for i in range(10):
        k2.allreduce("dup2", 3, np.float32, "sum", "recdoubling", i)
    res["dup2_whole"] = _taken(d2, KEY)
    d2.Free()
    res["dup2_direct_after_free"] = len(d2._dispatch.direct)
    res["bad"] = bad
    return res


def mixed() -> dict:
    """Direct calls while other requests are outstanding: a large non-blocking allreduce
    on the engine, a point-to-point message in flight, a small non-blocking allreduce;
    and two threads calling on the world communicator and a Dup of it at once."""
    import threading
    P, r = comm.size, comm.rank
    bad: list = []
    k = Calls(comm, bad)
    res: dict = {}
    for i in range(5):
        k.allreduce("mixed", 4, np.float32, "sum", "recdoubling", i)
    w0 = _whole(comm, KEY)
    for it in range(5):
        big = np.full(1 << 18, r + 1.0, np.float32)
        bigy = np.empty_like(big)
        req = comm.Iallreduce(big, bigy)
        k.allreduce("mixed", 4, np.float32, "sum", "recdoubling", 100 + it)
        req.Wait()
        k.check("mixed-big", it, bigy[:16], np.full(16, P * (P + 1) / 2, np.float32))
    for it in range(10):
        if r == 0:
            sreq = comm.Isend(np.full(3, it, np.int64), dest=1, tag=7)
        k.allreduce("mixed", 4, np.float32, "sum", "recdoubling", 200 + it)
        if r == 1:
            got = np.empty(3, np.int64)
            comm.Recv(got, source=0, tag=7)
            k.check("mixed-p2p", it, got, np.full(3, it, np.int64))
        if r == 0:
            sreq.Wait()
    for it in range(10):
        ins = [_data((12, it), q, 4, np.float32) for q in range(P)]
        b = np.empty(4, np.float32)
        q = comm.Iallreduce(ins[r], b, algorithm="recdoubling")
        k.allreduce("mixed", 4, np.float32, "sum", "recdoubling", 300 + it)
        q.Wait()
        k.check("mixed-nb", it, b, _reduce(ins, "sum"))
    res["direct_while_others"] = _whole(comm, KEY) - w0

    d = comm.Dup()
    kd = Calls(d, bad)
    errs: list = []

    def loop(kk, tag, n=150):
        try:
            for i in range(n):
                kk.allreduce(tag, 4, np.float32, "sum", "recdoubling", 1000 + i)
        except Exception as exc:        # reported, not raised in the thread
            errs.append(_err(exc))

    w0, d0 = _whole(comm, KEY), _whole(d, KEY)
    ts = [threading.Thread(target=loop, args=(k, "thread-world")),
          threading.Thread(target=loop, args=(kd, "thread-dup"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    res["threads_alive"] = [t.is_alive() for t in ts]
    res["thread_errors"] = errs
    res["threads_direct"] = [_whole(comm, KEY) - w0, _whole(d, KEY) - d0]
    if any(res["threads_alive"]):
        print("RESULT " + json.dumps({**res, "bad": bad}), flush=True)
        os._exit(5)
    d.Free()
    res["bad"] = bad
    return res


if __name__ == "__main__":
    comm = polycast.init()
    mode = sys.argv[1]
    try:
        res = {"counted": counted, "args": args, "kept": kept, "env": env, "mismatch": mismatch,
               "adopt": adopt, "death": death, "dup": dup, "mixed": mixed, "late": late}[mode]()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(3)
    print("RESULT " + json.dumps(res), flush=True)
    if mode == "death":
        os._exit(0)         # a peer is gone: skip the orderly goodbye
    polycast.finalize()
