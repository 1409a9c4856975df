"""Ranks that call a collective differently — collective, size, dtype, op, root, algorithm,
on the engine, multicast and symmetric-memory paths — or skip one: every rank raises a
clear MismatchError within the timeout, and the communicator works afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 5


def test_every_kind_of_mismatch_raises_on_every_rank():
    env = dict(os.environ, PYTHONPATH=REPO, POLYCAST_TIMEOUT=str(TIMEOUT_S))
    res = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", "4",
                          "--timeout", "150", os.path.join(REPO, "tests", "mismatch_kinds.py")],
                         capture_output=True, text=True, timeout=200, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = {}
    for ln in res.stdout.splitlines():
        if "MISMATCH {" in ln:
            x = json.loads(ln.split("MISMATCH ", 1)[1])
            reports[x["rank"]] = x["cases"]
    assert sorted(reports) == [0, 1, 2, 3]
    names = [c["case"] for c in reports[0]]
    assert names == ["collective", "size", "dtype", "op", "root", "algorithm", "mcast size",
                     "mcast vs ring", "symm size", "skip"]
    for rank, cases in reports.items():
        for c in cases:
            assert c["error"], f"rank {rank}, case {c['case']}: nothing raised"
            assert c["error"].startswith("MismatchError"), (rank, c)
            assert c["seconds"] < TIMEOUT_S + 5, (rank, c)          # nothing waited it out
            if c["case"] != "skip":
                assert c["usable_after"], (rank, c)
    # The rank that called differently is named, and both calls are described.
    size = next(c for c in reports[0] if c["case"] == "size")["error"]
    assert "count=100" in size and "rank 3" in size
