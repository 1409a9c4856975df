"""The README's example script runs as documented: `polycast run -n 4 examples/allgather.py`."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_runs_on_local_ranks():
    proc = subprocess.run(
        [sys.executable, "-m", "polycast.cli.main", "run", "-n", "3",
         str(ROOT / "examples" / "allgather.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "POLYCAST_TIMEOUT": "60"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] allgather ok: [0.0, 0.0, 0.0, 0.0, 1.0" in proc.stdout
    assert "['rank-0', 'rank-1', 'rank-2']" in proc.stdout
