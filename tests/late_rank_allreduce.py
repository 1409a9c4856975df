"""Helper for test_engine_rendezvous: a rank posts late into a pipelined recursive-doubling
allreduce whose messages go by rendezvous (run under polycast run)."""
import sys
import time

import numpy as np

import polycast

comm = polycast.init(timeout=20)
x = np.ones(int(sys.argv[1]), np.float32)
y = np.empty_like(x)
time.sleep(0.5 if comm.rank == int(sys.argv[2]) else 0)
comm.Allreduce(x, y, algorithm="recdoubling")
assert (y == comm.size).all()
print("ok")
polycast.finalize()
