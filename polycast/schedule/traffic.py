"""Traffic accounting from schedules: what each rank sends and receives, and how many steps.

Numbers come from the schedule itself, not from formulas, so a new algorithm is measured
the moment it is registered. Multicast counts once at the sender (the switches copy) and
once at every receiver. ``switch_link_nbytes`` is the traffic on one non-blocking switch:
a point-to-point message crosses two links (up, down), a multicast one link up and one
down per receiver.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import global_order, match_messages
from .ir import Kind, Schedule


@dataclass(frozen=True)
class Traffic:
    collective: str
    algorithm: str
    nranks: int
    nbytes: int                       # nccl-tests' S: the size algbw divides by
    sent_nbytes: tuple[int, ...]      # per rank, point-to-point + multicast injected
    recv_nbytes: tuple[int, ...]      # per rank
    messages: int                     # point-to-point messages, all ranks (control included)
    multicasts: int                   # multicast steps, all roots
    steps: int                        # most message steps (send/recv/mcast/mrecv) of one rank
    depth: int                        # message hops on the longest dependency chain (latency)
    switch_link_nbytes: int           # bytes over all links of one switch

    @property
    def max_sent(self) -> int:
        return max(self.sent_nbytes, default=0)

    @property
    def max_recv(self) -> int:
        return max(self.recv_nbytes, default=0)


def traffic(schedule: Schedule, itemsize: int = 1) -> Traffic:
    """Account the traffic of ``schedule`` with elements of ``itemsize`` bytes."""
    s = schedule
    P = s.nranks
    sent = [0] * P
    recv = [0] * P
    messages = multicasts = link = steps = 0
    for rank, prog in enumerate(s.programs):
        nmsg = 0
        for st in prog:
            kind = st.kind
            if kind is Kind.COPY:
                continue
            nmsg += 1
            nbytes = s.step_nelems(st, rank) * itemsize
            if kind is Kind.SEND:
                sent[rank] += nbytes
                messages += 1
                link += 2 * nbytes
            elif kind is Kind.MCAST:
                sent[rank] += nbytes
                multicasts += 1
                link += nbytes
            else:                           # RECV, MRECV
                recv[rank] += nbytes
                if kind is Kind.MRECV:
                    link += nbytes
        steps = max(steps, nmsg)
    return Traffic(str(s.collective), s.algorithm, P,
                   s.collective.total_elements(P, s.count) * itemsize, tuple(sent),
                   tuple(recv), messages, multicasts, steps, _depth(s), link)


def _depth(s: Schedule) -> int:
    """Longest chain of messages (each send->receive edge is one hop) along dependencies."""
    sender = match_messages(s).sender
    order, stuck = global_order(s, sender)
    if stuck:
        return -1                           # deadlocks: the verifier says where
    hops = [[0] * len(p) for p in s.programs]
    for rank, idx in order:
        st = s.programs[rank][idx]
        h = max((hops[rank][d] for d in st.deps), default=0)
        snode = sender.get((rank, idx))
        if snode is not None:
            h = max(h, hops[snode[0]][snode[1]] + 1)
        hops[rank][idx] = h
    return max((max(row, default=0) for row in hops), default=0)
