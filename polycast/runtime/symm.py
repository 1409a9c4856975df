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
each rank stores a descriptor of the call and then its epoch, and waits (yielding, then
sleeping with a growing nap) until every peer's epoch has caught up. Barriers come before
reading (inputs ready) and after (nobody still reads a buffer its owner may now
overwrite). The descriptors are compared after the first barrier, so ranks that call
differently all raise MismatchError instead of reading wrong data; a rank whose own
arguments are wrong still joins that barrier, as "cannot take part", so the others raise
at once too. Every wait is bounded by the communicator's timeout (CollectiveTimeout naming
the ranks missing) and watches the driver's dead-peer list (PeerLost naming the rank);
after either, the ranks' epochs disagree, so the communicator's symm path refuses further
calls. Stores to the control segment are ordered after the data stores by x86-64's total
store order (the same assumption the shm rings make).

Measured (bench/symm.py, 4 ranks on 2 cores, 16 MiB): busbw allgather 3.6-4.0 GB/s,
reduce-scatter 4.2-4.9, allreduce 4.2-4.7, against the ring's 0.8-1.4; a 16-byte call
takes ~100 us against the ring's 0.8-1.5 ms (18 us for allreduce on 2 ranks).

``auto`` with ordinary arrays (:func:`route`, :func:`auto_staged`): when every rank of
the communicator is on one host, POLYCAST_SYMM is not 0 and symm has not been refused
there (other hosts, a failed allocation, a lost peer), Allgather, Reduce_scatter_block,
Allreduce and Bcast go *staged*: the input is copied into the communicator's staging
segment and the collective reads peers' staging segments (allgather and reduce-scatter
write straight into the user's recvbuf; allreduce reduces its block in place, then copies
every block out; broadcast is pipelined in BCAST_CHUNK_NBYTES chunks; an allreduce up to
ONE_SHOT_MAX_NBYTES takes one barrier, its input in one of two alternating slots of a
small segment). The staging segment is made by the first such call (collective: every
rank makes the same call) and replaced by one of the next power of two when a call needs
more; a rank that needs to grow it first joins a barrier saying so, so ranks passing
different sizes all raise MismatchError rather than some allocating while others wait.
It is freed with the communicator. The choice uses only what every rank shares, never
whether a rank's own buffers are symmetric (those take the zero-copy path above, on
every rank alike or MismatchError). Measured, 4 ranks on 2 cores (loaded machine, noisy):
16 MiB busbw allgather 1.2-2.8 GB/s, allreduce 1.1-2.4, broadcast 1.6-4.7; 8-byte
allreduce 60-180 us, against the engine's 0.5-1.2, 0.8-1.3, ~1.0-1.25 GB/s and 300-1300 us.

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
Symm calls on one communicator are serialised by a lock and complete before they return
(the ``I``-variants return an already completed request).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import mmap
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..collectives import Collective, ReduceOp
from ..errors import CollectiveTimeout, InvalidArgument, MismatchError, PeerLost, PolycastError
from ..memory import apply_avg
from .env import host_id
from .shm import SHM_DIR, shm_available, shm_unavailable_reason

NAME = "symm"
CTRL_NBYTES = 4096
EPOCH, SIG0 = 0, 8              # uint64 slots of a rank's control block: epoch, 2 descriptors
PROGRESS = 3                    # slot: chunks a pipelined broadcast's root has staged
BCAST_CHUNK_NBYTES = 256 << 10   # 4 ranks, 16 MiB: 128K 4.1, 256K 4.7, 512K 3.5, 1M 4.5 GB/s
# Poll with sched_yield this long, then nap (growing to MAX_NAP_SECONDS). A yield hands the
# core to a peer that has not arrived yet; 4 ranks on 2 cores, 16-element allreduce: 0 ->
# 386 us, 50 us -> 281, 200 us -> 127-314 (noisy), 1 ms -> 120, 5 ms -> 120.
YIELD_SECONDS = 1e-3
MAX_NAP_SECONDS = 1e-3
_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
           ReduceOp.MAX: np.maximum, ReduceOp.AVG: np.add}
BAD_SIG = (1 << 64) - 1         # a rank that cannot take part (e.g. a non-symmetric buffer)
# Allreduce up to this size is one-shot (every rank reduces all of it: 2 barriers instead
# of 3); above, reduce-scatter + allgather moves P/2 times fewer bytes per rank.
ONE_SHOT_MAX_NBYTES = 64 << 10


