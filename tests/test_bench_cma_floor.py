"""bench/cma_floor.py runs end to end on a small case: the copy ceilings of this machine and
a 2-rank engine allgather whose CPU is split into single-copy reads, the local copy and the
rest, with the frames counted and the copy floor beside it; and the auto (symm) path's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow                   # runs the benchmark
def test_cma_floor_bench_splits_an_engine_allgather(tmp_path):
    out = tmp_path / "cma_floor.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, os.path.join(REPO, "bench", "cma_floor.py"),
                          "--ranks", "2", "--sizes", "4MiB", "--algos", "ring,direct,auto",
                          "--iters", "3", "--json", str(out)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    if res.returncode == 2:
        pytest.skip("single-copy (process_vm_readv) is not available here: " +
                    res.stderr.strip()[-300:])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert [c["case"] for c in got["ceilings"]] == [
        "1 reader, 4 MiB", "1 reader, 12 MiB", "2 readers at once, 12 MiB each"]
    for c in got["ceilings"]:
        assert c["read_gbps"] > 0.1 and c["memcpy_gbps"] > 0.1, c
    rows = {r["algorithm"]: r for r in got["rows"]}
    assert set(rows) == {"ring", "direct", "auto"}
    # auto: the symm path, no frames at all; with a core per rank 512 KiB a rank goes
    # single copy (runtime/symm/single.py), so its reads are timed
    from polycast.runtime.symm.barrier import _cores
    auto = rows.pop("auto")
    assert auto["correct"] and auto["frames"] == 0, auto
    assert auto["read_s"] > 0 or _cores() < 2, auto
    for r in rows.values():
        assert r["correct"] and r["ranks"] == 2 and r["nbytes"] == 4 << 20, r
        # 2 MiB shards (over the 1 MiB eager limit between shm ranks, so by rendezvous) go
        # single-copy: the reads are timed, and every call handles frames
        assert r["read_s"] > 0 and r["frames"] >= 2, r
        assert 0 < r["cpu_s"] and r["wall_s"] > 0 and r["floor_s"] > 0, r
        assert abs(r["cpu_s"] - r["read_s"] - r["copy_s"] - r["rest_s"]) < 1e-9, r
    assert "ranks   size algorithm" in res.stdout
