"""Rendezvous: large point-to-point payloads go only once the receiver cleared them.

A SEND of more than ``eager_max_nbytes`` does not send its data at once: it sends an RTS
(length and call signature, checked like a DATA's) and waits for the receiver's CTS, then
sends the DATA as an eager SEND would. The receiver answers CTS as soon as the matching RECV
step has started; a large RECV that starts first sends its CTS unasked, so a sender that is
behind finds it waiting and sends DATA with no RTS (an RTS that crossed it is expected:
counted in ``rts_crossed``). Either way exactly one CTS precedes each DATA. An RTS of a
collective not posted yet is held in the early buffer (it costs a header, not a payload),
so a late rank never makes a large collective overflow.

An RTS whose RECV is posted but waiting on its dependencies is granted at once if its
payload fits in the early buffer (the bytes are reserved there, as an eager DATA would have
held them): the schedule IR promises that sends never wait for the receiver's RECV (the
verifier checks deadlock freedom under that rule; recursive doubling's RECV waits on its own
SEND to the same peer), so such a RECV must not stall the SEND while memory allows. Only
when the buffer is full, where an eager DATA would have failed the call (OVERFLOW), is that
RTS held, and granted as soon as the buffer has room again (oldest first) or its RECV
starts: a rank late inside the collective then costs nothing, and a RECV that waits on this
very SEND still progresses as granted messages are consumed. A cycle of such waits that
needs more of the buffer at once than there is (a single message larger than it, say)
still waits, until ``op_timeout_s`` (the error names the CTS wait); eager, it would have
failed at once with OVERFLOW.

Pulled DATA (``F_PULL``, :meth:`Engine.set_pull_peers`). When the driver can hand the
receiver a payload it may hold unread (the sender's memory, read single-copy when wanted), a
large SEND sends its DATA at once and the receiver treats it as an RTS: read at once into its
destination if the RECV started (the CTS it would have sent), held unread at the cost of a
header if its collective is not posted yet, read into the early buffer if the RECV waits on
its dependencies and the buffer has room (the grant), else held unread and read as soon as
the buffer has room or the RECV starts (the held RTS). The sender's SEND completes when the
receiver has read it (the driver's acknowledgement), as it would have after its CTS. A held
payload that will never be read (its request failed) is let go, so the sender's memory is
released.

:class:`Rendezvous` is mixed into :class:`~polycast.engine.engine.Engine` (it uses the
engine's ``rank``, ``comm``, ``config``, ``stats``, ``_early``, ``_reqs``, ``_grant_wait``,
``_send`` and ``_fail``).
"""

from __future__ import annotations

from ..errors import PeerLost
from .actions import new_region
from .early import ENTRY_OVERHEAD_NBYTES, holding, let_go, own, try_hold
from .request import DONE, PENDING, STARTED, Request
from .wire import F_NO_PAYLOAD, F_PULL, AbortReason, Header, MsgKind, make_header

_region = new_region


