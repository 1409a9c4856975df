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
from ..errors import PolycastError
from .network import Network, same_time_bound

# event kinds
_MSG, _DGRAM, _SENDDONE, _TIMER, _KICK, _POST = range(6)


class SimulationError(PolycastError):
    """The simulation could not finish: a request failed, or a bound was exceeded."""


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


def pacing_gbps_for(schedules, link_gbps: float) -> float:
    """The multicast pacing the simulator gives the engines: the host link rate split over
    the streams that run at once (specs/mcast-protocol.md: link rate / roots), so a
    stream's MCAST step completes, and hands its token on, when its datagrams could have
    left, and concurrent streams do not flood the receivers."""
    roots = 1
    for s in schedules:
        if s.uses_multicast:
            roots = max(roots, int(s.options.get("roots", 1) or 1))
    return link_gbps / roots


class Simulation:
    """One engine per rank on a :class:`~polycast.sim.topology.Topology`.

    ``post(schedule, itemsize, at=0.0)`` queues a collective on every rank; ``run()``
    advances the clock until every posted request completed on every rank."""

    def __init__(self, topology, config: SimConfig | None = None) -> None:
        from ..engine.engine import Engine
        self.topo = topology
        self.cfg = config or SimConfig()
        self.P = topology.nranks
        ecfg = default_engine_config(**self.cfg.engine)
        self.engines = [Engine(r, self.P, config=ecfg) for r in range(self.P)]
        cfg = self.cfg
        if cfg.host_gbps is not None and not cfg.host_gbps > 0:
            raise SimulationError(f"host_gbps must be > 0 (or None), got {cfg.host_gbps!r}")
        if not cfg.host_latency_s >= 0:
            raise SimulationError(f"host_latency_s must be >= 0, got {cfg.host_latency_s!r}")
        self.net = Network(topology, record=cfg.record,
                           host_bw=None if cfg.host_gbps is None else cfg.host_gbps * 1e9 / 8)
        self._host_links: dict = {}              # (src, dst|-1) -> links incl. host ports
        self.rng = np.random.default_rng(self.cfg.seed)
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple] = []
        self._seq = 0
        self._channels: dict[tuple[int, int], deque] = {}   # (src, dst|-1) -> pending
        self._busy: set[tuple[int, int]] = set()
        self._timers: dict[tuple[int, int], float] = {}
        self._reqs: list[tuple] = []             # req -> (schedule, itemsize, at)
        self._innet: dict[int, dict] = {}        # req -> {(dst, tag): senders expected}
        self._combine: dict[tuple, list] = {}    # innet: (dst, seq, tag) -> waiting sends
        self._pending = 0                        # (rank, req) pairs not yet complete
        self.timelines = [RankTimeline() for _ in range(self.P)]
        self.lost_datagrams = 0                  # data datagrams lost (x receivers)
        self.lost_eos = 0                        # end-of-stream datagrams lost
        self.lost_nbytes = 0                     # payload bytes lost, summed over receivers
        self._seq_req: dict[int, int] = {}       # engine sequence number -> request
        self.datagrams = 0
        self.on_complete = None                  # optional hook(req, rank, now)
        self._tree_groups: dict[int, list] = {}
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
    def post(self, schedule, itemsize: int, at: float = 0.0) -> int:
        if schedule.nranks != self.P:
            raise SimulationError(f"schedule for {schedule.nranks} ranks on a topology of "
                                  f"{self.P}")
        req = len(self._reqs)
        self._reqs.append((schedule, itemsize, at))
        from ..algorithms import get
        if get(schedule.collective, schedule.algorithm).innet:
            self._innet[req] = _innet_groups(schedule)
        for r in range(self.P):
            self._push(at, _POST, r, req, None)
        self._pending += self.P
        return req

    def run(self) -> None:
        cfg, net, heap = self.cfg, self.net, self._heap
        while self._pending:
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
            if self.nic is not None:
                self.nic.advance(t)
            bound = same_time_bound(t)
            for f in net.pop_drained(bound):
                self._drained(f)
            while heap and heap[0][0] <= bound:
                ev = heapq.heappop(heap)
                self._event(ev)
            net.settle(t)
            if self.events > cfg.max_events:
                raise SimulationError(f"more than {cfg.max_events} events; raise "
                                      "SimConfig.max_events for a bigger run")

    def completion_time(self, req: int) -> float:
        """When the last rank completed ``req``."""
        return max(tl.completed[req] for tl in self.timelines)

    def engine_stats(self) -> dict:
        """The engines' stats, summed over ranks (numeric fields)."""
        out: dict = {}
        for e in self.engines:
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
        out = [r for r, tl in enumerate(self.timelines) if len(tl.completed) < len(self._reqs)]
        return ", ".join(map(str, out[:16])) + (" ..." if len(out) > 16 else "")

    def _event(self, ev) -> None:
        self.events += 1
        _, _, kind, a, b, c = ev
        t = self.now            # the batch's time: every event of a batch sees one clock
        if kind == _MSG:                       # a: dst, b: src, c: header
            self._do(a, self.engines[a].on_message(b, c, None, t))
        elif kind == _DGRAM:                   # a: receivers, b: headers, c: kept mask
            engines = self.engines
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
        elif kind == _SENDDONE:                # a: rank, b: token
            self._do(a, self.engines[a].on_send_done(b, t))
        elif kind == _TIMER:                   # a: rank, b: timer id, c: deadline
            if self._timers.get((a, b)) == c:
                del self._timers[(a, b)]
                self._do(a, self.engines[a].on_timer(b, t))
        elif kind == _KICK:                    # a: channel key (not_before passed)
            self._busy.discard(a)
            self._start_next(a)
        elif kind == _POST:                    # a: rank, b: req
            sched, itemsize, _ = self._reqs[b]
            self.timelines[a].posted[b] = t
            seq = self.engines[a].next_seq & 0xFFFFFFFF
            if self._seq_req.setdefault(seq, b) != b:
                raise SimulationError(f"rank {a} numbered request {b} as seq {seq}, which "
                                      f"another rank gave request {self._seq_req[seq]}")
            self._do(a, self.engines[a].post(b, sched, itemsize, t))

    def _do(self, rank: int, actions) -> None:
        kick = None
        for act in actions:
            tp = type(act)
            if tp is A.Send or tp is A.Multicast:
                # Queue every message of this batch before starting any, so a stream's
                # datagrams can go as one flow.
                key = (rank, act.peer if tp is A.Send else -1)
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
                self._timers[(rank, act.timer)] = act.deadline
                self._push(max(act.deadline, self.now), _TIMER, rank, act.timer, act.deadline)
            elif tp is A.CancelTimer:
                self._timers.pop((rank, act.timer), None)
            elif tp is A.Complete:
                tl = self.timelines[rank]
                if act.req not in tl.completed:
                    tl.completed[act.req] = self.now
                    self._pending -= 1
                    if self.on_complete is not None:
                        self.on_complete(act.req, rank, self.now)
            elif tp is A.Fail:
                raise SimulationError(f"rank {rank} failed request {act.req} at "
                                      f"t={self.now:.6g}s: {act.error}") from act.error
            # Deliver / Copy: no buffers in the simulator.
        if kick is not None:
            for key in kick:
                if key not in self._busy:
                    self._start_next(key)

    # channels: FIFO per (src, peer) for Sends, per root (peer -1) for datagrams

    def _start_next(self, key) -> None:
        q = self._channels.get(key)
        now = self.now
        src = key[0]
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
                links, lat = self._route(src, act.peer)
                if nbytes:
                    self.net.add_flow(links, nbytes, now, ("send", key, act, lat),
                                      cap=self._rx_cap)
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
                span = acts[-1].not_before - act.not_before
                if len(acts) > 1 and span > 0:
                    cap = (nbytes - acts[-1].header.payload_nbytes) / span
                links = self._tree(src)
                f = self.net.add_flow(links, nbytes, now, ("mcast", key, acts, None), cap=cap)
                if self.nic is not None:
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
        src, dst = key
        self._push(t, _SENDDONE, src, act.token, None)
        self._push(t + lat, _MSG, dst, src, act.header)
        if self.cfg.record:
            n = act.header.payload_nbytes
            self.timelines[src].intervals.append(Interval("send", start, t, dst, n))
            self.timelines[dst].intervals.append(Interval("recv", start, t + lat, src, n))

    def _groups(self, root: int):
        """Receivers of root's tree grouped by latency: [(latency, ranks array)]."""
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
            self.timelines[root].intervals.append(Interval("mcast", start, t, -1, n))
            if n:
                for lat, ranks in self._groups(root):
                    for r in ranks.tolist():
                        self.timelines[r].intervals.append(
                            Interval("mrecv", start, t + lat, root, n))

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
        groups = self._innet.get(self._seq_req.get(hdr.seq, -1))
        if groups is not None and hdr.kind is MsgKind.DATA:
            expected = groups.get((act.peer, hdr.tag), 0)
            if expected < 2:
                return False
            gkey = (act.peer, hdr.seq, hdr.tag)
            waiting = self._combine.setdefault(gkey, [])
            waiting.append(((src, act.peer), act))
            if len(waiting) == expected:
                del self._combine[gkey]
                dst = act.peer
                links, lat = self.topo.mcast_tree(self._node[dst])
                rev = links ^ 1                       # the reverse (aggregation) tree
                self.net.add_flow(rev, nbytes, self.now,
                                  ("innet", None, dst, (waiting, float(lat.max()))),
                                  cap=self._rx_cap)
            return True
        return False

    def _innet_drained(self, dst: int, extra, start: float, t: float) -> None:
        waiting, lat = extra
        for key, act in waiting:
            self._send_drained(key, act, lat, start, t)
        for key, _ in waiting:
            self._busy.discard(key)
            self._start_next(key)


def _innet_groups(schedule) -> dict[tuple[int, int], int]:
    """(destination, tag) -> number of senders of data messages with that tag to it."""
    from ..schedule.ir import Kind
    out: dict[tuple[int, int], int] = {}
    for rank, prog in enumerate(schedule.programs):
        for st in prog:
            if st.kind is Kind.SEND and st.blocks:
                out[(st.peer, st.tag)] = out.get((st.peer, st.tag), 0) + 1
    return out
