"""The RTS/CTS rendezvous of large point-to-point messages: state transitions in the
in-memory World, and the late-rank case across real processes."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather, ring_reduce_scatter  # noqa: E402

from polycast.collectives import Collective  # noqa: E402
from polycast.engine.actions import Send  # noqa: E402
from polycast.engine.engine import Engine, EngineConfig  # noqa: E402
from polycast.engine.wire import F_NO_PAYLOAD, Header, MsgKind  # noqa: E402
from polycast.errors import (CollectiveTimeout, InvalidArgument, MismatchError,  # noqa: E402
                             PeerLost, ProtocolError)
from polycast.schedule.builder import Builder  # noqa: E402
from polycast.schedule.ir import Layout  # noqa: E402

EAGER = 1024                    # rendezvous above 1 KiB in these tests


def send_recv(count: int, P: int = 2):
    """Rank 0 sends its whole buffer to rank 1 (step 1; step 0 copies for itself)."""
    lay = Layout(count)
    b = Builder(Collective.BROADCAST, P, 0, count, "p2p", {"send": lay, "recv": lay})
    b.copy(0, "send", (0,), "recv", (0,))
    b.send(0, 1, "recv", (0,))
    b.recv(1, 0, "recv", (0,))
    return b.build()


def rts(seq, src, tag, length, sig, comm=0):
    return Header(MsgKind.RTS, comm, seq, src, tag, 0, length, sig, 0, F_NO_PAYLOAD)


def kinds(acts, kind):
    return [a for a in acts if isinstance(a, Send) and a.header.kind is kind]


def test_config_validates_threshold():
    with pytest.raises(InvalidArgument, match="eager_max_nbytes"):
        EngineConfig(eager_max_nbytes=-1).validate()
    assert EngineConfig().eager_max_nbytes == 256 * 1024


def test_small_messages_stay_eager():
    P = 4
    w = World(P, EngineConfig(eager_max_nbytes=EAGER))
    call = w.post_call(ring_allgather(P, 64))          # 256 B per message
    w.run()
    w.check(call)
    assert w.sends_of(MsgKind.RTS) == 0 and w.sends_of(MsgKind.CTS) == 0


def test_a_per_peer_eager_limit_sends_eager_to_that_peer_only():
    """Engine.set_eager_limits: a pair that agrees on a larger limit exchanges messages up
    to it eager (no RTS/CTS), including the receiver clearing a large RECV unasked; the
    other pairs keep config.eager_max_nbytes; a message over the pair's limit still goes
    by rendezvous. Every rank's result is right either way."""
    P = 4
    w = World(P, EngineConfig(eager_max_nbytes=EAGER))
    # the pairs (0, 1) and (2, 3) agree on 4 KiB; (1, 2) and (3, 0) keep 1 KiB
    for a, b in ((0, 1), (2, 3)):
        w.engines[a].set_eager_limits({b: 4 * EAGER})
        w.engines[b].set_eager_limits({a: 4 * EAGER})
    call = w.post_call(ring_allgather(P, 512))          # 2 KiB per message
    w.run()
    w.check(call)
    rts_from = sorted((r, peer) for r, peer, h in w.sent if h.kind is MsgKind.RTS)
    # the ring sends r -> r+1: 0->1 and 2->3 eager; 1->2 and 3->0 by rendezvous
    assert rts_from and {(r, (r + 1) % P) for r, _ in rts_from} == {(1, 2), (3, 0)}
    assert all(peer == (r + 1) % P for r, peer in rts_from), rts_from
    assert w.engines[0].eager_max_nbytes(1) == 4 * EAGER
    assert w.engines[0].eager_max_nbytes(3) == EAGER
    w2 = World(2, EngineConfig(eager_max_nbytes=EAGER))
    for a, b in ((0, 1), (1, 0)):
        w2.engines[a].set_eager_limits({b: 4 * EAGER})
    big = w2.post_call(send_recv(2048))                # 8 KiB: over the pair's limit too
    w2.run()
    w2.check(big)
    assert w2.sends_of(MsgKind.RTS) + w2.sends_of(MsgKind.CTS) >= 1
    with pytest.raises(InvalidArgument):
        w2.engines[0].set_eager_limits({5: 4096})       # no such peer


