"""Carrying out the engine's actions: memory, peer frames, datagrams, timers, requests.

``Send`` becomes a frame queued to a peer (:class:`PeerIO`), ``Multicast`` a datagram and
``MulticastChunks`` a stream's datagrams (:class:`MulticastIO`), ``Deliver`` / ``Copy``
memory operations on the request's arrays (:class:`polycast.memory.Buffers`), ``SetTimer``
/ ``CancelTimer`` entries of :class:`Timers`, ``Complete`` / ``Fail`` the end of a user's
:class:`Request`.
"""

from __future__ import annotations

import collections
import time

import numpy as np

from ...engine.actions import (CancelTimer, Complete, Copy, Deliver, Fail, Matched, Multicast,
                               MulticastChunks, Send, SetTimer)
from ...engine.early import let_go
from ...engine.mcast import chunk_datagrams
from ...engine.wire import MsgKind
from ...memory import Buffers
from .datagrams import MulticastIO
from .peers import PeerIO
from .timers import Timers


# Kinds whose payload the receiving engine only delivers or keeps (engine.early.own): the
# transport may hand it a payload that reads the sender's memory (runtime/transport/cma.py).
_LAZY_OK = frozenset((MsgKind.DATA, MsgKind.P2P_DATA))


class CommState:
    """One communicator as the driver holds it: its engine and its members' world ranks."""

    __slots__ = ("id", "engine", "members", "local_of", "mcast_error", "replay")

    def __init__(self, comm_id: int, engine, members: list[int]) -> None:
        self.id, self.engine, self.members = comm_id, engine, members
        self.local_of = {w: i for i, w in enumerate(members)}
        self.mcast_error: str | None = None
        self.replay = None          # its compiled replays (driver/replay.py), when in use


class ActionRunner:
    """Runs engine action lists in order. Actions of engine calls made while a list is
    being carried out wait behind the rest of it (the engine's contract)."""

    def __init__(self, buffers: Buffers, requests: dict, peers: PeerIO, mcast: MulticastIO,
                 timers: Timers, secret: bytes | None, mcast_requests: set,
                 on_action=None) -> None:
        self.buffers, self.requests = buffers, requests
        self.mcast_requests = mcast_requests
        self.peers, self.mcast, self.timers = peers, mcast, timers
        self.secret = secret
        self.on_action = on_action          # fn(cs, action) for actions not handled here
        self._in_run = False
        self._queued: collections.deque = collections.deque()
        self.allocate: set[int] = set()     # receives whose buffer is made on Matched
        self.finished = 0       # requests ended (completed or failed): Progress's wake-ups

    def run(self, cs: CommState, actions) -> None:
        if not actions:
            return          # most send-done events (and many messages) ask for nothing
        if self._in_run:
            self._queued.append((cs, actions))
            return
        self._in_run = True
        try:
            self._run_list(cs, actions)
            while self._queued:
                qcs, qactions = self._queued.popleft()
                self._run_list(qcs, qactions)
        finally:
            self._in_run = False
            self._queued.clear()

    def _run_list(self, cs: CommState, actions) -> None:
        bufs = self.buffers
        for a in actions:        # engine calls made meanwhile queue in _queued
            t = type(a)
            if t is Deliver:
                if a.region.req in bufs:
                    try:
                        bufs.deliver(a.region, a.payload, a.reduce)
                    except Exception as exc:        # fails the request, never the thread
                        let_go(a.payload)
                        self._memory_failed(cs, a.region.req, exc)
                else:
                    let_go(a.payload)   # its request failed meanwhile: never to be read
            elif t is Send:
                self._send(cs, a)
            elif t is Copy:
                if a.src.req in bufs:
                    try:
                        bufs.copy(a.src, a.dst, a.reduce)
                    except Exception as exc:
                        self._memory_failed(cs, a.src.req, exc)
            elif t is Multicast:
                self._multicast(cs, a)
            elif t is MulticastChunks:
                self._multicast_chunks(cs, a)
            elif t is SetTimer:
                self.timers.set(cs.id, a.timer, a.deadline)
            elif t is CancelTimer:
                self.timers.cancel(cs.id, a.timer)
            elif t is Complete:
                self.complete(a.req)
            elif t is Fail:
                self.fail_request(a.req, a.error)
            elif t is Matched:
                self._matched(a)
            elif self.on_action is not None:
                self.on_action(cs, a)

    def complete(self, req_id: int) -> None:
        """A request completed: its result final, its buffers let go, its caller told."""
        bufs = self.buffers
        bufs.finalize(req_id)
        bufs.unregister(req_id)
        self.mcast_requests.discard(req_id)
        req = self.requests.pop(req_id, None)
        if req is not None:
            self.finished += 1
            req._finish()

    def _memory_failed(self, cs: CommState, req_id: int, exc: Exception) -> None:
        """A memory operation of a request raised (a buffer that cannot take the data, an
        op the dtype cannot take): that request fails, here and on every peer; the
        progress thread and every other request go on."""
        self.buffers.unregister(req_id)         # the request's remaining actions skip
        self.run(cs, cs.engine.abort(req_id, f"its data could not be placed: "
                                     f"{type(exc).__name__}: {exc}", time.monotonic()))

    def _matched(self, a: Matched) -> None:
        """A receive took a message: its status, and its buffer when it had none."""
        req = self.requests.get(a.req)
        if req is not None:
            req.status = (a.source, a.tag, a.nbytes)
        if a.req in self.allocate:
            self.allocate.discard(a.req)
            buf = np.empty(a.nbytes, np.uint8)
            self.buffers.register_arrays(a.req, recv=buf)
            if req is not None:
                req.result = buf

    def fail_request(self, req_id: int, error: BaseException) -> None:
        self.allocate.discard(req_id)
        self.buffers.unregister(req_id)
        self.mcast_requests.discard(req_id)
        req = self.requests.pop(req_id, None)
        if req is not None:
            self.finished += 1
            req._finish(error)

    def _send(self, cs: CommState, a: Send) -> None:
        if a.payload is not None and a.payload.nbytes:
            if a.payload.req not in self.buffers:
                return      # its request failed meanwhile: a header without its data
                #             would only make the peer fail on a short payload
            views = [self.buffers.gather(a.payload)]
            nbytes = a.payload.nbytes
        elif a.data:
            views, nbytes = [a.data], len(a.data)
        else:
            views, nbytes = [], 0
        hdr = a.header.pack(self.secret, views) if self.secret else a.header.pack()
        if not self.peers.send(cs.members[a.peer], hdr, views, nbytes, (cs.id, a.token),
                               a.header.kind in _LAZY_OK):
            # The engine learns of the loss separately; the bytes have nowhere to go.
            self.run(cs, cs.engine.on_send_done(a.token, time.monotonic()))

    def _multicast_chunks(self, cs: CommState, a: MulticastChunks) -> None:
        if not self.mcast.joined(cs.id) or a.payload.req not in self.buffers:
            return
        if self.mcast.sends_chunks:         # the helper builds and sends them
            self.mcast.send_chunks(cs.id, a, self.buffers, self.secret)
            return
        for d in chunk_datagrams(a):
            self._multicast(cs, d)

    def _multicast(self, cs: CommState, a: Multicast) -> None:
        if not self.mcast.joined(cs.id):
            return          # posting checked this; a datagram with no socket is just lost
        views = [self.buffers.gather(a.payload)] if (
            a.payload is not None and a.payload.req in self.buffers) else []
        hdr = a.header.pack(self.secret, views) if self.secret else a.header.pack()
        self.mcast.send(cs.id, hdr, views, a.not_before)
