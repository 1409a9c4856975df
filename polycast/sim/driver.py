"""The simulator's driver: an event clock running one real :class:`~polycast.engine.engine.Engine`
per rank on the modelled network (:mod:`polycast.sim.network`).

The engines are the runtime's engines, unchanged; the simulator only carries out their
actions in simulated time:

* ``Send`` -> a flow on the ECMP route, in FIFO order per (sender, peer) channel as the
  reliable channel (TCP/shm) is ordered; ``on_send_done`` when its last byte left,
  ``on_message`` one path latency later (no payload: sizes come from the header).
* ``Multicast`` -> a flow on the root's replication tree, in FIFO order per root (the NIC
  sends datagrams in order) and not before the engine's pacing time ``not_before``. The
  datagrams of one stream queued together form one flow, capped at the pacing rate their
  ``not_before`` spacing shows (engines are configured to pace at link rate / roots, the
  protocol's default, see :func:`pacing_gbps_for`). The engine caps ``mtu_nbytes`` at a UDP
  payload (65000 B), so loss is per datagram of at most 65000 B, and every datagram is one
  engine input at every receiver;
  ``on_datagram_header`` at every other rank one path latency after it drained, unless the
  seeded loss model drops it for that receiver (the engine's recovery protocol then runs
  for real). Lost bytes are counted so tests can check the recovery moved exactly them.
* ``SetTimer``/``CancelTimer`` -> timer events; ``Deliver``/``Copy`` -> nothing (no buffers);
  ``Complete`` -> the rank's completion time; ``Fail`` -> :class:`SimulationError`.
* Algorithms registered with ``innet=True`` (SHARP-like in-network reduction): the data
  messages of one (destination, tag) from every sender are combined by the switches into
  one flow on the reverse multicast tree of the destination, started once every sender has
  handed its message over; each link carries the block once. The destination's engine
  still gets one message per sender (all at once), as the switch delivers the reduction.

With ``SimConfig.nic`` (a :class:`~polycast.models.nic.NicModel`), every receiver processes
multicast datagrams at the NIC's rate behind a bounded receive queue that drops what
overflows (:mod:`polycast.sim.nic`), and point-to-point messages to it go no faster than
that rate. Default off: without it, receivers keep up with any link.

Events at one timestamp are processed as a batch and the network rates recomputed once.
Every run is bounded by an event count and a simulated-time limit.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..engine import actions as A
from ..engine.wire import MsgKind
from .errors import SimulationError
from .network import Network, run_batch, same_time_bound

# event kinds
_MSG, _DGRAM, _SENDDONE, _TIMER, _KICK, _POST, _CALL = range(7)




@dataclass
class SimConfig:
    loss: float = 0.0                  # probability a datagram is lost at one receiver
    seed: int = 0
    max_events: int = 50_000_000
    max_time_s: float = 3600.0         # simulated seconds
    record: bool = False               # keep per-message timelines and flow records
    placement: tuple[int, ...] | None = None   # rank -> topology rank slot (None: identity)
    engine: dict = field(default_factory=dict)   # EngineConfig overrides
    nic: object | None = None          # NicModel: receivers' chunk rate + queue (None: off)
    # The hosts (off by default: ideal hosts that keep up with any link, zero software time).
    # host_gbps: a rank's send path and its receive path each move at most this many
    # Gbit/s, shared by its flows (network.py's host ports). host_latency_s: software time
    # per message and per datagram batch, from its last byte on the wire to the engine
    # seeing it (driver wake-up, syscalls, copies), added to the path latency.
    host_gbps: float | None = None
    host_latency_s: float = 0.0
    # Which account of the protocol's timing runs (polycast/sim/fast.py): "auto" takes the
    # fast path where its checks pass and the engines elsewhere; "engine" always steps the
    # engines (the reference); "fast" fails where the fast path cannot run.
    path: str = "auto"


@dataclass
class Interval:
    """One message as a rank saw it (recorded when ``SimConfig.record``)."""
    kind: str            # "send", "mcast", "recv", "mrecv"
    start: float
    end: float
    peer: int            # the other rank (-1: the multicast group)
    nbytes: int


@dataclass
class RankTimeline:
    posted: dict[int, float] = field(default_factory=dict)      # req -> time
    completed: dict[int, float] = field(default_factory=dict)   # req -> time
    intervals: list[Interval] = field(default_factory=list)


def default_engine_config(**overrides):
    """The engine configuration the simulator uses: datagrams as large as a whole block
    (the flow model needs no fragmentation; loss is then per large datagram), no pacing
    below the link rate unless asked, and timeouts far beyond any simulated run."""
    from ..engine.engine import EngineConfig
    # The engine caps mtu_nbytes at a UDP payload (65000): the largest it allows. The
    # driver coalesces a stream's back-to-back datagrams into one flow anyway.
    # Every send is eager: the simulated early buffer is unbounded (max_early_nbytes), so
    # the RTS/CTS rendezvous, which exists only to bound that buffer on real ranks, would
    # protect nothing here and add a round trip per large message to every modelled time
    # (the closed-form alpha-beta checks assume the IR's eager sends).
    base = {"mtu_nbytes": 65000, "op_timeout_s": 600.0, "max_early_nbytes": 1 << 50,
            "eager_max_nbytes": 1 << 50}
    base.update(overrides)
    return EngineConfig(**base)


def pacing_gbps_for(schedules, link_gbps: float, framing=None) -> float:
    """The multicast pacing the simulator gives the engines: the host link rate split over
    the streams that run at once (specs/mcast-protocol.md: link rate / roots), so a
    stream's MCAST step completes, and hands its token on, when its datagrams could have
    left, and concurrent streams do not flood the receivers. The engine paces its
    datagrams' payload and own header; with ``framing`` (the topology's) the rate is
    lowered so that a stream of full datagrams takes exactly link rate / roots on the
    wire, headers of every packet included."""
    roots = 1
    for s in schedules:
        if s.uses_multicast:
            roots = max(roots, int(s.options.get("roots", 1) or 1))
    rate = link_gbps / roots
    if framing is not None and not framing.ideal:
        from ..engine.wire import HEADER_NBYTES
        mtu = default_engine_config().mtu_nbytes
        rate *= (mtu + HEADER_NBYTES) / framing.datagram_wire(mtu)
    return rate


class Simulation:
    """Engines on a :class:`~polycast.sim.topology.Topology`: one per (rank, communicator).

    ``post(schedule, itemsize, at=0.0)`` queues a collective on every rank; ``run()``
    advances the clock until every posted request completed on every rank.

    Workloads (:mod:`polycast.sim.pipeline`) use four more calls:

    * ``add_comm(group) -> comm``: a communicator over the global ranks ``group``; a
      schedule posted on it has ``len(group)`` ranks and its rank i is ``group[i]``. Each
      member gets its own engine for it (as a real rank has one per communicator); the
      engines of one rank share its links and host ports. Communicator 0 is the world.
    * ``post(schedule, itemsize, at=..., comm=c)``: ``at`` is one time for every member, a
      sequence of per-member times (local rank order), or ``None`` for none yet.
    * ``post_rank(req, rank, at)``: post request ``req`` on one member (global ``rank``) at
      simulated time ``at`` (not in the past); callable from callbacks while ``run()`` runs.
      Every member must post a communicator's requests in the same order (the engine
      numbers them by order, as MPI and NCCL require).
    * ``call_at(t, fn)``: ``fn(t)`` at simulated time ``t`` (a compute kernel ending);
      ``on_complete(req, rank, now)``, if set, is called when ``rank`` completes ``req``.
    ``run()`` returns when every (rank, request) pair posted or announced is complete and no
    callback is due; callbacks may post more before that."""

    def __init__(self, topology, config: SimConfig | None = None) -> None:
        self.topo = topology
        self.cfg = config or SimConfig()
        self.P = topology.nranks
        ecfg = self._ecfg = default_engine_config(**self.cfg.engine)
        # Endpoints: one engine per (rank, communicator); the world's endpoint of rank r is
        # r. Events name endpoints; channels are per (endpoint, peer).
        self._ep_engine = _Engines(ecfg, self.P)
        self._ep_rank = list(range(self.P))
        self._ep_comm = [0] * self.P
        self._comm_group: list[tuple[int, ...]] = [tuple(range(self.P))]
        self._comm_eps: list[list[int]] = [list(range(self.P))]    # comm -> local -> ep
        self._calls = 0                          # call_at callbacks not yet run
        cfg = self.cfg
        if cfg.host_gbps is not None and not cfg.host_gbps > 0:
            raise SimulationError(f"host_gbps must be > 0 (or None), got {cfg.host_gbps!r}")
        if not cfg.host_latency_s >= 0:
            raise SimulationError(f"host_latency_s must be >= 0, got {cfg.host_latency_s!r}")
        self.net = Network(topology, record=cfg.record,
                           host_bw=None if cfg.host_gbps is None else cfg.host_gbps * 1e9 / 8)
        self._host_links: dict = {}              # (src, dst|-1) -> links incl. host ports
        self._framing = topology.framing         # wire bytes per message / datagrams
        self.rng = np.random.default_rng(self.cfg.seed)
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple] = []
        self._seq = 0
        self._channels: dict[tuple[int, int], deque] = {}   # (src, dst|-1) -> pending
        self._busy: set[tuple[int, int]] = set()
        self._timers: dict[tuple[int, int], float] = {}
        self._reqs: list[tuple] = []             # req -> (schedule, itemsize, comm)
        self._unposted: dict[int, set] = {}      # req -> members not posted yet
        self._innet: dict[int, dict] = {}        # req -> {(dst, tag): senders expected}
        self._innet_of: dict[int, tuple] = {}    # id(schedule) -> (schedule, its groups)
        self._combine: dict[tuple, list] = {}    # innet: (dst, seq, tag) -> waiting sends
        self._pending = 0                        # (rank, req) pairs not yet complete
        self.timelines = [RankTimeline() for _ in range(self.P)]
        self.lost_datagrams = 0                  # data datagrams lost (x receivers)
        self.lost_eos = 0                        # end-of-stream datagrams lost
        self.lost_nbytes = 0                     # payload bytes lost, summed over receivers
        self._seq_req: dict[tuple, int] = {}     # (comm, engine seq number) -> request
        self.datagrams = 0
        self.on_complete = None                  # optional hook(req, rank, now)
        self.path: str | None = None             # "fast" or "engine" once run() chose
        self.path_reason = ""                    # why not the fast path (engine runs)
        self.fast_mode = ""                      # fast path: "walk" or "events" (fast.py)
        self._fast_stats: dict | None = None
        self._tree_groups: dict[int, list] = {}  # root endpoint -> receivers by latency
        self._comm_trees: dict[int, tuple] = {}  # root endpoint (not the world's) -> tree
        pl = self.cfg.placement
        if pl is not None and sorted(pl) != list(range(self.P)):
            raise SimulationError(f"placement must be a permutation of 0..{self.P - 1}")
        self._node = list(pl) if pl is not None else list(range(self.P))
        self.nic = None                          # the receivers' queues (SimConfig.nic)
        self._rx_cap = math.inf                  # point-to-point bytes/s into a receiver
        if self.cfg.nic is not None:
            from .nic import ReceiveQueues
            self.nic = ReceiveQueues(self.cfg.nic, self.P, self.cfg.seed)
            self._rx_cap = self.nic.rate

    # -- public ----------------------------------------------------------------------
    def add_comm(self, group) -> int:
        """A communicator over the global ranks ``group`` (in its local rank order); returns
        its id for :meth:`post`."""
        try:
            members = tuple(int(r) for r in group)
        except (TypeError, ValueError):
            raise SimulationError(f"a communicator is a sequence of ranks, got {group!r}") \
                from None
        bad = [r for r in members if not 0 <= r < self.P]
        if not members or bad or len(set(members)) != len(members):
            raise SimulationError(
                f"communicator {list(members)[:16]}: " + (
                    f"rank {bad[0]} does not exist (ranks 0..{self.P - 1})" if bad else
                    "no ranks" if not members else "a rank is listed twice"))
        cid = len(self._comm_group)
        self._comm_group.append(members)
        eps = []
        for local, rank in enumerate(members):
            eps.append(len(self._ep_engine))
            self._ep_engine.add(local, len(members), cid)
            self._ep_rank.append(rank)
            self._ep_comm.append(cid)
        self._comm_eps.append(eps)
        return cid

    @property
    def engines(self) -> list:
        """The world communicator's engines (rank order)."""
        return [self._ep_engine[r] for r in range(self.P)]

    def comm_group(self, comm: int) -> tuple[int, ...]:
        """The global ranks of communicator ``comm`` (local rank order)."""
        return self._comm_group[comm]

    def post(self, schedule, itemsize: int, at=0.0, comm: int = 0) -> int:
        """Queue a collective on communicator ``comm`` (default: the world). ``at``: the
        time every member posts it, a sequence of per-member times (``None`` entries: later,
        by :meth:`post_rank`), or ``None`` (every member later)."""
        if not 0 <= comm < len(self._comm_group):
            raise SimulationError(f"no communicator {comm!r} (add_comm makes them)")
        group = self._comm_group[comm]
        if schedule.nranks != len(group):
            raise SimulationError(
                f"schedule for {schedule.nranks} ranks on a topology of {self.P}" if comm == 0
                else f"schedule for {schedule.nranks} ranks on communicator {comm} of "
                     f"{len(group)}")
        if at is None or isinstance(at, (int, float)):
            times = [at] * len(group)
        else:
            times = list(at)
            if len(times) != len(group):
                raise SimulationError(f"{len(times)} post times for a communicator of "
                                      f"{len(group)} ranks")
        req = len(self._reqs)
        self._reqs.append((schedule, itemsize, comm))
        from ..algorithms import get
        if get(schedule.collective, schedule.algorithm).innet:
            hit = self._innet_of.get(id(schedule))
            if hit is None or hit[0] is not schedule:
                hit = self._innet_of[id(schedule)] = (schedule, _innet_groups(schedule))
            self._innet[req] = hit[1]
        self._unposted[req] = set(group)
        self._pending += len(group)
        for rank, t in zip(group, times):
            if t is not None:
                self.post_rank(req, rank, t)
        return req

    def post_rank(self, req: int, rank: int, at: float) -> None:
        """Member ``rank`` (global) posts request ``req`` at simulated time ``at``."""
        waiting = self._unposted.get(req)
        if waiting is None or rank not in waiting:
            raise SimulationError(f"rank {rank} cannot post request {req}: "
                                  + ("no such request" if not 0 <= req < len(self._reqs) else
                                     "already posted" if rank in self._comm_group[
                                         self._reqs[req][2]] else "not a member of its "
                                     "communicator"))
        if not at >= self.now:
            raise SimulationError(f"rank {rank} posts request {req} at t={at!r}, before now "
                                  f"(t={self.now:.6g}s)")
        waiting.discard(rank)
        if not waiting:
            del self._unposted[req]
        comm = self._reqs[req][2]
        ep = rank if comm == 0 else self._comm_eps[comm][self._comm_group[comm].index(rank)]
        self._push(at, _POST, ep, req, None)

    def call_at(self, t: float, fn) -> None:
        """Call ``fn(t)`` at simulated time ``t`` (>= now), in the batch of that instant."""
        if not t >= self.now:
            raise SimulationError(f"call_at t={t!r} is before now (t={self.now:.6g}s)")
        self._calls += 1
        self._push(t, _CALL, fn, None, None)

    def run(self) -> None:
        """Run every posted request to completion, on the path ``SimConfig.path`` picks
        (``self.path`` says which ran, ``self.path_reason`` why not the fast one)."""
        if self.path is None:
            self.path = self._dispatch()
        elif self.path == "fast" and (self._heap or self._pending):
            raise SimulationError("this simulation ran on the fast path: post everything "
                                  "before run(), or use SimConfig(path='engine')")
        if self.path == "fast":
            return
        self._run_engines()

    def _dispatch(self) -> str:
        """The one place that picks the path: the fast one when asked for or allowed and
        its checks pass (polycast/sim/fast.py), else the engines."""
        from . import fast
        mode = self.cfg.path
        if mode not in ("auto", "engine", "fast"):
            raise SimulationError(f"SimConfig.path must be auto, engine or fast, got {mode!r}")
        if mode == "engine":
            self.path_reason = "asked for the engines"
            return "engine"
        try:
            self.fast_mode = fast.run(self)
        except fast.Refused as e:
            if mode == "fast":
                raise SimulationError(f"the fast path cannot run this simulation: {e}") \
                    from None
            self.path_reason = str(e)
            return "engine"
        return "fast"

    def _run_engines(self) -> None:
        cfg, net, heap = self.cfg, self.net, self._heap
        while self._pending or self._calls:
            t_ev = heap[0][0] if heap else math.inf
            t = min(t_ev, net.next_time())
            if t == math.inf:
                raise SimulationError(
                    f"deadlock: {self._pending} (rank, request) pairs incomplete at "
                    f"t={self.now:.6g}s with nothing in flight "
                    f"(ranks waiting: {self._incomplete_ranks()})")
            if t > cfg.max_time_s:
                raise SimulationError(f"simulated time passed the limit of {cfg.max_time_s}s "
                                      f"with {self._pending} (rank, request) pairs incomplete")
            self.now = t
            run_batch(t, net, heap, self.nic, self._drained, self._event)
            if self.events > cfg.max_events:
                raise SimulationError(f"more than {cfg.max_events} events; raise "
                                      "SimConfig.max_events for a bigger run")

    def completion_time(self, req: int) -> float:
        """When the last member completed ``req``."""
        tls = self.timelines
        return max(tls[r].completed[req] for r in self._comm_group[self._reqs[req][2]])

    def engine_stats(self) -> dict:
        """The engines' stats, summed over ranks and communicators (numeric fields); on
        the fast path, the counts it kept (completed, messages, datagrams)."""
        if self._fast_stats is not None:
            return dict(self._fast_stats)
        out: dict = {}
        for e in self._ep_engine.made():
            st = e.stats
            items = st.items() if isinstance(st, dict) else vars(st).items()
            for k, v in items:
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        return out

    # -- internals -------------------------------------------------------------------
    def _push(self, t: float, kind: int, a, b, c) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b, c))

    def _incomplete_ranks(self) -> str:
        out = set()
        for req, (_, _, comm) in enumerate(self._reqs):
            for r in self._comm_group[comm]:
                if req not in self.timelines[r].completed:
                    out.add(r)
        out = sorted(out)
        return ", ".join(map(str, out[:16])) + (" ..." if len(out) > 16 else "") \
            + self._unposted_note()

    def _unposted_note(self) -> str:
        if not self._unposted:
            return ""
        req, ranks = next(iter(self._unposted.items()))
        return (f"; {len(self._unposted)} request(s) not posted by every member, e.g. "
                f"request {req} by rank(s) {sorted(ranks)[:8]}")

    def _event(self, ev) -> None:
        self.events += 1
        _, _, kind, a, b, c = ev
        t = self.now            # the batch's time: every event of a batch sees one clock
        if kind == _MSG:                       # a: dst endpoint, b: src (local), c: header
            self._do(a, self._ep_engine[a].on_message(b, c, None, t))
        elif kind == _DGRAM:                   # a: receiver endpoints, b: headers, c: kept
            engines = self._ep_engine
            self.events += len(a) * len(b) - 1       # count each engine input
            if c is None:
                for r in a:
                    eng = engines[r]
                    for h in b:
                        self._do(r, eng.on_datagram_header(h, None, t))
            else:
                for i, r in enumerate(a):
                    eng = engines[r]
                    for j, h in enumerate(b):
                        if c[j, i]:
                            self._do(r, eng.on_datagram_header(h, None, t))
        elif kind == _SENDDONE:                # a: endpoint, b: token
            self._do(a, self._ep_engine[a].on_send_done(b, t))
        elif kind == _TIMER:                   # a: endpoint, b: timer id, c: deadline
            if self._timers.get((a, b)) == c:
                del self._timers[(a, b)]
                self._do(a, self._ep_engine[a].on_timer(b, t))
        elif kind == _KICK:                    # a: channel key (not_before passed)
            self._busy.discard(a)
            self._start_next(a)
        elif kind == _POST:                    # a: endpoint, b: req
            sched, itemsize, comm = self._reqs[b]
            rank = self._ep_rank[a]
            eng = self._ep_engine[a]
            self.timelines[rank].posted[b] = t
            seq = eng.next_seq & 0xFFFFFFFF
            if self._seq_req.setdefault((comm, seq), b) != b:
                raise SimulationError(
                    f"rank {rank} numbered request {b} as seq {seq}"
                    + (f" of communicator {comm}" if comm else "") + ", which another rank "
                    f"gave request {self._seq_req[(comm, seq)]} (members must post a "
                    "communicator's requests in the same order)")
            self._do(a, eng.post(b, sched, itemsize, t))
        elif kind == _CALL:                    # a: fn
            self._calls -= 1
            a(t)

    def _do(self, ep: int, actions) -> None:
        kick = None
        for act in actions:
            tp = type(act)
            if tp is A.Send or tp is A.Multicast:
                # Queue every message of this batch before starting any, so a stream's
                # datagrams can go as one flow.
                key = (ep, act.peer if tp is A.Send else -1)
                q = self._channels.get(key)
                if q is None:
                    q = self._channels[key] = deque()
                q.append(act)
                if key not in self._busy:
                    if kick is None:
                        kick = [key]
                    elif key not in kick:
                        kick.append(key)
            elif tp is A.SetTimer:
                self._timers[(ep, act.timer)] = act.deadline
                self._push(max(act.deadline, self.now), _TIMER, ep, act.timer, act.deadline)
            elif tp is A.CancelTimer:
                self._timers.pop((ep, act.timer), None)
            elif tp is A.Complete:
                rank = self._ep_rank[ep]
                tl = self.timelines[rank]
                if act.req not in tl.completed:
                    tl.completed[act.req] = self.now
                    self._pending -= 1
                    if self.on_complete is not None:
                        self.on_complete(act.req, rank, self.now)
            elif tp is A.Fail:
                raise SimulationError(f"rank {self._ep_rank[ep]} failed request {act.req} at "
                                      f"t={self.now:.6g}s: {act.error}{self._unposted_note()}"
                                      ) from act.error
            # Deliver / Copy: no buffers in the simulator.
        if kick is not None:
            for key in kick:
                if key not in self._busy:
                    self._start_next(key)

    # channels: FIFO per (src, peer) for Sends, per root (peer -1) for datagrams

    def _start_next(self, key) -> None:
        q = self._channels.get(key)
        now = self.now
        src = key[0]                            # the sender's endpoint
        comm = self._ep_comm[src]
        while q:
            act = q[0]
            if type(act) is A.Multicast and act.not_before > same_time_bound(now):
                self._busy.add(key)
                self._push(act.not_before, _KICK, key, None, None)
                return
            q.popleft()
            hdr = act.header
            nbytes = hdr.payload_nbytes
            if type(act) is A.Send:
                if nbytes and self._innet and self._combine_send(src, act, nbytes):
                    self._busy.add(key)
                    return
                links, lat = self._route(self._ep_rank[src],
                                         self._comm_group[comm][act.peer] if comm else act.peer)
                if nbytes:
                    wire = self._framing.message_wire(nbytes)
                    self.net.add_flow(links, wire, now, ("send", key, act, lat),
                                      cap=self._rx_cap * wire / nbytes,
                                      goodput=nbytes / wire)
                    self._busy.add(key)
                    return
                self._send_drained(key, act, lat, now, now)
                continue
            # Multicast: the datagrams of one stream queued back to back go as one flow on
            # the tree, no faster than the engine's pacing (their not_before spacing);
            # each datagram is still delivered (or lost) on its own.
            acts = [act]
            if hdr.kind is MsgKind.MCAST_DATA:
                while q:
                    nxt = q[0]
                    h2 = nxt.header
                    if (type(nxt) is not A.Multicast or h2.kind is not MsgKind.MCAST_DATA
                            or h2.seq != hdr.seq or h2.stream != hdr.stream):
                        break
                    acts.append(q.popleft())
                    nbytes += h2.payload_nbytes
            self.datagrams += len(acts)
            if nbytes:
                cap = math.inf
                fr = self._framing
                sizes = [a.header.payload_nbytes for a in acts]
                wire = fr.datagram_wire(sizes)
                span = acts[-1].not_before - act.not_before
                if len(acts) > 1 and span > 0:
                    cap = (wire - fr.datagram_wire(sizes[-1])) / span
                links = self._tree(src)
                f = self.net.add_flow(links, wire, now, ("mcast", key, acts, None), cap=cap,
                                      goodput=nbytes / wire)
                if self.nic is not None:
                    if comm:
                        raise SimulationError("the NIC model (SimConfig.nic) covers multicast "
                                              "on the world communicator only")
                    self.nic.add(f, src)
                self._busy.add(key)
                return
            self._mcast_drained(src, acts, now, now)
        self._busy.discard(key)

    def _route(self, src: int, dst: int):
        """(links, latency) of a message src -> dst: the network route, plus the hosts'
        ports and software latency when the host model is on."""
        links, lat = self.topo.route(self._node[src], self._node[dst])
        if self.net.host_bw is None and not self.cfg.host_latency_s:
            return links, lat
        key = (src, dst)
        hit = self._host_links.get(key)
        if hit is None:
            if self.net.host_bw is not None:
                links = np.concatenate([links, [self.net.send_port(src),
                                                self.net.recv_port(dst)]])
            hit = self._host_links[key] = (links, lat + self.cfg.host_latency_s)
        return hit

    def _tree(self, root: int):
        """Links of the multicast tree of endpoint ``root`` over its communicator (plus the
        host ports with the host model)."""
        if root >= self.P:
            return self._comm_tree(root)[0]
        links, _ = self.topo.mcast_tree(self._node[root])
        if self.net.host_bw is None:
            return links
        key = (root, -1)
        hit = self._host_links.get(key)
        if hit is None:
            ports = [self.net.send_port(root)] + [self.net.recv_port(r) for r in range(self.P)
                                                  if r != root]
            hit = self._host_links[key] = np.concatenate([links, ports])
        return hit

    def _comm_tree(self, root: int):
        """(links incl. host ports, [(latency, receiver endpoints)]) of the tree of endpoint
        ``root`` of a communicator other than the world: the root's tree pruned to the
        members (topology.Topology.mcast_tree_within)."""
        hit = self._comm_trees.get(root)
        if hit is None:
            comm = self._ep_comm[root]
            rank = self._ep_rank[root]
            members = self._comm_group[comm]
            node = self._node
            links, lat = self.topo.mcast_tree_within(node[rank], [node[r] for r in members])
            others = [(r, ep) for r, ep in zip(members, self._comm_eps[comm]) if r != rank]
            if self.net.host_bw is not None:
                links = np.concatenate([links, [self.net.send_port(rank)]
                                        + [self.net.recv_port(r) for r, _ in others]])
            eps = np.array([ep for _, ep in others], dtype=np.int64)
            lats = np.array([lat[node[r]] for r, _ in others]) + self.cfg.host_latency_s
            groups = [(float(x), eps[lats == x]) for x in np.unique(lats)]
            hit = self._comm_trees[root] = (links, groups)
        return hit

    def _drained(self, f) -> None:
        what, key, act, extra = f.data
        t = self.now
        if what == "send":
            self._send_drained(key, act, extra, f.start, t)
        elif what == "mcast":                  # act: the coalesced datagrams
            self._mcast_drained(key[0], act, f.start, t, f.fid)
        else:                                  # "innet": extra = list of (key, act)
            self._innet_drained(act, extra, f.start, t)
            return
        self._busy.discard(key)
        self._start_next(key)

    def _send_drained(self, key, act, lat: float, start: float, t: float) -> None:
        src, dst = key                          # endpoint, local peer
        comm = self._ep_comm[src]
        if comm:
            dst_ep, me = self._comm_eps[comm][dst], self._ep_engine[src].rank
        else:
            dst_ep, me = dst, src
        self._push(t, _SENDDONE, src, act.token, None)
        self._push(t + lat, _MSG, dst_ep, me, act.header)
        if self.cfg.record:
            n = act.header.payload_nbytes
            s, d = self._ep_rank[src], self._ep_rank[dst_ep]
            self.timelines[s].intervals.append(Interval("send", start, t, d, n))
            self.timelines[d].intervals.append(Interval("recv", start, t + lat, s, n))

    def _groups(self, root: int):
        """Receivers of endpoint root's tree grouped by latency: [(latency, endpoints)]."""
        if root >= self.P:
            return self._comm_tree(root)[1]
        g = self._tree_groups.get(root)
        if g is None:
            _, lat = self.topo.mcast_tree(self._node[root])
            ranks = np.array([r for r in range(self.P) if r != root], dtype=np.int64)
            lats = lat[np.array(self._node, dtype=np.int64)[ranks]] + self.cfg.host_latency_s
            g = [(float(x), ranks[lats == x]) for x in np.unique(lats)]
            self._tree_groups[root] = g
        return g

    def _mcast_drained(self, root: int, acts, start: float, t: float,
                       fid: int | None = None) -> None:
        hdrs = [a.header for a in acts]
        sizes = np.array([h.payload_nbytes for h in hdrs], dtype=np.int64)
        data = np.array([h.kind is MsgKind.MCAST_DATA for h in hdrs])
        loss = self.cfg.loss
        nic_keep = nic_delay = None
        if self.nic is not None:
            nic_keep, nic_delay = self.nic.take(fid, root, sizes)
        for lat, ranks in self._groups(root):
            keep = None
            if loss > 0:
                keep = self.rng.random((len(hdrs), len(ranks))) >= loss
                lost = ~keep
                nlost = int(lost.sum())
                if nlost:
                    per_dgram = lost.sum(axis=1)
                    self.lost_datagrams += int(per_dgram[data].sum())
                    self.lost_eos += int(per_dgram[~data].sum())
                    self.lost_nbytes += int((per_dgram * sizes).sum())
                else:
                    keep = None
            if nic_delay is not None:
                self._nic_push(t + lat, ranks, hdrs, keep, nic_keep, nic_delay)
                continue
            self._push(t + lat, _DGRAM, ranks.tolist(), hdrs, keep)
        if self.cfg.record:
            n = int(sizes.sum())
            rr, rank_of = self._ep_rank[root], self._ep_rank
            self.timelines[rr].intervals.append(Interval("mcast", start, t, -1, n))
            if n:
                for lat, eps in self._groups(root):
                    for e in eps.tolist():
                        self.timelines[rank_of[e]].intervals.append(
                            Interval("mrecv", start, t + lat, rr, n))

    def _nic_push(self, t: float, ranks, hdrs, keep, nic_keep, nic_delay) -> None:
        """Deliver to ``ranks`` what both the loss model (``keep``) and the NIC's queue
        (``nic_keep``) let through, when each rank's NIC has processed it."""
        if nic_keep is not None:
            nk = nic_keep[:, ranks]
            keep = nk if keep is None else keep & nk
        delays = nic_delay[ranks]
        for d in np.unique(delays):
            sel = delays == d
            k = None if keep is None else keep[:, sel]
            self._push(t + float(d), _DGRAM, ranks[sel].tolist(), hdrs, k)

    # in-network reduction ---------------------------------------------------------------
    def _combine_send(self, src: int, act, nbytes: int) -> bool:
        hdr = act.header
        comm = self._ep_comm[src]
        groups = self._innet.get(self._seq_req.get((comm, hdr.seq), -1))
        if groups is not None and hdr.kind is MsgKind.DATA:
            expected = groups.get((act.peer, hdr.tag), 0)
            if expected < 2:
                return False
            gkey = (comm, act.peer, hdr.seq, hdr.tag)
            waiting = self._combine.setdefault(gkey, [])
            waiting.append(((src, act.peer), act))
            if len(waiting) == expected:
                del self._combine[gkey]
                dst = self._comm_group[comm][act.peer] if comm else act.peer
                if comm:
                    node = self._node
                    links, lat = self.topo.mcast_tree_within(
                        node[dst], [node[r] for r in self._comm_group[comm]])
                    lat_max = max(float(lat[node[r]]) for r in self._comm_group[comm])
                else:
                    links, lat = self.topo.mcast_tree(self._node[dst])
                    lat_max = float(lat.max())
                rev = links ^ 1                       # the reverse (aggregation) tree
                wire = self._framing.message_wire(nbytes)
                self.net.add_flow(rev, wire, self.now,
                                  ("innet", None, dst, (waiting, lat_max)),
                                  cap=self._rx_cap * wire / nbytes, goodput=nbytes / wire)
            return True
        return False

    def _innet_drained(self, dst: int, extra, start: float, t: float) -> None:
        waiting, lat = extra
        for key, act in waiting:
            self._send_drained(key, act, lat, start, t)
        for key, _ in waiting:
            self._busy.discard(key)
            self._start_next(key)