def test_a_raised_eager_limit_holds_only_in_calls_the_early_buffer_can_take():
    """A rank that posts late holds what its peers send it eager: the raised limits apply
    only to calls of at most max_early_nbytes / 8 (count x itemsize x ranks), so a large
    call's messages between the very same peers still go by rendezvous."""
    P = 2
    cfg = EngineConfig(eager_max_nbytes=EAGER, max_early_nbytes=64 * EAGER)   # bound: 8 KiB
    # float32, count x 4 B x 2 ranks: an 8 KiB call (a 4 KiB message), then a 16 KiB one
    for count, rendezvous in ((1024, False), (2048, True)):
        w = World(P, cfg)
        for a, b in ((0, 1), (1, 0)):
            w.engines[a].set_eager_limits({b: 64 * EAGER})
        call = w.post_call(send_recv(count))
        w.run()
        w.check(call)
        assert (w.sends_of(MsgKind.RTS) + w.sends_of(MsgKind.CTS) > 0) is rendezvous, count


def test_large_message_to_late_rank_holds_only_the_rts():
    """Ring allgather, 4 ranks, 64 KiB shards, rank 3 posts 1 s late, early buffer 16 KiB:
    eager sends overflow it and fail the call everywhere; rendezvous succeeds holding only
    RTS headers."""
    P, count = 4, 16384
    sched = ring_allgather(P, count, nchunks=2)

    def run(eager):
        w = World(P, EngineConfig(eager_max_nbytes=eager, max_early_nbytes=16384))
        call = w.post_call(sched, ranks=range(P - 1))
        w.advance(1.0)
        late = w.engines[P - 1]
        held = late.stats.early_nbytes
        inputs = call.inputs
        call.reqs[P - 1] = w.post(P - 1, sched, inputs[P - 1], call.recvs[P - 1])
        w.run(max_time_s=5.0)
        return w, call, held

    w, _, _ = run(eager=1 << 30)                       # today's path: overflow
    assert any(isinstance(e, ProtocolError) and "max_early_nbytes" in str(e)
               for e in w.errors.values()), w.errors
    w, call, held = run(eager=EAGER)
    w.check(call)
    late = w.engines[P - 1].stats
    # at most one RTS header per message to it (6) and one CTS header per message from it
    # (rank 0's RECVs started and cleared rank 3's SENDs ahead)
    assert late.early_peak_nbytes <= 12 * 64, late
    assert 0 < held <= 12 * 64
    assert late.early_nbytes == 0 and late.cts_out == (P - 1) * 2
    # every DATA went after exactly one CTS of its receiver
    assert w.sends_of(MsgKind.DATA) == w.sends_of(MsgKind.CTS) == P * (P - 1) * 2
    assert w.sends_of(MsgKind.RTS) > 0
    assert all(e.stats.drops == {} for e in w.engines)


