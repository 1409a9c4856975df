"""The engine's point-to-point paths, matching, buffering, errors and timeouts (no sockets)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather, ring_reduce_scatter  # noqa: E402

from polycast.engine.actions import Complete, Copy, Fail, Send, SetTimer  # noqa: E402
from polycast.engine.engine import Engine, EngineConfig  # noqa: E402
from polycast.engine.wire import Header, MsgKind  # noqa: E402
from polycast.errors import (CollectiveTimeout, InvalidArgument, MismatchError,  # noqa: E402
                             PeerLost, ProtocolError)
from polycast.schedule.builder import Builder  # noqa: E402
from polycast.schedule.ir import Layout  # noqa: E402
from polycast.collectives import Collective  # noqa: E402


def ring(P=4, count=10, nchunks=1):
    return ring_allgather(P, count, nchunks)


def send_recv(P=2, count=4):
    """A tiny broadcast: rank 0 sends everything to rank 1 (and copies for itself)."""
    lay = Layout(count)
    b = Builder(Collective.BROADCAST, P, 0, count, "p2p", {"send": lay, "recv": lay})
    b.copy(0, "send", (0,), "recv", (0,))
    b.send(0, 1, "recv", (0,))
    b.recv(1, 0, "recv", (0,))
    return b.build()


# -- every registered point-to-point algorithm, no loss --------------------------------

def _registry_cases():
    # The registry grows while others work; a broken generator module must not hide the
    # engine's own tests, so it becomes one failing case instead of a collection error.
    try:
        from polycast.algorithms import algorithms
        return [pytest.param(a, P, id=f"{a.collective}-{a.name}-P{P}")
                for a in algorithms() if not a.multicast for P in (2, 3, 5, 8)
                if a.unsupported_reason(P) is None]
    except Exception as e:      # noqa: BLE001 - reported by the test below
        return [pytest.param(e, 0, id="registry-import")]


@pytest.mark.parametrize("algo,P", _registry_cases())
def test_point_to_point_algorithms_exact(algo, P):
    if isinstance(algo, Exception):
        raise algo
    from polycast.algorithms import build
    root = P - 1 if algo.collective.rooted else 0
    s = build(algo.collective, algo.name, P, 13, root=root, nchunks=2)
    w = World(P, seed=P)
    ops = ["sum", "max"] if algo.collective.has_op else [None]
    calls = [w.post_call(s, "int32", op=op, seed=i) for i, op in enumerate(ops)]
    w.run()
    for c in calls:
        w.check(c)
    assert all(not e.busy for e in w.engines)


def test_many_requests_outstanding_at_once():
    P = 4
    ag = ring_allgather(P, 50, nchunks=3)
    rs = ring_reduce_scatter(P, 50)
    rs2 = ring_reduce_scatter(P, 41)
    w = World(P, seed=3)
    calls = [w.post_call(ag, "float32"), w.post_call(rs, "float32", op="sum"),
             w.post_call(rs2, "int64", op="prod", seed=5)]
    # All three are in flight together before anything is delivered.
    assert all(e.busy and len(e._reqs) == 3 for e in w.engines)
    w.run()
    for c in calls:
        w.check(c)


def test_in_place_call():
    P = 3
    from polycast.reference import make_inputs, reference
    w = World(P)
    # broadcast in place: the root's send is its recv (the COPY is then a no-op)
    from world import mcast_broadcast
    s = mcast_broadcast(P, 20, root=1)
    inputs = make_inputs("broadcast", P, 20, "float64", root=1, seed=1)
    want = reference("broadcast", inputs, root=1)
    bufs = [x.copy() for x in inputs]
    for r in range(P):
        w.post(r, s, bufs[r] if r == 1 else None, bufs[r])
    w.run()
    for r in range(P):
        np.testing.assert_array_equal(bufs[r], want[r])


def test_avg_integer_floor_division():
    P = 3
    s = ring_reduce_scatter(P, 2)
    w = World(P)
    inputs = [np.array([1, 2, -1, 0, 5, 7], np.int32) + r for r in range(P)]
    c = w.post_call(s, op="avg", inputs=inputs)
    w.run()
    w.check(c)
    np.testing.assert_array_equal(c.recvs[2], np.floor_divide(sum(inputs), 3)[4:6])


# -- matching: early messages, held messages, stale and duplicate ---------------------

def test_messages_before_post_are_held_then_used():
    s = send_recv(count=8)
    w = World(2)
    src = np.arange(8, dtype=np.float32)
    dst = np.zeros(8, np.float32)
    w.post(0, s, src, np.zeros(8, np.float32))
    w.advance(1.0)                  # the message reaches rank 1 before it posts
    e1 = w.engines[1]
    assert e1.stats.early_nbytes > 0 and not w.done.get((1, 0))
    w.post(1, s, None, dst)
    w.run()
    np.testing.assert_array_equal(dst, src)
    assert e1.stats.early_nbytes == 0


def test_early_buffer_overflow_fails_clearly_on_every_rank():
    s = send_recv(count=1000)
    w = World(2, EngineConfig(max_early_nbytes=1000))
    w.post(0, s, np.ones(1000, np.float32), np.zeros(1000, np.float32))
    w.advance(1.0)
    assert w.engines[1].stats.drops.get("early_overflow") == 1
    w.post(1, s, None, np.zeros(1000, np.float32))
    w.run()
    err = w.errors[(1, 0)]
    assert isinstance(err, ProtocolError) and "max_early_nbytes=1000" in str(err)
    assert w.engines[1].stats.early_nbytes == 0


def test_early_messages_left_behind_by_a_failed_post_are_released():
    # An ABORT held before the post fails the call as soon as it is replayed; what was
    # held behind it must give its bytes back, or the budget shrinks for good.
    s = send_recv(count=8)
    e1 = Engine(1, 2)
    sig = 0
    e1.on_message(0, Header(MsgKind.ABORT, 0, 0, 0, 3, 0, 4, sig), b"oops", 0.0)
    for tag in (0, 1):
        e1.on_message(0, Header(MsgKind.DATA, 0, 0, 0, tag, 0, 32, sig), bytes(32), 0.0)
    assert e1.stats.early_nbytes > 64
    out = e1.post(0, s, 4, 0.0)
    assert any(isinstance(a, Fail) for a in out) and not e1.busy
    assert e1.stats.early_nbytes == 0


def test_stale_and_duplicate_and_foreign_messages_dropped():
    s = send_recv(count=4)
    w = World(2)
    dst = np.zeros(4, np.float32)
    w.post(0, s, np.arange(4, dtype=np.float32), np.zeros(4, np.float32))
    w.post(1, s, None, dst)
    w.run()
    e1 = w.engines[1]
    sig = w.sent[0][2].sig
    payload = np.full(4, 7, np.float32).tobytes()
    stale = Header(MsgKind.DATA, 0, 0, 0, 0, 0, 16, sig)
    w.inject_message(1, 0, stale, payload)                     # seq 0 is finished
    foreign = Header(MsgKind.DATA, 9, 1, 0, 0, 0, 16, sig)
    w.inject_message(1, 0, foreign, payload)
    spoofed = Header(MsgKind.DATA, 0, 1, 0, 0, 0, 16, sig)     # claims src 0, came from 1?
    w.inject_message(1, 1, spoofed, payload)
    assert e1.stats.drops == {"stale": 1, "foreign_comm": 1, "bad_src": 1}
    np.testing.assert_array_equal(dst, np.arange(4))           # untouched


def test_post_validates_before_sending():
    e = Engine(0, 4)
    with pytest.raises(InvalidArgument, match="for 3 ranks but this communicator has 4"):
        e.post(0, ring(P=3), 4, 0.0)
    with pytest.raises(InvalidArgument, match="itemsize"):
        e.post(0, ring(P=4), 0, 0.0)
    e.post(0, ring(P=4), 4, 0.0)
    with pytest.raises(InvalidArgument, match="already outstanding"):
        e.post(0, ring(P=4), 4, 0.0)
    with pytest.raises(InvalidArgument, match="valid ranks are 0..3"):
        Engine(4, 4)
    with pytest.raises(InvalidArgument, match="mtu_nbytes"):
        Engine(0, 2, config=EngineConfig(mtu_nbytes=10))


def test_buffers_checked_against_schedule():
    from polycast.memory import Buffers
    s = ring(P=4, count=10)
    with pytest.raises(InvalidArgument, match="needs a recv buffer of 40 elements on rank 1, "
                                              "got 39"):
        Buffers().register(0, s, 1, np.zeros(10), np.zeros(39))
    with pytest.raises(InvalidArgument, match="dtypes differ"):
        Buffers().register(0, s, 1, np.zeros(10, np.float32), np.zeros(40))
    with pytest.raises(InvalidArgument, match="unknown reduction op 'median'"):
        Buffers().register(0, ring_reduce_scatter(4, 2), 0, np.zeros(8), np.zeros(2),
                           "median")


def test_first_actions_are_sends_copies_and_a_timer():
    e = Engine(0, 4)
    acts = e.post(7, ring(P=4, count=8), 4, 0.0)
    assert any(isinstance(a, SetTimer) and a.deadline == 60.0 for a in acts)
    copies = [a for a in acts if isinstance(a, Copy)]
    sends = [a for a in acts if isinstance(a, Send)]
    assert len(copies) == 1 and copies[0].dst.runs == ((0, 8),) and copies[0].dst.nbytes == 32
    assert len(sends) == 1 and sends[0].peer == 1 and sends[0].header.length == 32
    assert sends[0].header.kind is MsgKind.DATA and sends[0].header.seq == 0
    assert e.busy


# -- mismatches ----------------------------------------------------------------------

def test_mismatched_calls_fail_on_every_rank():
    P = 4
    w = World(P)
    a = ring(P, 10)
    b = ring(P, 12)
    for r in range(P):
        s = b if r == 2 else a
        n = s.count
        w.post(r, s, np.zeros(n, np.float32), np.zeros(P * n, np.float32))
    w.run()
    assert len(w.errors) == P and not w.done
    for r in range(P):
        assert isinstance(w.errors[(r, 0)], MismatchError), w.errors[(r, 0)]
    assert all("allgather ring" in str(e) for e in w.errors.values())
    # the odd rank and every rank that detected it name both calls
    both = [r for r in range(P) if "count=12" in str(w.errors[(r, 0)])
            and "count=10" in str(w.errors[(r, 0)])]
    assert 2 in both and len(both) >= 2, {r: str(e) for (r, _), e in w.errors.items()}
    assert all(not e.busy for e in w.engines)


def test_dtype_mismatch_detected():
    P = 2
    w = World(P)
    s = ring_reduce_scatter(P, 4)
    w.post(0, s, np.zeros(8, np.float32), np.zeros(4, np.float32), "sum")
    w.post(1, s, np.zeros(8, np.int32), np.zeros(4, np.int32), "sum")
    w.run()
    assert all(isinstance(w.errors[(r, 0)], MismatchError) for r in range(P))


def test_length_mismatch_is_a_mismatch():
    s = send_recv(count=4)
    e = Engine(1, 2)
    e.post(0, s, 4, 0.0)
    sig = e._reqs[0].sig
    acts = e.on_message(0, Header(MsgKind.DATA, 0, 0, 0, 0, 0, 12, sig), b"x" * 12, 0.0)
    aborts = [a for a in acts if isinstance(a, Send) and a.header.kind is MsgKind.ABORT]
    assert [a.peer for a in aborts] == [0] and b"expects 16 bytes" in aborts[0].data
    # it waits briefly for the other side to describe its call, then fails regardless
    assert not any(isinstance(a, Fail) for a in acts)
    grace = next(a for a in acts if isinstance(a, SetTimer) and a.deadline < 1.0)
    fails = [a for a in e.on_timer(grace.timer, grace.deadline) if isinstance(a, Fail)]
    assert fails and isinstance(fails[0].error, MismatchError)
    assert "expects 16 bytes from rank 0" in str(fails[0].error)
    assert not e.busy


# -- timeouts and lost peers -----------------------------------------------------------

def test_timeout_names_rank_collective_and_step():
    P = 3
    w = World(P, EngineConfig(op_timeout_s=2.0))
    s = ring(P=P, count=6)
    for r in (0, 1):                # rank 2 never posts
        w.post(r, s, np.zeros(6, np.float32), np.zeros(18, np.float32))
    w.posted.add((2, 0))            # so run() waits for it too ...
    w.dead.add(2)                   # ... but it never acts
    w.run(max_time_s=10.0)
    for r in (0, 1):
        err = w.errors[(r, 0)]
        assert isinstance(err, CollectiveTimeout)
        assert f"rank {r}: allgather ring" in str(err)
    assert "step" in str(w.errors[(1, 0)]) and "from rank 0" in str(w.errors[(1, 0)]) or \
        "aborted by rank" in str(w.errors[(1, 0)])
    assert w.engines[0].stats.timeouts + w.engines[1].stats.timeouts >= 1
    assert w.now < 3.0


def test_peer_lost_fails_requests_that_need_it():
    P = 4
    w = World(P)
    s = ring(P=P, count=6)
    w.post_call(s, ranks=[0, 1, 2])
    w.posted.add((3, 0))
    w.kill(3)
    w.run(max_time_s=1.0)
    for r in range(3):
        err = w.errors[(r, 0)]
        assert isinstance(err, PeerLost) and err.rank == 3, err
    # a later call that needs the dead rank fails at once
    w.post(0, s, np.zeros(6, np.float32), np.zeros(24, np.float32), req=5)
    assert isinstance(w.errors[(0, 5)], PeerLost)


def test_send_done_completes_send_steps():
    s = send_recv()
    e = Engine(0, 2)
    acts = e.post(0, s, 4, 0.0)
    send = next(a for a in acts if isinstance(a, Send))
    assert e.busy
    done = e.on_send_done(send.token, 0.1)
    assert [type(a) for a in done if isinstance(a, Complete)] == [Complete]
    assert not e.busy and e.stats.completed == 1
    assert e.on_send_done(send.token, 0.2) == []          # unknown token: ignored


def test_peer_lost_spares_requests_that_do_not_need_it():
    s = send_recv(P=3, count=4)             # ranks 0 and 1 talk; rank 2 has nothing to do
    w = World(3)
    src = np.arange(4, dtype=np.float32)
    dst = np.zeros(4, np.float32)
    w.post(0, s, src, np.zeros(4, np.float32))
    w.post(1, s, None, dst)
    w.kill(2, notify_after_s=0.0)
    w.run(max_time_s=1.0)
    assert (0, 0) in w.done and (1, 0) in w.done and not w.errors
    np.testing.assert_array_equal(dst, src)
    # but the next call that needs rank 2 fails at once, naming it
    w.post(0, ring(P=3, count=2), np.zeros(2, np.float32), np.zeros(6, np.float32), req=1)
    err = w.errors[(0, 1)]
    assert isinstance(err, PeerLost) and err.rank == 2 and "lost earlier" in str(err)
