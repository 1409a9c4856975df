"""Multicast datagrams of every communicator: the group sockets, sending (now or paced),
and reading.

Fire and forget, as the engine's reliable-multicast protocol expects: a datagram the
kernel refuses (ENOBUFS) is simply lost and recovered by the protocol. A datagram the
engine paces (``not_before`` in the future) waits in a heap and leaves when due. Received
datagrams go to ``on_datagram(comm_id, data)``; :meth:`MulticastIO.read` is the one place
datagrams are read, and where ``POLYCAST_FAULTS`` (:mod:`polycast.runtime.transport.faults`) injects
loss, duplicates, reordering and replays.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import selectors
import time

from ...config import Config
from ..transport import faults as _faults
from ..transport.mcast import MulticastUnavailable, drop_own_datagrams, open_group

READ_BATCH = 256            # datagrams read per readable event before other work
DATAGRAM_MAX_NBYTES = 65536
PACE_SLACK_SECONDS = 20e-6  # a datagram due this soon leaves now


class _Group:
    __slots__ = ("sock", "addr", "out")

    def __init__(self, sock, addr) -> None:
        self.sock, self.addr = sock, addr
        self.out: collections.deque = collections.deque()     # (header, views) to send


class MulticastIO:
    """One multicast socket per communicator; selector keys are ``("mcast", comm_id)``."""

    def __init__(self, sel: selectors.BaseSelector, on_datagram, cfg: Config | None = None
                 ) -> None:
        """``cfg``: the job's settings (the multicast interface, POLYCAST_FAULTS)."""
        cfg = cfg if cfg is not None else Config()
        self._sel = sel
        self._interface = cfg.mcast_interface or None
        self._faults_spec = cfg.faults
        self._on_datagram = on_datagram
        self._groups: dict[int, _Group] = {}
        self._paced: list = []                  # (not_before, n, comm id, datagram)
        self._counter = itertools.count()
        self.faults: _faults.Faults | None = None   # POLYCAST_FAULTS, set up by open()
        self._faults_read = False

    def open(self, comm_id: int, job_id: str, single_host: bool, own_rank: int) -> str | None:
        """Join the communicator's group; returns why multicast is unavailable, or None."""
        try:
            sock, addr = open_group(job_id, comm_id, single_host, self._interface)
        except MulticastUnavailable as exc:
            return str(exc)
        drop_own_datagrams(sock, own_rank)
        if not self._faults_read:
            self._faults_read = True
            self.faults = _faults.parse(self._faults_spec, own_rank)
        self._sel.register(sock, selectors.EVENT_READ, ("mcast", comm_id))
        self._groups[comm_id] = _Group(sock, addr)
        return None

    def joined(self, comm_id: int) -> bool:
        return comm_id in self._groups

    def close(self, comm_id: int) -> None:
        g = self._groups.pop(comm_id, None)
        if g is not None:
            self._sel.unregister(g.sock)
            g.sock.close()

    def close_all(self) -> None:
        for g in self._groups.values():
            g.sock.close()
        self._groups.clear()

    # -- output ------------------------------------------------------------------------------
    def send(self, comm_id: int, header: bytes, views: list, not_before: float) -> None:
        """Send one datagram (header then payload views) now, or at ``not_before``."""
        g = self._groups.get(comm_id)
        if g is None:
            return          # posting checked this; a datagram with no socket is just lost
        if not_before > time.monotonic() + PACE_SLACK_SECONDS:
            # The engine counts a paced MCAST done at its last not_before, and the request may
            # complete (its buffer reused) before this datagram leaves: own the bytes.
            dgram = (header, [bytes(v) for v in views])
            heapq.heappush(self._paced, (not_before, next(self._counter), comm_id, dgram))
        else:
            g.out.append((header, views))
            self._flush(g)

    def flush(self, comm_id: int) -> None:
        """Send what a blocked socket held back (its selector key became writable)."""
        g = self._groups.get(comm_id)
        if g is not None:
            self._flush(g)

    def _flush(self, g: _Group) -> None:
        q = g.out
        while q:
            hdr, views = q[0]
            try:
                g.sock.sendmsg([hdr, *views], [], 0, g.addr)
            except (BlockingIOError, InterruptedError):
                _own_queued(q)
                break
            except OSError:
                pass        # e.g. ENOBUFS: a lost datagram, the protocol recovers it
            q.popleft()
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if q else 0)
        key = self._sel.get_key(g.sock)
        if key.events != events:
            self._sel.modify(g.sock, events, key.data)

    def next_paced(self) -> float | None:
        """When the next paced datagram is due, or None."""
        return self._paced[0][0] if self._paced else None

    def send_paced(self, now: float) -> None:
        """Send the paced datagrams due at ``now``."""
        touched = set()
        while self._paced and self._paced[0][0] <= now:
            _, _, comm_id, dgram = heapq.heappop(self._paced)
            g = self._groups.get(comm_id)
            if g is not None:
                g.out.append(dgram)
                touched.add(comm_id)
        for comm_id in touched:
            self.flush(comm_id)

    def pending_output(self) -> bool:
        return any(g.out for g in self._groups.values()) or bool(self._paced)

    # -- input -------------------------------------------------------------------------------
    def read(self, comm_id: int) -> None:
        """Hand up to READ_BATCH waiting datagrams of a communicator to ``on_datagram``."""
        g = self._groups.get(comm_id)
        if g is None:
            return
        on_datagram = self._on_datagram
        faults = self.faults
        for _ in range(READ_BATCH):
            try:
                data = g.sock.recv(DATAGRAM_MAX_NBYTES)
            except OSError:             # BlockingIOError: drained
                break
            if faults is None:
                on_datagram(comm_id, data)
            else:
                faults.feed(comm_id, data, on_datagram)
        if faults is not None:
            faults.release(comm_id, on_datagram)


def _own_queued(q) -> None:
    """Replace zero-copy views in datagrams still queued by copies: the engine considers an
    MCAST step done once it emitted its datagrams, so the request can complete and its
    buffer be reused while a blocked socket still holds them back."""
    for i, (hdr, views) in enumerate(q):
        if views and not isinstance(views[0], bytes):
            q[i] = (hdr, [bytes(v) for v in views])