def test_rts_duplicate_stale_and_unexpected_cts_are_dropped_and_counted():
    count = 1024                                        # 4 KiB of float32
    cfg = EngineConfig(eager_max_nbytes=EAGER)
    s = send_recv(count)
    e0, e1 = Engine(0, 2, config=cfg), Engine(1, 2, config=cfg)
    a0 = e0.post(0, s, 4, 0.0)
    (r,) = kinds(a0, MsgKind.RTS)
    assert r.header.length == 4 * count and r.payload is None and not kinds(a0, MsgKind.DATA)
    a1 = e1.post(0, s, 4, 0.0)                          # its RECV starts: cleared unasked
    (c,) = kinds(a1, MsgKind.CTS)
    assert e1.stats.cts_ahead_out == 1
    assert not e1.on_message(0, r.header, b"", 0.0)     # crossed our CTS: expected, no CTS
    assert e1.stats.rts_crossed == 1 and e1.stats.drops == {}
    assert not e1.on_message(0, r.header, b"", 0.0)     # again: a duplicate
    assert e1.stats.drops == {"duplicate_rts": 1}
    a0 = e0.on_message(1, c.header, b"", 0.0)
    (d,) = kinds(a0, MsgKind.DATA)
    assert d.header.length == 4 * count and d.payload.nbytes == 4 * count
    assert not e0.on_message(1, c.header, b"", 0.0)     # CTS twice: nothing sent twice
    assert e0.stats.drops == {"unexpected_cts": 1}
    # the DATA's send completes the SEND step and the request
    for a in kinds(a0, MsgKind.DATA) + [r]:
        e0.on_send_done(a.token, 0.0)
    assert not e0.busy and e0.stats.completed == 1
    e1.on_message(0, d.header, b"\0" * (4 * count), 0.0)
    e1.on_send_done(c.token, 0.0)
    assert not e1.busy and e1.stats.completed == 1
    assert not e1.on_message(0, r.header, b"", 0.0)     # seq 0 is finished: stale
    assert e1.stats.drops == {"duplicate_rts": 1, "stale": 1}


def test_receivers_ahead_clear_sends_without_rts():
    """All ranks post together: every RECV starts at once and sends its CTS unasked, so
    only the first SEND of each rank (which starts at post too) sends an RTS (which
    crosses that CTS); forwarded shards go without one."""
    P, nchunks = 4, 2
    w = World(P, EngineConfig(eager_max_nbytes=EAGER))
    call = w.post_call(ring_allgather(P, 4096, nchunks=nchunks))
    w.run()
    w.check(call)
    ndata = P * (P - 1) * nchunks
    assert w.sends_of(MsgKind.DATA) == w.sends_of(MsgKind.CTS) == ndata
    assert w.sends_of(MsgKind.RTS) == P * nchunks
    assert sum(e.stats.rts_crossed for e in w.engines) == P * nchunks
    assert all(e.stats.drops == {} and e.stats.early_nbytes == 0 for e in w.engines)


def test_rts_with_wrong_signature_fails_every_rank_before_any_data():
    P, count = 2, 1024
    w = World(P, EngineConfig(eager_max_nbytes=EAGER))
    s = send_recv(count)
    w.post(0, s, np.zeros(count, np.float32), np.zeros(count, np.float32))
    w.post(1, s, np.zeros(count, np.int32), np.zeros(count, np.int32))     # same size
    w.run()
    assert all(isinstance(w.errors[(r, 0)], MismatchError) for r in range(P)), w.errors
    assert all("carries call signature" in str(e) for e in w.errors.values()), w.errors
    assert w.sends_of(MsgKind.DATA) == 0
    assert not any(e.busy for e in w.engines)


def test_rts_with_wrong_length_fails_every_rank():
    P, count = 2, 1024
    w = World(P, EngineConfig(eager_max_nbytes=EAGER))
    s = send_recv(count)
    w.post(1, s, None, np.zeros(count, np.float32))
    sig = w.engines[1]._reqs[0].sig
    w.inject_message(1, 0, rts(0, 0, 0, 4 * count + 4, sig))   # a forged/corrupt RTS
    w.post(0, s, np.zeros(count, np.float32), np.zeros(count, np.float32))
    w.run()
    for r in range(P):
        assert isinstance(w.errors[(r, 0)], MismatchError), w.errors
    assert f"expects {4 * count} bytes from rank 0 but its RTS" in str(w.errors[(1, 0)])


def test_peer_lost_while_waiting_for_cts():
    count = 1024
    w = World(2, EngineConfig(eager_max_nbytes=EAGER))
    s = send_recv(count)
    w.post(0, s, np.zeros(count, np.float32), np.zeros(count, np.float32))
    w.posted.add((1, 0))
    w.advance(0.5)
    assert w.engines[0].busy and w.sends_of(MsgKind.RTS) == 1
    w.kill(1)
    w.run()
    err = w.errors[(0, 0)]
    assert isinstance(err, PeerLost) and err.rank == 1, err
    assert "send to rank 1: waiting for its clear-to-send (CTS)" in str(err)