class Rendezvous:
    """RTS/CTS for SEND/RECV steps larger than ``config.eager_max_nbytes``."""

    def _pulls(self, peer: int, nbytes: int) -> bool:
        """Whether a collective's message over the eager limit between us and ``peer`` goes
        as a pulled DATA (:meth:`Engine.set_pull_peers`)."""
        pull = self._pull_min[peer]
        return bool(pull) and nbytes >= pull

    # -- the sender -----------------------------------------------------------------------
    def _start_large_send(self, r: Request, idx: int, step, nbytes: int, out: list) -> None:
        """A SEND step over the eager limit starts: DATA if the receiver cleared it
        already, else an RTS (the DATA follows its CTS)."""
        key = (step.peer, step.tag)
        if self._pulls(step.peer, nbytes):
            # The receiver reads it when its RECV starts (it holds the DATA as an RTS):
            # no RTS, CTS or their round trip.
            if r.cts_early:
                r.cts_early.discard(key)        # a CTS it sent anyway (pull limits differ)
            h = make_header(MsgKind.DATA, self.comm, r.seq, self.rank, step.tag, 0,
                            nbytes, r.sig, 0, F_PULL)
            self.stats.pull_out += 1
            self._send(r, step.peer, h, _region(r.req, step.buf, r.plan.runs[idx], nbytes),
                       idx, out)
            return
        if r.cts_early and key in r.cts_early:
            # the receiver's RECV started first and cleared us already: no RTS
            r.cts_early.discard(key)
            h = make_header(MsgKind.DATA, self.comm, r.seq, self.rank, step.tag, 0,
                            nbytes, r.sig)
            self._send(r, step.peer, h, _region(r.req, step.buf, r.plan.runs[idx], nbytes),
                       idx, out)
            return
        h = make_header(MsgKind.RTS, self.comm, r.seq, self.rank, step.tag, 0,
                        nbytes, r.sig, 0, F_NO_PAYLOAD)
        if r.rts_wait is None:
            r.rts_wait = {}
        r.rts_wait[key] = idx
        self.stats.rts_out += 1
        self.stats.control_messages_out += 1
        self._send(r, step.peer, h, None, -1, out)

    def _on_cts(self, r: Request, src: int, h: Header, out: list) -> None:
        key = (src, h.tag)
        wait = r.rts_wait
        idx = wait.pop(key, None) if wait else None
        if idx is None:
            sidx = r.plan.send_index.get(key)
            if (sidx is not None and r.state[sidx] == PENDING
                    and r.plan.nelems[sidx] * r.itemsize > r.eager[src]
                    and not (r.cts_early and key in r.cts_early)):
                if r.cts_early is None:         # the receiver is ahead of this SEND
                    r.cts_early = set()
                r.cts_early.add(key)
                return
            self.stats.drop("unexpected_cts")
            return
        step = r.prog[idx]
        nbytes = r.plan.nelems[idx] * r.itemsize
        data = make_header(MsgKind.DATA, self.comm, r.seq, self.rank, step.tag, 0, nbytes,
                           r.sig)
        self._send(r, src, data, _region(r.req, step.buf, r.plan.runs[idx], nbytes), idx,
                   out)

    # -- the receiver ---------------------------------------------------------------------
    def _clear_ahead(self, r: Request, step, out: list) -> None:
        """A large RECV starts with nothing held: its message will come by rendezvous, so
        clear it now and a sender that is behind us sends its DATA without the RTS round
        trip."""
        key = (step.peer, step.tag)
        rdv = r.rdv
        if rdv is None:
            rdv = r.rdv = set()
        if key not in rdv:
            rdv.add(key)
            if r.cts_ahead is None:
                r.cts_ahead = set()
            r.cts_ahead.add(key)
            self.stats.cts_ahead_out += 1
            self._send_cts(r, step.peer, step.tag, out)

    def _on_rts(self, r: Request, src: int, h: Header, now: float, out: list) -> None:
        st = self.stats
        key = (src, h.tag)
        idx = r.plan.recv_index.get(key)
        if idx is None or not h.flags & F_NO_PAYLOAD:
            st.drop("unexpected_rts")
            return
        nbytes = r.plan.nelems[idx] * r.itemsize
        if h.length != nbytes:
            self._mismatch(r, f"step {idx} expects {nbytes} bytes from rank {src} but its "
                              f"RTS (tag {h.tag}) announces {h.length}", now, out)
            return
        if r.cts_ahead and key in r.cts_ahead:
            # The sender started before our unasked CTS reached it; that CTS answers this.
            r.cts_ahead.discard(key)
            st.rts_crossed += 1
            return
        rdv = r.rdv
        if rdv is None:
            rdv = r.rdv = set()
        state = r.state[idx]
        if key in rdv or key in r.held or state == DONE:
            st.drop("duplicate_rts")
            return
        if state == STARTED:
            rdv.add(key)
            self._send_cts(r, src, h.tag, out)
            return
        # The RECV waits on its dependencies. Grant now while the early buffer allows
        # (sends must not wait on RECVs, see the module docstring); else hold the RTS.
        cost = nbytes + ENTRY_OVERHEAD_NBYTES
        if self._early.charge(cost):
            rdv.add(key)
            if r.granted is None:
                r.granted = {}
            r.granted[key] = cost
            r.held_nbytes += cost
            st.cts_granted_early += 1
            self._send_cts(r, src, h.tag, out)
            return
        if not self._early.charge(ENTRY_OVERHEAD_NBYTES):
            self._overflow(r, out)
            return
        rdv.add(key)
        r.held[key] = (h, None)
        r.held_nbytes += ENTRY_OVERHEAD_NBYTES
        # Grant it as soon as the buffer has room again: its RECV may wait on a SEND of
        # ours that waits on the peer's CTS (recursive doubling), which only grants end.
        self._grant_wait.append((r, key))

    def _hold_pulled(self, r: Request, src: int, h: Header, payload, out: list) -> None:
        """A pulled DATA (F_PULL) whose RECV waits on its dependencies, and the early buffer
        has no room for its bytes: held unread, as an RTS would be, and read into the buffer
        as soon as it has room (:meth:`_retry_grants`) or its RECV starts."""
        if not self._early.charge(ENTRY_OVERHEAD_NBYTES):
            let_go(payload)
            self._overflow(r, out)
            return
        if not try_hold(payload):               # its transport cannot keep it unread
            self._early.release(ENTRY_OVERHEAD_NBYTES)
            self._overflow(r, out)
            return
        key = (src, h.tag)
        self.stats.pull_held += 1
        r.held[key] = (h, payload)
        r.held_nbytes += ENTRY_OVERHEAD_NBYTES
        self._grant_wait.append((r, key))

    def _retry_grants(self, out: list) -> None:
        """Grant held RTSs of posted requests, oldest first, while the early buffer
        has room (called after any event that may have released some); a pulled DATA held
        unread is read into the buffer then (its sender's SEND completes)."""
        wait = self._grant_wait
        early = self._early
        while wait:
            r, key = wait[0]
            held = r.held.get(key) if self._reqs.get(r.req) is r else None
            if held is None or not (held[0].kind is MsgKind.RTS or holding(held[1])):
                wait.popleft()                  # its RECV started, or the request ended
                continue
            idx = r.plan.recv_index[key]
            cost = r.plan.nelems[idx] * r.itemsize + ENTRY_OVERHEAD_NBYTES
            # the held header's own cost is given back as the payload's is reserved
            early.release(ENTRY_OVERHEAD_NBYTES)
            if not early.charge(cost):
                early.release(-ENTRY_OVERHEAD_NBYTES)     # still held: as it was
                return
            wait.popleft()
            r.held_nbytes += cost - ENTRY_OVERHEAD_NBYTES
            if held[0].kind is not MsgKind.RTS:
                try:
                    r.held[key] = (held[0], own(held[1]))
                except PeerLost as exc:         # its sender died before we read it
                    self._fail(r, exc, out, abort=AbortReason.PEER_LOST, lost=key[0])
                continue
            del r.held[key]
            if r.granted is None:
                r.granted = {}
            r.granted[key] = cost
            self.stats.cts_granted_early += 1
            self._send_cts(r, key[0], key[1], out)

    def _send_cts(self, r: Request, dst: int, tag: int, out: list) -> None:
        st = self.stats
        st.cts_out += 1
        st.control_messages_out += 1
        h = make_header(MsgKind.CTS, self.comm, r.seq, self.rank, tag, 0, 0, r.sig)
        self._send(r, dst, h, None, -1, out)
