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

import numpy as np

from ...config import Config
from ..transport import dgram
from ..transport import faults as _faults
from ..transport.mcast import MulticastUnavailable, drop_own_datagrams, open_group

READ_BATCH = dgram.READ_BATCH   # datagrams read per readable event before other work
LINGER_US = dgram.LINGER_US      # the most a read waits for more of a stream
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


class _Chunks:
    """A stream the helper sends (the engine's MulticastChunks): chunks ``[next, nchunks)``
    are still to go, chunk i not before ``t0 + i * dt``. ``bufs`` (the driver's Buffers)
    while it reads the request's array, None once it reads its own copy."""

    __slots__ = ("comm_id", "args", "req", "bufs", "next", "nchunks", "t0", "dt", "blocked")

    def due(self, until: float) -> int:
        """Chunks that may have left by ``until`` (an index past the last one due)."""
        if self.dt <= 0.0:
            return self.nchunks
        return min(self.nchunks, max(0, int((until - self.t0) / self.dt) + 1))


class MulticastIO:
    """One multicast socket per communicator; selector keys are ``("mcast", comm_id)``."""

    def __init__(self, sel: selectors.BaseSelector, on_datagram, cfg: Config | None = None,
                 placer=None, on_progress=None, send_chunks: bool | None = None) -> None:
        """``cfg``: the job's settings (the multicast interface, POLYCAST_FAULTS);
        ``placer``: the compiled helper's (transport.dgram.Placer), or None: the Python
        path; ``on_progress``: what the placer placed (Driver._on_placed); ``send_chunks``:
        send streams with the helper when it does not place (None: when it does)."""
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
        # With the helper, streams leave chunk by chunk from the request's memory, built
        # and sent in C (MulticastChunks); without it, as one datagram per chunk.
        self.sends_chunks = placer is not None if send_chunks is None else \
            bool(send_chunks) and dgram.available()
        self._chunks: list[_Chunks] = []
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
        self._chunks = [st for st in self._chunks if st.comm_id != comm_id]

    def close_all(self) -> None:
        for g in self._groups.values():
            g.sock.close()
        self._groups.clear()
        self._chunks.clear()

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

    def send_chunks(self, comm_id: int, a, bufs, secret: bytes | None) -> None:
        """Send stream ``a`` (a MulticastChunks) with the helper, each chunk when due; the
        request's array is read in place while the request lasts (the engine counts the
        step done at the last chunk's time, and due chunks leave before timers fire)."""
        h, reg = a.header, a.payload
        arr = bufs.array(reg.req, reg.buf)
        st = _Chunks()
        st.comm_id, st.req, st.bufs = comm_id, reg.req, bufs
        st.args = [secret, h.comm, h.seq & 0xFFFFFFFF, h.src, h.sig, h.stream, arr,
                   dgram.runs_bytes(reg.runs), a.itemsize, a.chunk_elems,
                   sum(b - a_ for a_, b in reg.runs), reg.runs]
        st.next, st.nchunks, st.t0, st.dt = 0, a.nchunks, a.not_before, a.chunk_seconds
        st.blocked = False
        self._chunks.append(st)
        g = self._groups[comm_id]
        self._send_chunks(g, st, time.monotonic() + self._slack)
        if st.next >= st.nchunks:
            self._chunks.remove(st)
        elif st.blocked:
            self._want_write(g, True)

    def _send_chunks(self, g: _Group, st: _Chunks, until: float) -> None:
        """Send the chunks of ``st`` due by ``until``; on a full socket buffer, mark it
        blocked and let it read its own copy of what is left (the request may end before
        the socket drains)."""
        if st.bufs is not None and st.req not in st.bufs:
            st.next = st.nchunks        # its request failed: nothing more to send
            return
        end = st.due(until)
        a = st.args
        while st.next < end:
            want = min(end - st.next, dgram.SEND_CHUNKS_MAX)
            sent = dgram.send_chunks(g.sock, g.addr, a, st.next, st.next + want)
            st.next += sent
            if sent < want:
                st.blocked = True
                if st.bufs is not None:
                    arr, runs = a[6], a[11]
                    a[6] = arr[runs[0][0]:runs[0][1]].copy() if len(runs) == 1 else \
                        np.concatenate([arr[x:y] for x, y in runs])
                    a[7] = dgram.runs_bytes(((0, a[10]),))
                    a[11] = ((0, a[10]),)
                    st.bufs = None
                return
        st.blocked = False

    def _want_write(self, g: _Group, want: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
        key = self._sel.get_key(g.sock)
        if key.events != events:
            self._sel.modify(g.sock, events, key.data)

    def flush(self, comm_id: int) -> None:
        """Send what a blocked socket held back (its selector key became writable)."""
        g = self._groups.get(comm_id)
        if g is not None:
            if self._chunks:
                self._pump(time.monotonic() + self._slack, comm_id)
            self._flush(g)

    def _pump(self, until: float, comm_id: int | None = None) -> None:
        """Send the streams' chunks due by ``until`` (of one communicator, or all)."""
        left = []
        for st in self._chunks:
            if comm_id is None or st.comm_id == comm_id:
                g = self._groups.get(st.comm_id)
                if g is None:
                    continue
                self._send_chunks(g, st, until)
                if st.blocked:
                    self._want_write(g, True)
            if st.next < st.nchunks:
                left.append(st)
        self._chunks = left

    def _flush(self, g: _Group) -> None:
        q = g.out
        if any(st.blocked for st in self._chunks if self._groups.get(st.comm_id) is g):
            # a stream's chunks are held back: what was queued after them (its EOS) waits
            self._want_write(g, True)
            return
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
        self._want_write(g, bool(q))

    def next_paced(self) -> float | None:
        """When the next paced datagram is due, or None."""
        due = self._paced[0][0] if self._paced else None
        for st in self._chunks:
            if not st.blocked:
                t = st.t0 + st.next * st.dt
                if due is None or t < due:
                    due = t
        return due

    def send_paced(self, now: float) -> None:
        """Send the paced datagrams due at ``now`` (with the helper: and those due within
        PACE_BATCH_SECONDS, in one batch). Called before timers fire: a paced MCAST step
        ends at its last datagram's time, and its datagrams must have left by then."""
        touched = set()
        now += self._slack
        if self._chunks:
            self._pump(now)
        while self._paced and self._paced[0][0] <= now:
            _, _, comm_id, item = heapq.heappop(self._paced)
            g = self._groups.get(comm_id)
            if g is not None:
                g.out.append(item)
                touched.add(comm_id)
        for comm_id in touched:
            self.flush(comm_id)

    def pending_output(self) -> bool:
        return any(g.out for g in self._groups.values()) or bool(self._paced) or \
            bool(self._chunks)

    # -- input -------------------------------------------------------------------------------
    def read(self, comm_id: int, interrupts: tuple = (), wait_s: float = 0.0) -> None:
        """Take up to READ_BATCH waiting datagrams of a communicator: placed by the helper
        and reported, or handed to ``on_datagram``. ``interrupts``: descriptors of other
        input, which end the helper's wait for more of a stream; ``wait_s``: how long the
        caller has until its next due work (the wait is at most dgram.LINGER_US)."""
        g = self._groups.get(comm_id)
        if g is None:
            return
        on_datagram = self._on_datagram
        faults = self.faults
        placer = self.placer
        if placer is not None:
            if faults is None:
                linger_us = min(LINGER_US, max(0.0, wait_s) * 1e6)
                self._placed(comm_id, placer.recv(g.sock, READ_BATCH, linger_us,
                                                  watch=interrupts))
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
