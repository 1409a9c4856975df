"""`polycast run`: rank-prefixed output, failure propagation, bounded shutdown."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, timeout=60):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def test_output_is_prefixed_and_env_is_set(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        print("hello", os.environ["POLYCAST_RANK"], os.environ["POLYCAST_SIZE"], sys.argv[1:])
        print("warn", os.environ["POLYCAST_RANK"], file=sys.stderr)
    """))
    res = _run(["-n", "3", str(script), "a", "--flag"])
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.splitlines())
    assert lines == [f"[rank {r}] hello {r} 3 ['a', '--flag']" for r in range(3)]
    assert sorted(res.stderr.splitlines()) == [f"[rank {r}] warn {r}" for r in range(3)]


def test_a_failing_rank_ends_the_others_and_sets_the_status(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["POLYCAST_RANK"] == "1":
            sys.exit(3)
        print("waiting", flush=True)
        time.sleep(120)
    """))
    t0 = time.monotonic()
    res = _run(["-n", "3", str(script)])
    assert res.returncode == 3
    assert time.monotonic() - t0 < 30            # the sleepers were ended, not waited for
    assert "rank 1 failed first: it exited with status 3" in res.stderr


def test_module_form_and_a_real_collective():
    res = _run(["-n", "2", "-m", "polycast.tools.selftest", "--suite", "mismatch"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SELFTEST mismatch OK") == 2
    assert "[rank 0] " in res.stdout and "[rank 1] " in res.stdout


def test_bad_rank_count_is_a_clear_error():
    res = _run(["-n", "0", "x.py"])
    assert res.returncode == 2 and "positive" in res.stderr
