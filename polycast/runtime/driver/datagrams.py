"""Multicast datagrams of every communicator: the group sockets, sending (now or paced),
and reading.

Fire and forget, as the engine's reliable-multicast protocol expects: a datagram the
kernel refuses (ENOBUFS) is simply lost and recovered by the protocol. A datagram the
engine paces (``not_before`` in the future) waits in a heap and leaves when due; what is due
leaves in one batch. :meth:`MulticastIO.read` is the one place datagrams are read, and
where ``POLYCAST_FAULTS`` (:mod:`polycast.runtime.transport.faults`) injects loss, duplicates,
reordering and replays.

Two ways, chosen once per driver (runtime/transport/dgram.py):

* with the compiled helper (``placer``): the engines run with ``external_streams``; the
  helper places the chunks of the streams they opened and reports them
  (``on_progress(comm_id, [(key, ranges, eos)], consumed, nbytes, drops)``), batches
  of datagrams leave with one sendmmsg (UDP GSO), and only the datagrams the helper does not
  consume reach ``on_datagram(comm_id, data)``;
* without: every datagram goes to ``on_datagram``, one sendmsg each.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import selectors
import time

from ...config import Config
from ..transport import dgram
from ..transport import faults as _faults
from ..transport.mcast import MulticastUnavailable, drop_own_datagrams, open_group

READ_BATCH = dgram.READ_BATCH   # datagrams read per readable event before other work
DATAGRAM_MAX_NBYTES = 65536
PACE_SLACK_SECONDS = 20e-6  # a datagram due this soon leaves now
# With the helper, datagrams due within this leave together, in one sendmmsg of UDP GSO
# batches (one pass down the stack for up to 64 KiB of them, and one GRO-coalesced arrival
# at the receivers where the kernel does that): the pacing rate holds on average, over
# bursts of at most this long at line rate (a switch queue absorbs far more).
PACE_BATCH_SECONDS = 250e-6


class _Group:
    __slots__ = ("sock", "addr", "out")

    def __init__(self, sock, addr) -> None:
        self.sock, self.addr = sock, addr
        self.out: collections.deque = collections.deque()     # (header, views) to send


class MulticastIO:
    """One multicast socket per communicator; selector keys are ``("mcast", comm_id)``."""

    def __init__(self, sel: selectors.BaseSelector, on_datagram, cfg: Config | None = None,
                 placer=None, on_progress=None) -> None:
        """``cfg``: the job's settings (the multicast interface, POLYCAST_FAULTS);
        ``placer``: the compiled helper's (transport.dgram.Placer), or None: the Python
        path; ``on_progress``: what the placer placed (Driver._on_placed)."""
        cfg = cfg if cfg is not None else Config()
        self._sel = sel
        self._interface = cfg.mcast_interface or None
        self._faults_spec = cfg.faults
        self._on_datagram = on_datagram
        self.placer = placer                  # transport.dgram.Placer, or None: Python path
        self._on_progress = on_progress
        self._slack = PACE_SLACK_SECONDS if placer is None else PACE_BATCH_SECONDS
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
        if self.placer is not None:
            self.placer.watch(sock)             # UDP GRO where the kernel offers it
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
        if not_before > time.monotonic() + self._slack:
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
        if self.placer is not None and q:
            items = [(hdr, views[0] if len(views) == 1 else
                      (b"".join(views) if views else None)) for hdr, views in q]
            for _ in range(dgram.send(g.sock, g.addr, items)):
                q.popleft()
            if q:
                _own_queued(q)
        while self.placer is None and q:
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
        """Send the paced datagrams due at ``now`` (with the helper: and those due within
        PACE_BATCH_SECONDS, in one batch)."""
        touched = set()
        now += self._slack
        while self._paced and self._paced[0][0] <= now:
            _, _, comm_id, item = heapq.heappop(self._paced)
            g = self._groups.get(comm_id)
            if g is not None:
                g.out.append(item)
                touched.add(comm_id)
        for comm_id in touched:
            self.flush(comm_id)

    def pending_output(self) -> bool:
        return any(g.out for g in self._groups.values()) or bool(self._paced)

    # -- input -------------------------------------------------------------------------------
    def read(self, comm_id: int, interrupts: tuple = ()) -> None:
        """Take up to READ_BATCH waiting datagrams of a communicator: placed by the helper
        and reported, or handed to ``on_datagram``. ``interrupts``: descriptors of other
        input, which end the helper's wait for more of a stream."""
        g = self._groups.get(comm_id)
        if g is None:
            return
        on_datagram = self._on_datagram
        faults = self.faults
        placer = self.placer
        if placer is not None:
            if faults is None:
                self._placed(comm_id, placer.recv(g.sock, READ_BATCH, watch=interrupts))
                return
            # Faults act on what is read, before the helper sees it: read in Python.
            on_datagram = self._feed
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


    def _feed(self, comm_id: int, data) -> None:
        self._placed(comm_id, self.placer.feed(data))

    def _placed(self, comm_id: int, got) -> None:
        progress, up, consumed, nbytes, drops = got
        if consumed or progress:
            self._on_progress(comm_id, progress, consumed, nbytes, drops)
        for data, _ in up:
            self._on_datagram(comm_id, data)

    # -- streams the helper places (the engines' OpenStream / StreamData / CloseStream) -------
    def open_stream(self, key: tuple, sig: int, array, runs, chunk_elems: int,
                    nchunks: int) -> None:
        self.placer.open(key, sig, array, runs, chunk_elems, nchunks)

    def stream_data(self, key: tuple, offset: int, payload) -> tuple[int, int] | None:
        return self.placer.write(key, offset, payload)

    def close_stream(self, key: tuple) -> None:
        self.placer.close(key)


def _own_queued(q) -> None:
    """Replace zero-copy views in datagrams still queued by copies: the engine considers an
    MCAST step done once it emitted its datagrams, so the request can complete and its
    buffer be reused while a blocked socket still holds them back."""
    for i, (hdr, views) in enumerate(q):
        if views and not isinstance(views[0], bytes):
            q[i] = (hdr, [bytes(v) for v in views])
