"""The symmetric memory of one communicator: its allocations (``symm_empty``), the staging
segment of the ``auto`` path, and its epoch barrier (:mod:`.barrier`)."""

from __future__ import annotations

import collections
import mmap
import os

import numpy as np

from ...errors import InvalidArgument, MismatchError
from ..transport import cma
from ..bootstrap.env import host_id
from ..transport.shm import shm_unavailable_reason
from ... import debug
from .barrier import CTRL_NBYTES, EpochBarrier, describe
from .queue import JobQueue
from .segments import Segment, _close, _map_collectively

# Allreduce up to this size is one-shot (every rank reduces all of it: 2 barriers instead
# of 3); above, reduce-scatter + allgather moves P/2 times fewer bytes per rank.
ONE_SHOT_MAX_NBYTES = 64 << 10
# The ``auto`` path stages a rank's data up to this size in one of two alternating slots
# (see :mod:`.staged`: one barrier a call instead of two). Larger, the barrier matters less
# than the doubled footprint: 4 ranks, 16 MiB allgather (4 MiB a rank), ranks at real-time
# priority: 4 MiB slots 3.08 GB/s, 1 MiB slots (staging segment) 3.59; same below.
SLOT_NBYTES = 1 << 20


class SymmState:
    """The symmetric memory of one communicator: allocations and the barrier block. Its
    communicator's dispatch makes and holds it (polycast.dispatch.call.Dispatch.symm)."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.world_ranks = list(comm.members)
        self.segments: list[Segment] = []
        # The symm collectives run as jobs in posting order (blocking or not): .queue
        self.queue = JobQueue(self)
        self.usable_reason: str | None = None
        self.done: dict = {}            # collective -> its completed request
        self.plans: dict = {}           # a staged call's shape -> its views (.staged._plan)
        self.small: dict = {}           # a compiled slotted call's shape -> .staged._small
        self.nsegments = 0              # allocations made (segment indices stay unique)
        self.nuser = 0                  # symm_empty allocations (their tags: a0, a1, ...)
        # The staging buffer of the auto path for ordinary arrays (see staged_*); while it
        # is being (re)allocated, the object collectives that allocation makes take the
        # engine, so nothing recurses into it.
        self.stage: Segment | None = None
        self.slots: Segment | None = None       # two slots of slot_nbytes (.staged)
        self.slot_nbytes = SLOT_NBYTES          # (tests shrink it before the first call)
        self.growing = False
        self.auto_refused: str | None = None
        # Whether every rank may read every other rank's memory (process_vm_readv: the
        # probes the rings made at connect time), the same answer everywhere.
        got = comm.allgather((host_id(comm.config.host_id), _reads_every_peer(comm),
                              cma.can_write()))
        hosts = [h for h, _, _ in got]
        self.single_copy = all(ok for _, ok, _ in got)
        # and every rank may write every other (a broadcast root's share: .single.bcast)
        self.single_copy_writes = self.single_copy and all(w for _, _, w in got)
        # Calls that took a single-copy form (.single), by collective: what tests count.
        self.single_copy_calls: collections.Counter = collections.Counter()
        self.pids = _pids(comm) if self.single_copy else []
        why = None
        if len(set(hosts)) != 1:
            why = ("symmetric memory needs every rank of the communicator on one host; ranks "
                   f"are on {len(set(hosts))} hosts")
        # The epoch barrier orders data and counters the way the shm rings do: only where
        # the CPU keeps stores in order (same answer on every rank of one host).
        why = why or shm_unavailable_reason()
        if why:
            self.usable_reason = why
            self.bar = EpochBarrier(comm, None)
            self.bar.queue = self.queue
            return
        maps = _map_collectively(comm, CTRL_NBYTES, "ctrl")
        self._ctrl_maps = maps
        self.bar = EpochBarrier(comm, [np.ndarray((CTRL_NBYTES // 8,), np.uint64, m, 0)
                                       for m in maps])
        self.bar.queue = self.queue
        if comm.config.debug_level >= debug.INFO:
            debug.info(comm.rank, describe(comm.config.hooks))

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
            if self.slots is None:
                # The two slots of calls up to slot_nbytes (see .staged), made with the
                # first staging buffer: a step every rank takes at the same call.
                self.slots = self._new_segment(2 * self.slot_nbytes, f"s{self.nsegments}")
                if self.bar.native is not None:
                    self.bar.native.set_slots(self.slots.bases, self.slot_nbytes)
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
        self.queue.close()
        self.bar.native = None          # it holds addresses in the maps closed below
        self.plans.clear()              # their views hold the slots' mappings
        self.small.clear()
        for seg in self.segments:
            for m in seg.maps:
                _close(m)
        self.segments = []
        self.stage = self.slots = None
        if self.bar.ctrl is not None:
            self.bar.ctrl = None
            for m in self._ctrl_maps:
                _close(m)


def _reads_every_peer(comm) -> bool:
    """Whether this rank may read every member's memory single-copy (runtime/transport/cma.py: the
    probe each shm ring's reader made of its writer at connect time; the cma=0 test hook
    says no)."""
    world = getattr(comm._driver, "world", None)
    if world is None or cma.disabled_reason(None, comm.config.hooks.cma) is not None:
        return False
    for w in comm.members:
        if w == world.rank:
            continue
        peer = world.peers.get(w)
        if (peer is None or peer.ring_in is None or not peer.pid
                or w in world.single_copy_refused):
            return False
    return True


def _pids(comm) -> list[int]:
    """The process id of every member, by communicator rank (ours: our own)."""
    world = comm._driver.world
    return [os.getpid() if w == world.rank else world.peers[w].pid for w in comm.members]
