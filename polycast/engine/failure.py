"""How a collective fails: clearly, on every rank, naming rank, call and step.

A failing request sends ABORT (with the reason and its text) to every peer not known lost,
so their calls fail too instead of waiting for their own timeout; an ABORT received fails
the request with the matching polycast error (MismatchError, CollectiveTimeout, PeerLost,
ProtocolError, InvalidArgument). A mismatch (a message whose call signature or length
disagrees with the posted call) aborts every peer at once and waits a short grace for the
other side's description, so both ranks' errors name both calls; a rank whose own call is
already over answers from its short memory of recent calls (``_recent``). Timeouts and lost
peers say what the request was waiting on (:meth:`Failure._stuck`).

A call refused before it was posted (its arguments failed the caller's checks on this rank
only, :meth:`Failure.refuse`) still takes its sequence number, so the next call matches
the peers' next call, and aborts the peers' call with reason INVALID: they raise
InvalidArgument naming this rank and its problem. A request failed from outside
(:meth:`Failure.abort`: the driver could not carry out its memory operation) ends the same
way on every rank.

:class:`Failure` is mixed into :class:`~polycast.engine.engine.Engine` (it uses the engine's
``rank``, ``nranks``, ``comm``, ``config``, ``stats``, ``_reqs``, ``_lost``, ``_tokens``,
token numbering, ``_set_timer`` and ``_cleanup``).
"""

from __future__ import annotations

from ..errors import (CollectiveTimeout, InvalidArgument, MismatchError, PeerLost,
                      PolycastError, ProtocolError)
from ..schedule.ir import Kind
from .actions import Action, Fail, Send
from .request import DONE, PENDING, Request, describe
from .wire import AbortReason, Header, MsgKind, make_header


# A MISMATCH abort that answers another (it describes the sender's call) carries this in
# its offset field and is never answered in turn.
_ANSWER = 1


