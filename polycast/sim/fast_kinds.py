"""What the fast path's graph is made of (polycast/sim/fast_walk.py walks it, fast_events.py
runs it through the flow model): node kinds and its refusal."""

from __future__ import annotations

from ..schedule.ir import Kind

# node kinds: a schedule's step kinds, and the FIN a multicast collective's member sends
SEND, RECV, COPY, MCAST, MRECV, FIN = (int(Kind.SEND), int(Kind.RECV), int(Kind.COPY),
                                       int(Kind.MCAST), int(Kind.MRECV), 5)
# a stream later than this many coarse timeouts after its MRECV started would be pulled by
# the engine's recovery (engine/stream.py: SILENT_RTO_FACTOR, less its 0.1 % margin)
SILENT_RTO = 3.99


class Refused(Exception):
    """The fast path does not cover this run; the message says why."""
