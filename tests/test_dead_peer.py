"""A rank SIGKILLed or SIGSTOPped in the middle of a collective, on the shared-memory, TCP,
multicast and symmetric-memory paths: every survivor raises an error naming it within the
timeout, the launcher exits non-zero, and nothing is left in /dev/shm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 3
CASES = [(m, p) for m in ("kill", "stop") for p in ("shm", "tcp", "mcast", "symm")]


@pytest.mark.parametrize("mode, path", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_survivors_name_the_dead_or_stopped_rank(mode, path):
    env = dict(os.environ, PYTHONPATH=REPO, POLYCAST_TIMEOUT=str(TIMEOUT_S),
               POLYCAST_TRANSPORT="tcp" if path == "tcp" else "auto")
    res = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", "4",
                          "--timeout", "90", os.path.join(REPO, "tests", "dead_peer.py"),
                          mode, path], capture_output=True, text=True, timeout=120, env=env,
                         cwd=REPO)
    out = res.stdout + res.stderr
    assert res.returncode not in (0, 124), out[-3000:]
    survivors = [json.loads(ln.split("SURVIVOR ", 1)[1]) for ln in res.stdout.splitlines()
                 if "SURVIVOR " in ln]
    assert sorted(s["rank"] for s in survivors) == [0, 1, 3], out[-3000:]
    for s in survivors:
        assert "rank 2" in s["message"], s
        if mode == "kill":
            assert s["error"] == "PeerLost" and s["seconds"] < TIMEOUT_S, s
        else:
            assert s["error"] == "CollectiveTimeout" and s["seconds"] < TIMEOUT_S + 3, s
    if mode == "kill":
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
