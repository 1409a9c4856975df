"""Symmetric memory on one host: every rank maps its peers' buffers and reads them directly.

This is the style of PyTorch's ``torch.distributed._symmetric_memory`` for low-contention
intra-node allgather and reduce-scatter:

>>> x = comm.symm_empty((n,), np.float32)          # collective: every rank, same shape
>>> x[:] = ...
>>> comm.Allgather(x, out, algorithm="symm")       # out: any array of P*n elements
>>> comm.Allgather(plain, y, algorithm="symm")     # or y symmetric (P*n), any sendbuf
>>> comm.Reduce_scatter_block(x, part, op="sum", algorithm="symm")  # x: P*m elements
>>> comm.Allreduce(x, y, algorithm="symm")          # y symmetric too (or IN_PLACE)

``symm_empty`` puts the array in its own /dev/shm segment and maps every peer's segment
of the same allocation (allocations are collective, so the k-th allocation of a
communicator is the same on every rank, and every rank can name every peer's segment:
``polycast-<job>-symm-<comm>-<k>-<rank>``). Two object allgathers through the
communicator carry the "created" and "mapped" reports; each rank unlinks its segment as
soon as every rank has mapped it. On any failure on the way (a rank that cannot create or
map, a peer lost) every rank raises and the survivors unlink every rank's segment, the
dead one's included; a shape mismatch is caught before anything is created. So /dev/shm
holds nothing once ``symm_empty`` returns or raises, unless every rank died inside it.
Raw /dev/shm files are used rather than ``multiprocessing.shared_memory`` because its
resource tracker (Python < 3.13) unlinks and warns about segments other processes own.

The collectives *pull*: for allgather rank r copies block p straight out of peer p's
mapped send buffer; for reduce-scatter it reduces block r of every peer's mapped send
buffer into its own result (in-place numpy ufuncs reading the peer's memory: no copy in
between). At step i rank r reads peer (r + i) mod P, so at every step each rank is read by
exactly one other rank and no source is contended. Allreduce is reduce-scatter into the
owner's block of a symmetric ``recvbuf``, then allgather of those blocks (each block is
reduced once, so every rank holds the same bits); up to ONE_SHOT_MAX_NBYTES it is one-shot
instead: every rank reduces the whole buffer from every peer in rank order (one barrier
less; the same bits everywhere again). A plain ``sendbuf`` is first copied into ``recvbuf``.

Synchronisation is an epoch barrier in a small shared control segment per communicator:
each rank stores a descriptor of the call and then its epoch, and waits (polling, then
yielding the core, then sleeping on a futex the arriving peer wakes) until every peer's
epoch has caught up. Barriers come before
reading (inputs ready) and after (nobody still reads a buffer its owner may now
overwrite). The descriptors are compared after the first barrier, so ranks that call
differently all raise MismatchError instead of reading wrong data; a rank whose own
arguments are wrong still joins that barrier, as "cannot take part", so the others raise
at once too. Every wait is bounded by the communicator's timeout (CollectiveTimeout naming
the ranks missing) and watches the driver's dead-peer list (PeerLost naming the rank);
after either, the ranks' epochs disagree, so the communicator's symm path refuses further
calls. Stores to the control segment are ordered after the data stores by x86-64's total
store order (the same assumption the shm rings make).

bench/symm.py measures it against the engine's ring, large and small calls.

``auto`` with ordinary arrays (:func:`route`, :func:`auto_staged`): when every rank of the
communicator is on one host, POLYCAST_SYMM is not 0 and symm has not been refused there
(other hosts, a failed allocation, a lost peer), Allgather, Reduce_scatter_block, Allreduce
and Bcast go *staged*: the input is copied into shared memory and the collective reads
peers' copies (allgather and reduce-scatter write straight into the user's recvbuf;
allreduce reduces its block, then copies every block out, or up to ONE_SHOT_MAX_NBYTES
reduces the whole; broadcast above the slots is pipelined in BCAST_CHUNK_NBYTES chunks;
large allgather, reduce-scatter and allreduce read the peers' arrays single-copy instead,
:mod:`.single`). Calls up to SLOT_NBYTES a rank use one of two alternating slots and take
one barrier (allreduce above one-shot: two), no closing one (:mod:`.staged` says why that
is safe); larger ones use a staging segment made by the first such call (collective: every
rank makes the same call) and replaced by one of the next power of two when a call needs
more; a rank that needs to grow it first joins a barrier saying so, so ranks passing
different sizes all raise MismatchError rather than some allocating while others wait. It
is freed with the communicator. The choice uses only what every rank shares, never whether
a rank's own buffers are symmetric (those take the zero-copy path above, on every rank
alike or MismatchError). bench/peers.py shows it (``auto(symm)``) beside the engine's
best algorithm and MPICH, per size.

Why this does not break "one engine": this path is a transport-level fast path for one
host, like PyTorch's, not a second copy of an algorithm. The engine's schedules (direct,
ring, ...) remain the semantics of every collective; here the buffers themselves are
shared, so there is nothing to send: the "schedule" degenerates to direct reads in a
rotated order, and it is only taken on one host, where it is a copy through shared
memory like the shm rings' (POLYCAST_SYMM=0 or an explicit algorithm= runs the schedule
instead). It cannot
run in the simulator (there is no shared memory across a modelled network) and does not
need to: its traffic is that of the ``direct`` allgather and reduce-scatter schedules
(every rank exchanges with every peer, once), which the simulator and verifier cover.
Symm calls on one communicator run one at a time in posting order (:mod:`.queue`): a
blocking call on the caller's thread, an ``I``-variant on the communicator's worker
thread, so it returns at once with a pending request and overlaps with the caller's
computation. (The first call that needs the staging segment made or grown still waits for
the peers: that allocation is collective.)

=========== ===================================================================================
module      what it holds
=========== ===================================================================================
segments    collective /dev/shm allocations (create, map every peer's, unlink; no leftovers)
shared      SymmState: a communicator's allocations, staging segment, barrier; symm_empty
barrier     the epoch barrier (descriptors, MismatchError, bounded waits, PeerLost)
common      argument checks shared by the collectives, block bounds, ufuncs
direct      allgather / reduce-scatter / allreduce on the user's symmetric arrays
staged      the ``auto`` path for ordinary arrays (allgather, reduce-scatter, allreduce, bcast)
single      its large allgather / reduce-scatter / allreduce reading peers' arrays (one copy)
queue       running the collectives as jobs in posting order: caller's thread or the worker
=========== ===================================================================================
"""

from .barrier import BAD_SIG, EpochBarrier
from .direct import allgather, allreduce, reduce_scatter
from .segments import segment_path
from .staged import (BCAST_CHUNK_NBYTES, staged_allgather, staged_allreduce, staged_bcast,
                     staged_reduce_scatter)
from .shared import ONE_SHOT_MAX_NBYTES, SLOT_NBYTES, SymmState

__all__ = ["SymmState", "EpochBarrier", "BAD_SIG", "ONE_SHOT_MAX_NBYTES", "SLOT_NBYTES",
           "BCAST_CHUNK_NBYTES", "segment_path", "allgather", "reduce_scatter", "allreduce",
           "staged_allgather", "staged_reduce_scatter", "staged_allreduce", "staged_bcast"]
# Which path a call takes (SYMM, STAGED or the engine), and the communicator's SymmState,
# are its dispatch's (polycast.dispatch).
