"""torch ``Work`` objects over polycast requests, completed by the engine, not by wait().

A torch call posts one or more polycast requests (most post one) and may need a last
step once they are done (copy a staging buffer into the caller's tensors, convert bf16
back). :class:`Work` holds them and the ``torch.futures.Future`` torch's callers chain
on (DDP's comm hooks, FSDP's prefetch). The future completes when the requests do,
whoever notices first:

* the completion thread (one per process): an asynchronous Work registers a callback on
  each of its requests (:meth:`polycast.Request.add_done_callback`); the last one to
  finish hands the Work to this thread, which runs its last step and completes its
  future, so a Work nobody waits on still completes and runs its future's callbacks as
  soon as the engine is done;
* a thread calling :meth:`Work.wait`, which drives the requests' progress itself (the
  runtime's fast path: no hand-off to another thread on the critical path).

The last step runs exactly once, under the Work's lock, in whichever thread gets there.
"""

from __future__ import annotations

import collections
import datetime
import threading

import torch
import torch.distributed as dist

from ..errors import PolycastError

_MARGIN_SECONDS = 5.0


class Work(dist._Work):
    """One torch call's requests, its last step and its future."""

    def __init__(self, requests: list, finish=None, result=None, *, desc: str = "",
                 timeout_seconds: float = 60.0, source_rank=-1) -> None:
        super().__init__()
        self._requests = requests
        self._finish = finish
        self._result = [] if result is None else result
        self._desc = desc
        self._timeout = timeout_seconds
        self._source = source_rank      # an int, or a function asked once done (recv)
        # torch's Future.set_exception stores the exception as the future's *value*, which
        # C++ readers take for a result: DDP's reducer reads it as a tensor list and
        # crashes (torch 2.13). So the outcome (result or exception) goes into _outcome,
        # and the future handed out is chained from it by a callback that raises the
        # exception: a real error for C++ (its wait() throws) and for Python.
        self._outcome = torch.futures.Future()
        self._future = self._outcome.then(_unwrap)
        self._lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        self._queued = False
        self._pending = 0
        self._pending_lock = threading.Lock()

    # -- completion ---------------------------------------------------------------------
    def _submit(self) -> "Work":
        """Complete the Work as soon as its requests finish, whoever waits (an
        asynchronous call, or one whose future was asked for)."""
        if self._queued or self._done:
            return self
        self._queued = True
        requests = list(self._requests)
        if not requests:
            _COMPLETER.submit(self)
            return self
        self._pending = len(requests)
        for req in requests:
            req.add_done_callback(self._request_done)
        return self

    def _request_done(self, _request) -> None:
        # In the thread that finished the request (often the progress thread, with the
        # driver's lock held): only count, and hand the Work on.
        with self._pending_lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            _COMPLETER.submit(self)

    def _complete(self, timeout_seconds: float | None = None) -> None:
        """Wait for every request (bounded), run the last step once, settle the future."""
        with self._lock:
            if self._done:
                return
            bound = self._timeout + _MARGIN_SECONDS if timeout_seconds is None \
                else timeout_seconds
            error = None
            for req in self._requests:
                try:
                    req.Wait(bound)
                except BaseException as exc:       # every request ends before we report
                    error = error or exc
            if error is None and self._finish is not None:
                try:
                    self._finish()
                except BaseException as exc:
                    error = exc
            self._finish = None
            self._requests = []
            self._error = error
            self._done = True
        # Outside the lock: the future's callbacks may post (and wait on) more work.
        self._outcome.set_result(self._result if error is None else _Failed(error))

    # -- torch's Work interface -----------------------------------------------------------
    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        seconds = None
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
            seconds = timeout.total_seconds()
        self._complete(seconds)
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        self._submit()
        return self._future

    def is_completed(self) -> bool:
        """Never blocks: finishes the Work if its requests are done."""
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False            # another thread is finishing it right now
        try:
            ready = all(r.Test() for r in self._requests)
        except PolycastError:
            ready = True            # failed: _complete records the error
        finally:
            self._lock.release()
        if ready:
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        """The sender of a receive's message (torch's ``dist.recv`` without ``src``
        returns it); -1 for other calls."""
        self.wait()
        return self._source() if callable(self._source) else self._source

    _source_rank = source_rank      # the name torch's Python calls (the C++ one can't see us)

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<polycast.torch.Work {self._desc} {state}>"


class _Failed:
    """A Work's error, as the value of its outcome future (see Work.__init__)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _unwrap(outcome: torch.futures.Future):
    value = outcome.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class _Completer:
    """The completion thread: finishes Works whose requests are all done, in the order
    they became done."""

    def __init__(self) -> None:
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, work: Work) -> None:
        with self._cv:
            self._queue.append(work)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="polycast-torch-completion")
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                work = self._queue.popleft()
            try:
                work._complete()
            except Exception:       # never lose the thread; the Work holds its error
                pass


_COMPLETER = _Completer()


def done_work(result=None, desc: str = "") -> Work:
    """A Work that is already complete (calls that finished before returning)."""
    w = Work([], None, result, desc=desc)
    w._complete()
    return w
