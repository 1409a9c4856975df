"""bench/floor.py runs end to end on a few calls: the in-process engine's events per rank and
call, a 1-rank call with and without the driver, and a 2-rank job's wall, CPU and pieces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_floor_bench_splits_a_small_call(tmp_path):
    """The engine's events per message (the compiled replay off)."""
    out = tmp_path / "floor.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "floor.py"),
                          "--ranks", "2", "--iters", "60", "--repeats", "2",
                          "--mpich-us", "10", "--replay", "off", "--json", str(out)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    (eng,) = got["engine"]
    # recdoubling on 2 ranks: one DATA message each way, every event kind timed
    assert eng["nranks"] == 2 and eng["messages_per_rank"] == 1.0
    assert set(eng["us"]) == {"post", "on_message", "on_send_done", "pack", "parse_header"}
    assert eng["us"]["post"]["each"] > 0 and eng["us"]["on_message"]["each"] > 0
    assert eng["per_rank_call_us"] >= eng["us"]["post"]["per_rank_call"]
    entry = got["entry"]
    assert 0 < entry["api_cpu_us"] < entry["whole_cpu_us"], entry
    (ranks,) = got["ranks"]
    assert ranks["nranks"] == 2 and ranks["wall_us"] > 0 and ranks["cpu_us"] > 0
    assert ranks["budget_cpu_us"] == 3 * 10 * min(got["cores"], 2) / 2
    pieces = ranks["pieces"]
    # every call posts once into the engine and takes the peer's one message (the peer may
    # be one call ahead or behind at the window's edges: its message of the first call can
    # arrive while this rank finishes the Barrier before the window)
    assert pieces["engine.post"]["per_call"] == 1.0, pieces
    assert 0.95 <= pieces["engine.on_message"]["per_call"] <= 1.05, pieces
    assert pieces["driver.post"]["cpu_us"] >= pieces["engine.post"]["cpu_us"] * 0.5
    assert "2 ranks: wall" in res.stdout


def test_floor_bench_times_the_replayed_call(tmp_path):
    from polycast.runtime.driver.replay import unavailable_reason
    if unavailable_reason() is not None:
        import pytest
        pytest.skip(f"no compiled replay: {unavailable_reason()}")
    out = tmp_path / "floor.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "floor.py"),
                          "--ranks", "2", "--iters", "60", "--repeats", "1",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    (ranks,) = got["ranks"]
    pieces = ranks["pieces"]
    # every call goes from the comm layer straight to the replay (runtime/driver/direct.py);
    # (almost) none reaches the driver's or the engine's post
    assert pieces["direct.run"]["per_call"] == 1.0, pieces
    assert pieces["replay.replay"]["per_call"] == 1.0, pieces
    assert pieces.get("driver.post", {"per_call": 0})["per_call"] <= 0.1, pieces
    assert pieces.get("engine.post", {"per_call": 0})["per_call"] <= 0.1, pieces
    assert ranks["replay"]["whole_per_call"] > 0.8 and ranks["replay"]["yields_per_call"] >= 0
    assert ranks["replay"]["direct_per_call"] > 0.8, ranks["replay"]