def _populate_flags() -> int:
    return mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def _open_map(path: str, nbytes: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        elif os.fstat(fd).st_size < nbytes:
            raise PolycastError(f"{path} holds {os.fstat(fd).st_size} bytes, "
                                f"expected {nbytes}")
        # Populate the page tables now, not on the first collective (~1 us per page).
        return mmap.mmap(fd, nbytes, flags=_populate_flags())
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass        # the user still holds an array on it: the mapping goes with that array


@dataclass
class Segment:
    """One collective allocation: this rank's mapping and every peer's."""
    index: int
    nbytes: int
    maps: list                      # mmap per rank (ours included)
    bases: list[int] = field(default_factory=list)      # address of each mapping

    def view(self, rank: int, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        return np.ndarray((count,), dtype, self.maps[rank], offset)


def segment_path(job_id: str, comm_id: int, tag: str, rank: int) -> str:
    """Where rank ``rank``'s segment of allocation ``tag`` lives while it is being mapped.
    Every rank can name every peer's, so survivors can remove a dead peer's segment."""
    return os.path.join(SHM_DIR, f"polycast-{job_id}-symm-{comm_id:x}-{tag}-{rank}")


def _map_collectively(comm, nbytes: int, tag: str) -> list:
    """Every rank creates a segment of ``nbytes``; all map all; each unlinks its own as soon
    as everyone has mapped it. On any failure (a rank that cannot create or map, a peer
    lost on the way) every rank raises and unlinks *every* rank's segment, so a peer that
    died after creating its own leaks nothing either. Returns the mmap per rank."""
    job = comm._driver.world.job_id
    paths = [segment_path(job, comm.id, tag, p) for p in range(comm.size)]
    maps: list = [None] * comm.size
    done = False
    try:
        err = None
        try:
            maps[comm.rank] = _open_map(paths[comm.rank], max(nbytes, 1), True)
        except OSError as exc:
            err = f"rank {comm.rank} cannot create {paths[comm.rank]}: {exc}"
        errors = [e for e in comm.allgather(err) if e]      # also: every segment exists
        if errors:
            raise PolycastError("symmetric allocation failed: " + "; ".join(errors))
        try:
            for p in range(comm.size):
                if p != comm.rank:
                    maps[p] = _open_map(paths[p], max(nbytes, 1), False)
        except (OSError, PolycastError) as exc:
            err = f"rank {comm.rank} cannot map a peer's segment: {exc}"
        errors = [e for e in comm.allgather(err) if e]      # also: everyone has mapped
        if errors:
            raise PolycastError("symmetric allocation failed: " + "; ".join(errors))
        done = True
        return maps
    except BaseException:
        for m in maps:
            if m is not None:
                _close(m)
        raise
    finally:
        for p in ([comm.rank] if done else range(comm.size)):
            _unlink(paths[p])


class SymmState:
    """The symmetric memory of one communicator: allocations and the barrier block."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.world_ranks = list(comm.members)
        self.segments: list[Segment] = []
        self.lock = threading.Lock()
        self.epoch = 0
        self.usable_reason: str | None = None
        # After a barrier timed out or lost a peer, the ranks' epochs no longer agree: a
        # late rank could pass a barrier on a stale epoch and read a buffer in use.
        self.broken: str | None = None
        self.done: dict = {}            # collective -> its completed request
        self.nsegments = 0              # allocations made (segment indices stay unique)
        self.nuser = 0                  # symm_empty allocations (their tags: a0, a1, ...)
        # The staging buffer of the auto path for ordinary arrays (see staged_*); while it
        # is being (re)allocated, the object collectives that allocation makes take the
        # engine, so nothing recurses into it.
        self.stage: Segment | None = None
        self.small: Segment | None = None
        self.growing = False
        self.auto_refused: str | None = None
        hosts = comm.allgather(host_id())
        why = None
        if len(set(hosts)) != 1:
            why = ("symmetric memory needs every rank of the communicator on one host; ranks "
                   f"are on {len(set(hosts))} hosts")
        # The epoch barrier orders data and counters the way the shm rings do: only where
        # the CPU keeps stores in order (same answer on every rank of one host).
        why = why or shm_unavailable_reason()
        if why:
            self.usable_reason = why
            self.ctrl = None
            return
        maps = _map_collectively(comm, CTRL_NBYTES, "ctrl")
        self._ctrl_maps = maps
        self.ctrl = [np.ndarray((CTRL_NBYTES // 8,), np.uint64, m, 0) for m in maps]

    # -- allocation -----------------------------------------------------------------------
    def alloc(self, shape, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise InvalidArgument(f"symmetric arrays hold plain data; dtype {dt} holds "
                                  "Python objects")
        try:
            shape = tuple(int(s) for s in (shape if np.iterable(shape) else (shape,)))
        except (TypeError, ValueError):
            raise InvalidArgument(f"shape must be an int or a tuple of ints, got {shape!r}"
                                  ) from None
        if any(s < 0 for s in shape):
            raise InvalidArgument(f"shape must be non-negative, got {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        asks = self.comm.allgather((shape, dt.str))
        if len(set(asks)) != 1:
            raise MismatchError("symm_empty is collective and symmetric: every rank must ask "
                                "for the same shape and dtype; got " +
                                ", ".join(f"rank {r}: {s} {np.dtype(d)}"
                                          for r, (s, d) in enumerate(asks)))
        if self.usable_reason:
            raise InvalidArgument(self.usable_reason)
        seg = self._new_segment(nbytes, f"a{self.nuser}")
        self.nuser += 1
        return np.ndarray(shape, dt, seg.maps[self.rank], 0)

    def _new_segment(self, nbytes: int, tag: str) -> Segment:
        maps = _map_collectively(self.comm, nbytes, tag)
        seg = Segment(self.nsegments, max(nbytes, 1), maps)
        self.nsegments += 1
        seg.bases = [np.frombuffer(m, np.uint8, 1).__array_interface__["data"][0]
                     for m in maps]
        self.segments.append(seg)
        return seg

    def grow_stage(self, nbytes: int) -> Segment:
        """Replace the staging segment by one of ``nbytes`` (collective: every rank calls it
        with the same size). The old one is unmapped first: bounded by the largest call."""
        self.growing = True
        try:
            old, self.stage = self.stage, None
            if old is not None:
                self.segments.remove(old)
                for m in old.maps:
                    _close(m)
            self.stage = self._new_segment(nbytes, f"s{self.nsegments}")
            if self.small is None:
                # Two slots for small allreduces (see staged_allreduce), made with the first
                # staging buffer: a step every rank takes at the same call.
                self.small = self._new_segment(2 * ONE_SHOT_MAX_NBYTES, f"s{self.nsegments}")
            return self.stage
        finally:
            self.growing = False

    def find(self, arr) -> tuple[Segment, int] | None:
        """(segment, byte offset) of an array inside one of our allocations, else None."""
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            return None
        # Cheap first: our arrays (and views of them) end in an mmap; most arrays do not.
        base = arr.base
        while isinstance(base, np.ndarray):
            base = base.base
        if not isinstance(base, mmap.mmap):
            return None
        lo = arr.__array_interface__["data"][0]
        hi = lo + arr.nbytes
        for seg in self.segments:
            base = seg.bases[self.rank]
            if base <= lo and hi <= base + seg.nbytes:
                return seg, lo - base
        return None

    def free(self) -> None:
        for seg in self.segments:
            for m in seg.maps:
                _close(m)
        self.segments = []
        self.stage = self.small = None
        if self.ctrl is not None:
            self.ctrl = None
            for m in self._ctrl_maps:
                _close(m)

    # -- the barrier ----------------------------------------------------------------------
    def barrier(self, sig: int, what: str) -> list[int]:
        """Publish ``sig`` and wait for every peer's epoch; returns every rank's sig."""
        if self.broken:
            raise PolycastError(f"rank {self.rank}: {what}: the symmetric memory of this "
                                f"communicator is unusable after an earlier failure "
                                f"({self.broken})")
        try:
            return self._barrier(sig, what)
        except (PeerLost, CollectiveTimeout) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            raise

    def _barrier(self, sig: int, what: str) -> list[int]:
        self.epoch += 1
        e = self.epoch
        slot = SIG0 // 8 + (e & 1)
        own = self.ctrl[self.rank]
        own[slot] = sig
        own[EPOCH] = e                     # after the descriptor (and the data): TSO
        self.wait_for([p for p in range(self.size) if p != self.rank], EPOCH, e, what,
                      "did not reach the barrier")
        return [int(self.ctrl[p][slot]) for p in range(self.size)]

    def wait_for(self, pending: list[int], slot: int, target: int, what: str,
                 missing: str) -> None:
        """Wait until control slot ``slot`` of every rank in ``pending`` is >= ``target``,
        bounded by the timeout and watching the driver's dead-peer list."""
        down = getattr(self.comm._driver, "peer_down", None)
        start = time.monotonic()
        deadline = start + self.comm.timeout_seconds
        nap = 20e-6
        while True:
            pending = [p for p in pending if int(self.ctrl[p][slot]) < target]
            if not pending:
                return
            now = time.monotonic()
            for p in pending:
                reason = down(self.world_ranks[p]) if down is not None else None
                if reason is not None:
                    raise PeerLost(p, f"rank {self.rank}: {what}: rank {p} is gone "
                                      f"({reason}) while the others wait for it")
            if now > deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank}: {what}: ranks {pending} {missing} within "
                    f"{self.comm.timeout_seconds:g} s (did every rank call it, with "
                    "symmetric buffers?)")
            if now - start < YIELD_SECONDS:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(MAX_NAP_SECONDS, nap * 2)

    def check_sigs(self, sigs: list[int], what: str) -> None:
        if len(set(sigs)) == 1:
            return
        mine = sigs[self.rank]
        bad = [p for p, s in enumerate(sigs) if s == BAD_SIG]
        if bad:
            raise MismatchError(f"rank {self.rank}: {what}: ranks {bad} could not take "
                                "part (bad arguments there, e.g. a buffer not from "
                                "symm_empty: see their InvalidArgument)")
        diff = [p for p, s in enumerate(sigs) if s != mine]
        raise MismatchError(f"rank {self.rank}: {what}: ranks called collectives differently "
                            f"(collective, size, dtype, op or buffer offset): ranks {diff} "
                            f"differ from rank {self.rank}")


