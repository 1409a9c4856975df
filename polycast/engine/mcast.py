"""Reliable multicast (specs/mcast-protocol.md): streams, placement, bitmaps, gap pulls,
deferral, FIN and pacing.

An MCAST step cuts its region into chunks of at most ``mtu_nbytes`` (whole elements), sends
one datagram per chunk (paced), then an end-of-stream datagram (EOS), and ``eos_repeats - 1``
more EOS spaced out after it (:func:`eos_delays`). An
MRECV step keeps a bitmap of chunks. Loss is detected at EOS or by a coarse timer; the
missing chunk ranges are pulled from the ring successor (rank+1), which answers from its own
copy or defers until it holds the data; the root always holds it. A rank holding all
multicast data of a collective sends FIN to rank+1 and completes once it has also received
FIN from rank-1.

Two layers, so that a process other than the engine's (an offload worker) can run the
receive side of a subset of streams:

* :class:`Stream` and :class:`Pacer` are the protocol's per-stream state and its rules,
  with no request, action or engine in sight. A stream is made from its geometry (root,
  ordinal, element runs, element count, itemsize, mtu); a receiver calls
  :meth:`Stream.start` when its MRECV step may write, then :meth:`Stream.place` per data
  datagram (the element runs to write, or why to drop it), :meth:`Stream.eos`,
  :meth:`Stream.take_gaps` (byte ranges to pull), :meth:`Stream.recovered`, and reads
  ``have``/``nchunks``/``bitmap`` for progress.
* :class:`ReliableMulticast` is the engine's side (a mixin of
  :class:`~polycast.engine.engine.Engine`): it drives a request's streams from its MCAST
  and MRECV steps and turns their decisions into actions: Multicast and Deliver, gap pulls
  (RECOVER_REQ) to the successor over the reliable channel, answers (RECOVER_DATA) now or
  deferred, the recovery timer, FIN, and pacing adapted to the loss each collective saw.
"""

from __future__ import annotations

import numpy as np

from .actions import (CloseStream, Deliver, Multicast, MulticastChunks, OpenStream, Region,
                      StreamData, new_deliver, new_multicast, new_region)
from .early import ENTRY_OVERHEAD_NBYTES
from .plan import slice_runs
from .request import Request
from .wire import F_NO_PAYLOAD, HEADER_NBYTES, Header, MsgKind, make_header

_region = new_region
_deliver = new_deliver
_multicast = new_multicast
_MCAST_DATA, _MCAST_EOS = MsgKind.MCAST_DATA, MsgKind.MCAST_EOS    # enum lookups cost ~55 ns

# A stream of which nothing at all arrived is most likely not sent yet (its root is late):
# pulling it early would make every successor send the whole stream again over the
# reliable channel once it arrives. Such streams wait this many coarse timeouts.
SILENT_RTO_FACTOR = 4

# A receiver whose queue is full as a stream ends loses what arrives then: EOS repeats sent
# back to back are lost together and cost it the coarse timeout. So the repeats after the
# first are spaced: the first of them EOS_SPACING_SPANS stream send times later (a queue the
# stream overfilled has drained by then when the receiver is at least half as fast as the
# stream), each next one EOS_SPACING_GROWTH times later again (slower receivers, longer
# overloads), never sooner than the coarse timeout / EOS_SPACING_MIN_RTO (small streams) nor
# later than half of it. Measured with polycast sim --nic (notes: issue 11, nic): rto
# fractions alone (rto/8, rto/4) cost a fast link 20x its time when the first EOS is lost.
EOS_SPACING_SPANS = 2
EOS_SPACING_GROWTH = 4
EOS_SPACING_MIN_RTO = 1024


def eos_delays(repeats: int, rto_s: float, span_s: float) -> list[float]:
    """Seconds after a stream's first EOS at which its other ``repeats - 1`` EOS leave;
    ``span_s``: the stream's send time (its bytes at the pacing rate), ``rto_s``: the
    request's coarse recovery timeout."""
    first = max(EOS_SPACING_SPANS * span_s, rto_s / EOS_SPACING_MIN_RTO)
    return [min(first * EOS_SPACING_GROWTH ** i, rto_s / 2) for i in range(repeats - 1)]


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


def chunk_datagrams(a: MulticastChunks) -> list[Multicast]:
    """A stream's MCAST_DATA datagrams, one :class:`Multicast` per chunk: what a driver
    without a compiled sender makes of a :class:`MulticastChunks`."""
    h, reg, isz, ce = a.header, a.payload, a.itemsize, a.chunk_elems
    comm, seq, me, sig, ordinal = h.comm, h.seq, h.src, h.sig, h.stream
    req, buf, t, dt = reg.req, reg.buf, a.not_before, a.chunk_seconds
    out = []
    for i, runs in enumerate(chunk_runs(reg.runs, ce)):
        nb = sum(b - a for a, b in runs) * isz
        out.append(_multicast(make_header(_MCAST_DATA, comm, seq, me, i, i * ce * isz, nb, sig,
                                          ordinal), _region(req, buf, runs, nb), t + i * dt))
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


