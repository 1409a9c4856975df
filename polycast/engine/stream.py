"""A multicast stream's state and rules, and the engine's send pacer (specs/mcast-protocol.md),
with no request, action or engine in sight, so that a process other than the engine's (an
offload worker, runtime/offload/worker.py) can run the receive side of a stream.

A :class:`Stream` is made from its geometry (root, ordinal, element runs, element count,
itemsize, mtu); a receiver calls :meth:`Stream.start` when its MRECV step may write, then
:meth:`Stream.place` per data datagram (the element runs to write, or why to drop it),
:meth:`Stream.eos`, :meth:`Stream.take_gaps` (byte ranges to pull), :meth:`Stream.mark`, and
reads ``have``/``nchunks``/``bitmap`` for progress. :class:`Pacer` is one engine's multicast
send rate, adapted to the loss each collective saw. The engine's side, which turns their
decisions into actions, is :mod:`polycast.engine.mcast`.
"""

from __future__ import annotations

import numpy as np

from .plan import slice_runs
from .wire import Header

# A stream of which nothing at all arrived is most likely not sent yet (its root is late):
# pulling it early would make every successor send the whole stream again over the
# reliable channel once it arrives. Such streams wait this many coarse timeouts.
SILENT_RTO_FACTOR = 4


def gaps(held: bytearray, asked: bytearray, lo: int, hi: int) -> list[tuple[int, int]]:
    """Chunk ranges [i, j) within [lo, hi) neither held nor asked for (numpy: streams of
    a million chunks are scanned at C speed)."""
    if hi <= lo:
        return []
    have = np.frombuffer(held, np.uint8, hi - lo, lo) | np.frombuffer(asked, np.uint8,
                                                                      hi - lo, lo)
    edges = np.diff(np.concatenate(([1], have, [1])).astype(np.int8))
    starts = np.flatnonzero(edges == -1) + lo
    ends = np.flatnonzero(edges == 1) + lo
    return list(zip(starts.tolist(), ends.tolist()))


def chunk_runs(runs, chunk_elems: int) -> list[tuple]:
    """Split runs into consecutive pieces of ``chunk_elems`` elements (the last shorter)."""
    out = []
    cur: list[tuple[int, int]] = []
    need = chunk_elems
    for a, b in runs:
        while a < b:
            take = min(need, b - a)
            cur.append((a, a + take))
            a += take
            need -= take
            if need == 0:
                out.append(tuple(cur))
                cur, need = [], chunk_elems
    if cur:
        out.append(tuple(cur))
    return out


