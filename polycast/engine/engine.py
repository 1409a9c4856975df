"""The sans-I/O engine: one per rank, progressing any number of collectives at once.

The driver feeds events (``post``, ``on_message``, ``on_datagram``, ``on_send_done``,
``on_timer``, ``on_peer_lost``) with its own clock's ``now`` and carries out the returned
actions (:mod:`polycast.engine.actions`) in order. The engine never sleeps, reads a clock,
touches memory or raises on anything that arrives from the network: bad input is dropped
and counted in :attr:`Engine.stats`.

Matching. Every rank posts collectives in the same order (as MPI requires), so the engine
numbers them: the k-th post gets sequence number k. A message belongs to (comm, seq); within
a collective a DATA message is matched to the RECV step by (src, tag), a datagram to the
MRECV step by (root, stream ordinal). Messages and datagrams of a collective not posted yet
are held in one bounded buffer (``max_early_nbytes``); so are those whose step has not
started (its dependencies are not complete).

The engine's parts, each in its own module:

* this module: the :class:`Engine` facade (events in, actions out), posting, peers lost
  and gone, timers;
* :mod:`.steps`: matching messages to steps, step progression, completion;
* :mod:`.plan` (what is precomputed per schedule and rank), :mod:`.request` (one posted
  collective's state), :mod:`.config` (EngineConfig, EngineStats);
* :mod:`.early`: the early buffer, the one memory budget for everything held;
* :mod:`.rendezvous`: RTS/CTS for large point-to-point payloads;
* :mod:`.mcast`: reliable multicast: placement, gap pulls, deferral, FIN, pacing, on
  :mod:`.stream`'s streams (bitmaps, chunk geometry; a :class:`~.stream.Stream` runs
  without an engine, e.g. in an offload worker) and pacer;
* :mod:`.failure`: aborts, mismatches, timeouts and the description of what is stuck.

Payloads handed to ``on_message``/``on_datagram`` may be held by the engine until they come
back in a ``Deliver`` (or are dropped): a driver that reuses receive memory must pass a copy.
"""

from __future__ import annotations

from collections import deque

from ..errors import CollectiveTimeout, InvalidArgument, PeerLost, ProtocolError
from ..schedule.ir import Kind, Schedule
from .actions import Action, new_cancel_timer, new_set_timer
from .config import MIB, EngineConfig, EngineStats
from .early import EarlyBuffer, let_go
from .failure import Failure
from .mcast import ReliableMulticast
from .p2p import P2P_TOKEN, PointToPoint
from .plan import Plan, make_plan
from .request import DONE, Request
from .rendezvous import Rendezvous
from .replay import Replay
from .steps import Steps
from .stream import Pacer
from .wire import AbortReason, Header, WireError, call_signature, parse_datagram

_set_timer = new_set_timer
_cancel_timer = new_cancel_timer

__all__ = ["Engine", "EngineConfig", "EngineStats", "MIB"]


