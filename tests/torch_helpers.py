"""Running multi-rank torch scripts from the tests (skipped when torch is missing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

try:
    import torch  # noqa: F401
    import torch.distributed as dist
    HAVE_TORCH = dist.is_available() and dist.is_gloo_available()
    WHY = "" if HAVE_TORCH else "torch.distributed with gloo is not available"
except ImportError:
    HAVE_TORCH, WHY = False, "torch is not installed (pip install 'polycast[torch]')"

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason=WHY)


def env(**extra) -> dict:
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
         "POLYCAST_TIMEOUT": "30", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    e.update({k: str(v) for k, v in extra.items()})
    return e


def polycast_run(nranks: int, script, *args, timeout: float = 240, **extra):
    """``polycast run -n nranks script args`` -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", str(nranks),
                           "--timeout", str(timeout - 10), str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env(**extra))


def torchrun(nranks: int, script, *args, timeout: float = 240, **extra):
    """``torchrun --nproc-per-node nranks script args`` on a free port -> CompletedProcess."""
    from polycast.tools.launch import free_port
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(nranks), "--master-port", str(free_port()), str(script),
                           *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env(**extra))


def results(result_dir) -> list[dict]:
    """What every rank reported (``report`` in the workers), in rank order."""
    out = []
    for path in sorted(Path(result_dir).glob("rank-*.json"),
                       key=lambda p: int(p.stem.split("-")[1])):
        out.append(json.loads(path.read_text()))
    return out


def spawn(nranks: int, script, *args, timeout: float = 120, **extra) -> list:
    """Start the ranks ourselves (no launcher that ends the others when one fails):
    -> [(returncode, stdout, stderr)] per rank."""
    from polycast.tools.launch import free_port
    port = free_port()
    procs = []
    try:
        for r in range(nranks):
            e = env(RANK=r, WORLD_SIZE=nranks, LOCAL_RANK=r, LOCAL_WORLD_SIZE=nranks,
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra)
            procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, cwd=ROOT, env=e))
        deadline = time.monotonic() + timeout
        outs = []
        for p in procs:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.returncode, o, e))
        return outs
    finally:
        for p in procs:              # only on a timeout: ours, by pid
            if p.poll() is None:
                p.kill()
                p.wait()