class Stream:
    """One multicast stream as this rank sees it: the root's MCAST (``owner``), or an MRECV
    of it. Chunk ``i`` is elements ``[i*chunk_elems, (i+1)*chunk_elems)`` of the stream
    (the concatenation of ``runs``), at byte offset ``i*chunk_elems*itemsize``."""

    __slots__ = ("idx", "root", "ordinal", "owner", "nelems", "itemsize", "nbytes",
                 "chunk_elems", "nchunks", "buf", "bitmap", "have", "held", "eos_seen",
                 "last_progress", "requested", "deferred", "runs", "started", "open")

    def __init__(self, idx, root, ordinal, owner, runs, nelems, itemsize, mtu):
        self.idx, self.root, self.ordinal, self.owner = idx, root, ordinal, owner
        self.runs = runs
        self.nelems = nelems
        self.itemsize = itemsize
        self.nbytes = nelems * itemsize
        self.chunk_elems = max(1, mtu // itemsize)
        self.nchunks = -(-nelems // self.chunk_elems)
        self.buf = ""
        self.bitmap = None              # bytearray once receiving: 1 per chunk held
        self.have = 0                   # chunks held
        self.held = []                  # (header, payload) datagrams before the step started
        self.eos_seen = False
        self.last_progress = 0.0
        self.requested = None           # bytearray: chunks asked of the successor
        self.deferred = []              # (requester, header, chunk range) to answer
        self.started = False            # owner: its data is ready to serve
        self.open = False               # external placement: OpenStream sent, no CloseStream

    # -- receiving ------------------------------------------------------------------------
    def start(self, buf: str, now: float) -> list:
        """The MRECV step started: chunks may be written into ``buf`` from now on. Returns
        the datagrams held until now (to place, in order)."""
        self.buf = buf
        self.bitmap = bytearray(self.nchunks)
        self.requested = bytearray(self.nchunks)
        self.last_progress = now
        held, self.held = self.held, []
        return held

    @property
    def incomplete(self) -> bool:
        """Receiving, and chunks are still missing."""
        return not self.owner and self.bitmap is not None and self.have < self.nchunks

    def fits(self, h: Header) -> str:
        """"" when data datagram ``h`` is a chunk of this stream not held yet, else why to
        drop it (as :meth:`place` would, without marking anything)."""
        i = h.tag
        if i >= self.nchunks:
            return "bad_chunk"
        e0 = i * self.chunk_elems
        if h.offset != e0 * self.itemsize or \
                h.length != min(self.chunk_elems, self.nelems - e0) * self.itemsize:
            return "bad_chunk"
        return "duplicate" if self.bitmap[i] else ""

    def place(self, h: Header, now: float):
        """A data datagram (chunk ``h.tag`` at byte ``h.offset``, ``h.length`` bytes): the
        element runs of the stream's buffer to write its payload to (a tuple), or, when it
        must be dropped, the reason (a str). Only valid once started."""
        i = h.tag
        if i >= self.nchunks:
            return "bad_chunk"
        ce = self.chunk_elems
        isz = self.itemsize
        e0 = i * ce
        nb = (min(ce, self.nelems - e0)) * isz
        if h.offset != e0 * isz or h.length != nb:
            return "bad_chunk"
        bm = self.bitmap
        if bm[i]:
            return "duplicate"
        bm[i] = 1
        self.have += 1
        self.last_progress = now
        runs = self.runs
        e1 = e0 + nb // isz
        if len(runs) == 1:              # the common case: the stream is one element range
            a0 = runs[0][0]
            return ((a0 + e0, a0 + e1),)
        return slice_runs(runs, e0, e1)

    def eos(self, h: Header) -> str:
        """An end-of-stream datagram: "" when accepted, else the reason to drop it."""
        if h.tag != self.nchunks or h.offset != self.nbytes:
            return "bad_eos"
        if self.eos_seen:
            return "duplicate_eos"
        self.eos_seen = True
        return ""

    def overdue(self, now: float, rto: float) -> bool:
        """No progress for a coarse timeout (longer while nothing at all has arrived)."""
        wait = rto if (self.have or self.eos_seen) else rto * SILENT_RTO_FACTOR
        return now - self.last_progress >= wait * 0.999

    def take_gaps(self, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """Missing chunk ranges within chunks [lo, hi) not asked for yet, as (byte offset,
        nbytes) to pull; they count as asked from now on."""
        hi = self.nchunks if hi is None else hi
        ce, isz = self.chunk_elems, self.itemsize
        out = []
        for i, j in gaps(self.bitmap, self.requested, lo, hi):
            self.requested[i:j] = b"\x01" * (j - i)
            off = i * ce * isz
            out.append((off, min(j * ce, self.nelems) * isz - off))
        return out

    def range_chunks(self, offset: int, nbytes: int) -> tuple[int, int] | None:
        """Chunk range [c0, c1) that a recovery byte range covers exactly (else None)."""
        cb = self.chunk_elems * self.itemsize
        if nbytes <= 0 or offset % cb or offset + nbytes > self.nbytes:
            return None
        end = offset + nbytes
        if end != self.nbytes and end % cb:
            return None
        return offset // cb, -(-end // cb)

    def mark(self, c0: int, c1: int, now: float) -> int:
        """Chunks [c0, c1) are held now (written by recovery, or by an external placer):
        mark them; returns the bytes that were new."""
        bm = self.bitmap
        fresh = bm.count(0, c0, c1)     # at C speed: a placer reports thousands at a time
        if not fresh:
            return 0
        ce, isz, nelems = self.chunk_elems, self.itemsize, self.nelems
        new = fresh * ce * isz
        last = self.nchunks - 1
        if c0 <= last < c1 and not bm[last]:
            new -= (ce - (nelems - last * ce)) * isz     # the last chunk may be short
        bm[c0:c1] = b"\x01" * (c1 - c0)
        self.have += fresh
        self.last_progress = now
        return new

    def slice(self, offset: int, nbytes: int) -> tuple:
        """The element runs of the stream's bytes [offset, offset+nbytes)."""
        isz = self.itemsize
        return slice_runs(self.runs, offset // isz, (offset + nbytes) // isz)

    # -- serving recovery -----------------------------------------------------------------
    def can_serve(self, rng: tuple[int, int]) -> bool:
        """This rank holds chunks [c0, c1) (the root once its MCAST started)."""
        if self.owner:
            return self.started
        if self.bitmap is None:
            return False
        c0, c1 = rng
        return self.have == self.nchunks or 0 not in self.bitmap[c0:c1]

    def servable(self) -> list:
        """Deferred requests that can be answered now, in arrival order (the rest stay)."""
        now, keep = [], []
        for ent in self.deferred:
            (now if self.can_serve(ent[2]) else keep).append(ent)
        self.deferred = keep
        return now


class Pacer:
    """The multicast send rate of one engine (all its streams), adapted after every
    multicast collective to the loss it saw: down 30% above 1% loss (never below
    ``min_fraction`` of the configured rate), up 10% back towards it after none."""

    __slots__ = ("max_gbps", "min_fraction", "rate_gbps", "next_t")

    def __init__(self, max_gbps: float | None, min_fraction: float) -> None:
        self.max_gbps = max_gbps
        self.min_fraction = min_fraction
        self.rate_gbps = max_gbps       # None: no pacing
        self.next_t = 0.0               # when the next datagram may leave (seconds)

    def adapt(self, got_nbytes: int, recovered_nbytes: int, sent_nbytes: int,
              resent_nbytes: int) -> None:
        """After a collective: bytes this rank received (multicast plus recovered), and
        bytes it multicast of its own streams and had to resend to its predecessor."""
        if not self.max_gbps:
            return
        # Loss as a receiver (what we had to recover) and as a sender (what our successor
        # pulled back of our own streams): a broadcast root receives nothing, so without
        # the second it would never slow down.
        recv_loss = recovered_nbytes / got_nbytes if got_nbytes else 0.0
        send_loss = resent_nbytes / sent_nbytes if sent_nbytes else 0.0
        if not got_nbytes and not sent_nbytes:
            return
        loss = max(recv_loss, send_loss)
        if loss > 0.01:
            self.rate_gbps = max(self.max_gbps * self.min_fraction, self.rate_gbps * 0.7)
        elif loss == 0:
            self.rate_gbps = min(self.max_gbps, self.rate_gbps * 1.1)
