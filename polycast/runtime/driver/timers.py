"""The engines' timers: one heap of deadlines for every communicator of the process.

The engine sets and cancels timers by id (``SetTimer`` / ``CancelTimer``); a timer set
again simply moves. Cancelled and moved entries stay in the heap and are skipped when they
come up (lazy deletion), and are swept out when they outnumber the live ones.
"""

from __future__ import annotations

import heapq
import itertools

# Sweep the heap when it holds this many entries and four times as many as are live.
SWEEP_MIN_ENTRIES = 1024


class Timers:
    """Deadlines (seconds, the driver's monotonic clock) keyed by (communicator, timer)."""

    __slots__ = ("_live", "_heap", "_counter")

    def __init__(self) -> None:
        self._live: dict[tuple[int, int], float] = {}
        self._heap: list = []                 # (deadline, n, comm id, timer id)
        self._counter = itertools.count()

    def set(self, comm_id: int, timer: int, deadline: float) -> None:
        self._live[(comm_id, timer)] = deadline
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._counter), comm_id, timer))
        if len(heap) > SWEEP_MIN_ENTRIES and len(heap) > 4 * len(self._live):
            # Timers set and cancelled often (multicast recovery, pacing, p2p op
            # timeouts): drop the cancelled entries now rather than a minute later.
            live = self._live
            heap[:] = [e for e in heap if live.get((e[2], e[3])) == e[0]]
            heapq.heapify(heap)

    def cancel(self, comm_id: int, timer: int) -> None:
        self._live.pop((comm_id, timer), None)

    def next_deadline(self) -> float | None:
        """The earliest deadline in the heap (perhaps of a cancelled timer), or None."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> tuple[int, int] | None:
        """The next live timer due at ``now`` as (comm id, timer id), removed; None when
        no more are due. Call it in a loop: firing a timer may set others."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, _, comm_id, timer = heapq.heappop(heap)
            key = (comm_id, timer)
            if self._live.get(key) != deadline:
                continue            # moved or cancelled
            del self._live[key]
            return key
        return None
