"""A short GIL switch interval while a communication thread runs beside the user's code.

A collective that overlaps with computation runs on a thread of its own (the symm
worker, :mod:`.symm.queue`). It spends its time in calls that release the GIL (copies,
reductions, futex sleeps) and needs the GIL back after each one, for a few microseconds
of Python. When the user's thread holds the GIL (pure-Python compute; or numpy compute
whose GIL-free stretches are shorter than a wake-up on a busy core), CPython makes the
returning thread wait the switch interval (``sys.getswitchinterval()``, five milliseconds
by default) before it asks the holder to let go. A 64 MiB allreduce takes the GIL back some
ten to a few hundred times, so it crawled while the user computed and ran in ``Wait``
instead: no overlap (bench/overlap.py shows how much of the collective's CPU falls inside
the compute window).

:func:`short_switch` (or :func:`begin_short` / :func:`end_short`) lowers the interval to POLYCAST_SWITCH_US while at least one such job
runs, and puts back what was there when the last one ends. The user's thread is only
interrupted when the communication thread actually waits for the GIL, and then holds it
for those few microseconds. The interval is the interpreter's, so a program that sets its
own meanwhile keeps it (we restore only a value we set ourselves).
"""

from __future__ import annotations

import contextlib
import sys
import threading

from ...config import Config

# The configuration's POLYCAST_SWITCH_US (0 leaves the interval alone), in seconds.
SWITCH_SECONDS = Config.gil_switch_us * 1e-6

_lock = threading.Lock()
_users = 0
_saved: float | None = None      # the interval before the first user, when we lowered it
_set: float = 0.0                # the interval we set then


def begin_short(seconds: float = SWITCH_SECONDS) -> None:
    """One more user of the short interval (the first one lowers it to ``seconds``: its
    job's POLYCAST_SWITCH_US)."""
    global _users, _saved, _set
    with _lock:
        if _users == 0:
            old = sys.getswitchinterval()
            if 0 < seconds < old:
                sys.setswitchinterval(seconds)
                _saved, _set = old, seconds
        _users += 1


def end_short() -> None:
    """One user fewer (the last one puts back the interval it found, unless the program
    set its own meanwhile: a float round-trips through the C setter within 1 us)."""
    global _users, _saved
    with _lock:
        _users -= 1
        if _users == 0 and _saved is not None:
            if abs(sys.getswitchinterval() - _set) < 1e-6:
                sys.setswitchinterval(_saved)
            _saved = None


@contextlib.contextmanager
def short_switch(seconds: float = SWITCH_SECONDS):
    """Run the body with the switch interval at most ``seconds``."""
    begin_short(seconds)
    try:
        yield
    finally:
        end_short()
