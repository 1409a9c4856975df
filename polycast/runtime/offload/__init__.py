"""Offloaded progress: one process per host owns the data path of every local rank, the way
a host hands work to a NIC (``polycast.init(progress="offload")`` or
``POLYCAST_PROGRESS=offload``).

What runs where
===============

* **Application processes** (the ranks) run no engine, no transport and no progress
  thread. A call builds its schedule as usual (cached per communicator), then writes one
  small work descriptor into a shared-memory submission ring and returns a Request; a
  completion arrives in a shared-memory completion ring. Their buffers are *registered*
  (allocated with ``comm.empty()`` / ``comm.symm_empty()`` in the rank's arena, used in
  place: zero copies on the host side) or *staged* (any other numpy array: the input is
  copied into the arena before the descriptor is posted and the output copied back out at
  completion; ``POLYCAST_OFFLOAD_STAGING=0`` turns staging off, and an unregistered buffer
  then raises InvalidArgument). bench/offload.py measures what staging costs.
* **The offload process** of the host runs, for every local rank, exactly what that rank
  would run in-process: its :class:`~polycast.runtime.bootstrap.world.World` (rendezvous, TCP to
  every rank, shm rings to local ranks) and its :class:`~polycast.runtime.driver.Driver`
  (engines, transports, timers, multicast). Errors are therefore the engine's own
  (MismatchError, PeerLost, CollectiveTimeout, ProtocolError), carried back in the
  completion with their text.
* **Multicast receive workers** (``POLYCAST_OFFLOAD_WORKERS``, default 1; 0 = the offload
  process receives itself): every communicator multicasts on one group *per root*, and
  worker ``w`` of ``k`` joins the groups of the roots ``r % k == w`` (the paper maps its
  allgather onto NIC threads the same way). A worker runs the receive side of the
  reliable-multicast protocol for its streams: it verifies each datagram, places its chunk
  straight into the arena buffer of every local rank receiving that stream
  (:class:`polycast.engine.stream.Stream`: bitmap, duplicates, bounds) and reports the
  placed chunk ranges; the engines (``EngineConfig.external_streams``) keep the rest of
  the protocol (gap pulls, deferral, FIN, pacing) and hand the worker what came by
  recovery. One writer per stream buffer, so a chunk is never written after its engine
  saw the stream complete.

Who starts it, how it is found and how it ends
==============================================

The host's local rank 0 starts it (``python -m polycast.runtime.offload.server``; its
configuration, the shared secret included, goes through a pipe, never the command line)
and keeps its pid. It listens on a Linux *abstract* Unix socket named after the job's
rendezvous address and the user id (:func:`.channel.socket_name`): nothing on the file
system to leak, one per network namespace (a host of ``polycast lab``). Every local rank
connects to it (bounded by the job's timeout), and both sides check with SO_PEERCRED that
the other runs as the same user. The offload process ends when every rank that attached
has detached (``finalize`` says goodbye; a rank that dies closes its socket, and the
offload closes that rank's connections without a goodbye, so its peers see the rank lost,
as they would in-process), or when no rank attached within the timeout. Local rank 0's
``finalize`` waits for it (bounded) and kills it by pid if it lingers. It ends its workers
by pid. A dead offload process closes every rank's socket: each rank fails its
outstanding requests and every later call with :class:`polycast.errors.OffloadLost`,
never a hang.

Descriptors, completions and registered memory
==============================================

Each rank creates three files in /dev/shm: its arena (sparse, ``POLYCAST_OFFLOAD_ARENA``
bytes, default 1 GiB), a submission ring and a completion ring (single-producer
single-consumer byte rings, :class:`polycast.runtime.transport.shm.Ring`, reused as they are). It
names them in its hello; the offload process maps them (and its workers map the arenas),
then the rank unlinks them: nothing is left in /dev/shm once ``init`` returns, whatever
dies afterwards. Descriptors (:mod:`.descriptors`) are fixed-size structs: SCHEDULE
(once per schedule a rank uses: the pickled schedule, since schedules are data), POST
(request id, communicator, schedule id, dtype, op, and the arena offsets of send/recv),
ADD_COMM, FREE_COMM, STATS, BYE; completions carry the request id, a status and an
error's class and text. A buffer is named by its byte offset in its rank's arena, so the
offload process and the workers address it without any per-call mapping. Doorbells and
liveness share the Unix socket: a writer that finds the reader asleep (the ring's
``reader_sleeping`` word) sends one byte; end-of-file means the other side is gone.

Modules: :mod:`.channel` (socket naming and credentials, the two rings and doorbells),
:mod:`.descriptors` (the structs), :mod:`.arena` (registered memory: allocation, lookup),
:mod:`.client` (what a rank's Comm talks to), :mod:`.server` (the offload process),
:mod:`.streams` (the offload side of the multicast workers), :mod:`.worker` (a worker).
"""

from __future__ import annotations

# Whether a rank's communication is offloaded is its configuration's ``progress``
# (POLYCAST_PROGRESS or init(progress=...)): polycast.config.
