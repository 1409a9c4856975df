"""Request.add_done_callback: the runtime's completion hook (polycast.torch's futures)."""

from __future__ import annotations

import threading

from polycast.errors import PeerLost
from polycast.runtime.driver import Request


def test_callback_runs_once_on_finish_and_at_once_when_already_done():
    r = Request(1, 0, "test", 1.0)
    seen = []
    r.add_done_callback(seen.append)
    r.add_done_callback(lambda q: seen.append("second"))
    assert seen == []
    r._finish()
    assert seen == [r, "second"]
    r.add_done_callback(seen.append)          # already done: now, in this thread
    assert seen == [r, "second", r]


def test_callback_sees_the_error():
    r = Request(2, 0, "test", 1.0)
    got = []
    r.add_done_callback(lambda q: got.append(q.error))
    r._finish(PeerLost(1, "gone"))
    assert isinstance(got[0], PeerLost)


def test_no_callback_lost_when_adding_races_finishing():
    for _ in range(200):
        r = Request(3, 0, "test", 1.0)
        seen = []
        t = threading.Thread(target=r._finish)
        t.start()
        r.add_done_callback(seen.append)
        t.join()
        assert seen == [r]