def test_op_timeout_while_waiting_for_cts_names_the_step():
    count = 1024
    w = World(2, EngineConfig(eager_max_nbytes=EAGER, op_timeout_s=2.0))
    s = send_recv(count)
    w.post(0, s, np.zeros(count, np.float32), np.zeros(count, np.float32))
    w.posted.add((1, 0))
    w.dead.add(1)                                       # never acts, never reported lost
    w.run()
    err = w.errors[(0, 0)]
    assert isinstance(err, CollectiveTimeout)
    assert "step 1 (send to rank 1: waiting for its clear-to-send (CTS))" in str(err), err


def test_recv_waiting_on_its_own_send_is_granted_early_no_deadlock():
    """Both ranks SEND to each other and RECV into the block they send (so the RECV depends
    on the SEND): the IR promises sends never wait for RECVs, so the RTS is granted against
    the early buffer rather than held until the RECV starts (which would deadlock)."""
    count = 2048
    lay = Layout(count)
    b = Builder(Collective.BROADCAST, 2, 0, count, "swap", {"send": lay, "recv": lay})
    for r in (0, 1):
        c = b.copy(r, "send", (0,), "recv", (0,))
        snd = b.send(r, 1 - r, "recv", (0,), deps=(c,))
        b.recv(r, 1 - r, "recv", (0,), deps=(snd,))
    s = b.build()
    w = World(2, EngineConfig(eager_max_nbytes=EAGER, op_timeout_s=5.0))
    x = [np.arange(count, dtype=np.float32) + 1000 * r for r in (0, 1)]
    y = [np.zeros(count, np.float32) for _ in (0, 1)]
    for r in (0, 1):
        w.post(r, s, x[r], y[r])
    w.run()
    assert not w.errors, w.errors
    for r in (0, 1):
        np.testing.assert_array_equal(y[r], x[1 - r])
        st = w.engines[r].stats
        assert st.cts_granted_early == 1 and st.early_nbytes == 0
        assert 4 * count <= st.early_peak_nbytes <= 4 * count + 64


def test_pending_recv_is_granted_against_the_early_buffer():
    """Recursive-doubling allreduce, ranks posting one after another: RTSs reach RECVs
    that are posted but wait on earlier steps (here on the SEND to the same peer), so they
    are granted at once, the payload reserved in the early buffer as an eager DATA would
    have held it."""
    from polycast.algorithms import build
    P, count = 4, 8192                                  # 16 KiB halves
    s = build("allreduce", "recdoubling", P, count, nchunks=2)
    w = World(P, EngineConfig(eager_max_nbytes=EAGER, max_early_nbytes=1 << 20))
    call = w.post_call(s, op="sum", ranks=[])
    for r in (3, 2, 1, 0):
        call.reqs[r] = w.post(r, s, call.inputs[r], call.recvs[r], "sum")
        w.advance(1e-3)
    w.run()
    w.check(call)
    assert sum(e.stats.cts_granted_early for e in w.engines) > 0
    assert w.sends_of(MsgKind.CTS) == w.sends_of(MsgKind.DATA) > 0
    assert all(e.stats.early_nbytes == 0 for e in w.engines)


