"""A rank that dies mid-step: the others raise a clear polycast error naming it, well
within the timeout (no hang)."""

from __future__ import annotations

import re

import pytest

from torch_helpers import ROOT, needs_torch, polycast_run, results, spawn

pytestmark = needs_torch
TIMEOUT_SECONDS = 20


@pytest.mark.slow                   # a training step killed mid-way, then the timeout
def test_rank_dying_mid_step_raises_on_the_others_in_time(tmp_path):
    outs = spawn(3, ROOT / "tests" / "torch_fault_worker.py", timeout=TIMEOUT_SECONDS + 90,
                 POLYCAST_TIMEOUT=TIMEOUT_SECONDS, RESULT_DIR=tmp_path)
    assert outs[2][0] == 17, outs[2]                  # the victim
    got = results(tmp_path)
    assert [r["rank"] for r in got] == [0, 1], outs
    for (code, out, err), r in zip(outs[:2], got):
        assert code == 0, out[-2000:] + err[-3000:]
        assert r.get("step") == 2, r                   # raised at the step the peer died
        assert "rank 2" in r["error"], r               # names the dead rank
        # Raised by the backend's own call: PeerLost itself; reached through DDP's reducer
        # (a failed future, in C++): a RuntimeError quoting it.
        assert r["error_type"] == "PeerLost" or (
            r["error_type"] == "RuntimeError" and "PeerLost: lost rank 2" in r["error"]), r
        assert r["seconds"] < TIMEOUT_SECONDS, r


@pytest.mark.slow                   # two ranks wait out a 4 s timeout plus torch's retry delay
def test_unreachable_store_fails_within_the_timeout_naming_it(tmp_path):
    """Under polycast's launcher, a torch job whose store nobody serves (here: every rank a
    client, as under an agent store that is not there) fails within POLYCAST_TIMEOUT with
    the address, not after torch's 30 minutes."""
    proc = polycast_run(2, ROOT / "tests" / "torch_store_worker.py", timeout=120,
                        POLYCAST_TIMEOUT=4, RESULT_DIR=tmp_path,
                        TORCHELASTIC_USE_AGENT_STORE="True")
    got = results(tmp_path)
    assert [r["rank"] for r in got] == [0, 1], proc.stdout[-2000:] + proc.stderr[-3000:]
    for r in got:
        assert r["error_type"] == "CollectiveTimeout", r
        assert re.search(r"store at 127\.0\.0\.1:\d+ \(env://\) not reached within 4 s",
                         r["error"]), r
        assert r["seconds"] < 60, r
