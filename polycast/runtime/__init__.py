"""polycast.runtime: the real-process driver of the engine.

=============== ==========================================================================
module          what it holds
=============== ==========================================================================
env             rank/size/master address from polycast run, torchrun, mpiexec or srun
store           the rendezvous TCP key-value store (server on rank 0, bounded clients)
launch          ``polycast run -n N script.py``: local ranks, ``[rank N]`` output, fail-fast
world           bootstrap: rendezvous, one TCP connection per pair, shm rings per local pair
frames          the framing shared by the reliable transports
tcp             non-blocking framed TCP link (queued partial writes, recv_into)
shm             SPSC shared-memory rings, zero-copy receive, doorbells over TCP
mcast           UDP multicast groups per (job, communicator), own-datagram BPF filter
driver/         the engines' driver: progress, actions, peer I/O, datagrams, timers, Request
symm/           symmetric memory on one host: peers read each other's buffers (auto, symm)
selftest        every collective and algorithm against the reference on real ranks
bench_rank      the rank side of ``polycast bench``
=============== ==========================================================================

The user API is :mod:`polycast.comm` (``polycast.init()``).
"""
