"""What a simulation records per rank (both paths fill it): when each request was posted
and completed, and with ``SimConfig.record`` every message as the rank saw it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Interval:
    """One message as a rank saw it (recorded when ``SimConfig.record``)."""
    kind: str            # "send", "mcast", "recv", "mrecv"
    start: float
    end: float
    peer: int            # the other rank (-1: the multicast group)
    nbytes: int


@dataclass
class RankTimeline:
    posted: dict[int, float] = field(default_factory=dict)      # req -> time
    completed: dict[int, float] = field(default_factory=dict)   # req -> time
    intervals: list[Interval] = field(default_factory=list)
