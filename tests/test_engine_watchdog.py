"""The engine's op-timeout watchdog: one timer for all of an engine's collectives, each
failing at its own deadline (op_timeout_s after its post), none left running for nothing."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather  # noqa: E402

from polycast.engine.actions import CancelTimer, Complete, Fail, SetTimer  # noqa: E402
from polycast.engine.engine import Engine, EngineConfig  # noqa: E402
from polycast.errors import CollectiveTimeout  # noqa: E402


def _timers(acts, kind=SetTimer):
    return [a for a in acts if isinstance(a, kind)]


def test_each_collective_times_out_at_its_own_deadline():
    e = Engine(0, 2, config=EngineConfig(op_timeout_s=10.0))
    sched = ring_allgather(2, 4)                 # rank 1 never answers
    first = _timers(e.post(1, sched, 4, 0.0))
    assert [t.deadline for t in first] == [10.0]
    # a second call while the watchdog runs sets no timer and cancels none
    assert not _timers(e.post(2, sched, 4, 3.0)) + _timers(e.post(3, sched, 4, 3.0),
                                                          CancelTimer)
    out = e.on_timer(first[0].timer, 10.0)
    fails = [a for a in out if isinstance(a, Fail)]
    assert [f.req for f in fails] == [1]
    assert isinstance(fails[0].error, CollectiveTimeout)
    assert "not done after 10 s" in str(fails[0].error)
    again = _timers(out)
    assert [t.deadline for t in again] == [13.0]            # the earliest left
    out = e.on_timer(again[0].timer, 13.0)
    assert sorted(a.req for a in out if isinstance(a, Fail)) == [2, 3]
    assert not _timers(out) and not e.busy and e.stats.timeouts == 3


def test_a_late_fire_fails_only_what_is_due_and_an_early_post_rearms():
    e = Engine(0, 2, config=EngineConfig(op_timeout_s=10.0))
    sched = ring_allgather(2, 4)
    w = _timers(e.post(1, sched, 4, 5.0))[0]
    # a post whose deadline comes first (a clock the caller set back) moves the watchdog
    acts = e.post(2, sched, 4, 1.0)
    assert [t.deadline for t in _timers(acts)] == [11.0]
    assert [c.timer for c in _timers(acts, CancelTimer)] == [w.timer]
    assert e.on_timer(w.timer, 15.0) == []                 # the cancelled one: nothing
    out = e.on_timer(_timers(acts)[0].timer, 11.0)
    assert [a.req for a in out if isinstance(a, Fail)] == [2]
    assert [t.deadline for t in _timers(out)] == [15.0]


def test_completed_collectives_leave_nothing_to_time_out():
    w = World(2, EngineConfig(op_timeout_s=5.0))
    calls = [w.post_call(ring_allgather(2, 8), seed=i) for i in range(3)]
    w.run()
    for c in calls:
        w.check(c)
    # the watchdog fires later, finds nothing due, and stays off
    w.advance(10.0)
    assert not w.errors and all(e.stats.timeouts == 0 for e in w.engines)
    assert all(not t for t in w._timers)


def test_a_single_rank_call_completes_with_the_watchdog_armed_once():
    e = Engine(0, 1, config=EngineConfig(op_timeout_s=10.0))
    from polycast.algorithms import build
    sched = build("allreduce", "recdoubling", 1, 4)
    acts = e.post(1, sched, 4, 0.0)
    assert any(isinstance(a, Complete) for a in acts) and len(_timers(acts)) == 1
    watchdog = _timers(acts)[0].timer
    acts = e.post(2, sched, 4, 1.0)
    assert any(isinstance(a, Complete) for a in acts) and not _timers(acts)
    assert e.on_timer(watchdog, 10.0) == []             # nothing due, nothing re-armed
    acts = e.post(3, sched, 4, 20.0)                    # the next post arms it again
    assert [t.deadline for t in _timers(acts)] == [30.0]
