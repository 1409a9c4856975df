"""The flow-level network model: max-min fair sharing of directed links.

What is modelled
----------------
* A **flow** moves ``nbytes`` over a fixed set of directed links: a point-to-point message
  over its ECMP route, a multicast datagram (or a whole coalesced multicast stream) over
  its root's replication tree — each tree link charged once, so the switches' copies are
  free and the flow goes at the tree's bottleneck — and an in-network reduction over the
  reverse tree of its destination.
* All active flows share link bandwidth **max-min fairly** (progressive filling / water
  filling): repeatedly find the link whose remaining capacity split over its unfrozen flows
  is smallest, freeze those flows at that share, subtract, repeat. A flow's rate is
  constant between events, so its drain time is exact.
* A flow's last byte has left the sender when it has drained; it reaches a receiver one
  **path latency** later (sum of link latencies plus per-switch hop latency). Without
  contention a message of S bytes on a path of bottleneck B costs exactly
  ``latency + S/B``.
* Rates are recomputed once per batch of events at one timestamp (``settle``), and only for
  the connected component of flows (flows linked by shared links) that the batch touched.
* Bytes are counted per directed link (``link_bytes``), at the flow's start. A flow's
  bytes are **wire bytes**: the driver adds the topology's per-packet headers
  (:mod:`polycast.sim.framing`) to the payload, so a link moves payload at its goodput.
* **Host processing** (optional, :class:`Network` ``host_bw``): a rank's send and its
  receive path each move at most ``host_bw`` bytes/s, shared by all of the rank's flows in
  that direction — a host stack, a CPU-bound process or a NIC DMA engine slower than the
  link. Modelled as two private links per rank (send port, receive port) that every flow
  of the rank crosses (a multicast flow crosses its root's send port and every receiver's
  receive port, so it goes at the slowest receiver's pace); they are not network links and
  carry no ``link_bytes``. Off by default (``None``: hosts keep up with any link).

What is not modelled
--------------------
No packets, no queues or buffers, no switch buffer overflow, no congestion-control
dynamics (TCP/DCQCN ramp-up, incast collapse), no PFC/credit back-pressure or head-of-line
blocking, no NIC message-rate limits (beyond the optional host
rate above), no routing adaptivity
(ECMP is static), no link failures. Rates are the ideal of a perfectly fair, perfectly
efficient transport; loss is injected by the driver on datagram delivery, not by the
network.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

#: Relative tolerance under which two event times are the same instant (float round-off of
#: flows that start together, at the same rate, finish together).
TIME_RTOL = 1e-12
_INF = math.inf


def same_time_bound(t: float) -> float:
    """Every time <= this bound belongs to the batch at ``t``."""
    return t + abs(t) * TIME_RTOL + 1e-18


@dataclass(eq=False, slots=True)
class Flow:
    fid: int
    links: np.ndarray          # link ids (unique within the flow)
    nbytes: int
    start: float
    data: object               # the driver's tag: what to do when the flow drains
    remaining: float = 0.0
    rate: float = 0.0          # bytes/s
    t_last: float = 0.0        # time `remaining` was last brought up to date
    finish: float = _INF       # drain time at the current rate
    version: int = 0           # heap entries with another version are stale
    cap: float = _INF          # the sender's own limit (pacing), bytes/s
    goodput: float = 1.0       # payload bytes per byte on the wire (framing.py)


@dataclass
class FlowRecord:
    """A finished flow, kept when recording is on (utilisation plots)."""
    start: float
    finish: float
    nbytes: int
    layer_links: tuple[int, ...]     # links of the flow per topology layer


class Network:
    """Active flows on a topology's links, their max-min fair rates and drain times."""

    def __init__(self, topology, record: bool = False, host_bw: float | None = None) -> None:
        self.topology = topology
        self.nlinks = topology.nlinks                    # network links (host ports follow)
        self.capacity = topology.bandwidth               # bytes/s per directed link
        self.host_bw = host_bw
        if host_bw is not None:
            if not host_bw > 0:
                raise ValueError(f"host_bw must be > 0 bytes/s, got {host_bw!r}")
            # Link ids nlinks + r (send port of r) and nlinks + P + r (receive port).
            self.capacity = np.concatenate([self.capacity,
                                            np.full(2 * topology.nranks, float(host_bw))])
        self.link_bytes = np.zeros(self.nlinks, dtype=np.float64)
        self.flows: dict[int, Flow] = {}
        self._link_flows: list[set[int]] = [set() for _ in range(len(self.capacity))]
        self._heap: list[tuple[float, int, int]] = []    # (finish, fid, version)
        self._dirty_links: set[int] = set()
        self._next_fid = 0
        self.recomputes = 0          # water-filling calls (components settled)
        self.flows_started = 0
        self.record = record
        self.records: list[FlowRecord] = []

    # -- flows -----------------------------------------------------------------------
    def send_port(self, rank: int) -> int:
        """The id of ``rank``'s host send port (only with ``host_bw``)."""
        return self.nlinks + rank

    def recv_port(self, rank: int) -> int:
        return self.nlinks + self.topology.nranks + rank

    def add_flow(self, links: np.ndarray, nbytes: int, now: float, data: object,
                 cap: float = _INF, goodput: float = 1.0) -> Flow:
        """Start a flow of ``nbytes`` > 0 wire bytes over ``links`` (network links, then
        any host ports), never faster than ``cap`` bytes/s (a paced sender), carrying
        ``goodput`` payload bytes per wire byte; its rate is set at ``settle``."""
        if nbytes <= 0:
            raise ValueError("flows carry at least one byte; the driver handles empty messages")
        fid = self._next_fid
        self._next_fid += 1
        f = Flow(fid, links, nbytes, now, data, remaining=float(nbytes), t_last=now, cap=cap,
                 goodput=goodput)
        self.flows[fid] = f
        link_flows = self._link_flows
        for l in links.tolist():
            link_flows[l].add(fid)
        self._dirty_links.update(links.tolist())
        if self.host_bw is None:
            self.link_bytes[links] += nbytes
        else:
            self.link_bytes[links[links < self.nlinks]] += nbytes
        self.flows_started += 1
        return f

    def next_time(self) -> float:
        """The earliest drain time of an active flow (``inf`` if none)."""
        heap, flows = self._heap, self.flows
        while heap:
            t, fid, ver = heap[0]
            f = flows.get(fid)
            if f is not None and f.version == ver:
                return t
            heapq.heappop(heap)
        return _INF

    def pop_drained(self, bound: float) -> list[Flow]:
        """Remove and return the flows drained at or before ``bound``."""
        out = []
        heap, flows = self._heap, self.flows
        while heap and heap[0][0] <= bound:
            t, fid, ver = heapq.heappop(heap)
            f = flows.get(fid)
            if f is None or f.version != ver:
                continue
            del flows[fid]
            f.remaining = 0.0
            lst = f.links.tolist()
            link_flows = self._link_flows
            for l in lst:
                link_flows[l].discard(fid)
            self._dirty_links.update(lst)
            if self.record:
                self._record(f)
            out.append(f)
        return out

    def _record(self, f: Flow) -> None:
        net = f.links[f.links < self.nlinks]
        counts = np.bincount(self.topology.layer_index[net], minlength=4)
        self.records.append(FlowRecord(f.start, f.finish, f.nbytes, tuple(counts.tolist())))

    # -- rates -----------------------------------------------------------------------
    def settle(self, now: float) -> None:
        """Recompute the rates of every flow connected (through shared links) to a link
        whose set of flows changed since the last call, and their drain times."""
        if not self._dirty_links:
            return
        flows, link_flows = self.flows, self._link_flows
        dirty = self._dirty_links
        self._dirty_links = set()
        seen: set[int] = set()
        done: set[int] = set()
        # One breadth-first search per connected component (flows joined by shared
        # links) that a changed link belongs to; each component water-fills alone, so the
        # many disjoint flows of a ring step stay cheap.
        for seed in dirty:
            if seed in seen or not link_flows[seed]:
                continue
            seen.add(seed)
            stack = [seed]
            group: list[Flow] = []
            while stack:
                l = stack.pop()
                for fid in link_flows[l]:
                    if fid in done:
                        continue
                    done.add(fid)
                    f = flows[fid]
                    group.append(f)
                    for l2 in f.links.tolist():
                        if l2 not in seen:
                            seen.add(l2)
                            stack.append(l2)
            self._fill(group, now)

    def _fill(self, group: list[Flow], now: float) -> None:
        self.recomputes += 1
        cap = self.capacity
        if len(group) == 1:
            f = group[0]
            rates = [min(float(cap[f.links].min()), f.cap)]
        else:
            rates = _water_fill(group, cap).tolist()
        heap = self._heap
        for f, rate in zip(group, rates):
            if f.rate > 0:
                f.remaining -= f.rate * (now - f.t_last)
                if f.remaining < 0:
                    f.remaining = 0.0
            f.t_last = now
            if rate == f.rate and f.finish != _INF:
                continue        # unchanged: keep the drain time (no round-off drift)
            f.rate = rate
            f.finish = now + f.remaining / rate
            f.version += 1
            heapq.heappush(heap, (f.finish, f.fid, f.version))


