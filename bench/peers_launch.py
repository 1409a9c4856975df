"""Launching bench/peers.py's peers, bounded: one subprocess in its own process group
(killed, group and all, when it runs out of time), what it ended as (:class:`Finished`),
a peer's outcome (:class:`PeerRun`), the rows a peer wrote with their bandwidth, and the
MPICH and gloo launches (polycast's, which walks its algorithms, is bench/peers.py's)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers_common as pc  # noqa: E402
from polycast.collectives import Collective  # noqa: E402

# MPICH over TCP: no shared-memory path between local ranks (NOLOCAL), and UCX (this
# wheel's netmod) restricted to its TCP transport.
MPICH_TCP_ENV = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"}
DEFAULT_JSON = HERE / "results" / "peers.json"
KILL_GRACE_SECONDS = 3.0


@dataclass
class Finished:
    """How one bounded subprocess ended."""
    returncode: int | None   # None when it was killed on timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool

    def why(self, what: str, timeout_seconds: float) -> str:
        if self.timed_out:
            return f"{what} timed out after {timeout_seconds:g}s"
        tail = ([ln for ln in self.stderr.splitlines() if ln.strip()]
                or [ln for ln in self.stdout.splitlines() if ln.strip()])
        last = tail[-1].strip()[:200] if tail else "no output"
        return f"{what} failed (exit {self.returncode}): {last}"


@dataclass
class PeerRun:
    """One peer's outcome: ``rows`` by (collective, nbytes); ``unavailable`` is the reason
    the peer did not run at all, ``missing`` the reason shown for cases it did not finish
    (``missing_by`` per case where known)."""
    name: str
    rows: dict[tuple[str, int], dict] = field(default_factory=dict)
    unavailable: str = ""
    missing: str = ""
    missing_by: dict[tuple[str, int], str] = field(default_factory=dict)
    library: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def reason(self, key: tuple[str, int] | None = None) -> str:
        return (self.unavailable or self.missing_by.get(key) or self.missing
                or "no result")


def run_bounded(cmd: list[str], timeout_seconds: float, env: dict | None = None) -> Finished:
    """Run ``cmd`` in its own process group; on timeout kill that group (by the child's
    pid), first with SIGTERM, then SIGKILL."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, cwd=str(HERE.parent))
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
        return Finished(proc.returncode, out, err, time.monotonic() - t0, False)
    except subprocess.TimeoutExpired:
        out, err = _kill_group(proc)
        return Finished(None, out, err, time.monotonic() - t0, True)
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> tuple[str, str]:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_SECONDS)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            continue
    try:
        out, err = proc.communicate(timeout=KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        out, err = "", ""
    return out or "", err or ""

def with_bandwidth(row: dict, nranks: int) -> dict:
    """``row`` plus algbw and busbw (GB/s) from its nbytes and time_us."""
    t = float(row["time_us"])
    algbw = row["nbytes"] / (t * 1e3) if t > 0 else 0.0
    busbw = algbw * Collective.parse(row["collective"]).busbw_factor(nranks)
    return {**row, "algbw": algbw, "busbw": busbw}


def read_rows(path: Path, nranks: int) -> dict[tuple[str, int], dict]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = with_bandwidth(json.loads(line), nranks)
                rows[(r["collective"], r["nbytes"])] = r
    return rows

def find_mpiexec() -> str | None:
    """The mpich wheel puts mpiexec beside the interpreter; prefer it to one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def run_mpich(cases, nranks, warmup, timeout_seconds, workdir: Path,
              transport: str = "auto") -> PeerRun:
    run = PeerRun("mpich")
    if importlib.util.find_spec("mpi4py") is None:
        run.unavailable = "mpi4py not installed: pip install mpich mpi4py"
        return run
    mpiexec = find_mpiexec()
    if mpiexec is None:
        run.unavailable = "no mpiexec: pip install mpich"
        return run
    out = workdir / "mpich.jsonl"
    cmd = [mpiexec, "-n", str(nranks), sys.executable, str(HERE / "peers_mpi_worker.py"),
           pc.dump_plan(cases, warmup), str(out)]
    env = {**os.environ, **MPICH_TCP_ENV} if transport == "tcp" else None
    return _finish(run, run_bounded(cmd, timeout_seconds, env), out, nranks, "mpiexec",
                   timeout_seconds)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(cases, nranks, warmup, timeout_seconds, workdir: Path) -> PeerRun:
    run = PeerRun("gloo")
    if importlib.util.find_spec("torch") is None:
        run.unavailable = "torch not installed: pip install torch==2.13.0 (CPU build)"
        return run
    out = workdir / "gloo.jsonl"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore::FutureWarning"}
    cmd = [sys.executable, str(HERE / "peers_gloo_worker.py"), str(nranks), str(free_port()),
           pc.dump_plan(cases, warmup), str(out)]
    return _finish(run, run_bounded(cmd, timeout_seconds, env), out, nranks, "gloo ranks",
                   timeout_seconds)


def _finish(run: PeerRun, done: Finished, out: Path, nranks: int, what: str,
            timeout_seconds: float) -> PeerRun:
    run.seconds = done.seconds
    run.rows = read_rows(out, nranks)
    if run.rows:
        run.library = next(iter(run.rows.values())).get("library", "")
    if done.timed_out or done.returncode != 0:
        reason = done.why(what, timeout_seconds)
        run.notes.append(reason)
        if run.rows:
            run.missing = reason
        else:
            run.unavailable = reason
    return run
