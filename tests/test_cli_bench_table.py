"""`polycast bench`'s output helpers in one process: the nccl-tests-like table (a row per
size, the correctness column) and the progress callback (rich's bar, started and stopped);
the runs themselves start ranks (tests/test_bench_*.py)."""
import re

import pytest

from polycast.cli.bench import _progress_factory, _table


def _row(nbytes, correct):
    return {"nbytes": nbytes, "count": nbytes // 4, "dtype": "float32", "algorithm": "ring",
            "time_us": 12.345, "algbw": 1.5, "busbw": 2.25, "correct": correct,
            "transport": "shm", "calls": "nonblocking"}


def test_the_table_has_a_row_per_size_and_says_which_were_wrong(capsys):
    _table([_row(1024, True), _row(1 << 20, False), _row(4, None)], "allreduce", 4)
    out = capsys.readouterr().out
    assert "polycast bench: allreduce, 4 ranks, transport shm, nonblocking calls" in out
    rows = [re.split(r"[\s│|]+", ln.strip("│| ")) for ln in out.splitlines() if "ring" in ln]
    assert rows == [["1KiB", "256", "float32", "ring", "12.3", "1.500", "2.250", "ok"],
                    ["1MiB", "262144", "float32", "ring", "12.3", "1.500", "2.250", "WRONG"],
                    ["4B", "1", "float32", "ring", "12.3", "1.500", "2.250", "-"]]


def test_progress_is_silent_when_off_and_a_bar_when_on():
    update, stop = _progress_factory(False)
    assert update(1, 2) is None and stop() is None
    pytest.importorskip("rich")
    update, stop = _progress_factory(True)
    try:
        update(1, 3)
        update(3, 3)
    finally:
        stop()
