"""polycast.config: every POLYCAST_* parameter read once, validated, documented, passed down."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from polycast import config
from polycast.collectives import Collective
from polycast.errors import InvalidArgument

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_parse_and_validate():
    cfg = config.load({})
    assert cfg == config.Config() and cfg.sources == ()
    cfg = config.load({"POLYCAST_TRANSPORT": "SHM", "POLYCAST_TIMEOUT": "2.5",
                       "POLYCAST_SYMM": "off", "POLYCAST_SHM_RING_NBYTES": "1MiB",
                       "POLYCAST_ALLGATHER_ALGO": "Ring", "POLYCAST_DEBUG": "info",
                       "POLYCAST_TEST_HOOKS": "native=0, replay_step_limit=3"})
    assert (cfg.transport, cfg.timeout_seconds, cfg.symm, cfg.shm_ring_nbytes) == (
        "shm", 2.5, False, 1 << 20)
    assert cfg.algorithm(Collective.ALLGATHER) == "ring"
    assert cfg.algorithm(Collective.ALLREDUCE) is None
    assert cfg.debug_level == 1
    assert (cfg.hooks.native, cfg.hooks.replay, cfg.hooks.replay_step_limit) == (False, True, 3)
    assert cfg.source("POLYCAST_TIMEOUT") == "environment"
    assert cfg.source("POLYCAST_MTU") == "default" and not cfg.is_set("mtu_nbytes")


@pytest.mark.parametrize("var,text,says", [
    ("POLYCAST_TIMEOUT", "-3", "give a positive number of seconds"),
    ("POLYCAST_TRANSPORT", "udp", "valid choices: auto, shm, tcp"),
    ("POLYCAST_SYMM", "maybe", "1/true/yes/on or 0/false/no/off"),
    ("POLYCAST_NCHUNKS", "0", "positive integer"),
    ("POLYCAST_MTU", "10", "in 64..65000"),
    ("POLYCAST_OFFLOAD_WORKERS", "65", "in 0..64"),
    ("POLYCAST_SHM_RING_NBYTES", "lots", "number of bytes"),
    ("POLYCAST_DEBUG", "LOUD", "WARN, INFO or TRACE"),
    ("POLYCAST_SECRET", "", "set but empty"),
    ("POLYCAST_TEST_HOOKS", "native", "name=value"),
    ("POLYCAST_TEST_HOOKS", "replay=maybe", "replay='maybe' is not a bool"),
    ("POLYCAST_NATIVE", "0", "POLYCAST_TEST_HOOKS=native=0"),        # retired switches
    ("POLYCAST_REPLAY_SPIN_US", "5", "now: POLYCAST_WAIT_SPIN_US"),
])
def test_a_bad_value_is_one_line_naming_the_variable_and_what_it_accepts(var, text, says):
    with pytest.raises(InvalidArgument) as info:
        config.load({var: text})
    msg = str(info.value)
    assert msg.startswith(f"{var}={text!r}: ") and says in msg and "\n" not in msg


def test_one_boolean_parser():
    for t in ("1", "true", "YES", "on"):
        assert config.parse_bool(t) is True
    for t in ("0", "False", "no", "OFF"):
        assert config.parse_bool(t) is False
    with pytest.raises(ValueError):
        config.parse_bool("2")


def test_an_unknown_name_is_warned_about_with_the_nearest_known_one():
    config.reset_logged()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = config.load({"POLYCAST_TRANSPROT": "tcp", "POLYCAST_RANK": "0"})
        config.load({"POLYCAST_TRANSPROT": "tcp"})                # once per process
    assert cfg.transport == "auto"
    msgs = [str(x.message) for x in w]
    assert msgs == ["polycast: POLYCAST_TRANSPROT is not a polycast variable; did you mean "
                    "POLYCAST_TRANSPORT?"]


def test_debug_info_logs_each_set_variable_once(capsys):
    config.reset_logged()
    env = {"POLYCAST_DEBUG": "INFO", "POLYCAST_TIMEOUT": "9", "POLYCAST_SECRET": "s3cret"}
    config.load(env, rank=2)
    config.load(env, rank=2)
    err = capsys.readouterr().err.splitlines()
    assert sorted(err) == ["[rank 2] polycast INFO POLYCAST_DEBUG=INFO",
                           "[rank 2] polycast INFO POLYCAST_SECRET=(set)",
                           "[rank 2] polycast INFO POLYCAST_TIMEOUT=9"]
    config.load({"POLYCAST_TIMEOUT": "9"})                   # not at INFO: nothing
    assert capsys.readouterr().err == ""


def test_replace_override_and_to_env():
    base = config.Config()
    cfg = base.replace(symm=False, hooks={"native": False}, algorithms={"allreduce": "Ring"})
    assert not cfg.symm and not cfg.hooks.native and cfg.algorithm(Collective.ALLREDUCE) == "ring"
    assert cfg.source("POLYCAST_SYMM") == "argument"
    with pytest.raises(InvalidArgument, match=r"progress='nic' \(or POLYCAST_PROGRESS\)"):
        base.replace(progress="nic")
    assert config.load(cfg.to_env()) == cfg           # what another process is handed
    with config.override(timeout_seconds=3.0) as o:
        assert config.current() is o and o.timeout_seconds == 3.0
        assert o.source("POLYCAST_TIMEOUT") == "override"
    assert config.current().timeout_seconds == config.load().timeout_seconds


def test_configuration_doc_is_generated_from_the_dataclass():
    """docs/configuration.md is `polycast config --markdown`: regenerate it when a
    parameter changes."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == config.markdown(), \
        "docs/configuration.md is stale: polycast config --markdown > docs/configuration.md"
    for var in config.known_variables():
        if var not in config.ALGO_VARS:
            assert f"`{var}`" in doc


