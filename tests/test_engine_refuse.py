"""No call may poison the next, at the engine: a call one rank refuses fails on every rank
and keeps sequence numbers in step; rooted schedules agree before anyone finishes; a
mismatch found after the other rank's call ended still names that call; a request the
driver cannot carry out fails on every rank."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather  # noqa: E402

from polycast.algorithms import build, supported  # noqa: E402
from polycast.collectives import Collective  # noqa: E402
from polycast.errors import InvalidArgument, MismatchError  # noqa: E402
from polycast.schedule.guard import agreed, heard_from  # noqa: E402
from polycast.schedule.verify import verify  # noqa: E402


def _gather(P, count, root, guard=True):
    s = build("gather", "linear", P, count, root=root)
    return agreed(s) if guard else s


@pytest.mark.parametrize("guard", [True, False])
def test_refused_gather_fails_everywhere_and_the_next_call_is_clean(guard):
    """The issue's example: the root's recvbuf is too small, so the root refuses. With the
    agreement barrier every rank fails; without it the senders report success (the bug),
    but either way the root's next call gets fresh data, never the refused call's."""
    P, root = 4, 0
    w = World(P)
    s = _gather(P, 2, root, guard)
    for r in range(1, P):
        w.post(r, s, np.full(2, r, np.int64), None)
    w._execute(root, w.engines[root].refuse("rank 0: Gather: recvbuf too small", w.now))
    w.run()
    failed = {r for (r, _), e in w.errors.items() if isinstance(e, InvalidArgument)}
    if guard:
        assert failed == {1, 2, 3}
        assert all("rank 0 could not run it" in str(w.errors[(r, 0)]) for r in failed)
        assert all("recvbuf too small" in str(w.errors[(r, 0)]) for r in failed)
    else:
        assert not failed and len(w.done) == P - 1      # what the guard is there for
    # The next gather: rank r sends 10 + r; the root must see exactly that.
    s1 = _gather(P, 1, root, guard)
    out = np.zeros(P, np.int64)
    for r in range(P):
        w.post(r, s1, np.full(1, 10 + r, np.int64), out if r == root else None)
    w.run()
    assert out.tolist() == [10, 11, 12, 13]
    assert all(not e.busy for e in w.engines)
    assert all(e.stats.early_nbytes == 0 for e in w.engines)


def test_refusal_before_the_peers_post_is_held_for_them():
    P = 3
    w = World(P)
    s = ring_allgather(P, 4)
    w._execute(1, w.engines[1].refuse("rank 1: bad buffer", w.now))
    w.run(until_finished=False)
    for r in (0, 2):                            # they post after the ABORT arrived
        w.post(r, s, np.zeros(4, np.float32), np.zeros(12, np.float32))
    w.run()
    assert {r for (r, _) in w.errors} == {0, 2}
    assert all(isinstance(e, InvalidArgument) for e in w.errors.values())


@pytest.mark.parametrize("coll", ["broadcast", "reduce", "gather", "scatter"])
def test_agreed_rooted_schedules_verify_and_hear_from_everyone(coll):
    for P in (2, 3, 5, 8):
        for name in supported(coll, P):
            s = agreed(build(coll, name, P, 6, root=P // 2))
            verify(s)
            assert set(heard_from(s)) == {(1 << P) - 1}, (coll, name, P)


def test_all_to_all_collectives_need_no_agreement_step():
    for coll in ("allreduce", "allgather", "reduce_scatter", "alltoall", "barrier"):
        for name in supported(coll, 6):
            s = build(coll, name, 6, 12)
            assert agreed(s) is s
            assert set(heard_from(s)) == {(1 << 6) - 1}, (coll, name)


def test_a_mismatch_found_after_the_other_call_ended_names_it():
    """Rank 1 (a broadcast root, no agreement step) finishes its call; rank 0 posts a
    different one and finds the mismatch only then: rank 1 answers from its memory of
    recent calls, so rank 0's error names both calls."""
    w = World(2)
    w.post(1, build("broadcast", "direct", 2, 4, root=1), np.arange(4, dtype=np.float32),
           np.zeros(4, np.float32))
    w.run()
    assert (1, 0) in w.done
    w.post(0, build("broadcast", "direct", 2, 5, root=1), None, np.zeros(5, np.float32))
    w.run()
    err = w.errors[(0, 0)]
    assert isinstance(err, MismatchError)
    assert "count=5" in str(err) and "count=4" in str(err) and "already over" in str(err)


def test_abort_from_the_driver_fails_the_request_on_every_rank():
    P = 3
    w = World(P)
    s = ring_allgather(P, 4)
    for r in range(P):
        w.post(r, s, np.zeros(4, np.float32), np.zeros(12, np.float32))
    w._execute(2, w.engines[2].abort(0, "its data could not be placed: read-only", w.now))
    w.run()
    assert {r for (r, _) in w.errors} == {0, 1, 2}
    assert all(isinstance(e, InvalidArgument) and "read-only" in str(e)
               for e in w.errors.values())
    assert all(not e.busy for e in w.engines)


def test_every_rank_names_both_calls_of_a_mismatch():
    """Ranks that called as the detector did wait for the odd call's description (which
    it sends to everyone), so no error names only one call."""
    for odd in range(4):
        P = 4
        w = World(P)
        a, b = ring_allgather(P, 10), ring_allgather(P, 12)
        for r in range(P):
            s = b if r == odd else a
            w.post(r, s, np.zeros(s.count, np.float32), np.zeros(P * s.count, np.float32))
        w.run()
        assert len(w.errors) == P and not w.done
        for (r, _), e in w.errors.items():
            assert isinstance(e, MismatchError), e
            assert "count=10" in str(e) and "count=12" in str(e), (odd, r, str(e))
        assert all(not e.busy for e in w.engines)
