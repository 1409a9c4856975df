"""Job secrets (runtime/bootstrap/auth.py): the store and the ranks refuse outsiders, and forged,
altered and replayed packets are dropped and counted without disturbing a result."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import pytest

from polycast.runtime.bootstrap import auth
from polycast.runtime.transport.mcast import group_for
from polycast.runtime.bootstrap.store import StoreClient, StoreServer, _frame_mac, store_key
from polycast.runtime.bootstrap.world import _connect_pairs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = auth.secret_from_env({auth.ENV: "the job's secret"})
OTHER = auth.secret_from_env({auth.ENV: "another secret"})


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0, KEY)
    yield s
    s.close()


def test_store_serves_clients_with_the_secret(server):
    with StoreClient("127.0.0.1", server.port, 5, KEY) as c:
        c.set("k", b"v")
        assert c.get("k") == b"v" and c.add("n", 3) == 3
    assert server.refused == 0 and server.bad_frames == 0


@pytest.mark.parametrize("secret", [None, OTHER], ids=["no secret", "wrong secret"])
def test_store_refuses_a_client_without_the_secret(server, secret):
    t0 = time.monotonic()
    with pytest.raises(auth.AuthenticationFailed, match="POLYCAST_SECRET"):
        StoreClient("127.0.0.1", server.port, 5, secret)
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while server.refused < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.refused == 1
    with StoreClient("127.0.0.1", server.port, 5, KEY) as c:     # still serving
        assert c.get("anything") is None


def test_a_client_cannot_join_a_store_without_secret_by_having_one():
    plain = StoreServer("127.0.0.1", 0, None)
    try:
        with pytest.raises(auth.AuthenticationFailed):
            StoreClient("127.0.0.1", plain.port, 5, KEY)
        with StoreClient("127.0.0.1", plain.port, 5, None) as c:
            c.set("a", b"1")
    finally:
        plain.close()


def _raw_session(port: int) -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s, auth.connect_handshake(s, store_key(KEY), b"store")


def test_store_drops_forged_and_replayed_frames(server):
    import struct
    hdr = struct.Struct("!BII")
    frame = hdr.pack(1, 1, 1) + b"k" + b"v"                     # SET k = v
    # A wrong MAC ends the connection (and is counted).
    s, session = _raw_session(server.port)
    s.sendall(frame + b"\0" * 16)
    assert s.recv(100) == b""
    s.close()
    # A frame replayed with its (old) counter: accepted once, refused the second time.
    s, session = _raw_session(server.port)
    good = frame + _frame_mac(session, b"c", 0, frame)
    s.sendall(good)
    assert len(s.recv(100)) > 0                                  # the reply to the SET
    s.sendall(good)
    assert s.recv(100) == b""
    s.close()
    deadline = time.monotonic() + 5
    while server.bad_frames < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.bad_frames == 2


def test_store_survives_garbage_and_silent_clients(server):
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    for junk in (b"", b"\xff" * 7, os.urandom(32), os.urandom(5000)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.recv(16)                                           # the challenge
            s.sendall(junk)
    with StoreClient("127.0.0.1", server.port, 5, KEY) as c:
        c.set("x", b"1")
        assert c.get("x") == b"1"
    silent.close()


def test_rank_listener_refuses_a_forger_and_accepts_the_peer():
    key = auth.derive(KEY, "pairs", "job")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    info = {0: {"addr": "127.0.0.1", "port": port}}
    got = {}

    def rank0():
        got.update(_connect_pairs(0, 2, info, listener, key, time.monotonic() + 10))
    t = threading.Thread(target=rank0)
    t.start()
    forger = socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises(auth.AuthenticationFailed):
        auth.connect_handshake(forger, auth.derive(OTHER, "pairs", "job"),
                               b"PCst\0\0\0\0")
    forger.close()
    peer = _connect_pairs(1, 2, info, socket.socket(), key, time.monotonic() + 10)
    t.join(10)
    listener.close()
    assert list(got) == [1] and list(peer) == [0]
    for s in [*got.values(), *peer.values()]:
        s.close()


def test_secret_handling():
    assert auth.secret_from_env({}) is None
    with pytest.raises(ValueError, match="empty"):
        auth.secret_from_env({auth.ENV: ""})
    assert len(KEY) == 32 and KEY != OTHER
    assert auth.job_key(KEY, "a-1") != auth.job_key(KEY, "a-2")   # per start
    assert auth.job_key(None, "a-1") is None
    # Two communicators of a job, and two jobs, get different multicast groups.
    assert len({group_for("a-1", 0), group_for("a-1", 5), group_for("a-2", 0)}) == 3


@pytest.mark.parametrize("secret", [True, False], ids=["secret", "no secret"])
def test_forged_and_replayed_datagrams_are_dropped_and_results_exact(secret):
    import subprocess
    args = [sys.executable, "-m", "polycast.cli.main", "run", "-n", "4", "--timeout", "120"]
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop(auth.ENV, None)
    if secret:
        args.append("--secret")
    res = subprocess.run(args + [os.path.join(REPO, "tests", "hostile_datagrams.py"), "3"],
                         capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    reports = [json.loads(ln.split("HOSTILE ", 1)[1]) for ln in res.stdout.splitlines()
               if "HOSTILE " in ln]
    assert sorted(x["rank"] for x in reports) == [0, 1, 2, 3]
    for x in reports:
        d = x["drops"]
        assert x["secret"] is secret
        assert d.get("stale", 0) > 0, x               # replays of an earlier collective
        assert d.get("bad_magic", 0) > 0, x           # garbage
        if secret:
            assert d.get("unauthenticated", 0) > 0 and d.get("bad_mac", 0) > 0, x
        else:
            assert d.get("foreign_comm", 0) > 0, x    # another communicator's datagrams
    if secret:      # forged control frames handed to rank 0's driver: dropped and counted
        r0 = next(x for x in reports if x["rank"] == 0)
        assert r0["frames_dropped"] == 6