def _sig(*parts) -> int:
    d = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 63) - 1)


def state(comm, create: bool = False) -> SymmState | None:
    st = comm.__dict__.get("_symm_state")
    if st is None and create:
        # Making the state runs object allgathers on this communicator: they must take the
        # engine, not the auto symm path that would make the state again.
        comm._symm_creating = True
        try:
            st = comm._symm_state = SymmState(comm)
        finally:
            comm._symm_creating = False
    return st


def alloc(comm, shape, dtype=np.float32) -> np.ndarray:
    """See :meth:`polycast.comm.Comm.symm_empty`."""
    if comm._freed:
        raise InvalidArgument(f"{comm!r} was freed")
    return state(comm, create=True).alloc(shape, dtype)


def free(comm) -> None:
    st = comm.__dict__.pop("_symm_state", None)
    if st is not None:
        st.free()


def is_symmetric(comm, arr) -> bool:
    st = state(comm)
    return st is not None and st.find(arr) is not None


def wanted(comm, coll: Collective, algorithm: str | None, sendbuf, recvbuf,
           in_place: bool) -> bool:
    """Whether a call takes this path: asked for by name (``algorithm=`` or
    POLYCAST_<COLLECTIVE>_ALGO), or ``auto`` when the buffers peers must read are symmetric
    (the user opted in by allocating them so; every rank must do the same): the source of
    reduce-scatter, the source or the whole recvbuf of allgather, the recvbuf of
    allreduce."""
    name = (algorithm or os.environ.get(f"POLYCAST_{coll.name}_ALGO") or "auto").lower()
    if name == NAME:
        return True
    if name != "auto" or auto_disabled():
        return False
    st = comm.__dict__.get("_symm_state")
    if st is None or st.usable_reason or st.broken or comm.size < 2:
        return False
    src = recvbuf if in_place else sendbuf
    if coll is Collective.REDUCE_SCATTER:
        return st.find(src) is not None
    if coll is Collective.ALLGATHER:
        return st.find(recvbuf) is not None or st.find(src) is not None
    if coll is Collective.ALLREDUCE:
        return st.find(recvbuf) is not None
    return False


