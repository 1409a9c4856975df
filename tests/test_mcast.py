"""The reliable-multicast protocol, state by state, in the fake-clock world."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import Net, World, mcast_allgather, mcast_broadcast  # noqa: E402

from polycast.engine.actions import Multicast, SetTimer  # noqa: E402
from polycast.engine.engine import Engine, EngineConfig  # noqa: E402
from polycast.engine.wire import Header, MsgKind  # noqa: E402
from polycast.errors import CollectiveTimeout, MismatchError, PeerLost  # noqa: E402

SMALL = EngineConfig(mtu_nbytes=64)         # 16 float32 per datagram: many chunks


def control_kinds(w: World) -> set:
    return {h.kind for _, _, h in w.sent if h.kind is not MsgKind.DATA}


# -- the no-loss handshake: exactly one control message per rank -----------------------

@pytest.mark.parametrize("P", [2, 3, 8, 16])
def test_no_loss_broadcast_sends_exactly_one_fin_per_rank(P):
    w = World(P, SMALL, seed=P)
    c = w.post_call(mcast_broadcast(P, 100, root=P // 2))
    w.run()
    w.check(c)
    w.advance(1.0)                  # the spaced EOS repeats leave after the request is done
    for r in range(P):
        sent = [(peer, h.kind) for rank, peer, h in w.sent if rank == r]
        assert sent == [((r + 1) % P, MsgKind.FIN)], (r, sent)
        assert w.engines[r].stats.control_messages_out == 1
        assert w.engines[r].stats.recovery_requests == 0
    # the root sent 7 data datagrams (100 floats / 16) + 3 EOS
    assert w.engines[P // 2].stats.datagrams_out == 7 + 3


def test_no_loss_allgather_only_fins_and_tokens():
    P = 6
    w = World(P, SMALL, seed=1)
    c = w.post_call(mcast_allgather(P, 40, roots=2))
    w.run()
    w.check(c)
    assert control_kinds(w) == {MsgKind.FIN}
    assert w.sends_of(MsgKind.FIN) == P
    assert w.sends_of(MsgKind.DATA) == P - 2          # tokens between consecutive roots


def test_own_datagrams_are_dropped_and_counted():
    w = World(3, SMALL)
    c = w.post_call(mcast_broadcast(3, 40))
    w.run()
    w.check(c)
    w.advance(1.0)
    assert w.engines[0].stats.drops["own_datagram"] == 3 + 3
    assert "own_datagram" not in w.engines[1].stats.drops


# -- loss, reordering, duplicates --------------------------------------------------------

@pytest.mark.parametrize("loss,dup,jitter", [(0.1, 0, 0), (0.3, 0.2, 5e-5), (0.0, 0.5, 1e-4)])
def test_broadcast_and_allgather_exact_under_loss(loss, dup, jitter):
    P = 7
    w = World(P, SMALL, Net(loss=loss, dup=dup, jitter_s=jitter), seed=11)
    calls = [w.post_call(mcast_broadcast(P, 333, root=2), "float16", seed=1),
             w.post_call(mcast_allgather(P, 50, roots=3, nchunks=2), "int8", seed=2)]
    w.run()
    for c in calls:
        w.check(c)
    stats = [e.stats for e in w.engines]
    if loss:
        assert sum(s.recovered_bytes for s in stats) > 0
        assert sum(s.recovery_requests for s in stats) > 0
    if dup:
        assert sum(s.drops.get("duplicate", 0) for s in stats) > 0
    assert all(s.early_nbytes == 0 for s in stats)


def test_recovery_pulls_gaps_from_successor_with_deferral_chain():
    """Ranks 1 and 2 miss the same chunks; 1 asks 2, which must defer until 3 answers it."""
    P = 5
    lost = {3, 4, 5}

    def drop(h, dst):
        return h.kind is MsgKind.MCAST_DATA and dst in (1, 2) and h.tag in lost

    w = World(P, SMALL, Net(drop=drop), seed=2)
    c = w.post_call(mcast_broadcast(P, 160, root=0))
    w.run()
    w.check(c)
    reqs = [(r, peer, h.offset, h.length) for r, peer, h in w.sent
            if h.kind is MsgKind.RECOVER_REQ]
    # one request per gap range (chunks 3..5 = bytes 192..384), to the ring successor only
    assert sorted(reqs) == [(1, 2, 192, 192), (2, 3, 192, 192)]
    served = [(r, peer) for r, peer, h in w.sent if h.kind is MsgKind.RECOVER_DATA]
    assert sorted(served) == [(2, 1), (3, 2)]
    assert w.engines[2].stats.recovery_deferred == 1
    assert w.engines[1].stats.recovered_bytes == 192 == w.engines[2].stats.recovered_bytes
    assert w.sends_of(MsgKind.FIN) == P


def test_root_answers_recovery_as_owner():
    P = 3
    w = World(P, SMALL, Net(drop=lambda h, dst: h.kind is MsgKind.MCAST_DATA and dst == 2
                            and h.tag == 0))
    c = w.post_call(mcast_broadcast(P, 40, root=0))
    w.run()
    w.check(c)
    served = [(r, peer) for r, peer, h in w.sent if h.kind is MsgKind.RECOVER_DATA]
    assert served == [(0, 2)]                       # rank 2's successor is the root


def test_lost_eos_is_caught_by_the_coarse_timeout():
    P = 4
    cfg = EngineConfig(mtu_nbytes=64, recovery_timeout_s=0.5)

    def drop(h, dst):           # every EOS lost, and chunk 1 lost at rank 3
        return h.kind is MsgKind.MCAST_EOS or (dst == 3 and h.tag == 1)

    w = World(P, cfg, Net(drop=drop))
    c = w.post_call(mcast_broadcast(P, 64, root=1))
    w.run()
    w.check(c)
    assert 0.5 <= w.done[(3, 0)] < 1.0             # waited for the timeout, then recovered
    assert w.engines[3].stats.recovery_requests == 1


def test_eos_burst_lost_to_a_full_queue_is_caught_by_a_spaced_repeat():
    """Rank 3's receive queue is full as the stream ends (the first 0.1 ms): chunk 1 and the
    EOS sent then are lost there. A repeat sent later finds room, so rank 3 pulls chunk 1
    at once instead of waiting the coarse timeout (with the repeats back to back, all were
    lost together: test_lost_eos_is_caught_by_the_coarse_timeout)."""
    from polycast.engine.mcast import eos_delays
    P = 4
    cfg = EngineConfig(mtu_nbytes=64, recovery_timeout_s=0.5)
    w = World(P, cfg)

    def drop(h, dst):
        full = w.now < 1e-4
        return dst == 3 and full and (h.kind is MsgKind.MCAST_EOS or h.tag == 1)

    w.net.drop = drop
    c = w.post_call(mcast_broadcast(P, 64, root=1))
    rto = w.engines[1]._reqs[0].rto
    first, second = eos_delays(3, rto, (256 + 4 * 44) * 8 / 10e9)
    w.run()
    w.check(c)
    assert rto > 0.5 and 1e-4 < first < second < rto / 2
    assert first <= w.done[(3, 0)] < first + 1e-4 < rto / 100   # the first spaced repeat
    assert w.engines[3].stats.recovery_requests == 1
    assert w.engines[3].stats.recovered_bytes == 64
    assert w.sends_of(MsgKind.FIN) == P
    assert w.engines[1].stats.datagrams_out == 4 + 2          # the second repeat is due
    w.advance(rto)
    assert w.engines[1].stats.datagrams_out == 4 + 3          # ... after the request ended
    assert w.engines[3].stats.drops == {"stale": 1}           # its request is over


def test_eos_repeats_are_spaced_outlive_completion_and_die_with_a_failure():
    from polycast.engine.actions import CancelTimer
    from polycast.engine.mcast import eos_delays
    assert eos_delays(1, 1.0, 1e-3) == []
    assert eos_delays(3, 1.0, 1e-3) == [2e-3, 8e-3]             # 2 and 8 stream times
    assert eos_delays(5, 1.0, 0.01) == [0.02, 0.08, 0.32, 0.5]  # at most rto/2
    assert eos_delays(3, 1.0, 0.0) == [1 / 1024, 4 / 1024]      # tiny streams: rto/1024
    e = Engine(0, 3, config=EngineConfig(mtu_nbytes=64, eos_repeats=4, pacing_gbps=1.0))
    acts = e.post(0, mcast_broadcast(3, 40, root=0), 4, 0.0)
    rto = e._reqs[0].rto
    eos_at = [a.not_before for a in acts if isinstance(a, Multicast)
              and a.header.kind is MsgKind.MCAST_EOS]
    span = (160 + 3 * 44) * 8 / 1e9                           # 3 datagrams at 1 Gbit/s
    assert eos_at == [pytest.approx(span)]
    timers = [a for a in acts if isinstance(a, SetTimer) and a.deadline < rto / 2 + 1e-3]
    eos_timers = timers[:3]
    assert [t.deadline - span for t in eos_timers] == pytest.approx(eos_delays(4, rto, span))
    out = e.on_peer_lost(1, 1e-3)                            # the request fails
    cancelled = {a.timer for a in out if isinstance(a, CancelTimer)}
    assert {t.timer for t in eos_timers} <= cancelled
    assert e.on_timer(eos_timers[0].timer, 1.0) == []


def test_stream_wholly_lost_is_recovered():
    P = 3
    w = World(P, SMALL, Net(drop=lambda h, dst: dst == 1))    # rank 1 hears nothing at all
    c = w.post_call(mcast_allgather(P, 30, roots=1))
    w.run()
    w.check(c)
    assert w.engines[1].stats.recovered_bytes == 2 * 30 * 4


def test_late_recovery_data_never_rewrites_a_completed_stream():
    P = 2
    e = Engine(1, P, config=SMALL)
    s = mcast_broadcast(P, 16)
    e.post(0, s, 4, 0.0)
    sig = e._reqs[0].sig
    payload = np.arange(16, dtype=np.float32).tobytes()
    h = Header(MsgKind.MCAST_DATA, 0, 0, 0, 0, 0, 64, sig, 0)
    acts = e.on_datagram_header(h, payload, 0.0)
    assert any(a.__class__.__name__ == "Deliver" for a in acts)
    late = Header(MsgKind.RECOVER_DATA, 0, 0, 0, 0, 0, 64, sig, 0)
    assert not any(a.__class__.__name__ == "Deliver"
                   for a in e.on_message(0, late, payload, 0.1))
    assert e.stats.drops["late_recovery"] == 1


# -- early datagrams, stale, foreign, forged ---------------------------------------------

def test_datagrams_before_post_are_held_then_placed():
    P = 3
    w = World(P, SMALL)
    s = mcast_broadcast(P, 100)
    send = np.arange(100, dtype=np.float32)
    w.post(0, s, send, np.zeros(100, np.float32))
    w.advance(0.01)                     # the stream is over before the others post
    assert w.engines[1].stats.early_nbytes > 400
    recvs = [np.zeros(100, np.float32) for _ in range(P)]
    for r in (1, 2):
        w.post(r, s, None, recvs[r])
    w.run()
    for r in (1, 2):
        np.testing.assert_array_equal(recvs[r], send)
        assert w.engines[r].stats.recovery_requests == 0
        assert w.engines[r].stats.early_nbytes == 0


def test_early_datagram_overflow_is_dropped_then_recovered():
    P = 3
    cfg = EngineConfig(mtu_nbytes=64, max_early_nbytes=400)
    w = World(P, cfg)
    s = mcast_broadcast(P, 100)
    send = np.arange(100, dtype=np.float32)
    w.post(0, s, send, np.zeros(100, np.float32))
    w.advance(0.01)
    assert w.engines[1].stats.drops["early_overflow"] > 0
    assert w.engines[1].stats.early_peak_nbytes <= 400
    recvs = [np.zeros(100, np.float32) for _ in range(P)]
    for r in (1, 2):
        w.post(r, s, None, recvs[r])
    w.run()
    for r in (1, 2):
        np.testing.assert_array_equal(recvs[r], send)
    assert w.engines[1].stats.recovered_bytes > 0


def test_stale_foreign_and_unknown_stream_datagrams_dropped():
    P = 2
    w = World(P, SMALL)
    c = w.post_call(mcast_broadcast(P, 16))
    w.run()
    w.check(c)
    before = c.recvs[1].copy()
    sig = next(h.sig for _, _, h in w.sent)
    junk = b"\x7f" * 64
    for h in (Header(MsgKind.MCAST_DATA, 0, 0, 0, 0, 0, 64, sig, 0),    # seq 0 is finished
              Header(MsgKind.MCAST_DATA, 5, 1, 0, 0, 0, 64, sig, 0),    # another comm
              Header(MsgKind.MCAST_DATA, 0, 0, 9, 0, 0, 64, sig, 0)):   # no such rank
        w.inject_datagram(1, h.pack() + junk)
    drops = w.engines[1].stats.drops
    assert (drops["stale"], drops["foreign_comm"], drops["bad_src"]) == (1, 1, 1)
    np.testing.assert_array_equal(c.recvs[1], before)
    # A datagram with a bad chunk geometry for a posted call is dropped too
    e = Engine(1, 2, config=SMALL)
    e.post(0, mcast_broadcast(P, 16), 4, 0.0)
    sig = e._reqs[0].sig
    for h in (Header(MsgKind.MCAST_DATA, 0, 0, 0, 5, 0, 64, sig, 0),     # chunk 5 of 1
              Header(MsgKind.MCAST_DATA, 0, 0, 0, 0, 4, 60, sig, 0),     # misplaced
              Header(MsgKind.MCAST_DATA, 0, 0, 0, 0, 0, 64, sig ^ 1, 0),  # other call
              Header(MsgKind.MCAST_DATA, 0, 0, 0, 0, 0, 64, sig, 3)):    # no such stream
        assert e.on_datagram_header(h, junk, 0.0) == []
    assert e.stats.drops == {"bad_chunk": 2, "bad_sig": 1, "bad_stream": 1}


def test_secret_world_exact_and_forgeries_dropped():
    P = 4
    secret = b"k" * 32
    w = World(P, EngineConfig(mtu_nbytes=64, secret=secret), Net(loss=0.2), seed=4, raw=True)
    c = w.post_call(mcast_allgather(P, 33, roots=2))
    forged = Header(MsgKind.MCAST_DATA, 0, 0, 0, 0, 0, 64, 0, 0).pack(b"guess", b"x" * 64)
    w.inject_datagram(2, forged + b"x" * 64)
    w.run()
    w.check(c)
    assert w.engines[2].stats.drops["bad_mac"] == 1


# -- pacing --------------------------------------------------------------------------------

def test_pacing_spaces_datagrams_and_delays_the_token():
    e = Engine(0, 3, config=EngineConfig(mtu_nbytes=1000, pacing_gbps=1.0))
    s = mcast_allgather(3, 2500, roots=1)      # rank 0 streams 10000 bytes, then a token
    acts = e.post(0, s, 4, 0.0)
    times = [a.not_before for a in acts if isinstance(a, Multicast)]
    assert len(times) == 10 + 1                 # the data, then the first EOS
    gaps = np.diff(times[:10])
    np.testing.assert_allclose(gaps, (1000 + 44) * 8 / 1e9)
    assert not any(a.__class__.__name__ == "Send" for a in acts)    # token waits
    timer = min((a for a in acts if isinstance(a, SetTimer)), key=lambda a: a.deadline)
    assert timer.deadline == pytest.approx(times[-1] + 44 * 8 / 1e9)   # after the first EOS
    later = e.on_timer(timer.timer, timer.deadline)
    sends = [a for a in later if a.__class__.__name__ == "Send"]
    assert len(sends) == 1 and sends[0].peer == 1 and sends[0].header.length == 0


def test_pacing_adapts_to_loss():
    P = 4
    cfg = EngineConfig(mtu_nbytes=64, pacing_gbps=10.0)
    w = World(P, cfg, Net(loss=0.2), seed=9)
    c = w.post_call(mcast_allgather(P, 200, roots=1))
    w.run()
    w.check(c)
    rates = [e.stats.pacing_gbps for e in w.engines]
    assert all(r < 10.0 for r in rates) and all(r >= 1.0 for r in rates)
    w2 = World(P, cfg, seed=9)
    c2 = w2.post_call(mcast_allgather(P, 200, roots=1))
    w2.run()
    w2.check(c2)
    assert all(e.stats.pacing_gbps == 10.0 for e in w2.engines)


# -- failures --------------------------------------------------------------------------------

def test_mcast_timeout_names_the_missing_chunks():
    P = 3
    cfg = EngineConfig(mtu_nbytes=64, op_timeout_s=1.0)
    w = World(P, cfg)
    s = mcast_broadcast(P, 64, root=0)
    recvs = [np.zeros(64, np.float32) for _ in range(P)]
    w.post(1, s, None, recvs[1])              # neither the root nor rank 2 ever post
    w.posted.update({(0, 0), (2, 0)})
    w.dead.update({0, 2})
    w.run(max_time_s=5.0)
    err = w.errors[(1, 0)]
    assert isinstance(err, CollectiveTimeout)
    assert "rank 1: broadcast mcast" in str(err)
    assert "step 0 (mrecv from rank 0: 4 of 4 chunks missing)" in str(err)


def test_peer_lost_during_allgather_fails_everyone():
    P = 4
    w = World(P, SMALL)
    w.post_call(mcast_allgather(P, 40, roots=1), ranks=[0, 1, 3])
    w.posted.add((2, 0))
    w.kill(2)
    w.run(max_time_s=1.0)
    for r in (0, 1, 3):
        err = w.errors[(r, 0)]
        assert isinstance(err, PeerLost) and err.rank == 2


def test_mismatched_multicast_calls_fail_everywhere():
    P = 3
    w = World(P, SMALL)
    a, b = mcast_broadcast(P, 32), mcast_broadcast(P, 48)
    for r in range(P):
        s = b if r == 1 else a
        w.post(r, s, np.zeros(s.count, np.float32), np.zeros(s.count, np.float32))
    w.run(max_time_s=5.0)
    # Nobody hangs. Ranks 1 (the odd one) and 2 (its successor, which it FINs) fail with
    # MismatchError. The root may legitimately finish first: its own exchanges all matched
    # and its data is right; the ABORT then reaches a finished call (dropped as stale).
    assert isinstance(w.errors[(1, 0)], MismatchError)
    assert isinstance(w.errors[(2, 0)], MismatchError)
    assert (0, 0) in w.errors or (0, 0) in w.done
    assert all(not e.busy for e in w.engines)


# -- the registry's multicast algorithms -------------------------------------------------

def _registry_multicast():
    try:
        from polycast.algorithms import algorithms
        return [pytest.param(a, id=f"{a.collective}-{a.name}") for a in algorithms()
                if a.multicast]
    except Exception as e:      # noqa: BLE001 - a half-written generator: one failing case
        return [pytest.param(e, id="registry-import")]


@pytest.mark.parametrize("algo", _registry_multicast())
@pytest.mark.parametrize("P", [2, 5, 8])
def test_registry_multicast_no_loss_one_fin_per_rank(algo, P):
    if isinstance(algo, Exception):
        raise algo
    if algo.unsupported_reason(P):
        pytest.skip(algo.unsupported_reason(P))
    from polycast.algorithms import build
    root = P - 1 if algo.collective.rooted else 0
    s = build(algo.collective, algo.name, P, 90, root=root)
    w = World(P, SMALL, seed=P)
    c = w.post_call(s, "float32", op="sum" if algo.collective.has_op else None)
    w.run()
    w.check(c)
    for r in range(P):
        control = [(peer, h.kind) for rank, peer, h in w.sent
                   if rank == r and h.kind is not MsgKind.DATA]
        assert control == [((r + 1) % P, MsgKind.FIN)], (r, control)


# -- hostile input in the middle of a run -------------------------------------------------

def _fuzz_header(rng, P):
    kind = rng.choice(list(MsgKind))
    length = rng.choice([0, 1, 4, 64, 1000])
    h = Header(kind, rng.choice([0, 0, 1]), rng.choice([0, 0, 1, 2**32 - 1]),
               rng.randrange(P + 2), rng.randrange(8), rng.choice([0, 64, 128, 2**40]),
               length, rng.getrandbits(32), rng.randrange(3), rng.choice([0, 2]))
    payload = bytes(rng.getrandbits(8) for _ in range(h.payload_nbytes))
    return h, payload


def test_fuzzed_datagrams_never_raise_or_corrupt():
    import random
    rng = random.Random(7)
    P = 4
    w = World(P, SMALL, Net(loss=0.1), seed=5)
    c = w.post_call(mcast_allgather(P, 64, roots=2))
    for i in range(3000):
        h, payload = _fuzz_header(rng, P)
        dst = rng.randrange(P)
        w._execute(dst, w.engines[dst].on_datagram_header(h, payload, w.now))
        if i % 100 == 0:
            w.advance(1e-6)
    w.run()
    w.check(c)                      # a forged signature never lands in a buffer
    assert sum(e.stats.dropped for e in w.engines) > 2500


def test_fuzzed_messages_never_raise_and_nothing_hangs():
    import random
    rng = random.Random(8)
    P = 4
    w = World(P, EngineConfig(mtu_nbytes=64, op_timeout_s=1.0), seed=6)
    w.post_call(mcast_allgather(P, 64, roots=2))
    for i in range(3000):
        h, payload = _fuzz_header(rng, P)
        dst = rng.randrange(P)
        if h.src < P and h.src != dst:
            w._execute(dst, w.engines[dst].on_message(h.src, h, payload, w.now))
        if i % 100 == 0:
            w.advance(1e-6)
    w.run(max_time_s=10.0)          # every request completes or fails: none hangs
    assert w.finished()
    for e in w.engines:
        assert not e.busy
        held = e.stats.early_nbytes
        assert held <= e.config.max_early_nbytes


# -- timing of recovery: late roots, forwarded evidence --------------------------------------

def test_late_root_triggers_no_recovery():
    """A root that starts 3 coarse timeouts late is not mistaken for a lost stream."""
    P = 4
    cfg = EngineConfig(mtu_nbytes=64, recovery_timeout_s=0.1)
    w = World(P, cfg)
    s = mcast_broadcast(P, 200, root=0)
    recvs = [np.zeros(200, np.float32) for _ in range(P)]
    for r in range(1, P):
        w.post(r, s, None, recvs[r])
    w.advance(0.3)
    send = np.arange(200, dtype=np.float32)
    w.post(0, s, send, recvs[0])
    w.run()
    for r in range(P):
        np.testing.assert_array_equal(recvs[r], send)
    assert w.sends_of(MsgKind.RECOVER_REQ) == 0 and w.sends_of(MsgKind.FIN) == P


def test_request_from_predecessor_is_forwarded_at_once():
    """Rank 2 lost chunk 2 and every EOS; rank 1 lost chunk 2 but saw EOS. Rank 1's request
    makes rank 2 pull from rank 3 immediately, not at its own coarse timeout."""
    P = 4
    cfg = EngineConfig(mtu_nbytes=64, recovery_timeout_s=1.0)

    def drop(h, dst):
        if dst == 2 and h.kind is MsgKind.MCAST_EOS:
            return True
        return h.kind is MsgKind.MCAST_DATA and dst in (1, 2) and h.tag == 2

    w = World(P, cfg, Net(drop=drop))
    c = w.post_call(mcast_broadcast(P, 64, root=0))
    w.run()
    w.check(c)
    reqs = [(r, t) for (r, _, h), t in zip(w.sent, w.sent_at) if h.kind is MsgKind.RECOVER_REQ]
    assert [r for r, _ in reqs] == [1, 2]
    assert all(t < 0.01 for _, t in reqs)               # long before the 1 s timeout
    assert w.now < 0.01


def test_gap_finder_matches_a_plain_scan():
    import random
    from polycast.engine.mcast import gaps as _gaps
    rng = random.Random(3)
    for _ in range(500):
        n = rng.randrange(0, 40)
        held = bytearray(rng.random() < 0.5 for _ in range(n))
        asked = bytearray(rng.random() < 0.3 for _ in range(n))
        lo = rng.randrange(0, n + 1)
        hi = rng.randrange(lo, n + 1)
        want, i = [], lo
        while i < hi:
            if held[i] or asked[i]:
                i += 1
                continue
            j = i
            while j < hi and not held[j] and not asked[j]:
                j += 1
            want.append((i, j))
            i = j
        assert _gaps(held, asked, lo, hi) == want


def test_a_broadcast_root_slows_down_when_its_receivers_lose_data():
    # The root receives no multicast data, so only the unicast re-sends its successor pulls
    # back tell it that its stream is too fast.
    P, root = 4, 0
    cfg = EngineConfig(mtu_nbytes=64, pacing_gbps=10.0)
    w = World(P, cfg, Net(loss=0.3), seed=5)
    c = w.post_call(mcast_broadcast(P, 400, root=root))
    w.run()
    w.check(c)
    assert w.engines[root].stats.recovery_served > 0
    assert w.engines[root].stats.pacing_gbps < 10.0
    w2 = World(P, cfg, seed=5)                          # no loss: full rate stays
    c2 = w2.post_call(mcast_broadcast(P, 400, root=root))
    w2.run()
    w2.check(c2)
    assert w2.engines[root].stats.pacing_gbps == 10.0


# -- external placement (EngineConfig.external_streams: the offload's receive workers) ----

@pytest.mark.parametrize("loss,dup,jitter", [(0.0, 0, 0), (0.2, 0.2, 5e-5)])
def test_external_placement_exact_under_loss(loss, dup, jitter):
    """The world places chunks itself (as a worker does) and reports them; the engines
    keep gap pulls, deferral, FIN: results are exact, recovered bytes come as StreamData."""
    from dataclasses import replace
    P = 5
    w = World(P, replace(SMALL, external_streams=True), Net(loss=loss, dup=dup,
                                                             jitter_s=jitter), seed=5)
    calls = [w.post_call(mcast_broadcast(P, 333, root=1), "float16", seed=1),
             w.post_call(mcast_allgather(P, 50, roots=2, nchunks=2), "int32", seed=2)]
    w.run()
    for c in calls:
        w.check(c)
    stats = [e.stats for e in w.engines]
    assert all(s.datagrams_in == 0 for s in stats)       # the engines never saw a datagram
    if loss:
        assert sum(s.recovered_bytes for s in stats) > 0
    assert all(not p for p in w.placers)                 # every stream was closed


def test_external_placement_closes_streams_before_a_failure():
    from dataclasses import replace

    from polycast.engine.actions import CloseStream, Deliver, Fail, OpenStream
    cfg = replace(SMALL, external_streams=True, op_timeout_s=1.0)
    e = Engine(1, 2, config=cfg)
    acts = e.post(0, mcast_broadcast(2, 100), 4, 0.0)
    opens = [a for a in acts if isinstance(a, OpenStream)]
    assert len(opens) == 1 and opens[0].nchunks == 7 and opens[0].region.buf == "recv"
    o = opens[0]
    acts = e.on_stream_progress(o.seq, o.root, o.ordinal, [(0, 3)], 0.1)
    assert not any(isinstance(a, Deliver) for a in acts)
    op_timer = next(t for t, ent in e._timers.items() if ent[0] == "op")
    acts = e.on_timer(op_timer, 1.5)
    kinds = [type(a).__name__ for a in acts if isinstance(a, (CloseStream, Fail))]
    assert kinds == ["CloseStream", "Fail"], kinds
    assert "4 of 7 chunks missing" in str(acts[-1].error)
    # a late report of the closed stream is dropped, counted
    assert e.on_stream_progress(o.seq, o.root, o.ordinal, [(3, 7)], 2.0) == []
    assert e.stats.drops["stale_progress"] == 1
