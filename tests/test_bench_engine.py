"""bench/engine.py runs end to end on a few chunks: every case is timed, and its datagram cases
check on the way that every datagram was placed and none dropped (the bench asserts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_engine_bench_times_every_case(tmp_path):
    out = tmp_path / "engine.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "engine.py"),
                          "--chunks", "40", "--repeats", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    cases = {r["case"]: r for r in got["results"]}
    assert len(cases) == 6, sorted(cases)
    # 40 chunks: 4 events per chunk for the 2-rank ring's messages, one datagram per chunk
    # plus the EOS for each datagram case
    assert cases["message in + send done"]["events"] == 160
    for name, r in cases.items():
        assert r["engine_s"] > 0 and r["us_per_event_best"] > 0, name
        if name.startswith("datagram"):
            assert r["events"] == 41, (name, r["events"])
