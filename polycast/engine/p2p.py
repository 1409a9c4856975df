"""Point-to-point messages: MPI matching on (source, tag), in order, any size.

Collectives are matched by sequence number (every rank posts them in the same order);
point-to-point messages are not: a receive names a source (or ANY_SOURCE) and a tag (or
ANY_TAG) and takes the first message that matches, MPI's rule. Per communicator:

* posted receives wait in posting order; messages that match none wait, in arrival
  order, as *unexpected* (their payload charged to the early buffer, the engine's one
  memory budget). A new message goes to the first posted receive it matches; a new
  receive takes the first unexpected message it matches. Messages from one source arrive
  in the order they were sent (the reliable channel keeps order per peer), so two
  messages with the same (source, tag, comm) are never overtaken: MPI's non-overtaking
  rule.
* A message of at most ``eager_max_nbytes`` goes at once (P2P_DATA with its payload); the
  send completes when its buffer may be reused. A larger one goes by rendezvous: P2P_RTS
  (its length), matched like a message, answered by P2P_CTS once a receive matched it,
  then P2P_DATA. An unmatched large message costs the receiver a header, never its
  payload, so the receiver's memory stays bounded.
* A message to this rank itself waits as a rendezvous does, and moves by a local Copy
  once a receive matches it.
* A message longer than the matched receive's buffer fails that receive (MPI's
  truncation error) and, by rendezvous, the send too (its CTS says so); an eager one is
  consumed. Every request has the communicator's timeout; a lost peer fails the sends to
  it, the receives from it and every ANY_SOURCE receive.

Wire (see :mod:`.wire`): ``seq`` is the sender's message number to that destination
(``P2P_*`` of one message share it), ``tag`` the user's tag, ``length`` the payload bytes
(P2P_RTS: announced, F_NO_PAYLOAD), ``offset`` of a P2P_CTS is nonzero when the receive
refused the message (too long). The driver learns which message a receive got from a
:class:`~.actions.Matched` action, given before the data is placed.

:class:`PointToPoint` is mixed into :class:`~polycast.engine.engine.Engine` (it uses the
engine's ``rank``, ``nranks``, ``comm``, ``config``, ``stats``, ``_early``, ``_tokens``,
token numbering, ``_lost`` and the timer helpers).
"""

from __future__ import annotations

from ..errors import CollectiveTimeout, InvalidArgument, PeerLost, ProtocolError
from .actions import Action, Complete, Copy, Deliver, Fail, Matched, Send, new_region
from .early import ENTRY_OVERHEAD_NBYTES, own
from .wire import F_NO_PAYLOAD, Header, MsgKind, make_header

ANY_SOURCE = -2
ANY_TAG = -1
P2P_TOKEN = -2          # the step index of a point-to-point send's token
_DATA, _RTS, _CTS = MsgKind.P2P_DATA, MsgKind.P2P_RTS, MsgKind.P2P_CTS


class P2PRequest:
    """One posted send or receive."""

    __slots__ = ("req", "is_send", "peer", "tag", "nbytes", "itemsize", "timer", "msg",
                 "matched")

    def __init__(self, req, is_send, peer, tag, nbytes, itemsize):
        self.req, self.is_send, self.peer, self.tag = req, is_send, peer, tag
        self.nbytes = nbytes            # send: message bytes; recv: capacity (None: any)
        self.itemsize = itemsize
        self.timer = None
        self.msg = None                 # send: its message number
        self.matched = None             # recv: (src, msgid) awaiting rendezvous DATA

    def desc(self, rank: int) -> str:
        if self.is_send:
            return (f"rank {rank}: Send of {self.nbytes} bytes to rank {self.peer}, tag "
                    f"{self.tag} (request {self.req})")
        src = "ANY_SOURCE" if self.peer == ANY_SOURCE else f"rank {self.peer}"
        tag = "ANY_TAG" if self.tag == ANY_TAG else str(self.tag)
        return f"rank {rank}: Recv from {src}, tag {tag} (request {self.req})"

    def takes(self, src: int, tag: int) -> bool:
        return ((self.peer == ANY_SOURCE or self.peer == src)
                and (self.tag == ANY_TAG or self.tag == tag))


