"""Agreement: no rank finishes a call that another rank did not enter.

A rank whose arguments fail its checks never enters the call; it aborts the peers' call
instead (:meth:`polycast.engine.engine.Engine.refuse`). That fails every peer whose
completion waits, directly or through others, on a message of that rank. In an allreduce,
allgather, reduce-scatter, alltoall or barrier every rank's result needs every rank's input,
so every rank waits on every other. A rooted call is different: a broadcast root sends and
is done, gather's senders too; they would report success for a call that failed elsewhere
(and the failed rank's next call would receive their stale data, were it not for sequence
numbers). :func:`agreed` gives such schedules an entry barrier (dissemination: ceil(log2 P)
rounds of control messages, running alongside the data, not before it), so every rank's
completion causally follows every rank's entry, which is what the verifier checks for a
barrier. The cost is those messages: nothing for a large call, the barrier's latency at
most for a small one (a broadcast root then finishes when every rank has entered).
"""

from __future__ import annotations

from ..collectives import Collective
from .builder import number_messages
from .graph import global_order, match_messages
from .ir import Kind, Schedule, Step

# Every rank's result depends on every rank's input: the data already agrees.
_ALL_TO_ALL = frozenset({Collective.ALLREDUCE, Collective.ALLGATHER,
                         Collective.REDUCE_SCATTER, Collective.ALLTOALL, Collective.BARRIER})


def heard_from(s: Schedule) -> list[int]:
    """Per rank, the set (bitmask) of ranks whose entry causally precedes its last step."""
    m = match_messages(s)
    order, stuck = global_order(s, m.sender)
    if stuck:
        return [0] * s.nranks       # a deadlocked schedule: the verifier says why
    know = [[0] * len(p) for p in s.programs]
    for rank, idx in order:
        st = s.programs[rank][idx]
        k = 1 << rank
        for d in st.deps:
            k |= know[rank][d]
        snode = m.sender.get((rank, idx))
        if snode is not None:
            k |= know[snode[0]][snode[1]]
        know[rank][idx] = k
    out = []
    for rank, row in enumerate(know):
        k = 1 << rank
        for v in row:
            k |= v
        out.append(k)
    return out


def agreed(s: Schedule) -> Schedule:
    """``s``, or ``s`` with an entry barrier when some rank could finish without hearing
    from every other (see the module docstring)."""
    P = s.nranks
    if P == 1 or s.collective in _ALL_TO_ALL:
        return s
    full = (1 << P) - 1
    if all(k == full for k in heard_from(s)):
        return s
    return with_barrier(s)


def with_barrier(s: Schedule) -> Schedule:
    """``s`` plus a dissemination barrier of control messages on every rank, independent
    of the data steps (so both progress at once); tags continue each pair's numbering."""
    P = s.nranks
    programs = []
    for r, prog in enumerate(s.programs):
        steps = list(prog)
        prev: tuple[int, ...] = ()
        dist = 1
        while dist < P:
            steps.append(Step(Kind.SEND, (r + dist) % P, deps=prev))
            sig = len(steps) - 1
            steps.append(Step(Kind.RECV, (r - dist) % P, deps=(sig,)))
            prev = (len(steps) - 1,)
            dist <<= 1
        programs.append(steps)
    return Schedule(s.collective, s.algorithm, P, s.root, s.count, s.layouts,
                    number_messages(programs), {**s.options, "agreed": True})