def auto_disabled() -> bool:
    """POLYCAST_SYMM=0 (or false/no/off): ``auto`` never takes symmetric memory."""
    return os.environ.get("POLYCAST_SYMM", "1").strip().lower() in ("0", "false", "no", "off")


_STAGED = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE,
           Collective.BROADCAST)


def _members_on_one_host(comm) -> bool:
    """From what the rendezvous told every rank (no message): the same answer everywhere,
    since every member sees every other member on its own host or none does."""
    world = getattr(comm._driver, "world", None)
    if world is None or not shm_available():
        return False
    if world.single_host:
        return True
    peers = world.peers
    return all(w == world.rank or (w in peers and peers[w].same_host) for w in comm.members)


_ENV_ALGO = {c: f"POLYCAST_{c.name}_ALGO" for c in Collective}
SYMM, STAGED = "symm", "staged"


def route(comm, coll: Collective, algorithm: str | None, sendbuf, recvbuf,
          in_place: bool) -> str | None:
    """Which symm path a call takes: SYMM (``algorithm="symm"``, or ``auto`` with the
    user's symmetric buffers: :func:`wanted`), STAGED (``auto`` with ordinary arrays on
    one host: :func:`auto_staged`), or None (the engine). One function, so the common case
    reads the environment twice, not four times (measured: 12 -> ~4 us a call)."""
    name = algorithm or os.environ.get(_ENV_ALGO[coll]) or "auto"
    if name == NAME:
        return SYMM
    name = name.lower()
    if name == NAME:
        return SYMM
    if name != "auto" or auto_disabled():
        return None
    st = comm.__dict__.get("_symm_state")
    if st is not None and not (st.usable_reason or st.broken) and comm.size > 1:
        src = recvbuf if in_place else sendbuf
        if (coll is Collective.REDUCE_SCATTER and st.find(src) is not None
                or coll is Collective.ALLGATHER and (st.find(recvbuf) is not None
                                                     or st.find(src) is not None)
                or coll is Collective.ALLREDUCE and st.find(recvbuf) is not None):
            return SYMM
    buf = recvbuf if coll is not Collective.BROADCAST else sendbuf
    return STAGED if _staged_ok(comm, coll, buf) else None


def auto_staged(comm, coll: Collective, algorithm: str | None, buf) -> bool:
    """Whether an ``auto`` call with ordinary arrays takes the staged symm path: the
    collective is allgather, reduce-scatter, allreduce or broadcast, the communicator has
    2+ ranks all on one host, POLYCAST_SYMM is not 0, and symmetric memory has not been
    refused on this communicator (other hosts, a failed allocation, a lost peer). All of it
    is the same on every rank (``buf`` only gives the dtype, which ranks share), so ranks
    never take different paths. The first such call makes the communicator's symmetric
    state (collective: every rank is making the same call)."""
    if algorithm is not None and algorithm.lower() != "auto":
        return False
    env = os.environ.get(_ENV_ALGO[coll])
    if env and env.lower() != "auto" or auto_disabled():
        return False
    return _staged_ok(comm, coll, buf)


def _staged_ok(comm, coll: Collective, buf) -> bool:
    if coll not in _STAGED or comm.size < 2 or comm._freed:
        return False
    if not isinstance(buf, np.ndarray) or buf.dtype.hasobject:
        return False
    d = comm.__dict__
    st = d.get("_symm_state")
    if st is None:
        if d.get("_symm_creating") or d.get("_symm_refused") or not _members_on_one_host(comm):
            return False
        try:
            st = state(comm, create=True)
        except (PeerLost, CollectiveTimeout):
            raise
        except PolycastError as exc:        # raised on every rank: all take the engine
            comm._symm_refused = str(exc)
            return False
    return not (st.usable_reason or st.broken or st.growing or st.auto_refused)


