"""A posted call as the user holds it: ``Wait`` / ``Test`` / ``Waitall`` / ``Waitany`` /
``Waitsome`` / ``Cancel`` as mpi4py, and the :class:`Status` a receive fills.

MPI's request states: *active* (posted, not complete), *complete* (``Test`` would say
True), and *null* once a ``Wait`` or ``Test`` has returned it complete (``REQUEST_NULL``:
falsy, equal to :data:`REQUEST_NULL`; a ``Wait`` on it returns at once, again with its
result, and raises its error again if it failed). The multiple-completion calls
(``Waitany``, ``Testany``, ``Waitsome``, ``Testsome``) skip null requests (and inactive
persistent ones, :class:`polycast.Prequest`) and say ``UNDEFINED`` / None when no active
one is left, as MPI does, so a loop over them ends.

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


ANY_SOURCE = -2                 # the engine's wildcards (engine/p2p.py), an empty status's
ANY_TAG = -1
PROC_NULL = -1                  # a peer that makes a call complete at once, empty
UNDEFINED = -32766              # MPI.UNDEFINED: Waitany of no active request, Split color
_EMPTY = (ANY_SOURCE, ANY_TAG, 0)       # MPI's empty status (a null request, a collective)


class Status:
    """What a receive or probe found: source, tag and size (mpi4py's Status)."""

    def __init__(self, status: "Status | None" = None) -> None:
        """An empty status, or a copy of ``status``."""
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"Status({status!r}): expected a Status to copy, or nothing")
        if status is None:
            self.source, self.tag, self.nbytes, self.error = ANY_SOURCE, ANY_TAG, 0, 0
            self.cancelled = False
        else:
            self.source, self.tag, self.nbytes = status.source, status.tag, status.nbytes
            self.error, self.cancelled = status.error, status.cancelled

    def _fill(self, source: int, tag: int, nbytes: int, cancelled: bool = False) -> None:
        # A request that completed: its error is raised, never left in a status.
        self.source, self.tag, self.nbytes, self.error = source, tag, nbytes, 0
        self.cancelled = cancelled

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_error(self) -> int:
        return self.error

    def Get_count(self, datatype=None) -> int:
        """Elements of ``datatype`` (a numpy dtype-like; bytes when None) received
        (UNDEFINED when the bytes are not a whole number of them)."""
        if datatype is None:
            return self.nbytes
        import numpy as np
        size = np.dtype(datatype).itemsize
        return self.nbytes // size if self.nbytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Is_cancelled(self) -> bool:
        """True when the request it came from was cancelled (:meth:`Request.Cancel`)."""
        return self.cancelled

    def Set_source(self, source: int) -> None:
        self.source = source

    def Set_tag(self, tag: int) -> None:
        self.tag = tag

    def Set_error(self, error: int) -> None:
        self.error = error

    def Set_cancelled(self, flag: bool) -> None:
        self.cancelled = bool(flag)

    def Set_elements(self, datatype, count: int) -> None:
        """Say ``count`` elements of ``datatype`` were received (MPI_Status_set_elements)."""
        import numpy as np
        self.nbytes = int(count) * np.dtype(datatype).itemsize

    def __repr__(self) -> str:
        return f"<polycast.Status source={self.source} tag={self.tag} nbytes={self.nbytes}>"

    # mpi4py's property: the count in bytes
    @property
    def count(self) -> int:
        return self.nbytes

    @count.setter
    def count(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)


def _is_null_eq(a, b) -> bool:
    """MPI handle equality: the same request, or both null."""
    return a is b or (a._is_null and getattr(b, "_is_null", False) is True)


