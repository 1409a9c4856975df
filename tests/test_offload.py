"""Offloaded progress (polycast.init(progress="offload")): every collective and algorithm
on 2-4 real ranks, and the failure paths: mismatch, a rank killed, a timeout, the offload
process killed, unregistered buffers where registration is required. After every run the
offload process is gone and /dev/shm holds nothing of it."""

from __future__ import annotations

import glob
import os
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_runtime_helpers import selftest, spawn_ranks  # noqa: E402

from polycast.errors import InvalidArgument  # noqa: E402
from polycast import config  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="offload mode needs Linux (abstract Unix sockets)")

OFFLOAD = {"POLYCAST_PROGRESS": "offload"}


def _leftovers(results) -> list[str]:
    """This run's shared files still in /dev/shm: the names carry their creator's pid (a
    rank's rings and arena; the offload process's worker rings), so other jobs on the
    machine (other test runs, other users) are not counted."""
    ours = {r.pid for r in results} | _server_pids(results)
    return [p for p in glob.glob("/dev/shm/polycast-off-*")
            if int(os.path.basename(p).split("-")[2]) in ours]


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    return True             # a zombie: exited, waiting for its reaper
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _server_pids(results) -> set[int]:
    return {int(m) for r in results for m in re.findall(r"RESULT server_pid (\d+)", r.out)}


def _ok(results, suite: str) -> None:
    for r in results:
        assert r.returncode == 0, f"rank {r.rank}:\n{r.out}\n{r.err[-3000:]}"
        assert f"SELFTEST {suite} OK" in r.out, r.out + r.err[-3000:]


@pytest.mark.parametrize("nranks,workers,secret", [(2, "1", ""), (3, "2", "s3cr3t-for-offload"),
                                                   pytest.param(4, "0", "", marks=pytest.mark.slow)])
def test_every_collective_and_algorithm(nranks, workers, secret):
    """The runtime selftest (every collective, every algorithm, the API) in offload mode:
    exact results, as in-process (with a job secret: every message and datagram MACed)."""
    env = {**OFFLOAD, "POLYCAST_OFFLOAD_WORKERS": workers}
    if secret:
        env["POLYCAST_SECRET"] = secret
    res = selftest(nranks, "all", env=env, timeout=180)
    _ok(res, "all")
    assert "algos=" in res[0].out and int(res[0].out.split("algos=")[1].split()[0]) > 30
    assert not _leftovers(res)


def test_loss_recovered_through_the_workers():
    """Datagrams lost, duplicated and reordered where the workers read them (POLYCAST_FAULTS)
    are pulled by the engines and placed by the workers (StreamData): exact results,
    recovered bytes counted."""
    env = {**OFFLOAD, "POLYCAST_OFFLOAD_WORKERS": "2",
           "POLYCAST_FAULTS": "loss=0.2,dup=0.05,reorder=0.1,seed=3",
           "POLYCAST_TIMEOUT": "30"}
    res = spawn_ranks(3, ["tests/offload_rank.py", "lossy"], env=env, timeout=90)
    for r in res:
        assert r.returncode == 0, r.out + r.err[-3000:]
        assert "RESULT lossy exact=True" in r.out, r.out
    recovered = [int(m) for r in res for m in re.findall(r"recovered=(\d+)", r.out)]
    assert sum(recovered) > 0, [r.out for r in res]
    assert not _leftovers(res)


def test_mismatch_is_the_engines_error_on_every_rank():
    res = selftest(3, "mismatch", env={**OFFLOAD, "POLYCAST_TIMEOUT": "20"}, timeout=90)
    _ok(res, "mismatch")


def test_a_rank_killed_is_peer_lost_on_the_others():
    res = selftest(3, "death", env={**OFFLOAD, "POLYCAST_TIMEOUT": "20"}, timeout=90)
    dead = [r for r in res if r.returncode != 0]
    assert len(dead) == 1, [(r.rank, r.returncode) for r in res]
    for r in res:
        if r.returncode == 0:
            assert "SELFTEST death OK" in r.out, r.out + r.err[-2000:]
    assert not _leftovers(res)


# The timeout a scenario sets also bounds its start-up: on a loaded machine (load 18+, seen
# 4 times in sessions 4-5: every rank's output empty) the offload process, a fresh Python,
# was not answering within a 3 s POLYCAST_TIMEOUT. Not what these tests are about: launch
# once more then, and only then.
STARTUP_FAILED = ("no offload process for this host", "rendezvous did not finish")