class _Message:
    """An unexpected message: eager (``payload``), rendezvous (None) or to self
    (``local``: the send request whose buffer holds it)."""

    __slots__ = ("src", "tag", "msgid", "nbytes", "payload", "eager", "local", "cost")

    def __init__(self, src, tag, msgid, nbytes, payload, eager, local, cost):
        self.src, self.tag, self.msgid, self.nbytes = src, tag, msgid, nbytes
        self.payload, self.eager, self.local, self.cost = payload, eager, local, cost


class PointToPoint:
    """Sends, receives, probes; see the module docstring."""

    def _p2p_init(self) -> None:
        self._p2p: dict[int, P2PRequest] = {}            # req -> request
        self._recvs: list[P2PRequest] = []               # posted, unmatched: posting order
        self._unexpected: list[_Message] = []            # arrival order
        self._next_msg: dict[int, int] = {}              # destination -> next message number
        self._awaiting_cts: dict[tuple[int, int], P2PRequest] = {}   # (dst, msgid) -> send
        self._awaiting_data: dict[tuple[int, int], P2PRequest] = {}  # (src, msgid) -> recv
        self._p2p_broken: dict[int, str] = {}            # src -> why its messages were lost

    # -- posting --------------------------------------------------------------------------
    def post_send(self, req: int, peer: int, tag: int, nbytes: int, itemsize: int,
                  now: float, sync: bool = False) -> list[Action]:
        """Send ``nbytes`` of request ``req``'s ``send`` buffer to ``peer`` with ``tag``.
        ``sync`` (MPI's Ssend): by rendezvous whatever the size, so the send completes only
        after a receive has matched it (to self it does anyway)."""
        self._p2p_check(req, peer, tag, False)
        r = P2PRequest(req, True, peer, tag, nbytes, itemsize)
        out: list[Action] = []
        if peer in self._lost:
            out.append(Fail(req, PeerLost(peer, f"{r.desc(self.rank)}: rank {peer} was lost "
                                                f"({self._lost[peer]})")))
            return out
        self._p2p[req] = r
        msgid = self._next_msg.get(peer, 0)
        self._next_msg[peer] = (msgid + 1) & 0xFFFFFFFF
        r.msg = msgid
        r.timer = self._set_timer(out, now + self.config.op_timeout_s, "p2p", r, None)
        if peer == self.rank:                   # to self: wait for a receive, then Copy
            self._p2p_arrival(_Message(peer, tag, msgid, nbytes, None, False, r, 0), out)
        elif sync or nbytes > self.eager_max_nbytes(peer):
            self._awaiting_cts[(peer, msgid)] = r
            self.stats.rts_out += 1
            self.stats.control_messages_out += 1
            self._p2p_send(r, peer, make_header(_RTS, self.comm, msgid, self.rank, tag, 0,
                                                nbytes, 0, 0, F_NO_PAYLOAD), None, out)
        else:
            self._p2p_send_data(r, out)
        return out

    def post_recv(self, req: int, peer: int, tag: int, capacity_nbytes: int | None,
                  itemsize: int, now: float) -> list[Action]:
        """Receive the first message from ``peer`` (or ANY_SOURCE) with ``tag`` (or
        ANY_TAG) into request ``req``'s ``recv`` buffer of ``capacity_nbytes`` (None: the
        driver allocates the message's size when told by ``Matched``)."""
        self._p2p_check(req, peer, tag, True)
        r = P2PRequest(req, False, peer, tag, capacity_nbytes, itemsize)
        out: list[Action] = []
        lost = self._lost.get(peer) if peer != ANY_SOURCE else None
        if lost is not None:
            out.append(Fail(req, PeerLost(peer, f"{r.desc(self.rank)}: rank {peer} was lost "
                                                f"({lost})")))
            return out
        self._p2p[req] = r
        r.timer = self._set_timer(out, now + self.config.op_timeout_s, "p2p", r, None)
        for i, m in enumerate(self._unexpected):
            if r.takes(m.src, m.tag):
                del self._unexpected[i]
                self._early.release(m.cost)
                self._p2p_match(r, m, out)
                return out
        why = self._p2p_broken.get(peer) if peer != ANY_SOURCE else next(
            iter(self._p2p_broken.values()), None)
        if why is not None:
            self._p2p_fail(r, ProtocolError(f"{r.desc(self.rank)}: {why}"), out)
            return out
        self._recvs.append(r)
        return out

    def cancel_recv(self, req: int) -> list[Action] | None:
        """MPI_Cancel of receive ``req``: if no message has matched it yet, it leaves the
        posted queue and completes (the caller marks it cancelled; nothing was received).
        None when it cannot be cancelled: matched already, ended, or a send (a send is
        never cancelled here: MPI-4.1 deprecates that, and its Wait still completes)."""
        r = self._p2p.get(req)
        if r is None or r.is_send or r.matched is not None or r not in self._recvs:
            return None
        out: list[Action] = []
        self._p2p_end(r, out)
        out.append(Complete(req))
        return out

    def improbe(self, peer: int, tag: int) -> tuple[int, int, int, object] | None:
        """MPI_Improbe: as :meth:`iprobe`, and the message leaves matching (no receive can
        take it now): (source, tag, nbytes, handle), the handle for :meth:`post_mrecv`.
        Its payload stays charged to the early buffer until then."""
        for i, m in enumerate(self._unexpected):
            if ((peer == ANY_SOURCE or peer == m.src) and (tag == ANY_TAG or tag == m.tag)):
                del self._unexpected[i]
                return m.src, m.tag, m.nbytes, m
        return None

    def post_mrecv(self, req: int, message, capacity_nbytes: int | None, itemsize: int,
                   now: float) -> list[Action]:
        """MPI_Mrecv: receive ``message`` (a handle from :meth:`improbe`) into request
        ``req``, as :meth:`post_recv` would had it matched it."""
        m: _Message = message
        self._p2p_check(req, m.src, m.tag, True)
        r = P2PRequest(req, False, m.src, m.tag, capacity_nbytes, itemsize)
        out: list[Action] = []
        self._early.release(m.cost)
        m.cost = 0
        gone = (m.local is not None and self._p2p.get(m.local.req) is not m.local) or (
            not m.eager and m.local is None and m.src in self._lost)
        if gone:        # its sender ended meanwhile (timed out, lost): no data will come
            out.append(Fail(req, PeerLost(m.src, f"{r.desc(self.rank)}: the probed "
                                                 f"message's sender (rank {m.src}) ended "
                                                 "before its data came")))
            return out
        self._p2p[req] = r
        r.timer = self._set_timer(out, now + self.config.op_timeout_s, "p2p", r, None)
        self._p2p_match(r, m, out)
        return out

    def iprobe(self, peer: int, tag: int) -> tuple[int, int, int] | None:
        """(source, tag, nbytes) of the first unexpected message a receive from ``peer``
        with ``tag`` would take, or None (the message stays)."""
        for m in self._unexpected:
            if ((peer == ANY_SOURCE or peer == m.src) and (tag == ANY_TAG or tag == m.tag)):
                return m.src, m.tag, m.nbytes
        return None

    def _p2p_check(self, req: int, peer: int, tag: int, recv: bool) -> None:
        if not isinstance(req, int) or req in self._p2p or req in self._reqs:
            raise InvalidArgument(f"request id {req!r} is already outstanding (or not an "
                                  "int); use a fresh id per call")
        if not (0 <= peer < self.nranks or (recv and peer == ANY_SOURCE)):
            raise InvalidArgument(f"rank {peer!r} out of range: valid ranks are "
                                  f"0..{self.nranks - 1}"
                                  + (" or ANY_SOURCE" if recv else ""))
        if not (0 <= tag <= 0x7FFFFFFF or (recv and tag == ANY_TAG)):
            raise InvalidArgument(f"tag {tag!r} out of range: 0..{0x7FFFFFFF}"
                                  + (" or ANY_TAG" if recv else ""))

    # -- messages -------------------------------------------------------------------------
    def _p2p_message(self, src: int, h: Header, payload, now: float, out: list) -> None:
        kind = h.kind
        if kind is _DATA and h.flags & F_NO_PAYLOAD:
            self.stats.drop("bad_flags")        # a payload kind that says it has none
            return
        if kind is _CTS:
            r = self._awaiting_cts.pop((src, h.seq), None)
            if r is None:
                self.stats.drop("unexpected_cts")
                return
            if h.offset:
                self._p2p_fail(r, InvalidArgument(
                    f"{r.desc(self.rank)}: the matching receive on rank {src} has room for "
                    f"{h.length} bytes only (MPI's truncation error)"), out)
                return
            self._p2p_send_data(r, out)
            return
        if kind is _DATA and (src, h.seq) in self._awaiting_data:
            r = self._awaiting_data.pop((src, h.seq))
            self._p2p_place(r, payload, h.length, out)
            return
        if src in self._p2p_broken:
            self.stats.drop("p2p_after_overflow")
            return
        eager = kind is _DATA
        cost = ENTRY_OVERHEAD_NBYTES + (h.length if eager else 0)
        self._p2p_arrival(_Message(src, h.tag, h.seq, h.length, payload, eager, None, cost),
                          out, charge=True)

    def _p2p_arrival(self, m: _Message, out: list, charge: bool = False) -> None:
        for i, r in enumerate(self._recvs):
            if r.takes(m.src, m.tag):
                del self._recvs[i]
                self._p2p_match(r, m, out)
                return
        if charge:
            if not self._early.charge(m.cost):
                # A reliable message is never resent: receives that could take this
                # source's messages fail from now on (named), rather than wait or misorder.
                self.stats.drop("early_overflow")
                self._p2p_broken[m.src] = (
                    f"messages from rank {m.src} arrived before their receives and "
                    f"overflowed max_early_nbytes={self.config.max_early_nbytes}")
                return
            if m.payload is not None:
                m.payload = own(m.payload)
        self._unexpected.append(m)

    def _p2p_match(self, r: P2PRequest, m: _Message, out: list) -> None:
        cap = r.nbytes
        if cap is not None and m.nbytes > cap or m.nbytes % r.itemsize:
            why = (f"{r.desc(self.rank)}: the message from rank {m.src} (tag {m.tag}) has "
                   f"{m.nbytes} bytes, " + (
                       f"the receive buffer room for {cap} (MPI's truncation error)"
                       if cap is not None and m.nbytes > cap else
                       f"not a whole number of {r.itemsize}-byte elements"))
            if m.local is not None:
                self._p2p_fail(m.local, InvalidArgument(why), out)
            elif not m.eager:
                self.stats.control_messages_out += 1
                self._p2p_send(None, m.src, make_header(_CTS, self.comm, m.msgid, self.rank,
                                                        m.tag, 1, cap or 0, 0, 0,
                                                        F_NO_PAYLOAD), None, out)
            self._p2p_fail(r, InvalidArgument(why), out)
            return
        out.append(Matched(r.req, m.src, m.tag, m.nbytes))
        if m.local is not None:                 # a message to ourselves
            s = m.local
            if m.nbytes:
                n = m.nbytes // s.itemsize
                out.append(Copy(new_region(s.req, "send", ((0, n),), m.nbytes),
                                new_region(r.req, "recv", ((0, m.nbytes // r.itemsize),),
                                           m.nbytes), False))
            self._p2p_done(s, out)
            self._p2p_done(r, out)
        elif m.eager:
            self._p2p_place(r, m.payload, m.nbytes, out)
        else:
            self._awaiting_data[(m.src, m.msgid)] = r
            r.matched = (m.src, m.msgid)
            self.stats.cts_out += 1
            self.stats.control_messages_out += 1
            self._p2p_send(None, m.src, make_header(_CTS, self.comm, m.msgid, self.rank,
                                                    m.tag, 0, 0, 0), None, out)

    def _p2p_place(self, r: P2PRequest, payload, nbytes: int, out: list) -> None:
        if nbytes:
            out.append(Deliver(payload, new_region(r.req, "recv",
                                                   ((0, nbytes // r.itemsize),), nbytes),
                               False))
        self._p2p_done(r, out)

    # -- sends ----------------------------------------------------------------------------
    def _p2p_send_data(self, r: P2PRequest, out: list) -> None:
        n = r.nbytes
        region = new_region(r.req, "send", ((0, n // r.itemsize),), n) if n else None
        self._p2p_send(r, r.peer, make_header(_DATA, self.comm, r.msg, self.rank, r.tag, 0,
                                              n, 0), region, out)

    def _p2p_send(self, r: P2PRequest | None, peer: int, h: Header, region, out: list
                  ) -> None:
        token = self._next_token
        self._next_token += 1
        # Only a DATA's send-done completes its request; control messages report nothing.
        self._tokens[token] = (r if h.kind is _DATA else None, P2P_TOKEN, peer, h)
        st = self.stats
        st.messages_out += 1
        st.message_bytes_out += h.payload_nbytes
        out.append(Send(peer, h, region, token))

    def _p2p_sent(self, r: P2PRequest, out: list) -> None:
        if self._p2p.get(r.req) is r:
            self._p2p_done(r, out)

    # -- endings --------------------------------------------------------------------------
    def _p2p_end(self, r: P2PRequest, out: list) -> bool:
        if self._p2p.pop(r.req, None) is not r:
            return False
        if r.timer is not None:
            self._cancel_timer(out, r.timer)
            r.timer = None
        if not r.is_send:
            if r in self._recvs:
                self._recvs.remove(r)
            if r.matched is not None:
                self._awaiting_data.pop(r.matched, None)
        else:
            self._awaiting_cts.pop((r.peer, r.msg), None)
            if r.peer == self.rank:
                for i, m in enumerate(self._unexpected):
                    if m.local is r:
                        del self._unexpected[i]
                        break
        return True

    def _p2p_done(self, r: P2PRequest, out: list) -> None:
        if self._p2p_end(r, out):
            self.stats.completed += 1
            out.append(Complete(r.req))

    def _p2p_fail(self, r: P2PRequest, err, out: list) -> None:
        if self._p2p_end(r, out):
            self.stats.failed += 1
            out.append(Fail(r.req, err))

    def _p2p_timed_out(self, r: P2PRequest, out: list) -> None:
        r.timer = None
        self.stats.timeouts += 1
        if r.is_send:
            what = ("waiting for the receiver's clear-to-send"
                    if (r.peer, r.msg) in self._awaiting_cts else "waiting for a receive")
        else:
            what = ("waiting for the message's data" if r.matched else
                    "no matching message arrived")
        self._p2p_fail(r, CollectiveTimeout(
            f"{r.desc(self.rank)} not done after {self.config.op_timeout_s:g} s (the "
            f"communicator's timeout is over): {what}"),
            out)

    def _p2p_peer_lost(self, peer: int, out: list) -> None:
        for r in list(self._p2p.values()):
            if r.peer == peer or (not r.is_send and r.peer == ANY_SOURCE and r.matched is None):
                self._p2p_fail(r, PeerLost(peer, f"{r.desc(self.rank)}: rank {peer} was "
                                                 f"lost ({self._lost[peer]})"), out)
            elif not r.is_send and r.matched is not None and r.matched[0] == peer:
                self._p2p_fail(r, PeerLost(peer, f"{r.desc(self.rank)}: rank {peer} was "
                                                 f"lost before its data came"), out)
        kept = []
        for m in self._unexpected:
            if m.src == peer and not m.eager and m.local is None:
                self._early.release(m.cost)         # an announced message never coming
            else:
                kept.append(m)
        self._unexpected = kept