def test_rts_held_for_a_posted_recv_when_the_buffer_is_full():
    """Rank 1 posts a 2-message chain: its second RECV waits on its first, whose sender
    (rank 2) is late. Rank 0's 16 KiB message for the second RECV does not fit the 1 KiB
    early buffer: its RTS is held (eager would fail the call) and answered once the RECV
    starts."""
    count = 4096
    lay = Layout(3 * count, 3)
    b = Builder(Collective.BROADCAST, 3, 1, 3 * count, "chain", {"send": lay, "recv": lay})
    first = b.recv(1, 2, "recv", (2,))
    b.recv(1, 0, "recv", (0,), deps=(first,))
    b.send(2, 1, "send", (2,))
    b.send(0, 1, "send", (0,))
    s = b.build()
    w = World(3, EngineConfig(eager_max_nbytes=EAGER, max_early_nbytes=1024))
    x = [np.full(3 * count, r + 1, np.float32) for r in range(3)]
    y = [np.zeros(3 * count, np.float32) for _ in range(3)]
    w.post(1, s, x[1], y[1])
    w.post(0, s, x[0], y[0])
    w.advance(0.5)
    e1 = w.engines[1].stats
    # the first RECV cleared rank 2 ahead; rank 0's RTS is held, not granted
    assert e1.cts_out == e1.cts_ahead_out == 1 and e1.cts_granted_early == 0
    assert 0 < e1.early_nbytes <= 64
    w.post(2, s, x[2], y[2])
    w.run()
    assert not w.errors, w.errors
    np.testing.assert_array_equal(y[1][:count], 1)
    np.testing.assert_array_equal(y[1][2 * count:], 3)
    assert e1.cts_out == 2 and e1.early_nbytes == 0 and e1.early_peak_nbytes <= 1024


def test_held_rts_granted_as_the_buffer_frees_no_deadlock():
    """Recursive doubling on 4 ranks posting one after another, 8 chunks of 16 KiB per
    exchange, early buffer 20 KiB: each RECV waits on its own SEND to the same peer, whose
    CTS waits on the peer's RECV, which waits on the peer's SEND... Only one grant fits at
    a time; held RTSs are granted as granted messages are consumed. Eager sends overflow
    the same buffer and fail."""
    from polycast.algorithms import build
    P = 4
    s = build("allreduce", "recdoubling", P, 32768, nchunks=8)
    for eager, ok in ((EAGER, True), (1 << 30, False)):
        w = World(P, EngineConfig(eager_max_nbytes=eager, max_early_nbytes=20000,
                                  op_timeout_s=5.0))
        call = w.post_call(s, op="sum", ranks=[])
        for r in reversed(range(P)):
            call.reqs[r] = w.post(r, s, call.inputs[r], call.recvs[r], "sum")
            w.advance(1e-3)
        w.run()
        if not ok:
            assert any(isinstance(e, ProtocolError) and "max_early_nbytes" in str(e)
                       for e in w.errors.values()), w.errors
            continue
        w.check(call)
        assert sum(e.stats.cts_granted_early for e in w.engines) > 4
        assert all(e.stats.early_peak_nbytes <= 20000 and e.stats.early_nbytes == 0
                   for e in w.engines)
        assert all(not e._grant_wait for e in w.engines)


def test_many_requests_outstanding_with_rendezvous_interleaved():
    """Eight collectives in flight on every rank, small (eager) and large (rendezvous)
    mixed, ranks posting at different times; every one exact."""
    P = 4
    w = World(P, EngineConfig(eager_max_nbytes=EAGER, max_early_nbytes=8192), seed=3)
    scheds = [ring_allgather(P, 16), ring_allgather(P, 4096, nchunks=3),
              ring_reduce_scatter(P, 2048), ring_reduce_scatter(P, 8),
              ring_allgather(P, 1000, nchunks=2), ring_allgather(P, 5),
              ring_reduce_scatter(P, 1500), ring_allgather(P, 3000)]
    from polycast.reference import make_inputs
    calls = []
    for i, s in enumerate(scheds):
        op = "sum" if s.collective is Collective.REDUCE_SCATTER else None
        inputs = make_inputs(s.collective, P, s.count, "float32", 0, i, op or "sum")
        _, nrecv = s.collective.buffer_counts(P, s.count)
        recvs = [np.full(nrecv, 99, np.float32) for _ in range(P)]
        calls.append((s, op, inputs, recvs, {}))
    order = [0, 2, 1, 3]
    for k, r in enumerate(order):
        for i, (s, op, inputs, recvs, reqs) in enumerate(calls):
            reqs[r] = w.post(r, s, inputs[r], recvs[r], op)
            if i % 3 == k % 3:
                w.advance(1e-5)
        w.advance(0.01 * k)
    w.run()
    from world import Call
    for s, op, inputs, recvs, reqs in calls:
        c = Call(s, op, inputs, recvs, reqs)
        w.check(c)
    assert w.sends_of(MsgKind.RTS) > 0 and w.sends_of(MsgKind.DATA) > w.sends_of(MsgKind.RTS)
    for e in w.engines:
        assert e.stats.early_nbytes == 0 and e.stats.early_peak_nbytes <= 8192
        assert e.stats.drops == {}, e.stats.drops
        assert not e.busy


