"""The fast path's walk (:mod:`polycast.sim.fast`): longest-path times of a
:class:`~.fast_plan._Plan`'s graph level by level, the channel order settled by re-walking,
the contention and recovery checks on the times found, and the results written into the
simulation. :class:`Walk` is a mixin of :class:`~.fast_plan._Plan`: it reads the arrays
the plan built."""

from __future__ import annotations

import math
import numpy as np

from .fast_checks import _quantize, _quantum, links_fit
from .fast_kinds import FIN, MCAST, MRECV, RECV, SEND, SILENT_RTO, Refused

_NEG = -math.inf


class Walk:
    """The walk, checks and results of a :class:`~.fast_plan._Plan` (a mixin)."""

    def _chain(self, order) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the message before it on its channel (an MCAST: on its engine's
        multicast channel, which is also its pacer), and the one after it; -1 for none."""
        cn, ck, mn, mk = order
        prev = np.full(self.N, -1, self.ix)
        nxt = np.full(self.N, -1, self.ix)
        for nodes, keys in ((cn, ck), (mn, mk)):
            same = keys[1:] == keys[:-1]
            a, b = nodes[:-1][same], nodes[1:][same]
            prev[b] = a
            nxt[a] = b
        return prev, nxt

    def settled_walk(self) -> dict:
        """Walk, re-order the channels by the start times found, walk again, until the
        order the walk assumed is the order its times give."""
        self.check_start()
        if len(self.g.reqs) > 1:
            # Several requests share channels: first order each channel by the start times
            # a walk finds when each request had its channels to itself.
            order = self.channel_order(self.walk(self._order(np.zeros(self.N), True)))
        else:
            order = self.initial_order()
        for _ in range(8):
            times = self.walk(order)
            if self.order_holds(order, times["emit"]):
                return times
            # Not settled, and flows of different channels already share a link beyond its
            # capacity: a re-walk only re-orders messages within their channels, which
            # leaves such overlaps where they are (in every case of the equality grid: a
            # walk that showed them never settled into one without), and a settled walk
            # would be refused for them. So the events mode now, not after the re-walks:
            # only a speed choice, as the events mode is exact.
            try:
                self.check_contention(times)
            except Refused as e:
                raise Refused(f"{e} (seen while the channel order was settling)") from None
            order = self.channel_order(times)
        raise Refused("the channels' message order did not settle")

    def initial_order(self):
        return self._order(np.zeros(self.N))

    def order_holds(self, order, emit: np.ndarray) -> bool:
        """Whether the times a walk found give its channels the order it assumed (each
        next message of a channel later, or at the same instant and after it by request
        and program position): the order :meth:`_order` would sort them into."""
        quantum = _quantum(emit)
        tie = self.tie
        for nodes, keys in ((order[0], order[1]), (order[2], order[3])):
            same = keys[1:] == keys[:-1]
            a, b = nodes[:-1][same], nodes[1:][same]
            ta, tb = _quantize(emit[a], quantum), _quantize(emit[b], quantum)
            later = (tb > ta) | ((tb == ta) & (tie[b] > tie[a]))
            if not later.all():
                return False
        return True

    def _order(self, emit: np.ndarray, per_request: bool = False):
        """Channel and pacer orders: nodes sorted by (channel, start time, request,
        program position); returns (chan sorted nodes, chan keys, pacer nodes, keys).
        ``per_request``: every request its own channels (a first guess)."""
        msg, mc = self.msg, self.mcasts
        ckey = self.ep[msg] * (1 << 32) + self.peer[msg] + 1
        mkey = self.ep[mc]
        if per_request:
            ckey = ckey * len(self.g.reqs) + self.q[msg]
            mkey = mkey * len(self.g.reqs) + self.q[mc]
        quantum = _quantum(emit)
        span = int(self.tie.max()) + 1 if self.N else 1
        out = []
        for nodes, key in ((msg, ckey), (mc, mkey)):
            t = _quantize(emit[nodes], quantum)
            tie = self.tie[nodes]
            if float(t.max(initial=0.0)) * span < 2.0**62:
                # (time, tie) as one integer: one sort key fewer
                o = np.lexsort((t.astype(np.int64) * span + tie, key))
            else:
                o = np.lexsort((tie, t, key))
            out += [nodes[o], key[o]]
        return tuple(out)

    def channel_order(self, times):
        return self._order(times["emit"])

    # -- the walk ---------------------------------------------------------------------
    def _buffers(self):
        """The walk's per-node rows, made once per plan: a re-walk overwrites them (a
        walk's times are read before the next walk), and a row holds a node's value only
        where its kind sets it (done and emit: every node; start, drain, chanfree: messages
        and MCASTs; arrive: messages; pnext: MCASTs)."""
        if self._bufs is None:
            self._bufs = (np.empty((7, self.N)), np.empty(self.N, self.ix))
        return self._bufs

    def walk(self, order) -> dict:
        """Longest-path times of every node (Kahn's algorithm, a level of ready nodes at a
        time)."""
        N = self.N
        prev, nxt = self._chain(order)
        indeg = self.indeg0 + (prev >= 0)
        dep_ptr, dep_src, arr_src = self.dep_ptr, self.dep_src, self.arr_src
        succ_ptr, succ = self.succ_ptr, self.succ
        kind, post, dur, lat = self.kind, self.post, self.dur, self.lat
        t_eos, t_next, wire, paced = self.t_eos, self.t_next, self.wire, self.paced
        F, stamp = self._buffers()
        done, arrive, chanfree, pnext, drain, emit, start = F
        front = np.flatnonzero(indeg == 0)
        seen = 0
        levels = 0
        while len(front):
            n = len(front)
            levels += 1
            seen += n
            # dependencies: the latest done of each node's predecessors (and its post)
            ready = post[front]
            cnt = dep_ptr[front + 1] - dep_ptr[front]
            has = cnt > 0
            if has.any():
                c = cnt[has]
                first = np.cumsum(c) - c
                e = np.repeat(dep_ptr[front[has]] - first, c) + np.arange(int(first[-1] + c[-1]))
                ready[has] = np.maximum(ready[has], np.maximum.reduceat(done[dep_src[e]], first))
            k = kind[front]
            emit[front] = ready
            dn = ready.copy()
            # messages (SEND with a payload, control SEND, FIN)
            m = (k == SEND) | (k == FIN)
            if m.any():
                f = front[m]
                p = prev[f]
                st = np.maximum(ready[m], np.where(p >= 0, chanfree[p], _NEG))
                dr = st + dur[f]
                start[f], drain[f], chanfree[f] = st, dr, dr
                arrive[f] = dr + lat[f]
                dn[m] = dr
            m = k == RECV
            if m.any():
                dn[m] = np.maximum(ready[m], arrive[arr_src[front[m]]])
            m = k == MRECV
            if m.any():
                f = front[m]
                dn[m] = np.maximum(ready[m], drain[arr_src[f]] + lat[f])
            m = k == MCAST
            if m.any():
                f = front[m]
                p = prev[f]
                has = p >= 0
                pace_in = np.where(has, pnext[p], _NEG)
                t0 = np.maximum(ready[m], pace_in)
                st = np.maximum(t0, np.where(has, chanfree[p], _NEG))
                dr = np.where(wire[f] > 0, st + dur[f], st)
                te = t0 + t_eos[f]
                start[f], drain[f] = st, dr
                chanfree[f] = np.maximum(dr, te)
                pn = t0 + t_next[f]
                pnext[f] = np.where(paced, pn, pace_in)
                dn[m] = np.maximum(pn, ready[m]) if paced else ready[m]
            done[front] = dn
            # successors: the static ones, then the next on each channel
            sc = succ_ptr[front + 1] - succ_ptr[front]
            stot = int(sc.sum())
            first = np.cumsum(sc) - sc
            t = succ[np.repeat(succ_ptr[front] - first, sc) + np.arange(stot)]
            x = nxt[front]
            t = np.concatenate([t, x[x >= 0]])
            if not len(t):
                break
            np.subtract.at(indeg, t, 1)
            t = t[indeg[t] == 0]
            # each new node once: of its copies in t, the one whose index wins the store
            j = np.arange(len(t), dtype=stamp.dtype)
            stamp[t] = j
            front = t[stamp[t] == j]
        if seen != N:
            raise Refused("the schedule's steps wait on each other (a cycle) under the "
                          "assumed channel order")
        self.levels = levels
        return {"done": done, "emit": emit, "start": start, "drain": drain,
                "arrive": arrive, "chanfree": chanfree}

    # -- checks -----------------------------------------------------------------------
    def check_start(self) -> None:
        """Refuse, before any walk, a run whose flows already overflow a link at the first
        post: what :meth:`check_contention` would refuse in any walk's times, found without
        them (only a speed choice: the events mode is exact).

        A channel counts when a message on it that carries bytes is a step with no
        dependency posted at the earliest post time t0. Under any channel order the walk
        accepts (messages sorted by emit time; such a step emits at t0, the earliest emit
        there is) the messages before it emit at t0 too (within the order's quantum), so the
        channel's first message that carries bytes starts then: messages without bytes take
        no time on a unicast channel (a stream's channel counts only when all its streams
        carry bytes: an empty one still spaces the next by the pacing). It stays busy for at
        least its shortest message at no less than its slowest rate. Those channels' rates
        summed per link, over the link's capacity, overflow it at once."""
        kind, wire = self.kind, self.wire
        nodes = np.flatnonzero(((kind == SEND) | (kind == FIN) | (kind == MCAST)))
        ns = self.g.nsteps
        if not len(nodes) or not ns:
            return
        P2 = self.sim.P + 2
        ep, peer, k = self.ep[nodes], self.peer[nodes], kind[nodes]
        chan = np.where(k == MCAST, ep * P2, ep * P2 + 1 + peer)
        uc, ci, inv = np.unique(chan, return_index=True, return_inverse=True)
        C = len(uc)
        root = np.zeros(self.N, bool)
        root[:ns] = self.g.dep_counts == 0
        rt = np.flatnonzero(root)
        if not len(rt):
            return
        t0 = self.post[rt].min()
        w = wire[nodes] > 0
        at0 = np.bincount(inv, weights=root[nodes] & w & (self.post[nodes] == t0),
                          minlength=C) > 0
        empty_stream = np.bincount(inv, weights=~w & (k == MCAST), minlength=C) > 0
        rate = np.full(C, np.inf)
        np.minimum.at(rate, inv[w], self.rate[nodes[w]])
        dur = np.full(C, np.inf)
        np.minimum.at(dur, inv[w], self.dur[nodes[w]])
        # every time of a walk is below this sum: the busy spans dwarf the time tolerances
        span = float(self.post.max() + self.dur.sum() + self.lat.sum() + self.t_next.sum() +
                     self.t_eos.sum())
        ok = at0 & ~empty_stream & (rate > 0) & np.isfinite(rate) & (dur > 1e-9 * span)
        if ok.sum() < 2:
            return
        cap = self.sim.net.capacity
        lk, lens = self.route_links.gather(self.route[nodes[ci[ok]]])
        load = np.bincount(lk, weights=np.repeat(rate[ok], lens), minlength=len(cap))
        over = np.flatnonzero(load > cap * (1 + 1e-9))
        if len(over):
            j = int(over[0])
            raise Refused(f"flows share link {j} beyond its capacity from the first post "
                          f"({load[j] / cap[j]:.3g}x): max-min sharing runs the engines")

    def check_contention(self, times) -> None:
        """Every link shared by several channels carries, at every instant, no more than
        its capacity of solo rates (else max-min sharing would slow some flow)."""
        sim = self.sim
        cap = sim.net.capacity
        flows = np.flatnonzero(self.wire > 0)
        if not len(flows):
            return
        route = self.route[flows]
        chan = np.where(self.kind[flows] == MCAST, self.ep[flows] * (sim.P + 2),
                        self.ep[flows] * (sim.P + 2) + 1 + self.peer[flows])
        # (channel, route) pairs -> links; links used by two channels or more are shared
        uc, ci = np.unique(chan, return_index=True)
        lk, _ = self.route_links.gather(route[ci])
        if not len(lk):
            return
        cnt = np.bincount(lk, minlength=len(cap))
        shared = cnt > 1
        if not shared.any():
            return
        # flows on shared links: (link, time, +-rate) events, flow by flow
        links, lens = self.route_links.gather(route)
        on = shared[links]
        if not on.any():
            return
        links = links[on]
        fr = np.repeat(flows, lens)[on]
        links_fit(links, times["start"][fr], times["drain"][fr], self.rate[fr], cap)

    def check_recovery(self, times) -> None:
        """No stream arrives so late after its MRECV started that the engine's coarse
        timeout would pull it (the recovery protocol runs on the engines)."""
        mr = self.mrecvs
        if not len(mr):
            return
        sim = self.sim
        ecfg = sim._ecfg
        rate = ecfg.pacing_gbps or ecfg.line_rate_gbps
        # rto per (request, member): recovery floor + 2 x its multicast bytes at the rate
        key = self.q * (1 << 32) + self.local
        mm = np.flatnonzero((self.kind == MCAST) | (self.kind == MRECV))
        uk, inv = np.unique(key[mm], return_inverse=True)
        tot = np.bincount(inv, weights=self.nbytes[mm].astype(np.float64))
        rto = ecfg.recovery_timeout_s + 2 * tot * 8 / (rate * 1e9)
        pos = np.searchsorted(uk, key[mr])
        late = times["done"][mr] - times["emit"][mr] > SILENT_RTO * rto[pos]
        if late.any():
            raise Refused("a stream arrives later than the engines' recovery timeout")

    # -- results ----------------------------------------------------------------------
    def commit(self, times) -> None:
        sim, g = self.sim, self.g
        done, start, arrive = times["done"], times["start"], times["arrive"]
        nlinks = sim.net.nlinks
        # link bytes: wire bytes per route, added once per route
        flows = np.flatnonzero(self.wire > 0)
        per_route = np.bincount(self.route[flows], weights=self.wire[flows].astype(np.float64),
                                minlength=len(self.route_links))
        lb = sim.net.link_bytes
        used = np.flatnonzero(per_route)
        lk, lens = self.route_links.gather(used)
        w = np.repeat(per_route[used], lens)
        net = lk < nlinks                       # not the host ports
        # whole bytes: float sums are exact (below 2**53), in any order
        lb += np.bincount(lk[net], weights=w[net], minlength=nlinks)
        sim.net.flows_started += len(flows)
        sim.datagrams += self.ndatagrams
        # completion per (request, member)
        tmax = 0.0
        steps = np.arange(g.nsteps)
        for q, (sched, _, comm, n, base, starts, pt) in enumerate(g.reqs):
            sel = steps[g.q == q] if len(g.reqs) > 1 else steps
            comp = np.full(n, _NEG)
            np.maximum.at(comp, g.local[sel], done[sel])
            comp = np.maximum(comp, pt)
            if q in self.fin_of:
                f0 = self.fin_of[q]
                fins = np.arange(f0, f0 + n)
                comp = np.maximum(comp, start[fins])               # FIN handed off
                comp = np.maximum(comp, np.roll(arrive[fins], 1))  # FIN from rank - 1
            grp = sim._comm_group[comm]
            for i, r in enumerate(grp):
                tl = sim.timelines[r]
                tl.posted[q] = float(pt[i])
                tl.completed[q] = float(comp[i])
            tmax = max(tmax, float(comp.max()))
        sim._pending = 0
        sim._heap.clear()
        sim.now = tmax
        sim.events = self.N
        sim.fast_levels = self.levels
        nreq = sum(r[3] for r in g.reqs)
        sim._fast_stats = {"completed": nreq, "failed": 0, "recovered_bytes": 0,
                           "messages_out": int(len(self.msg)),
                           "message_bytes_out": int(self.nbytes[self.msg].sum()),
                           "datagrams_out": self.ndatagrams}
