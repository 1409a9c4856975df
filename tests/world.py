"""The engine's test world: N engines joined by an in-memory network, with a fake clock.

* The reliable channel (DATA, FIN, RECOVER_*, ABORT) never loses and keeps order per pair.
* Datagrams are delivered to every rank of the group, the sender included (as multicast on
  loopback does), each copy independently lost, duplicated and delayed (so reordered).
* Actions are carried out with :mod:`polycast.memory` on real numpy arrays.
* ``raw=True`` puts every message and datagram through the wire format (pack, then the
  engine's parser), MAC included when the config has a secret.
* ``pull_nbytes``: every pair pulls (Engine.set_pull_peers) rendezvous messages of at least
  that many bytes. Their payload stays the sender's (:class:`Pulled`) until the receiver reads
  it, or lets it go, and only then is the sender's SEND done, as over the runtime's
  single-copy descriptors.
* Everything is seeded; ``run`` is bounded in events and virtual seconds and, if requests
  are still unfinished, raises AssertionError naming them.
"""

from __future__ import annotations

import ctypes
import heapq
import random
from dataclasses import dataclass, field

import numpy as np

from polycast.engine.actions import (CancelTimer, CloseStream, Complete, Copy, Deliver, Fail,
                                     Matched, Multicast, MulticastChunks, OpenStream, Region,
                                     Send, SetTimer, StreamData)
from polycast.engine.engine import Engine, EngineConfig
from polycast.engine.mcast import chunk_datagrams
from polycast.engine.wire import F_PULL, MsgKind, parse_header, verify_mac
from polycast.memory import Buffers
from polycast.reference import reference
from polycast.runtime.transport.lazy import LazyPayload


class Pulled(LazyPayload):
    """A pulled DATA's payload: the sender's bytes, read when the receiver wants them."""

    piecewise = True
    holdable = True

    def __init__(self, src: int, data: bytes, token: int) -> None:
        super().__init__(src, len(data))
        self.data, self.token = np.frombuffer(data, np.uint8), token

    def _read(self, ranges) -> None:
        self._read_at(0, ranges)

    def _read_at(self, offset: int, ranges) -> None:
        for a, n in ranges:
            ctypes.memmove(a, self.data[offset:offset + n].ctypes.data, n)
            offset += n


@dataclass
class Net:
    loss: float = 0.0               # per datagram copy
    dup: float = 0.0                # per datagram copy: delivered twice
    jitter_s: float = 0.0           # extra uniform delay per datagram copy (reorders)
    latency_s: float = 2e-6         # reliable channel, one way
    dgram_latency_s: float = 2e-6
    drop: object = None             # optional fn(header, dst) -> True to drop a datagram copy


@dataclass
class Call:
    schedule: object
    op: str | None
    inputs: list
    recvs: list
    reqs: dict = field(default_factory=dict)    # rank -> req id


