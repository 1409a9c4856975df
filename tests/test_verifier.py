"""The verifier on hand-broken schedules: each breakage must raise ScheduleError naming the
problem (and where it is). Every test first checks that the unbroken schedule verifies, so
the failure comes from the edit."""

from __future__ import annotations

import dataclasses

import pytest

from polycast.algorithms.registry import build
from polycast.collectives import Collective
from polycast.errors import ScheduleError
from polycast.schedule.builder import Builder
from polycast.schedule.ir import Kind, Layout, Schedule, Step
from polycast.schedule.verify import verify


def _good(*args, **kw) -> Schedule:
    s = build(*args, **kw)
    verify(s)
    return s


def _edit(s: Schedule, rank: int, fn) -> Schedule:
    """``s`` with ``rank``'s program replaced by ``fn(list of its steps)``."""
    progs = list(s.programs)
    progs[rank] = tuple(fn(list(progs[rank])))
    return dataclasses.replace(s, programs=tuple(progs))


def _drop(prog: list[Step], idx: int) -> list[Step]:
    """Remove step ``idx``, renumbering the deps of later steps (deps on it vanish)."""
    out = []
    for i, st in enumerate(prog):
        if i == idx:
            continue
        deps = tuple(d - (d > idx) for d in st.deps if d != idx)
        out.append(dataclasses.replace(st, deps=deps))
    return out


def _index(prog: list[Step], kind: Kind, peer: int | None = None, nth: int = 0) -> int:
    hits = [i for i, st in enumerate(prog) if st.kind is kind and peer in (None, st.peer)]
    return hits[nth]


def _broken(s: Schedule, match: str) -> str:
    with pytest.raises(ScheduleError, match=match) as err:
        verify(s)
    return str(err.value)


# ------------------------------------------------------------------------ messages


def test_dropped_receive():
    s = _good("broadcast", "chain", 4, 8)             # 0 -> 1 -> 2 -> 3
    bad = _edit(s, 2, lambda p: _drop(p, _index(p, Kind.RECV, 1)))
    msg = _broken(bad, "never matched")
    assert "1 sends 1->2 but 0 receives" in msg and "rank 1 step" in msg


def test_wrong_peer():
    s = _good("broadcast", "chain", 4, 8)
    bad = _edit(s, 1, lambda p: [dataclasses.replace(st, peer=3) if st.kind is Kind.SEND
                                 else st for st in p])
    msg = _broken(bad, "never matched")
    assert "sends 1->3 but 0 receives" in msg or "0 sends 1->2 but 1 receives" in msg


def test_receive_of_the_wrong_size():
    s = _good("broadcast", "direct", 2, 5, nchunks=2)   # pieces of 2 and 3 elements
    # rank 1 puts the 2-element piece 0 into the 3-element block 1 and vice versa
    def swap(p):
        return [dataclasses.replace(st, blocks=(1 - st.blocks[0],)) for st in p]
    msg = _broken(_edit(s, 1, swap), "block 1 has 3 elements but the matching send's "
                                     "block 0 has 2")
    assert "rank 1 step 0" in msg


def test_multicast_not_received():
    s = _good("broadcast", "mcast", 3, 6)
    bad = _edit(s, 2, lambda p: _drop(p, _index(p, Kind.MRECV)))
    msg = _broken(bad, "does not receive the 1 multicasts of root 0")
    assert "rank 2" in msg


# ------------------------------------------------------------------------ ordering


def test_missing_dependency_is_a_race():
    s = _good("broadcast", "chain", 3, 8)             # rank 1: recv from 0, send to 2
    bad = _edit(s, 1, lambda p: [dataclasses.replace(st, deps=()) for st in p])
    msg = _broken(bad, "concurrently with step 0 writing it")
    assert "add a dependency" in msg and "rank 1 step 1" in msg


def test_overwrite_while_sending_is_a_race():
    s = _good("alltoall", "bruck", 4, 2)              # tmp parts are received in place
    def strip(p):
        i = _index(p, Kind.RECV)                      # the first round's receive
        return [dataclasses.replace(st, deps=()) if j == i else st for j, st in enumerate(p)]
    msg = _broken(_edit(s, 0, strip), "may still be reading it|concurrently")
    assert "'tmp'" in msg and "rank 0" in msg


def test_cycle_is_a_deadlock():
    # Two ranks that each wait for the other's message before sending their own.
    def prog(peer: int):
        return (Step(Kind.RECV, peer, tag=0), Step(Kind.SEND, peer, deps=(0,), tag=0))
    s = dataclasses.replace(_good("barrier", "dissemination", 2, 0),
                            programs=(prog(1), prog(0)))
    msg = _broken(s, "deadlock")
    assert "rank 0 step 0" in msg and "rank 1 step 0" in msg


def test_dependency_on_a_later_step():
    s = _good("broadcast", "chain", 3, 8)
    bad = _edit(s, 1, lambda p: [dataclasses.replace(p[0], deps=(1,))] + p[1:])
    _broken(bad, "depends on step 1, which is not an earlier step")


# ------------------------------------------------------------------------ data


def test_forwarding_before_receiving_sends_data_not_held():
    s = _good("broadcast", "chain", 3, 8)
    def swap(p):                                      # send first; receive after it
        r, snd = p[_index(p, Kind.RECV)], p[_index(p, Kind.SEND)]
        return [dataclasses.replace(snd, deps=()), dataclasses.replace(r, deps=(0,))]
    msg = _broken(_edit(s, 1, swap), "which it does not hold")
    assert "rank 1 step 0 (send peer 2)" in msg and "'recv'" in msg


