"""`polycast algos` and `polycast demo`."""

import json

from polycast.cli.main import main


def test_algos_json_shows_multicast_sending_one_shard(capsys):
    assert main(["algos", "--ranks", "8", "--size", "64MiB", "-c", "allgather", "--json"]) == 0
    rows = {r["algorithm"]: r for r in json.loads(capsys.readouterr().out)}
    S = (64 << 20) // 8
    assert rows["ring"]["max_sent_nbytes"] == 7 * S
    assert rows["mcast"]["max_sent_nbytes"] == S
    assert rows["mcast"]["max_recv_nbytes"] == 7 * S
    assert rows["mcast"]["multicast"] and not rows["ring"]["multicast"]


def test_algos_table_lists_every_collective(capsys):
    assert main(["algos", "--ranks", "6", "--size", "96KiB"]) == 0
    out = capsys.readouterr().out
    for c in ("broadcast", "allreduce", "allgather", "reduce_scatter", "alltoall", "barrier"):
        assert f"{c}  P=6" in out


def test_algos_bad_input_is_one_line_and_status_2(capsys):
    assert main(["algos", "--ranks", "8", "--size", "3", "-c", "allgather"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the smallest size is 32 B" in err and "\n" not in err
    assert main(["algos", "-c", "nope"]) == 2
    assert "valid choices" in capsys.readouterr().err


def test_demo_runs_every_section(capsys):
    assert main(["demo", "--ranks", "8", "--local-ranks", "2", "--sim-nodes", "16"]) == 0
    out = capsys.readouterr().out
    assert "tree 0: root 0" in out and "tree 1: root 7" in out
    assert "1.750x" in out                              # 2(P-1)/P from the schedules
    assert "3. For real" in out and "WRONG" not in out and "failed" not in out
    assert out.count(" ok ") >= 4 or out.count("│ ok") >= 4   # every real row checked
    ratio = float(out.split("multicast moves ")[1].split("x")[0])
    assert abs(ratio - 2 * 15 / 16) < 0.02             # simulated fabric traffic, 16 nodes
    assert "5. Simulated FSDP" in out
