"""``polycast sim sweep --ray ADDRESS`` against a real local Ray head that this test starts
(on 127.0.0.1, its own temp dir and ports) and stops (its process session, by pid). Skipped
with the reason when Ray is not installed (the ``ray`` extra)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'polycast[ray]')")

from polycast.sim.sweep import grid, run_grid  # noqa: E402

START_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(sid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                # fields 3 and 6 of stat: the state and the session id; a zombie is
                # already dead (only its parent's reaping is pending).
                if int(fields[3]) == sid and fields[0] != "Z":
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _start_head(tmp, attempt: int):
    """Start `ray start --head` in its own session; return (process, log file, port or
    None, the log's text when it did not start)."""
    port = _free_port()
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    argv = [ray_bin if os.path.exists(ray_bin) else "ray", "start", "--head", "--block",
            f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
            "--include-dashboard=false", "--disable-usage-stats",
            f"--temp-dir={tmp}/{attempt}",
            f"--dashboard-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}", f"--metrics-export-port={_free_port()}",
            f"--runtime-env-agent-port={_free_port()}"]
    log = open(tmp / f"head{attempt}.log", "w+")
    head = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        log.seek(0)
        text = log.read()
        if "Ray runtime started" in text:
            return head, log, port, ""
        if head.poll() is not None or time.monotonic() > deadline:
            return head, log, None, text
        time.sleep(0.2)


def _stop_head(head, log) -> None:
    # End the head: SIGTERM to `ray start` alone lets it stop its daemons in order
    # (a signal to all of them at once stalls that for half a minute); then whatever
    # is left of its session (pid = session id) is killed by pid.
    head.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=15)
    deadline = time.monotonic() + 10
    while _session_pids(head.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in _session_pids(head.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if head.poll() is None:
        head.kill()
        head.wait(timeout=10)
    log.close()
    assert not _session_pids(head.pid), "Ray processes left after the test"


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    # Two tries: on a loaded 2-core machine Ray's head can give up on its own raylet
    # (ray/_private/node.py waits a fixed 30 s for it to register: "GCS cannot find the
    # node"). That is Ray's start-up, not what this test checks (the sweep's rows).
    failures = []
    for attempt in range(2):
        head, log, port, text = _start_head(tmp, attempt)
        if port is not None:
            break
        _stop_head(head, log)
        failures.append(text[-3000:])
    else:
        pytest.fail(f"Ray head did not start twice within {START_TIMEOUT_S} s:\n"
                    + "\n---\n".join(failures))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _stop_head(head, log)


@pytest.mark.slow                   # starting a Ray head node dominates
def test_sweep_on_ray_matches_local(ray_head, tmp_path):
    out = tmp_path / "sweep.json"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "sim", "sweep",
                        "-c", "allgather", "--algos", "ring,mcast", "--nodes", "8,12",
                        "--sizes", "1MiB", "--topologies", "switch;leafspine:hosts_per_leaf=4",
                        "--ray", ray_head, "--out", str(out)],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    local = run_grid(grid("allgather", ["ring", "mcast"], [8, 12], [1 << 20],
                          ["switch", "leafspine:hosts_per_leaf=4"]), workers=1)
    assert len(rows) == len(local) == 8
    for got, want in zip(rows, local):
        assert got["error"] == "" and want["error"] == ""
        assert (got["algorithm"], got["nodes"], got["topology"]) == \
            (want["algorithm"], want["nodes"], want["topology"])
        assert got["time_s"] == want["time_s"] and got["link_bytes"] == want["link_bytes"]


def test_sweep_on_ray_bad_address_is_one_line():
    free = _free_port()              # nothing listens there
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "sim", "sweep", "-c",
                        "allgather", "--algos", "ring", "--nodes", "4", "--sizes", "1KiB",
                        "--topologies", "switch", "--ray", f"127.0.0.1:{free}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "cannot connect to a Ray cluster" in p.stderr.strip().splitlines()[-1]
