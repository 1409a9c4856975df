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

* :class:`~polycast.engine.stream.Stream` and :class:`~polycast.engine.stream.Pacer`
  (engine/stream.py) are the protocol's per-stream state and its rules, with no request,
  action or engine in sight.
* :class:`ReliableMulticast`, here, is the engine's side (a mixin of
  :class:`~polycast.engine.engine.Engine`): it drives a request's streams from its MCAST
  and MRECV steps and turns their decisions into actions: Multicast and Deliver, gap pulls
  (RECOVER_REQ) to the successor over the reliable channel, answers (RECOVER_DATA) now or
  deferred, the recovery timer, FIN, and pacing adapted to the loss each collective saw.
"""

from __future__ import annotations

from .actions import (CloseStream, Deliver, Multicast, MulticastChunks, OpenStream, Region,
                      StreamData, new_deliver, new_multicast, new_region)
from .early import ENTRY_OVERHEAD_NBYTES
from .request import Request
# (Stream, Pacer, gaps and chunk_runs are reached here too: polycast.engine.mcast.Stream.)
from .stream import SILENT_RTO_FACTOR, Pacer, Stream, chunk_runs, gaps  # noqa: F401
from .wire import F_NO_PAYLOAD, HEADER_NBYTES, Header, MsgKind, make_header

_region = new_region
_deliver = new_deliver
_multicast = new_multicast
_MCAST_DATA, _MCAST_EOS = MsgKind.MCAST_DATA, MsgKind.MCAST_EOS    # enum lookups cost ~55 ns

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
