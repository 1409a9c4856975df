"""The simulator's event loop: it steps one real :class:`~polycast.engine.engine.Engine` per
rank (and communicator) and carries out their actions in simulated time on the modelled
network (:mod:`polycast.sim.network`). :class:`EngineLoop` is a mixin of
:class:`~polycast.sim.driver.Simulation` (which holds the state and the API: construction,
communicators, posting, results); this module holds how the engines' actions become flows
and events:

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

import numpy as np

from ..engine import actions as A
from ..engine.wire import MsgKind
from .errors import SimulationError
from .network import run_batch, same_time_bound
from .records import Interval

# event kinds
_MSG, _DGRAM, _SENDDONE, _TIMER, _KICK, _POST, _CALL = range(7)


class EngineLoop:
    """The engines' event loop of a :class:`~polycast.sim.driver.Simulation` (a mixin: the
    state it reads and writes is the Simulation's, made in its ``__init__``)."""

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
