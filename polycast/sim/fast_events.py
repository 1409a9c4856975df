"""The fast path's event mode: the flows of a run whose flows contend, without engines.

When the graph walk (:mod:`polycast.sim.fast`) finds flows that would share a link beyond
its capacity, their rates are max-min fair shares that change whenever a flow starts or
ends: that needs the event loop. This mode runs the very loop of
:meth:`~polycast.sim.driver.Simulation.run` -- a batch of events per instant, the same
:class:`~polycast.sim.network.Network` settling rates once per batch, FIFO channels,
multicast streams as one paced flow -- but a step's progress is a few array updates on the
graph the walk built instead of an engine call with its headers, plans and actions.

What the engines would do is mirrored step for step: the ready steps of a rank start in
the order the engine's pump starts them, a rank's messages of one event are queued before
any of its channels starts a flow, a stream's datagrams go when their pacing allows, the
FIN of a multicast collective leaves when its last MRECV completes and before the steps it
releases start. The equality grid (tests/test_sim_fast.py) holds it to the engines.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from . import fast_events_native
from .errors import SimulationError
from .fast_kinds import COPY, FIN, MCAST, MRECV, RECV, SEND, Refused
from .network import Network, run_batch, same_time_bound

_POST, _SENDDONE, _ARR, _MARR, _PACE, _KICK, _EOS = range(7)


def run_events(sim, plan) -> None:
    """Run ``plan``'s graph through the flow model; commit the results to ``sim``."""
    ev = _EventRun(sim, plan)
    ev.run()
    ev.commit()