class World:
    def __init__(self, nranks: int, config: EngineConfig | None = None, net: Net | None = None,
                 seed: int = 0, raw: bool = False, comm: int = 0, pull_nbytes: int = 0) -> None:
        self.P = nranks
        self.config = config or EngineConfig()
        self.net = net or Net()
        self.rng = random.Random(seed)
        self.raw = raw
        self.engines = [Engine(r, nranks, comm, self.config) for r in range(nranks)]
        self.pulled: list[Pulled] = []
        if pull_nbytes:
            for r, eng in enumerate(self.engines):
                eng.set_pull_peers({p: pull_nbytes for p in range(nranks) if p != r})
        self.mem = [Buffers() for _ in range(nranks)]
        self.now = 0.0
        self._heap: list = []
        self._n = 0
        self._timers: list[dict[int, float]] = [{} for _ in range(nranks)]
        self._chan_last: dict[tuple[int, int], float] = {}
        self.dead: set[int] = set()
        self.done: dict[tuple[int, int], float] = {}        # (rank, req) -> time
        self.errors: dict[tuple[int, int], Exception] = {}  # (rank, req) -> error
        self.posted: set[tuple[int, int]] = set()
        self.sent: list[tuple[int, int, object]] = []        # (rank, peer, header) of Sends
        self.sent_at: list[float] = []                       # ... and when
        self.datagrams_sent = 0
        self.matched: dict[tuple[int, int], tuple] = {}     # (rank, req) -> (src, tag, nbytes)
        self.events = 0
        self._next_req = [0] * nranks
        # config.external_streams: the world places multicast chunks itself, as the
        # offload's receive workers do (one placer per rank: (seq, root, ordinal) -> state)
        self.placers: list[dict] = [{} for _ in range(nranks)]
        self.early_dgrams: list[dict] = [{} for _ in range(nranks)]

    # -- posting --------------------------------------------------------------------------
    def post(self, rank: int, schedule, send, recv, op: str | None = None, req: int | None = None,
             dtype: str | None = None) -> int:
        if req is None:
            req = self._next_req[rank]
        self._next_req[rank] = max(self._next_req[rank], req + 1)
        dt = self.mem[rank].register(req, schedule, rank, send, recv, op)
        self.posted.add((rank, req))
        acts = self.engines[rank].post(req, schedule, dt.itemsize, self.now,
                                       dtype=dtype or str(dt), op=str(op or ""))
        self._execute(rank, acts)
        return req

    def send(self, rank: int, peer: int, tag: int, arr: np.ndarray) -> int:
        """A point-to-point send of ``arr`` (engine/p2p.py)."""
        req = self._next_req[rank]
        self._next_req[rank] += 1
        self.mem[rank].register_arrays(req, send=arr)
        self.posted.add((rank, req))
        self._execute(rank, self.engines[rank].post_send(req, peer, tag, arr.nbytes,
                                                         arr.itemsize, self.now))
        return req

    def recv(self, rank: int, peer: int, tag: int, arr: np.ndarray) -> int:
        """A point-to-point receive into ``arr`` (peer/tag may be ANY_SOURCE/ANY_TAG)."""
        req = self._next_req[rank]
        self._next_req[rank] += 1
        self.mem[rank].register_arrays(req, recv=arr)
        self.posted.add((rank, req))
        self._execute(rank, self.engines[rank].post_recv(req, peer, tag, arr.nbytes,
                                                         arr.itemsize, self.now))
        return req

    def post_call(self, schedule, dtype="float32", op: str | None = None, seed: int = 0,
                  ranks=None, inputs=None) -> Call:
        """Post one collective on every rank (or ``ranks``) with make_inputs() data."""
        from polycast.reference import make_inputs
        coll = schedule.collective
        if inputs is None:
            inputs = make_inputs(coll, self.P, schedule.count, dtype, schedule.root, seed,
                                 op or "sum")
        _, nrecv = coll.buffer_counts(self.P, schedule.count)
        recvs = [np.full(nrecv, 99, dtype=inputs[0].dtype) for _ in range(self.P)]
        call = Call(schedule, op, inputs, recvs)
        for r in (range(self.P) if ranks is None else ranks):
            call.reqs[r] = self.post(r, schedule, inputs[r], recvs[r], op)
        return call

    def check(self, call: Call) -> None:
        """Every rank finished and holds exactly the reference result."""
        want = reference(call.schedule.collective, call.inputs, call.schedule.root,
                         call.op or "sum")
        for r, req in call.reqs.items():
            assert (r, req) not in self.errors, f"rank {r} failed: {self.errors[(r, req)]!r}"
            assert (r, req) in self.done, f"rank {r} request {req} did not complete"
            if want[r] is not None:
                np.testing.assert_array_equal(call.recvs[r], want[r],
                                              err_msg=f"rank {r} of {call.schedule.describe()}")

    # -- the event loop -------------------------------------------------------------------
    def _push(self, t: float, fn, *args) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, fn, args))

    def finished(self) -> bool:
        return all(k in self.done or k in self.errors for k in self.posted
                   if k[0] not in self.dead)

    def run(self, max_events: int = 2_000_000, max_time_s: float = 600.0,
            until_finished: bool = True) -> None:
        while self._heap:
            if until_finished and self.finished():
                return
            if self.events >= max_events or self._heap[0][0] > max_time_s:
                break
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = max(self.now, t)
            self.events += 1
            fn(*args)
        if until_finished and not self.finished():
            stuck = sorted(k for k in self.posted if k not in self.done and k not in self.errors
                           and k[0] not in self.dead)
            raise AssertionError(f"stuck after {self.events} events at t={self.now:.6f}s: "
                                 f"(rank, req) {stuck[:10]}; engine stats of rank "
                                 f"{stuck[0][0]}: {self.engines[stuck[0][0]].stats}")

    def advance(self, seconds: float) -> None:
        """Run every event up to now + seconds (whether or not requests finish)."""
        end = self.now + seconds
        while self._heap and self._heap[0][0] <= end:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = max(self.now, t)
            self.events += 1
            fn(*args)
        self.now = end

    # -- carrying out actions -------------------------------------------------------------
    def _execute(self, rank: int, actions) -> None:
        mem = self.mem[rank]
        for a in actions:
            if isinstance(a, Deliver):
                mem.deliver(a.region, a.payload, a.reduce)
            elif isinstance(a, Multicast):
                self._multicast(rank, a)
            elif isinstance(a, MulticastChunks):
                for d in chunk_datagrams(a):
                    self._multicast(rank, d)
            elif isinstance(a, Send):
                self._send(rank, a)
            elif isinstance(a, Copy):
                mem.copy(a.src, a.dst, a.reduce)
            elif isinstance(a, SetTimer):
                self._timers[rank][a.timer] = a.deadline
                self._push(a.deadline, self._fire, rank, a.timer, a.deadline)
            elif isinstance(a, CancelTimer):
                self._timers[rank].pop(a.timer, None)
            elif isinstance(a, Complete):
                mem.finalize(a.req)
                self.done[(rank, a.req)] = self.now
            elif isinstance(a, Fail):
                self.errors[(rank, a.req)] = a.error
            elif isinstance(a, (OpenStream, StreamData, CloseStream)):
                self._placer(rank, a)
            elif isinstance(a, Matched):
                self.matched[(rank, a.req)] = (a.source, a.tag, a.nbytes)
            else:
                raise AssertionError(f"unknown action {a!r}")

    def _send(self, rank: int, a: Send) -> None:
        self.sent.append((rank, a.peer, a.header))
        self.sent_at.append(self.now)
        if a.payload is not None:
            payload = bytes(self.mem[rank].gather(a.payload))     # copy: sender may reuse
        else:
            payload = bytes(a.data)
        assert len(payload) == a.header.payload_nbytes, (a, len(payload))
        if a.header.flags & F_PULL:     # done when the receiver has read it (_message)
            payload = Pulled(rank, payload, a.token)
            self.pulled.append(payload)
        else:
            self._push(self.now, self._send_done, rank, a.token)
        if a.peer in self.dead or rank in self.dead:
            return
        key = (rank, a.peer)
        t = max(self.now + self.net.latency_s, self._chan_last.get(key, 0.0))
        self._chan_last[key] = t
        header = a.header
        if self.raw:
            secret = self.config.secret
            wire = header.pack(secret, payload)
            header = parse_header(wire, secret)          # header only: payload follows
            verify_mac(header, payload, secret)
        self._push(t, self._message, a.peer, rank, header, payload)

    def _multicast(self, rank: int, a: Multicast) -> None:
        self.datagrams_sent += 1
        payload = bytes(self.mem[rank].gather(a.payload)) if a.payload is not None else b""
        assert len(payload) == a.header.length
        t0 = max(self.now, a.not_before)
        wire = a.header.pack(self.config.secret, payload) + payload if self.raw else None
        net, rng = self.net, self.rng
        for dst in range(self.P):
            copies = 1 + (rng.random() < net.dup)
            for _ in range(copies):
                if rng.random() < net.loss:
                    continue
                if net.drop is not None and net.drop(a.header, dst):
                    continue
                t = t0 + net.dgram_latency_s + rng.random() * net.jitter_s
                self._push(t, self._datagram, dst, a.header, payload, wire)

    def _message(self, dst: int, src: int, header, payload) -> None:
        if dst in self.dead:
            return
        self._execute(dst, self.engines[dst].on_message(src, header, payload, self.now))
        if type(payload) is Pulled:
            done = (lambda: self._push(self.now, self._send_done, src, payload.token))
            if payload.holding:         # kept unread: the sender waits until it is read
                payload.on_done = done
            else:
                payload.finish()
                done()

    def _datagram(self, dst: int, header, payload, wire) -> None:
        if dst in self.dead:
            return
        if self.config.external_streams:
            self._place_datagram(dst, header, payload)
            return
        eng = self.engines[dst]
        if wire is not None:
            acts = eng.on_datagram(wire, self.now)
        else:
            acts = eng.on_datagram_header(header, payload, self.now)
        self._execute(dst, acts)

    def _send_done(self, rank: int, token: int) -> None:
        if rank in self.dead:
            return
        self._execute(rank, self.engines[rank].on_send_done(token, self.now))

    def _fire(self, rank: int, timer: int, deadline: float) -> None:
        if rank in self.dead or self._timers[rank].get(timer) != deadline:
            return
        del self._timers[rank][timer]
        self._execute(rank, self.engines[rank].on_timer(timer, self.now))

    # -- external placement (what the offload's receive workers do) ----------------------
    def _placer(self, rank: int, a) -> None:
        from polycast.engine.mcast import Stream
        key = (a.seq, a.root, a.ordinal)
        placers = self.placers[rank]
        if isinstance(a, OpenStream):
            isz = a.region.nbytes // max(1, a.region.nelems)
            s = Stream(0, a.root, a.ordinal, False, a.region.runs, a.region.nelems, isz,
                       a.chunk_elems * isz)
            s.start(a.region.buf, self.now)
            placers[key] = (s, a.region.req)
            for h, payload in self.early_dgrams[rank].pop(key, []):
                self._place_datagram(rank, h, payload)
        elif isinstance(a, CloseStream):
            placers.pop(key, None)
        else:                                               # StreamData: recovered bytes
            ent = placers.get(key)
            rng = ent[0].range_chunks(a.offset, len(a.payload)) if ent else None
            if rng is None:
                return
            s, req = ent
            self.mem[rank].deliver(Region(req, s.buf, s.slice(a.offset, len(a.payload)),
                                          len(a.payload)), a.payload, False)
            s.mark(rng[0], rng[1], self.now)
            self._push(self.now, self._progress, rank, key, [rng], False, True)

    def _place_datagram(self, dst: int, h, payload) -> None:
        if h.src == dst:
            return                                          # our own, looped back
        key = (h.seq, h.src, h.stream)
        ent = self.placers[dst].get(key)
        if ent is None:
            self.early_dgrams[dst].setdefault(key, []).append((h, payload))
            return
        s, req = ent
        if h.kind is MsgKind.MCAST_EOS:
            if not s.eos(h):
                self._progress(dst, key, [], True, False)
            return
        runs = s.place(h, self.now)
        if isinstance(runs, str):
            return                                          # duplicate or bad: dropped
        self.mem[dst].deliver(Region(req, s.buf, runs, h.length), payload, False)
        self._progress(dst, key, [(h.tag, h.tag + 1)], False, False)

    def _progress(self, rank: int, key, ranges, eos: bool, recovered: bool) -> None:
        if rank in self.dead:
            return
        self._execute(rank, self.engines[rank].on_stream_progress(
            *key, ranges, self.now, eos=eos, recovered=recovered))

    # -- faults ---------------------------------------------------------------------------
    def kill(self, rank: int, notify_after_s: float | None = 1e-3) -> None:
        """Rank dies; after ``notify_after_s`` every other rank's driver reports it lost."""
        self.dead.add(rank)
        if notify_after_s is not None:
            for r in range(self.P):
                if r != rank:
                    self._push(self.now + notify_after_s, self._lost, r, rank)

    def _lost(self, rank: int, peer: int) -> None:
        if rank in self.dead:
            return
        self._execute(rank, self.engines[rank].on_peer_lost(peer, self.now, "killed"))

    def inject_datagram(self, dst: int, data: bytes) -> None:
        self._execute(dst, self.engines[dst].on_datagram(data, self.now))

    def inject_message(self, dst: int, src: int, header, payload=b"") -> None:
        self._execute(dst, self.engines[dst].on_message(src, header, payload, self.now))

    # -- counting -------------------------------------------------------------------------
    def sends_of(self, kind: MsgKind, rank: int | None = None) -> int:
        return sum(1 for r, _, h in self.sent if h.kind is kind and (rank is None or r == rank))


# -- short names for the registry schedules the protocol tests use ----------------------

def ring_allgather(P: int, count: int, nchunks: int = 1):
    from polycast.algorithms import build
    return build("allgather", "ring", P, count, nchunks=nchunks)


def ring_reduce_scatter(P: int, count: int):
    from polycast.algorithms import build
    return build("reduce_scatter", "ring", P, count)


def mcast_broadcast(P: int, count: int, root: int = 0, nchunks: int = 1):
    """Root multicasts its buffer once; everyone else receives it."""
    from polycast.algorithms import build
    return build("broadcast", "mcast", P, count, root=root, nchunks=nchunks)


def mcast_allgather(P: int, count: int, roots: int = 2, nchunks: int = 1):
    """The SC24 allgather: `roots` token-passing streams at a time."""
    from polycast.algorithms import build
    return build("allgather", "mcast", P, count, nchunks=nchunks, roots=roots)
