"""A rank SIGKILLed or SIGSTOPped in the middle of a collective, on the shared-memory, TCP,
multicast and symmetric-memory paths: every survivor raises an error naming it within the
timeout, the launcher exits non-zero, and nothing is left in /dev/shm. Also a rank killed
between two calls (``between``), whose loss some survivors learn before their next call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 3
CASES = [(m, p) for m in ("kill", "stop") for p in ("shm", "tcp", "mcast", "symm")] + [
    ("between", "shm")]
# A stopped peer is found only when the timeout fires: the engine's wait (shm) and the
# symmetric-memory wait stay in the README's command, TCP and multicast (the same engine
# wait) are in the slow set.
SLOW = {("stop", "tcp"), ("stop", "mcast")}


@pytest.mark.parametrize("mode, path", [
    pytest.param(m, p, id=f"{m}-{p}", marks=pytest.mark.slow if (m, p) in SLOW else ())
    for m, p in CASES])
def test_survivors_name_the_dead_or_stopped_rank(mode, path):
    env = dict(os.environ, PYTHONPATH=REPO, POLYCAST_TIMEOUT=str(TIMEOUT_S),
               POLYCAST_TRANSPORT="tcp" if path == "tcp" else "auto")
    for _ in range(2):
        res = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", "4",
                              "--timeout", "90", os.path.join(REPO, "tests", "dead_peer.py"),
                              mode, path], capture_output=True, text=True, timeout=120,
                             env=env, cwd=REPO)
        out = res.stdout + res.stderr
        # The 3 s timeout also bounds the start-up: on a loaded machine (load 15-26, seen
        # twice) rank 0's store was not up within 3 s of the others starting. That is not
        # what this test is about: launch once more (only then, and only once).
        if "rendezvous did not finish" not in out:
            break
    assert res.returncode not in (0, 124), out[-3000:]
    survivors = [json.loads(ln.split("SURVIVOR ", 1)[1]) for ln in res.stdout.splitlines()
                 if "SURVIVOR " in ln]
    assert sorted(s["rank"] for s in survivors) == [0, 1, 3], out[-3000:]
    for s in survivors:
        assert "rank 2" in s["message"], s
        if mode != "stop":
            assert s["error"] == "PeerLost" and s["seconds"] < TIMEOUT_S, s
        else:
            assert s["error"] == "CollectiveTimeout" and s["seconds"] < TIMEOUT_S + 3, s
    if mode != "stop":
        assert "rank 2 failed first: it was killed by SIGKILL" in res.stderr
    else:
        assert "rank 2 is stopped" in res.stderr
    job = next(ln.split("JOB ", 1)[1].strip() for ln in res.stdout.splitlines() if "JOB " in ln)
    left = [f for f in os.listdir("/dev/shm") if job in f]
    assert not left, left


def test_a_timeout_names_collective_sequence_step_peer_and_bytes():
    """Issue 14 item 7: a timeout says what the rank waits for."""
    import numpy as np
    from polycast.engine import EngineConfig
    from polycast.errors import CollectiveTimeout
    from world import World, mcast_broadcast, ring_allgather
    errors = []
    for rank, schedule, send, recv in (
            (0, ring_allgather(3, 8), np.ones(8, np.float32), np.zeros(24, np.float32)),
            (1, mcast_broadcast(3, 64, root=2), None, np.zeros(64, np.float32))):
        w = World(3, EngineConfig(op_timeout_s=1.0))       # only this rank calls
        w.post(rank, schedule, send, recv)
        w.run(max_time_s=5.0, until_finished=False)
        errors.append(w.errors[(rank, 0)])
    assert all(isinstance(e, CollectiveTimeout) for e in errors), errors
    ring, bcast = map(str, errors)
    assert ("allgather ring" in ring and "seq 0" in ring
            and "(recv from rank 2) with 32 bytes outstanding" in ring), ring
    assert ("broadcast mcast" in bcast
            and "(mrecv from rank 2: 1 of 1 chunks missing) with about 256 of 256 bytes "
            "outstanding" in bcast), bcast


@pytest.mark.parametrize("aborts_first", [False, True], ids=["rank0-posts-first",
                                                              "aborts-arrive-first"])
def test_a_call_failed_at_post_for_a_lost_peer_tells_the_others(aborts_first):
    """Ranks 1 and 3 learn rank 2 is gone between two calls, so their next ring allgather
    fails when posted; rank 0's part needs only ranks 1 and 3 and its own connection to rank
    2 spares it (test_peer_lost_spares_requests_that_do_not_need_it): it must hear from them
    at once (an ABORT, before or after it posts), not wait its whole timeout (CI's
    test_dead_peer[kill-shm] failure: rank 0 still waiting after the launcher's 2 s
    settle)."""
    import numpy as np
    from polycast.engine import EngineConfig
    from polycast.errors import PeerLost
    from world import World, ring_allgather
    P, count = 4, 8
    s = ring_allgather(P, count)
    w = World(P, EngineConfig(op_timeout_s=5.0))
    w.post_call(s)
    w.run(max_time_s=1.0)
    assert all((r, 0) in w.done for r in range(P)), w.errors
    w.kill(2, notify_after_s=0.0)
    w.run(max_time_s=1.0, until_finished=False)
    t_lost = w.now
    for r in (1, 3):                    # the ranks that know fail at once, at post
        w.post(r, s, np.ones(count, np.float32), np.zeros(P * count, np.float32), req=1)
    assert isinstance(w.errors.get((1, 1)), PeerLost) and isinstance(w.errors.get((3, 1)),
                                                                     PeerLost), w.errors
    if aborts_first:
        w.run(max_time_s=t_lost + 0.1, until_finished=False)
        assert (0, 1) not in w.errors and w.engines[1].stats.aborts_out >= 1
    w.post(0, s, np.ones(count, np.float32), np.zeros(P * count, np.float32), req=1)
    w.run(max_time_s=t_lost + 10.0)
    err = w.errors[(0, 1)]
    assert isinstance(err, PeerLost) and err.rank == 2 and "rank 2" in str(err), err
    assert w.now - t_lost < 0.5, (w.now, t_lost)       # not the 5 s timeout


def _finished_call_then_stale_aborts(P=4, count=8, reason="PEER_LOST"):
    """Every rank finishes call 0; then rank 0 hears (too late to matter: its call 0 is
    over) that ranks 1 and 3 failed call 0 on the loss of rank 2 (or timed out on it)."""
    import numpy as np
    from polycast.engine import EngineConfig
    from polycast.engine.wire import AbortReason, MsgKind, make_header
    from world import World, ring_allgather
    s = ring_allgather(P, count)
    w = World(P, EngineConfig(op_timeout_s=5.0))
    w.post_call(s)
    w.run(max_time_s=1.0)
    assert all((r, 0) in w.done for r in range(P)), w.errors
    for src in (1, 3):
        text = f"rank {src}: allgather ring (seq 0) was waiting on rank 2".encode()
        w.inject_message(0, src, make_header(MsgKind.ABORT, 0, 0, src,
                                             int(AbortReason[reason]), 2, len(text), 0),
                         text)
    assert not w.errors

    def post_next():
        w.post(0, s, np.ones(count, np.float32), np.zeros(P * count, np.float32), req=1)
    return w, post_next


@pytest.mark.parametrize("gone_first", [False, True], ids=["waiting", "posted-after"])
def test_a_peer_that_left_after_its_call_failed_fails_calls_waiting_on_it(gone_first):
    """Session 4's test_dead_peer[kill-tcp] failure: ranks 1 and 3 failed call k on the loss
    of rank 2 (their ABORTs came when rank 0 had finished k), then left in order; rank 0,
    in call k+1, waited on them its whole timeout. Now their goodbye fails it at once,
    naming rank 2, whether it was posted before they left or after."""
    from polycast.errors import PeerLost
    w, post_next = _finished_call_then_stale_aborts()
    t0 = w.now
    if not gone_first:
        post_next()
        w.run(max_time_s=t0 + 0.05, until_finished=False)
        assert (0, 1) not in w.errors                # waiting on rank 3's data
    for peer in (1, 3):
        w._execute(0, w.engines[0].on_peer_gone(peer, w.now))
    if gone_first:
        post_next()
    err = w.errors.get((0, 1))                  # at once: not the 5 s timeout
    assert isinstance(err, PeerLost) and err.rank == 2, (err, w.now - t0)
    assert "left after its own call failed" in str(err) and "rank 2" in str(err), err


def test_a_peer_that_left_after_its_call_timed_out_fails_calls_with_a_timeout():
    """test_dead_peer[stop-shm] (rank 2 stopped): the first failure was a timeout, so a call
    failed by the departure of a rank that timed out is a CollectiveTimeout too, not a
    PeerLost naming the rank that left."""
    from polycast.errors import CollectiveTimeout
    w, post_next = _finished_call_then_stale_aborts(reason="TIMEOUT")
    post_next()
    w._execute(0, w.engines[0].on_peer_gone(3, w.now))
    err = w.errors.get((0, 1))
    assert isinstance(err, CollectiveTimeout), err
    assert "left after its own call failed" in str(err) and "rank 2" in str(err), err


def test_a_peer_that_left_in_order_without_a_failure_changes_nothing():
    """A goodbye alone (a rank that called fewer collectives) keeps today's behaviour: the
    call waits for its timeout; and a recorded failure of a peer the call does not receive
    from fails nothing."""
    from polycast.errors import CollectiveTimeout
    w, post_next = _finished_call_then_stale_aborts()
    post_next()
    w._execute(0, w.engines[0].on_peer_gone(2, w.now))   # no failure recorded for rank 2
    w._execute(0, w.engines[0].on_peer_gone(1, w.now))   # failed, but rank 0 sends to it only
    w.run(max_time_s=w.now + 1.0, until_finished=False)
    assert (0, 1) not in w.errors
    w.run(max_time_s=w.now + 10.0, until_finished=False)
    assert isinstance(w.errors.get((0, 1)), CollectiveTimeout), w.errors


@pytest.mark.parametrize("orderly", [True, False], ids=["goodbye", "broken"])
def test_the_driver_reports_an_orderly_goodbye_to_the_engines(orderly):
    """PeerIO's on_gone (the driver's route to Engine.on_peer_gone) fires on a goodbye
    and close, and only then (a broken connection is on_lost's)."""
    import selectors
    import socket
    from polycast.runtime.driver.peers import PeerIO
    from polycast.runtime.transport.frames import KIND_BYE, control_frame
    from polycast.runtime.transport.tcp import TcpLink
    from polycast.runtime.bootstrap.world import Peer, World
    ours, theirs = socket.socketpair()
    world = World(0, 2, "job", True, 5.0)
    world.peers[1] = Peer(1, TcpLink(ours, 1))
    lost, gone = [], []
    sel = selectors.DefaultSelector()             # PeerIO registers the sockets itself
    io = PeerIO(world, sel, lambda *a: None, lambda tokens: None,
                lambda r, why: lost.append(r), gone.append)
    if orderly:
        theirs.sendall(control_frame(KIND_BYE))
    theirs.close()
    io.read_peer(1)
    assert (gone, lost) == (([1], []) if orderly else ([], [1]))
    ours.close()
    sel.close()