class _EventRun:
    def __init__(self, sim, plan) -> None:
        """The run's arrays (both loops); the Python loop's lists are made by
        :meth:`_lists` when it runs."""
        self.sim, self.plan = sim, plan
        g = plan.g
        N = plan.N
        self.N = N
        self.paced = plan.paced
        # DEP successors (steps' dependencies; MRECV -> FIN is handled by counting)
        ns = g.nsteps
        src = g.dep_flat
        dst = np.repeat(np.arange(ns, dtype=np.int64), g.dep_counts)
        o = np.lexsort((dst, src))
        src, dst = src[o], dst[o]
        ptr = np.zeros(N + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=N), out=ptr[1:])
        self._succ = (ptr, dst)
        # a channel (sender endpoint, peer: -1 for a multicast stream) as an int key
        self.W = int(plan.peer.max(initial=0)) + 2
        self.deps_left = np.concatenate([g.dep_counts, np.zeros(N - ns, np.int64)])
        # members: (request, local rank) numbered request by request
        self.nmem = [r[3] for r in g.reqs]
        self.mbase = np.concatenate([[0], np.cumsum(self.nmem)[:-1]]).astype(np.int64).tolist()
        M = sum(self.nmem)
        mem = self.mem = np.asarray(self.mbase, np.int64)[plan.q] + plan.local  # every node's
        self.mq = np.repeat(np.arange(len(self.nmem)), self.nmem)
        # per member: the steps its post starts (in program order), its steps and MRECVs
        # left, whether it sends a FIN, the bytes of its MCAST and MRECV steps (rto)
        rt = np.flatnonzero(g.dep_counts == 0)
        o = np.argsort(mem[rt], kind="stable")
        self._roots = (rt[o], mem[rt][o])
        self.steps_left = np.bincount(mem[:ns], minlength=M)
        mr = plan.mrecvs
        self.mrecv_left = np.bincount(mem[mr], minlength=M)
        self.fin_of = plan.fin_of
        self.mfin = np.isin(self.mq, list(self.fin_of))
        mm = np.flatnonzero((plan.kind == MCAST) | (plan.kind == MRECV))
        self.mcast_nbytes = np.bincount(mem[mm], weights=plan.nbytes[mm].astype(np.float64),
                                        minlength=M)
        recv_of_send = self.recv_of_send = np.full(N, -1, np.int64)
        recv_of_send[plan.recv_send[plan.recvs]] = plan.recvs
        # per MCAST: its MRECV nodes grouped by latency, in the driver's order
        self.mgroups: dict[int, list] = {}
        if len(mr):
            ep = plan.ep
            mc = plan.mrecv_mcast[mr]
            o = np.argsort(mc, kind="stable")
            xs_all, mc = mr[o], mc[o]
            cut = np.flatnonzero(np.diff(mc)) + 1
            node_of = np.full(int(ep.max()) + 1, -1, np.int64)     # endpoint -> MRECV node
            for xs, m in zip(np.split(xs_all, cut), mc[np.r_[0, cut]].tolist()):
                node_of[ep[xs]] = xs
                groups = []
                for lat, eps in sim._groups(int(ep[m])):
                    if len(eps) and int(eps.max()) >= len(node_of):
                        node_of = np.concatenate([node_of, np.full(int(eps.max()) + 1 -
                                                                   len(node_of), -1, np.int64)])
                    nodes = node_of[eps]
                    nodes = nodes[nodes >= 0]
                    if len(nodes):
                        groups.append((lat, nodes.tolist()))
                self.mgroups[m] = groups
                node_of[ep[xs]] = -1
        # in-network reduction: SEND node -> senders expected to its (destination, tag)
        self.innet_expect: dict[int, int] = {}
        self.combine: dict[tuple, list] = {}
        for q, groups in sim._innet.items():
            sel = np.flatnonzero((plan.q == q) & (plan.kind == SEND) & (plan.wire > 0))
            for n in sel.tolist():
                e = groups.get((int(plan.peer[n]), int(g.tag[n])), 0)
                if e >= 2:
                    self.innet_expect[n] = e
        self.completed = [None] * M
        self.events = 0
        self.now = 0.0
        hb = sim.net.host_bw
        self.net = Network(sim.topo, host_bw=hb, native=sim.net.native)
        # receivers behind a NIC (SimConfig.nic): the driver's queues, run here until one
        # drops a datagram (recovery: the engines)
        self.nic, self.rx_cap = None, math.inf
        if sim.cfg.nic is not None:
            from .nic import ReceiveQueues
            self.nic = ReceiveQueues(sim.cfg.nic, sim.P, sim.cfg.seed)
            self.rx_cap = self.nic.rate
        self.pending = M

    def _lists(self) -> None:
        """The Python loop's state: the arrays as lists (indexing them is what it does per
        event), the per-node flags and times, the queues; then the posts."""
        plan, g, N = self.plan, self.plan.g, self.N
        self.kind = plan.kind.tolist()
        self.q = plan.q.tolist()
        self.local = plan.local.tolist()
        self.ep = plan.ep.tolist()
        self.peer = plan.peer.tolist()
        self.wire = plan.wire.tolist()
        self.nbytes = plan.nbytes.tolist()
        self.lat = plan.lat.tolist()
        self.route = plan.route.tolist()
        rl = plan.route_links                  # unicast routes flat, then the trees
        self.rflat, self.rptr, self.nuni, self.trees = rl.flat, rl.ptr_list, rl.nunicast, rl.trees
        self.t_eos = plan.t_eos.tolist()
        self.t_next = plan.t_next.tolist()
        self.mcap = plan.mcap.tolist()
        self.goodput = plan.goodput.tolist()
        # per node its successors: None, one node, or a list
        ptr, dst = self._succ
        nsucc = np.diff(ptr)
        succ_of = np.where(nsucc == 1, dst[np.minimum(ptr[:-1], max(len(dst) - 1, 0))],
                           -1).astype(object) if len(dst) else np.full(N, -1, object)
        succ_of[nsucc == 0] = None
        dl = dst.tolist()
        pl = ptr.tolist()
        for x in np.flatnonzero(nsucc > 1).tolist():
            succ_of[x] = dl[pl[x]:pl[x + 1]]
        self.succ_of = succ_of.tolist()
        self.deps_left = self.deps_left.tolist()
        M = len(self.completed)
        self.roots: list[list] = [[] for _ in range(M)]
        for x, m in zip(*(a.tolist() for a in self._roots)):
            self.roots[m].append(x)
        self.mem = self.mem.tolist()
        self.mq = self.mq.tolist()
        self.steps_left = self.steps_left.tolist()
        self.mrecv_left = self.mrecv_left.tolist()
        self.mfin = self.mfin.tolist()
        self.mcast_nbytes = self.mcast_nbytes.tolist()
        self.recv_of_send = self.recv_of_send.tolist()
        self.arrived = [False] * N
        self.started = [False] * N
        self.done_t = [math.nan] * N
        self.start_t = [math.nan] * N
        self.fin_out = [False] * M
        self.fin_in = [False] * M
        self.pacer: dict[int, float] = {}
        self.channels: dict[int, deque] = {}     # by channel key (self.chan)
        self.busy: set = set()
        self.kick: list = []
        self.heap: list = []
        self.seq = 0
        self.open: dict[float, tuple] = {}     # time -> the last entry pushed for it
        for q, r in enumerate(g.reqs):
            pt = r[6]
            for i in range(r[3]):
                self._push(float(pt[i]), _POST, q, i)

    # -- the loop -------------------------------------------------------------------
    def _push(self, t, kind, a, b=None) -> None:
        self.open.pop(t, None)
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def _push_msg(self, t, kind, n: int) -> None:
        """Push a message's _SENDDONE or _ARR of node n. Such events of one kind pushed
        one after another for the same time share one heap entry (a list of nodes, handled
        in push order): the heap orders events by (time, push order), so nothing pushed
        between them for another time runs between them, and an entry still queued for
        this time would have run before them anyway. Any other push for time ``t``
        closes the entry (:meth:`_push`), as does taking it off the heap."""
        g = self.open.get(t)
        if g is not None and g[0] == kind:
            g[1].append(n)
            return
        nodes = [n]
        self.open[t] = (kind, nodes)
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, nodes, None))

    def run(self) -> None:
        if fast_events_native.why_not(self) is None:
            self._run_native()
            return
        self._lists()
        heap, net = self.heap, self.net
        cfg = self.sim.cfg
        max_time_s, max_events = cfg.max_time_s, cfg.max_events
        next_time, nic, drained, event = net.next_time, self.nic, self._drained, self._event
        inf = math.inf
        while self.pending:
            t = next_time()
            if heap and heap[0][0] < t:
                t = heap[0][0]
            if t == inf:
                raise SimulationError(f"deadlock: {self.pending} (rank, request) pairs "
                                      f"incomplete at t={self.now:.6g}s (fast path)")
            if t > max_time_s:
                raise SimulationError(f"simulated time passed the limit of {cfg.max_time_s}s "
                                      f"with {self.pending} (rank, request) pairs incomplete")
            self.now = t
            run_batch(t, net, heap, nic, drained, event)
            if self.events > max_events:
                raise SimulationError(f"more than {cfg.max_events} events; raise "
                                      "SimConfig.max_events for a bigger run")

    def _run_native(self) -> None:
        """The same loop in C (fast_events_native), from the same start: the posts are
        its first pushes, in the same order as :meth:`_lists` pushes them."""
        a = fast_events_native.arrays(self, *self._succ, *self._roots)
        status, now, pending, self.events = fast_events_native.run(self, a)
        self.now, self.pending = now, pending
        self.done_t, self.start_t = a["done_t"], a["start_t"]
        self.completed = a["completed"].tolist()
        cfg = self.sim.cfg
        if status == 1:
            raise SimulationError(f"deadlock: {pending} (rank, request) pairs "
                                  f"incomplete at t={now:.6g}s (fast path)")
        if status == 2:
            raise SimulationError(f"simulated time passed the limit of {cfg.max_time_s}s "
                                  f"with {pending} (rank, request) pairs incomplete")
        if status == 3:
            raise SimulationError(f"more than {cfg.max_events} events; raise "
                                  "SimConfig.max_events for a bigger run")

    def _flush(self) -> None:
        """Start the channels the last engine call queued messages on (the driver's _do)."""
        if self.kick:
            ks, self.kick = self.kick, []
            for key in ks:
                if key not in self.busy:
                    self._start_next(key)

    def _event(self, e) -> None:
        t, _, kind, a, b = e
        if kind == _ARR or kind == _SENDDONE:          # nodes a (_push_msg)
            g = self.open.get(t)
            if g is not None and g[1] is a:
                del self.open[t]
            self.events += len(a)
            complete = self._complete_step
            if kind == _ARR:                  # the messages of nodes a arrived
                recv_of_send, arrived, started = self.recv_of_send, self.arrived, self.started
                for x in a:
                    r = recv_of_send[x]
                    if r >= 0:
                        arrived[r] = True
                        if started[r]:
                            complete(r)
                    else:
                        self._fin_arrived(x)
                    if self.kick:
                        self._flush()
            else:                             # the messages of nodes a left their senders
                kinds = self.kind
                for x in a:
                    if kinds[x] == FIN:
                        self._fin_sent(x)
                    else:
                        complete(x)
                    if self.kick:
                        self._flush()
            return
        self.events += 1
        if kind == _MARR:                   # stream a arrived at nodes b
            arrived, started, done_t = self.arrived, self.started, self.done_t
            for x in b:
                arrived[x] = True
                if started[x] and done_t[x] != done_t[x]:    # not done
                    self._stream_complete(x)
                    if self.kick:
                        self._flush()
            return
        elif kind == _PACE:
            self._complete_step(a)
        elif kind == _KICK:
            self.busy.discard(a)
            self._start_next(a)
        elif kind == _POST:
            self._post(a, b)
        elif kind == _EOS:                    # a spaced end-of-stream repeat (its timer)
            self._emit(self.ep[a] * self.W, ("eos", a, self.now))
        if self.kick:
            self._flush()

    def _fin_arrived(self, a: int) -> None:
        """FIN node a arrived at its member's ring successor."""
        q, i = self.q[a], self.local[a]
        m = self.mbase[q] + (i + 1) % self.nmem[q]
        self.fin_in[m] = True
        self._maybe_complete(m)

    def _fin_sent(self, a: int) -> None:
        m = self.mem[a]
        self.fin_out[m] = True
        self._maybe_complete(m)

    # -- the engine's steps -------------------------------------------------------------
    def _post(self, q: int, i: int) -> None:
        m = self.mbase[q] + i
        self._pump(list(self.roots[m]))
        if self.mfin[m] and not self.mrecv_left[m]:
            self._send_fin(q, i)
        self._maybe_complete(m)

    def _pump(self, ready: list) -> None:
        """Start ``ready`` in order, and the steps each start releases after them (a
        FIFO: ``ready`` grows while it is read): the engine's pump."""
        started, start_t, kind, arrived = self.started, self.start_t, self.kind, self.arrived
        now = self.now
        i = 0
        while i < len(ready):
            n = ready[i]
            i += 1
            started[n] = True
            start_t[n] = now
            k = kind[n]
            if k == SEND:                     # a message (an int) on its channel
                self._emit(self.ep[n] * self.W + self.peer[n] + 1, n)
            elif k == RECV:
                if arrived[n]:
                    self._step_done(n, ready)
            elif k == COPY:
                self._step_done(n, ready)
            elif k == MCAST:
                self._start_mcast(n, ready)
            elif k == MRECV:
                if arrived[n] or not self.nbytes[n]:
                    self._stream_complete(n, ready)

    def _start_mcast(self, n: int, ready: list) -> None:
        now, ep = self.now, self.ep[n]
        t0 = max(now, self.pacer.get(ep, 0.0)) if self.paced else now
        key = ep * self.W                          # the endpoint's stream channel
        self._emit(key, ("mcast", n, t0))
        self._emit(key, ("eos", n, t0 + self.t_eos[n]))
        if self.nic is not None:
            # The engine repeats the EOS later by timer (engine/mcast.eos_delays); each takes
            # a chunk of room in every receiver's queue, so with a NIC they count.
            for d in self._eos_delays(n):
                self._push(t0 + self.t_eos[n] + d, _EOS, n)
        if self.paced:
            pn = t0 + self.t_next[n]
            self.pacer[ep] = pn
            if pn > now:
                self._push(pn, _PACE, n)
                return
        self._step_done(n, ready)

    def _eos_delays(self, n: int) -> list:
        from ..engine.mcast import eos_delays
        from ..engine.wire import HEADER_NBYTES
        ecfg = self.sim._ecfg
        rate = ecfg.pacing_gbps or ecfg.line_rate_gbps
        tot = self.mcast_nbytes[self._member(n)]
        rto = ecfg.recovery_timeout_s + 2 * tot * 8 / (rate * 1e9)
        nb = int(self.plan.nbytes[n])
        span = (nb + len(self.plan.dgram_sizes[n]) * HEADER_NBYTES) * 8 / (rate * 1e9)
        return eos_delays(ecfg.eos_repeats, rto, span)

    def _member(self, n: int) -> int:
        return self.mem[n]

    def _step_done(self, n: int, ready: list) -> None:
        self.done_t[n] = self.now
        s = self.succ_of[n]
        if s is not None:
            left = self.deps_left
            if type(s) is int:                # the common case: one successor
                left[s] -= 1
                if not left[s]:
                    ready.append(s)
            else:
                for x in s:
                    left[x] -= 1
                    if not left[x]:
                        ready.append(x)
        self.steps_left[self.mem[n]] -= 1

    def _complete_step(self, n: int) -> None:
        """A step done by an event (message, send done, pacing): successors, completion."""
        ready: list = []
        self._step_done(n, ready)
        if ready:
            self._pump(ready)
        m = self.mem[n]
        if not self.steps_left[m]:              # else _maybe_complete has nothing to do
            self._maybe_complete(m)

    def _stream_complete(self, n: int, ready: list | None = None) -> None:
        outer = ready is None
        if outer:
            ready = []
        self._step_done(n, ready)
        m = self.mem[n]
        self.mrecv_left[m] -= 1
        if self.mrecv_left[m] == 0:
            self._send_fin(self.q[n], self.local[n])
        if outer:
            if ready:
                self._pump(ready)
            self._maybe_complete(m)
        # else: in the middle of a pump (the MRECV started with its data held): the pump
        # goes on with the steps it released, and its caller checks completion

    def _send_fin(self, q: int, i: int) -> None:
        f = self.fin_of[q] + i
        self._emit(self._chan(f), f)

    def _maybe_complete(self, m: int) -> None:
        """Member ``m`` completes once its steps are done (and its FIN out and in)."""
        if self.steps_left[m] or self.completed[m] is not None:
            return
        if self.mfin[m] and not (self.fin_out[m] and self.fin_in[m]):
            return
        self.completed[m] = self.now
        self.pending -= 1

    # -- channels and flows -------------------------------------------------------------
    def _chan(self, n: int) -> int:
        """The channel of message node n (SEND or FIN): (its endpoint, its peer)."""
        return self.ep[n] * self.W + self.peer[n] + 1

    def _emit(self, key, item) -> None:
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = deque()
        ch.append(item)
        if key not in self.busy and key not in self.kick:
            self.kick.append(key)

    def _start_next(self, key: int) -> None:
        """Start what channel ``key`` holds: a message (node n, an int) or a stream's
        data or end marker (("mcast" | "eos", node, not before)), until one flows."""
        ch = self.channels.get(key)
        now = self.now
        while ch:
            item = ch[0]
            if type(item) is int:                   # a message: SEND or FIN node
                ch.popleft()
                n = item
                w = self.wire[n]
                if w:
                    if n in self.innet_expect:
                        self._combine_send(key, n)
                        self.busy.add(key)
                        return
                    cap = math.inf if self.nic is None else self.rx_cap * w / self.nbytes[n]
                    r = self.route[n]                 # a route: a view of the flat array
                    ptr = self.rptr
                    self.net.add_flow(self.rflat[ptr[r]:ptr[r + 1]], w, now, n,
                                      cap=cap, goodput=self.goodput[n])
                    self.busy.add(key)
                    return
                self._push_msg(now, _SENDDONE, n)
                self._push_msg(now + self.lat[n], _ARR, n)
                continue
            if item[2] > same_time_bound(now):
                self.busy.add(key)
                self._push(item[2], _KICK, key)
                return
            ch.popleft()
            n = item[1]
            if item[0] == "eos":
                if self.nic is not None:            # a marker takes a chunk of room
                    self.nic.take(None, self.ep[n], np.zeros(1, np.int64))
                continue
            w = self.wire[n]
            if w:
                f = self.net.add_flow(self._links(n), w, now,
                                      ("mcast", key, n), cap=self.mcap[n],
                                      goodput=self.goodput[n])
                if self.nic is not None:
                    self.nic.add(f, self.ep[n])
                self.busy.add(key)
                return
            self._mcast_arrivals(n, now, None)
        self.busy.discard(key)

    def _links(self, n: int) -> np.ndarray:
        """The links of node n's flow: its route (a view of the plan's flat array) or its
        multicast tree."""
        r = self.route[n]
        if r < self.nuni:
            ptr = self.rptr
            return self.rflat[ptr[r]:ptr[r + 1]]
        return self.trees[r - self.nuni]

    def _combine_send(self, key, n: int) -> None:
        """In-network reduction (the driver's _combine_send): the messages of one
        (destination, tag) wait for each other, then go as one flow on the reverse of the
        destination's multicast tree."""
        q, dst = self.q[n], self.peer[n]
        gk = (q, dst, int(self.plan.g.tag[n]))
        waiting = self.combine.setdefault(gk, [])
        waiting.append((key, n))
        if len(waiting) == self.innet_expect[n]:
            del self.combine[gk]
            sim = self.sim
            links, lat = sim.topo.mcast_tree(sim._node[dst])
            w = self.wire[n]
            self.net.add_flow(links ^ 1, w, self.now,
                              ("innet", None, (waiting, float(lat.max()))),
                              cap=self.rx_cap * w / self.nbytes[n],
                              goodput=self.goodput[n])

    def _mcast_arrivals(self, m: int, t: float, fid) -> None:
        delay = None
        if self.nic is not None:
            keep, delay = self.nic.take(fid, self.ep[m], self.plan.dgram_sizes[m])
            if keep is not None:
                raise Refused("a NIC's receive queue dropped datagrams: the engines recover "
                              "them")
        for lat, nodes in self.mgroups.get(m, ()):
            if delay is None:
                self._push(t + lat, _MARR, m, nodes)
                continue
            d = delay[[self.ep[x] for x in nodes]]       # world: endpoint == rank
            for x in np.unique(d).tolist():
                self._push(t + lat + x, _MARR, m, [y for y, e in zip(nodes, d) if e == x])

    def _drained(self, f) -> None:
        data = f.data
        now = self.now
        if type(data) is int:                        # a message's flow (node data)
            self._push_msg(now, _SENDDONE, data)
            self._push_msg(now + self.lat[data], _ARR, data)
            key = self.ep[data] * self.W + self.peer[data] + 1
            if self.channels[key]:
                self.busy.discard(key)
                self._start_next(key)
            else:                             # nothing queued (_start_next's end)
                self.busy.discard(key)
            return
        what, key, n = data
        if what == "innet":
            waiting, lat = n
            for _, x in waiting:
                self._push_msg(now, _SENDDONE, x)
                self._push_msg(now + lat, _ARR, x)
            for k, _ in waiting:
                self.busy.discard(k)
                self._start_next(k)
            return
        self._mcast_arrivals(n, now, f.fid)                # ("mcast", key, n)
        self.busy.discard(key)
        self._start_next(key)

    # -- results ----------------------------------------------------------------------
    def commit(self) -> None:
        sim, plan = self.sim, self.plan
        self._check_recovery()
        sim.net.link_bytes += self.net.link_bytes
        sim.net.flows_started += self.net.flows_started
        if self.nic is not None:
            sim.nic = self.nic                       # its counters, for the result
        sim.datagrams += plan.ndatagrams
        tmax = 0.0
        for q, r in enumerate(plan.g.reqs):
            comm = r[2]
            for i, rank in enumerate(sim._comm_group[comm]):
                tl = sim.timelines[rank]
                tl.posted[q] = float(r[6][i])
                t = self.completed[self.mbase[q] + i]
                tl.completed[q] = t
                tmax = max(tmax, t)
        sim._pending = 0
        sim._heap.clear()
        sim.now = tmax
        sim.events = self.events
        nreq = sum(self.nmem)
        sim._fast_stats = {"completed": nreq, "failed": 0, "recovered_bytes": 0,
                           "messages_out": int(len(plan.msg)),
                           "message_bytes_out": int(plan.nbytes[plan.msg].sum()),
                           "datagrams_out": plan.ndatagrams}

    def _check_recovery(self) -> None:
        """As the walk's check: no stream so late after its MRECV started that the
        engine's coarse timeout would have pulled it."""
        plan = self.plan
        mr = plan.mrecvs
        if not len(mr):
            return
        times = {"done": np.asarray(self.done_t), "emit": np.asarray(self.start_t)}
        try:
            plan.check_recovery(times)
        except Refused as e:
            raise SimulationError(f"fast path: {e}; run with SimConfig(path='engine')") \
                from None


__all__ = ["run_events"]
