"""A rank of tests/test_lab_faults.py: multicast and ring collectives in a loop while the
test breaks the network under them (an uplink down and up, a host's multicast cut).

    polycast lab run -- python tests/lab_fault_rank.py SECONDS NBYTES

Rank 0 prints ``LOOP STARTED`` once every rank is in the loop; the loop ends (every rank
together) at the first iteration boundary after SECONDS. Each rank prints one ``RESULT
<json>`` line: iterations, how many were exact, and the error that ended it (a polycast
exception's type and message), if any; it exits 0 when every result was exact, 3 when a
collective raised.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import polycast
from polycast.errors import PolycastError

CALLS = ("allgather:mcast", "broadcast:mcast", "allgather:ring")


def main(seconds: float, nbytes: int) -> int:
    comm = polycast.init()
    P, r = comm.size, comm.rank
    count = nbytes // 4 // P * P
    full = (np.arange(count, dtype=np.float32) % 65521) + 1
    recv = np.zeros(count, np.float32)
    done = {"rank": r, "iterations": 0, "exact": 0, "error": None, "recovered_bytes": 0,
            "job_id": comm._driver.world.job_id}
    comm.Barrier()
    if r == 0:
        print("LOOP STARTED", flush=True)
    t0 = time.monotonic()
    try:
        go = True
        while go:
            for spec in CALLS:
                coll, algo = spec.split(":")
                recv[:] = 0
                if coll == "allgather":
                    comm.Allgather(full.reshape(P, -1)[r].copy(), recv, algorithm=algo)
                else:
                    if r == 0:
                        recv[:] = full
                    comm.Bcast(recv, 0, algorithm=algo)
                done["iterations"] += 1
                done["exact"] += bool(np.array_equal(recv, full))
            go = comm.bcast(time.monotonic() - t0 < seconds, 0)
        done["recovered_bytes"] = comm.stats().recovered_bytes
    except PolycastError as exc:
        done["error"] = f"{type(exc).__name__}: {exc}"
        print("RESULT " + json.dumps(done), flush=True)
        return 3
    print("RESULT " + json.dumps(done), flush=True)
    polycast.finalize()
    return 0 if done["exact"] == done["iterations"] else 1


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), int(sys.argv[2])))