STAGE_MIN_NBYTES = 4096


def _stage(comm, st: SymmState, nbytes: int, desc: tuple, what: str) -> Segment | None:
    """The staging segment, with room for ``nbytes``. Growth is decided from the call's
    size, which every rank shares: each rank that needs more joins a barrier first whose
    descriptor says so, so ranks whose sizes differ (some growing, some not) all raise
    MismatchError there instead of some allocating while others wait. The new size is the
    next power of two (at least STAGE_MIN_NBYTES), so a series of growing calls allocates
    O(log) times. None: the allocation failed on every rank (the call takes the engine)."""
    seg = st.stage
    if seg is not None and nbytes <= seg.nbytes:
        return seg
    need = max(STAGE_MIN_NBYTES, 1 << max(0, nbytes - 1).bit_length())
    with st.lock:
        st.check_sigs(st.barrier(_sig("grow", need, *desc), what), what)
    try:
        return st.grow_stage(need)
    except (PeerLost, CollectiveTimeout) as exc:
        st.broken = f"{type(exc).__name__}: {exc}"
        raise
    except PolycastError as exc:            # every rank raised it (the reports are shared)
        st.auto_refused = f"staging buffer of {need} bytes: {exc}"
        return None


def staged_allgather(comm, sendbuf, recvbuf, in_place: bool):
    """``auto`` allgather of ordinary arrays: this rank's block is copied into the staging
    segment, whence every peer reads it straight into its own recvbuf (no copy out).
    Returns a completed request, or None when the call must take the engine."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "allgather"):
        recv = _flat(recvbuf, "recvbuf")
        if recv.size % P:
            raise InvalidArgument(f"Allgather recvbuf of {recv.size} elements is not a "
                                  f"multiple of the {P} ranks")
        n = recv.size // P
        src = recv[r * n:(r + 1) * n] if in_place else _flat(sendbuf, "sendbuf")
        if src.size != n:
            raise InvalidArgument(f"Allgather: sendbuf has {src.size} elements, recvbuf "
                                  f"needs {P} x {src.size} = {P * src.size}, got {recv.size}")
        if src.dtype != recv.dtype:
            raise InvalidArgument(f"Allgather: sendbuf dtype {src.dtype} and recvbuf dtype "
                                  f"{recv.dtype} must match")
    dt = recv.dtype
    seg = _stage(comm, st, n * dt.itemsize, ("allgather", n, dt.str),
                 _describe("allgather", n, dt))
    if seg is None:
        return None
    stage = seg.view(r, 0, n, dt)
    stage[...] = src
    return allgather(comm, stage, recv, False)


def staged_reduce_scatter(comm, sendbuf, recvbuf, op, in_place: bool):
    """``auto`` reduce-scatter of ordinary arrays: the input is copied into the staging
    segment; each rank reduces its block from every peer's copy into its recvbuf."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "reduce_scatter"):
        recv, src, n, ropt = _reduce_scatter_args(sendbuf, recvbuf, op, in_place, P)
        out = recv[:n] if in_place else recv
    dt = recv.dtype
    seg = _stage(comm, st, P * n * dt.itemsize, ("reduce_scatter", n, dt.str, ropt.value),
                 _describe("reduce_scatter", n, dt, ropt.value))
    if seg is None:
        return None
    stage = seg.view(r, 0, P * n, dt)
    stage[...] = src
    return reduce_scatter(comm, stage, out, ropt, False)


