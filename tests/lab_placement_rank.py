"""A rank of tests/test_lab_placement.py: what the lab runner told this rank about its
place, what the runtime made of it, and a few collectives whose algorithms group ranks by
host. Prints one ``PLACEMENT <json>`` line (rank 0 prints every rank's).

    polycast lab run --ranks-per-host 2 -- python tests/lab_placement_rank.py [--offload]
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import polycast
from polycast.runtime.bootstrap.env import host_id

TORCH_VARS = ("MASTER_ADDR", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "GROUP_WORLD_SIZE", "RANK", "WORLD_SIZE")


def main(argv: list[str]) -> int:
    offload = "--offload" in argv
    comm = polycast.init(progress="offload" if offload else None)
    P, r = comm.size, comm.rank
    count = 4096 * P
    full = np.arange(count, dtype=np.float32) + 1
    results = {}
    for algo in ("ring", "mcast", "hring", "hmcast"):
        if offload and algo not in ("ring", "mcast"):
            continue
        recv = np.zeros(count, np.float32)
        comm.Allgather(full.reshape(P, -1)[r].copy(), recv, algorithm=algo)
        results[algo] = bool(np.array_equal(recv, full))
    me = {"rank": r, "env": {k: os.environ.get(k) for k in TORCH_VARS},
          "polycast_local": [os.environ.get("POLYCAST_LOCAL_RANK"),
                             os.environ.get("POLYCAST_LOCAL_SIZE")],
          "host_id": host_id(), "addr_master": os.environ.get("POLYCAST_MASTER_ADDR"),
          "transports": {str(k): v for k, v in comm.transports().items()},
          "exact": results, "mcast_error": comm.mcast_error}
    everyone = comm.allgather(me)
    if r == 0:
        print("PLACEMENT " + json.dumps(everyone), flush=True)
    polycast.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
