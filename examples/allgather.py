"""Run with:  polycast run -n 4 examples/allgather.py

The same script works under torchrun, mpiexec and srun (polycast.init reads their
environment)."""

import numpy as np

import polycast

comm = polycast.init()
rank, size = comm.Get_rank(), comm.Get_size()

# Buffer methods, as mpi4py: every rank contributes 4 floats, every rank gets all of them.
send = np.full(4, rank, dtype=np.float32)
recv = np.empty(4 * size, dtype=np.float32)
comm.Allgather(send, recv, algorithm="mcast")        # reliable multicast (UDP, loopback)
assert (recv.reshape(size, 4) == np.arange(size)[:, None]).all()

# Non-blocking: several collectives in flight at once.
grads = np.ones(1 << 20, dtype=np.float32)
reduced = np.empty_like(grads)
req = comm.Iallreduce(grads, reduced, op="sum")      # algorithm="auto" (the tuner)
comm.Bcast(send, root=0)
req.Wait()
assert (reduced == size).all()

# Lowercase methods move Python objects.
names = comm.allgather(f"rank-{rank}")
if rank == 0:
    print("allgather ok:", recv.tolist())
    print("objects:", names)
polycast.finalize()
