"""The epoch barrier of a communicator's symmetric memory.

Each rank stores a descriptor of the call (a signature) and then its epoch in its block of
a small shared control segment, and waits (yielding, then sleeping with a growing nap)
until every peer's epoch has caught up. The descriptors are compared after the barrier
(:meth:`EpochBarrier.check_sigs`), so ranks that call differently all raise
MismatchError; a rank with bad arguments joins as "cannot take part" (BAD_SIG). Every wait
is bounded by the communicator's timeout (CollectiveTimeout naming the ranks missing) and
watches the driver's dead peers (PeerLost naming the rank); after either, the ranks' epochs
disagree, so the barrier refuses further calls (``broken``). Stores to the control segment
are ordered after the data stores by x86-64's total store order (the shm rings' assumption).
"""

from __future__ import annotations

import hashlib
import os
import time

from ...errors import CollectiveTimeout, MismatchError, PeerLost, PolycastError
from ..report import process_state

CTRL_NBYTES = 4096
EPOCH, SIG0 = 0, 8              # uint64 slots of a rank's control block: epoch, 2 descriptors
PROGRESS = 3                    # slot: chunks a pipelined broadcast's root has staged
BAD_SIG = (1 << 64) - 1         # a rank that cannot take part (e.g. a non-symmetric buffer)
# Poll with sched_yield this long, then nap (growing to MAX_NAP_SECONDS). A yield hands the
# core to a peer that has not arrived yet; 4 ranks on 2 cores, 16-element allreduce: 0 ->
# 386 us, 50 us -> 281, 200 us -> 127-314 (noisy), 1 ms -> 120, 5 ms -> 120.
YIELD_SECONDS = 1e-3
MAX_NAP_SECONDS = 1e-3


class EpochBarrier:
    """The epoch barrier of one communicator's symmetric memory, in its control segment
    (``ctrl``: one uint64 block per rank, None when symmetric memory is unusable)."""

    def __init__(self, comm, ctrl: list | None) -> None:
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.world_ranks = list(comm.members)
        self.ctrl = ctrl
        self.epoch = 0
        # After a barrier timed out or lost a peer, the ranks' epochs no longer agree: a
        # late rank could pass a barrier on a stale epoch and read a buffer in use.
        self.broken: str | None = None
        # How long a wait yields the core before it naps (0 on a worker thread: see
        # :mod:`.queue`).
        self.yield_seconds = YIELD_SECONDS

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
                    "symmetric buffers?)" + self._notes(pending))
            if now - start < self.yield_seconds:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(MAX_NAP_SECONDS, nap * 2)

    def _notes(self, pending: list[int]) -> str:
        """"; rank 2 is stopped (...)" for pending ranks whose process explains it."""
        peers = self.comm._driver.world.peers
        out = ""
        for p in pending:
            peer = peers.get(self.world_ranks[p])
            state = process_state(peer.pid) if peer is not None and peer.pid else None
            if state:
                out += f"; rank {p} {state}"
        return out

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


def call_sig(*parts) -> int:
    d = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 63) - 1)
