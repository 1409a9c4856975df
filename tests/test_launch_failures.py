"""`polycast run` when things go wrong: the first failure is named, with its status and one
traceback; ranks die with their launcher; timeouts say what they end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, timeout=60, env=None):
    env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    return subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def _script(tmp_path, body: str, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# Ranks start at different times on a loaded machine (importing numpy and polycast can take
# seconds at load 20): a script whose timing matters calls all_started(n) first, so the
# times it sets count from when every rank is up, not from each rank's own start.
ALL_STARTED = """
import os as _os, time as _time
def all_started(n):
    d = _os.environ["READY_DIR"]
    open(_os.path.join(d, _os.environ["POLYCAST_RANK"]), "w").close()
    end = _time.monotonic() + 60
    while len(_os.listdir(d)) < n and _time.monotonic() < end:
        _time.sleep(0.005)
"""


def _ready_env(tmp_path) -> dict:
    d = tmp_path / "ready"
    d.mkdir()
    return {"READY_DIR": str(d)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:    # a zombie is dead: it only waits for its (gone) parent to reap it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_exit_status_and_traceback_of_the_rank_that_failed_in_a_collective(tmp_path):
    script = _script(tmp_path, """
        import sys, numpy as np, polycast
        comm = polycast.init(timeout=20)
        comm.Barrier()
        if comm.rank == 2:
            raise ValueError("boom on rank 2")
        a = np.ones(4)
        comm.Allreduce(a, np.empty_like(a))
    """)
    res = _run(["-n", "4", script])
    assert res.returncode == 1, res.stderr
    assert "rank 2 failed first: it exited with status 1 (ValueError: boom on rank 2)" \
        in res.stderr, res.stderr
    assert res.stderr.count("Traceback") == 1, res.stderr
    tb = [ln for ln in res.stderr.splitlines() if ln.startswith("[rank 2]")]
    assert tb[0] == "[rank 2] Traceback (most recent call last):" and "boom" in tb[-1]


def test_the_cause_is_named_even_when_its_consequences_exit_first(tmp_path):
    # Ranks 0 and 1 fail at once *because of* rank 2 (PeerLost naming it); rank 2 itself
    # takes longer to exit, with status 5. The launcher must wait for it and blame it.
    script = _script(tmp_path, ALL_STARTED + """
import os, sys, time
from polycast.errors import PeerLost
rank = int(os.environ["POLYCAST_RANK"])
all_started(3)
if rank == 2:
    time.sleep(0.7)
    sys.exit(5)
raise PeerLost(2, f"rank {rank}: allreduce needs rank 2, which is gone")
""")
    res = _run(["-n", "3", script], env=_ready_env(tmp_path))
    assert res.returncode == 5, res.stderr
    assert "rank 2 failed first: it exited with status 5; then ranks 0, 1 failed too" \
        in res.stderr, res.stderr
    assert "Traceback" not in res.stderr        # consequences print one line each
    assert res.stderr.count("a consequence of rank 2's failure") == 2


def test_ranks_die_with_a_killed_launcher(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    script = _script(tmp_path, f"""
        import os, time
        open(os.path.join({str(pids)!r}, os.environ["POLYCAST_RANK"]), "w").write(
            str(os.getpid()))
        time.sleep(120)
    """)
    env = dict(os.environ, PYTHONPATH=REPO)
    launcher = subprocess.Popen([sys.executable, "-m", "polycast.cli.main", "run", "-n", "3",
                                 script], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(pids)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = [int((pids / f).read_text()) for f in os.listdir(pids)]
        assert len(ranks) == 3 and all(_alive(p) for p in ranks)
    finally:
        launcher.kill()             # SIGKILL: the launcher gets no chance to clean up
        launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in ranks if _alive(p)]
    for p in left:                  # do not leave them behind if the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, "ranks outlived their SIGKILLed launcher"


def test_sigterm_to_the_launcher_ends_its_ranks(tmp_path):
    script = _script(tmp_path, """
        import time
        print("up", flush=True)
        time.sleep(120)
    """)
    env = dict(os.environ, PYTHONPATH=REPO)
    launcher = subprocess.Popen([sys.executable, "-m", "polycast.cli.main", "run", "-n", "2",
                                 script], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(2):
            assert "up" in launcher.stdout.readline()
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: ending all ranks" in err


def test_a_straggler_after_the_others_finished_is_ended_with_its_stack(tmp_path):
    script = _script(tmp_path, """
        import os, time
        import polycast         # installs the stack dump the launcher asks for
        def stuck_here():
            time.sleep(120)
        if os.environ["POLYCAST_RANK"] == "1":
            stuck_here()
    """)
    t0 = time.monotonic()
    res = _run(["-n", "3", "--straggler-timeout", "1", script])
    assert res.returncode == 124, res.stderr
    assert time.monotonic() - t0 < 30
    assert ("ranks 0, 2 finished 1 s ago but rank 1 is still running" in res.stderr), res.stderr
    assert "stuck_here" in res.stderr           # the stack dump says where it was


def test_a_rank_still_running_after_the_settle_is_ended_with_its_stack(tmp_path):
    """A failure the others should have followed (test_dead_peer[kill-shm] in CI: one
    survivor still waiting 2 s after the rest failed) says where that rank was."""
    script = _script(tmp_path, ALL_STARTED + """
import os, sys, time
import polycast         # installs the stack dump the launcher asks for
def still_waiting_here():
    time.sleep(120)
all_started(2)          # rank 0 has installed its handler by now
if os.environ["POLYCAST_RANK"] == "1":
    sys.exit(3)
still_waiting_here()
""")
    t0 = time.monotonic()
    res = _run(["-n", "2", "--straggler-timeout", "0", script], env=_ready_env(tmp_path))
    assert res.returncode == 3, res.stderr
    assert time.monotonic() - t0 < 30
    assert "rank 0 still running 2 s after rank 1 failed: stacks follow" in res.stderr, \
        res.stderr
    dump = [ln for ln in res.stderr.splitlines() if ln.startswith("[rank 0]")]
    assert any("still_waiting_here" in ln for ln in dump), res.stderr
    assert "rank 1 failed first: it exited with status 3; ended rank 0" in res.stderr, \
        res.stderr


def test_timeout_names_what_it_ends(tmp_path):
    script = _script(tmp_path, """
        import os, time
        if os.environ["POLYCAST_RANK"] != "0":
            time.sleep(120)
    """)
    res = _run(["-n", "3", "--timeout", "2", "--straggler-timeout", "0", script])
    assert res.returncode == 124, res.stderr
    assert "--timeout 2 s reached: ending ranks 1, 2, still running (rank 0 had finished)" \
        in res.stderr, res.stderr


@pytest.mark.parametrize("args, needle", [
    (["-n", "2", "--timeout", "0", "x.py"], "--timeout must be > 0"),
    (["-n", "2", "--straggler-timeout", "-1", "x.py"], "--straggler-timeout must be >= 0"),
])
def test_bad_launcher_options(args, needle):
    res = _run(args)
    assert res.returncode == 2 and needle in res.stderr and res.stderr.count("\n") == 1