class _Engines:
    """The engine of every endpoint, each made when first used: the fast path steps none,
    and a simulation of 65,536 ranks would otherwise build 65,536 engines (each with
    per-peer state) before anything runs."""

    def __init__(self, config, nranks: int) -> None:
        self._cfg = config
        self._spec: list[tuple[int, int, int]] = [(r, nranks, 0) for r in range(nranks)]
        self._made: dict[int, object] = {}

    def add(self, rank: int, nranks: int, comm: int) -> None:
        self._spec.append((rank, nranks, comm))

    def __len__(self) -> int:
        return len(self._spec)

    def __getitem__(self, ep: int):
        eng = self._made.get(ep)
        if eng is None:
            from ..engine.engine import Engine
            rank, n, comm = self._spec[ep]
            eng = self._made[ep] = Engine(rank, n, comm=comm, config=self._cfg)
        return eng

    def made(self) -> list:
        """The engines made so far (those never made have done nothing)."""
        return [self._made[ep] for ep in sorted(self._made)]


def _innet_groups(schedule) -> dict[tuple[int, int], int]:
    """(destination, tag) -> number of senders of data messages with that tag to it."""
    from ..schedule.ir import Kind
    out: dict[tuple[int, int], int] = {}
    for rank, prog in enumerate(schedule.programs):
        for st in prog:
            if st.kind is Kind.SEND and st.blocks:
                out[(st.peer, st.tag)] = out.get((st.peer, st.tag), 0) + 1
    return out
