"""A request's steps, as the engine carries them out: a message matched to its step (DATA to
the RECV of its (src, tag), the protocol's other kinds to their handlers), each ready step
started (a SEND's message, a RECV's held payload delivered or its rendezvous cleared, a
COPY, an MCAST or MRECV), a finished step releasing its successors, and the request's
completion and cleanup. A mixin of :class:`~polycast.engine.engine.Engine` (it uses its
``rank``, ``comm``, ``stats``, ``_early``, ``_reqs``, ``_tokens`` and the other parts'
handlers); the facade, posting and the events are engine.py's."""

from __future__ import annotations

from ..schedule.ir import Kind
from .actions import new_complete, new_copy, new_deliver, new_region, new_send
from .early import ENTRY_OVERHEAD_NBYTES, held_cost, let_go, own
from .request import DONE, PENDING, STARTED, Request
from .wire import F_NO_PAYLOAD, F_PULL, Header, MsgKind, make_header

_region = new_region
_deliver = new_deliver
_send_action = new_send
_copy = new_copy
_complete = new_complete
# Enum members as module constants: ``MsgKind.DATA`` is a ~55 ns class lookup, and the
# message path tests several per event.
_DATA, _ABORT, _RTS, _CTS, _FIN, _RECOVER_REQ, _RECOVER_DATA = (
    MsgKind.DATA, MsgKind.ABORT, MsgKind.RTS, MsgKind.CTS, MsgKind.FIN, MsgKind.RECOVER_REQ,
    MsgKind.RECOVER_DATA)
_P2P_DATA = MsgKind.P2P_DATA
_F_PULL = F_PULL
_SEND, _RECV, _COPY, _MCAST, _MRECV = Kind.SEND, Kind.RECV, Kind.COPY, Kind.MCAST, Kind.MRECV


