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
* Rates are recomputed once per batch of events at one timestamp (``settle``), and only
  where the batch can change them (see *Settling* below): the answer is the max-min fair
  allocation of all active flows, as if water-filled from scratch.
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

Settling
--------
Max-min fair rates are unique, and an allocation is max-min fair exactly when every flow
has a *bottleneck*: its own limit (its slowest link alone, its pacing cap), or a saturated
link on which no flow goes faster. Every flow keeps the bottleneck it was given, and
``settle`` recomputes only a region ``S`` of flows whose bottleneck may no longer hold:

* ``S`` starts with the flows added and the flows whose bottleneck link a flow left.
* ``S`` is water-filled on what the others leave of each link (they keep their rates).
* Checks: (1) a flow of ``S`` stopped by a link must go at least as fast as every other
  flow there; (2) a flow outside ``S`` whose bottleneck link carries a flow of ``S`` that
  changed rate must still find that link saturated and go at least as fast as the flows
  of ``S`` there. The flows that fail join ``S``, which is filled again; after
  ``refills_before_component`` such rounds ``S`` becomes its whole connected component
  (flows joined by shared links), filled once with nothing outside to check.

A flow whose bottleneck link saw no change keeps a valid bottleneck; after the checks
every other flow has one, so the result is the max-min allocation of all flows (to
``SAT_RTOL``). ``Network.check_rates`` (a test hook) compares every settle with a
water-filling of everything from scratch.

Compiled
--------
The same state and algorithm run in C (``polycast/sim/_network*.c``, built by setup.py where
a compiler exists): :class:`Network` hands its flows, links, drain heap and settle to it and
stays the one class callers use; its flows are then ``_network.Flow`` objects with the same
fields (read-only). Without the build, or with the ``sim_native=0`` test hook
(:class:`polycast.config.Hooks`, read once per :class:`~polycast.sim.driver.Simulation`),
the Python code below runs. Both give the max-min allocation to ``SAT_RTOL``; the steps
differ only where ties between equal shares are broken (tests/test_sim_network.py drives
both with the same flows).

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

from .water_fill import fill_numpy, fill_small, water_fill

_ABI = 1                         # NETWORK_ABI in _network.h


def _load_compiled():
    """(the compiled model, None), or (None, why not): not built, or built from an older
    interface than its source's (calling into it could crash)."""
    try:
        from . import _network as built
    except ImportError as exc:
        return None, f"not built ({exc}); reinstall with a C compiler"
    if getattr(built, "ABI", None) != _ABI:
        return None, (f"the build's interface is {getattr(built, 'ABI', 'unversioned')}, its "
                      f"source's {_ABI} (rebuild: python setup.py build_ext --inplace)")
    return built, None


compiled, why_not = _load_compiled()


def describe(native: bool = True) -> str:
    """One line for POLYCAST_DEBUG=INFO: which network model a Network made with ``native``
    runs."""
    if native and compiled is not None:
        return "sim network: compiled (polycast.sim._network)"
    return f"sim network: pure Python ({why_not or 'test hook sim_native=0'})"


#: Relative tolerance under which two event times are the same instant (float round-off of
#: flows that start together, at the same rate, finish together).
TIME_RTOL = 1e-12
_INF = math.inf


def same_time_bound(t: float) -> float:
    """Every time <= this bound belongs to the batch at ``t``."""
    return t + abs(t) * TIME_RTOL + 1e-18


def run_batch(t: float, net: "Network", heap: list, nic, on_drained, on_event) -> None:
    """Everything that happens at simulated time ``t``, in the one order the engine path and
    the fast path's events mode must share for their answers to be equal: the NIC model's
    clock, the flows drained by the batch's bound, the events queued by it (``heap`` holds
    tuples whose first item is their time), then one settle of the rates."""
    if nic is not None:
        nic.advance(t)
    bound = same_time_bound(t)
    for f in net.pop_drained(bound):
        on_drained(f)
    while heap and heap[0][0] <= bound:
        on_event(heapq.heappop(heap))
    net.settle(t)


