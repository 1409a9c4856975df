"""Start groups of real rank processes for the runtime tests (bounded, killed by pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from polycast.tools.launch import free_port, rank_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class RankResult:
    rank: int
    returncode: int
    out: str
    err: str
    pid: int = 0            # the rank's process id (names what it left behind, if anything)


def spawn_ranks(nranks: int, argv: list[str], *, env: dict | None = None,
                timeout: float = 90.0, per_rank: dict | None = None) -> list[RankResult]:
    """Run ``python argv...`` as ``nranks`` ranks without a launcher in between (so one
    rank's exit does not end the others); return every rank's status and output.
    ``per_rank``: {rank: {name: value}} set for that rank only."""
    port = free_port()
    job = f"t{os.getpid()}{port}"
    procs = []
    try:
        for r in range(nranks):
            e = rank_env(r, nranks, port, job, extra=env)
            e["PYTHONPATH"] = REPO + os.pathsep + e.get("PYTHONPATH", "")
            e.update((per_rank or {}).get(r, {}))
            procs.append(subprocess.Popen([sys.executable, *argv], env=e, cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL, text=True))
        results = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=timeout)
            results.append(RankResult(r, p.returncode, out, err, p.pid))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def rank_results(results: list[RankResult], victim: int | None = None, *,
                 exit_ok: bool = False, stderr: bool = False) -> list[dict]:
    """Each surviving rank's last ``RESULT <json>`` line (``exit_ok``: its exit status must
    be 0 too; ``stderr``: its stderr under "_stderr"); the ``victim`` must have exited 17."""
    out = []
    for r in results:
        if r.rank == victim:
            assert r.returncode == 17, (r.out[-2000:], r.err[-2000:])
            continue
        line = [ln for ln in r.out.splitlines() if ln.startswith("RESULT ")]
        assert line and (r.returncode == 0 or not exit_ok), \
            f"rank {r.rank} (exit {r.returncode})\n{r.out[-3000:]}\n{r.err[-3000:]}"
        res = json.loads(line[-1][len("RESULT "):])
        if stderr:
            res["_stderr"] = r.err
        out.append(res)
    return out


def selftest(nranks: int, suite: str, env: dict | None = None, timeout: float = 120.0):
    return spawn_ranks(nranks, ["-m", "polycast.tools.selftest", "--suite", suite],
                       env=env, timeout=timeout)


def with_config(comm, **changes):
    """A communicator of ``comm``'s members with ``comm``'s settings changed (collective:
    every rank calls it): a communicator's settings are fixed when it is made
    (polycast.config), so a rank script wanting others makes one this way instead of
    changing the environment under a running communicator."""
    comm.Barrier()
    return comm._make_child(comm._child_id("config"), list(comm.members),
                            comm.config.replace(**changes))
