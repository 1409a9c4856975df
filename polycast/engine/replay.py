"""The engine's side of a replayed call: a collective it has seen before, carried out by a
compiled helper (polycast/runtime/driver/_replay.c, driven by runtime/driver/replay.py) instead of
one engine event per message.

The engine still decides everything. Once per (schedule, itemsize, dtype, op) it exports
what this rank's program does (:meth:`Replay.replay_program`: steps with kind, peer, tag,
byte run, reduce flag, pulled or not, dependencies; and the call signature), or None when
the program is not one a replay may run (multicast, messages over the eager limit that go
by RTS/CTS or reduce a pulled DATA, more than one run per step, a MAC secret). A pulled DATA
(engine/rendezvous.py) is one frame each way, the helper's: a SEND the helper wrote but
whose reader has not acknowledged it is adopted as written (``post(..., written=mask)``,
its token from :meth:`Replay.replay_tokens`). Per call, the driver asks
:meth:`Replay.replay_begin` (nothing else is going on in this engine: no request, no
point-to-point, no lost peer, nothing held early but DATA of this very call, which it hands
over, pulled ones unread), takes :attr:`Engine.next_seq` as the call's sequence number, and
then either

* the whole call ran: :meth:`Replay.replayed` accounts for it as a post and its completion
  would (the sequence number, the stats, the finished call remembered for late aborts); or
* the helper stopped part-way (anything it did not expect): ``post(..., replayed=mask)``
  makes the request in exactly the state the steps in ``mask`` leave it (they are done:
  their frames written, their frames consumed and delivered, their copies made) and the
  ordinary engine path carries on, so every error is raised by this engine, on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..schedule.ir import Kind
from .early import holding
from .request import describe
from .wire import F_PULL, MsgKind, call_signature

MAX_STEPS = 64          # the helper keeps a program's done steps in one u64


@dataclass(frozen=True)
class ReplayStep:
    kind: Kind                  # SEND, RECV or COPY
    peer: int                   # SEND/RECV: local rank of the other side (else -1)
    tag: int
    buf: str                    # read (SEND, COPY) or written (RECV)
    offset: int                 # bytes into buf
    nbytes: int
    dst: str                    # COPY: the destination buffer (else "")
    dst_offset: int             # COPY: bytes into dst
    reduce: bool
    ndeps: int
    successors: tuple[int, ...]
    pull: bool = False          # SEND/RECV: a pulled DATA (F_PULL: the driver's single copy)


@dataclass(frozen=True)
class ReplayProgram:
    """What one rank does in a call of one (schedule, itemsize, dtype, op)."""

    sig: int
    steps: tuple[ReplayStep, ...]
    peers: tuple[int, ...]      # local ranks it sends to or receives from, in order
    nsend: int
    nrecv: int
    npull: int = 0              # SENDs of pulled DATA


class Replay:
    """Engine mixin (see the module docstring)."""

    def replay_program(self, schedule, itemsize: int, dtype: str, op: str,
                       max_message_nbytes: int) -> ReplayProgram | None:
        """This rank's program of the call, for a replay; None when it cannot be one (the
        ordinary path then runs it, and raises what is wrong with it, if anything)."""
        if self.config.secret or not isinstance(itemsize, int) or itemsize < 1:
            return None
        try:
            plan = self._get_plan(schedule)
        except Exception:
            return None
        prog = plan.prog
        if plan.multicast or not prog or len(prog) > MAX_STEPS:
            return None
        steps = []
        eager = self.eager_limits(schedule, itemsize)
        nsend = nrecv = npull = 0
        for idx, st in enumerate(prog):
            kind = st.kind
            if kind not in (Kind.SEND, Kind.RECV, Kind.COPY):
                return None
            runs, nbytes = plan.runs[idx], plan.nelems[idx] * itemsize
            if len(runs) > 1:
                return None
            pull = False
            if kind is not Kind.COPY and nbytes > eager[st.peer]:
                # A pulled DATA is one descriptor frame each way (no RTS/CTS): the
                # helper's, unless it reduces (read in place only). Other rendezvous
                # messages are the engine's.
                if not self._pulls(st.peer, nbytes) or st.reduce:
                    return None
                pull = True
                npull += kind is Kind.SEND
            elif kind is not Kind.COPY and nbytes > max_message_nbytes:
                return None
            offset = runs[0][0] * itemsize if runs else 0
            dst, dst_offset = "", 0
            if kind is Kind.COPY:
                druns = plan.dst_runs[idx]
                if len(druns) > 1:
                    return None
                dst, dst_offset = st.dst, (druns[0][0] * itemsize if druns else 0)
            else:
                nsend += kind is Kind.SEND
                nrecv += kind is Kind.RECV
            steps.append(ReplayStep(kind, st.peer if kind is not Kind.COPY else -1, st.tag,
                                    st.buf, offset, nbytes, dst, dst_offset, bool(st.reduce),
                                    plan.ndeps[idx], tuple(plan.succ[idx]), pull))
        return ReplayProgram(self._signature(schedule, itemsize, dtype, op), tuple(steps),
                             tuple(sorted(plan.peers)), nsend, nrecv, npull)

    def replay_begin(self, schedule, prog: ReplayProgram) -> list | None:
        """Whether a replay of the next call may start: None when something else is going
        on in this engine (a request, point-to-point, a lost peer, a grant wait, messages
        held for anything but this call). Else the messages of this call already held
        early, each a DATA for one of its RECV steps (its length and signature right):
        taken out of the early buffer as [(step, src, header, payload)]; hand those not
        used back with :meth:`replay_give_back` before posting the call."""
        if self._reqs or self._p2p or self._unexpected or self._lost or self._grant_wait:
            return None
        early = self._early
        if not early._by_seq:
            return [] if not early._failed else None
        seq = self._next_seq & 0xFFFFFFFF
        entries = early._by_seq.get(seq)
        if early._failed or entries is None or len(early._by_seq) != 1:
            return None
        recv_index = self._get_plan(schedule).recv_index
        steps = prog.steps
        taken = []
        for is_msg, src, h, payload in entries:
            idx = recv_index.get((src, h.tag)) if is_msg else None
            if idx is None or h.kind is not MsgKind.DATA or h.sig != prog.sig \
                    or h.flags != (F_PULL if steps[idx].pull else 0) \
                    or h.length != steps[idx].nbytes or payload is None and h.length:
                return None
            taken.append((idx, src, h, payload))
        early.pop(seq)
        for t in taken:
            early.release_entry(t[2], t[3])
        return taken

    def replay_give_back(self, held: list) -> None:
        """Messages :meth:`replay_begin` took and the replay did not use: held early again,
        in their order, for the call's post."""
        for _, src, h, payload in held:
            if holding(payload):
                self.stats.pull_held -= 1       # counted as it came; held again here
            self._early.hold(True, src, h, payload, h.payload_nbytes, self._next_seq)

    def replay_tokens(self, req: int) -> dict[int, int]:
        """Step index -> send token of the pulled SENDs an adopting post found written
        (``post(..., written=mask)``): the driver reports each done (``on_send_done``) when
        the receiver acknowledges it, as it does for the engine's own."""
        r = self._reqs.get(req)
        return dict(r.written) if r is not None and r.written else {}

    def replayed(self, schedule, prog: ReplayProgram, itemsize: int, dtype: str, op: str,
                 req: int, sent_nbytes: int, nrecv: int, recv_nbytes: int) -> int:
        """A call ran whole in the helper with sequence number :attr:`next_seq`: account
        for it as its post and completion would (``nrecv``: the frames it took from the
        rings; those held early were counted as they came). Returns the sequence number."""
        seq = self._next_seq & 0xFFFFFFFF
        self._next_seq += 1
        st = self.stats
        st.messages_out += prog.nsend
        st.message_bytes_out += sent_nbytes
        st.messages_in += nrecv
        st.message_bytes_in += recv_nbytes
        st.pull_out += prog.npull
        st.completed += 1
        st.replayed += 1
        # (a partial, not a closure: made on every replayed call, read only on a late abort)
        self._remember(seq, prog.sig, partial(describe, schedule, req, seq, dtype, op))
        return seq

    def _signature(self, schedule, itemsize: int, dtype: str, op: str) -> int:
        """The call signature ``post`` gives this call (and caches)."""
        key = (id(schedule), itemsize, dtype, op)
        hit = self._sig_cache.get(key)
        if hit is not None and hit[0] is schedule:
            return hit[1]
        return call_signature(str(schedule.collective), schedule.algorithm, schedule.count,
                              schedule.root, schedule.nranks, itemsize, dtype, op,
                              schedule.options)
