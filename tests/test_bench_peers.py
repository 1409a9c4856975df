"""bench/peers.py: the plan, the bandwidth arithmetic, the table on synthetic rows, the
bounded launcher, and a short real MPICH run when mpi4py and mpiexec are installed."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import peers_common as pc  # noqa: E402

from polycast.errors import InvalidArgument  # noqa: E402


def test_plan_rounds_sizes_up_to_whole_elements_per_rank():
    cases = peers.plan_cases(["allgather", "allreduce", "bcast"], [8, 65536], 4)
    got = {(c.collective, c.nbytes): c.count for c in cases}
    assert all(c.iters == 200 for c in cases)
    # allgather: S = count x 4 ranks x 4 bytes, so 8 B rounds up to 16 B (count 1)
    assert got == {("allgather", 16): 1, ("allgather", 65536): 4096,
                   ("allreduce", 8): 2, ("allreduce", 65536): 16384,
                   ("broadcast", 8): 2, ("broadcast", 65536): 16384}


def test_every_peer_gets_the_same_iterations_by_size():
    assert [peers.iters_for(n) for n in (8, 64 << 10, 1 << 20, 16 << 20, 1 << 30)] == \
        [200, 200, 128, 8, 8]
    assert peers.iters_for(16 << 20, 50) == 50
    # polycast bench runs a quarter of --iters above 8 MiB: ask 4x there
    assert peers.bench_iters_arg(16 << 20, 8) == 32 and peers.bench_iters_arg(8, 200) == 200


def test_plan_rejects_a_collective_it_does_not_compare():
    with pytest.raises(InvalidArgument, match="allgather, allreduce, broadcast"):
        peers.plan_cases(["alltoall"], [1024], 4)


def test_bandwidth_follows_nccl_tests():
    row = peers.with_bandwidth({"collective": "allreduce", "nbytes": 16 << 20,
                                "time_us": 10_000.0}, 4)
    assert row["algbw"] == pytest.approx((16 << 20) / 1e-2 / 1e9)
    assert row["busbw"] == pytest.approx(row["algbw"] * 2 * 3 / 4)
    row = peers.with_bandwidth({"collective": "broadcast", "nbytes": 1000, "time_us": 1.0}, 4)
    assert row["busbw"] == pytest.approx(1.0)       # factor 1, 1000 B in 1 us = 1 GB/s


def test_expected_results_match_a_hand_computation():
    # rank r, element i: (3i + 11r + 1) mod 101
    assert pc.expected("allgather", 2, 2).tolist() == [1, 4, 12, 15]
    assert pc.expected("allreduce", 2, 2).tolist() == [13, 19]
    assert pc.expected("broadcast", 3, 2).tolist() == [1, 4]
    # reduce_scatter: each rank's input is 2 blocks; rank 1 keeps the sum's second block
    assert pc.expected("reduce_scatter", 2, 2, rank=0).tolist() == [13, 19]
    assert pc.expected("reduce_scatter", 2, 2, rank=1).tolist() == [25, 31]


def _run(name, rows, unavailable=""):
    run = peers.PeerRun(name, unavailable=unavailable)
    for r in rows:
        r = peers.with_bandwidth({"correct": True, **r}, 4)
        run.rows[(r["collective"], r["nbytes"])] = r
    return run


def test_comparison_gives_ratios_and_reasons():
    cases = peers.plan_cases(["allgather", "allreduce"], [8, 1 << 20], 4)
    runs = {
        "polycast": _run("polycast", [
            {"collective": "allgather", "nbytes": 1 << 20, "time_us": 100.0,
             "algorithm": "mcast"},
            {"collective": "allreduce", "nbytes": 1 << 20, "time_us": 400.0,
             "algorithm": "ring", "correct": False}]),
        "mpich": _run("mpich", [
            {"collective": "allgather", "nbytes": 1 << 20, "time_us": 200.0},
            {"collective": "allreduce", "nbytes": 1 << 20, "time_us": 200.0},
            {"collective": "allreduce", "nbytes": 8, "time_us": 20.0}]),
        "gloo": _run("gloo", [], unavailable="torch not installed"),
    }
    runs["polycast"].rows[("allgather", 1 << 20)]["auto"] = {
        "algorithm": "auto(symm)", "busbw": runs["mpich"].rows[("allgather", 1 << 20)]["busbw"]
        * 3, "time_us": 66.7, "correct": True}
    columns, rows, records = peers.comparison(cases, runs)
    by = {(r[0], r[1]): dict(zip(columns, r)) for r in rows}
    assert by[("allgather", "1MiB")]["auto/MPICH"] == 3.0
    runs["polycast"].rows[("allgather", 1 << 20)].pop("auto")
    columns, rows, records = peers.comparison(cases, runs)
    by = {(r[0], r[1]): dict(zip(columns, r)) for r in rows}
    ag = by[("allgather", "1MiB")]
    assert ag["engine/MPICH"] == 2.0 and ag["engine algo"] == "mcast"
    assert ag["gloo busbw GB/s"] == "n/a (torch not installed)"
    assert ag["engine/gloo"] == "n/a"
    assert ag["auto/MPICH"] == "n/a"                # auto was not measured here
    ar = by[("allreduce", "1MiB")]
    assert ar["engine busbw GB/s"].endswith("WRONG")
    assert ar["engine/MPICH"] == "n/a"              # no ratio against a wrong result
    assert by[("allgather", "16B")]["MPICH busbw GB/s"].startswith("n/a")
    rec = {(r["collective"], r["nbytes"]): r for r in records}
    assert rec[("allgather", 1 << 20)]["mpich"]["time_us"] == 200.0
    assert rec[("allgather", 1 << 20)]["gloo"] == {"na": "torch not installed"}
    title, _, lat_rows, lat_rec = peers.latency(cases, runs)
    assert title == "8B allreduce latency"
    assert lat_rec["mpich"]["time_us"] == 20.0
    assert lat_rows[1][2] == "20.0"


def test_polycast_rows_pick_the_best_correct_algorithm():
    text = "progress...\n" + json.dumps([
        {"collective": "allgather", "algorithm": "ring", "nranks": 4, "nbytes": 4096,
         "time_us": 10.0, "algbw": 0.4, "busbw": 0.3, "correct": True},
        {"collective": "allgather", "algorithm": "mcast", "nranks": 4, "nbytes": 4096,
         "time_us": 5.0, "algbw": 0.8, "busbw": 0.6, "correct": True},
        {"collective": "allgather", "algorithm": "fast_but_wrong", "nranks": 4,
         "nbytes": 4096, "time_us": 1.0, "algbw": 4, "busbw": 3, "correct": False}])
    best = peers.best_rows(peers.parse_json_rows(text), 4)
    assert best[("allgather", 4096)]["algorithm"] == "mcast"
    # auto (the symm path on one host) is its own column: the engine column is the best
    # explicit algorithm even when auto was faster.
    with_auto = peers.parse_json_rows(text) + [
        {"collective": "allgather", "algorithm": "auto(symm)", "requested": "auto",
         "nranks": 4, "nbytes": 4096, "time_us": 2.0, "correct": True}]
    assert peers.best_rows(with_auto, 4)[("allgather", 4096)]["algorithm"] == "mcast"
    assert best[("allgather", 4096)]["busbw"] == pytest.approx(4096 / 5e3 * 3 / 4)


def test_a_launch_past_its_timeout_is_killed_with_its_children():
    t0 = time.monotonic()
    done = peers.run_bounded(
        [sys.executable, "-c",
         "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
         "'import time; time.sleep(60)']); print('started', flush=True); time.sleep(60)"],
        timeout_seconds=1.5)
    assert done.timed_out and done.returncode is None
    assert time.monotonic() - t0 < 15
    assert "started" in done.stdout
    assert "timed out after 1.5s" in done.why("sleeper", 1.5)


def test_bad_arguments_exit_2_with_the_valid_choices(capsys):
    assert peers.main(["--peers", "nccl"]) == 2
    assert "valid choices: polycast, mpich, gloo" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or peers.find_mpiexec() is None,
                    reason="mpi4py/mpich not installed (pip install mpich mpi4py)")
def test_a_short_real_run_measures_mpich_and_says_why_others_are_missing(tmp_path, capsys):
    out = tmp_path / "peers.json"
    rc = peers.main(["-n", "2", "--collectives", "allreduce,allgather", "--sizes", "8B,4KiB",
                     "--iters", "5", "--warmup", "1", "--peers", "mpich",
                     "--timeout", "60", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "8B allreduce latency" in text
    data = json.loads(out.read_text())
    mpich = data["peers"]["mpich"]
    assert mpich["status"] == "ok", mpich
    assert len(mpich["rows"]) == 4 and all(r["correct"] for r in mpich["rows"])
    assert all(r["iters"] == 5 and r["time_us"] > 0 for r in mpich["rows"])
    assert data["peers"]["gloo"]["status"] == "n/a: not selected"
    assert np.isfinite(data["latency"]["mpich"]["time_us"])


FAKE_BENCH = r'''
import json, sys
args = sys.argv[2:]                     # argv[1] is "bench"
if "--help" in args:
    print("usage: polycast bench [--iters N] [--warmup N] [--timeout S] [--json]" + SIZES)
    sys.exit(0)
coll = args[2]
sizes = ([int(x) for x in args[args.index("--sizes") + 1].split(",")] if "--sizes" in args
         else [int(args[args.index("--min") + 1])])
speed = {"auto": 2.0, "ring": 2.0, "mcast": 1.0}      # time_us per byte
with open(sys.argv[0] + ".launches", "a") as f:
    f.write(json.dumps(sizes) + "\n")
rows = []
for size in sizes:
    for algo in args[args.index("--algo") + 1].split(","):
        if algo == "boom":
            print(json.dumps(rows))
            print(f"polycast bench: boom at {size}B: it exploded", file=sys.stderr)
            sys.exit(1)
        if algo == "silent":                 # a rank died without a message
            print(json.dumps(rows))
            sys.exit(1)
        rows.append({"collective": coll, "algorithm": "ring" if algo == "auto" else algo,
                     "requested": algo, "nranks": 4, "nbytes": size,
                     "time_us": speed[algo] * size, "algbw": 0, "busbw": 0,
                     "correct": True, "iters": int(args[args.index("--iters") + 1])})
print(json.dumps(rows))
'''


@pytest.mark.parametrize("takes_sizes", [False, True])
def test_polycast_cases_go_on_past_an_algorithm_that_fails(tmp_path, monkeypatch,
                                                           takes_sizes):
    fake = tmp_path / "fake_polycast.py"
    fake.write_text(f"SIZES = {' --sizes LIST' if takes_sizes else ''!r}\n" + FAKE_BENCH)
    monkeypatch.setattr(peers, "polycast_command", lambda: [sys.executable, str(fake)])
    cases = peers.plan_cases(["allgather"], [1024, 4096], 4)
    run = peers.run_polycast(cases, 4, warmup=1, timeout_seconds=30,
                             algo="auto,ring,boom,silent,mcast")
    for nbytes in (1024, 4096):
        row = run.rows[("allgather", nbytes)]
        assert row["algorithm"] == "mcast"
        assert row["busbw"] == pytest.approx(nbytes / (nbytes * 1e3) * 3 / 4)
        assert row["auto"]["algorithm"] == "ring"
        assert sorted(r["requested"] for r in row["all"]) == ["auto", "mcast", "ring"]
    assert sum("boom failed: it exploded" in n for n in run.notes) == 2
    assert sum("silent failed" in n for n in run.notes) == 2
    assert not run.unavailable
    assert all(r["iters"] == 200 for r in run.rows[("allgather", 1024)]["all"])
    assert not any("iterations" in n for n in run.notes)
    # with --sizes the first launch covers both sizes; each failure costs one relaunch
    launches = [json.loads(ln) for ln in
                (tmp_path / "fake_polycast.py.launches").read_text().splitlines()]
    assert len(launches) == 6
    assert launches[0] == ([1024, 4096] if takes_sizes else [1024])


def test_polycast_without_a_bench_command_says_so(monkeypatch):
    monkeypatch.setattr(peers, "polycast_command",
                        lambda: [sys.executable, "-c", "import sys; sys.exit(2)"])
    run = peers.run_polycast(peers.plan_cases(["allreduce"], [8], 4), 4, 1, 30, None)
    assert run.unavailable == "polycast bench not available" and not run.rows


def _one_rank(prepare, case):
    same = lambda x: x  # noqa: E731 -- one rank: max and min over ranks are the value
    return pc.measure(case, 0, 1, prepare, lambda: None, same, same, warmup=2)


def test_measure_times_the_calls_and_catches_a_wrong_result():
    case = pc.Case("allgather", count=8, nbytes=32, iters=7)
    calls = []
    out = np.full(8, -1, pc.DTYPE)

    def prepare(c, good=True):
        def call():
            calls.append(1)
            out[:] = pc.send_data(c.collective, 0, c.count) + (0 if good else 1)
        return call, (lambda: out), (lambda: out.fill(-1))
    row = _one_rank(prepare, case)
    assert row.correct and row.iters == 7 and row.time_us > 0
    assert len(calls) == 1 + 2 + 7           # check call, warmup, timed
    bad = _one_rank(lambda c: prepare(c, good=False), case)
    assert not bad.correct and "WRONG" in bad.detail


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch not installed (pip install torch==2.13.0, a CPU build)")
def test_a_short_real_gloo_run(tmp_path):
    cases = peers.plan_cases(["allgather", "allreduce", "broadcast"], [64], 2, iters=3)
    run = peers.run_gloo(cases, 2, warmup=1, timeout_seconds=120, workdir=tmp_path)
    assert not run.unavailable, run.notes
    assert len(run.rows) == 3 and all(r["correct"] for r in run.rows.values())
    assert run.library.startswith("torch")