#: Relative slack under which a link counts as saturated, and rates as equal, in the
#: checks of ``settle`` (float round-off of sums of rates; a looser bound only makes the
#: recomputed region larger).
SAT_RTOL = 1e-9
_SMALL = 12                      # regions up to this many flows are water-filled in Python
_FEW = 16                        # flows with fewer links are updated link by link in Python


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
    solo: float = _INF         # its own limit: min(cap, its slowest link)
    lst: list = None           # links as a list (loops)
    by: int = -1               # its bottleneck link (-1: its own limit)


@dataclass
class FlowRecord:
    """A finished flow, kept when recording is on (utilisation plots)."""
    start: float
    finish: float
    nbytes: int
    layer_links: tuple[int, ...]     # links of the flow per topology layer


class _Counter:
    """A count kept by the compiled state when there is one (plus what callers added),
    else by the Python code (in ``_<name>``)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, net, owner=None):
        if net is None:
            return self
        c = net._c
        return getattr(net, self.slot) + (getattr(c, self.name) if c is not None else 0)

    def __set__(self, net, value) -> None:
        c = net._c
        setattr(net, self.slot, value - (getattr(c, self.name) if c is not None else 0))


class Network:
    """Active flows on a topology's links, their max-min fair rates and drain times."""

    #: a test hook: after every settle, compare every rate with a water-filling from scratch
    #: (read when a Network is made)
    check_rates = False
    #: refills of one settle after which its region becomes its connected component
    #: (measured: 5 keeps pairwise alltoall incremental and multicast + ring RS cheap)
    refills_before_component = 5
    recomputes = _Counter()          # regions water-filled
    refills = _Counter()             # ... again after a check widened them
    components = _Counter()          # ... as whole connected components (too many refills)
    flows_started = _Counter()

    def __init__(self, topology, record: bool = False, host_bw: float | None = None,
                 native: bool = True) -> None:
        """``native``: run the compiled model when it is built (module docstring)."""
        self.topology = topology
        self.nlinks = topology.nlinks                    # network links (host ports follow)
        self.capacity = np.ascontiguousarray(topology.bandwidth, dtype=np.float64)
        self.host_bw = host_bw
        if host_bw is not None:
            if not host_bw > 0:
                raise ValueError(f"host_bw must be > 0 bytes/s, got {host_bw!r}")
            # Link ids nlinks + r (send port of r) and nlinks + P + r (receive port).
            self.capacity = np.concatenate([self.capacity,
                                            np.full(2 * topology.nranks, float(host_bw))])
        n = len(self.capacity)
        self._sat = self.capacity * (1 - SAT_RTOL)     # a link at or above is saturated
        self.load = np.zeros(n)                        # sum of its flows' rates
        self._maxrate = np.zeros(n)                    # >= its fastest flow's rate
        self.link_bytes = np.zeros(self.nlinks, dtype=np.float64)
        self._recomputes = self._refills = self._components = self._flows_started = 0
        self.record = record
        self.records: list[FlowRecord] = []
        self._c = None
        self.native = native and compiled is not None
        if self.native:
            # The compiled state works on these arrays in place (capacity, load, link_bytes
            # stay readable here); the calls go to it without a Python frame.
            c = self._c = compiled.State(self.capacity, self._sat, self.load, self._maxrate,
                                         self.link_bytes, self.refills_before_component)
            self.flows = c.flows
            self.add_flow, self.next_time = c.add_flow, c.next_time
            self.pop_drained = self._pop_recorded if record else c.pop_drained
            self.settle = self._settle_checked if self.check_rates else c.settle
            return
        self._cap_list = self.capacity.tolist()
        self._nby = np.zeros(n, np.int64)              # flows it is the bottleneck of
        self.flows: dict[int, Flow] = {}
        self._link_flows: list[set[int]] = [set() for _ in range(n)]
        self._link_by: list[set[int]] = [set() for _ in range(n)]   # flows it stops
        self._heap: list[tuple[float, int, int]] = []    # (finish, fid, version)
        self._added: list[Flow] = []
        self._freed: set[int] = set()                    # links a flow left
        self._next_fid = 0

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
        lst = links.tolist()
        if not lst:
            raise ValueError("a flow crosses at least one link")
        fid = self._next_fid
        self._next_fid += 1
        if len(lst) < _FEW:
            capl = self._cap_list
            solo = min(capl[l] for l in lst)
        else:
            solo = float(self.capacity[links].min())
        f = Flow(fid, links, nbytes, now, data, remaining=float(nbytes), t_last=now, cap=cap,
                 goodput=goodput, solo=min(solo, cap), lst=lst)
        self.flows[fid] = f
        link_flows = self._link_flows
        for l in lst:
            link_flows[l].add(fid)
        self._added.append(f)
        if self.host_bw is None:
            self.link_bytes[links] += nbytes
        else:
            self.link_bytes[links[links < self.nlinks]] += nbytes
        self._flows_started += 1
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
        link_flows, freed = self._link_flows, self._freed
        while heap and heap[0][0] <= bound:
            t, fid, ver = heapq.heappop(heap)
            f = flows.get(fid)
            if f is None or f.version != ver:
                continue
            del flows[fid]
            f.remaining = 0.0
            self._set_by(f, -1)
            rate, load, maxrate = f.rate, self.load, self._maxrate
            for l in f.lst:
                lf = link_flows[l]
                lf.discard(fid)
                if not lf:                      # empty: no round-off left behind
                    load[l] = 0.0
                    maxrate[l] = 0.0
                else:
                    load[l] -= rate
            freed.update(f.lst)
            if self.record:
                self._record(f)
            out.append(f)
        return out

    def _pop_recorded(self, bound: float) -> list:
        """The compiled pop_drained, recording each flow (``record``)."""
        out = self._c.pop_drained(bound)
        for f in out:
            self._record(f)
        return out

    def _settle_checked(self, now: float) -> None:
        """The compiled settle, then the ``check_rates`` hook's check."""
        self._c.settle(now)
        self._check_all()

    def _set_by(self, f: Flow, l: int) -> None:
        if f.by == l:
            return
        if f.by >= 0:
            self._link_by[f.by].discard(f.fid)
            self._nby[f.by] -= 1
        f.by = l
        if l >= 0:
            self._link_by[l].add(f.fid)
            self._nby[l] += 1

    def _record(self, f: Flow) -> None:
        net = f.links[f.links < self.nlinks]
        counts = np.bincount(self.topology.layer_index[net], minlength=4)
        self.records.append(FlowRecord(f.start, f.finish, f.nbytes, tuple(counts.tolist())))

    # -- rates -----------------------------------------------------------------------
    def settle(self, now: float) -> None:
        """Bring every rate to the max-min fair allocation of the active flows, after the
        flows added and drained since the last call (module docstring: *Settling*)."""
        if not self._added and not self._freed:
            return
        flows, link_by = self.flows, self._link_by
        region: dict[int, Flow] = {}
        for f in self._added:
            if f.fid in flows:
                region[f.fid] = f
        for l in self._freed:
            for gid in link_by[l]:
                if gid not in region:
                    region[gid] = flows[gid]
        self._added = []
        self._freed = set()
        if not region:
            return
        widened = 0
        while True:
            self._recomputes += 1
            group = list(region.values())
            rates, by = self._fill(group)
            if not self._check(group, rates, by, region):
                break
            self._refills += 1
            widened += 1
            if widened > self.refills_before_component:
                # a region that keeps widening (a multicast tree joins many flows): fill
                # its whole component once, as a from-scratch water-filling would
                self._components += 1
                group = self._component(region)
                rates, by = self._fill(group)
                break
        self._apply(group, rates, by, now)
        if self.check_rates:
            self._check_all()

    def _component(self, region: dict) -> list[Flow]:
        """Every flow joined to ``region`` through shared links: water-filled together
        they need no check (no flow outside shares a link with them)."""
        flows, link_flows = self.flows, self._link_flows
        seen: set[int] = set()
        done = set(region)
        group = list(region.values())
        stack = [l for f in group for l in f.lst]
        while stack:
            l = stack.pop()
            if l in seen:
                continue
            seen.add(l)
            for gid in link_flows[l]:
                if gid not in done:
                    done.add(gid)
                    g = flows[gid]
                    group.append(g)
                    stack.extend(g.lst)
        return group

    def _fill(self, group: list[Flow]):
        """Max-min rates of ``group`` on what the other flows leave of each link; per flow
        the link that stopped it (-1: its own limit)."""
        if len(group) == 1:
            f = group[0]
            best, by = f.cap, -1
            load, capl = self.load, self._cap_list
            if len(f.lst) < _FEW:
                for l in f.lst:
                    r = capl[l] - (load[l] - f.rate)
                    if r < best:
                        best, by = r, l
            else:
                lk = f.links
                res = self.capacity[lk] - (load[lk] - f.rate)
                i = int(res.argmin())
                if res[i] < best:
                    best, by = float(res[i]), int(lk[i])
            return [max(best, 0.0)], [by]
        if len(group) <= _SMALL:
            return fill_small(group, self._cap_list, self.load)
        return fill_numpy(group, self.capacity, self.load)

    def _check(self, group, rates, by, region) -> bool:
        """The checks of *Settling*: flows that fail join ``region``; True if any did."""
        grew = False
        tight = []
        maxrate, flows, link_flows = self._maxrate, self.flows, self._link_flows
        # (1) a flow of the region stopped by a link goes at least as fast as the others
        for f, x, l in zip(group, rates, by):
            if l < 0 or x >= f.solo * (1 - 1e-12) or x >= maxrate[l] * (1 - SAT_RTOL):
                continue                    # its own limit, or nothing faster on l
            top = 0.0
            hi = x * (1 + SAT_RTOL)
            extra = []
            for gid in link_flows[l]:
                if gid in region:
                    continue
                g = flows[gid]
                r = g.rate
                if r > hi:
                    extra.append(g)
                if r > top:
                    top = r
            if extra:
                for g in extra:
                    region[g.fid] = g
                grew = True
            else:
                tight.append((l, max(top, x) * (1 + 1e-12)))
        # (2) outside flows stopped by a link where a flow of the region changed rate
        nby, link_by = self._nby, self._link_by
        touched: dict[int, list] = {}       # link -> [new load delta, fastest new rate]
        for f, x in zip(group, rates):
            if x == f.rate:
                continue
            d = x - f.rate
            lst = f.lst
            if len(lst) >= _FEW:
                lk = f.links
                lst = lk[nby[lk] > 0].tolist()
            for l in lst:
                if not nby[l]:
                    continue
                t = touched.get(l)
                if t is None:
                    touched[l] = [d, x]
                else:
                    t[0] += d
                    if x > t[1]:
                        t[1] = x
        if touched:
            load, sat = self.load, self._sat
            for l, (d, top) in touched.items():
                for gid in link_by[l]:
                    if gid in region:
                        continue
                    # (the region's unchanged rates there were no faster than g before)
                    g = flows[gid]
                    if load[l] + d >= sat[l] and g.rate >= top * (1 - SAT_RTOL):
                        continue
                    region[gid] = g
                    grew = True
        if not grew:
            for l, top in tight:            # tighter bounds, now that these rates stand
                maxrate[l] = top
        return grew

    def _apply(self, group, rates, by, now: float) -> None:
        heap, load, maxrate = self._heap, self.load, self._maxrate
        for f, rate, l in zip(group, rates, by):
            rate = float(rate)              # (numpy scalars stay out of drain times)
            if not rate > 0:
                raise AssertionError(f"flow {f.fid} settled at rate {rate!r}")
            old = f.rate
            if old > 0:
                f.remaining -= old * (now - f.t_last)
                if f.remaining < 0:
                    f.remaining = 0.0
            f.t_last = now
            self._set_by(f, l if rate < f.solo * (1 - 1e-12) else -1)
            lst = f.lst
            if f.finish != _INF and abs(rate - old) <= old * 1e-13:
                continue                    # unchanged: keep the drain time (no drift)
            f.rate = rate
            f.finish = now + f.remaining / rate
            f.version += 1
            heapq.heappush(heap, (f.finish, f.fid, f.version))
            if len(lst) < _FEW:
                d = rate - old
                for l2 in lst:
                    load[l2] += d
                    if maxrate[l2] < rate:
                        maxrate[l2] = rate
            else:
                lk = f.links
                load[lk] += rate - old
                np.maximum.at(maxrate, lk, rate)

    def _check_all(self) -> None:
        """Every rate against a water-filling of every active flow from scratch."""
        group = list(self.flows.values())
        if not group:
            return
        ref = water_fill(group, self.capacity)
        for f, r in zip(group, ref.tolist()):
            if abs(f.rate - r) > 1e-9 * r:
                raise AssertionError(f"flow {f.fid}: rate {f.rate!r}, max-min {r!r}")