def _water_fill(group: list[Flow], cap: np.ndarray) -> np.ndarray:
    """Max-min fair rates of ``group`` (progressive filling), vectorised over incidences."""
    n = len(group)
    lens = [len(f.links) for f in group]
    inc_links = np.concatenate([f.links for f in group])
    inc_flow = np.repeat(np.arange(n), lens)
    ulinks, local = np.unique(inc_links, return_inverse=True)
    nl = len(ulinks)
    rem = cap[ulinks].astype(np.float64)
    caps = np.array([f.cap for f in group])
    capped = np.flatnonzero(caps < _INF)
    if len(capped):
        # A sender's own limit is a private link of that capacity.
        local = np.concatenate([local, nl + np.arange(len(capped))])
        inc_flow = np.concatenate([inc_flow, capped])
        rem = np.concatenate([rem, caps[capped]])
        nl += len(capped)
    rate = np.zeros(n)
    frozen = np.zeros(n, dtype=bool)
    active = np.ones(len(local), dtype=bool)
    for _ in range(n + 1):          # each round freezes at least one flow
        cnt = np.bincount(local[active], minlength=nl)
        used = cnt > 0
        if not used.any():
            break
        share = np.full(nl, np.inf)
        share[used] = rem[used] / cnt[used]
        m = share.min()
        bottleneck = share <= m * (1 + 1e-12)
        newly = np.zeros(n, dtype=bool)
        newly[inc_flow[active & bottleneck[local]]] = True
        rate[newly] = m
        frozen |= newly
        sel = active & frozen[inc_flow]
        rem -= m * np.bincount(local[sel], minlength=nl)
        np.maximum(rem, 0.0, out=rem)
        active &= ~sel
    return rate
