"""Request.add_done_callback under a race (tests/test_nonblocking.py covers its basics):
a callback added while another thread finishes the request runs exactly once."""

from __future__ import annotations

import threading

from polycast.runtime.driver import Request


def test_no_callback_lost_or_doubled_when_adding_races_finishing():
    for _ in range(200):
        r = Request(3, 0, "test", 1.0)
        seen = []
        t = threading.Thread(target=r._finish)
        t.start()
        r.add_done_callback(seen.append)
        t.join()
        assert seen == [r]
