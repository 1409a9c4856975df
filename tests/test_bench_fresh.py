"""bench/fresh.py: a short real run of both modes (unchanged and fresh input) through
polycast, checked row by row; MPICH's rows when mpi4py and mpiexec are installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_fresh_bench_times_both_modes_and_checks_the_outputs(tmp_path):
    out = tmp_path / "fresh.json"
    done = subprocess.run([sys.executable, str(BENCH / "fresh.py"), "-n", "2", "--sizes",
                           "4KiB,600KiB", "--iters", "20", "--warmup", "3", "--json",
                           str(out)], capture_output=True, text=True, timeout=240)
    assert out.exists(), done.stdout[-1000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    mine = {(r["collective"], r["nbytes"], r["mode"]): r for r in rows
            if r["library"] == "polycast"}
    want = {(c, n, m) for c in ("broadcast", "allgather") for n in (4096, 600 << 10)
            for m in ("unchanged", "fresh")}
    assert set(mine) == want, done.stderr[-2000:]
    assert all(r["correct"] and r["time_us"] > 0 for r in mine.values()), mine
    mpich = [r for r in rows if r["library"] == "mpich"]
    if importlib.util.find_spec("mpi4py") is not None:
        assert len(mpich) == len(want) and all(r["correct"] for r in mpich), mpich
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MPICH/polycast" in done.stdout
