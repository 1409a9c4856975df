"""Bad input to any `polycast` command: one line on stderr, exit status 2, before any work
(no ranks started, no schedule built, no simulation run)."""

from __future__ import annotations

import importlib
import time

import pytest

from polycast.algorithms import build
from polycast.algorithms.estimate import TooLarge, estimate
from polycast.cli.main import main


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command gets as far as starting ranks or simulating."""
    def refuse(*a, **k):
        raise AssertionError("work started before the arguments were checked")
    for module, name in (("polycast.tools.launch", "launch"),
                         ("polycast.sim.simulate", "simulate"),
                         ("polycast.sim.sweep", "run_grid"), ("polycast.cli.algos", "rows_for")):
        monkeypatch.setattr(importlib.import_module(module), name, refuse)


BAD = [
    (["bench", "-n", "4", "broadcast", "--root", "-1"], "--root -1 is out of range"),
    (["bench", "-n", "4", "broadcast", "--root", "7"], "root is one of 0..3"),
    (["bench", "-n", "4", "allgather", "--algo", "ring,nope"], "'nope'"),
    (["bench", "-n", "4", "allgather", "--sizes", "8B"], "less than one 4-byte"),
    (["bench", "-n", "2", "allgather", "--iters", "0"], "--iters must be"),
    (["bench", "-n", "2", "allgather", "--transport", "udp"], "invalid choice"),
    (["bench", "-n", "2", "allgather", "--timeout", "0"], "--timeout must be > 0"),
    (["algos", "--nchunks", "0"], "--nchunks must be an integer >= 1"),
    (["algos", "--ranks", "100000"], "POLYCAST_MAX_SCHEDULE_GIB"),
    (["algos", "--ranks", "8", "--ranks-per-host", "3"], "does not divide"),
    (["sim", "sweep", "--algos", "ring,nope", "--nodes", "4"], "'nope'"),
    (["sim", "sweep", "--nodes", "4,0"], "--nodes must be"),
    (["sim", "sweep", "--out", "/nonexistent/x.csv"], "does not exist"),
    (["sim", "reduce_scatter", "--nodes", "3", "--size", "10B"], "less than one 4-byte"),
    (["sim", "allgather", "--nodes", "4", "--root", "4"], "--root 4 is out of range"),
    (["sim", "allgather", "--nodes", "4", "--compare", "ring,nope"], "'nope'"),
    (["sim", "allgather", "--nodes", "4", "--algo", "mcast", "--opt", "roots=0"],
     "roots must be"),
    (["sim", "allgather", "--nodes", "4", "--plot", "x.jpg"], "must end in one of"),
    (["sim", "allreduce", "--algo", "ring", "--nodes", "100000", "--topology",
      "fattree:radix=80"], "at most about"),
    (["sim", "allgather", "--nodes", "x"], "invalid int value"),
    (["sim", "fsdp", "--nodes", "8", "--roots", "0"], "--roots must be"),
    (["tree", "--ranks", "0"], "--ranks"),
    (["run", "-n", "2", "--timeout", "-1", "x.py"], "--timeout must be > 0"),
    (["run", "-n", "2", "no/such/script.py"], "not found"),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_status_2_before_any_work(argv, needle, capsys, no_work):
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    out, err = capsys.readouterr()
    assert exc.value.code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("polycast "), err
    assert needle in err, err
    assert time.monotonic() - t0 < 20          # no work: the 100,000-rank ones included


def test_a_size_that_does_not_divide_is_rounded_down_and_said(capsys):
    assert main(["sim", "reduce_scatter", "--nodes", "3", "--size", "13B",
                 "--topology", "switch", "--json"]) == 0
    out, err = capsys.readouterr()
    assert '"nbytes": 12' in out
    assert "using 12 B, the next smaller multiple of 12 B" in err


def test_sweep_with_points_that_cannot_run_exits_1(capsys):
    # a radix-4 fat tree holds 16 hosts: the 64-node point fails, the 4-node one runs.
    assert main(["sim", "sweep", "--algos", "ring", "--nodes", "4,64", "--sizes",
                 "64KiB", "--topologies", "fattree:radix=4", "--workers", "1"]) == 1
    assert "1 of 2 points could not run" in capsys.readouterr().err


def test_schedule_estimate_is_close_and_build_refuses_what_would_not_fit(monkeypatch):
    est = estimate("allgather", "ring", 128)
    real = build("allgather", "ring", 128, 128).nsteps
    assert real <= est.steps <= 1.5 * real
    t0 = time.monotonic()
    with pytest.raises(TooLarge, match="at most about"):
        build("allgather", "ring", 100_000, 100_000)
    assert time.monotonic() - t0 < 10
    monkeypatch.setenv("POLYCAST_MAX_SCHEDULE_GIB", "0.01")
    with pytest.raises(TooLarge, match="0.0 GiB"):
        build("alltoall", "pairwise", 300, 300)
    build("broadcast", "binomial", 300, 300)      # small schedules still build
