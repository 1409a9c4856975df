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


@pytest.mark.slow                   # a soak, through torch.distributed
def test_torch_path_soak_is_exact_and_samples_memory(tmp_path):
    """The same draws through torch.distributed on polycast groups (auto and an engine
    group): exact results, resident memory sampled every 100 calls and drawn."""
    pytest.importorskip("torch")
    out, series = tmp_path / "soak.json", tmp_path / "series"
    series.mkdir()
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "soak.py"), "--calls",
                          "300", "--ranks", "2", "--path", "torch", "--faults", "",
                          "--max-count", "4096", "--sample-every", "100", "--series-dir",
                          str(series), "--timeout", "200", "--out", str(out)],
                         capture_output=True, text=True, timeout=260, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run, = json.loads(out.read_text())["runs"]
    assert "error" not in run, run.get("error")
    assert run["path"] == "torch" and run["failed"] == 0, run["per_rank"][0]["failed"]
    assert run["fds_growth"] == 0, run
    assert all(x["calls"] == 300 for x in run["per_rank"])
    for rank in range(2):
        s = run["rss_series"][str(rank)] if str(rank) in run["rss_series"] \
            else run["rss_series"][rank]
        calls = [c for c, *_ in s]       # a sample where a batch (1-8 calls) crosses N*100
        assert len(calls) == 5 and calls[0] == 0 and calls[-2:] == [300, 300], calls
        assert [c // 100 for c in calls[1:3]] == [1, 2], calls
        lines = (series / f"torch-rank-{rank}.jsonl").read_text().splitlines()
        assert len(lines) == 3                     # written as the run went
