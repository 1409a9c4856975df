"""Soak, the reduced run (issue 14 item 6; the full 10,000-call run is bench/soak.py): mixed
collectives with random algorithms, sizes, roots, ops and dtypes, up to 8 outstanding, on 4
real ranks with loss, duplication, reordering and replays injected: no error, exact results,
no descriptor leaked."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow                   # a soak
def test_mixed_collectives_under_faults_are_exact_and_leak_nothing(tmp_path):
    out = tmp_path / "soak.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "soak.py"), "--calls",
                          "400", "--ranks", "4", "--max-count", "20000", "--timeout", "150",
                          "--out", str(out)],
                         capture_output=True, text=True, timeout=200, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run, = json.loads(out.read_text())["runs"]
    assert "error" not in run, run.get("error")
    assert run["failed"] == 0 and len(run["per_rank"]) == 4
    assert all(x["calls"] == 400 for x in run["per_rank"])
    assert run["fds_growth"] == 0, run
    assert run["rss_growth_mib"] < 64, run          # flat, up to allocator noise
    if run["mcast"]:
        inj = run["injected"]
        assert inj["lost"] > 0 and inj["reordered"] > 0, inj
        assert run["recovered_bytes"] > 0