# -- real processes --------------------------------------------------------------------

_LATE_RANK = r"""
import sys, time
import numpy as np
import polycast
comm = polycast.init()
rank, P = comm.Get_rank(), comm.Get_size()
n = 1 << 20                                     # 4 MiB of float32 per rank
x = np.arange(n, dtype=np.float32) + rank * n
y = np.zeros(P * n, np.float32)
if rank == P - 1:
    time.sleep(1.5)                             # everyone else is well ahead
comm.Allgather(x, y, algorithm="ring")
ok = np.array_equal(y, np.arange(P * n, dtype=np.float32))
st = comm.stats()
print(f"RESULT ok={ok} peak={st.early_peak_nbytes} rts={st.rts_out} cts={st.cts_out} "
      f"pull={st.pull_out} held={st.pull_held} cma={int(bool(comm._driver.peers.cma_peers))}",
      flush=True)
polycast.finalize()
"""


@pytest.mark.parametrize("transport,pull", [("shm", "1"), ("shm", "0"), ("tcp", "1")])
def test_late_rank_large_allgather_succeeds_across_processes(transport, pull):
    """3 ranks, 12 MiB ring allgather, the last rank posts 1.5 s late, early buffer 1 MiB
    (POLYCAST_MAX_EARLY_NBYTES): eager sends would overflow it and fail on every rank. By
    RTS/CTS the late rank holds RTS headers; between shm ranks that read each other
    single-copy, it holds the pulled DATAs unread (a header each), with no RTS or CTS."""
    import re
    from test_runtime_helpers import spawn_ranks
    limit = 1 << 20
    results = spawn_ranks(3, ["-c", _LATE_RANK], timeout=90, env={
        "POLYCAST_TRANSPORT": transport, "POLYCAST_TIMEOUT": "30",
        "POLYCAST_MAX_EARLY_NBYTES": str(limit), "POLYCAST_TEST_HOOKS": f"cma_pull={pull}"})
    got = []
    for r in results:
        m = re.search(r"RESULT ok=(\w+) peak=(\d+) rts=(\d+) cts=(\d+) pull=(\d+) "
                      r"held=(\d+) cma=(\d)", r.out)
        assert r.returncode == 0 and m, f"rank {r.rank}\n{r.out[-2000:]}\n{r.err[-3000:]}"
        assert m.group(1) == "True"
        assert int(m.group(2)) <= limit
        got.append([int(g) for g in m.groups()[2:]])
    rts, cts, pulls, held, cma = (sum(col) for col in zip(*got))
    if pull == "1" and cma == len(results):
        assert rts == cts == 0 and pulls > 0 and held > 0, got
    else:
        assert rts > 0 and cts > 0 and pulls == held == 0, got


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_the_runtime_sends_eager_up_to_1_mib_between_shm_ranks_only(transport):
    """Between ranks on shared-memory rings messages up to SHM_EAGER_MAX_NBYTES go eager
    (both ends agree: no CTS cleared unasked, no RTS); over TCP the engine's 256 KiB holds;
    POLYCAST_EAGER_MAX_NBYTES, when set, is every peer's limit. Over the limit, shm peers
    that read each other single-copy pull (no RTS); TCP peers send RTS."""
    from test_runtime_helpers import rank_results, spawn_ranks
    code = ("import json, numpy as np, polycast\n"
            "c = polycast.init()\n"
            "x = np.full(98304, c.rank + 1.0, np.float64); y = np.empty(2 * x.size)\n"
            "for _ in range(3): c.Allgather(x, y, algorithm='ring')\n"   # 768 KiB messages
            "ok = bool((y == np.repeat([1.0, 2.0], x.size)).all())\n"
            "st = c.stats()\n"
            "print('RESULT ' + json.dumps({'ok': ok, 'rts': st.rts_out, 'pull': st.pull_out, "
            "'cma': bool(c._driver.peers.cma_peers), "
            "'limit': c._driver._comms[0].engine.eager_max_nbytes(1 - c.rank)}), flush=True)\n"
            "polycast.finalize()\n")
    for env, eager in (({}, transport == "shm"), ({"POLYCAST_EAGER_MAX_NBYTES": "262144"},
                                                  False)):
        e = {"POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": transport, "POLYCAST_TIMEOUT": "20",
             **env}
        for res in rank_results(spawn_ranks(2, ["-c", code], env=e, timeout=120)):
            assert res["ok"], res
            if eager:
                assert res["rts"] == res["pull"] == 0 and res["limit"] == 1 << 20, res
            else:
                assert res["limit"] == 256 * 1024, (env, res)
                by_rts, by_pull = (0, 3) if res["cma"] else (3, 0)
                assert res["rts"] >= by_rts and res["pull"] >= by_pull, (env, res)
                assert not (res["rts"] and res["pull"]), (env, res)


