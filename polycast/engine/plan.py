"""What the engine precomputes per (schedule, rank): the step graph, each step's element
runs, and the indexes that match arriving messages and datagrams to steps.

A schedule is data (polycast.schedule.ir); the engine walks a rank's program many times (a
planner reuses schedules across calls, a simulator posts one schedule on thousands of
engines), so everything derived from it that does not depend on the call is made once here
and cached by the engine (see ``Engine._get_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidArgument
from ..schedule.ir import Kind, Schedule


@dataclass
class Plan:
    ndeps: list[int]
    succ: list[list[int]]
    runs: list[tuple]                       # per step: runs of its main region (or ())
    nelems: list[int]
    dst_runs: list[tuple]                   # COPY: destination runs
    recv_index: dict                        # (src, tag) -> step index (RECV)
    streams: dict                           # (root, ordinal) -> step index (MCAST / MRECV)
    peers: frozenset                        # ranks the program talks to point-to-point
    n_mrecv: int
    mcast_nelems: int                       # elements of all its MCAST and MRECV steps
    multicast: bool                         # the schedule multicasts (FIN ring on every rank)
    roots: tuple = ()                       # steps with no dependencies, in order
    send_index: dict = field(default_factory=dict)  # (peer, tag) -> step index (SEND)
    prog: tuple = ()                        # the rank's program (its steps)


_USES_MULTICAST: dict[int, tuple[Schedule, bool]] = {}


def _uses_multicast(schedule: Schedule) -> bool:
    """schedule.uses_multicast scans every rank's program: cached per schedule for the whole
    process, since a simulator posts one schedule on thousands of engines."""
    hit = _USES_MULTICAST.get(id(schedule))
    if hit is not None and hit[0] is schedule:
        return hit[1]
    if len(_USES_MULTICAST) >= 64:
        _USES_MULTICAST.pop(next(iter(_USES_MULTICAST)))
    value = schedule.uses_multicast
    _USES_MULTICAST[id(schedule)] = (schedule, value)
    return value


_RUNS: dict[tuple, tuple] = {}
# ~450 bytes an entry: 16,384 (7 MiB) hold a 1,024-rank schedule's blocks several times over,
# and bound what a long job of many sizes keeps (200,000 grew ~85 MiB before the first clear).
_RUNS_MAX = 16_384


def _runs(layout, blocks: tuple[int, ...]) -> tuple:
    """(layout.runs(blocks), their element count), memoised: the ranks of one schedule
    name the same blocks over and over."""
    key = (layout, blocks)
    hit = _RUNS.get(key)
    if hit is None:
        if len(_RUNS) >= _RUNS_MAX:
            _RUNS.clear()
        runs = tuple(layout.runs(blocks))
        hit = _RUNS[key] = (runs, sum(b - a for a, b in runs))
    return hit


def make_plan(schedule: Schedule, rank: int) -> Plan:
    prog = schedule.program(rank)
    n = len(prog)
    nranks = schedule.nranks
    layouts = schedule.layouts
    ndeps = [len(st.deps) for st in prog]
    succ: list[list[int]] = [[] for _ in range(n)]
    runs, nelems, dst_runs = [], [], []
    recv_index, streams, send_index = {}, {}, {}
    peers = set()
    n_mrecv = mcast_nelems = 0
    SEND, RECV, COPY, MCAST, MRECV = Kind.SEND, Kind.RECV, Kind.COPY, Kind.MCAST, Kind.MRECV
    empty = ((), 0)
    for idx, st in enumerate(prog):
        for d in st.deps:
            if not 0 <= d < idx:
                raise InvalidArgument(f"{schedule.describe()}: rank {rank} step {idx} "
                                      f"depends on step {d}, not an earlier step")
            succ[d].append(idx)
        kind = st.kind
        if st.blocks:
            lay = layouts.get(st.buf)
            if lay is not None:
                lay = lay.on(rank)          # a vector call's buffers differ per rank
            if lay is None:
                raise InvalidArgument(f"{schedule.describe()}: rank {rank} step {idx} names "
                                      f"buffer {st.buf!r}, which has no layout")
            r, ne = _runs(lay, st.blocks)
        else:
            r, ne = empty
        runs.append(r)
        nelems.append(ne)
        if kind is COPY:
            dst_runs.append(_runs(layouts[st.dst].on(rank), st.dst_blocks)[0] if st.dst_blocks else ())
            continue
        dst_runs.append(())
        if kind is MCAST:
            streams[(rank, st.tag)] = idx
            mcast_nelems += ne
            continue
        peer = st.peer
        if not 0 <= peer < nranks or peer == rank:
            raise InvalidArgument(f"{schedule.describe()}: rank {rank} step {idx} has "
                                  f"peer {peer}, not another of {nranks} ranks")
        if kind is RECV:
            recv_index[(peer, st.tag)] = idx
            peers.add(peer)
        elif kind is SEND:
            send_index[(peer, st.tag)] = idx
            peers.add(peer)
        elif kind is MRECV:
            streams[(peer, st.tag)] = idx
            n_mrecv += 1
            mcast_nelems += ne
    return Plan(ndeps, succ, runs, nelems, dst_runs, recv_index, streams, frozenset(peers),
                 n_mrecv, mcast_nelems, bool(streams) or _uses_multicast(schedule),
                 tuple(i for i, d in enumerate(ndeps) if d == 0), send_index, tuple(prog))


def slice_runs(runs, start: int, stop: int) -> tuple[tuple[int, int], ...]:
    """The runs covering elements ``[start, stop)`` of the concatenation of ``runs``."""
    out = []
    pos = 0
    for a, b in runs:
        n = b - a
        lo, hi = max(start, pos), min(stop, pos + n)
        if lo < hi:
            out.append((a + lo - pos, a + hi - pos))
        pos += n
        if pos >= stop:
            break
    return tuple(out)
