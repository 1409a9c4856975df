"""Run a bench script's own ranks as local processes and take rank 0's result line.

bench/symm.py, bench/overlap.py and bench/vector.py each re-run themselves with ``--rank`` in
N processes (environment from ``polycast.tools.launch.rank_env``); rank 0 prints one line
``<MARKER> <json>``. Every process is ended by pid when the job is over or times out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_ranks(cmd: list[str], nranks: int, job: str, marker: str, timeout_seconds: float,
              repo: str, extra_env: dict[str, str] | None = None):
    """Rank 0's ``marker`` line as JSON, or None (each rank's output printed to stderr)
    when a rank failed or rank 0 printed no such line."""
    from polycast.tools.launch import free_port, rank_env
    port = free_port()
    procs = []
    try:
        for r in range(nranks):
            env = rank_env(r, nranks, port, job)
            env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
            env.update(extra_env or {})
            procs.append(subprocess.Popen(cmd, env=env, cwd=repo, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [pr.communicate(timeout=timeout_seconds) for pr in procs]
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait(timeout=10)
    prefix = marker + " "
    line = [ln for ln in outs[0][0].splitlines() if ln.startswith(prefix)]
    if not line or any(pr.returncode for pr in procs):
        for r, (o, e) in enumerate(outs):
            print(f"rank {r} exit {procs[r].returncode}\n{o[-2000:]}\n{e[-2000:]}",
                  file=sys.stderr)
        return None
    return json.loads(line[0][len(prefix):])


def realtime_prefix(parser) -> list[str]:
    """The command prefix that runs a bench's processes at real-time round-robin priority 1
    (``--realtime``: the machine's other load stays out; root only)."""
    import shutil
    chrt = shutil.which("chrt")
    if chrt is None:
        parser.error("--realtime needs chrt (util-linux)")
    return [chrt, "-r", "1"]