class ReliableMulticast:
    """The engine's side of reliable multicast (mixed into Engine; uses its ``rank``,
    ``nranks``, ``comm``, ``config``, ``stats``, ``_early``, ``_pacer``, ``_reqs``, and its
    step, send and timer helpers)."""

    # -- datagrams ------------------------------------------------------------------------
    def _datagram(self, h: Header, payload, now: float, out: list) -> None:
        st = self.stats
        if h.comm != self.comm:
            st.drop("foreign_comm")
            return
        src = h.src
        if src == self.rank:
            st.drop("own_datagram")
            return
        if src >= self.nranks:
            st.drop("bad_src")
            return
        r = self._by_seq.get(h.seq)
        if r is None:
            self._early.hold(False, src, h, payload, h.length, self._next_seq)
            return
        if h.sig != r.sig:
            st.drop("bad_sig")
            return
        s = r.streams.get((src, h.stream)) or self._stream(r, (src, h.stream))
        if s is None or s.owner:
            st.drop("bad_stream")
            return
        kind = h.kind
        if kind is _MCAST_DATA:
            if s.bitmap is None:            # the MRECV step has not started: hold
                if self._early.charge(h.length + ENTRY_OVERHEAD_NBYTES, datagram=True):
                    s.held.append((h, payload))
                    r.held_nbytes += h.length + ENTRY_OVERHEAD_NBYTES
                else:
                    st.drop("early_overflow")
                return
            if s.open:
                # The placer is the stream's one writer (it may land datagrams in place
                # ahead of their checks): it writes this chunk and reports it.
                why = s.fits(h)
                if why:
                    st.drop(why)
                    return
                out.append(StreamData(r.seq, s.root, s.ordinal, r.req, h.offset, payload,
                                      False))
                return
            chunk = s.place(h, now)
            if chunk.__class__ is str:
                st.drop(chunk)
                return
            nb = h.length
            r.mcast_bytes_in += nb
            out.append(_deliver(payload, _region(r.req, s.buf, chunk, nb), False))
            if s.have == s.nchunks:
                self._stream_complete(r, s, now, out)
            elif s.deferred:
                self._answer_deferred(r, s, out)
        elif kind is _MCAST_EOS:
            why = s.eos(h)
            if why:
                st.drop(why)
                return
            if s.bitmap is not None and s.have < s.nchunks:
                self._request_gaps(r, s, out)
        else:
            st.drop("bad_kind")

    # -- the root -------------------------------------------------------------------------
    def _stream(self, r: Request, key: tuple[int, int]) -> Stream | None:
        """The stream state of (root, ordinal), made on first use: a simulated allgather
        on thousands of ranks must not allocate P streams per rank up front."""
        s = r.streams.get(key)
        if s is None:
            idx = r.plan.streams.get(key)
            if idx is None:
                return None
            s = Stream(idx, key[0], key[1], key[0] == self.rank, r.plan.runs[idx],
                       r.plan.nelems[idx], r.itemsize, self.config.mtu_nbytes)
            r.streams[key] = s
        return s

    def _start_mcast(self, r: Request, idx: int, now: float, out: list) -> None:
        step = r.prog[idx]
        s = self._stream(r, (self.rank, step.tag))
        s.started = True
        isz = r.itemsize
        ce = s.chunk_elems
        pacer = self._pacer
        rate = pacer.rate_gbps
        t = max(now, pacer.next_t)
        per_bit = 1.0 / (rate * 1e9) if rate else 0.0
        comm, seq, me, sig, ordinal, buf, req = (self.comm, r.seq, self.rank, r.sig,
                                                 step.tag, step.buf, r.req)
        st = self.stats
        if self.nranks == 1:
            self._step_done(r, idx)
            return
        chunks = MulticastChunks(make_header(_MCAST_DATA, comm, seq, me, 0, 0, 0, sig, ordinal),
                                 _region(req, buf, tuple(s.runs), s.nbytes), isz, ce, s.nchunks,
                                 t, (ce * isz + HEADER_NBYTES) * 8 * per_bit if rate else 0.0)
        if self.config.external_streams:
            if s.nchunks:
                out.append(chunks)      # the driver builds the datagrams (the helper: in C)
        else:
            out.extend(chunk_datagrams(chunks))
        st.datagrams_out += s.nchunks
        st.datagram_bytes_out += s.nbytes
        r.mcast_bytes_out += s.nbytes
        if rate:
            t += (s.nbytes + s.nchunks * HEADER_NBYTES) * 8 * per_bit
        eos = Header(MsgKind.MCAST_EOS, comm, seq, me, s.nchunks, s.nbytes, 0, sig, ordinal)
        out.append(Multicast(eos, None, t))
        st.datagrams_out += 1
        # The repeats go by timer, outside the pacing: they must not hold up this step or
        # the next stream. They outlive the request when it completes (a receiver may still
        # need them after this rank is done); a failed request cancels them.
        span = (s.nbytes + s.nchunks * HEADER_NBYTES) * 8 / (
            (rate or self.config.line_rate_gbps) * 1e9)
        for d in eos_delays(self.config.eos_repeats, r.rto, span):
            r.eos_timers.append(self._set_timer(out, t + d, "eos", None, eos))
        if rate:
            t += HEADER_NBYTES * 8 * per_bit
        if rate:
            pacer.next_t = t
            if t > now:
                # MCAST completes when its last datagram may leave: a token passed on
                # after it must not overtake the paced stream.
                tid = self._set_timer(out, t, "pace", r, idx)
                r.pace_timers[tid] = idx
                if s.deferred:
                    self._answer_deferred(r, s, out)
                return
        self._step_done(r, idx)
        if s.deferred:                  # requests that reached the root before it started
            self._answer_deferred(r, s, out)

    # -- receivers ------------------------------------------------------------------------
    def _start_mrecv(self, r: Request, idx: int, now: float, out: list) -> None:
        step = r.prog[idx]
        s = self._stream(r, (step.peer, step.tag))
        held = s.start(step.buf, now)
        if s.nchunks == 0:
            self._stream_complete(r, s, now, out)
            return
        if self.config.external_streams:
            s.open = True
            out.append(OpenStream(r.seq, s.root, s.ordinal, r.sig,
                                  Region(r.req, s.buf, s.runs, s.nbytes), s.chunk_elems,
                                  s.nchunks))
        for h, payload in held:
            cost = h.length + ENTRY_OVERHEAD_NBYTES
            r.held_nbytes -= cost
            self._early.release(cost)
            self._datagram(h, payload, now, out)
            if self._reqs.get(r.req) is not r:
                return
        if s.have < s.nchunks:
            if s.eos_seen:
                self._request_gaps(r, s, out)
            if r.rec_timer is None:
                r.rec_timer = self._set_timer(out, now + r.rto, "recover", r, None)

    def _stream_complete(self, r: Request, s: Stream, now: float, out: list) -> None:
        if s.open:
            s.open = False
            out.append(CloseStream(r.seq, s.root, s.ordinal, r.req))
        if s.deferred:
            self._answer_deferred(r, s, out)
        self._step_done(r, s.idx)
        r.mrecv_left -= 1
        if r.mrecv_left == 0:
            if r.rec_timer is not None:
                self._cancel_timer(out, r.rec_timer)
                r.rec_timer = None
            self._send_fin(r, out)
        self._pump(r, now, out)
        self._maybe_complete(r, out)

    def _send_fin(self, r: Request, out: list) -> None:
        r.fin_sent = True
        self.stats.fins_out += 1
        self.stats.control_messages_out += 1
        h = Header(MsgKind.FIN, self.comm, r.seq, self.rank, 0, 0, 0, r.sig)
        self._send(r, (self.rank + 1) % self.nranks, h, None, -1, out)

    def _on_fin(self, r: Request, src: int, out: list) -> None:
        if src != (self.rank - 1) % self.nranks or not r.multicast or r.fin_received:
            self.stats.drop("unexpected_fin")
            return
        r.fin_received = True
        self._maybe_complete(r, out)

    # -- recovery -------------------------------------------------------------------------
    def _recovery_timer(self, r: Request, now: float, out: list) -> None:
        pending = False
        for s in r.streams.values():
            if not s.incomplete:
                continue
            pending = True
            if s.overdue(now, r.rto):
                self._request_gaps(r, s, out)
        if pending:
            r.rec_timer = self._set_timer(out, now + r.rto, "recover", r, None)

    def _request_gaps(self, r: Request, s: Stream, out: list, lo: int = 0,
                      hi: int | None = None) -> None:
        """Ask the ring successor for every missing chunk range (within chunks [lo, hi))
        not already asked for."""
        succ = (self.rank + 1) % self.nranks
        st = self.stats
        for off, nbytes in s.take_gaps(lo, hi):
            h = make_header(MsgKind.RECOVER_REQ, self.comm, r.seq, self.rank, s.root, off,
                            nbytes, r.sig, s.ordinal, F_NO_PAYLOAD)
            st.recovery_requests += 1
            st.control_messages_out += 1
            self._send(r, succ, h, None, -1, out)

    def _on_recover_req(self, r: Request, src: int, h: Header, out: list) -> None:
        s = self._stream(r, (h.tag, h.stream))
        rng = s.range_chunks(h.offset, h.length) if s is not None else None
        if rng is None or not h.flags & F_NO_PAYLOAD:
            self.stats.drop("bad_recover_req")
            return
        if s.can_serve(rng):
            self._serve(r, s, src, h, out)
        else:
            self.stats.recovery_deferred += 1
            s.deferred.append((src, h, rng))
            if s.bitmap is not None and not s.owner:
                # The predecessor's request is evidence the stream was sent and that this
                # range is missing here too: pull it now rather than at our own timeout.
                self._request_gaps(r, s, out, rng[0], rng[1])

    def _serve(self, r: Request, s: Stream, dst: int, h: Header, out: list) -> None:
        region = Region(r.req, r.prog[s.idx].buf, s.slice(h.offset, h.length), h.length)
        reply = Header(MsgKind.RECOVER_DATA, self.comm, r.seq, self.rank, s.root, h.offset,
                       h.length, r.sig, s.ordinal)
        self.stats.recovery_served += 1
        if s.owner:
            r.served_own_nbytes += h.length
        self._send(r, dst, reply, region, -1, out)

    def _answer_deferred(self, r: Request, s: Stream, out: list) -> None:
        for src, h, _ in s.servable():
            self._serve(r, s, src, h, out)

    def _on_recover_data(self, r: Request, src: int, h: Header, payload, now: float,
                         out: list) -> None:
        s = self._stream(r, (h.tag, h.stream))
        rng = (s.range_chunks(h.offset, h.length)
               if s is not None and not s.owner else None)
        if rng is None or s.bitmap is None:
            self.stats.drop("bad_recover_data")
            return
        if s.have == s.nchunks:
            # Complete already: later steps may own these blocks now; never rewrite them.
            self.stats.drop("late_recovery")
            return
        if s.open:
            # The placer writes it and reports it like a multicast chunk (one writer per
            # stream: nothing here may race with its writes).
            out.append(StreamData(r.seq, s.root, s.ordinal, r.req, h.offset, payload))
            return
        out.append(Deliver(payload, Region(r.req, r.prog[s.idx].buf,
                                           s.slice(h.offset, h.length), h.length), False))
        new = s.mark(rng[0], rng[1], now)
        self.stats.recovered_bytes += new
        r.recovered_nbytes += new
        if s.have == s.nchunks:
            self._stream_complete(r, s, now, out)
        elif s.deferred:
            self._answer_deferred(r, s, out)

    # -- external placement (EngineConfig.external_streams) ---------------------------------
    def _stream_progress(self, seq: int, root: int, ordinal: int, ranges, now: float,
                         eos: bool, recovered: bool, out: list) -> None:
        """The placer wrote chunk ranges [c0, c1) of an open stream (and/or saw its EOS)."""
        r = self._by_seq.get(seq)
        s = r.streams.get((root, ordinal)) if r is not None else None
        if s is None or not s.open:
            self.stats.drop("stale_progress")       # its request ended meanwhile
            return
        n = s.nchunks
        new = 0
        for c0, c1 in ranges:
            if 0 <= c0 < c1 <= n:
                new += s.mark(c0, c1, now)
        if recovered:
            self.stats.recovered_bytes += new
            r.recovered_nbytes += new
        else:
            r.mcast_bytes_in += new
        if s.have == n:
            self._stream_complete(r, s, now, out)
            return
        if eos and not s.eos_seen:
            s.eos_seen = True
            self._request_gaps(r, s, out)
        if s.deferred and new:
            self._answer_deferred(r, s, out)

    def _close_streams(self, r: Request, out: list) -> None:
        """The request ended: every stream still open is closed (before its Fail)."""
        for s in r.streams.values():
            if s.open:
                s.open = False
                out.append(CloseStream(r.seq, s.root, s.ordinal, r.req))

    def _adapt_pacing(self, r: Request) -> None:
        if not r.multicast or not self.config.pacing_gbps:
            return
        self._pacer.adapt(r.mcast_bytes_in + r.recovered_nbytes, r.recovered_nbytes,
                          r.mcast_bytes_out, r.served_own_nbytes)
        self.stats.pacing_gbps = self._pacer.rate_gbps


    def _eos_repeat(self, eos: Header, now: float) -> list:
        """A spaced EOS repeat is due (its request may be over: see _start_mcast)."""
        self.stats.datagrams_out += 1
        return [Multicast(eos, None, now)]


__all__ = ["Stream", "Pacer", "ReliableMulticast", "gaps", "chunk_runs", "chunk_datagrams",
           "eos_delays",
           "SILENT_RTO_FACTOR"]
