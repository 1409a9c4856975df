"""A send completion must never be lost: frames still queued to a peer that finalized or
was lost are reported sent (issue 14: 1,000 outstanding mcast Iallreduce hung on "1 sends
not reported done" when a deferred recovery answer was queued to a rank that had left)."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys

import pytest

from polycast.runtime.driver.peers import PeerIO
from polycast.runtime.transport.frames import KIND_BYE, control_frame
from polycast.runtime.transport.tcp import TcpLink
from polycast.runtime.bootstrap.world import Peer, World

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peerio():
    ours, theirs = socket.socketpair()
    world = World(0, 2, "job", True, 5.0)
    world.peers[1] = Peer(1, TcpLink(ours, 1))
    sent, lost = [], []
    io = PeerIO(world, selectors.DefaultSelector(), lambda *a: None, sent.extend,
                lambda r, why: lost.append(r))
    return io, world, theirs, sent, lost


@pytest.mark.parametrize("orderly", [True, False], ids=["finalized", "lost"])
def test_frames_queued_to_a_departed_peer_are_reported_sent(orderly):
    io, world, theirs, sent, lost = _peerio()
    world.peers[1].tcp.enqueue(44, b"h" * 44, [b"payload"], 7, (0, 42))   # not flushed
    if orderly:
        theirs.sendall(control_frame(KIND_BYE))
    theirs.close()
    io.read_peer(1)
    assert sent == [(0, 42)]
    assert (1 in io.gone) is orderly and lost == ([] if orderly else [1])
    assert not io.pending_output()
    world.peers[1].tcp.sock.close()


@pytest.mark.slow                   # a stress run
def test_many_outstanding_multicast_allreduces_complete():
    script = os.path.join(REPO, "tests", "outstanding_mcast.py")
    res = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", "4",
                          "--timeout", "150", script, "1000"], capture_output=True,
                         text=True, timeout=200, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO, POLYCAST_TIMEOUT="60"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.count("outstanding ok 1000") == 4
