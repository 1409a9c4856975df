"""The communicator's per-call memo (Dispatch.post): a repeated call takes what it derives
(schedule, pipelining, dtype, op) from the memo, and an entry never serves a call whose
arguments differ from the one that made it. The communicator's settings (polycast.config)
are fixed when it is made, so they are not part of the key."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

from polycast import config
from polycast.collectives import Collective
from polycast.errors import InvalidArgument, PolycastError


class _FakeDriver:
    rank = 0


def _comm(monkeypatch, tmp_path, env: dict | None = None, **kw):
    """A communicator on a fake driver whose posts are recorded, with the settings the
    environment ``env`` gives (read once, now, as a real communicator's)."""
    from polycast.comm import Comm
    env = {"POLYCAST_PROFILE": str(tmp_path / "none.json"), **(env or {})}  # built-in model
    comm = Comm(_FakeDriver(), 0, [0, 1, 2, 3], 60.0, config=config.load(env), **kw)
    posted = []
    comm._dispatch.post_built = lambda sched, send, recv, itemsize, dtname, opname, after=None: \
        posted.append((sched.collective, sched.algorithm, sched.count, sched.root,
                       sched.options.get("nchunks", 1), itemsize, dtname, opname)) or sched
    return comm, posted


def _post(comm, posted, coll, count, root, op, algorithm, dtype):
    comm._post(coll, None, None, count, root, op, algorithm, dtype)
    return posted[-1]


def _outcome(comm, posted, *args):
    """What a call posts, or the error it raises (type and message)."""
    try:
        return _post(comm, posted, *args)
    except PolycastError as exc:
        return type(exc).__name__, str(exc)


CASES = [(Collective.ALLREDUCE, "sum"), (Collective.ALLREDUCE, "max"),
         (Collective.BROADCAST, None), (Collective.ALLGATHER, None),
         (Collective.REDUCE, "prod"), (Collective.REDUCE_SCATTER, "min")]


ENVS = [{}, {"POLYCAST_NCHUNKS": "2"}, {"POLYCAST_NCHUNKS": "3"},
        {"POLYCAST_ALLREDUCE_ALGO": "ring", "POLYCAST_BROADCAST_ALGO": "ring"},
        {"POLYCAST_ALLGATHER_ALGO": "ring", "POLYCAST_NCHUNKS": "1"}]


@pytest.mark.parametrize("env", ENVS)
def test_memo_never_serves_a_call_that_differs(monkeypatch, tmp_path, env):
    """A long random sequence of calls on a communicator with these settings: each call
    posts exactly what a communicator without any memo (a fresh one, the same settings)
    posts for it."""
    comm, posted = _comm(monkeypatch, tmp_path, env)
    rnd = random.Random(9)
    seen_hits = 0
    for i in range(200):
        coll, op = rnd.choice(CASES)
        count = rnd.choice([1, 2, 4, 1 << 16, 1 << 20])
        root = rnd.choice([0, 1, 3]) if coll.rooted else 0
        dtype = np.dtype(rnd.choice(["float32", "float64", "int32"]))
        algorithm = rnd.choice([None, None, "ring", "auto", "binomial"])
        args = (coll, count, root, op, algorithm, dtype)
        fresh, fresh_posted = _comm(monkeypatch, tmp_path, env)
        want = _outcome(fresh, fresh_posted, *args)
        for _ in range(rnd.choice([1, 2])):         # a repeat is served by the memo
            before = dict(comm._dispatch.calls)
            assert _outcome(comm, posted, *args) == want, (i, args)
            seen_hits += comm._dispatch.calls == before and len(before) > 0 \
                and isinstance(want[0], Collective)
    assert seen_hits > 50           # the memo was used, not just filled


def test_memo_checks_what_it_keys(monkeypatch, tmp_path):
    comm, posted = _comm(monkeypatch, tmp_path)
    f4 = np.dtype("float32")
    a = _post(comm, posted, Collective.BROADCAST, 4, 1, None, "binomial", f4)
    assert a[3] == 1 and a[1] == "binomial"
    # bool is an int, equal to 1 and hashing as 1: still refused, never the root-1 entry
    with pytest.raises(InvalidArgument, match="root"):
        comm._post(Collective.BROADCAST, None, None, 4, True, None, "binomial", f4)
    with pytest.raises(InvalidArgument, match="root"):
        comm._post(Collective.BROADCAST, None, None, 4, 4, None, "binomial", f4)
    # another op, dtype, count or algorithm: another entry
    assert _post(comm, posted, Collective.ALLREDUCE, 4, 0, "sum", None, f4)[7] == "sum"
    assert _post(comm, posted, Collective.ALLREDUCE, 4, 0, "max", None, f4)[7] == "max"
    assert _post(comm, posted, Collective.ALLREDUCE, 4, 0, "max", None,
                 np.dtype("float64"))[5:7] == (8, "float64")
    assert _post(comm, posted, Collective.ALLREDUCE, 4, 0, "max", "ring", f4)[1] == "ring"
    # the settings are the communicator's, read when it was made: a variable set later
    # changes nothing for it; one made then takes it (the variable wins over auto,
    # NCHUNKS over the planner)
    auto = _post(comm, posted, Collective.ALLREDUCE, 4, 0, "max", None, f4)
    monkeypatch.setenv("POLYCAST_ALLREDUCE_ALGO", "binomial")
    monkeypatch.setenv("POLYCAST_NCHUNKS", "2")
    assert _post(comm, posted, Collective.ALLREDUCE, 4, 0, "max", None, f4) == auto
    later, later_posted = _comm(monkeypatch, tmp_path, {
        "POLYCAST_ALLREDUCE_ALGO": "binomial", "POLYCAST_NCHUNKS": "2"})
    got = _post(later, later_posted, Collective.ALLREDUCE, 4, 0, "max", None, f4)
    assert got[1] == "binomial" and got[4] == 2
    with pytest.raises(InvalidArgument, match="POLYCAST_NCHUNKS='x'"):
        _comm(monkeypatch, tmp_path, {"POLYCAST_NCHUNKS": "x"})
    bad, _ = _comm(monkeypatch, tmp_path, {"POLYCAST_ALLREDUCE_ALGO": "nonsense"})
    with pytest.raises(InvalidArgument, match="ring"):
        bad._post(Collective.ALLREDUCE, None, None, 4, 0, "max", None, f4)
    # an unknown op is refused on every call, cached or not
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            comm._post(Collective.ALLREDUCE, None, None, 4, 0, "nope", "ring", f4)
    # unhashable arguments take the full path (and its error)
    with pytest.raises(Exception):
        comm._post(Collective.ALLREDUCE, None, None, 4, 0, "sum", ["ring"], f4)
    # a freed communicator refuses even a call it has memoized
    comm._freed = True
    with pytest.raises(InvalidArgument, match="freed"):
        comm._post(Collective.BROADCAST, None, None, 4, 1, None, "binomial", f4)


def test_memo_is_bounded(monkeypatch, tmp_path):
    from polycast.dispatch import call as core
    comm, posted = _comm(monkeypatch, tmp_path)
    for n in range(1, 3 * core._CALLS_MAX):
        _post(comm, posted, Collective.ALLGATHER, n, 0, None, "ring", np.dtype("uint8"))
        assert len(comm._dispatch.calls) <= core._CALLS_MAX


def test_multicast_fallback_warns_on_every_call(monkeypatch, tmp_path):
    comm, posted = _comm(monkeypatch, tmp_path, mcast_error="cannot join (test)")
    for _ in range(2):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = _post(comm, posted, Collective.ALLGATHER, 1 << 18, 0, None, "mcast",
                        np.dtype("uint8"))
        assert "mcast" not in got[1]
        assert any("multicast" in str(x.message) for x in w)


def test_debug_logs_every_call(monkeypatch, tmp_path, capsys):
    comm, posted = _comm(monkeypatch, tmp_path, {"POLYCAST_DEBUG": "TRACE"})
    for _ in range(3):
        _post(comm, posted, Collective.ALLREDUCE, 2, 0, "sum", None, np.dtype("float32"))
    assert capsys.readouterr().err.count("allreduce") >= 3
