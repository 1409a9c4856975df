"""`polycast doctor` (issue 14 item 7): checks shm, multicast on loopback and on a chosen
interface, socket buffer limits and the open-file limit, and says what to change."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from polycast import config
from polycast.cli.main import main as cli_main
from polycast.tools import doctor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _doctor(*args, preexec=None):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "polycast.cli.main", "doctor", *args],
                          capture_output=True, text=True, timeout=60, env=env,
                          preexec_fn=preexec)


def test_every_check_runs_and_every_problem_says_what_to_change():
    res = _doctor("--json", "--iface", "lo", "--probe")
    checks = json.loads(res.stdout)
    names = [c["name"] for c in checks]
    assert names == ["shared memory", "shm rings", "sim network model", "multicast on loopback",
                     "multicast on lo", "net.core.rmem_max", "net.core.wmem_max", "open files"]
    for c in checks:
        assert c["status"] in ("ok", "warn", "FAIL"), c
        assert bool(c["change"]) == (c["status"] != "ok"), c
    assert res.returncode == (1 if any(c["status"] == "FAIL" for c in checks) else 0)
    # the test suite's multicast tests run on loopback: here the probe must succeed
    assert checks[3]["status"] == "ok" and "came back" in checks[3]["found"], checks[3]


def test_a_low_open_file_limit_is_flagged_with_the_fix():
    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
    res = _doctor("--json", preexec=low)
    c = next(c for c in json.loads(res.stdout) if c["name"] == "open files")
    assert c["status"] == "warn" and "soft 256" in c["found"] and "ulimit -n" in c["change"]


def test_small_socket_buffers_and_missing_shm_are_named(monkeypatch):
    monkeypatch.setattr(doctor, "_sysctl", lambda key: 212992)
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    rmem, wmem = doctor.check_socket_buffers()
    assert rmem.status == "warn" and "sysctl -w net.core.rmem_max=67108864" in rmem.change
    assert wmem.status == "warn" and "net.core.wmem_max" in wmem.change
    shm = doctor.check_shm("/nonexistent-shm-dir")
    assert shm.status == "FAIL" and "tmpfs" in shm.change


def test_bad_input_is_one_line_and_status_2(capsys):
    assert cli_main(["doctor", "--iface", "no-such-if0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such interface" in err[0]
    assert cli_main(["doctor", "--probe"]) == 2
    assert "--probe needs --iface" in capsys.readouterr().err




def _rings():
    from polycast.runtime.transport import native
    return doctor.check_rings, native, "ring", "native", "unset POLYCAST_TEST_HOOKS"


def _sim_network():
    from polycast.sim import network
    return doctor.check_sim_network, network, "compiled", "sim_native", "unset POLYCAST_TEST_HOOKS"


@pytest.mark.parametrize("which", [_rings, _sim_network], ids=["shm rings", "sim network"])
def test_a_compiled_helper_check_says_what_runs_and_how_to_get_the_compiled_one(which,
                                                                               monkeypatch):
    check, module, attr, hook, fix = which()
    c = check()
    if getattr(module, attr) is not None:
        assert c.status == "ok" and "compiled" in c.found
        with config.override(hooks={hook: False}):
            c = check()
        assert c.status == "warn" and fix in c.change
    monkeypatch.setattr(module, attr, None)
    monkeypatch.setattr(module, "why_not", "the compiled helper is not built (...)")
    c = check()
    assert c.status == "warn" and "not built" in c.found and "C compiler" in c.change
    assert c.name in [x.name for x in doctor.run_checks()]
