"""Point-to-point in the engine (engine/p2p.py), over the engine's test world: MPI
matching (source, tag, ANY_SOURCE, ANY_TAG), non-overtaking, eager and rendezvous sizes,
messages to self, truncation, timeouts, lost peers, bounded memory; and p2p interleaved
with collectives on the same engine."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather  # noqa: E402

from polycast.engine.engine import EngineConfig  # noqa: E402
from polycast.engine.p2p import ANY_SOURCE, ANY_TAG  # noqa: E402
from polycast.engine.wire import MsgKind  # noqa: E402
from polycast.errors import (CollectiveTimeout, InvalidArgument, PeerLost,  # noqa: E402
                             ProtocolError)

SMALL = EngineConfig(eager_max_nbytes=64)


@pytest.mark.parametrize("n", [3, 16, 1000])        # eager, and rendezvous above 64 bytes
def test_send_recv_either_order(n):
    for recv_first in (False, True):
        w = World(2, SMALL)
        x = np.arange(n, dtype=np.float64)
        y = np.zeros(n)
        if recv_first:
            rr = w.recv(1, 0, 7, y)
            sr = w.send(0, 1, 7, x)
        else:
            sr = w.send(0, 1, 7, x)
            w.advance(0.01)
            rr = w.recv(1, 0, 7, y)
        w.run()
        assert (0, sr) in w.done and (1, rr) in w.done
        np.testing.assert_array_equal(y, x)
        assert w.matched[(1, rr)] == (0, 7, 8 * n)
        rdv = [h for _, _, h in w.sent if h.kind is MsgKind.P2P_RTS]
        assert bool(rdv) == (8 * n > 64) or (recv_first and 8 * n > 64)
        assert all(e.stats.early_nbytes == 0 and not e.busy for e in w.engines)


def test_matching_by_tag_any_tag_any_source_and_non_overtaking():
    w = World(3, SMALL)
    # rank 0 sends tags 1, 2, 1 (the last large); rank 2 sends tag 1
    a = [np.full(2, v, np.int64) for v in (10, 20, 30)]
    big = np.full(40, 31, np.int64)
    w.send(0, 1, 1, a[0])
    w.send(0, 1, 2, a[1])
    w.send(0, 1, 1, big)
    w.send(2, 1, 1, a[2])
    w.advance(0.01)
    got = {}
    for name, src, tag, n in (("t2", 0, 2, 2), ("first1", 0, 1, 2), ("any", ANY_SOURCE, 1, 40),
                              ("rest", ANY_SOURCE, ANY_TAG, 2)):
        buf = np.zeros(n, np.int64)
        got[name] = (w.recv(1, src, tag, buf), buf)
    w.run()
    vals = {k: (b[0], w.matched[(1, r)][:2]) for k, (r, b) in got.items()}
    assert vals["t2"] == (20, (0, 2))
    assert vals["first1"] == (10, (0, 1))            # not overtaken by the later tag-1 one
    assert vals["any"][1][1] == 1
    # ANY_SOURCE tag 1 took the first tag-1 message to arrive; the rest took the other
    assert {vals["any"][0], vals["rest"][0]} == {31, 30}
    assert not w.errors


def test_message_to_self_waits_for_its_receive():
    w = World(2, SMALL)
    x = np.arange(5, dtype=np.int32)
    y = np.zeros(5, np.int32)
    s = w.send(1, 1, 3, x)
    w.advance(0.01)
    assert (1, s) not in w.done
    r = w.recv(1, ANY_SOURCE, ANY_TAG, y)
    w.run()
    assert (1, s) in w.done and (1, r) in w.done and y.tolist() == [0, 1, 2, 3, 4]
    assert w.matched[(1, r)] == (1, 3, 20)


def test_truncation_fails_the_receive_and_a_rendezvous_sender():
    w = World(2, SMALL)
    w.send(0, 1, 0, np.zeros(4, np.int64))              # eager, 32 bytes
    s = w.send(0, 1, 1, np.zeros(100, np.int64))        # rendezvous, 800 bytes
    r1 = w.recv(1, 0, 0, np.zeros(2, np.int64))
    r2 = w.recv(1, 0, 1, np.zeros(10, np.int64))
    w.run()
    assert isinstance(w.errors[(1, r1)], InvalidArgument)
    assert "truncation" in str(w.errors[(1, r1)])
    assert isinstance(w.errors[(1, r2)], InvalidArgument)
    assert isinstance(w.errors[(0, s)], InvalidArgument) and "room for 80" in str(
        w.errors[(0, s)])
    # the next messages are fine
    y = np.zeros(3, np.int64)
    w.send(0, 1, 0, np.arange(3, dtype=np.int64))
    w.recv(1, 0, 0, y)
    w.run()
    assert y.tolist() == [0, 1, 2]
    assert all(e.stats.early_nbytes == 0 and not e.busy for e in w.engines)


def test_timeouts_name_the_call():
    w = World(2, EngineConfig(op_timeout_s=2.0, eager_max_nbytes=64))
    r = w.recv(1, 0, 5, np.zeros(1))
    s = w.send(0, 1, 9, np.zeros(100))                  # rendezvous: never cleared
    w.run()
    assert isinstance(w.errors[(1, r)], CollectiveTimeout)
    assert "Recv from rank 0, tag 5" in str(w.errors[(1, r)])
    assert isinstance(w.errors[(0, s)], CollectiveTimeout)
    assert "clear-to-send" in str(w.errors[(0, s)])


def test_lost_peer_fails_its_sends_receives_and_any_source():
    w = World(3, SMALL)
    r_from = w.recv(0, 2, 0, np.zeros(1))
    r_any = w.recv(0, ANY_SOURCE, 0, np.zeros(1))
    s_to = w.send(1, 2, 0, np.zeros(100))
    for rank in (0, 1):
        w._execute(rank, w.engines[rank].on_peer_lost(2, w.now, "killed"))
    w.run()
    for key in ((0, r_from), (0, r_any), (1, s_to)):
        assert isinstance(w.errors[key], PeerLost) and "killed" in str(w.errors[key])
    assert all(not w.engines[r].busy for r in (0, 1))


def test_unexpected_messages_are_bounded():
    w = World(2, EngineConfig(max_early_nbytes=4096, eager_max_nbytes=1024))
    for _ in range(10):
        w.send(0, 1, 0, np.zeros(100, np.float64))          # 800 bytes, eager
    w.advance(0.01)
    assert w.engines[1].stats.early_nbytes <= 4096
    bufs = [np.zeros(100) for _ in range(10)]
    reqs = [w.recv(1, 0, 0, b) for b in bufs]
    w.run()
    failed = [r for r in reqs if (1, r) in w.errors]
    assert failed and all(isinstance(w.errors[(1, r)], ProtocolError) for r in failed)
    assert "overflowed max_early_nbytes" in str(w.errors[(1, failed[0])])
    # large messages never cost the receiver their payload before a receive is posted
    w2 = World(2, EngineConfig(max_early_nbytes=4096, eager_max_nbytes=1024))
    for _ in range(10):
        w2.send(0, 1, 0, np.zeros(10000, np.float64))
    w2.advance(0.01)
    assert w2.engines[1].stats.early_nbytes <= 10 * 64
    out = [np.zeros(10000) for _ in range(10)]
    for b in out:
        w2.recv(1, 0, 0, b)
    w2.run()
    assert not w2.errors


def test_p2p_and_collectives_share_an_engine():
    P = 3
    w = World(P, SMALL)
    s = ring_allgather(P, 4)
    outs = [np.zeros(12, np.float32) for _ in range(P)]
    y = np.zeros(50)
    w.send(0, 2, 4, np.arange(50.0))
    for r in range(P):
        w.post(r, s, np.full(4, r, np.float32), outs[r])
    w.recv(2, 0, 4, y)
    w.run()
    assert not w.errors
    assert y.tolist() == list(np.arange(50.0))
    assert all(o.tolist() == [0] * 4 + [1] * 4 + [2] * 4 for o in outs)


def test_bad_arguments_raise_before_anything_is_sent():
    w = World(2)
    with pytest.raises(InvalidArgument, match="rank 5 out of range"):
        w.engines[0].post_send(100, 5, 0, 8, 8, 0.0)
    with pytest.raises(InvalidArgument, match="tag -3"):
        w.engines[0].post_recv(101, 1, -3, 8, 8, 0.0)
    with pytest.raises(InvalidArgument, match="rank -2 out of range"):
        w.engines[0].post_send(102, ANY_SOURCE, 0, 8, 8, 0.0)


def test_cancel_of_an_unmatched_receive_and_nothing_else():
    w = World(2, EngineConfig(op_timeout_s=2.0, eager_max_nbytes=64))
    y = np.zeros(3, np.int64)
    r = w.recv(1, 0, 4, y)
    acts = w.engines[1].cancel_recv(r)
    w._execute(1, acts)
    assert (1, r) in w.done and not w.engines[1].busy     # left the posted queue
    # the message it would have taken goes to the next receive, and nothing times out
    s = w.send(0, 1, 4, np.arange(3, dtype=np.int64))
    r2 = w.recv(1, 0, 4, y)
    w.run()
    assert (0, s) in w.done and (1, r2) in w.done and y.tolist() == [0, 1, 2]
    assert not w.errors
    # matched (rendezvous data on its way), ended, or a send: not cancellable
    r3 = w.recv(1, 0, 5, np.zeros(100, np.int64))
    s3 = w.send(0, 1, 5, np.zeros(100, np.int64))        # rendezvous: 800 bytes
    for _ in range(1000):                                # until its RTS has matched r3
        if w.engines[1]._awaiting_data:
            break
        w.advance(1e-7)
    assert (1, r3) not in w.done and w.engines[1].cancel_recv(r3) is None
    assert w.engines[0].cancel_recv(s3) is None
    assert w.engines[1].cancel_recv(r) is None
    w.run()
    assert (1, r3) in w.done and (0, s3) in w.done and not w.errors


def test_matched_probe_then_mrecv_eager_and_rendezvous():
    w = World(2, SMALL)
    w.send(0, 1, 3, np.arange(2, dtype=np.int64))              # eager
    w.send(0, 1, 3, np.arange(20, dtype=np.int64))             # rendezvous
    w.advance(0.01)
    e = w.engines[1]
    first = e.improbe(0, 3)
    second = e.improbe(ANY_SOURCE, ANY_TAG)
    assert first[:3] == (0, 3, 16) and second[:3] == (0, 3, 160)
    assert e.improbe(ANY_SOURCE, ANY_TAG) is None and e.iprobe(0, 3) is None
    y2, y20 = np.zeros(2, np.int64), np.zeros(20, np.int64)
    r20 = w._next_req[1]
    w._next_req[1] += 1
    w.mem[1].register_arrays(r20, recv=y20)
    w.posted.add((1, r20))
    w._execute(1, e.post_mrecv(r20, second[3], y20.nbytes, 8, w.now))   # second first
    r2 = w._next_req[1]
    w._next_req[1] += 1
    w.mem[1].register_arrays(r2, recv=y2)
    w.posted.add((1, r2))
    w._execute(1, e.post_mrecv(r2, first[3], y2.nbytes, 8, w.now))
    w.run()
    assert y2.tolist() == [0, 1] and y20.tolist() == list(range(20)) and not w.errors
    assert all(x.stats.early_nbytes == 0 and not x.busy for x in w.engines)