def test_non_root_sending_from_its_nominal_input():
    s = _good("broadcast", "chain", 3, 8)
    bad = _edit(s, 1, lambda p: [dataclasses.replace(st, buf="send", deps=())
                                 if st.kind is Kind.SEND else st for st in p])
    _broken(bad, r"sends block 0 of 'send', which it does not hold")


def test_double_counted_contribution():
    s = _good("reduce", "chain", 3, 8)
    # the root adds its own input once more at the end
    bad = _edit(s, 0, lambda p: p + [Step(Kind.COPY, -1, "send", (0,), True,
                                          (len(p) - 1,), "recv", (0,))])
    msg = _broken(bad, r"counts the contribution of rank\(s\) \[0\] twice")
    assert "rank 0 step" in msg


def test_lost_contribution():
    s = _good("reduce", "chain", 3, 8)
    # the root overwrites instead of combining: rank 0's own input is lost
    bad = _edit(s, 0, lambda p: [dataclasses.replace(st, reduce=False)
                                 if st.kind is Kind.RECV else st for st in p])
    _broken(bad, r"recv block 0 ends holding input block 0 of rank\(s\) \[1, 2\] instead "
                 r"of input block 0 of all ranks")


def test_wrong_final_data():
    s = _good("broadcast", "direct", 3, 4, nchunks=2)
    # rank 2 puts piece 0 where piece 1 belongs and vice versa (sizes are equal)
    def swap(p):
        return [dataclasses.replace(st, blocks=(1 - st.blocks[0],)) if st.kind is Kind.RECV
                else st for st in p]
    msg = _broken(_edit(s, 2, swap), r"recv block 0 ends holding input block 1 of "
                                     r"rank\(s\) \[0\] instead of input block 0")
    assert "rank 2" in msg


def test_missing_final_data():
    s = _good("broadcast", "direct", 3, 4)
    bad = _edit(_edit(s, 0, lambda p: _drop(p, _index(p, Kind.SEND, 2))),
                2, lambda p: _drop(p, _index(p, Kind.RECV, 0)))
    msg = _broken(bad, "ends holding nothing")
    assert "rank 2" in msg


def test_reduction_in_a_collective_without_op():
    s = _good("broadcast", "chain", 3, 8)
    bad = _edit(s, 2, lambda p: [dataclasses.replace(st, reduce=True) for st in p])
    _broken(bad, "broadcast has no reduction op")


def test_block_out_of_range():
    s = _good("broadcast", "chain", 3, 8, nchunks=2)
    bad = _edit(s, 2, lambda p: [dataclasses.replace(p[0], blocks=(5,))] + p[1:])
    _broken(bad, r"block 5 of 'recv' out of range 0\.\.1")


# ------------------------------------------------------------------------ barrier


def test_barrier_where_a_rank_leaves_early():
    s = _good("barrier", "dissemination", 4, 0)
    # without the chain of dependencies a signal vouches only for its sender
    progs = tuple(tuple(dataclasses.replace(st, deps=()) for st in p) for p in s.programs)
    msg = _broken(dataclasses.replace(s, programs=progs),
                  r"can leave the barrier before rank\(s\) \[1\] entered")
    assert "rank 0" in msg


def test_barrier_missing_a_round():
    s = _good("barrier", "dissemination", 5, 0)       # rounds of distance 1, 2, 4
    progs = tuple(tuple(p[:4]) for p in s.programs)   # drop the distance-4 round everywhere
    _broken(dataclasses.replace(s, programs=progs), "can leave the barrier before")


# ------------------------------------------------- gaps found by these tests, now closed


def test_writing_the_input_is_rejected():
    lay = Layout(4)
    b = Builder(Collective.ALLREDUCE, 2, 0, 4, "t", {"send": lay, "recv": lay})
    for r in (0, 1):
        b.send(r, 1 - r, "send", (0,))
    for r in (0, 1):
        b.recv(r, 1 - r, "send", (0,), reduce=True)   # reduces into its own input
        b.copy(r, "send", (0,), "recv", (0,))
    _broken(b.build(), "send")


def test_inconsistent_tags_are_rejected():
    s = _good("broadcast", "chain", 2, 4, nchunks=2)
    def swap(p):
        i, j = _index(p, Kind.SEND, nth=0), _index(p, Kind.SEND, nth=1)
        p[i], p[j] = dataclasses.replace(p[i], tag=1), dataclasses.replace(p[j], tag=0)
        return p
    # (a fix may check tags, or match by tag and then find the pieces swapped)
    _broken(_edit(s, 0, swap), "tag|ends holding")


def test_layout_smaller_than_the_buffer_is_rejected():
    lay = Layout(2)                                    # the call is for 4 elements
    b = Builder(Collective.BROADCAST, 2, 0, 4, "t", {"send": lay, "recv": lay})
    b.copy(0, "send", (0,), "recv", (0,))
    b.send(0, 1, "send", (0,))
    b.recv(1, 0, "recv", (0,))
    _broken(b.build(), "elements|count|size")


def test_non_root_use_of_recv_in_reduce_is_rejected():
    lay = Layout(4)
    b = Builder(Collective.REDUCE, 2, 0, 4, "t", {"send": lay, "recv": lay})
    b.copy(1, "send", (0,), "recv", (0,))        # rank 1 has no recv buffer in a reduce
    b.send(1, 0, "recv", (0,))
    b.copy(0, "send", (0,), "recv", (0,))
    b.recv(0, 1, "recv", (0,), reduce=True)
    _broken(b.build(), "only at the root")