class Failure:
    """Aborts, mismatches and the description of what a request waits on."""

    def _fail(self, r: Request, err: PolycastError, out: list, abort: AbortReason | None,
              lost: int = 0) -> None:
        if self._reqs.get(r.req) is not r:
            return
        if abort is not None:
            self._send_aborts(r, abort, str(err), lost, out)
        self._cleanup(r, out)
        self.stats.failed += 1
        out.append(Fail(r.req, err))

    def refuse(self, why: str, now: float) -> list[Action]:
        """This rank's next collective failed its own argument checks and is not posted:
        take its sequence number anyway and abort the peers' call (reason INVALID, with
        ``why``), so they raise too and every rank's next call still matches."""
        seq = self._next_seq & 0xFFFFFFFF
        self._next_seq += 1
        self._early.drop(seq)                       # what peers already sent for it
        self._early.failure(seq)
        self._remember(seq, 0, lambda: f"a call it refused ({why})")
        out: list[Action] = []
        self._abort_peers(seq, 0, AbortReason.INVALID, why, 0, out)
        return out

    def abort(self, req: int, why: str, now: float) -> list[Action]:
        """Fail request ``req`` from outside the protocol (the driver could not carry out
        one of its memory operations), here and on every peer: InvalidArgument naming
        the call and ``why``."""
        r = self._reqs.get(req)
        out: list[Action] = []
        if r is not None:
            self._fail(r, InvalidArgument(f"rank {self.rank}: {r.desc}: {why}"), out,
                       abort=AbortReason.INVALID)
        return out

    def _remember(self, seq: int, sig: int, desc) -> None:
        """Keep a finished call's description (a thunk) for a while: a peer that finds a
        mismatch after our call ended still learns what we called."""
        recent = self._recent
        recent[seq] = (sig, desc)
        if len(recent) > 64:
            del recent[next(iter(recent))]

    def _remember_request(self, r: Request) -> None:
        sched, req, seq, d = r.sched, r.req, r.seq, r._desc
        self._remember(seq, r.sig, (lambda: d) if isinstance(d, str) else
                       (lambda: describe(sched, req, seq, *d)))

    def _stale_abort(self, src: int, h: Header, out: list, payload=None) -> None:
        """An ABORT for a call that is over here: if it reports a mismatch, tell its sender
        what this rank called, so its error names both calls. If it reports a lost peer or
        a timeout, remember that its sender failed (see Engine.on_peer_gone)."""
        if h.tag in (AbortReason.PEER_LOST, AbortReason.TIMEOUT):
            try:
                text = bytes(payload).decode("utf-8", "replace")[:2000] if payload else ""
            except Exception:
                text = ""
            self._failed_peers.setdefault(src, (h.tag, h.offset, text or "(no reason given)"))
            return
        if h.tag != AbortReason.MISMATCH:
            return
        ent = self._recent.get(h.seq)
        if ent is None:
            return
        sig, desc = ent
        if sig != h.sig and h.offset != _ANSWER:
            self._abort_peers(h.seq, sig, AbortReason.MISMATCH,
                              f"rank {self.rank} called {desc()} (already over there), "
                              f"call signature 0x{sig:08x}", _ANSWER, out)

    def _send_aborts(self, r: Request, reason: AbortReason, text: str, lost: int, out: list,
                     only: int | None = None) -> None:
        self._abort_peers(r.seq, r.sig, reason, text, lost, out, only)

    def _abort_peers(self, seq: int, sig: int, reason: AbortReason, text: str, lost: int,
                     out: list, only: int | None = None) -> None:
        data = text.encode("utf-8")[:4000]
        for p in range(self.nranks) if only is None else (only,):
            if p == self.rank or p in self._lost:
                continue
            h = make_header(MsgKind.ABORT, self.comm, seq, self.rank, int(reason), lost,
                            len(data), sig)
            token = self._next_token
            self._next_token += 1
            self._tokens[token] = (None, -1, p, h)
            st = self.stats
            st.aborts_out += 1
            st.control_messages_out += 1
            st.messages_out += 1
            st.message_bytes_out += len(data)
            out.append(Send(p, h, None, token, data))

    def _on_abort(self, r: Request, src: int, h: Header, payload, now: float,
                  out: list) -> None:
        try:
            text = bytes(payload).decode("utf-8", "replace") if payload is not None else ""
        except Exception:
            text = ""
        text = text[:2000] or "(no reason given)"
        reason = h.tag
        mismatch = reason == AbortReason.MISMATCH
        if r.mismatch is not None:
            if mismatch and h.sig == r.sig:
                return      # another rank that called as we did: still await the other call
            # The other call's description (or a failure meanwhile): name both.
            self._fail(r, MismatchError(f"{r.mismatch}; rank {src} says: {text}"), out,
                       abort=None)
            return
        what = f"rank {self.rank}: {r.desc} aborted by rank {src}: {text}"
        if reason in (AbortReason.TIMEOUT, AbortReason.PEER_LOST):
            # Every rank says what it was waiting on, not only the one that timed out.
            what += f" (rank {self.rank} was waiting on {self._stuck(r)})"
        if mismatch:
            if h.sig == r.sig:
                # A rank that called as we did found a rank that called otherwise: wait a
                # moment for that call's description (it sends it to everyone), so this
                # error names both calls too.
                r.mismatch = what
                grace = min(self.config.op_timeout_s, 4 * self.config.recovery_timeout_s)
                r.mis_timer = self._set_timer(out, now + grace, "mismatch", r, None)
                return
            if h.offset != _ANSWER:
                # Tell everyone what we called (an answer: never answered in turn).
                self._send_aborts(r, AbortReason.MISMATCH,
                                  f"rank {self.rank} called {r.desc}, call signature "
                                  f"0x{r.sig:08x}", _ANSWER, out)
            err: PolycastError = MismatchError(
                f"{what} (this rank's call signature 0x{r.sig:08x}, rank {src}'s "
                f"0x{h.sig:08x})")
        elif reason == AbortReason.TIMEOUT:
            err = CollectiveTimeout(what)
        elif reason == AbortReason.PEER_LOST:
            err = PeerLost(h.offset if h.offset < self.nranks else src, what)
        elif reason == AbortReason.INVALID:
            err = InvalidArgument(f"rank {self.rank}: {r.desc} failed: rank {src} could not "
                                  f"run it: {text}")
        else:
            err = ProtocolError(what)
        if err.caused_by is None:
            err.caused_by = src
        self._fail(r, err, out, abort=None)

    def _mismatch(self, r: Request, detail: str, now: float, out: list) -> None:
        """Abort every peer now; fail this request once the other call's description
        comes back (its ABORT), or after a short grace, so the error names both calls."""
        if r.mismatch is not None:
            return
        r.mismatch = (f"rank {self.rank}: {r.desc}: ranks called collectives differently: "
                      f"{detail}")
        self._send_aborts(r, AbortReason.MISMATCH, r.mismatch, 0, out)
        grace = min(self.config.op_timeout_s, 4 * self.config.recovery_timeout_s)
        r.mis_timer = self._set_timer(out, now + grace, "mismatch", r, None)

    def _overflow(self, r: Request, out: list) -> None:
        self._fail(r, ProtocolError(
            f"rank {self.rank}: {r.desc}: more than max_early_nbytes="
            f"{self.config.max_early_nbytes} of messages held before their "
            "steps could start"), out, abort=AbortReason.OVERFLOW)

    def _mismatch_grace_over(self, r: Request, out: list) -> None:
        self._fail(r, MismatchError(f"{r.mismatch} (the other rank did not describe its "
                                    "call in time)"), out, abort=None)

    def _timed_out(self, r: Request, out: list) -> None:
        self.stats.timeouts += 1
        notes = "".join(f"; rank {p} {note}" for p, note in sorted(self.peer_notes.items()))
        self._fail(r, CollectiveTimeout(
            # " timeout " as a word: torch's suite (and users' scripts) match it.
            f"rank {self.rank}: {r.desc} not done after {self.config.op_timeout_s:g} s "
            f"(the communicator's timeout is over); "
            f"waiting on {self._stuck(r)}{notes}"), out, abort=AbortReason.TIMEOUT)

    def _stuck(self, r: Request) -> str:
        """The first unfinished steps, for error messages."""
        parts = []
        for idx, step in enumerate(r.prog):
            if r.state[idx] == DONE:
                continue
            if r.ndeps[idx] and r.state[idx] == PENDING:
                continue            # waiting on an earlier step: not the root cause
            nbytes = r.plan.nelems[idx] * r.itemsize
            what = f"step {idx} ({step.kind}"
            left = f"{nbytes} bytes"
            if step.kind is Kind.SEND:
                what += f" to rank {step.peer}"
                if r.rts_wait and r.rts_wait.get((step.peer, step.tag)) == idx:
                    what += ": waiting for its clear-to-send (CTS)"
            elif step.kind is Kind.RECV:
                what += f" from rank {step.peer}"
            elif step.kind is Kind.MRECV:
                what += f" from rank {step.peer}"
                s = r.streams.get((step.peer, step.tag))
                if s is not None and s.bitmap is not None:
                    what += f": {s.nchunks - s.have} of {s.nchunks} chunks missing"
                    missing = nbytes * (s.nchunks - s.have) // max(s.nchunks, 1)
                    left = f"about {missing} of {nbytes} bytes"
                else:
                    what += ": none received"
            parts.append(f"{what}) with {left} outstanding")
            if len(parts) == 4:
                break
        if r.multicast and r.ndone == len(r.state):
            if not r.fin_received:
                parts.append(f"FIN from rank {(self.rank - 1) % self.nranks}")
        if r.outstanding and not parts:
            sends = []
            for token in sorted(r.tokens)[:4]:
                ent = self._tokens.get(token)
                if ent is not None:
                    h = ent[3]
                    sends.append(f"{h.kind} to rank {ent[2]}, {h.payload_nbytes} bytes")
            parts.append(f"{r.outstanding} sends not reported done by the driver"
                         + (f" ({'; '.join(sends)})" if sends else ""))
        return ", ".join(parts) or "nothing (internal error)"