class Engine(Steps, Rendezvous, ReliableMulticast, Failure, PointToPoint, Replay):
    """One rank's protocol state machine. See the module docstring."""

    def __init__(self, rank: int, nranks: int, comm: int = 0,
                 config: EngineConfig | None = None) -> None:
        if not isinstance(nranks, int) or nranks < 1:
            raise InvalidArgument(f"nranks must be a positive integer, got {nranks!r}")
        if not isinstance(rank, int) or not 0 <= rank < nranks:
            raise InvalidArgument(f"rank {rank!r} out of range: valid ranks are "
                                  f"0..{nranks - 1}")
        if not isinstance(comm, int) or not 0 <= comm <= 0xFFFFFFFF:
            raise InvalidArgument(f"comm must be a u32 integer, got {comm!r}")
        self.rank, self.nranks, self.comm = rank, nranks, comm
        self.config = config if config is not None else EngineConfig()
        self.config.validate()
        self.stats = EngineStats(pacing_gbps=self.config.pacing_gbps)
        self._next_seq = 0
        self._reqs: dict[int, Request] = {}
        self._by_seq: dict[int, Request] = {}
        self._early = EarlyBuffer(self.config.max_early_nbytes, self.stats)
        self._timers: dict[int, tuple] = {}         # timer id -> (kind, request|None, arg)
        self._tokens: dict[int, tuple] = {}         # token -> (request or None, step index)
        self._next_token = 0
        self._next_timer = 0
        # One op-timeout watchdog for all of this engine's collectives (not a timer set and
        # cancelled per request: two actions and two heap operations a call): it fires at
        # the earliest deadline it was armed for, fails what is past its deadline and
        # re-arms for the earliest one left (none left: it stays off until a post).
        self._watchdog: int | None = None
        self._watchdog_at = float("inf")
        self._lost: dict[int, str] = {}
        # Peers whose call failed after ours was over here (their ABORT came too late to
        # matter): (reason, lost rank, their text). If such a peer then leaves, what a call
        # of ours still waits for from it never comes (on_peer_gone).
        self._failed_peers: dict[int, tuple] = {}
        self._departed: set[int] = set()
        self._pacer = Pacer(self.config.pacing_gbps, self.config.pacing_min_fraction)
        self._sig_cache: dict[tuple, tuple] = {}    # -> (schedule, sig)
        self._plans: dict[int, tuple] = {}          # id(schedule) -> (schedule, plan)
        self._grant_wait: deque = deque()           # (request, (src, tag)): RTS refused a grant
        self._recent: dict[int, tuple] = {}         # seq -> (sig, description thunk): over
        # What the driver knows of peers beyond the protocol ("stopped", "not running"),
        # for error messages only: rank -> note.
        self.peer_notes: dict[int, str] = {}
        # Per peer (by local rank), the largest message sent eager: config.eager_max_nbytes
        # unless set_eager_limits raised it (then only in calls of at most _eager_call_max
        # bytes). Both ends of a pair must agree, since a large RECV clears its sender
        # unasked. (Lists: read on every step's start.)
        self._eager_base = [self.config.eager_max_nbytes] * nranks
        self._eager_of = self._eager_base
        self._eager_call_max = self.config.max_early_nbytes // 8
        # Per peer, the smallest rendezvous message sent for it to pull (F_PULL), 0: none.
        self._pull_min = [0] * nranks
        self._p2p_init()

    # -- public state ---------------------------------------------------------------------
    def set_eager_limits(self, limits: dict[int, int]) -> None:
        """Messages to or from local rank ``peer`` of at most ``limits[peer]`` bytes go
        eager (no RTS/CTS); other peers keep ``config.eager_max_nbytes``. In a collective
        only when the call is small (schedule count x itemsize x ranks at most an eighth
        of max_early_nbytes): a rank that posts late holds what its peers send it eager
        (the early buffer), and a large call's messages must not overflow it, so those go
        by rendezvous as before. A driver sets the same value on both ends of a pair (the
        runtime: a shared-memory pair, by what both sides know of it), before the
        communicator's first call."""
        for peer, nbytes in limits.items():
            if not isinstance(nbytes, int) or nbytes < 0 or not isinstance(peer, int) \
                    or not 0 <= peer < self.nranks:
                raise InvalidArgument(f"eager limit {nbytes!r} for peer {peer!r}")
        eager = list(self._eager_base)
        for peer, nbytes in limits.items():
            eager[peer] = nbytes
        self._eager_of = eager

    def set_pull_peers(self, limits: dict[int, int]) -> None:
        """A collective's SEND to local rank ``peer`` over the eager limit and of at least
        ``limits[peer]`` bytes goes as a DATA flagged ``F_PULL`` at once, with no RTS: the
        driver promises that such a DATA reaches ``peer`` as a payload the receiver may
        hold unread (``hold()``, its bytes staying in our memory until it reads them or
        lets go: the runtime's single-copy descriptors, runtime/transport/cma.py). The receiver then
        does what it does with an RTS (engine/rendezvous.py), reading where it would have
        sent a CTS: one frame instead of three. A driver sets the same value on both ends
        of a pair (a receiver whose peer pulls sends it no unasked CTS); a mismatch costs
        frames, never data."""
        for peer, nbytes in limits.items():
            if not isinstance(nbytes, int) or nbytes < 1 or not isinstance(peer, int) \
                    or not 0 <= peer < self.nranks or peer == self.rank:
                raise InvalidArgument(f"pull limit {nbytes!r} for peer {peer!r}")
        pull = [0] * self.nranks
        for peer, nbytes in limits.items():
            pull[peer] = nbytes
        self._pull_min = pull

    def eager_max_nbytes(self, peer: int) -> int:
        """The largest message to or from ``peer`` sent eager (point to point, and the
        collectives small enough for the raised limits: :meth:`eager_limits`)."""
        return self._eager_of[peer]

    def eager_limits(self, schedule, itemsize: int) -> list[int]:
        """Per peer, the largest message of a call of ``schedule`` sent eager (the same
        answer on every rank: the schedule and itemsize are the call's)."""
        if schedule.count * itemsize * schedule.nranks <= self._eager_call_max:
            return self._eager_of
        return self._eager_base

    @property
    def busy(self) -> bool:
        """Any request outstanding."""
        return bool(self._reqs) or bool(self._p2p)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    # -- posting --------------------------------------------------------------------------
    def post(self, req: int, schedule: Schedule, itemsize: int, now: float, *,
             dtype: str = "", op: str = "", replayed: int = 0,
             written: int = 0) -> list[Action]:
        """Start a collective. Raises InvalidArgument (before anything is sent) when the
        schedule does not fit this engine; returns the first actions. ``replayed``: the
        steps (a bit per step index, a downward-closed set) a compiled replay of this call
        already did (engine/replay.py): they complete without their actions. ``written``:
        pulled SENDs it wrote whose reader has not acknowledged them yet: they start without
        their actions and complete on ``on_send_done`` of their tokens
        (:meth:`replay_tokens`)."""
        plan = self._get_plan(schedule)     # checked against this engine when it was made
        if not isinstance(req, int) or req in self._reqs:
            raise InvalidArgument(f"request id {req!r} is already outstanding (or not an "
                                  "int); use a fresh id per call")
        if not isinstance(itemsize, int) or itemsize < 1:
            raise InvalidArgument(f"itemsize must be a positive integer, got {itemsize!r}")
        if plan.streams and itemsize > self.config.mtu_nbytes:
            raise InvalidArgument(f"itemsize {itemsize} exceeds mtu_nbytes "
                                  f"{self.config.mtu_nbytes}: one element must fit a datagram")
        seq = self._next_seq & 0xFFFFFFFF
        self._next_seq += 1
        key = (id(schedule), itemsize, dtype, op)
        hit = self._sig_cache.get(key)
        if hit is not None and hit[0] is schedule:      # ids are reused after GC: check
            sig = hit[1]
        else:
            if len(self._sig_cache) >= 256:
                self._sig_cache.clear()
            sig = call_signature(str(schedule.collective), schedule.algorithm, schedule.count,
                                 schedule.root, schedule.nranks, itemsize, dtype, op,
                                 schedule.options)
            self._sig_cache[key] = (schedule, sig)
        r = Request(req, seq, schedule, plan, itemsize, sig, (dtype, op))
        r.prog = plan.prog
        r.eager = self.eager_limits(schedule, itemsize)
        if replayed or written:
            r.replayed = replayed
            if written:
                r.written = dict.fromkeys(i for i in range(len(r.state)) if written >> i & 1)
            self.stats.replay_adopted += 1
        self._reqs[req] = r
        self._by_seq[seq] = r
        out: list[Action] = []
        r.deadline = deadline = now + self.config.op_timeout_s
        if deadline < self._watchdog_at:
            self._arm_watchdog(out, deadline)
        if r.multicast:
            rate = self._pacer.rate_gbps or self.config.line_rate_gbps
            total = plan.mcast_nelems * itemsize
            r.rto = self.config.recovery_timeout_s + 2 * total * 8 / (rate * 1e9)
            if self.nranks == 1:                # nobody to hear it, nobody to shake hands with
                r.fin_sent = r.fin_received = True
        # A peer already lost: fail at once, clearly, and tell the others: a rank whose
        # part of this call needs only live peers would otherwise wait its whole timeout
        # for data that can never come (rank 0 of a ring when 1 and 3 fail here).
        for p in self._lost:
            if r.multicast or p in plan.peers:
                self._early.drop(seq)
                self._fail(r, PeerLost(p, f"rank {self.rank}: {r.desc} needs rank {p}, which "
                                          f"was lost earlier ({self._lost[p]})"), out,
                           abort=AbortReason.PEER_LOST, lost=p)
                return out
        why = self._early.failure(seq)
        if why is not None:
            self._early.drop(seq)
            self._fail(r, ProtocolError(f"rank {self.rank}: {r.desc}: {why}"), out,
                       abort=AbortReason.OVERFLOW)
            return out
        r.ready.extend(plan.roots)
        self._pump(r, now, out)
        if r.multicast and r.mrecv_left == 0 and not r.fin_sent and self._reqs.get(r.req) is r:
            self._send_fin(r, out)
        early = self._early.pop(seq)
        if early:
            for is_msg, src, h, payload in early:
                self._early.release_entry(h, payload)
                if self._reqs.get(r.req) is not r:
                    let_go(payload)             # failed meanwhile: drop (and release) the rest
                    continue
                if is_msg:
                    self._message(src, h, payload, now, out)
                else:
                    self._datagram(h, payload, now, out)
        if self._departed:              # what they sent before leaving is in by now
            for p in self._departed:
                if self._reqs.get(r.req) is r and self._fail_for_departed(r, p, out):
                    break
        if self._reqs.get(r.req) is r:
            self._maybe_complete(r, out)
        if self._grant_wait:
            self._retry_grants(out)
        return out

    def _get_plan(self, schedule: Schedule) -> Plan:
        """The plan of this rank's program of ``schedule``, checked against this engine
        (made once per schedule: a planner posts the same schedules again and again)."""
        key = id(schedule)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is schedule:
            return hit[1]
        if not isinstance(schedule, Schedule):
            raise InvalidArgument(f"post needs a Schedule, got {type(schedule).__name__}")
        if schedule.nranks != self.nranks:
            raise InvalidArgument(f"{schedule.describe()} is for {schedule.nranks} ranks but "
                                  f"this communicator has {self.nranks}")
        if len(schedule.programs) != self.nranks:
            raise InvalidArgument(f"{schedule.describe()} has {len(schedule.programs)} "
                                  f"programs for {self.nranks} ranks")
        plan = make_plan(schedule, self.rank)
        if len(self._plans) >= 64:
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = (schedule, plan)
        return plan

    # -- inputs ---------------------------------------------------------------------------
    def on_message(self, src: int, header: Header, payload: object, now: float
                   ) -> list[Action]:
        """A message from peer ``src`` on the reliable channel (already parsed)."""
        st = self.stats
        st.messages_in += 1
        st.message_bytes_in += header.payload_nbytes
        out: list[Action] = []
        self._message(src, header, payload, now, out)
        if self._grant_wait:
            self._retry_grants(out)
        return out

    def on_datagram(self, data, now: float) -> list[Action]:
        """A raw datagram: parse, check, place. Never raises; bad ones are counted."""
        st = self.stats
        st.datagrams_in += 1
        try:
            h, payload = parse_datagram(data, self.config.secret)
        except WireError as e:
            self.stats.drop(e.reason)
            return []
        except Exception:           # anything else unexpected from hostile input
            self.stats.drop("malformed")
            return []
        st.datagram_bytes_in += h.length
        out: list[Action] = []
        self._datagram(h, payload, now, out)
        return out

    def on_datagram_header(self, header: Header, payload: object, now: float
                           ) -> list[Action]:
        """A pre-parsed datagram (the simulator's path; ``payload`` may be None)."""
        st = self.stats
        st.datagrams_in += 1
        st.datagram_bytes_in += header.length
        out: list[Action] = []
        self._datagram(header, payload, now, out)
        return out

    def on_stream_progress(self, seq: int, root: int, ordinal: int, ranges, now: float, *,
                           eos: bool = False, recovered: bool = False) -> list[Action]:
        """(``EngineConfig.external_streams``) The placer of stream ``(root, ordinal)`` of
        collective ``seq`` wrote chunk ranges ``[(c0, c1), ...)`` into the region of its
        OpenStream (``recovered``: the bytes of a StreamData), and/or saw its end-of-stream
        datagram (``eos``). Reports after the stream closed are dropped (counted)."""
        out: list[Action] = []
        self._stream_progress(seq & 0xFFFFFFFF, root, ordinal, ranges, now, eos, recovered,
                              out)
        if self._grant_wait:
            self._retry_grants(out)
        return out

    def on_send_done(self, token: int, now: float) -> list[Action]:
        ent = self._tokens.pop(token, None)
        if ent is None:
            return []
        r, idx = ent[0], ent[1]
        out: list[Action] = []
        if idx == P2P_TOKEN:
            if r is not None:
                self._p2p_sent(r, out)
            return out
        if r is None or self._reqs.get(r.req) is not r:
            return out
        r.outstanding -= 1
        r.tokens.discard(token)
        if idx >= 0:
            self._step_done(r, idx)
            self._pump(r, now, out)
        self._maybe_complete(r, out)
        if self._grant_wait:
            self._retry_grants(out)
        return out

    def on_timer(self, timer: int, now: float) -> list[Action]:
        ent = self._timers.pop(timer, None)
        if ent is None:
            return []
        kind, r, arg = ent
        if kind == "eos":
            return self._eos_repeat(arg, now)
        out: list[Action] = []
        if kind == "op":
            self._watchdog, self._watchdog_at = None, float("inf")
            self._watch(now, out)
            return out
        if kind == "p2p":
            if self._p2p.get(r.req) is r:
                self._p2p_timed_out(r, out)
            return out
        if self._reqs.get(r.req) is not r:
            return out
        if kind == "pace":
            r.pace_timers.pop(timer, None)
            self._step_done(r, arg)
            self._pump(r, now, out)
            self._maybe_complete(r, out)
        elif kind == "recover":
            r.rec_timer = None
            self._recovery_timer(r, now, out)
        elif kind == "mismatch":
            r.mis_timer = None
            self._mismatch_grace_over(r, out)
        return out

    def on_peer_lost(self, peer: int, now: float, reason: str = "") -> list[Action]:
        """Fail every outstanding request that needs ``peer`` (multicast ones always do)."""
        out: list[Action] = []
        if not 0 <= peer < self.nranks or peer == self.rank:
            return out
        if peer in self._lost:
            return out
        self._lost[peer] = reason or "connection lost"
        for r in list(self._reqs.values()):
            if r.multicast or any(r.state[i] != DONE and r.prog[i].peer == peer
                                  and r.prog[i].kind in (Kind.SEND, Kind.RECV)
                                  for i in range(len(r.prog))):
                self._fail(r, PeerLost(peer, f"rank {self.rank}: {r.desc} was waiting on "
                                             f"{self._stuck(r)}: {self._lost[peer]}"),
                           out, abort=AbortReason.PEER_LOST, lost=peer)
        if self._p2p or self._unexpected:
            self._p2p_peer_lost(peer, out)
        return out

    def on_peer_gone(self, peer: int, now: float) -> list[Action]:
        """Peer ``peer`` finalized (an orderly goodbye: all it sent has arrived). Normally
        nothing to do: a call still waiting for it ends at its timeout (ranks calling
        different numbers of collectives). But when that peer's last call had failed (its
        PEER_LOST or TIMEOUT abort came for a call already over here, so nothing failed
        here), a call of ours still waiting to receive from it will never get it: fail it
        now, naming the first failure (test_dead_peer: rank 0 had finished call k, ranks 1
        and 3 failed k on the loss of rank 2 and left; rank 0 waited in k+1)."""
        out: list[Action] = []
        if not 0 <= peer < self.nranks or peer == self.rank:
            return out
        self._departed.add(peer)
        for r in list(self._reqs.values()):
            self._fail_for_departed(r, peer, out)
        return out

    def _fail_for_departed(self, r: Request, peer: int, out: list) -> bool:
        failed = self._failed_peers.get(peer)
        if failed is None or r.multicast:       # multicast data comes by datagram, later
            return False
        prog, state, held = r.prog, r.state, r.held
        if not any(state[i] != DONE and prog[i].kind is Kind.RECV and prog[i].peer == peer
                   and (peer, prog[i].tag) not in held for i in range(len(prog))):
            return False
        reason, lost, text = failed
        what = (f"rank {self.rank}: {r.desc} was waiting on {self._stuck(r)}, but rank "
                f"{peer} left after its own call failed: {text}")
        if reason == AbortReason.TIMEOUT:       # the first failure was a timeout: say so
            self._fail(r, CollectiveTimeout(what), out, abort=AbortReason.TIMEOUT)
            return True
        named = lost if 0 <= lost < self.nranks else peer
        self._fail(r, PeerLost(named, what), out, abort=AbortReason.PEER_LOST, lost=named)
        return True

    # -- timers ---------------------------------------------------------------------------
    def _set_timer(self, out: list, deadline: float, kind: str, r: Request, arg) -> int:
        tid = self._next_timer
        self._next_timer += 1
        self._timers[tid] = (kind, r, arg)
        out.append(_set_timer(tid, deadline))
        return tid

    def _arm_watchdog(self, out: list, deadline: float) -> None:
        if self._watchdog is not None:
            self._cancel_timer(out, self._watchdog)
        self._watchdog = self._set_timer(out, deadline, "op", None, None)
        self._watchdog_at = deadline

    def _watch(self, now: float, out: list) -> None:
        """The watchdog fired: every collective past its deadline times out."""
        for r in list(self._reqs.values()):
            if r.deadline <= now and self._reqs.get(r.req) is r:
                self._timed_out(r, out)
        if self._reqs:
            self._arm_watchdog(out, min(r.deadline for r in self._reqs.values()))

    def _cancel_timer(self, out: list, tid: int) -> None:
        if self._timers.pop(tid, None) is not None:
            out.append(_cancel_timer(tid))

