"""send/recv/isend/irecv, recv from any source, batch_isend_irecv and pipeline-parallel
exchanges (a hand-written GPipe and torch.distributed.pipelining's) on the polycast backend
equal gloo's (tests/torch_p2p_worker.py compares inside the ranks); bad input raises a
polycast error on the calling rank and leaves the group working."""

from __future__ import annotations

import pytest

from torch_helpers import ROOT, needs_torch, polycast_run, results

pytestmark = needs_torch

try:
    from polycast.comm import Comm
    HAVE_P2P = hasattr(Comm, "Isend")
except ImportError:
    HAVE_P2P = False


@pytest.mark.skipif(not HAVE_P2P, reason="polycast's Comm has no point-to-point "
                    "(Isend/Irecv) in this tree")
@pytest.mark.parametrize("nranks", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_point_to_point_equals_gloo(nranks, tmp_path):
    proc = polycast_run(nranks, ROOT / "tests" / "torch_p2p_worker.py", RESULT_DIR=tmp_path)
    got = results(tmp_path)
    assert len(got) == nranks, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in got:
        assert r["nfailures"] == 0, "\n".join(r["failures"])
        assert r["checks"] > 40, r
    assert proc.returncode == 0, proc.stderr[-3000:]
