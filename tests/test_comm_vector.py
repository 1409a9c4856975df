"""Vector and scan collectives through Comm on real processes, against a numpy reference
(the rank program is tests/comm_vector.py): 2, 3 and 4 ranks, shared memory and TCP."""

from __future__ import annotations

import pytest

from test_runtime_helpers import spawn_ranks


@pytest.mark.parametrize("nranks,transport", [(2, "shm"), (3, "tcp"), (4, "shm")])
def test_vector_and_scan_collectives(nranks, transport):
    results = spawn_ranks(nranks, ["tests/comm_vector.py"],
                          env={"POLYCAST_TIMEOUT": "20", "POLYCAST_TRANSPORT": transport},
                          timeout=150)
    for res in results:
        assert res.returncode == 0 and f"VECTOR OK {res.rank}" in res.out, (
            f"rank {res.rank}\n{res.out[-3000:]}\n{res.err[-3000:]}")
