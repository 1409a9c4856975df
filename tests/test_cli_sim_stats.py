"""``polycast sim ... --stats``: every simulating subcommand prints (or puts in its JSON) the
process's wall and CPU seconds and peak memory."""

import json
import re

import pytest

from polycast.cli.main import main

CASES = [
    ["sim", "allgather", "--algo", "ring", "-n", "4", "-t", "switch", "--size", "64KiB"],
    ["sim", "fsdp", "-n", "4", "-t", "switch", "--layers", "2", "--layer-bytes", "1MiB"],
]


@pytest.mark.parametrize("args", CASES, ids=["collective", "fsdp"])
def test_stats_line(args, capsys):
    assert main(args + ["--stats"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"^stats: ([0-9.]+) s wall, ([0-9.]+) s CPU, peak memory (\d+) MiB$", out,
                  re.M)
    assert m, out
    wall, cpu, mib = float(m[1]), float(m[2]), int(m[3])
    assert wall > 0 and cpu > 0 and mib > 10       # a Python process with numpy loaded


@pytest.mark.parametrize("args", CASES, ids=["collective", "fsdp"])
def test_stats_in_json_only_when_asked(args, capsys):
    assert main(args + ["--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "stats" not in (plain[0] if isinstance(plain, list) else plain)
    assert main(args + ["--json", "--stats"]) == 0
    got = json.loads(capsys.readouterr().out)
    obj = got[0] if isinstance(got, list) else got
    st = obj["stats"]
    assert st["peak_rss_bytes"] > 10 * 2**20
    assert 0 <= st["cpu_s_simulating"] <= st["cpu_s"]
    assert st["wall_s"] > 0
