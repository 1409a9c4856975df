"""Point-to-point through Comm on real processes, over shared memory and TCP (the rank
program is tests/comm_p2p.py)."""

from __future__ import annotations

import pytest

from test_runtime_helpers import spawn_ranks


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_point_to_point_on_real_ranks(transport):
    results = spawn_ranks(3, ["tests/comm_p2p.py"],
                          env={"POLYCAST_TIMEOUT": "20", "POLYCAST_TRANSPORT": transport},
                          timeout=120)
    for res in results:
        assert res.returncode == 0 and f"P2P OK {res.rank}" in res.out, (
            f"rank {res.rank}\n{res.out[-3000:]}\n{res.err[-3000:]}")