def test_polycast_config_prints_values_and_sources():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "POLYCAST_TIMEOUT": "7",
           "POLYCAST_TEST_HOOKS": "cma=0"}
    out = subprocess.run([sys.executable, "-m", "polycast.cli.main", "config", "--json",
                          "--set"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json
    rows = {r["variable"]: (r["value"], r["source"]) for r in json.loads(out.stdout)}
    assert rows == {"POLYCAST_TIMEOUT": ("7", "environment"),
                    "POLYCAST_TEST_HOOKS": ("cma=0", "environment")}
    bad = subprocess.run([sys.executable, "-m", "polycast.cli.main", "config"],
                         env={**env, "POLYCAST_TIMEOUT": "x"}, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("polycast config: error: POLYCAST_TIMEOUT='x': give a "
                                  "positive number of seconds")


def test_a_variable_set_after_the_communicator_exists_changes_nothing_for_it(monkeypatch):
    """A real (one-rank) communicator: its settings were read when it was made; setting
    variables afterwards (an algorithm that does not exist, symmetric memory off, a debug
    level) leaves its calls as they were. A communicator made afterwards takes them."""
    from polycast.comm.lifecycle import close_comm, open_comm
    from polycast.runtime.bootstrap.env import JobEnv
    from polycast.tools.launch import free_port
    for var in ("POLYCAST_ALLREDUCE_ALGO", "POLYCAST_SYMM", "POLYCAST_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    job = JobEnv(0, 1, 0, 1, "127.0.0.1", free_port(), "polycast", "", 20.0)
    comm = open_comm(job)
    try:
        before = comm.config
        x = np.arange(4, dtype=np.float32)
        comm.Allreduce(x.copy(), x)
        monkeypatch.setenv("POLYCAST_ALLREDUCE_ALGO", "no-such-algorithm")
        monkeypatch.setenv("POLYCAST_SYMM", "0")
        monkeypatch.setenv("POLYCAST_DEBUG", "TRACE")
        for _ in range(3):
            y = np.arange(4, dtype=np.float32)
            comm.Allreduce(np.ones(4, np.float32), y)
            assert np.array_equal(y, np.ones(4, np.float32))
        assert comm.config is before and comm.config.algorithm(Collective.ALLREDUCE) is None
        assert comm.Dup().config is before                  # children inherit it
    finally:
        close_comm(comm)
    later = config.current()
    assert later.algorithm(Collective.ALLREDUCE) == "no-such-algorithm" and not later.symm


# Modules that may look at the environment, and why: everything else takes its settings from
# a Config it is handed (or config.current() where a job, communicator or command is made).
_READS_ENVIRONMENT = {
    "polycast/config/environment.py": "reads the POLYCAST_* parameters",
    "polycast/runtime/bootstrap/env.py": "the launcher's variables: where a rank sits",
    "polycast/runtime/bootstrap/report.py": "the launcher's report directory, in excepthook",
    "polycast/lab/marks.py": "the lab runner's marks directory, handed to its ranks",
    "polycast/lab/runner.py": "builds its ranks' environment (gloo's interface)",
    "polycast/planner/profile.py": "XDG_CACHE_HOME, where the default profile lives",
    "polycast/torch/rendezvous.py": "torch's MASTER_ADDR, when its store names no host",
    "polycast/tools/launch.py": "the launcher: builds its ranks' environment",
    "polycast/tools/calibrate.py": "sets its measuring ranks' environment",
    "polycast/cli/tune.py": "--profile for the ranks and the profile it writes",
}


def test_only_the_configuration_reads_the_environment():
    import re
    uses = re.compile(r"os\.environ(?!\w)|os\.getenv|getenv\(")
    found = set()
    for path in (ROOT / "polycast").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        code = [ln.split("#")[0] for ln in path.read_text().splitlines()]
        if any(uses.search(ln) and '"""' not in ln and "``" not in ln for ln in code):
            found.add(rel)
    assert found <= set(_READS_ENVIRONMENT), sorted(found - set(_READS_ENVIRONMENT))