class Steps:
    """Messages to steps, steps to actions, and completion (mixed into Engine)."""

    # -- messages -------------------------------------------------------------------------
    def _message(self, src: int, h: Header, payload, now: float, out: list) -> None:
        st = self.stats
        if h.comm != self.comm:
            st.drop("foreign_comm")
            return
        if h.src != src or not 0 <= src < self.nranks or src == self.rank:
            st.drop("bad_src")
            return
        if h.kind >= _P2P_DATA:                     # point to point: engine/p2p.py
            self._p2p_message(src, h, payload, now, out)
            return
        r = self._by_seq.get(h.seq)
        if r is None:
            if h.kind is _ABORT and h.seq in self._recent:
                self._stale_abort(src, h, out, payload)
                return
            self._early.hold(True, src, h, payload, h.payload_nbytes, self._next_seq)
            return
        kind = h.kind
        if h.flags & F_NO_PAYLOAD and kind is not _RTS and kind is not _RECOVER_REQ:
            st.drop("bad_flags")        # a payload kind that says it has none (malformed)
            return
        if kind is _ABORT:
            self._on_abort(r, src, h, payload, now, out)
            return
        if h.sig != r.sig:
            let_go(payload)     # (a pulled DATA held before its call was posted: never read)
            self._mismatch(r, f"rank {src}'s {kind} message carries call signature "
                              f"0x{h.sig:08x}, this call's is 0x{r.sig:08x}", now, out)
            return
        if kind is _DATA:
            self._on_data(r, src, h, payload, now, out)
        elif kind is _RTS:
            self._on_rts(r, src, h, now, out)
        elif kind is _CTS:
            self._on_cts(r, src, h, out)
        elif kind is _FIN:
            self._on_fin(r, src, out)
        elif kind is _RECOVER_REQ:
            self._on_recover_req(r, src, h, out)
        elif kind is _RECOVER_DATA:
            self._on_recover_data(r, src, h, payload, now, out)
        else:
            st.drop("bad_kind")

    def _on_data(self, r: Request, src: int, h: Header, payload, now: float,
                 out: list) -> None:
        """A DATA message, matched to its RECV step by (src, tag): delivered if the step
        started, held (charged to the early buffer) if it waits on its dependencies."""
        st = self.stats
        idx = r.plan.recv_index.get((src, h.tag))
        if idx is None:
            let_go(payload)     # dropped: a pulled DATA held early is never read
            st.drop("unexpected_data")
            return
        nbytes = r.plan.nelems[idx] * r.itemsize
        if h.length != nbytes:
            let_go(payload)
            self._mismatch(r, f"step {idx} expects {nbytes} bytes from rank {src} but "
                              f"its message (tag {h.tag}) carries {h.length}", now, out)
            return
        state = r.state[idx]
        granted = r.granted.pop((src, h.tag), 0) if r.granted else 0
        if state == STARTED:
            if granted:                 # the RECV started after its early CTS
                r.held_nbytes -= granted
                self._early.release(granted)
            if nbytes:
                out.append(_deliver(payload, _region(r.req, r.prog[idx].buf,
                                                     r.plan.runs[idx], nbytes),
                                    r.prog[idx].reduce))
            self._step_done(r, idx)
            self._pump(r, now, out)
            self._maybe_complete(r, out)
        elif state == PENDING:
            if (src, h.tag) in r.held:
                let_go(payload)
                st.drop("duplicate")
                return
            cost = nbytes + ENTRY_OVERHEAD_NBYTES
            if granted:                 # reserved by the early CTS: already charged
                r.held[(src, h.tag)] = (h, own(payload))
                return
            if not self._early.charge(cost):
                if h.flags & _F_PULL:   # treated as an RTS the buffer cannot grant yet
                    self._hold_pulled(r, src, h, payload, out)
                    return
                self._overflow(r, out)
                return
            r.held[(src, h.tag)] = (h, own(payload))
            r.held_nbytes += cost
        else:
            let_go(payload)
            st.drop("duplicate")

    # -- steps ----------------------------------------------------------------------------
    def _pump(self, r: Request, now: float, out: list) -> None:
        """Start every ready step; steps that finish at once release their successors."""
        ready = r.ready
        while ready:
            if self._reqs.get(r.req) is not r:
                ready.clear()
                return
            idx = ready.popleft()
            self._start(r, idx, now, out)

    def _step_done(self, r: Request, idx: int) -> None:
        r.state[idx] = DONE
        r.ndone += 1
        ndeps = r.ndeps
        for s in r.plan.succ[idx]:
            ndeps[s] -= 1
            if ndeps[s] == 0:
                r.ready.append(s)

    def _start(self, r: Request, idx: int, now: float, out: list) -> None:
        step = r.prog[idx]
        r.state[idx] = STARTED
        kind = step.kind
        plan = r.plan
        if r.replayed >> idx & 1:
            self._replayed_step(r, idx, kind)
            return
        if r.written is not None and idx in r.written:
            self._written_step(r, idx)
            return
        if kind is _SEND:
            nbytes = plan.nelems[idx] * r.itemsize
            if nbytes > r.eager[step.peer]:
                self._start_large_send(r, idx, step, nbytes, out)
                return
            h = make_header(_DATA, self.comm, r.seq, self.rank, step.tag, 0, nbytes,
                            r.sig)
            region = _region(r.req, step.buf, plan.runs[idx], nbytes) if nbytes else None
            self._send(r, step.peer, h, region, idx, out)
        elif kind is _RECV:
            held = r.held.pop((step.peer, step.tag), None)
            if held is not None:
                h, payload = held
                cost = held_cost(h, payload)
                r.held_nbytes -= cost
                self._early.release(cost)
                if h.kind is MsgKind.RTS:       # a held rendezvous: clear it to send now
                    self._send_cts(r, step.peer, step.tag, out)
                    return
                if h.length:
                    out.append(_deliver(payload, _region(r.req, step.buf, plan.runs[idx],
                                                         h.length), step.reduce))
                self._step_done(r, idx)
            else:
                nbytes = plan.nelems[idx] * r.itemsize
                if nbytes > r.eager[step.peer] and not self._pulls(step.peer, nbytes):
                    self._clear_ahead(r, step, out)
        elif kind is _COPY:
            nbytes = plan.nelems[idx] * r.itemsize
            if nbytes:
                out.append(_copy(_region(r.req, step.buf, plan.runs[idx], nbytes),
                                 _region(r.req, step.dst, plan.dst_runs[idx], nbytes),
                                 step.reduce))
            self._step_done(r, idx)
        elif kind is _MCAST:
            self._start_mcast(r, idx, now, out)
        elif kind is _MRECV:
            self._start_mrecv(r, idx, now, out)

    def _replayed_step(self, r: Request, idx: int, kind) -> None:
        """A step the compiled replay did: its frame written (SEND) or consumed and
        delivered (RECV), or its copy made; counted as the ordinary path counts it."""
        st = self.stats
        if kind is _SEND:
            nbytes = r.plan.nelems[idx] * r.itemsize
            st.messages_out += 1
            st.message_bytes_out += nbytes
            peer = r.prog[idx].peer
            if nbytes > r.eager[peer] and self._pulls(peer, nbytes):
                st.pull_out += 1
        elif kind is _RECV:
            st.messages_in += 1
            st.message_bytes_in += r.plan.nelems[idx] * r.itemsize
        self._step_done(r, idx)

    def _written_step(self, r: Request, idx: int) -> None:
        """A pulled SEND the compiled replay wrote and its reader has not acknowledged: it
        waits on its token, as :meth:`_send`'s do, with no action (its frame is out)."""
        token = self._next_token
        self._next_token += 1
        step = r.prog[idx]
        nbytes = r.plan.nelems[idx] * r.itemsize
        h = make_header(_DATA, self.comm, r.seq, self.rank, step.tag, 0, nbytes, r.sig, 0,
                        F_PULL)                 # what went (for diagnostics)
        self._tokens[token] = (r, idx, step.peer, h)
        r.outstanding += 1
        r.tokens.add(token)
        r.written[idx] = token
        st = self.stats
        st.messages_out += 1
        st.message_bytes_out += nbytes
        st.pull_out += 1

    def _send(self, r: Request, peer: int, h: Header, region, idx: int, out: list,
              data: bytes = b"") -> None:
        token = self._next_token
        self._next_token += 1
        self._tokens[token] = (r, idx, peer, h)     # peer and header: for diagnostics
        r.outstanding += 1
        r.tokens.add(token)
        st = self.stats
        st.messages_out += 1
        st.message_bytes_out += h.payload_nbytes
        out.append(_send_action(peer, h, region, token, data))

    # -- completion --------------------------------------------------------------
    def _maybe_complete(self, r: Request, out: list) -> None:
        if r.ndone != len(r.state) or r.outstanding or r.mismatch is not None:
            return
        if r.multicast and not (r.fin_sent and r.fin_received):
            return
        if self._reqs.get(r.req) is not r:
            return
        self._adapt_pacing(r)
        r.eos_timers.clear()            # done here; receivers may still need the repeats
        self._cleanup(r, out)
        self.stats.completed += 1
        out.append(_complete(r.req))

    def _cleanup(self, r: Request, out: list) -> None:
        self._remember_request(r)
        del self._reqs[r.req]
        self._by_seq.pop(r.seq, None)
        timers = self._timers
        if r.rec_timer is not None or r.mis_timer is not None or r.pace_timers or \
                r.eos_timers:
            for tid in [r.rec_timer, r.mis_timer, *r.pace_timers, *r.eos_timers]:
                if tid is not None and tid in timers:
                    self._cancel_timer(out, tid)
            r.pace_timers.clear()
            r.eos_timers.clear()
        r.rec_timer = r.mis_timer = None
        if r.tokens:
            for token in r.tokens:
                self._tokens.pop(token, None)
            r.tokens.clear()
        if r.held_nbytes:
            self._early.release(r.held_nbytes)
            r.held_nbytes = 0
        if r.held:
            for _, payload in r.held.values():
                let_go(payload)
            r.held.clear()
        if r.streams:
            for s in r.streams.values():
                s.held = []
                s.deferred = []
        if self.config.external_streams:
            self._close_streams(r, out)