class Request:
    """A posted call. ``Wait`` / ``Test`` as mpi4py; see :mod:`polycast.comm`.

    ``Request()`` is a null request (MPI's REQUEST_NULL). ``desc`` may be given as a
    zero-argument callable: it is only needed for error messages, and formatting it on
    every small call was a visible share of a small call's cost. Requests compare as MPI handles (a null request
    equals :data:`REQUEST_NULL`) and, like mpi4py's, are not hashable."""

    __slots__ = ("req", "comm", "_desc", "_done", "_ev", "error", "timeout_seconds",
                 "on_done", "result", "driver", "_callbacks", "status", "_finished",
                 "cancelled", "replay")

    def __init__(self, req: int | None = None, comm: int = -1, desc="REQUEST_NULL",
                 timeout_seconds: float = 0.0) -> None:
        if req is not None and not isinstance(req, int):
            raise TypeError(f"Request({req!r}): polycast requests are not MPI handles to "
                            "copy; use the request itself (Request() is the null request)")
        self.req, self.comm, self._desc = req, comm, desc
        # A flag, and an Event only for a thread that must block without a driver
        # (threading.Event() costs ~4 us; a driving waiter never needs one).
        self._done = req is None                 # Request(): null, complete already
        self._ev: threading.Event | None = None
        self.error: BaseException | None = None
        self.timeout_seconds = timeout_seconds
        self.on_done = None          # called with the request in the waiting thread
        self.result = None
        self.driver = None
        self._callbacks: list | None = None
        self.status = None           # point-to-point receives: (source, tag, nbytes)
        self._finished = req is None  # Wait/Test returned it done: null (REQUEST_NULL)
        self.cancelled = False       # Cancel took it back (a receive nothing matched)
        # (schedule, itemsize, dtype, op) of a collective the compiled replay ran whole:
        # the comm layer may then take the call's next repeats straight there (direct.py)
        self.replay = None

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

    def Wait(self, status=None, timeout: float | None = None) -> bool:
        """Wait for completion, at most ``timeout`` seconds (default: the communicator's
        timeout plus a margin; the engine itself fails requests after that timeout), and
        fill ``status`` when given. Returns True, as mpi4py's ``Wait(status)``;
        :meth:`wait` returns the object an object receive got."""
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
        return True

    def _fill(self, status) -> None:
        # A collective's status, or a null request's, says nothing: MPI's empty status.
        status._fill(*(self.status or _EMPTY), self.cancelled)

    def Cancel(self) -> None:
        """MPI_Cancel. A receive that no message has matched yet completes at once,
        cancelled (its status's ``Is_cancelled()`` is True; nothing was received, the
        message it would have taken goes to the next matching receive). Anything else —
        a matched receive, a send (MPI-4.1 deprecates cancelling sends), a collective —
        is not cancelled and completes as it would: MPI lets a cancel fail that way.
        Either way, Wait/Test/Free it as usual."""
        cancel = getattr(self.driver, "cancel_recv", None)
        if not self._done and cancel is not None:
            cancel(self.comm, self)

    @property
    def _is_null(self) -> bool:
        return self._finished

    @property
    def _inactive(self) -> bool:
        """Skipped by Waitany/Testany/Waitsome/Testsome (MPI: a null request)."""
        return self._finished

    def __bool__(self) -> bool:
        """False once a Wait or Test has finished it (mpi4py's request becomes
        REQUEST_NULL then, and ``if req:`` tells an active request)."""
        return not self._finished

    __eq__ = _is_null_eq
    __hash__ = None              # an MPI handle: equality changes as it completes

    def __reduce__(self):
        raise ValueError(f"{self.desc}: a request cannot be pickled (it is this process's)")

    def _finalize(self) -> None:
        self._finished = True
        if self.error is not None:
            raise self.error
        if self.on_done is not None:
            fn, self.on_done = self.on_done, None
            self.result = fn()

    # mpi4py's lowercase forms (object messages: Wait's result is the object)
    def wait(self, status=None):
        """:meth:`Wait`, returning the request's result (an object receive's object)."""
        self.Wait(status)
        return self.result

    def test(self, status=None):
        done = self.Test(status)
        return done, (self.result if done else None)

    cancel = Cancel

    def Free(self) -> None:
        """Forget the request: it becomes null (an active one still completes; nothing
        waits for it)."""
        self._finished = True

    def Get_status(self, status=None) -> bool:
        """Whether the request is done, without finishing it (filling ``status``)."""
        if self._done and status is not None:
            self._fill(status)
        return self._done

    def get_status(self, status=None) -> bool:
        return self.Get_status(status)

    # -- many requests (mpi4py's class methods; also on Prequest) --------------------------
    @staticmethod
    def Waitall(requests, statuses=None, timeout: float | None = None) -> bool:
        """Wait for every request (in order); the first error is raised after all ended.
        ``statuses``: a list, filled with one Status per request (extended if shorter).
        Returns True (:meth:`waitall`: each request's result, None for a null one)."""
        Request._wait_all(requests, statuses, timeout)
        return True

    @staticmethod
    def _wait_all(requests, statuses, timeout: float | None) -> list:
        deadline = None if timeout is None else time.monotonic() + timeout
        sts = _statuses(statuses, len(requests))
        first = None
        results = []
        for i, r in enumerate(requests):
            st = _at(sts, i)
            if not _live(r):
                if st is not None:
                    st._fill(*_EMPTY)
                results.append(None)
                continue
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                r.Wait(st, timeout=left)
                results.append(_result(r))
            except PolycastError as exc:
                results.append(None)
                first = first or exc
        if first is not None:
            raise first
        return results

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """True, each finished, once every active request is complete; else False and
        none is finished (MPI's Testall)."""
        if not all(r._done for r in requests if _live(r)):
            return False
        Request.Waitall(requests, statuses)
        return True

    @staticmethod
    def Waitany(requests, status=None) -> int:
        """Index of the first active request to complete, finished (MPI's Waitany);
        UNDEFINED when none is active."""
        i = _wait_for_one(requests)
        if i == UNDEFINED:
            if status is not None:
                status._fill(*_EMPTY)
            return UNDEFINED
        requests[i].Wait(status)
        return i

    @staticmethod
    def Testany(requests, status=None) -> tuple[int, bool]:
        """(index, True) of a complete active request, finished; (UNDEFINED, False) when
        none is complete yet; (UNDEFINED, True) when none is active."""
        return _any_done(requests, status, finish=True)

    @staticmethod
    def Waitsome(requests, statuses=None) -> list[int] | None:
        """Indices of the active requests complete once at least one is, each finished
        (MPI's Waitsome); None when none is active. ``statuses``: a list, its k-th entry
        filled for the k-th index (extended if shorter)."""
        if _wait_for_one(requests) == UNDEFINED:
            return None
        return Request.Testsome(requests, statuses)

    @staticmethod
    def Testsome(requests, statuses=None) -> list[int] | None:
        """Indices of the active requests complete now (maybe none), each finished
        (MPI's Testsome); None when none is active."""
        live = [i for i, r in enumerate(requests) if _live(r)]
        if not live:
            return None
        done = [i for i in live if requests[i]._done]
        sts = _statuses(statuses, len(done))
        first = None
        for k, i in enumerate(done):
            try:
                requests[i].Wait(_at(sts, k))
            except PolycastError as exc:    # finish the others, then say it
                first = first or exc
        if first is not None:
            raise first
        return done

    @staticmethod
    def Get_status_any(requests, status=None) -> tuple[int, bool]:
        """:meth:`Testany` without finishing the request (MPI-4.1)."""
        return _any_done(requests, status, finish=False)

    @staticmethod
    def Get_status_all(requests, statuses=None) -> bool:
        """:meth:`Testall` without finishing the requests (MPI-4.1)."""
        if not all(r._done for r in requests if _live(r)):
            return False
        sts = _statuses(statuses, len(requests))
        for i, r in enumerate(requests):
            st = _at(sts, i)
            if st is not None:
                r.Get_status(st) if _live(r) else st._fill(*_EMPTY)
        return True

    @staticmethod
    def Get_status_some(requests, statuses=None) -> list[int] | None:
        """:meth:`Testsome` without finishing the requests (MPI-4.1)."""
        live = [i for i, r in enumerate(requests) if _live(r)]
        if not live:
            return None
        done = [i for i in live if requests[i]._done]
        sts = _statuses(statuses, len(done))
        for k, i in enumerate(done):
            requests[i].Get_status(_at(sts, k))
        return done

    get_status_any = Get_status_any
    get_status_all = Get_status_all
    get_status_some = Get_status_some

    @staticmethod
    def waitall(requests, statuses=None) -> list:
        return Request._wait_all(requests, statuses, None)

    @staticmethod
    def testall(requests, statuses=None):
        done = Request.Testall(requests, statuses)
        return done, ([_result(r) for r in requests] if done else None)

    @staticmethod
    def waitany(requests, status=None):
        """(index, object) of the first lowercase request to complete; (UNDEFINED, None)
        when none is active."""
        i = Request.Waitany(requests, status)
        return i, (None if i == UNDEFINED else _result(requests[i]))

    @staticmethod
    def testany(requests, status=None):
        """(index, flag, object), as :meth:`Testany` with the object received."""
        i, flag = Request.Testany(requests, status)
        return i, flag, (None if i == UNDEFINED else _result(requests[i]))

    @staticmethod
    def waitsome(requests, statuses=None):
        idx = Request.Waitsome(requests, statuses)
        return idx, (None if idx is None else [_result(requests[i]) for i in idx])

    @staticmethod
    def testsome(requests, statuses=None):
        idx = Request.Testsome(requests, statuses)
        return idx, (None if idx is None else [_result(requests[i]) for i in idx])


