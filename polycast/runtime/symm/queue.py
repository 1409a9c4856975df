"""Running a communicator's symm collectives in posting order, without blocking the poster.

A symm collective is a *job*: the part after the arguments were checked (copying the
input in, the barriers, the reads and reductions). Jobs of one communicator run one at a
time, in the order they were posted, on whichever thread gets to them first:

* a blocking call (``Allreduce``) runs its job on the calling thread — at once when
  nothing is queued before it (no request, no hand-off: the small-message path), else
  after helping the jobs ahead of it through;
* a non-blocking call (``Iallreduce``) returns a pending :class:`Request` at once and
  wakes the communicator's worker thread, which runs the job while the caller computes;
  ``Wait`` runs queued jobs itself (caller-driven progress, as the driver's) or waits for
  the one the worker is running. The worker leaves a job alone for HANDOFF_SECONDS after
  it was posted: a caller that waits at once (``Iallgather(...).Wait()``, as ``polycast
  bench`` calls) runs it itself, at the blocking call's speed, instead of sleeping while
  the worker runs it with sleeping waits (several times slower for a mid-size call); a
  longer job loses at most that much overlap.

Waking the worker is not free: on a machine with more ranks than cores the woken thread
takes a scheduling round and the GIL from the poster, only to find the job already run
(``bench/peers.py --nonblocking`` times ``Iallreduce().Wait()``). So a *small* job
(one that fits a slot: at most SLOT_NBYTES a rank, well under a millisecond of work) does
not wake a worker that is already looking in short naps: while posts keep coming (within
BURST_SECONDS of the last), the worker looks every LAZY_SECONDS instead of sleeping for
WORKER_IDLE_SECONDS, so a small job nobody waits for starts within LAZY_SECONDS +
HANDOFF_SECONDS. A large job, or the first post after a quiet spell, wakes it at once.

The worker's barrier waits sleep rather than spin (the passive form of the wait policy,
``EpochBarrier.policy``): a spinning worker would take a core, and the GIL, from the
computation it overlaps with. While it runs a job the GIL switch interval is short
(:mod:`..gil`): each return from a copy or a sleep takes the GIL back from the computing
thread within SWITCH_SECONDS instead of CPython's default interval.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

from ...errors import PolycastError
from ..driver import gil
from ..driver import Request

WORKER_IDLE_SECONDS = 0.5     # the worker's nap between looks when nothing is queued
HANDOFF_SECONDS = 500e-6      # how long a posted job waits for its poster before the worker
LAZY_SECONDS = 2e-3           # the worker's look interval during a burst of small posts
BURST_SECONDS = 0.1           # a burst: posts less than this apart


class JobQueue:
    """The symm jobs of one communicator (``SymmState.queue``)."""

    def __init__(self, st) -> None:
        self._st = st
        self._jobs: collections.deque = collections.deque()     # (fn, request, posted at)
        self._run_lock = threading.Lock()        # held while a job runs: one at a time
        self._cv = threading.Condition()          # jobs posted / a job ended / closing
        self._worker: threading.Thread | None = None
        self._closed = False
        # Who needs a notify: the worker while it waits with nothing queued (``_idle``: the
        # length of that wait, 0 when not waiting so), ``drive`` callers while they wait
        # for a job the worker runs (``_drivers``). Nobody else: a notify nobody needs
        # wakes a thread that goes straight back to sleep.
        self._idle = 0.0
        self._drivers = 0
        self._last_post = 0.0

    # -- posting -------------------------------------------------------------------------
    def run_now(self, fn):
        """Run ``fn`` on this thread after every job posted before it; returns its
        result (the blocking path; also the synchronous steps: staging growth, the
        barrier of a rank with bad arguments)."""
        if not self._jobs and self._run_lock.acquire(blocking=False):
            try:
                return fn()
            finally:
                self._run_lock.release()
        box = []
        req = Request(0, self._st.comm.id, "symm call behind queued ones",
                      self._st.comm.timeout_seconds)
        self.submit(lambda: box.append(fn()), req, wake=False)
        req.Wait()
        return box[0]

    def submit(self, fn, request: Request, wake: bool = True, small: bool = False
               ) -> Request:
        """Queue ``fn`` (finishing ``request`` when it returns or raises); ``wake``: have
        the worker start it without anyone waiting (a ``small`` job: within LAZY_SECONDS +
        HANDOFF_SECONDS, without a wake-up when the worker already looks that often)."""
        if self._closed:
            request._finish(PolycastError(f"{request.desc}: the communicator was freed"))
            return request
        request.driver = self
        with self._cv:
            now = time.monotonic()
            self._jobs.append((fn, request, now))
            if wake:
                self._last_post = now
                if self._worker is None:
                    self._worker = threading.Thread(target=self._work, daemon=True,
                                                    name=f"polycast-symm-{self._st.comm.id}")
                    self._worker.start()
                elif self._idle > (LAZY_SECONDS if small else 0.0):
                    self._cv.notify_all()
        return request

    # -- running ---------------------------------------------------------------------------
    def _run_one(self, on_worker: bool) -> bool:
        """Run the oldest job (call with the run lock held); False when none was queued."""
        try:
            fn, req, _ = self._jobs.popleft()
        except IndexError:
            return False
        bar = self._st.bar
        saved = bar.policy
        if on_worker:
            bar.policy = saved.passive()
        try:
            with gil.short_switch(self._st.comm.config.gil_switch_us * 1e-6) if on_worker \
                    else contextlib.nullcontext():
                fn()
        except BaseException as exc:        # handed to the request's waiter
            req._finish(exc)
        else:
            req._finish()
        finally:
            bar.policy = saved
        if self._drivers:           # read after _finish: see drive()
            with self._cv:
                self._cv.notify_all()
        return True

    def drive(self, request: Request, deadline: float) -> None:
        """``Request.Wait``: run queued jobs on this thread until ``request`` is done (or
        wait for the job the worker runs), at most until ``deadline``."""
        while not request._done:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._run_lock.acquire(blocking=False):
                try:
                    ran = self._run_one(on_worker=False)
                finally:
                    self._run_lock.release()
                if ran:
                    continue
            with self._cv:
                if not request._done:
                    # Counted under the lock after the look: a job ending after the look
                    # sees the count and notifies.
                    self._drivers += 1
                    try:
                        self._cv.wait(min(left, 0.05))
                    finally:
                        self._drivers -= 1

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    burst = time.monotonic() - self._last_post < BURST_SECONDS
                    self._idle = LAZY_SECONDS if burst else WORKER_IDLE_SECONDS
                    try:
                        self._cv.wait(self._idle)
                    finally:
                        self._idle = 0.0
                if self._closed and not self._jobs:
                    return
                # The poster may be about to wait: leave it the job for a moment.
                left = self._jobs[0][2] + HANDOFF_SECONDS - time.monotonic()
                if left > 0 and not self._closed:
                    self._cv.wait(left)
                    continue
            with self._run_lock:
                self._run_one(on_worker=True)

    def close(self, timeout: float = 5.0) -> None:
        """Fail what is still queued and end the worker (the communicator is freed)."""
        with self._cv:
            self._closed = True
            jobs, self._jobs = list(self._jobs), collections.deque()
            self._cv.notify_all()
        for _, req, _ in jobs:
            req._finish(PolycastError(f"{req.desc}: the communicator was freed first"))
        w = self._worker
        if w is not None and w is not threading.current_thread():
            w.join(timeout)
