"""How a rank waits for its peers: one policy every waiter follows.

Three kinds of code wait for input from ranks of the same host: a user thread driving
progress (runtime/driver/progress.py) watching its rings, the compiled replay of a kept call
(runtime/driver/_replay.c) watching the rings it reads, and the symmetric-memory barrier
(runtime/symm/barrier.py and _symm_wait.c) watching peers' control slots. Each waits the
same way, in three phases:

1. **spin**: look again at once, without yielding, for a few microseconds (the
   ``wait_busy_us`` test hook) — only where a peer can answer meanwhile: the symmetric-
   memory barrier of ranks that fit the host's cores (:func:`policy` with
   ``ranks_on_host``). With as many ranks as cores a peer answers within the spin and a
   yield's system call would only add to the latency of a small call; with more ranks than
   cores the peer is usually not running and spinning takes its core
   (``polycast bench -n 2`` and ``-n 4 allreduce --sizes 8B`` on 2 cores, with the hook at
   0 and 3, show both);
2. **yield**: look, then ``sched_yield`` (with more ranks than cores the task that runs
   is usually the peer waited for), until the looks whose yield came straight back (the
   core was ours alone: our own CPU) add up to ``yield_seconds``, or until
   ``yield_wall_seconds`` have passed (yields that ran other tasks: a loaded machine);
3. **sleep**: on a futex the peer's write wakes (its ring's data counter, its control
   slot), in slices of at most ``sleep_slice_seconds`` after which the waiter re-checks its
   bound (the call's deadline, dead peers, a replay's hand-over); without futexes a nap.

Sleeping earlier costs a wake-up later (a futex wake and a scheduling round, tens of
microseconds in a VM); yielding longer costs CPU the peers or the caller's computation
could use: with more ranks than cores a yield does not always hand the core to the peer
waited for, so the yield phase is short (a millisecond of it made 4-rank replayed calls
on 2 cores slower than 200 microseconds did; ``polycast bench -n 4 allreduce --algo ring
--sizes 8B`` measures it). A user whose ranks share cores with other work sets
``POLYCAST_WAIT_SPIN_US=0`` (sleep at once); the other numbers are test hooks.

:class:`WaitPolicy` is built once per configuration (:func:`policy`) and handed to every
waiter; the compiled waiters take it as :attr:`WaitPolicy.c_args` and run the same phases
in ``wait.h`` (:class:`Waiter` is their Python twin, for machines without a compiler).
Every wait is bounded: a sleep by the policy's slice, the whole wait by the caller's
deadline (the communicator's POLYCAST_TIMEOUT, a request's, a replay's hand-over), which
the waiter checks between slices.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass

# A yield that took longer than this ran another task: not our spinning (wait.h's
# PC_YIELD_RAN_OTHERS_S).
YIELD_RAN_OTHERS_SECONDS = 10e-6
SPIN, YIELD, SLEEP = 0, 1, 2        # the phases (wait.h's PC_SPIN, PC_YIELD, PC_SLEEP)


@dataclass(frozen=True)
class WaitPolicy:
    """The one wait policy (see the module's docstring for the phases)."""

    spin_seconds: float = 0.0           # busy looks before the first yield (see above)
    yield_seconds: float = 50e-6        # own CPU spent looking and yielding, then sleep
    yield_wall_seconds: float = 200e-6  # the yield phase's bound in wall time
    sleep_slice_seconds: float = 1e-3   # the longest sleep before the waiter looks again
    futex: bool = True                  # sleep on futexes (the futex=0 test hook: naps)

    @classmethod
    def from_config(cls, cfg, spin: bool = False) -> "WaitPolicy":
        """The policy ``cfg`` (a :class:`polycast.config.Config`) asks for:
        POLYCAST_WAIT_SPIN_US and the wait_busy_us (when ``spin``), wait_yield_wall_us and
        futex test hooks; POLYCAST_WAIT_SPIN_US=0 sleeps at once."""
        hooks = cfg.hooks
        own = cfg.wait_spin_us * 1e-6
        if own <= 0:
            return cls(0.0, 0.0, 0.0, futex=hooks.futex)
        busy = max(0.0, hooks.wait_busy_us) * 1e-6 if spin else 0.0
        return cls(busy, own, max(0.0, hooks.wait_yield_wall_us) * 1e-6, futex=hooks.futex)

    def passive(self) -> "WaitPolicy":
        """This policy without spinning or yielding: sleep at once (a worker thread whose
        spinning would take a core, and the GIL, from the computation it overlaps)."""
        return dataclasses.replace(self, spin_seconds=0.0, yield_seconds=0.0,
                                   yield_wall_seconds=0.0)

    @property
    def c_args(self) -> tuple:
        """(spin, yield, yield wall, sleep slice seconds, futex): wait.h's pc_wait_policy
        as the compiled helpers parse it."""
        return (self.spin_seconds, self.yield_seconds, self.yield_wall_seconds,
                self.sleep_slice_seconds, self.futex)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=16)
def policy(cfg, ranks_on_host: int | None = None) -> WaitPolicy:
    """The wait policy of configuration ``cfg``, built once per configuration (and host
    size). A waiter that names ``ranks_on_host`` (the symmetric-memory barrier) spins
    first when those ranks fit the cores; the others start by yielding."""
    fits = ranks_on_host is not None and ranks_on_host <= usable_cores()
    return WaitPolicy.from_config(cfg, spin=fits)


class Waiter:
    """One wait in progress: which phase comes after a look that found nothing (the
    Python twin of wait.h's pc_waiter; restart it when input comes)."""

    __slots__ = ("p", "start", "last", "own")

    def __init__(self, p: WaitPolicy, now: float | None = None) -> None:
        self.p = p
        self.start = self.last = time.monotonic() if now is None else now
        self.own = 0.0

    def phase(self, now: float) -> int:
        """SPIN, YIELD or SLEEP: what the policy says to do now."""
        p = self.p
        waited = now - self.start
        if waited < p.spin_seconds:
            return SPIN
        if self.own < p.yield_seconds and waited < p.spin_seconds + p.yield_wall_seconds:
            return YIELD
        return SLEEP

    def idle(self) -> bool:
        """After a look that found nothing: spin (return at once) or yield the core
        (counting the step as our own CPU when the yield came straight back); True when
        it is time to sleep instead."""
        now = time.monotonic()
        ph = self.phase(now)
        if ph == SPIN:
            return False
        if ph == SLEEP:
            return True
        os.sched_yield()
        after = time.monotonic()
        if after - now < YIELD_RAN_OTHERS_SECONDS:
            self.own += after - self.last
        self.last = after
        return False
