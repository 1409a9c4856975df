"""Every collective of the torch backend equals gloo's: 6 dtypes, sizes 0/1/7/1003 (and
70001 for float32), sync and async, on an ``auto`` group (symmetric memory on this host)
and an explicit-engine-schedules group; bad input raises a clear polycast error on every
rank and leaves the group working. One launch per world size runs the whole matrix
(tests/torch_matrix_worker.py compares inside the ranks, against a gloo group)."""

from __future__ import annotations

import pytest

from torch_helpers import ROOT, needs_torch, polycast_run, results

pytestmark = needs_torch


@pytest.mark.parametrize("nranks", [pytest.param(2, marks=pytest.mark.slow), 3,
                                    pytest.param(4, marks=pytest.mark.slow)])
def test_every_collective_equals_gloo(nranks, tmp_path):
    proc = polycast_run(nranks, ROOT / "tests" / "torch_matrix_worker.py",
                        MATRIX_BAD_INPUT=1 if nranks == 3 else 0, RESULT_DIR=tmp_path)
    got = results(tmp_path)
    assert len(got) == nranks, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in got:
        assert r["nfailures"] == 0, "\n".join(r["failures"])
        assert r["checks"] > 1500, r         # the matrix ran in full
    assert proc.returncode == 0, proc.stderr[-3000:]


try:
    from polycast.comm import Comm
    HAVE_VECTOR = hasattr(Comm, "Ialltoallv") and hasattr(Comm, "Iallgatherv")
except ImportError:
    HAVE_VECTOR = False


@pytest.mark.skipif(not HAVE_VECTOR, reason="polycast's Comm has no vector collectives "
                    "(Ialltoallv/Iallgatherv) in this tree")
def test_split_and_per_rank_sizes(tmp_path):
    """all_to_all_single with split sizes (vs gloo), all_to_all and all_gather with one
    size per rank (gloo refuses those: vs the senders' values), 3 ranks, sync and async;
    split sizes the ranks disagree on raise on every rank."""
    proc = polycast_run(3, ROOT / "tests" / "torch_matrix_worker.py", MATRIX_UNEVEN=1,
                        RESULT_DIR=tmp_path)
    got = results(tmp_path)
    assert len(got) == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in got:
        assert r["nfailures"] == 0, "\n".join(r["failures"])
        assert r["checks"] >= 3 * 4 * 2 * 2 + 2, r
    assert proc.returncode == 0, proc.stderr[-3000:]