def _scenario(nranks: int, name: str, env: dict):
    for _ in range(2):
        res = spawn_ranks(nranks, ["tests/offload_rank.py", name],
                          env={**OFFLOAD, **env}, timeout=90)
        if _server_pids(res) or not any(w in r.err for r in res for w in STARTUP_FAILED):
            break
    pids = _server_pids(res)
    assert len(pids) == 1, [(r.out, r.err[-2000:]) for r in res]
    assert _gone(pids.pop()), "the offload process outlived its ranks"
    assert not _leftovers(res)
    return res


def test_offload_process_killed_is_a_clear_error_on_every_rank():
    res = _scenario(2, "kill-offload", {"POLYCAST_TIMEOUT": "30"})
    for r in res:
        assert r.returncode == 0, r.err[-2000:]
        m = re.search(r"RESULT OffloadLost after ([0-9.]+)s: (.*)", r.out)
        assert m, r.out + r.err[-2000:]
        assert float(m.group(1)) < 5.0          # at once, not at the 30 s timeout
        assert "offload process" in m.group(2) and "is gone" in m.group(2)
        assert "RESULT later OffloadLost" in r.out


def test_timeout_is_the_engines_error():
    res = _scenario(2, "timeout", {"POLYCAST_TIMEOUT": "3"})
    out0 = res[0].out
    assert "RESULT CollectiveTimeout" in out0, out0 + res[0].err[-2000:]
    assert "not done after 3 s" in out0 and "waiting on" in out0


def test_unregistered_buffer_refused_when_staging_is_off():
    res = _scenario(2, "unregistered", {"POLYCAST_OFFLOAD_STAGING": "0"})
    for r in res:
        assert r.returncode == 0, r.err[-2000:]
        assert "RESULT registered ok=True" in r.out
        assert "RESULT InvalidArgument: send buffer is not registered memory" in r.out
        assert "RESULT after ok=True" in r.out


def test_a_call_refused_on_one_rank_fails_on_all():
    res = _scenario(2, "refuse", {"POLYCAST_TIMEOUT": "20"})
    assert "RESULT refused InvalidArgument: refused here" in res[0].out, res[0].out
    assert "RESULT refused" in res[1].out and "recvbuf is too small" in res[1].out, \
        res[1].out + res[1].err[-2000:]
    for r in res:
        assert "RESULT after ok=True" in r.out, r.out + r.err[-2000:]


def test_bad_settings_are_clear_errors():
    from polycast.runtime.bootstrap.env import JobEnv
    from polycast.runtime.offload.client import attach
    with pytest.raises(InvalidArgument, match="valid choices: thread, offload"):
        config.Config().replace(progress="nic")
    with pytest.raises(InvalidArgument, match="POLYCAST_PROGRESS"):
        config.load({"POLYCAST_PROGRESS": "bogus"})
    assert config.load({}).progress == "thread"
    with pytest.raises(InvalidArgument, match="POLYCAST_OFFLOAD_WORKERS='-1'"):
        config.load({"POLYCAST_OFFLOAD_WORKERS": "-1"})
    with pytest.raises(InvalidArgument, match="POLYCAST_OFFLOAD_WORKERS='x'"):
        config.load({"POLYCAST_OFFLOAD_WORKERS": "x"})
    with pytest.raises(InvalidArgument, match="POLYCAST_FAULTS='loss=2'"):
        attach(JobEnv(0, 1, 0, 1, "127.0.0.1", 1, "single", "", 1.0),   # before any start
               config.load({"POLYCAST_FAULTS": "loss=2"}))
    with pytest.raises(InvalidArgument, match="at least 1 MiB"):
        config.load({"POLYCAST_OFFLOAD_ARENA": "1000"})
    assert config.load({}).offload_arena_nbytes == 1 << 30


def test_a_missing_offload_process_is_a_clear_error():
    """A rank whose host has no offload process (its local rank 0 is not in offload mode, or
    never came) gets OffloadLost naming what to check, within its timeout, not a hang."""
    from polycast.errors import OffloadLost
    from polycast.runtime.bootstrap.env import JobEnv
    from polycast.tools.launch import free_port
    from polycast.runtime.offload.client import attach

    job = JobEnv(rank=1, size=2, local_rank=1, local_size=2, master_addr="127.0.0.1",
                 master_port=free_port(), launcher="polycast", job_id="", timeout_seconds=1.0)
    before = set(glob.glob(f"/dev/shm/polycast-off-{os.getpid()}-*"))
    t0 = time.monotonic()
    with pytest.raises(OffloadLost, match="no offload process for this host.*local rank 0"):
        attach(job)
    assert time.monotonic() - t0 < 5.0
    assert set(glob.glob(f"/dev/shm/polycast-off-{os.getpid()}-*")) == before
