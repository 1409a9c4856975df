"""Rank script: N outstanding 1 KiB Iallreduce(algorithm="mcast"), then Waitall; exact."""

import sys

import numpy as np

import polycast
from polycast import Request

comm = polycast.init()
n = int(sys.argv[1])
send = np.full(256, comm.rank + 1, np.float32)
recvs = [np.zeros(256, np.float32) for _ in range(n)]
Request.Waitall([comm.Iallreduce(send, r, algorithm="mcast") for r in recvs])
want = comm.size * (comm.size + 1) / 2
bad = [i for i, r in enumerate(recvs) if not (r == want).all()]
assert not bad, f"wrong results in calls {bad[:10]}"
print(f"outstanding ok {n}", flush=True)
