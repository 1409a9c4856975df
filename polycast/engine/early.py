"""The early buffer: one bounded budget for everything the engine holds before it can use it.

What is held: messages and datagrams of a collective not posted yet (kept here, by sequence
number), and those of a posted collective whose step has not started (kept in the request,
``Request.held`` and ``Stream.held``, but charged here), plus the payload bytes reserved by
a rendezvous CTS granted early. All of it counts against ``max_early_nbytes``
(``stats.early_nbytes`` is the running total, ``stats.early_peak_nbytes`` its peak); each
entry costs its payload plus :data:`ENTRY_OVERHEAD_NBYTES`, except a pulled DATA held unread
(``F_PULL``: its bytes are still in the sender's memory), which costs the overhead alone, as
an RTS does (:func:`try_hold`, :func:`held_cost`).

Datagrams may use only three quarters of the budget: they can be recovered, reliable
messages cannot, so a flood of early datagrams never costs a FIN or a DATA. A reliable
message refused here can never be resent, so the collective it belongs to is marked failed
(``failure(seq)``) and fails as soon as it is posted.
"""

from __future__ import annotations

from .config import EngineStats
from .wire import F_PULL, Header

ENTRY_OVERHEAD_NBYTES = 64          # what one held message costs beyond its payload


class EarlyBuffer:
    """The budget, and the messages and datagrams held for collectives not posted yet."""

    __slots__ = ("limit_nbytes", "stats", "_by_seq", "_failed")

    def __init__(self, limit_nbytes: int, stats: EngineStats) -> None:
        self.limit_nbytes = limit_nbytes
        self.stats = stats
        self._by_seq: dict[int, list] = {}     # seq -> [(is_msg, src, header, payload)]
        self._failed: dict[int, str] = {}       # seq -> why its messages were lost

    def charge(self, cost: int, datagram: bool = False) -> bool:
        """Take ``cost`` bytes of the budget; False (nothing taken) when it does not fit."""
        st = self.stats
        limit = self.limit_nbytes
        if datagram:
            # Datagrams can be recovered, reliable messages cannot: keep a quarter of the
            # budget for messages so a flood of early datagrams never costs a FIN.
            limit -= limit // 4
        if st.early_nbytes + cost > limit:
            return False
        st.early_nbytes += cost
        if st.early_nbytes > st.early_peak_nbytes:
            st.early_peak_nbytes = st.early_nbytes
        return True

    def release(self, cost: int) -> None:
        """Give back ``cost`` bytes taken by :meth:`charge`."""
        self.stats.early_nbytes -= cost

    def release_entry(self, h: Header, payload) -> None:
        """Give back what one entry held by :meth:`hold` cost."""
        self.stats.early_nbytes -= held_cost(h, payload)

    def hold(self, is_msg: bool, src: int, h: Header, payload, nbytes: int,
             next_seq: int) -> None:
        """Keep a message (``is_msg``) or datagram of collective ``h.seq``, not posted yet,
        when the budget allows; ``next_seq`` is the engine's next sequence number (older
        collectives are over: their stragglers are dropped as stale)."""
        seq = h.seq
        # Sequence numbers are u32 and wrap; "behind us" is the half-space below next_seq.
        behind = (next_seq - 1 - seq) & 0xFFFFFFFF
        if next_seq > 0 and behind < 0x80000000:
            self.stats.drop("stale")
            return
        if seq in self._failed:
            self.stats.drop("early_overflow")
            return
        if is_msg and h.flags & F_PULL and self.charge(ENTRY_OVERHEAD_NBYTES):
            if try_hold(payload):               # the sender keeps the bytes until we read
                self.stats.pull_held += 1
                self._by_seq.setdefault(seq, []).append((is_msg, src, h, payload))
                return
            self.release(ENTRY_OVERHEAD_NBYTES)
        if not self.charge(nbytes + ENTRY_OVERHEAD_NBYTES, datagram=not is_msg):
            self.stats.drop("early_overflow")
            if is_msg:
                # A reliable message is never resent: the collective cannot succeed.
                self._failed[seq] = (
                    f"messages of this collective arrived before it was posted and "
                    f"overflowed max_early_nbytes={self.limit_nbytes}")
            return
        self._by_seq.setdefault(seq, []).append((is_msg, src, h, own(payload)))

    def pop(self, seq: int) -> list:
        """The entries held for ``seq`` (still charged: release each with
        :meth:`release_entry`)."""
        return self._by_seq.pop(seq, None) or []

    def drop(self, seq: int) -> None:
        """Give up the entries held for ``seq`` (its collective failed): their budget back,
        and pulled payloads back to their senders unread."""
        for _, _, h, payload in self.pop(seq):
            self.release_entry(h, payload)
            let_go(payload)

    def failure(self, seq: int) -> str | None:
        """Why ``seq``'s messages were lost before it was posted, if they were (once)."""
        return self._failed.pop(seq, None)


def own(payload):
    """A payload the engine keeps for later, as bytes of its own.

    Drivers hand payloads as views into their receive memory (the shm rings hand views into
    the ring, freed when the view dies). A view parked here until its step starts would pin
    that memory and every frame behind it, so the peer's next messages, the very clear-to-
    send or data that lets the step start, could never arrive: copy what is held, not what
    is delivered at once (None, the simulator's payload, stays None). A payload that is not
    memory (the runtime's single-copy ``RemotePayload``) makes its own copy with ``own()``."""
    if payload is None or type(payload) is bytes:
        return payload
    keep = getattr(payload, "own", None)
    if keep is not None:
        return keep()
    return bytes(memoryview(payload).cast("B"))


def try_hold(payload) -> bool:
    """Keep a pulled DATA's payload unread (its bytes stay in the sender's memory until it
    is delivered, :func:`own`-ed or :func:`let_go`); False when its transport cannot (it
    must then be delivered or owned while the frame is handled, as any other)."""
    hold = getattr(payload, "hold", None)
    return hold is not None and hold()


def holding(payload) -> bool:
    """Whether ``payload`` is held unread (:func:`try_hold`)."""
    return getattr(payload, "holding", False)


def held_cost(h: Header, payload) -> int:
    """What a held message costs the budget: its payload and the entry's overhead, or the
    overhead alone while it is held unread."""
    if holding(payload):
        return ENTRY_OVERHEAD_NBYTES
    return h.payload_nbytes + ENTRY_OVERHEAD_NBYTES


def let_go(payload) -> None:
    """A payload held unread will never be read: its sender may reuse its memory."""
    if holding(payload):
        payload.release()
