"""A posted collective as the user holds it: ``Wait`` / ``Test`` / ``Waitall`` as mpi4py.

A request is finished by whichever thread carries out the engine's ``Complete`` or ``Fail``
(the progress thread, or a user thread driving progress in ``Wait``). A waiting thread
that can drive progress does so (:meth:`Driver.drive`); otherwise it blocks on an event
made only then.
"""

from __future__ import annotations

import threading
import time
import warnings

from ...errors import CollectiveTimeout, PolycastError

# Guards the callback lists of every request (uncontended: ~0.1 us a request).
_CALLBACK_LOCK = threading.Lock()


def _call_back(fn, request) -> None:
    try:
        fn(request)
    except Exception as exc:        # the progress loop must go on
        warnings.warn(f"polycast: a done-callback of {request.desc} raised {exc!r}",
                      RuntimeWarning, stacklevel=2)


class Request:
    """A posted collective. ``Wait`` / ``Test`` as mpi4py; see :mod:`polycast.comm`.

    ``desc`` may be given as a zero-argument callable: it is only needed for error
    messages, and formatting it on every small call measured ~2 us."""

    __slots__ = ("req", "comm", "_desc", "_done", "_ev", "error", "timeout_seconds",
                 "on_done", "result", "driver", "_callbacks")

    def __init__(self, req: int, comm: int, desc, timeout_seconds: float) -> None:
        self.req, self.comm, self._desc = req, comm, desc
        # A flag, and an Event only for a thread that must block without a driver
        # (threading.Event() costs ~4 us; a driving waiter never needs one).
        self._done = False
        self._ev: threading.Event | None = None
        self.error: BaseException | None = None
        self.timeout_seconds = timeout_seconds
        self.on_done = None          # called with the request in the waiting thread
        self.result = None
        self.driver = None
        self._callbacks: list | None = None

    @property
    def desc(self) -> str:
        d = self._desc
        if not isinstance(d, str):
            d = self._desc = d()
        return d

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done = True
        ev = self._ev                # set after _done: a waiter that made ev sees one of them
        if ev is not None:
            ev.set()
        with _CALLBACK_LOCK:      # after _done: a callback added meanwhile is seen here
            fns, self._callbacks = self._callbacks, None
        if fns:
            for fn in fns:
                _call_back(fn, self)

    def add_done_callback(self, fn) -> None:
        """Call ``fn(request)`` once the request has completed or failed (at once if it
        has), from the thread that finished it: the progress thread, a thread driving
        progress, or the communicator's symm worker. After it, ``Wait``/``Test`` do not
        block; call one of them to finish the call (it raises the request's error and runs
        its last step). Keep ``fn`` short and non-blocking (set an event, queue work): it
        runs inside the progress loop. An exception from it is reported as a warning."""
        with _CALLBACK_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _call_back(fn, self)

    def Test(self) -> bool:
        """True once done (raises the request's error if it failed)."""
        if not self._done:
            return False
        self._finalize()
        return True

    def Wait(self, timeout: float | None = None):
        """Wait for completion, at most ``timeout`` seconds (default: the communicator's
        timeout plus a margin; the engine itself fails requests after that timeout)."""
        if not self._done:
            bound = timeout if timeout is not None else self.timeout_seconds + 5.0
            if self.driver is not None:
                self.driver.drive(self, time.monotonic() + bound)
            else:
                ev = self._ev
                if ev is None:
                    ev = self._ev = threading.Event()
                if not self._done:
                    ev.wait(bound)
            if not self._done:
                raise CollectiveTimeout(f"{self.desc}: not complete after {bound:g} s")
        self._finalize()
        return self.result

    def _finalize(self) -> None:
        if self.error is not None:
            raise self.error
        if self.on_done is not None:
            fn, self.on_done = self.on_done, None
            self.result = fn()

    @staticmethod
    def Waitall(requests, timeout: float | None = None) -> list:
        """Wait for every request (in order); the first error is raised after all ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first = None
        results = []
        for r in requests:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                results.append(r.Wait(left))
            except PolycastError as exc:
                results.append(None)
                first = first or exc
        if first is not None:
            raise first
        return results

    @staticmethod
    def Testall(requests) -> bool:
        return all(r.Test() for r in requests)