REQUEST_NULL = Request()
"""MPI's null request: what a finished request equals (``req == REQUEST_NULL``)."""


def _live(r) -> bool:
    """Counts for the multiple-completion calls: active or complete, not yet finished."""
    return r is not None and not r._inactive


def _any_done(requests, status, finish: bool) -> tuple[int, bool]:
    """Testany (``finish``: Wait the request found) / Get_status_any."""
    live = [i for i, r in enumerate(requests) if _live(r)]
    for i in live:
        if requests[i]._done:
            (requests[i].Wait if finish else requests[i].Get_status)(status)
            return i, True
    if not live and status is not None:
        status._fill(*_EMPTY)
    return UNDEFINED, not live


def _result(r):
    return getattr(r, "result", None)


def _statuses(statuses, n: int):
    """``statuses`` with at least ``n`` entries when it is a list (extended, as mpi4py
    does); other sequences are filled as far as they go (see :func:`_at`)."""
    if isinstance(statuses, list) and len(statuses) < n:
        statuses.extend(Status() for _ in range(n - len(statuses)))
    return statuses


def _at(statuses, k: int):
    return statuses[k] if statuses is not None and k < len(statuses) else None


def _wait_for_one(requests) -> int:
    """Index of an active request that is complete (not finished), waiting for one at most
    the longest timeout among them; UNDEFINED when none is active."""
    live = [(i, r) for i, r in enumerate(requests) if _live(r)]
    if not live:
        return UNDEFINED
    deadline = time.monotonic() + max(r.timeout_seconds for _, r in live) + 5.0
    while True:
        for i, r in live:
            if r._done:
                return i
        now = time.monotonic()
        if now > deadline:
            raise CollectiveTimeout(f"Waitany: none of {len(live)} active requests "
                                    f"completed (first: {live[0][1].desc})")
        driving = next((r for _, r in live if r.driver is not None), None)
        if driving is not None:
            driving.driver.drive(driving, now + 0.002)   # progresses every request
        else:
            time.sleep(0.0005)
