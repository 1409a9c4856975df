"""Pulled DATA (F_PULL, Engine.set_pull_peers): a large SEND sends its DATA at once and the
receiver treats it as an RTS, reading it where it would have sent a CTS. In the in-memory
World with ``pull_nbytes``, whose payloads stay the sender's until read (tests/world.py
``Pulled``): every collective right, no RTS or CTS, each case of the RTS's handling (RECV
started, collective not posted, RECV waiting with and without room in the early buffer),
and a held payload let go when its call fails, so its sender's memory is released."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather  # noqa: E402

from polycast.collectives import Collective  # noqa: E402
from polycast.engine.engine import EngineConfig  # noqa: E402
from polycast.engine.wire import F_PULL, MsgKind  # noqa: E402
from polycast.errors import InvalidArgument, MismatchError  # noqa: E402
from polycast.schedule.builder import Builder  # noqa: E402
from polycast.schedule.ir import Layout  # noqa: E402

EAGER = 1024                    # rendezvous above 1 KiB
PULL = 2048                     # ... and pulled from 2 KiB


def all_read(w: World) -> bool:
    """Every pulled payload was read or let go (its sender's SEND could complete)."""
    return all(not p.holding and (p.used or p.closed) for p in w.pulled)


def test_set_pull_peers_checks_its_input():
    w = World(2, EngineConfig(eager_max_nbytes=EAGER))
    for bad in ({5: 4096}, {0: 4096}, {1: 0}, {1: "big"}):
        with pytest.raises(InvalidArgument, match="pull limit"):
            w.engines[0].set_pull_peers(bad)


@pytest.mark.parametrize("raw", [False, True])
def test_ring_allgather_pulls_with_no_rts_or_cts(raw):
    """4 ranks, 8 KiB messages: each goes as one pulled DATA (the wire format carries the
    flag when ``raw``); results exact; no RTS/CTS; every pulled payload read."""
    P = 4
    w = World(P, EngineConfig(eager_max_nbytes=EAGER), raw=raw, pull_nbytes=PULL)
    call = w.post_call(ring_allgather(P, 2048))
    w.run()
    w.check(call)
    assert w.sends_of(MsgKind.RTS) == w.sends_of(MsgKind.CTS) == 0
    pulled = [h for _, _, h in w.sent if h.kind is MsgKind.DATA and h.flags & F_PULL]
    assert len(pulled) == P * (P - 1) == sum(e.stats.pull_out for e in w.engines)
    assert all_read(w) and len(w.pulled) == len(pulled)


def test_messages_under_the_pull_limit_keep_the_rts():
    """A peer's pull limit is a floor: 1.5 KiB messages (over the eager limit, under the
    pull limit) go by RTS/CTS as before."""
    P = 4
    w = World(P, EngineConfig(eager_max_nbytes=EAGER), pull_nbytes=PULL)
    call = w.post_call(ring_allgather(P, 384))
    w.run()
    w.check(call)
    assert w.sends_of(MsgKind.RTS) > 0 and not w.pulled


def test_a_late_rank_holds_pulled_data_unread():
    """Rank 3 posts 1 s late with a 16 KiB early buffer, 64 KiB messages: it holds what was
    sent to it as headers (pull_held), unread, its sender's SEND not done; then its post
    reads them straight into place."""
    P, count = 4, 16384
    w = World(P, EngineConfig(eager_max_nbytes=EAGER, max_early_nbytes=16384),
              pull_nbytes=PULL)
    call = w.post_call(ring_allgather(P, count, nchunks=2), ranks=range(P - 1))
    w.advance(1.0)
    late = w.engines[P - 1]
    assert late.stats.pull_held > 0
    assert 0 < late.stats.early_nbytes <= 16384
    waiting = [p for p in w.pulled if p.holding]
    assert waiting and not any(p.used for p in waiting)
    assert (P - 2, call.reqs[P - 2]) not in w.done      # its SEND to rank 3: unread
    call.reqs[P - 1] = w.post(P - 1, call.schedule, call.inputs[P - 1], call.recvs[P - 1])
    w.run()
    w.check(call)
    assert late.stats.early_nbytes == 0 and all_read(w)
    assert w.sends_of(MsgKind.RTS) == w.sends_of(MsgKind.CTS) == 0


def exchange(count: int, P: int = 2):
    """Every pair swaps buffers, each RECV waiting on the rank's own SEND to that peer (as
    recursive doubling's does): the SEND must not wait for the peer's RECV to start."""
    lay = Layout(count)
    b = Builder(Collective.ALLGATHER, P, 0, count, "swap", {"send": lay, "recv": lay})
    for r in range(P):
        s = b.send(r, 1 - r, "send", (0,))
        b.recv(r, 1 - r, "recv", (0,), deps=(s,))
    return b.build()


def run_exchange(w: World, count: int):
    sched = exchange(count)
    xs = [np.full(count, r + 1, np.float32) for r in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    for r in range(2):
        w.post(r, sched, xs[r], ys[r])
    w.run(max_time_s=5.0)
    return xs, ys


def test_a_waiting_recv_reads_into_the_early_buffer_while_it_has_room():
    """The RTS's grant: the pulled DATA is read at once into the early buffer (both SENDs
    complete, so both RECVs start), not held."""
    w = World(2, EngineConfig(eager_max_nbytes=EAGER), pull_nbytes=PULL)
    xs, ys = run_exchange(w, 4096)
    for r in range(2):
        assert (ys[r] == xs[1 - r]).all()
        assert w.engines[r].stats.early_peak_nbytes >= 4096 * 4
        assert w.engines[r].stats.pull_held == 0 and w.engines[r].stats.early_nbytes == 0
    assert all_read(w)


def test_a_held_pulled_data_is_read_as_soon_as_the_buffer_has_room():
    """Rank 1's early buffer takes one 8 KiB message. Ranks 0 and 2 each send it 8 KiB, and
    a token to rank 3 once that SEND is done (read); rank 3 passes each on to rank 1, where
    the RECV from rank s waits for s's token. So the first DATA to arrive is read into the
    buffer at once, the second is held unread (no room), and it must be read as soon as the
    first RECV starts and frees the buffer: else its sender's token never comes, and
    nothing more happens."""
    P, count = 4, 2048                                   # 8 KiB of float32
    lays = {"send": Layout(count), "recv": Layout(P * count, P)}
    b = Builder(Collective.ALLGATHER, P, 0, count, "held", lays)
    for src in (0, 2):
        big = b.send(src, 1, "send", (0,))
        b.send(src, 3, deps=(big,))                      # its token, once it was read
        b.send(3, 1, deps=(b.recv(3, src),))             # ... passed on to rank 1
    for src in (0, 2):
        b.recv(1, src, "recv", (src,), deps=(b.recv(1, 3),))
    sched = b.build()
    cfg = EngineConfig(eager_max_nbytes=EAGER, max_early_nbytes=count * 4 + 2 * 64)
    w = World(P, cfg, pull_nbytes=PULL)
    xs = [np.full(count, r + 1, np.float32) for r in range(P)]
    ys = [np.zeros(P * count, np.float32) for _ in range(P)]
    reqs = {r: w.post(r, sched, xs[r], ys[r]) for r in range(P)}
    w.run(max_time_s=5.0)
    assert all((r, reqs[r]) in w.done for r in range(P)), w.errors
    assert w.engines[1].stats.pull_held == 1
    for src in (0, 2):
        assert (ys[1][src * count:(src + 1) * count] == src + 1).all()
    assert all_read(w) and w.engines[1].stats.early_nbytes == 0


def test_held_pulled_data_is_let_go_when_the_call_fails():
    """The late rank posts a different call (a mismatch): every rank fails with
    MismatchError and every payload it held unread is let go (its sender's memory free),
    never read."""
    P, count = 3, 4096
    w = World(P, EngineConfig(eager_max_nbytes=EAGER, op_timeout_s=2.0), pull_nbytes=PULL)
    call = w.post_call(ring_allgather(P, count), ranks=range(P - 1))
    w.advance(0.5)
    held = [p for p in w.pulled if p.holding]
    assert held
    other = ring_allgather(P, 2 * count)
    w.post(P - 1, other, np.zeros(2 * count, np.float32), np.zeros(2 * P * count, np.float32))
    w.run(max_time_s=10.0)
    assert len(w.errors) == P and all(isinstance(e, MismatchError) for e in w.errors.values())
    assert all(not p.holding and not p.used for p in held)
    assert all(not p.holding for p in w.pulled)
    assert all(e.stats.early_nbytes == 0 for e in w.engines)


_MISMATCH_LATE = r"""
import json, time
import numpy as np
import polycast
c = polycast.init()
rank, P = c.Get_rank(), c.Get_size()
n = 1 << 20                                     # 4 MiB of float32 per rank: pulled
x = np.full(n, rank + 1.0, np.float32)
err = None
if rank == P - 1:
    time.sleep(1.0)                             # what rank 1 sends it is held unread
    bad = np.zeros(n // 2, np.float32)
    try:
        c.Allgather(bad, np.zeros(P * n // 2, np.float32), algorithm="ring")
    except polycast.PolycastError as exc:
        err = type(exc).__name__
else:
    try:
        c.Allgather(x, np.zeros(P * n, np.float32), algorithm="ring")
    except polycast.PolycastError as exc:
        err = type(exc).__name__
y = np.zeros(P * n, np.float32)
c.Allgather(x, y, algorithm="ring")             # the next call: nothing spoiled
peers = c._driver.peers
st = c.stats()
print("RESULT " + json.dumps({
    "err": err, "ok": bool((y == np.repeat(np.arange(1.0, P + 1), n)).all()),
    "cma": bool(peers.cma_peers), "pulled": st.pull_out, "held": peers.cma_held,
    "unacked": sum(len(w) for w in peers._cma_wait.values())}), flush=True)
polycast.finalize()
"""


def test_a_mismatched_late_call_lets_its_held_pulled_data_go_across_processes():
    """3 shm ranks, ring allgather of 4 MiB messages; the last rank posts 1 s late with a
    different count. What rank 1 sent it was held unread; the mismatch fails the call on
    every rank, the held descriptor is let go (acknowledged unread: rank 1's buffer is
    free, nothing left unacknowledged anywhere), and the next call is exact."""
    from test_runtime_helpers import rank_results, spawn_ranks
    env = {"POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": "shm", "POLYCAST_TIMEOUT": "20"}
    res = rank_results(spawn_ranks(3, ["-c", _MISMATCH_LATE], env=env, timeout=90),
                       exit_ok=True)
    assert all(r["err"] == "MismatchError" and r["ok"] for r in res), res
    assert all(r["unacked"] == 0 for r in res), res
    if not all(r["cma"] for r in res):
        pytest.skip("single-copy reads between these processes are refused here: the "
                    "ranks used RTS/CTS (the mismatch and the next call were still checked)")
    assert res[2]["held"] >= 1 and res[1]["pulled"] >= 1, res


_SENDER_DIES = r"""
import json, os, time
import numpy as np
import polycast
c = polycast.init()
rank, P = c.Get_rank(), c.Get_size()
n = 1 << 20                                     # 4 MiB of float32 per rank: pulled
x = np.full(n, rank + 1.0, np.float32)
y = np.zeros(P * n, np.float32)
if rank == 1:
    c.Iallgather(x, y, algorithm="ring")        # its DATA to rank 2 goes out, unread
    time.sleep(0.5)
    os._exit(17)
if rank == P - 1:
    time.sleep(1.5)                             # holds rank 1's descriptor meanwhile
t0 = time.monotonic()
try:
    c.Allgather(x, y, algorithm="ring")
    err = None
except polycast.PolycastError as exc:
    err = type(exc).__name__
print("RESULT " + json.dumps({"err": err, "s": time.monotonic() - t0,
                              "held": c._driver.peers.cma_held,
                              "cma": bool(c._driver.peers.cma_peers)}), flush=True)
os._exit(0)
"""


def test_a_sender_that_dies_while_its_pulled_data_is_held_fails_the_call_in_time():
    """Rank 1 posts a ring allgather of 4 MiB messages and dies; rank 2, posting late, held
    its descriptor unread. Ranks 0 and 2 fail with PeerLost, well within the timeout; the
    held descriptor is never read from a process that is gone."""
    from test_runtime_helpers import rank_results, spawn_ranks
    env = {"POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": "shm", "POLYCAST_TIMEOUT": "20"}
    res = rank_results(spawn_ranks(3, ["-c", _SENDER_DIES], env=env, timeout=90), victim=1)
    assert all(r["err"] == "PeerLost" and r["s"] < 10 for r in res), res
    assert res[1]["held"] >= 1 or not res[1]["cma"], res          # rank 2 held it
