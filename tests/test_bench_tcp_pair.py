"""bench/tcp_pair.py runs end to end on a small size: raw-socket ceilings (one way, both ways,
a 4-process ring) and polycast's 2-rank pair over TCP, before/after alternating, JSON out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow                   # runs the benchmark
def test_tcp_pair_bench_measures_raw_and_polycast_rows(tmp_path):
    out = tmp_path / "tcp_pair.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "tcp_pair.py"),
                          "--size", "1MiB", "--iters", "2", "--rounds", "2", "--cases", "pair",
                          "--before", REPO, "--out", str(out)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    rows = {(r["case"], r["tree"]): r for r in got["rows"]}
    assert set(rows) == {("raw uni (sockets)", "raw"), ("raw bidi (sockets)", "raw"),
                         ("raw ring 4 (sockets, busbw)", "raw"),
                         ("pair uni (broadcast binomial)", "before"),
                         ("pair uni (broadcast binomial)", "now"),
                         ("pair bidi (allgather ring)", "before"),
                         ("pair bidi (allgather ring)", "now")}, sorted(rows)
    for r in rows.values():
        assert r["nbytes"] == 1 << 20 and len(r["all_gbps"]) == 2
        assert all(v > 0 for v in r["all_gbps"]), r
    assert "pair bidi (allgather ring)" in res.stdout
