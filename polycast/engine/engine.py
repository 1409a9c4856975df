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

Rendezvous. A SEND of more than ``eager_max_nbytes`` does not send its data at once: it
sends an RTS (length and call signature, checked like a DATA's) and waits for the
receiver's CTS, then sends the DATA as an eager SEND would. The receiver answers CTS as
soon as the matching RECV step has started; a large RECV that starts first sends its CTS
unasked, so a sender that is behind finds it waiting and sends DATA with no RTS (an RTS
that crossed it is expected: counted in ``rts_crossed``). Either way exactly one CTS
precedes each DATA. An RTS of a collective not posted yet is held in the early buffer (it
costs a header, not a payload), so a late rank never makes a large collective overflow. An
RTS whose RECV is posted but waiting on its dependencies is granted at once if its payload
fits in the early buffer (the bytes are reserved there, as an eager DATA would have held
them): the schedule IR promises that sends never wait for the receiver's RECV (the verifier
checks deadlock freedom under that rule; recursive doubling's RECV waits on its own SEND to
the same peer), so such a RECV must not stall the SEND while memory allows. Only when the
buffer is full, where an eager DATA would have failed the call (OVERFLOW), is that RTS
held, and granted as soon as the buffer has room again (oldest first) or its RECV starts: a
rank late inside the collective then costs nothing, and a RECV that waits on this very SEND
still progresses as granted messages are consumed. A cycle of such waits that needs more of
the buffer at once than there is (a single message larger than it, say) still waits, until
``op_timeout_s`` (the error names the CTS wait); eager, it would have failed at once with
OVERFLOW.

Reliable multicast (specs/mcast-protocol.md). An MCAST step cuts its region into chunks of
at most ``mtu_nbytes`` (whole elements), sends one datagram per chunk (paced), then an
end-of-stream datagram ``eos_repeats`` times. An MRECV step keeps a bitmap of chunks. Loss is
detected at EOS or by a coarse timer; the missing chunk ranges are pulled from the ring
successor (rank+1), which answers from its own copy or defers until it holds the data; the
root always holds it. A rank holding all multicast data of a collective sends FIN to rank+1
and completes once it has also received FIN from rank-1.

Payloads handed to ``on_message``/``on_datagram`` may be held by the engine until they come
back in a ``Deliver`` (or are dropped): a driver that reuses receive memory must pass a copy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import (CollectiveTimeout, InvalidArgument, MismatchError, PeerLost,
                      PolycastError, ProtocolError)
from ..schedule.ir import Kind, Schedule
from .actions import (Action, CancelTimer, Complete, Copy, Deliver, Fail, Multicast,
                      Region, Send, SetTimer)
from .wire import (F_NO_PAYLOAD, HEADER_NBYTES, AbortReason, Header, MsgKind, WireError,
                   call_signature, make_header, parse_datagram)

_new = object.__new__


def _fast(cls):
    """A positional constructor for a frozen slots dataclass that skips the generated
    __init__'s per-field ``object.__setattr__`` (the engine's hot path makes millions)."""
    setters = tuple(getattr(cls, f).__set__ for f in cls.__slots__)
    n = len(setters)
    if n == 1:
        (a,) = setters

        def make(x):
            o = _new(cls)
            a(o, x)
            return o
    elif n == 2:
        a, b = setters

        def make(x, y):
            o = _new(cls)
            a(o, x)
            b(o, y)
            return o
    elif n == 3:
        a, b, c = setters

        def make(x, y, z):
            o = _new(cls)
            a(o, x)
            b(o, y)
            c(o, z)
            return o
    elif n == 4:
        a, b, c, d = setters

        def make(x, y, z, w):
            o = _new(cls)
            a(o, x)
            b(o, y)
            c(o, z)
            d(o, w)
            return o
    elif n == 5:
        a, b, c, d, e = setters

        def make(x, y, z, w, v):
            o = _new(cls)
            a(o, x)
            b(o, y)
            c(o, z)
            d(o, w)
            e(o, v)
            return o
    else:                                   # pragma: no cover - not used
        return cls
    return make


_region = _fast(Region)
_deliver = _fast(Deliver)
_multicast = _fast(Multicast)
_send_action = _fast(Send)
_copy = _fast(Copy)
_set_timer = _fast(SetTimer)
_cancel_timer = _fast(CancelTimer)
_complete = _fast(Complete)

MIB = 1 << 20
_ENTRY_OVERHEAD_NBYTES = 64          # what one held message costs beyond its payload
# A stream of which nothing at all arrived is most likely not sent yet (its root is late):
# pulling it early would make every successor send the whole stream again over the
# reliable channel once it arrives. Such streams wait this many coarse timeouts.
_SILENT_RTO_FACTOR = 4
_PENDING, _STARTED, _DONE = 0, 1, 2


