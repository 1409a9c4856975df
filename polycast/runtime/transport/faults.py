"""Fault injection where multicast datagrams are read: ``POLYCAST_FAULTS``.

    POLYCAST_FAULTS="loss=0.1,dup=0.05,reorder=0.2,replay=0.02,seed=7"

Every datagram a rank reads from a multicast group passes through :class:`Faults` before
the engine sees it, so the real runtime (sockets, processes, the driver) meets the faults
the protocol must survive, not only the in-process test world:

=========== ===================================================================================
``loss``    drop the datagram (probability)
``dup``     deliver it twice
``reorder`` hold it back and deliver it after the next one (or when the socket is drained)
``replay``  also deliver a datagram recorded earlier in this process — usually of an earlier
            collective, sometimes of another communicator (stale: must be dropped)
``seed``    seeds the choices (with the rank), so a run can be repeated
=========== ===================================================================================

Probabilities are in [0, 1); loss must stay below 1 (a rank that never hears anything cannot
finish). :attr:`Faults.counts` says how many of each were injected. Parsed here only; the
driver's :class:`~polycast.runtime.driver.datagrams.MulticastIO` applies it in ``read``.
"""

from __future__ import annotations

import collections
import random

from ...config import read_var
from ...errors import InvalidArgument

ENV = "POLYCAST_FAULTS"
KINDS = ("loss", "dup", "reorder", "replay")
HISTORY = 512               # datagrams remembered for replays


class Faults:
    """Decides, per datagram read, what the engine gets instead."""

    def __init__(self, loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0,
                 replay: float = 0.0, seed: int = 0, rank: int = 0) -> None:
        self.loss, self.dup, self.reorder, self.replay = loss, dup, reorder, replay
        self.seed = seed
        self._rng = random.Random(seed * 1_000_003 + rank)
        self._held: dict[int, collections.deque] = {}
        self._history: collections.deque = collections.deque(maxlen=HISTORY)
        self.counts = {"read": 0, "lost": 0, "duplicated": 0, "reordered": 0, "replayed": 0}

    def __repr__(self) -> str:
        return (f"Faults(loss={self.loss}, dup={self.dup}, reorder={self.reorder}, "
                f"replay={self.replay}, seed={self.seed})")

    def feed(self, comm_id: int, data: bytes, deliver) -> None:
        """One datagram read for ``comm_id``: call ``deliver(comm_id, datagram)`` for what the
        engine gets now (nothing, it, it twice, a replay, held ones)."""
        rng, c = self._rng, self.counts
        c["read"] += 1
        self._history.append(data)
        held = self._held.get(comm_id)
        if self.replay and rng.random() < self.replay and len(self._history) > 1:
            c["replayed"] += 1
            deliver(comm_id, self._history[rng.randrange(len(self._history) - 1)])
        if self.loss and rng.random() < self.loss:
            c["lost"] += 1
        elif self.reorder and rng.random() < self.reorder:
            c["reordered"] += 1
            if held is None:
                held = self._held[comm_id] = collections.deque()
            held.append(data)
            return              # what was held before stays held behind it
        else:
            deliver(comm_id, data)
            if self.dup and rng.random() < self.dup:
                c["duplicated"] += 1
                deliver(comm_id, data)
        if held:
            self.release(comm_id, deliver)

    def release(self, comm_id: int, deliver) -> None:
        """Deliver what was held back for ``comm_id`` (its socket has nothing more now)."""
        held = self._held.get(comm_id)
        while held:
            deliver(comm_id, held.popleft())

    @property
    def injected(self) -> int:
        c = self.counts
        return c["lost"] + c["duplicated"] + c["reordered"] + c["replayed"]


def parse(spec: str, rank: int = 0) -> Faults | None:
    """A :class:`Faults` from ``loss=0.1,dup=0.05,...`` (None for an empty spec)."""
    spec = spec.strip()
    if not spec:
        return None
    values: dict = {}
    for item in spec.split(","):
        key, eq, text = item.strip().partition("=")
        if not eq or key not in KINDS + ("seed",):
            raise InvalidArgument(f"{ENV}={spec!r}: {item.strip()!r} is not KEY=VALUE with KEY "
                                  f"one of {', '.join(KINDS + ('seed',))}")
        try:
            values[key] = int(text) if key == "seed" else float(text)
        except ValueError:
            raise InvalidArgument(f"{ENV}={spec!r}: {key}={text!r} is not a number") from None
        if key != "seed" and not 0 <= values[key] < 1:
            raise InvalidArgument(f"{ENV}={spec!r}: {key} must be a probability in [0, 1)")
    return Faults(rank=rank, **values)


def from_env(rank: int = 0, env=None) -> Faults | None:
    """The faults ``POLYCAST_FAULTS`` in ``env`` (default ``os.environ``) asks for, or None:
    for a process that takes it at start (an offload worker); a rank takes it from its
    configuration (``parse(config.faults, rank)``)."""
    return parse(read_var(ENV, env), rank)