def staged_allreduce(comm, sendbuf, recvbuf, op, in_place: bool):
    """``auto`` allreduce of ordinary arrays: the input is copied into the staging segment.
    Up to ONE_SHOT_MAX_NBYTES every rank reduces the whole of every peer's copy, in rank
    order, straight into its recvbuf (one barrier: the input sits in one of two slots that
    alternate). Above, each rank reduces its block
    in its own staging copy (nobody else reads that block then), and after a barrier every
    rank copies every block from its owner into its recvbuf (three barriers). Either way
    each element is reduced in one order, so every rank holds the same bits."""
    P, r = comm.size, comm.rank
    st = state(comm)
    with _telling_peers(comm, "allreduce"):
        recv, src, ropt = _allreduce_args(sendbuf, recvbuf, op, in_place)
    dt, isz, count = recv.dtype, recv.dtype.itemsize, recv.size
    what = _describe("allreduce", count, dt, ropt.value)
    seg = _stage(comm, st, count * isz, ("allreduce", count, dt.str, ropt.value), what)
    if seg is None:
        return None
    ufunc = _UFUNCS[ropt]
    sig = _sig("allreduce-staged", count, dt.str, ropt.value, seg.index)
    if count * isz <= ONE_SHOT_MAX_NBYTES:
        # One barrier, no closing one: the input goes to slot (epoch & 1) of the small
        # segment. A peer still reading this slot would be in the call two barriers back,
        # but we passed the barrier after it, which that peer reached only once done.
        small = st.small
        with st.lock:
            off = ((st.epoch + 1) & 1) * ONE_SHOT_MAX_NBYTES
            small.view(r, off, count, dt)[...] = src
            st.check_sigs(st.barrier(sig, what), what)
            # recv is ours alone: reduce straight into it, in rank order (same bits).
            ufunc(small.view(0, off, count, dt), small.view(1, off, count, dt), out=recv)
            for p in range(2, P):
                ufunc(recv, small.view(p, off, count, dt), out=recv)
            if ropt is ReduceOp.AVG:
                apply_avg(recv, P)
        return _done_request(comm, "allreduce")
    mine = seg.view(r, 0, count, dt)
    mine[...] = src
    with st.lock:
        st.check_sigs(st.barrier(sig, what), what)
        blocks = _blocks(count, P)
        a, b = blocks[r]
        acc = mine[a:b]
        for i in range(1, P):
            ufunc(acc, seg.view((r + i) % P, a * isz, b - a, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.barrier(0, what)
        for i in range(P):
            p = (r + i) % P
            a, b = blocks[p]
            recv[a:b] = seg.view(p, a * isz, b - a, dt)
        st.barrier(0, what)
    return _done_request(comm, "allreduce")


def staged_bcast(comm, buf, root: int):
    """``auto`` broadcast of an ordinary array: the root copies it into its staging
    segment; after a barrier every other rank copies it out (a second barrier keeps the
    root from overwriting it for the next call while a peer still reads). Above
    2 x BCAST_CHUNK_NBYTES it is pipelined: the root publishes its progress chunk by chunk
    in its control block and the others copy each chunk as soon as it is there, while it
    is still in cache."""
    r = comm.rank
    st = state(comm)
    with _telling_peers(comm, "bcast"):
        b = _flat(buf, "buf")
    dt, n = b.dtype, b.size
    what = _describe("bcast", n, dt, f"root {root}")
    seg = _stage(comm, st, n * dt.itemsize, ("bcast", n, dt.str, root), what)
    if seg is None:
        return None
    nbytes = n * dt.itemsize
    pipelined = nbytes > 2 * BCAST_CHUNK_NBYTES
    if r == root and not pipelined:
        seg.view(r, 0, n, dt)[...] = b
    with st.lock:
        st.check_sigs(st.barrier(_sig("bcast", n, dt.str, root, seg.index), what), what)
        if pipelined:
            # Progress values are (opening epoch << 24) + chunks done: larger than any
            # left from an earlier call, the same target on every rank.
            step = max(1, BCAST_CHUNK_NBYTES // dt.itemsize)
            base = st.epoch << 24
            own, nchunks = st.ctrl[r], -(-n // step)
            try:
                for i in range(nchunks):
                    lo, hi = i * step, min(n, (i + 1) * step)
                    if r == root:
                        seg.view(r, lo * dt.itemsize, hi - lo, dt)[...] = b[lo:hi]
                        own[PROGRESS] = base + i + 1      # after the data: TSO
                    else:
                        st.wait_for([root], PROGRESS, base + i + 1, what,
                                    "did not publish the data")
                        b[lo:hi] = seg.view(root, lo * dt.itemsize, hi - lo, dt)
            except (PeerLost, CollectiveTimeout) as exc:
                st.broken = f"{type(exc).__name__}: {exc}"
                raise
        elif r != root:
            b[...] = seg.view(root, 0, n, dt)
        st.barrier(0, what)
    return _done_request(comm, "bcast")


# -- the collectives ------------------------------------------------------------------------

def _blocks(n: int, P: int) -> list[tuple[int, int]]:
    return [(i * n // P, (i + 1) * n // P) for i in range(P)]


def _flat(buf, what: str) -> np.ndarray:
    if not isinstance(buf, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    return buf.reshape(-1)


def _require(comm, coll: str, src, what: str, loc=None):
    """The state and (segment, offset) of ``src``; a clear InvalidArgument otherwise."""
    st = state(comm)
    if st is None:
        raise InvalidArgument(f"algorithm='symm' for {coll} needs {what} allocated with "
                              "comm.symm_empty(shape, dtype) on every rank; this "
                              "communicator has no symmetric allocation")
    if st.usable_reason:
        raise InvalidArgument(f"algorithm='symm' for {coll}: {st.usable_reason}")
    if comm._freed:
        raise InvalidArgument(f"{comm!r} was freed")
    loc = loc or st.find(src)
    if loc is None:
        raise InvalidArgument(f"algorithm='symm' for {coll} needs {what} to be (a "
                              "contiguous part of) an array from comm.symm_empty(), at the "
                              "same offset on every rank; got an ordinary array")
    return st, loc


@contextlib.contextmanager
def _telling_peers(comm, coll: str):
    """A local argument error still takes part in the opening barrier (with BAD_SIG), so
    peers that called correctly raise MismatchError at once instead of waiting for the
    timeout (and every rank's epoch stays in step)."""
    try:
        yield
    except InvalidArgument:
        st = state(comm)
        if st is not None and st.ctrl is not None and not st.broken and not comm._freed:
            with st.lock:
                try:
                    st.barrier(BAD_SIG, f"symm {coll}")
                except PolycastError:
                    pass
        raise


def _done_request(comm, coll: str):
    """The request an ``I``-variant returns: already complete (one per communicator and
    collective, made once: a fresh one cost 4 of a small call's ~30 us)."""
    st = state(comm)
    req = st.done.get(coll)
    if req is None:
        from .driver import Request
        req = st.done[coll] = Request(0, comm.id, f"rank {comm.rank}: symm {coll} "
                                                  "(complete on return)", comm.timeout_seconds)
        req._finish()
    return req


@functools.lru_cache(maxsize=64)
def _describe(coll: str, count: int, dtype: np.dtype, op: str = "") -> str:
    # Only for messages; cached because str(dtype) is slow Python code in numpy.
    return f"symm {coll} of {count} x {dtype}" + (f" ({op})" if op else "")


_OPS = {o.value: o for o in ReduceOp}


def _op(op) -> ReduceOp:
    got = _OPS.get(op) if isinstance(op, str) else None
    return got or ReduceOp.parse(op if op is not None else "sum")



def _reduce_scatter_args(sendbuf, recvbuf, op, in_place: bool, P: int):
    """(recv, src, n, op) of a Reduce_scatter_block, n the block size, checked alike on
    both paths (in place: the input is recvbuf's P blocks)."""
    recv = _flat(recvbuf, "recvbuf")
    ropt = _op(op)
    if in_place:
        if recv.size % P:
            raise InvalidArgument("Reduce_scatter_block IN_PLACE: recvbuf must hold "
                                  f"{P} blocks, got {recv.size} elements")
        src, n = recv, recv.size // P
    else:
        src, n = _flat(sendbuf, "sendbuf"), recv.size
        if src.size != P * n:
            raise InvalidArgument(f"Reduce_scatter_block: sendbuf needs {P} x {n} = "
                                  f"{P * n} elements, got {src.size}")
    if src.dtype != recv.dtype:
        raise InvalidArgument(f"Reduce_scatter_block: sendbuf dtype {src.dtype} and "
                              f"recvbuf dtype {recv.dtype} must match")
    return recv, src, n, ropt


def _allreduce_args(sendbuf, recvbuf, op, in_place: bool):
    """(recv, src, op) of an Allreduce, flattened and checked alike on both paths."""
    recv = _flat(recvbuf, "recvbuf")
    ropt = _op(op)
    src = recv if in_place else _flat(sendbuf, "sendbuf")
    if src.size != recv.size:
        raise InvalidArgument(f"Allreduce needs equal send and recv sizes, got "
                              f"{src.size} and {recv.size}")
    if src.dtype != recv.dtype:
        raise InvalidArgument(f"Allreduce: sendbuf dtype {src.dtype} and recvbuf dtype "
                              f"{recv.dtype} must match")
    return recv, src, ropt

def allgather(comm, sendbuf, recvbuf, in_place: bool):
    """Rank r's block p of ``recvbuf`` = peer p's ``sendbuf`` (or, in place, peer p's block
    p of its symmetric ``recvbuf``)."""
    P, r = comm.size, comm.rank
    with _telling_peers(comm, "allgather"):
        recv = _flat(recvbuf, "recvbuf")
        if recv.size % P:
            raise InvalidArgument(f"Allgather recvbuf of {recv.size} elements is not a "
                                  f"multiple of the {P} ranks")
        n = recv.size // P
        src = recv[r * n:(r + 1) * n] if in_place else _flat(sendbuf, "sendbuf")
        st = state(comm)
        if (not in_place and st is not None and st.find(src) is None
                and st.find(recv) is not None and src.size == n and src.dtype == recv.dtype):
            # A plain sendbuf, a symmetric recvbuf: our block goes in first, then in place.
            recv[r * n:(r + 1) * n] = src
            src, in_place = recv[r * n:(r + 1) * n], True
        if src.size != n:
            raise InvalidArgument(f"Allgather: sendbuf has {src.size} elements, recvbuf "
                                  f"needs {P} x {src.size} = {P * src.size}, got {recv.size}")
        if src.dtype != recv.dtype:
            raise InvalidArgument(f"Allgather: sendbuf is {src.dtype}, recvbuf {recv.dtype}: "
                                  "they must match")
        # In place, the whole recvbuf is symmetric and peer p's block p is read from it.
        st, (seg, off) = _require(comm, "allgather", recv if in_place else src,
                                  "recvbuf (IN_PLACE)" if in_place else "sendbuf")
    what = _describe("allgather", n, recv.dtype)
    step = n * recv.dtype.itemsize if in_place else 0
    with st.lock:
        st.check_sigs(st.barrier(_sig("allgather", n, recv.dtype.str, seg.index, off,
                                      in_place), what), what)
        if not in_place:
            recv[r * n:(r + 1) * n] = src
        for i in range(1, P):
            p = (r + i) % P
            recv[p * n:(p + 1) * n] = seg.view(p, off + p * step, n, recv.dtype)
        st.barrier(0, what)
    return _done_request(comm, "allgather")


def reduce_scatter(comm, sendbuf, recvbuf, op, in_place: bool):
    """Rank r's ``recvbuf`` = op over every peer's block r of its symmetric ``sendbuf``
    (in place: of its symmetric ``recvbuf``, the result landing in its first block)."""
    P, r = comm.size, comm.rank
    with _telling_peers(comm, "reduce_scatter"):
        recv, src, n, ropt = _reduce_scatter_args(sendbuf, recvbuf, op, in_place, P)
        st, (seg, off) = _require(comm, "reduce_scatter", src,
                                  "recvbuf (IN_PLACE)" if in_place else "sendbuf")
    dt = recv.dtype
    ufunc = _UFUNCS[ropt]
    what = _describe("reduce_scatter", n, dt, ropt.value)
    mine = off + r * n * dt.itemsize
    # In place, peers read our block 0 until the closing barrier: reduce aside first.
    acc = np.empty(n, dt) if in_place else recv
    with st.lock:
        st.check_sigs(st.barrier(_sig("reduce_scatter", n, dt.str, ropt.value, seg.index,
                                      off, in_place), what), what)
        # The first step reads our block and the next peer's at once (no copy pass).
        first = seg.view(r, mine, n, dt)
        if P == 1:
            np.copyto(acc, first)
        for i in range(1, P):
            ufunc(first if i == 1 else acc, seg.view((r + i) % P, mine, n, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.barrier(0, what)
    if in_place:
        recv[:n] = acc
    return _done_request(comm, "reduce_scatter")


def allreduce(comm, sendbuf, recvbuf, op, in_place: bool):
    """Reduce-scatter into the owner's block of the symmetric ``recvbuf``, then allgather
    the blocks from their owners (one-shot up to ONE_SHOT_MAX_NBYTES). A non-symmetric
    ``sendbuf`` is first copied into ``recvbuf`` (then it runs in place)."""
    P, r = comm.size, comm.rank
    with _telling_peers(comm, "allreduce"):
        recv, src, ropt = _allreduce_args(sendbuf, recvbuf, op, in_place)
        st = state(comm)
        rloc = st.find(recv) if st is not None else None
        sloc = rloc if in_place else (st.find(src) if st is not None else None)
        if not in_place and rloc is not None and sloc is None:
            # A plain sendbuf: one local copy into the symmetric recvbuf, then in place.
            # (Nobody reads our recvbuf now: the last symm call ended with a barrier.)
            recv[...] = src
            src, in_place, sloc = recv, True, rloc
        st, (sseg, soff) = _require(comm, "allreduce", src,
                                    "recvbuf (IN_PLACE)" if in_place else "sendbuf", sloc)
        if rloc is None:
            raise InvalidArgument("algorithm='symm' for allreduce needs recvbuf to be (part "
                                  "of) an array from comm.symm_empty() too: peers read the "
                                  "reduced blocks from it; got an ordinary array")
    rseg, roff = rloc
    dt, isz, count = recv.dtype, recv.dtype.itemsize, recv.size
    ufunc = _UFUNCS[ropt]
    what = _describe("allreduce", count, dt, ropt.value)
    with st.lock:
        st.check_sigs(st.barrier(_sig("allreduce", count, dt.str, ropt.value, sseg.index,
                                      soff, rseg.index, roff, in_place), what), what)
        if P == 1:
            recv[...] = src
            st.barrier(0, what)
            return _done_request(comm, "allreduce")
        if recv.nbytes <= ONE_SHOT_MAX_NBYTES:
            # Small: every rank reduces the whole buffer from every peer (one barrier less;
            # rank order, so every rank gets the reference's bits), aside first since
            # peers still read our buffer.
            acc = np.empty(count, dt)
            ufunc(sseg.view(0, soff, count, dt), sseg.view(1, soff, count, dt), out=acc)
            for p in range(2, P):
                ufunc(acc, sseg.view(p, soff, count, dt), out=acc)
            if ropt is ReduceOp.AVG:
                apply_avg(acc, P)
            st.barrier(0, what)
            recv[...] = acc
            return _done_request(comm, "allreduce")
        blocks = _blocks(count, P)
        a, b = blocks[r]
        acc = recv[a:b]       # our block of recv: only we read it in this phase
        first = src[a:b]      # the first step reads ours and the next peer's (no copy)
        for i in range(1, P):
            ufunc(first if i == 1 else acc,
                  sseg.view((r + i) % P, soff + a * isz, b - a, dt), out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        st.barrier(0, what)
        for i in range(1, P):
            p = (r + i) % P
            a, b = blocks[p]
            recv[a:b] = rseg.view(p, roff + a * isz, b - a, dt)
        st.barrier(0, what)
    return _done_request(comm, "allreduce")


__all__ = ["NAME", "SymmState", "alloc", "free", "is_symmetric", "wanted", "segment_path",
           "allgather", "reduce_scatter", "allreduce", "auto_disabled", "auto_staged", "route",
           "SYMM", "STAGED",
           "staged_allgather", "staged_reduce_scatter", "staged_allreduce", "staged_bcast"]
