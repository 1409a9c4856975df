"""A repeated collective, straight from the comm layer into the compiled replay.

Why: with the replay (replay.py) a small call on the engine path still spent most of a
rank's CPU outside the helper, in Python redone on every call for a call whose shape had not
changed: the comm layer's argument checks and memo, then a Request, ``Buffers.register``,
``Driver.post`` and the replay's glue (bench/floor.py measures the split). On 2 cores four
ranks' CPU is the wall time.

What: once a call on the engine path was replayed whole (``Request.replay`` says so), the
comm layer keeps a :class:`DirectCall` for its shape: collective, algorithm, op or root, the
dtype object and the element counts of its arrays (``Driver.direct_call`` makes it). The
next call of that shape, blocking or its I-variant (which returns a Request; only up to
INLINE_POST_MAX_NBYTES, as an inline post),

* checks its own arguments in a few attribute reads: exact ndarrays, the kept dtype object,
  the kept element counts; the helper then refuses read-only, non-contiguous and (for
  ``disjoint`` calls) overlapping arrays before anything moves;
* hands the arrays to the helper under the progress lock, as ``Driver.post`` would.

Then, like the post's replay:

* **whole**: accounted as a post and its completion would be (``Engine.replayed``); no
  Request is made and nothing is registered;
* **stopped part-way** (anything the helper did not expect): the call gets its Request and
  its registered arrays now, the engine adopts it in the state the helper left it
  (``Replayer.adopt``) and the caller waits on it (an I-variant returns it), so every error
  is the engine's, on every rank;
* **not taken** (an argument or a variable differs, something else is going on in the
  engine or on its rings, a command is queued): False with nothing done, and the caller
  takes the full path, which checks and raises as always.

Nothing here depends on the environment: the communicator's configuration is fixed when it
is made (polycast.config), so a kept shape stays valid for its life.
"""

from __future__ import annotations

import time

import numpy as np

from ...collectives import Collective
from ...errors import PolycastError
from .request import Request

_NDARRAY = np.ndarray
_DONE = 0
_TWO, _BCAST, _BARRIER = "two arrays", "broadcast", "barrier"     # call() by collective


class DirectCall:
    """One kept call shape of one communicator (see the module docstring)."""

    __slots__ = ("d", "cs", "rp", "ent", "schedule", "itemsize", "dtname", "op", "kind", "dtype",
                 "nsend", "nrecv", "tmp", "rank", "timeout_seconds", "inline_ok",
                 "whole", "adopted")

    def __init__(self, driver, cs, ent, shape, send, recv, timeout_seconds: float,
                 tmp_nelems: int | None, inline_ok: bool = True) -> None:
        self.d, self.cs, self.rp, self.ent = driver, cs, cs.replay, ent
        self.schedule, self.itemsize, self.dtname, self.op = shape
        coll = self.schedule.collective
        self.kind = _BCAST if coll is Collective.BROADCAST else \
            _BARRIER if coll is Collective.BARRIER else _TWO
        arr = recv if recv is not None else send
        self.dtype = arr.dtype if arr is not None else None
        self.nsend = -1 if send is None else send.size
        self.nrecv = -1 if recv is None else recv.size
        # The helper's scratch, reused: a call it stops part-way is adopted with this very
        # array, and the next call waits for the engine to be idle (Engine.replay_begin).
        self.tmp = None if tmp_nelems is None else np.empty(tmp_nelems, self.dtype)
        self.rank = cs.engine.rank
        self.timeout_seconds = timeout_seconds
        self.inline_ok = inline_ok          # small enough for its I-variant to run here
        self.whole = 0                      # calls run whole here (tests, benchmarks)
        self.adopted = 0                    # ... begun here, finished by the engine

    # -- the arguments' check, then run -----------------------------------------------------
    def call(self, send, recv, root, nonblocking: bool = False):
        """The call as the dispatch hands it over (polycast.dispatch.call): an allreduce,
        allgather or reduce-scatter's two arrays (the counts kept tell them apart), a
        broadcast's buffer (``recv``) and ``root``, or a barrier's nothing."""
        kind = self.kind
        if kind is _BARRIER:
            return self.run(None, None, False, nonblocking)
        dt = self.dtype
        if kind is _BCAST:
            if type(recv) is not _NDARRAY or recv.dtype is not dt or recv.size != self.nrecv:
                return False
            return self.run(recv if root == self.rank else None, recv, False, nonblocking)
        if type(send) is not _NDARRAY or type(recv) is not _NDARRAY:
            return False
        if send.dtype is not dt or recv.dtype is not dt or send.size != self.nsend \
                or recv.size != self.nrecv:
            return False
        return self.run(send, recv, True, nonblocking)

    # -- the call ---------------------------------------------------------------------------
    def run(self, send, recv, disjoint: bool, nonblocking: bool = False):
        """False: nothing was done; take the full path. Else the call is done (or failed:
        raised here, as Wait raises): True, or with ``nonblocking`` (an I-variant) its
        Request, done already, or the adopted call's, which the engine finishes. The
        I-variant's replay waits for its peers as the post's does (replay.py)."""
        d = self.d
        progress = d.progress
        if progress._cmds or progress.error is not None or nonblocking and not self.inline_ok:
            return False        # posts keep their order; a dead thread is the full path's
        with progress.lock:
            progress._drive_ended = time.monotonic()    # Progress.user_active, inline
            cs = self.cs
            if d._comms.get(cs.id) is not cs:
                return False
            got = self.rp.replay(self.ent, send, recv, self.tmp, disjoint)
            if got is None:
                return False
            reason, done, sent_nb, nrecv, recv_nb, written = got
            req_id = d.new_request_id()
            if reason == _DONE:
                cs.engine.replayed(self.schedule, self.ent.prog, self.itemsize, self.dtname,
                                   self.op, req_id, sent_nb, nrecv, recv_nb)
                self.whole += 1
                if not nonblocking:
                    return True
                request = self._request(req_id)
                request._finish()
                return request
            request = self._adopt(req_id, send, recv, done, written)
        if nonblocking:
            return request
        request.Wait()
        return True

    def _request(self, req_id: int) -> Request:
        sched, rank = self.schedule, self.rank
        return Request(req_id, self.cs.id, lambda: f"rank {rank}: {sched.describe()}",
                       self.timeout_seconds)

    def _adopt(self, req_id: int, send, recv, done: int, written) -> Request:
        """The helper stopped part-way: the call becomes an ordinary request, in the state
        the ``done`` steps and ``written`` pulled SENDs left it (progress lock held)."""
        d, cs, sched, rank = self.d, self.cs, self.schedule, self.rank
        request = self._request(req_id)
        request.driver = d
        d.requests[req_id] = request
        self.adopted += 1
        try:
            d.buffers.register(req_id, sched, rank, send, recv, self.op or None, self.tmp)
        except (PolycastError, ValueError, TypeError) as exc:
            # Not expected (the kept shape passed these checks); the call still has to end
            # on every rank: adopted, then failed as a memory operation that could not run.
            self.rp.adopt(req_id, sched, self.itemsize, self.dtname, self.op, done, written)
            d.runner._memory_failed(cs, req_id, exc)
        else:
            self.rp.adopt(req_id, sched, self.itemsize, self.dtname, self.op, done, written)
        d.peers.flush_all()
        return request
