"""The epoch barrier of a communicator's symmetric memory.

Each rank stores a descriptor of the call (a signature) and then its epoch in its block of
a small shared control segment, and waits until every peer's epoch has caught up. The
descriptors are compared after the barrier (:meth:`EpochBarrier.check_sigs`), so ranks that
call differently all raise MismatchError; a rank with bad arguments joins as "cannot take
part" (BAD_SIG). Every wait is bounded by the communicator's timeout (CollectiveTimeout
naming the ranks missing) and watches the driver's dead peers (PeerLost naming the rank);
after either, the ranks' epochs disagree, so the barrier refuses further calls
(``broken``). Stores to the control segment are ordered after the data stores by x86-64's
total store order (the shm rings' assumption).

How a wait waits (:meth:`EpochBarrier.wait_for`): as the one wait policy says
(:mod:`..transport.wait`): it polls the peers' slots for a few microseconds (a peer running
on another core arrives within them), then yields the core (to whoever is runnable, with
more ranks than cores usually the peer waited for), then sleeps on the first missing peer's
slot with a futex (:mod:`..futex`), a slice at a time. A rank that publishes a slot wakes
the futex when a peer has said it sleeps (its SLEEP slot). A wake-up lost to a store/load
reordering between those two costs one slice, never a hang. Without futexes (not Linux, the
futex=0 test hook) it naps instead.

The compiled helper (``_symm*.c``, its parts listed in ``_symm.h``; built by pip where a C
compiler exists; the native=0 test hook turns it off) runs the same protocol with release/acquire
ordering and fenced sleep flags: the publish, the poll/yield/sleep of a wait (returning to
this module's loop every sleep slice at most, so the deadline and dead peers are
still checked), and whole small slotted calls (:meth:`EpochBarrier.run_small`). Its layout
is this one: a compiled rank and a Python rank interoperate.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import os
import time

from ..transport import futex, native
from ..transport.wait import Waiter, policy as wait_policy
from ..driver import Request

from ...errors import CollectiveTimeout, MismatchError, PeerLost, PolycastError
from ..bootstrap.report import process_state

CTRL_NBYTES = 4096
EPOCH, SIG0 = 0, 8              # uint64 slots of a rank's control block: epoch, 2 descriptors
PROGRESS = 3                    # slot: chunks a pipelined broadcast's root has staged
SLEEP = 4                       # slot: non-zero while this rank sleeps on a peer's futex
ADDR = 5                        # slot: where a single-copy call's data lies in our memory
ADDR2 = 6                       # slot: and its second array (allreduce: recvbuf)
BAD_SIG = (1 << 64) - 1         # a rank that cannot take part (e.g. a non-symmetric buffer)
# Without futexes a wait naps, from this long, doubling up to the policy's sleep slice.
FIRST_NAP_SECONDS = 20e-6


# The compiled helper, or None and why not (chosen once, at import).
compiled, compiled_why_not = native.load("polycast.runtime.symm._symm",
                                         "the futex and slot layout")
if compiled is not None and not hasattr(compiled.Barrier, "call"):
    # A helper built from an older _symm.c (an in-place build not redone after an update):
    # its layout is the same, its methods are not; the Python protocol runs instead.
    compiled, compiled_why_not = None, ("the built helper is older than its source (rebuild: "
                                        "python setup.py build_ext --inplace)")

# The small calls the compiled helper runs whole (its K_* codes).
K_ALLREDUCE, K_BCAST, K_ALLGATHER, K_REDUCE_SCATTER = 0, 1, 2, 3


def describe(hooks=None) -> str:
    """One line for POLYCAST_DEBUG=INFO and ``polycast doctor`` (``hooks``: the job's test
    hooks, whose native=0 turns the compiled helper off)."""
    if compiled is not None and (hooks is None or hooks.native):
        return "symm barrier and small calls: compiled (polycast.runtime.symm._symm)"
    return ("symm barrier and small calls: pure Python "
            f"({compiled_why_not or 'test hook native=0'})")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def copy_error(rank: int, p: int, what: str, err: int, write: bool) -> PolycastError:
    """The error of a single copy from (``write``: into) rank ``p``'s array that failed
    with errno ``err``: PeerLost when ``p`` is gone (ESRCH)."""
    doing = "writing into" if write else "reading"
    if err == errno.ESRCH:
        return PeerLost(p, f"rank {rank}: {what}: rank {p} exited while {doing} its array")
    return PolycastError(f"rank {rank}: {what}: {doing} rank {p}'s array failed "
                         f"({os.strerror(err)})")


class EpochBarrier:
    """The epoch barrier of one communicator's symmetric memory, in its control segment
    (``ctrl``: one uint64 block per rank, None when symmetric memory is unusable)."""

    def __init__(self, comm, ctrl: list | None) -> None:
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.world_ranks = list(comm.members)
        self.ctrl = ctrl
        self._native = None
        self._epoch = 0
        self._others = [p for p in range(self.size) if p != self.rank]
        # After a barrier timed out or lost a peer, the ranks' epochs no longer agree: a
        # late rank could pass a barrier on a stale epoch and read a buffer in use.
        self._broken: str | None = None
        # How a wait polls, yields, then sleeps (passive on a worker thread: see
        # :mod:`.queue`); futex sleeps where they work here.
        hooks = comm.config.hooks
        self.use_futex = ctrl is not None and hooks.futex and futex.available()
        self.policy = wait_policy(comm.config, self.size)   # every member is on this host
        if self.policy.futex != self.use_futex:
            self.policy = dataclasses.replace(self.policy, futex=self.use_futex)
        self._waitsets: dict = {}           # (rank, slot) -> futex.WaitSet on that slot
        # The compiled hot path (None: this module's Python); it holds the control blocks'
        # addresses, so it is dropped when they are unmapped (SymmState.free).
        self.native = None
        # The compiled helper while it keeps repeated calls (staged._keep_fast arms it): the
        # dispatch hands a call to it first (see the ``fast`` property).
        self._fast = None
        self.queue = None           # the state's job queue (SymmState sets it)
        if ctrl is not None and compiled is not None and hooks.native:
            self.native = compiled.Barrier(self.rank, [c.__array_interface__["data"][0]
                                                       for c in ctrl])

    # The epoch lives in the compiled helper when there is one: its one-call fast path
    # (comm -> Barrier.allreduce/bcast) moves it without Python.
    @property
    def epoch(self) -> int:
        n = self._native
        return self._epoch if n is None else n.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        n = self._native
        if n is None:
            self._epoch = value
        else:
            n.epoch = value

    @property
    def native(self):
        """The compiled hot path, or None (this module's Python)."""
        return self._native

    @native.setter
    def native(self, value) -> None:
        old = self._native
        if old is not None and old is not value:
            self._epoch = old.epoch
            self.fast_off()
        self._native = value
        if value is not None:
            value.epoch = self._epoch

    @property
    def fast(self):
        """The compiled helper while it keeps repeated calls, else None."""
        return self._fast

    @fast.setter
    def fast(self, native) -> None:
        self._fast = native
        # The dispatch's step-1 entry follows it, bound once: a call reaches the helper in
        # one attribute lookup from its method (polycast.dispatch.call.methods).
        self.comm._dispatch.fast = None if native is None else native.call

    @property
    def broken(self) -> str | None:
        return self._broken

    @broken.setter
    def broken(self, why: str | None) -> None:
        self._broken = why
        if why:
            self.fast_off()

    def fast_off(self) -> None:
        """Stop the one-call fast path (dispatch -> the compiled helper) of this
        communicator: every call takes the Python path again, which decides afresh."""
        self.fast = None
        if self._native is not None:
            self._native.disarm()

    def fast_rest(self, got: int) -> None:
        """The rest of a fast call that returned ``got`` (not True/False): n > 0 peers still
        missing (wait in :meth:`wait_for`'s bounded loop, then finish; a single-copy call
        may wait again, at its closing barrier), -1 the descriptors differ (MismatchError on
        every rank), -2 a single-copy call's copy failed (PeerLost when the peer is gone)."""
        native = self._native
        e, what = native.last()
        try:
            while got > 0:
                self.wait_for(self._others, EPOCH, e, what, "did not reach the barrier")
                got = native.finish_pending()
                if got > 0:
                    e, what = native.last()
        except (PeerLost, CollectiveTimeout) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            native.drop_pending()
        if got == -2:
            p, err, wrote = native.cma_error()
            exc = copy_error(self.rank, p, what, err, wrote)
            self.broken = f"{type(exc).__name__}: {exc}"
            raise exc
        if got < 0:
            slot = SIG0 // 8 + (e & 1)
            self.check_sigs([int(c[slot]) for c in self.ctrl], what)

    def fast_request(self, got, coll: str):
        """The request of a non-blocking fast call that returned ``got``: complete (True),
        failed with MismatchError (-1), or pending (n > 0: its wait and copy out are queued
        first in the communicator's job queue, as any symm job: ``Wait`` or the worker
        runs it)."""
        comm = self.comm
        req = Request(0, comm.id, lambda: f"rank {comm.rank}: symm {coll}",
                      comm.timeout_seconds)
        if got is True:
            req._finish()
            return req
        if got < 0:
            try:
                self.fast_rest(got)
            except PolycastError as exc:
                req._finish(exc)
            return req
        return self.queue.submit(lambda: self.fast_rest(got), req, small=True)

    def publish(self, slot: int, value: int) -> None:
        """Store ``value`` in our ``slot`` (after the data: TSO) and wake peers sleeping on
        it."""
        if self.native is not None:
            self.native.publish(slot, value)
            return
        own = self.ctrl[self.rank]
        own[slot] = value
        if self.use_futex:
            ctrl = self.ctrl
            for p in range(self.size):
                if p != self.rank and ctrl[p][SLEEP]:
                    futex.wake(self._addr(self.rank, slot), self.size)
                    return

    def _addr(self, rank: int, slot: int) -> int:
        return self.ctrl[rank].__array_interface__["data"][0] + 8 * slot

    def _refuse_if_broken(self, what: str) -> None:
        if self.broken:
            raise PolycastError(f"rank {self.rank}: {what}: the symmetric memory of this "
                                f"communicator is unusable after an earlier failure "
                                f"({self.broken})")

    def barrier(self, sig: int, what: str) -> list[int]:
        """Publish ``sig`` and wait for every peer's epoch; returns every rank's sig."""
        self._refuse_if_broken(what)
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
        self.publish(EPOCH, e)             # after the descriptor (and the data): TSO
        self.wait_for(self._others, EPOCH, e, what, "did not reach the barrier")
        return [int(c[slot]) for c in self.ctrl]

    def run_small(self, kind: int, sig: int, what: str, src, dst, root: int = 0,
                  dtype_code: int = 0, op_code: int = 0) -> None:
        """A whole small slotted call in the compiled helper (``kind``: K_*): copy ``src``
        into our slot for the next epoch, publish ``sig`` and the epoch, wait for every
        peer, compare the descriptors (MismatchError on every rank when they differ, nothing
        copied out), then copy out into ``dst`` or fold every rank's slot in rank order
        (dtype and op codes: see staged.py). Waits beyond the spin and yields take
        :meth:`wait_for`'s bounded loop."""
        if self.broken:
            self._refuse_if_broken(what)
        self.epoch += 1
        e = self.epoch
        try:
            rc = self.native.start(kind, e, sig, src, dst, root, dtype_code, op_code,
                                   self.policy.c_args)
        except Exception:           # buffers refused before anything was published
            self.epoch -= 1
            raise
        try:
            if rc > 0:
                self.wait_for(self._others, EPOCH, e, what, "did not reach the barrier")
                rc = self.native.finish(kind, e, src, dst, root, dtype_code, op_code)
        except (PeerLost, CollectiveTimeout) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            raise
        if rc < 0:
            slot = SIG0 // 8 + (e & 1)
            self.check_sigs([int(c[slot]) for c in self.ctrl], what)

    def wait_for(self, pending: list[int], slot: int, target: int, what: str,
                 missing: str) -> None:
        """Wait until control slot ``slot`` of every rank in ``pending`` is >= ``target``,
        bounded by the timeout and watching the driver's dead-peer list."""
        ctrl = self.ctrl
        native = self.native
        policy = self.policy
        start = time.monotonic()
        if native is not None:
            # Spin and yields in C; then this loop's checks between bounded sleeps.
            # (callers wait for one peer, or for every other rank)
            only = pending[0] if len(pending) == 1 else -1
            if not native.wait(only, slot, target, policy.c_args, 0.0):
                return
            asleep = policy.passive().c_args
            waiter = None
        else:
            waiter = Waiter(policy, start)
            while True:
                pending = [p for p in pending if int(ctrl[p][slot]) < target]
                if not pending:
                    return
                if waiter.idle():
                    break
        down = getattr(self.comm._driver, "peer_down", None)
        deadline = start + self.comm.timeout_seconds
        slice_ = policy.sleep_slice_seconds
        nap = min(FIRST_NAP_SECONDS, slice_)
        while True:
            pending = [p for p in pending if int(ctrl[p][slot]) < target]
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
            if native is not None:
                native.wait(only, slot, target, asleep,
                            min(deadline - now, slice_) if policy.futex else nap)
            elif policy.futex:
                self._sleep(pending[0], slot, target, min(deadline - now, slice_))
            else:
                time.sleep(nap)
            if not policy.futex:
                nap = min(slice_, nap * 2)

    def _sleep(self, p: int, slot: int, target: int, seconds: float) -> None:
        """Sleep until rank ``p``'s ``slot`` changes (a futex on its low 32 bits), a wake-up,
        or ``seconds``. SLEEP is raised before the last look, so a publisher storing after
        that look sees it and wakes us."""
        ws = self._waitsets.get((p, slot))
        if ws is None:
            ws = self._waitsets[(p, slot)] = futex.WaitSet([(self._addr(p, slot), False)])
        own = self.ctrl[self.rank]
        own[SLEEP] = 1
        try:
            seen = int(self.ctrl[p][slot])
            if seen < target:
                ws.wait([seen & 0xFFFFFFFF], seconds)
        finally:
            own[SLEEP] = 0

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


@functools.lru_cache(maxsize=512)
def call_sig(*parts) -> int:
    """A call's descriptor (cached: the same few calls repeat, and hashing costs ~2 us)."""
    d = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 63) - 1)
