"""Faults injected in the real UDP receive path (POLYCAST_FAULTS, runtime/transport/faults.py): every
multicast collective on 4 real ranks stays exact under loss up to 30 %, reordering,
duplication and stale datagrams replayed from earlier collectives and other communicators."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polycast.errors import InvalidArgument
from polycast.runtime.transport import faults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MATRIX = [
    ("loss=0.3,seed=1", False),
    ("loss=0.05,reorder=0.3,dup=0.2,seed=2", False),
    ("replay=0.2,loss=0.1,seed=3", False),
    ("loss=0.1,dup=0.1,reorder=0.1,replay=0.1,seed=4", True),
]
# Every fault kind is in the last case, which the README's command runs; the rest are slow.
CASES = [pytest.param(s, k, id=s + (",secret" if k else ""),
                      marks=() if k else pytest.mark.slow) for s, k in MATRIX]


@pytest.mark.parametrize("spec, secret", CASES)
def test_every_multicast_collective_is_exact_under_faults(spec, secret):
    env = dict(os.environ, PYTHONPATH=REPO, POLYCAST_FAULTS=spec, POLYCAST_TIMEOUT="60")
    env.pop("POLYCAST_SECRET", None)
    args = [sys.executable, "-m", "polycast.cli.main", "run", "-n", "4", "--timeout", "150"]
    res = subprocess.run(args + (["--secret"] if secret else [])
                         + [os.path.join(REPO, "tests", "fault_matrix.py")],
                         capture_output=True, text=True, timeout=200, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = [json.loads(ln.split("FAULTS ", 1)[1]) for ln in res.stdout.splitlines()
               if "FAULTS " in ln]
    assert sorted(x["rank"] for x in reports) == [0, 1, 2, 3]
    want = faults.parse(spec)
    for x in reports:
        assert x["failed"] == [] and x["checks"] >= 40, x
        inj, drops = x["injected"], x["drops"]
        for kind, counter in (("loss", "lost"), ("dup", "duplicated"),
                              ("reorder", "reordered"), ("replay", "replayed")):
            if getattr(want, kind):
                assert inj[counter] > 0, (kind, x)
        if want.replay:
            # Replays of earlier collectives are stale; of the other communicator, foreign.
            assert drops.get("stale", 0) > 0 and drops.get("foreign_comm", 0) > 0, x


def test_fault_specs_are_parsed_in_one_place():
    f = faults.parse("loss=0.25,dup=0.5,seed=9")
    assert (f.loss, f.dup, f.reorder, f.replay, f.seed) == (0.25, 0.5, 0.0, 0.0, 9)
    assert faults.parse("") is None and faults.from_env(env={}) is None
    for bad, why in (("loss=1", "probability"), ("loss=x", "not a number"),
                     ("drop=0.1", "KEY=VALUE"), ("loss", "KEY=VALUE")):
        with pytest.raises(InvalidArgument, match=why):
            faults.parse(bad)


def test_fault_decisions_keep_every_datagram_accounted_for():
    f = faults.Faults(loss=0.2, dup=0.2, reorder=0.3, replay=0.1, seed=5)
    got = []
    sent = [bytes([i % 256]) * 8 for i in range(2000)]
    for d in sent:
        f.feed(0, d, lambda c, x: got.append(x))
    f.release(0, lambda c, x: got.append(x))
    c = f.counts
    assert c["read"] == 2000 and min(c["lost"], c["duplicated"], c["reordered"],
                                     c["replayed"]) > 0
    # everything read arrives once, minus the lost, plus duplicates and replays
    assert len(got) == 2000 - c["lost"] + c["duplicated"] + c["replayed"]
    assert got != [d for d in sent if d in got]       # and not in the order it came