def test_settings_override_the_engine_config():
    """POLYCAST_MAX_EARLY_NBYTES / POLYCAST_EAGER_MAX_NBYTES reach the engines' config;
    bad values are refused naming the variable."""
    from types import SimpleNamespace

    from polycast import config
    from polycast.runtime.bootstrap.engine_config import engine_config
    world = SimpleNamespace(key=None, job_id="j", single_host=True, timeout_seconds=7.0)
    base, default = engine_config(world, config.Config()), EngineConfig()
    assert (base.max_early_nbytes, base.eager_max_nbytes, base.op_timeout_s) == (
        default.max_early_nbytes, default.eager_max_nbytes, 7.0)
    cfg = engine_config(world, config.load({"POLYCAST_MAX_EARLY_NBYTES": "4096",
                                            "POLYCAST_EAGER_MAX_NBYTES": "0"}))
    assert (cfg.max_early_nbytes, cfg.eager_max_nbytes, cfg.op_timeout_s) == (4096, 0, 7.0)
    for bad in ("lots", "-5"):
        with pytest.raises(InvalidArgument, match=f"POLYCAST_EAGER_MAX_NBYTES='{bad}'"):
            config.load({"POLYCAST_EAGER_MAX_NBYTES": bad})


def test_every_algorithm_with_every_payload_by_rendezvous_across_processes():
    """POLYCAST_EAGER_MAX_NBYTES=0: every message with a payload goes RTS/CTS; every
    collective and algorithm of the runtime selftest stays exact (no deadlock from SENDs
    waiting on RECVs that wait on them: those are granted against the early buffer)."""
    from test_runtime_helpers import selftest
    results = selftest(4, "all", env={"POLYCAST_TRANSPORT": "tcp",
                                      "POLYCAST_EAGER_MAX_NBYTES": "0"})
    for r in results:
        assert r.returncode == 0 and "SELFTEST all OK" in r.out, (
            f"rank {r.rank} exit {r.returncode}\n{r.out[-3000:]}\n{r.err[-3000:]}")


def test_held_payloads_do_not_pin_the_shm_ring():
    # A late rank grants clear-to-sends early and parks the data it receives until its
    # steps start. Parked as views into the shm ring, they pinned the ring's tail and the
    # partner's next clear-to-send could never arrive (recursive doubling, 16 x 1 MiB).
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).with_name("late_rank_allreduce.py")
    env = {**os.environ, "POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": "shm"}
    proc = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", "4",
                           str(script), str(1 << 22), "0"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ok") == 4
