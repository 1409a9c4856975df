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
                 "on_done", "result", "driver", "_callbacks", "status", "_finished")

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
        self.status = None           # point-to-point receives: (source, tag, nbytes)
        self._finished = False       # Wait/Test returned it done: mpi4py's REQUEST_NULL

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

    def Test(self, status=None) -> bool:
        """True once done (raises the request's error if it failed); fills ``status``
        (a :class:`polycast.Status`) when given."""
        if not self._done:
            return False
        self._finalize()
        if status is not None:
            self._fill(status)
        return True

    def Wait(self, status=None, timeout: float | None = None):
        """Wait for completion, at most ``timeout`` seconds (default: the communicator's
        timeout plus a margin; the engine itself fails requests after that timeout), and
        fill ``status`` when given (mpi4py's ``Wait(status)``)."""
        if isinstance(status, (int, float)):
            status, timeout = None, status          # Wait(seconds), polycast's older form
        elif status is not None and not hasattr(status, "_fill"):
            raise TypeError(f"Wait(status): expected a polycast.Status, got {status!r}")
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
        if status is not None:
            self._fill(status)
        return self.result

    def _fill(self, status) -> None:
        # A collective's status says nothing: MPI's empty status.
        status._fill(*(self.status or (-2, -1, 0)))

    def __bool__(self) -> bool:
        """False once a Wait or Test has finished it (mpi4py's request becomes
        REQUEST_NULL then, and ``if req:`` tells an active request)."""
        return not self._finished

    def _finalize(self) -> None:
        self._finished = True
        if self.error is not None:
            raise self.error
        if self.on_done is not None:
            fn, self.on_done = self.on_done, None
            self.result = fn()

    # mpi4py's lowercase forms (object messages: Wait's result is the object)
    def wait(self, status=None):
        return self.Wait(status)

    def test(self, status=None):
        done = self.Test(status)
        return done, (self.result if done else None)

    def Free(self) -> None:
        """Forget the request (it still completes; nothing waits for it)."""

    def Get_status(self, status=None) -> bool:
        """Whether the request is done, without finishing it (filling ``status``)."""
        if self._done and status is not None:
            self._fill(status)
        return self._done

    @staticmethod
    def Waitall(requests, statuses=None, timeout: float | None = None) -> list:
        """Wait for every request (in order); the first error is raised after all ended.
        ``statuses``: a list to fill, one Status per request."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first = None
        results = []
        for i, r in enumerate(requests):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                results.append(r.Wait(statuses[i] if statuses is not None else None,
                                      timeout=left))
            except PolycastError as exc:
                results.append(None)
                first = first or exc
        if first is not None:
            raise first
        return results

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        if not all(r._done for r in requests):
            return False
        Request.Waitall(requests, statuses)
        return True

    @staticmethod
    def Waitany(requests, status=None) -> int:
        """Index of the first request to complete (MPI's Waitany); -1 for none."""
        if not requests:
            return -1
        deadline = time.monotonic() + max(r.timeout_seconds for r in requests) + 5.0
        while True:
            for i, r in enumerate(requests):
                if r._done:
                    r.Wait(status)
                    return i
            now = time.monotonic()
            if now > deadline:
                raise CollectiveTimeout(f"Waitany: none of {len(requests)} requests "
                                        f"completed (first: {requests[0].desc})")
            live = next((r for r in requests if r.driver is not None), None)
            if live is not None:
                live.driver.drive(live, now + 0.002)     # progresses every request
            else:
                time.sleep(0.0005)

    @staticmethod
    def Testany(requests, status=None) -> tuple[int, bool]:
        for i, r in enumerate(requests):
            if r._done:
                r.Wait(status)
                return i, True
        return -1, not requests

    @staticmethod
    def waitall(requests, statuses=None) -> list:
        return Request.Waitall(requests, statuses)

    @staticmethod
    def Waitsome(requests, statuses=None) -> list[int] | None:
        """Indices of the requests done once at least one is (MPI's Waitsome); None when
        the list is empty."""
        if not requests:
            return None
        first = Request.Waitany(requests)
        return Request.Testsome(requests, statuses) or [first]

    @staticmethod
    def Testsome(requests, statuses=None) -> list[int] | None:
        """Indices of the requests done now, each finished (MPI's Testsome)."""
        if not requests:
            return None
        done = [i for i, r in enumerate(requests) if r._done]
        for i in done:
            requests[i].Wait(statuses[i] if statuses is not None and i < len(statuses)
                             else None)
        return done

    @staticmethod
    def waitany(requests, status=None):
        """(index, object) of the first lowercase request to complete."""
        i = Request.Waitany(requests, status)
        return i, (requests[i].result if i >= 0 else None)

    @staticmethod
    def testall(requests, statuses=None):
        done = Request.Testall(requests, statuses)
        return done, ([r.result for r in requests] if done else None)

    @staticmethod
    def waitsome(requests, statuses=None):
        idx = Request.Waitsome(requests, statuses)
        return idx, (None if idx is None else [requests[i].result for i in idx])

    @staticmethod
    def testsome(requests, statuses=None):
        idx = Request.Testsome(requests, statuses)
        return idx, (None if idx is None else [requests[i].result for i in idx])