@dataclass
class EngineConfig:
    mtu_nbytes: int = 8192                  # max datagram payload
    pacing_gbps: float | None = None        # multicast pacing rate (None: no pacing)
    eos_repeats: int = 3
    recovery_timeout_s: float = 0.05        # coarse-timeout floor when EOS is lost ...
    line_rate_gbps: float = 10.0            # ... plus 2x the multicast bytes at this rate
    op_timeout_s: float = 60.0              # every request fails after this
    max_early_nbytes: int = 64 * MIB        # bound on held messages and datagrams
    secret: bytes | None = None             # keyed BLAKE2 MAC on every message
    pacing_min_fraction: float = 0.1        # loss adaptation never slows below this share
    # Larger SEND payloads go by rendezvous (RTS/CTS), so a late receiver holds headers, not
    # payloads. Below the runtime's ~1 MiB blocks, so every block of a large call is
    # covered; measured (4 local ranks, ring allgather 1-16 MiB, shm and tcp) within run-to-
    # run noise of all-eager, since a RECV that starts first clears its sender unasked.
    eager_max_nbytes: int = 64 * 1024

    def validate(self) -> None:
        def bad(name: str, why: str):
            raise InvalidArgument(f"EngineConfig.{name}={getattr(self, name)!r}: {why}")
        if not isinstance(self.mtu_nbytes, int) or not 64 <= self.mtu_nbytes <= 65000:
            bad("mtu_nbytes", "must be an integer in 64..65000 (a UDP payload)")
        if self.pacing_gbps is not None and not self.pacing_gbps > 0:
            bad("pacing_gbps", "must be > 0 or None")
        if not isinstance(self.eos_repeats, int) or not 1 <= self.eos_repeats <= 64:
            bad("eos_repeats", "must be an integer in 1..64")
        for name in ("recovery_timeout_s", "op_timeout_s", "line_rate_gbps"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        if not isinstance(self.max_early_nbytes, int) or self.max_early_nbytes < 0:
            bad("max_early_nbytes", "must be a non-negative integer")
        if self.secret is not None and not isinstance(self.secret, (bytes, bytearray)):
            bad("secret", "must be bytes or None")
        if self.secret is not None and not 1 <= len(self.secret) <= 64:
            bad("secret", "BLAKE2b keys are 1..64 bytes")
        if not isinstance(self.eager_max_nbytes, int) or self.eager_max_nbytes < 0:
            bad("eager_max_nbytes", "must be a non-negative integer (bytes; larger SEND "
                "payloads use the RTS/CTS rendezvous)")
        if not 0 < self.pacing_min_fraction <= 1:
            bad("pacing_min_fraction", "must be in (0, 1]")


@dataclass
class EngineStats:
    messages_in: int = 0
    messages_out: int = 0
    message_bytes_in: int = 0
    message_bytes_out: int = 0
    datagrams_in: int = 0
    datagrams_out: int = 0
    datagram_bytes_in: int = 0
    datagram_bytes_out: int = 0
    control_messages_out: int = 0           # FIN, RECOVER_REQ, ABORT, RTS, CTS
    rts_out: int = 0                        # rendezvous SENDs announced
    cts_out: int = 0                        # RTS answered
    cts_granted_early: int = 0              # ... before their RECV started (bytes reserved)
    cts_ahead_out: int = 0                  # CTS sent unasked as a large RECV started
    rts_crossed: int = 0                    # RTS that crossed our unasked CTS (expected)
    fins_out: int = 0
    drops: dict[str, int] = field(default_factory=dict)   # reason -> count
    recovery_requests: int = 0              # RECOVER_REQ sent
    recovery_served: int = 0                # RECOVER_DATA sent
    recovery_deferred: int = 0              # requests answered only after own recovery
    recovered_bytes: int = 0                # multicast bytes that came by recovery
    timeouts: int = 0
    aborts_out: int = 0
    completed: int = 0
    failed: int = 0
    early_nbytes: int = 0                   # held now
    early_peak_nbytes: int = 0
    pacing_gbps: float | None = None        # current (adapted) pacing rate

    def drop(self, reason: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())


# ---------------------------------------------------------------------------------------
# per-schedule precomputation (cached: planners reuse schedules across calls)

@dataclass
class _Plan:
    ndeps: list[int]
    succ: list[list[int]]
    runs: list[tuple]                       # per step: runs of its main region (or ())
    nelems: list[int]
    dst_runs: list[tuple]                   # COPY: destination runs
    recv_index: dict                        # (src, tag) -> step index (RECV)
    streams: dict                           # (root, ordinal) -> step index (MCAST / MRECV)
    peers: frozenset                        # ranks the program talks to point-to-point
    n_mrecv: int
    mcast_nelems: int                       # elements of all its MCAST and MRECV steps
    multicast: bool                         # the schedule multicasts (FIN ring on every rank)
    roots: tuple = ()                       # steps with no dependencies, in order
    send_index: dict = field(default_factory=dict)  # (peer, tag) -> step index (SEND)


_USES_MULTICAST: dict[int, tuple[Schedule, bool]] = {}


def _uses_multicast(schedule: Schedule) -> bool:
    """schedule.uses_multicast scans every rank's program: cached per schedule for the whole
    process, since a simulator posts one schedule on thousands of engines."""
    hit = _USES_MULTICAST.get(id(schedule))
    if hit is not None and hit[0] is schedule:
        return hit[1]
    if len(_USES_MULTICAST) >= 64:
        _USES_MULTICAST.pop(next(iter(_USES_MULTICAST)))
    value = schedule.uses_multicast
    _USES_MULTICAST[id(schedule)] = (schedule, value)
    return value


_RUNS: dict[tuple, tuple] = {}


def _runs(layout, blocks: tuple[int, ...]) -> tuple:
    """(layout.runs(blocks), their element count), memoised: the ranks of one schedule
    name the same blocks over and over."""
    key = (layout, blocks)
    hit = _RUNS.get(key)
    if hit is None:
        if len(_RUNS) >= 200_000:
            _RUNS.clear()
        runs = tuple(layout.runs(blocks))
        hit = _RUNS[key] = (runs, sum(b - a for a, b in runs))
    return hit


def _plan(schedule: Schedule, rank: int) -> _Plan:
    prog = schedule.program(rank)
    n = len(prog)
    nranks = schedule.nranks
    layouts = schedule.layouts
    ndeps = [len(st.deps) for st in prog]
    succ: list[list[int]] = [[] for _ in range(n)]
    runs, nelems, dst_runs = [], [], []
    recv_index, streams, send_index = {}, {}, {}
    peers = set()
    n_mrecv = mcast_nelems = 0
    SEND, RECV, COPY, MCAST, MRECV = Kind.SEND, Kind.RECV, Kind.COPY, Kind.MCAST, Kind.MRECV
    empty = ((), 0)
    for idx, st in enumerate(prog):
        for d in st.deps:
            if not 0 <= d < idx:
                raise InvalidArgument(f"{schedule.describe()}: rank {rank} step {idx} "
                                      f"depends on step {d}, not an earlier step")
            succ[d].append(idx)
        kind = st.kind
        if st.blocks:
            lay = layouts.get(st.buf)
            if lay is None:
                raise InvalidArgument(f"{schedule.describe()}: rank {rank} step {idx} names "
                                      f"buffer {st.buf!r}, which has no layout")
            r, ne = _runs(lay, st.blocks)
        else:
            r, ne = empty
        runs.append(r)
        nelems.append(ne)
        if kind is COPY:
            dst_runs.append(_runs(layouts[st.dst], st.dst_blocks)[0] if st.dst_blocks else ())
            continue
        dst_runs.append(())
        if kind is MCAST:
            streams[(rank, st.tag)] = idx
            mcast_nelems += ne
            continue
        peer = st.peer
        if not 0 <= peer < nranks or peer == rank:
            raise InvalidArgument(f"{schedule.describe()}: rank {rank} step {idx} has "
                                  f"peer {peer}, not another of {nranks} ranks")
        if kind is RECV:
            recv_index[(peer, st.tag)] = idx
            peers.add(peer)
        elif kind is SEND:
            send_index[(peer, st.tag)] = idx
            peers.add(peer)
        elif kind is MRECV:
            streams[(peer, st.tag)] = idx
            n_mrecv += 1
            mcast_nelems += ne
    return _Plan(ndeps, succ, runs, nelems, dst_runs, recv_index, streams, frozenset(peers),
                 n_mrecv, mcast_nelems, bool(streams) or _uses_multicast(schedule),
                 tuple(i for i, d in enumerate(ndeps) if d == 0), send_index)


def _gaps(held: bytearray, asked: bytearray, lo: int, hi: int) -> list[tuple[int, int]]:
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


def slice_runs(runs, start: int, stop: int) -> tuple[tuple[int, int], ...]:
    """The runs covering elements ``[start, stop)`` of the concatenation of ``runs``."""
    out = []
    pos = 0
    for a, b in runs:
        n = b - a
        lo, hi = max(start, pos), min(stop, pos + n)
        if lo < hi:
            out.append((a + lo - pos, a + hi - pos))
        pos += n
        if pos >= stop:
            break
    return tuple(out)


def _chunk_runs(runs, chunk_elems: int) -> list[tuple]:
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


# ---------------------------------------------------------------------------------------
# per-request state

class _Stream:
    """One multicast stream as this rank sees it: the root's MCAST, or an MRECV of it."""

    __slots__ = ("idx", "root", "ordinal", "owner", "nelems", "nbytes", "chunk_elems",
                 "nchunks", "buf", "bitmap", "have", "held", "eos_seen",
                 "last_progress", "requested", "deferred", "runs")

    def __init__(self, idx, root, ordinal, owner, runs, nelems, itemsize, mtu):
        self.idx, self.root, self.ordinal, self.owner = idx, root, ordinal, owner
        self.runs = runs
        self.nelems = nelems
        self.nbytes = nelems * itemsize
        self.chunk_elems = max(1, mtu // itemsize)
        self.nchunks = -(-nelems // self.chunk_elems)
        self.buf = ""
        self.bitmap = None
        self.have = 0
        self.held = []                  # (header, payload) datagrams before the step started
        self.eos_seen = False
        self.last_progress = 0.0
        self.requested = None           # bytearray: chunks asked of the successor
        self.deferred = []              # (requester, header) recovery requests to answer


class _Request:
    __slots__ = ("req", "seq", "sched", "prog", "plan", "itemsize", "sig", "_desc", "state",
                 "ndeps", "ndone", "ready", "held", "held_nbytes", "streams", "mrecv_left",
                 "multicast", "fin_sent", "fin_received", "outstanding", "op_timer",
                 "rec_timer", "pace_timers", "rto", "mcast_bytes_in", "recovered_nbytes",
                 "mcast_bytes_out", "served_own_nbytes", "tokens", "mismatch", "mis_timer", "rts_wait", "rdv", "granted", "cts_early",
                 "cts_ahead")

    def __init__(self, req, seq, sched, plan, itemsize, sig, desc):
        self.req, self.seq, self.sched, self.plan = req, seq, sched, plan
        self.prog = None
        self.itemsize, self.sig, self._desc = itemsize, sig, desc
        self.state = [_PENDING] * len(plan.ndeps)
        self.ndeps = list(plan.ndeps)
        self.ndone = 0
        self.ready = deque()
        self.held = {}                  # (src, tag) -> (header, payload): RECV not started
        self.held_nbytes = 0
        self.streams = {}               # (root, ordinal) -> _Stream
        self.mrecv_left = plan.n_mrecv
        self.multicast = plan.multicast
        self.fin_sent = self.fin_received = False
        self.outstanding = 0            # Sends not yet reported done
        self.op_timer = self.rec_timer = None
        self.pace_timers = {}           # timer -> step index (paced MCAST completions)
        self.rto = 0.0
        self.mcast_bytes_in = 0
        self.recovered_nbytes = 0
        self.mcast_bytes_out = 0        # our own streams' bytes, multicast
        self.served_own_nbytes = 0      # ... and re-sent by unicast: the loss others saw
        self.tokens = set()
        self.mismatch = None            # our MismatchError text, while awaiting the other call
        self.mis_timer = None
        self.rts_wait = None            # (peer, tag) -> SEND step index awaiting its CTS
        self.rdv = None                 # (src, tag) of RECVs whose RTS was accepted
        self.granted = None             # (src, tag) -> bytes reserved by an early CTS
        self.cts_early = None           # (peer, tag): CTS that came before the SEND started
        self.cts_ahead = None           # (src, tag): CTS sent unasked as the RECV started

    @property
    def desc(self) -> str:
        """The call, for error messages: formatted on first use (every post formatting it
        measured ~2 us of a small collective's engine time). ``_desc`` holds (dtype, op)
        until then."""
        d = self._desc
        if isinstance(d, tuple):
            dtype, op = d
            sc = self.sched
            d = self._desc = (
                f"{sc.collective} {sc.algorithm} (request {self.req}, seq {self.seq}, "
                f"P={sc.nranks}, count={sc.count}, root={sc.root}"
                + (f", {dtype}" if dtype else "") + (f", op={op}" if op else "") + ")")
        return d


# ---------------------------------------------------------------------------------------

class Engine:
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
        self._reqs: dict[int, _Request] = {}
        self._by_seq: dict[int, _Request] = {}
        self._early: dict[int, list] = {}           # seq -> [(is_msg, src, header, payload)]
        self._early_failed: dict[int, str] = {}     # seq -> why its messages were lost
        self._timers: dict[int, tuple] = {}         # timer id -> (kind, request, arg)
        self._tokens: dict[int, tuple] = {}         # token -> (request or None, step index)
        self._next_token = 0
        self._next_timer = 0
        self._lost: dict[int, str] = {}
        self._pace_next = 0.0
        self._rate_gbps = self.config.pacing_gbps
        self._sig_cache: dict[tuple, tuple] = {}    # -> (schedule, sig)
        self._plans: dict[tuple, tuple] = {}        # (id(schedule), rank) -> (schedule, plan)
        self._grant_wait: deque = deque()           # (request, (src, tag)): RTS refused a grant

    # -- public state ---------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Any request outstanding."""
        return bool(self._reqs)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    # -- posting --------------------------------------------------------------------------
    def post(self, req: int, schedule: Schedule, itemsize: int, now: float, *,
             dtype: str = "", op: str = "") -> list[Action]:
        """Start a collective. Raises InvalidArgument (before anything is sent) when the
        schedule does not fit this engine; returns the first actions."""
        if not isinstance(schedule, Schedule):
            raise InvalidArgument(f"post needs a Schedule, got {type(schedule).__name__}")
        if not isinstance(req, int) or req in self._reqs:
            raise InvalidArgument(f"request id {req!r} is already outstanding (or not an "
                                  "int); use a fresh id per call")
        if schedule.nranks != self.nranks:
            raise InvalidArgument(f"{schedule.describe()} is for {schedule.nranks} ranks but "
                                  f"this communicator has {self.nranks}")
        if len(schedule.programs) != self.nranks:
            raise InvalidArgument(f"{schedule.describe()} has {len(schedule.programs)} "
                                  f"programs for {self.nranks} ranks")
        if not isinstance(itemsize, int) or itemsize < 1:
            raise InvalidArgument(f"itemsize must be a positive integer, got {itemsize!r}")
        plan = self._get_plan(schedule)
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
        r = _Request(req, seq, schedule, plan, itemsize, sig, (dtype, op))
        r.prog = schedule.program(self.rank)
        self._reqs[req] = r
        self._by_seq[seq] = r
        out: list[Action] = []
        r.op_timer = self._set_timer(out, now + self.config.op_timeout_s, "op", r, None)
        if r.multicast:
            rate = self._rate_gbps or self.config.line_rate_gbps
            total = plan.mcast_nelems * itemsize
            r.rto = self.config.recovery_timeout_s + 2 * total * 8 / (rate * 1e9)
            if self.nranks == 1:                # nobody to hear it, nobody to shake hands with
                r.fin_sent = r.fin_received = True
        # A peer already lost: fail at once, clearly.
        for p in self._lost:
            if r.multicast or p in plan.peers:
                for _, _, h, _ in self._early.pop(seq, ()):
                    self._early_release(h)
                self._fail(r, PeerLost(p, f"rank {self.rank}: {r.desc} needs rank {p}, which "
                                          f"was lost earlier ({self._lost[p]})"), out,
                           abort=None)
                return out
        why = self._early_failed.pop(seq, None)
        if why is not None:
            for _, _, h, _ in self._early.pop(seq, ()):
                self._early_release(h)
            self._fail(r, ProtocolError(f"rank {self.rank}: {r.desc}: {why}"), out,
                       abort=AbortReason.OVERFLOW)
            return out
        r.ready.extend(plan.roots)
        self._pump(r, now, out)
        if r.multicast and r.mrecv_left == 0 and not r.fin_sent and self._reqs.get(r.req) is r:
            self._send_fin(r, out)
        early = self._early.pop(seq, None)
        if early:
            for is_msg, src, h, payload in early:
                self._early_release(h)
                if self._reqs.get(r.req) is not r:
                    break
                if is_msg:
                    self._message(src, h, payload, now, out)
                else:
                    self._datagram(h, payload, now, out)
        if self._reqs.get(r.req) is r:
            self._maybe_complete(r, out)
        if self._grant_wait:
            self._retry_grants(out)
        return out

    def _get_plan(self, schedule: Schedule) -> _Plan:
        key = (id(schedule), self.rank)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is schedule:
            return hit[1]
        plan = _plan(schedule, self.rank)
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

    def on_send_done(self, token: int, now: float) -> list[Action]:
        ent = self._tokens.pop(token, None)
        if ent is None:
            return []
        r, idx = ent
        out: list[Action] = []
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
        out: list[Action] = []
        if self._reqs.get(r.req) is not r:
            return out
        if kind == "op":
            r.op_timer = None
            self.stats.timeouts += 1
            self._fail(r, CollectiveTimeout(
                f"rank {self.rank}: {r.desc} not done after {self.config.op_timeout_s:g} s; "
                f"waiting on {self._stuck(r)}"), out, abort=AbortReason.TIMEOUT)
        elif kind == "pace":
            r.pace_timers.pop(timer, None)
            self._step_done(r, arg)
            self._pump(r, now, out)
            self._maybe_complete(r, out)
        elif kind == "recover":
            r.rec_timer = None
            self._recovery_timer(r, now, out)
        elif kind == "mismatch":
            r.mis_timer = None
            self._fail(r, MismatchError(f"{r.mismatch} (the other rank did not describe its "
                                        "call in time)"), out, abort=None)
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
            if r.multicast or any(r.state[i] != _DONE and r.prog[i].peer == peer
                                  and r.prog[i].kind in (Kind.SEND, Kind.RECV)
                                  for i in range(len(r.prog))):
                self._fail(r, PeerLost(peer, f"rank {self.rank}: {r.desc} was waiting on "
                                             f"{self._stuck(r)}: {self._lost[peer]}"),
                           out, abort=AbortReason.PEER_LOST, lost=peer)
        return out

    # -- messages -------------------------------------------------------------------------
    def _message(self, src: int, h: Header, payload, now: float, out: list) -> None:
        st = self.stats
        if h.comm != self.comm:
            st.drop("foreign_comm")
            return
        if h.src != src or not 0 <= src < self.nranks or src == self.rank:
            st.drop("bad_src")
            return
        r = self._by_seq.get(h.seq)
        if r is None:
            self._hold_early(True, src, h, payload, h.payload_nbytes)
            return
        kind = h.kind
        if kind is MsgKind.ABORT:
            self._on_abort(r, src, h, payload, out)
            return
        if h.sig != r.sig:
            self._mismatch(r, f"rank {src}'s {kind} message carries call signature "
                              f"0x{h.sig:08x}, this call's is 0x{r.sig:08x}", now, out)
            return
        if kind is MsgKind.DATA:
            idx = r.plan.recv_index.get((src, h.tag))
            if idx is None:
                st.drop("unexpected_data")
                return
            nbytes = r.plan.nelems[idx] * r.itemsize
            if h.length != nbytes:
                self._mismatch(r, f"step {idx} expects {nbytes} bytes from rank {src} but "
                                  f"its message (tag {h.tag}) carries {h.length}", now, out)
                return
            state = r.state[idx]
            granted = r.granted.pop((src, h.tag), 0) if r.granted else 0
            if state == _STARTED:
                if granted:                 # the RECV started after its early CTS
                    r.held_nbytes -= granted
                    st.early_nbytes -= granted
                if nbytes:
                    out.append(_deliver(payload, _region(r.req, r.prog[idx].buf,
                                                         r.plan.runs[idx], nbytes),
                                        r.prog[idx].reduce))
                self._step_done(r, idx)
                self._pump(r, now, out)
                self._maybe_complete(r, out)
            elif state == _PENDING:
                if (src, h.tag) in r.held:
                    st.drop("duplicate")
                    return
                cost = nbytes + _ENTRY_OVERHEAD_NBYTES
                if granted:                 # reserved by the early CTS: already charged
                    r.held[(src, h.tag)] = (h, _own(payload))
                    return
                if not self._charge(cost):
                    self._fail(r, ProtocolError(
                        f"rank {self.rank}: {r.desc}: more than max_early_nbytes="
                        f"{self.config.max_early_nbytes} of messages held before their "
                        "steps could start"), out, abort=AbortReason.OVERFLOW)
                    return
                r.held[(src, h.tag)] = (h, _own(payload))
                r.held_nbytes += cost
            else:
                st.drop("duplicate")
        elif kind is MsgKind.RTS:
            self._on_rts(r, src, h, now, out)
        elif kind is MsgKind.CTS:
            self._on_cts(r, src, h, out)
        elif kind is MsgKind.FIN:
            if src != (self.rank - 1) % self.nranks or not r.multicast or r.fin_received:
                st.drop("unexpected_fin")
                return
            r.fin_received = True
            self._maybe_complete(r, out)
        elif kind is MsgKind.RECOVER_REQ:
            self._on_recover_req(r, src, h, out)
        elif kind is MsgKind.RECOVER_DATA:
            self._on_recover_data(r, src, h, payload, now, out)
        else:
            st.drop("bad_kind")

    # -- rendezvous -----------------------------------------------------------------------
    def _on_rts(self, r: _Request, src: int, h: Header, now: float, out: list) -> None:
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
        if key in rdv or key in r.held or state == _DONE:
            st.drop("duplicate_rts")
            return
        if state == _STARTED:
            rdv.add(key)
            self._send_cts(r, src, h.tag, out)
            return
        # The RECV waits on its dependencies. Grant now while the early buffer allows
        # (sends must not wait on RECVs, see the module docstring); else hold the RTS.
        cost = nbytes + _ENTRY_OVERHEAD_NBYTES
        if self._charge(cost):
            rdv.add(key)
            if r.granted is None:
                r.granted = {}
            r.granted[key] = cost
            r.held_nbytes += cost
            st.cts_granted_early += 1
            self._send_cts(r, src, h.tag, out)
            return
        if not self._charge(_ENTRY_OVERHEAD_NBYTES):
            self._fail(r, ProtocolError(
                f"rank {self.rank}: {r.desc}: more than max_early_nbytes="
                f"{self.config.max_early_nbytes} of messages held before their "
                "steps could start"), out, abort=AbortReason.OVERFLOW)
            return
        rdv.add(key)
        r.held[key] = (h, None)
        r.held_nbytes += _ENTRY_OVERHEAD_NBYTES
        # Grant it as soon as the buffer has room again: its RECV may wait on a SEND of
        # ours that waits on the peer's CTS (recursive doubling), which only grants end.
        self._grant_wait.append((r, key))

    def _retry_grants(self, out: list) -> None:
        """Grant held RTSs of posted requests, oldest first, while the early buffer
        has room (called after any event that may have released some)."""
        wait = self._grant_wait
        st = self.stats
        while wait:
            r, key = wait[0]
            held = r.held.get(key) if self._reqs.get(r.req) is r else None
            if held is None or held[0].kind is not MsgKind.RTS:
                wait.popleft()                  # its RECV started, or the request ended
                continue
            idx = r.plan.recv_index[key]
            cost = r.plan.nelems[idx] * r.itemsize + _ENTRY_OVERHEAD_NBYTES
            # the held header's own cost is given back as the payload's is reserved
            st.early_nbytes -= _ENTRY_OVERHEAD_NBYTES
            if not self._charge(cost):
                st.early_nbytes += _ENTRY_OVERHEAD_NBYTES
                return
            wait.popleft()
            del r.held[key]
            r.held_nbytes += cost - _ENTRY_OVERHEAD_NBYTES
            if r.granted is None:
                r.granted = {}
            r.granted[key] = cost
            st.cts_granted_early += 1
            self._send_cts(r, key[0], key[1], out)

    def _send_cts(self, r: _Request, dst: int, tag: int, out: list) -> None:
        st = self.stats
        st.cts_out += 1
        st.control_messages_out += 1
        h = make_header(MsgKind.CTS, self.comm, r.seq, self.rank, tag, 0, 0, r.sig)
        self._send(r, dst, h, None, -1, out)

    def _on_cts(self, r: _Request, src: int, h: Header, out: list) -> None:
        key = (src, h.tag)
        wait = r.rts_wait
        idx = wait.pop(key, None) if wait else None
        if idx is None:
            sidx = r.plan.send_index.get(key)
            if (sidx is not None and r.state[sidx] == _PENDING
                    and r.plan.nelems[sidx] * r.itemsize > self.config.eager_max_nbytes
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

    def _on_abort(self, r: _Request, src: int, h: Header, payload, out: list) -> None:
        try:
            text = bytes(payload).decode("utf-8", "replace") if payload is not None else ""
        except Exception:
            text = ""
        text = text[:2000] or "(no reason given)"
        if r.mismatch is not None:
            # We found the mismatch and were waiting for the other side's call: name both.
            self._fail(r, MismatchError(f"{r.mismatch}; rank {src} says: {text}"), out,
                       abort=None)
            return
        what = f"rank {self.rank}: {r.desc} aborted by rank {src}: {text}"
        reason = h.tag
        if reason == AbortReason.MISMATCH:
            if h.sig != r.sig:
                # The detector names its call; tell it ours, so both errors name both.
                self._send_aborts(r, AbortReason.MISMATCH,
                                  f"rank {self.rank} called {r.desc}, call signature "
                                  f"0x{r.sig:08x}", 0, out, only=src)
            err: PolycastError = MismatchError(
                f"{what} (this rank's call signature 0x{r.sig:08x}, rank {src}'s "
                f"0x{h.sig:08x})")
        elif reason == AbortReason.TIMEOUT:
            err = CollectiveTimeout(what)
        elif reason == AbortReason.PEER_LOST:
            err = PeerLost(h.offset if h.offset < self.nranks else src, what)
        else:
            err = ProtocolError(what)
        self._fail(r, err, out, abort=None)

    def _mismatch(self, r: _Request, detail: str, now: float, out: list) -> None:
        """Abort every peer now; fail this request once the other call's description
        comes back (its ABORT), or after a short grace, so the error names both calls."""
        if r.mismatch is not None:
            return
        r.mismatch = (f"rank {self.rank}: {r.desc}: ranks called collectives differently: "
                      f"{detail}")
        self._send_aborts(r, AbortReason.MISMATCH, r.mismatch, 0, out)
        grace = min(self.config.op_timeout_s, 4 * self.config.recovery_timeout_s)
        r.mis_timer = self._set_timer(out, now + grace, "mismatch", r, None)

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
            self._hold_early(False, src, h, payload, h.length)
            return
        if h.sig != r.sig:
            st.drop("bad_sig")
            return
        s = r.streams.get((src, h.stream)) or self._stream(r, (src, h.stream))
        if s is None or s.owner:
            st.drop("bad_stream")
            return
        if h.kind is MsgKind.MCAST_DATA:
            if s.bitmap is None:            # the MRECV step has not started: hold
                if self._charge(h.length + _ENTRY_OVERHEAD_NBYTES, datagram=True):
                    s.held.append((h, payload))
                    r.held_nbytes += h.length + _ENTRY_OVERHEAD_NBYTES
                else:
                    st.drop("early_overflow")
                return
            i = h.tag
            if i >= s.nchunks:
                st.drop("bad_chunk")
                return
            ce = s.chunk_elems
            nb = (min(ce, s.nelems - i * ce)) * r.itemsize
            if h.offset != i * ce * r.itemsize or h.length != nb:
                st.drop("bad_chunk")
                return
            if s.bitmap[i]:
                st.drop("duplicate")
                return
            s.bitmap[i] = 1
            s.have += 1
            s.last_progress = now
            r.mcast_bytes_in += nb
            runs = s.runs
            e0 = i * ce
            e1 = e0 + nb // r.itemsize
            if len(runs) == 1:          # the common case: the stream is one element range
                a0 = runs[0][0]
                chunk = ((a0 + e0, a0 + e1),)
            else:
                chunk = slice_runs(runs, e0, e1)
            out.append(_deliver(payload, _region(r.req, s.buf, chunk, nb), False))
            if s.have == s.nchunks:
                self._stream_complete(r, s, now, out)
            elif s.deferred:
                self._answer_deferred(r, s, out)
        elif h.kind is MsgKind.MCAST_EOS:
            if h.tag != s.nchunks or h.offset != s.nbytes:
                st.drop("bad_eos")
                return
            if s.eos_seen:
                st.drop("duplicate_eos")
                return
            s.eos_seen = True
            if s.bitmap is not None and s.have < s.nchunks:
                self._request_gaps(r, s, out)
        else:
            st.drop("bad_kind")

    # -- early buffer ---------------------------------------------------------------------
    def _charge(self, cost: int, datagram: bool = False) -> bool:
        st = self.stats
        limit = self.config.max_early_nbytes
        if datagram:
            # Datagrams can be recovered, reliable messages cannot: keep a quarter of the
            # budget for messages so a flood of early datagrams never costs a FIN.
            limit -= limit // 4
        if st.early_nbytes + cost > limit:
            return False
        st.early_nbytes += cost
        if st.early_nbytes > st.early_peak_nbytes:
            st.early_peak_nbytes = st.early_nbytes
        return True

    def _early_release(self, h: Header) -> None:
        self.stats.early_nbytes -= h.payload_nbytes + _ENTRY_OVERHEAD_NBYTES

    def _hold_early(self, is_msg: bool, src: int, h: Header, payload, nbytes: int) -> None:
        seq = h.seq
        # Sequence numbers are u32 and wrap; "behind us" is the half-space below next_seq.
        behind = (self._next_seq - 1 - seq) & 0xFFFFFFFF
        if self._next_seq > 0 and behind < 0x80000000:
            self.stats.drop("stale")
            return
        if seq in self._early_failed:
            self.stats.drop("early_overflow")
            return
        if not self._charge(nbytes + _ENTRY_OVERHEAD_NBYTES, datagram=not is_msg):
            self.stats.drop("early_overflow")
            if is_msg:
                # A reliable message is never resent: the collective cannot succeed.
                self._early_failed[seq] = (
                    f"messages of this collective arrived before it was posted and "
                    f"overflowed max_early_nbytes={self.config.max_early_nbytes}")
            return
        self._early.setdefault(seq, []).append((is_msg, src, h, _own(payload)))

    # -- steps ----------------------------------------------------------------------------
    def _pump(self, r: _Request, now: float, out: list) -> None:
        """Start every ready step; steps that finish at once release their successors."""
        ready = r.ready
        while ready:
            if self._reqs.get(r.req) is not r:
                ready.clear()
                return
            idx = ready.popleft()
            self._start(r, idx, now, out)

    def _step_done(self, r: _Request, idx: int) -> None:
        r.state[idx] = _DONE
        r.ndone += 1
        ndeps = r.ndeps
        for s in r.plan.succ[idx]:
            ndeps[s] -= 1
            if ndeps[s] == 0:
                r.ready.append(s)

    def _start(self, r: _Request, idx: int, now: float, out: list) -> None:
        step = r.prog[idx]
        r.state[idx] = _STARTED
        kind = step.kind
        plan = r.plan
        if kind is Kind.SEND:
            nbytes = plan.nelems[idx] * r.itemsize
            if nbytes > self.config.eager_max_nbytes:
                key = (step.peer, step.tag)
                if r.cts_early and key in r.cts_early:
                    # the receiver's RECV started first and cleared us already: no RTS
                    r.cts_early.discard(key)
                    h = make_header(MsgKind.DATA, self.comm, r.seq, self.rank, step.tag, 0,
                                    nbytes, r.sig)
                    self._send(r, step.peer, h, _region(r.req, step.buf, plan.runs[idx],
                                                        nbytes), idx, out)
                    return
                h = make_header(MsgKind.RTS, self.comm, r.seq, self.rank, step.tag, 0,
                                nbytes, r.sig, 0, F_NO_PAYLOAD)
                if r.rts_wait is None:
                    r.rts_wait = {}
                r.rts_wait[(step.peer, step.tag)] = idx
                self.stats.rts_out += 1
                self.stats.control_messages_out += 1
                self._send(r, step.peer, h, None, -1, out)
                return
            h = make_header(MsgKind.DATA, self.comm, r.seq, self.rank, step.tag, 0, nbytes,
                            r.sig)
            region = _region(r.req, step.buf, plan.runs[idx], nbytes) if nbytes else None
            self._send(r, step.peer, h, region, idx, out)
        elif kind is Kind.RECV:
            held = r.held.pop((step.peer, step.tag), None)
            if held is not None:
                h, payload = held
                cost = h.payload_nbytes + _ENTRY_OVERHEAD_NBYTES
                r.held_nbytes -= cost
                self.stats.early_nbytes -= cost
                if h.kind is MsgKind.RTS:       # a held rendezvous: clear it to send now
                    self._send_cts(r, step.peer, step.tag, out)
                    return
                if h.length:
                    out.append(_deliver(payload, _region(r.req, step.buf, plan.runs[idx],
                                                         h.length), step.reduce))
                self._step_done(r, idx)
            elif plan.nelems[idx] * r.itemsize > self.config.eager_max_nbytes:
                # A large message will come by rendezvous: clear it now, so a sender that
                # is behind us sends its DATA without the RTS round trip.
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
        elif kind is Kind.COPY:
            nbytes = plan.nelems[idx] * r.itemsize
            if nbytes:
                out.append(_copy(_region(r.req, step.buf, plan.runs[idx], nbytes),
                                 _region(r.req, step.dst, plan.dst_runs[idx], nbytes),
                                 step.reduce))
            self._step_done(r, idx)
        elif kind is Kind.MCAST:
            self._start_mcast(r, idx, now, out)
        elif kind is Kind.MRECV:
            self._start_mrecv(r, idx, now, out)

    def _send(self, r: _Request, peer: int, h: Header, region, idx: int, out: list,
              data: bytes = b"") -> None:
        token = self._next_token
        self._next_token += 1
        self._tokens[token] = (r, idx)
        r.outstanding += 1
        r.tokens.add(token)
        st = self.stats
        st.messages_out += 1
        st.message_bytes_out += h.payload_nbytes
        out.append(_send_action(peer, h, region, token, data))

    # -- multicast: the root --------------------------------------------------------------
    def _stream(self, r: _Request, key: tuple[int, int]) -> _Stream | None:
        """The stream state of (root, ordinal), made on first use: a simulated allgather
        on thousands of ranks must not allocate P streams per rank up front."""
        s = r.streams.get(key)
        if s is None:
            idx = r.plan.streams.get(key)
            if idx is None:
                return None
            s = _Stream(idx, key[0], key[1], key[0] == self.rank, r.plan.runs[idx],
                        r.plan.nelems[idx], r.itemsize, self.config.mtu_nbytes)
            r.streams[key] = s
        return s

    def _start_mcast(self, r: _Request, idx: int, now: float, out: list) -> None:
        step = r.prog[idx]
        s = self._stream(r, (self.rank, step.tag))
        isz = r.itemsize
        ce = s.chunk_elems
        rate = self._rate_gbps
        t = max(now, self._pace_next)
        per_bit = 1.0 / (rate * 1e9) if rate else 0.0
        comm, seq, me, sig, ordinal, buf, req = (self.comm, r.seq, self.rank, r.sig,
                                                 step.tag, step.buf, r.req)
        st = self.stats
        if self.nranks == 1:
            self._step_done(r, idx)
            return
        pieces = _chunk_runs(s.runs, ce)
        MCAST_DATA = MsgKind.MCAST_DATA
        for i, runs in enumerate(pieces):
            nb = sum(b - a for a, b in runs) * isz
            h = make_header(MCAST_DATA, comm, seq, me, i, i * ce * isz, nb, sig, ordinal)
            out.append(_multicast(h, _region(req, buf, runs, nb), t))
            st.datagrams_out += 1
            st.datagram_bytes_out += nb
            r.mcast_bytes_out += nb
            if rate:
                t += (nb + HEADER_NBYTES) * 8 * per_bit
        eos = Header(MsgKind.MCAST_EOS, comm, seq, me, s.nchunks, s.nbytes, 0, sig, ordinal)
        for _ in range(self.config.eos_repeats):
            out.append(Multicast(eos, None, t))
            st.datagrams_out += 1
            if rate:
                t += HEADER_NBYTES * 8 * per_bit
        if rate:
            self._pace_next = t
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

    # -- multicast: receivers -------------------------------------------------------------
    def _start_mrecv(self, r: _Request, idx: int, now: float, out: list) -> None:
        step = r.prog[idx]
        s = self._stream(r, (step.peer, step.tag))
        s.buf = step.buf
        s.bitmap = bytearray(s.nchunks)
        s.requested = bytearray(s.nchunks)
        s.last_progress = now
        if s.nchunks == 0:
            self._stream_complete(r, s, now, out)
            return
        held, s.held = s.held, []
        for h, payload in held:
            cost = h.length + _ENTRY_OVERHEAD_NBYTES
            r.held_nbytes -= cost
            self.stats.early_nbytes -= cost
            self._datagram(h, payload, now, out)
            if self._reqs.get(r.req) is not r:
                return
        if s.have < s.nchunks:
            if s.eos_seen:
                self._request_gaps(r, s, out)
            if r.rec_timer is None:
                r.rec_timer = self._set_timer(out, now + r.rto, "recover", r, None)

    def _stream_complete(self, r: _Request, s: _Stream, now: float, out: list) -> None:
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

    def _send_fin(self, r: _Request, out: list) -> None:
        r.fin_sent = True
        self.stats.fins_out += 1
        self.stats.control_messages_out += 1
        h = Header(MsgKind.FIN, self.comm, r.seq, self.rank, 0, 0, 0, r.sig)
        self._send(r, (self.rank + 1) % self.nranks, h, None, -1, out)

    def _recovery_timer(self, r: _Request, now: float, out: list) -> None:
        pending = False
        for s in r.streams.values():
            if s.owner or s.bitmap is None or s.have == s.nchunks:
                continue
            pending = True
            wait = r.rto if (s.have or s.eos_seen) else r.rto * _SILENT_RTO_FACTOR
            if now - s.last_progress >= wait * 0.999:
                self._request_gaps(r, s, out)
        if pending:
            r.rec_timer = self._set_timer(out, now + r.rto, "recover", r, None)

    def _request_gaps(self, r: _Request, s: _Stream, out: list, lo: int = 0,
                      hi: int | None = None) -> None:
        """Ask the ring successor for every missing chunk range (within chunks [lo, hi))
        not already asked for."""
        hi = s.nchunks if hi is None else hi
        ce, isz = s.chunk_elems, r.itemsize
        succ = (self.rank + 1) % self.nranks
        for i, j in _gaps(s.bitmap, s.requested, lo, hi):
            s.requested[i:j] = b"\x01" * (j - i)
            off = i * ce * isz
            nbytes = min(j * ce, s.nelems) * isz - off
            h = make_header(MsgKind.RECOVER_REQ, self.comm, r.seq, self.rank, s.root, off,
                            nbytes, r.sig, s.ordinal, F_NO_PAYLOAD)
            self.stats.recovery_requests += 1
            self.stats.control_messages_out += 1
            self._send(r, succ, h, None, -1, out)

    def _range_chunks(self, r: _Request, s: _Stream, h: Header) -> tuple[int, int] | None:
        """Chunk range [c0, c1) that a recovery header's byte range covers exactly."""
        isz, ce = r.itemsize, s.chunk_elems
        cb = ce * isz
        off, nb = h.offset, h.length
        if nb <= 0 or off % cb or off + nb > s.nbytes:
            return None
        end = off + nb
        if end != s.nbytes and end % cb:
            return None
        return off // cb, -(-end // cb)

    def _on_recover_req(self, r: _Request, src: int, h: Header, out: list) -> None:
        s = self._stream(r, (h.tag, h.stream))
        rng = self._range_chunks(r, s, h) if s is not None else None
        if rng is None or not h.flags & F_NO_PAYLOAD:
            self.stats.drop("bad_recover_req")
            return
        if self._can_serve(r, s, rng):
            self._serve(r, s, src, h, out)
        else:
            self.stats.recovery_deferred += 1
            s.deferred.append((src, h, rng))
            if s.bitmap is not None and not s.owner:
                # The predecessor's request is evidence the stream was sent and that this
                # range is missing here too: pull it now rather than at our own timeout.
                self._request_gaps(r, s, out, rng[0], rng[1])

    def _can_serve(self, r: _Request, s: _Stream, rng) -> bool:
        if s.owner:
            return r.state[s.idx] != _PENDING       # the root's data is ready once started
        if s.bitmap is None:
            return False
        c0, c1 = rng
        return s.have == s.nchunks or 0 not in s.bitmap[c0:c1]

    def _serve(self, r: _Request, s: _Stream, dst: int, h: Header, out: list) -> None:
        isz = r.itemsize
        e0, e1 = h.offset // isz, (h.offset + h.length) // isz
        region = Region(r.req, r.prog[s.idx].buf, slice_runs(s.runs, e0, e1), h.length)
        reply = Header(MsgKind.RECOVER_DATA, self.comm, r.seq, self.rank, s.root, h.offset,
                       h.length, r.sig, s.ordinal)
        self.stats.recovery_served += 1
        if s.owner:
            r.served_own_nbytes += h.length
        self._send(r, dst, reply, region, -1, out)

    def _answer_deferred(self, r: _Request, s: _Stream, out: list) -> None:
        keep = []
        for src, h, rng in s.deferred:
            if self._can_serve(r, s, rng):
                self._serve(r, s, src, h, out)
            else:
                keep.append((src, h, rng))
        s.deferred = keep

    def _on_recover_data(self, r: _Request, src: int, h: Header, payload, now: float,
                         out: list) -> None:
        s = self._stream(r, (h.tag, h.stream))
        rng = self._range_chunks(r, s, h) if s is not None and not s.owner else None
        if rng is None or s.bitmap is None:
            self.stats.drop("bad_recover_data")
            return
        if s.have == s.nchunks:
            # Complete already: later steps may own these blocks now; never rewrite them.
            self.stats.drop("late_recovery")
            return
        c0, c1 = rng
        bm = s.bitmap
        isz, ce = r.itemsize, s.chunk_elems
        e0, e1 = h.offset // isz, (h.offset + h.length) // isz
        out.append(Deliver(payload, Region(r.req, r.prog[s.idx].buf,
                                           slice_runs(s.runs, e0, e1), h.length), False))
        new = 0
        for i in range(c0, c1):
            if not bm[i]:
                bm[i] = 1
                new += 1
                s.have += 1
                nb = min(ce, s.nelems - i * ce) * isz
                self.stats.recovered_bytes += nb
                r.recovered_nbytes += nb
        if new:
            s.last_progress = now
        if s.have == s.nchunks:
            self._stream_complete(r, s, now, out)
        elif s.deferred:
            self._answer_deferred(r, s, out)

    # -- completion and failure -----------------------------------------------------------
    def _maybe_complete(self, r: _Request, out: list) -> None:
        if r.ndone != len(r.state) or r.outstanding or r.mismatch is not None:
            return
        if r.multicast and not (r.fin_sent and r.fin_received):
            return
        if self._reqs.get(r.req) is not r:
            return
        self._adapt_pacing(r)
        self._cleanup(r, out)
        self.stats.completed += 1
        out.append(_complete(r.req))

    def _adapt_pacing(self, r: _Request) -> None:
        cfg = self.config
        if not cfg.pacing_gbps or not r.multicast:
            return
        # Loss as a receiver (what we had to recover) and as a sender (what our successor
        # pulled back of our own streams): a broadcast root receives nothing, so without
        # the second it would never slow down.
        got = r.mcast_bytes_in + r.recovered_nbytes
        recv_loss = r.recovered_nbytes / got if got else 0.0
        send_loss = r.served_own_nbytes / r.mcast_bytes_out if r.mcast_bytes_out else 0.0
        if not got and not r.mcast_bytes_out:
            return
        loss = max(recv_loss, send_loss)
        if loss > 0.01:
            self._rate_gbps = max(cfg.pacing_gbps * cfg.pacing_min_fraction,
                                  self._rate_gbps * 0.7)
        elif loss == 0:
            self._rate_gbps = min(cfg.pacing_gbps, self._rate_gbps * 1.1)
        self.stats.pacing_gbps = self._rate_gbps

    def _fail(self, r: _Request, err: PolycastError, out: list, abort: AbortReason | None,
              lost: int = 0) -> None:
        if self._reqs.get(r.req) is not r:
            return
        if abort is not None:
            self._send_aborts(r, abort, str(err), lost, out)
        self._cleanup(r, out)
        self.stats.failed += 1
        out.append(Fail(r.req, err))

    def _send_aborts(self, r: _Request, reason: AbortReason, text: str, lost: int, out: list,
                     only: int | None = None) -> None:
        data = text.encode("utf-8")[:4000]
        for p in range(self.nranks) if only is None else (only,):
            if p == self.rank or p in self._lost:
                continue
            h = make_header(MsgKind.ABORT, self.comm, r.seq, self.rank, int(reason), lost,
                            len(data), r.sig)
            token = self._next_token
            self._next_token += 1
            self._tokens[token] = (None, -1)
            st = self.stats
            st.aborts_out += 1
            st.control_messages_out += 1
            st.messages_out += 1
            st.message_bytes_out += len(data)
            out.append(Send(p, h, None, token, data))

    def _cleanup(self, r: _Request, out: list) -> None:
        del self._reqs[r.req]
        self._by_seq.pop(r.seq, None)
        for tid in [r.op_timer, r.rec_timer, r.mis_timer, *r.pace_timers]:
            if tid is not None and tid in self._timers:
                self._cancel_timer(out, tid)
        r.op_timer = r.rec_timer = r.mis_timer = None
        r.pace_timers.clear()
        for token in r.tokens:
            self._tokens.pop(token, None)
        r.tokens.clear()
        if r.held_nbytes:
            self.stats.early_nbytes -= r.held_nbytes
            r.held_nbytes = 0
        r.held.clear()
        for s in r.streams.values():
            s.held = []
            s.deferred = []

    def _stuck(self, r: _Request) -> str:
        """The first unfinished steps, for error messages."""
        parts = []
        for idx, step in enumerate(r.prog):
            if r.state[idx] == _DONE:
                continue
            if r.ndeps[idx] and r.state[idx] == _PENDING:
                continue            # waiting on an earlier step: not the root cause
            what = f"step {idx} ({step.kind}"
            if step.kind is Kind.SEND:
                what += f" to rank {step.peer}"
                if r.rts_wait and r.rts_wait.get((step.peer, step.tag)) == idx:
                    what += ": waiting for its clear-to-send (CTS)"
            elif step.kind in (Kind.RECV, Kind.MRECV):
                what += f" from rank {step.peer}"
            if step.kind is Kind.MRECV:
                s = r.streams.get((step.peer, step.tag))
                if s is not None and s.bitmap is not None:
                    what += f": {s.nchunks - s.have} of {s.nchunks} chunks missing"
            parts.append(what + ")")
            if len(parts) == 4:
                break
        if r.multicast and r.ndone == len(r.state):
            if not r.fin_received:
                parts.append(f"FIN from rank {(self.rank - 1) % self.nranks}")
        if r.outstanding and not parts:
            parts.append(f"{r.outstanding} sends not reported done")
        return ", ".join(parts) or "nothing (internal error)"

    # -- timers ---------------------------------------------------------------------------
    def _set_timer(self, out: list, deadline: float, kind: str, r: _Request, arg) -> int:
        tid = self._next_timer
        self._next_timer += 1
        self._timers[tid] = (kind, r, arg)
        out.append(_set_timer(tid, deadline))
        return tid

    def _cancel_timer(self, out: list, tid: int) -> None:
        if self._timers.pop(tid, None) is not None:
            out.append(_cancel_timer(tid))


def _own(payload):
    """A payload the engine keeps for later, as bytes of its own.

    Drivers hand payloads as views into their receive memory (the shm rings hand views into
    the ring, freed when the view dies). A view parked here until its step starts would pin
    that memory and every frame behind it, so the peer's next messages, the very clear-to-
    send or data that lets the step start, could never arrive: copy what is held, not what
    is delivered at once (None, the simulator's payload, stays None)."""
    if payload is None or type(payload) is bytes:
        return payload
    return bytes(memoryview(payload).cast("B"))
