"""The fast path: a simulation's timing without stepping the engines, checked exact.

The engine-driven simulation (:class:`~polycast.sim.driver.Simulation` stepping one
:class:`~polycast.engine.engine.Engine` per rank) is the reference. Without loss, NIC
queues, timeouts or failures, what the engines do with a schedule is fixed: a step starts
when its dependencies are done; a SEND goes on its channel (FIFO per sender and peer),
drains at its flow's rate and is done then, its message arriving one path latency later;
a RECV is done when its step has started and its message has arrived; a COPY at once; an
MCAST paces its datagrams (the engine's pacer) and goes as one flow on the root's tree
when its channel is free, an MRECV is done when its stream has arrived; a multicast
collective then sends FIN to the ring successor and completes once it has FIN from its
predecessor. That makes the run a graph — steps, and the channels', pacers' and matches'
edges between them — whose times are one longest-path walk, done here level by level over
numpy arrays (every rank's ring step at once) instead of one Python event per message.

The walk assumes two things the event loop decides on the fly, and then checks both:

* **Channel order.** The messages of a channel leave in the order their steps started;
  the walk assumes an order (program order at first), computes the start times, and if
  they order a channel otherwise walks again in that order (until it settles).
* **No binding contention.** Every flow is assumed to move at its solo rate (its path's
  slowest link, or its pacing cap). Max-min fair sharing gives every flow its solo rate
  exactly when, on every link, the solo rates of the flows in flight at once fit the
  link's capacity: that is checked for every link that more than one channel uses.

When a check fails (a rank sending to two peers through one port, an alltoall colliding
on uplinks, in-network reduction) the fast path refuses with the reason and the
simulation runs on the engines: one protocol, one answer. ``tests/test_sim_fast.py``
compares both on every registered algorithm (the equality grid).
"""

from __future__ import annotations

import math
import numpy as np

from .errors import SimulationError
from . import fast_stream
from .fast_checks import _quantize, _quantum, links_fit, stream_shape
from .fast_events import run_events
from .fast_kinds import COPY, FIN, MCAST, MRECV, RECV, SEND, SILENT_RTO, Refused

_NEG = -math.inf


def static_refusal(loss: float = 0.0, nic=None, record: bool = False) -> str | None:
    """What of a run's configuration alone sends it to the engines (known before any work;
    a NIC model is not: the fast path runs it until its queue drops a datagram)."""
    if loss:
        return "loss injection runs the engines' recovery"
    if record:
        return "recording per-message timelines runs the engines"
    return None


def refusal(sim) -> str | None:
    """Why ``sim`` (posted, not run) must run on the engines, or None."""
    cfg = sim.cfg
    why = static_refusal(cfg.loss, cfg.nic, cfg.record)
    if why:
        return why
    if sim.on_complete is not None or sim._calls:
        return "callbacks (on_complete, call_at) run the engines"
    if sim._unposted:
        return "requests not posted by every member run the engines"
    if any(ev[2] != 5 for ev in sim._heap):           # driver._POST
        return "the simulation already ran"
    for q in sim._innet:
        if sim._reqs[q][2]:
            return "in-network reduction on a sub-communicator runs the engines"
    if cfg.nic is not None and any(comm for _, _, comm in sim._reqs):
        return "the NIC model on a sub-communicator runs the engines"
    for sched, _, comm in sim._reqs:
        if sched.nranks < 2:
            return "a one-rank collective runs the engines"
    return None


def _check_post_order(sim) -> None:
    """Members of a communicator post its requests in one order (the engines number them
    by order): the same error as the engines give, before anything runs."""
    order: dict[int, list] = {}
    for ev in sorted(sim._heap):                    # (t, seq, _POST, endpoint, req, _)
        order.setdefault(ev[3], []).append(ev[4])
    for comm, eps in enumerate(sim._comm_eps):
        seqs = {tuple(order.get(e, ())) for e in eps}
        if len(seqs) > 1:
            raise SimulationError(f"members of communicator {comm} post its requests in "
                                  "different orders (members must post a communicator's "
                                  "requests in the same order)")


# -- the graph ------------------------------------------------------------------------------

class _Graph:
    """Every step of every posted request as arrays (the schedules' columns,
    :func:`~polycast.schedule.compact.columns_of`, side by side)."""

    def __init__(self, sim) -> None:
        from ..schedule.compact import columns_of
        self.sim = sim
        posts: dict[tuple[int, int], float] = {}
        for ev in sim._heap:                            # (t, seq, _POST, endpoint, req, _)
            posts[(ev[3], ev[4])] = ev[0]
        cols = {k: [] for k in ("kind", "peer", "tag", "nbytes")}
        qs, locals_, idxs = [], [], []
        dep_counts, dep_flat = [], []
        self.reqs = []
        eps_of, group_of, post_of, shapes = [], [], [], []
        base = 0
        for q, (sched, itemsize, comm) in enumerate(sim._reqs):
            group = sim._comm_group[comm]
            eps = sim._comm_eps[comm]
            n = sched.nranks
            c = columns_of(sched)
            ns = c.nsteps
            cols["kind"].append(c.kind)
            cols["peer"].append(c.peer)
            cols["tag"].append(c.tag)
            cols["nbytes"].append(c.nelems * itemsize)
            qs.append(np.full(ns, q, np.int64))
            locals_.append(c.local)
            idxs.append(c.idx)
            pt = np.array([posts[(e, q)] for e in eps], dtype=np.float64)
            dep_counts.append(c.dep_counts.astype(np.int64))
            dep_flat.append(c.dep_flat + base)
            self.reqs.append((sched, itemsize, comm, n, base, None, pt))
            lens = np.diff(c.starts)
            shapes.append((n, int(lens[0])) if len(lens) and (lens == lens[0]).all() else None)
            eps_of.append(np.asarray(eps, dtype=np.int64))
            group_of.append(np.asarray(group, dtype=np.int64))
            post_of.append(pt)
            base += ns
        self.nsteps = base
        # Steps in program-position order (every rank's first step, then every rank's
        # second, ...; each rank's own steps stay in program order): a level of the walk
        # holds about one step per rank, and in the schedules' rank-major order those lie
        # a whole program apart, every read a cache miss.
        if shapes and None not in shapes:
            # request, rank and position of every step follow from the layout
            perm, self.q, self.local, self.idx = _position_order(shapes)
        else:
            perm = np.argsort(np.concatenate(idxs), kind="stable") if idxs else \
                np.zeros(0, np.int64)
            for k, v in (("q", qs), ("local", locals_), ("idx", idxs)):
                cols[k] = v
        inv = np.empty(base, np.int64)
        inv[perm] = np.arange(base)
        for k, v in cols.items():
            a = np.concatenate(v)[perm] if v else np.zeros(0, np.int64)
            setattr(self, k, a if k == "kind" else a.astype(np.int64, copy=False))
        # endpoint, global rank and post time of every step, by (request, local rank)
        off = np.concatenate([[0], np.cumsum([len(x) for x in eps_of])])
        at = off[self.q] + self.local
        self.ep = np.concatenate(eps_of)[at]
        self.rank = np.concatenate(group_of)[at]
        self.post = np.concatenate(post_of)[at]
        counts = np.concatenate(dep_counts)
        flat = np.concatenate(dep_flat)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.dep_counts = counts = counts[perm]
        tot = int(counts.sum())
        ends = np.cumsum(counts)
        pos = np.repeat(first[perm] - (ends - counts), counts) + np.arange(tot)
        self.dep_flat = inv[flat[pos]]


def _position_order(shapes: list[tuple[int, int]]):
    """For requests of ``(programs, steps per program)`` laid out rank-major one after
    another: the order listing step 0 of every program (request by request), then step 1,
    ... -- ``np.argsort(positions, kind="stable")`` without the sort -- and in that order
    every step's request, program and position."""
    n = np.array([s[0] for s in shapes], np.int64)
    L = np.array([s[1] for s in shapes], np.int64)
    off = np.concatenate([[0], np.cumsum(n * L)[:-1]])
    # blocks of one (position, request), in order: position-major, then request
    j, q = np.nonzero(np.arange(int(L.max(initial=0)))[:, None] < L[None, :])
    size = n[q]
    total = int(size.sum())
    first = np.cumsum(size) - size
    local = np.arange(total, dtype=np.int64) - np.repeat(first, size)
    qq = np.repeat(q.astype(np.int64), size)
    idx = np.repeat(j.astype(np.int64), size)
    perm = off[qq] + local * L[qq] + idx
    return perm, qq, local, idx


def run(sim) -> str:
    """Time ``sim``'s posted requests without engines; fill its timelines, link bytes and
    counters as :meth:`Simulation.run` would. Returns the mode that ran: ``stream`` (one
    template request timed position by position, :mod:`.fast_stream`), ``walk`` (the
    graph walk, its checks passed) or ``events`` (the flows' events, for runs whose flows
    contend). Raises :class:`Refused` before changing anything when neither covers the
    run."""
    why = refusal(sim)
    if why:
        raise Refused(why)
    _check_post_order(sim)
    t = fast_stream.form_of(sim)
    if t is not None:
        try:
            return fast_stream.run(sim, t)
        except Refused as e:
            sim.fast_stream_refused = str(e)
            fast_stream.walk_fits(sim, str(e))
    g = _Graph(sim)
    if g.nsteps > sim.cfg.max_events:
        raise SimulationError(f"more than {sim.cfg.max_events} events; raise "
                              "SimConfig.max_events for a bigger run")
    plan = _Plan(sim, g)
    try:
        if sim._innet:
            raise Refused("in-network reduction combines flows in the switches")
        if sim.cfg.nic is not None:
            raise Refused("the NIC model's queues change with every flow")
        times = plan.settled_walk()
        plan.check_contention(times)
        plan.check_recovery(times)
    except Refused as e:
        sim.fast_walk_refused = str(e)
    else:
        plan.commit(times)
        return "walk"
    # (out of the except block: its traceback would keep the last walk's rows alive)
    plan._bufs = times = None               # the walk's rows (times are views of them)
    plan.drop_walk_edges()
    run_events(sim, plan)
    return "events"


class _Plan:
    """Routes, flow durations and the graph's edges for one simulation."""

    def __init__(self, sim, g: _Graph) -> None:
        self.sim, self.g = sim, g
        topo = sim.topo
        self.fr = topo.framing
        ns = g.nsteps
        kind = g.kind
        # FIN nodes: one per (request, member) of a request that multicasts.
        fin_q, fin_local, fin_ep, fin_rank, fin_post, fin_idx = [], [], [], [], [], []
        self.fin_base = ns
        fin_of = {}
        for q, (sched, _, comm, n, base, starts, pt) in enumerate(g.reqs):
            if not sched.uses_multicast:
                continue
            eps = sim._comm_eps[comm]
            grp = sim._comm_group[comm]
            fin_of[q] = ns + len(fin_q)
            for i in range(n):
                fin_q.append(q)
                fin_local.append(i)
                fin_ep.append(eps[i])
                fin_rank.append(grp[i])
                fin_post.append(pt[i])
        nf = len(fin_q)
        self.fin_of = fin_of
        self.N = N = ns + nf
        def cat(steps, fins, dtype=np.int64):      # the graph's own array when no FIN
            return np.concatenate([steps, np.asarray(fins, dtype)]) if nf else steps
        self.kind = cat(kind, np.full(nf, FIN))
        self.q = cat(g.q, fin_q)
        self.ep = cat(g.ep, fin_ep)
        self.rank = cat(g.rank, fin_rank)
        self.local = cat(g.local, fin_local)
        self.post = cat(g.post, fin_post, np.float64)
        n_of_q = np.array([r[3] for r in g.reqs], dtype=np.int64)
        fin_peer = (np.asarray(fin_local, np.int64) + 1) % n_of_q[np.asarray(fin_q, np.int64)] \
            if nf else np.zeros(0, np.int64)
        self.peer = cat(g.peer, fin_peer)
        self.nbytes = cat(g.nbytes, np.zeros(nf))
        # tie-break of messages started at one instant: request, then program position
        # (a FIN right after its last MRECV, before the steps that MRECV releases), as one
        # integer: request * span + 2 * position (+ 1 for a FIN)
        span = 2 * (int(g.idx.max()) + 1) + 1 if len(g.idx) else 1
        self.tie = np.concatenate([g.idx * 2, np.full(nf, span - 1, np.int64)]) \
            + self.q * span
        # the peer's global rank: its communicator's member, by (request, local rank)
        groups = [np.asarray(sim._comm_group[r[2]], dtype=np.int64) for r in g.reqs]
        off = np.concatenate([[0], np.cumsum([len(x) for x in groups])[:-1]])
        self.global_peer = np.where(self.peer >= 0, np.concatenate(groups)[
            off[self.q] + np.maximum(self.peer, 0)], -1)
        self._match()
        self._fin_ties()
        self._edges_static()
        self._flows()

    # -- matching ---------------------------------------------------------------------
    def _match(self) -> None:
        """RECV -> its SEND (by pair and ordinal), MRECV -> its MCAST (by root and ordinal)."""
        g, kind = self.g, self.kind[:self.g.nsteps]
        q, loc, peer, tag = g.q, g.local, g.peer, g.tag
        nmax = int(max(r[3] for r in g.reqs))
        T = int(tag.max()) + 2 if len(tag) else 1
        sends = np.flatnonzero(kind == SEND)
        recvs = np.flatnonzero(kind == RECV)
        key_s = ((q[sends] * nmax + loc[sends]) * nmax + peer[sends]) * T + tag[sends]
        key_r = ((q[recvs] * nmax + peer[recvs]) * nmax + loc[recvs]) * T + tag[recvs]
        if len(sends) != len(recvs):
            raise Refused("a message without its match")
        os_, or_ = np.argsort(key_s, kind="stable"), np.argsort(key_r, kind="stable")
        if not np.array_equal(key_s[os_], key_r[or_]):
            raise Refused("a message without its match")
        rs, ss = recvs[or_], sends[os_]
        self.recv_send = np.full(self.N, -1, np.int64)
        self.recv_send[rs] = ss
        if (self.nbytes[rs] != self.nbytes[ss]).any():
            raise Refused("a RECV expects another size than its SEND carries")
        mc = np.flatnonzero(kind == MCAST)
        mr = np.flatnonzero(kind == MRECV)
        key_m = (q[mc] * nmax + loc[mc]) * T + tag[mc]
        key_x = (q[mr] * nmax + peer[mr]) * T + tag[mr]
        om = np.argsort(key_m, kind="stable")
        pos = np.searchsorted(key_m[om], key_x)
        pos = np.minimum(pos, max(len(mc) - 1, 0))
        if len(mr) and (not len(mc) or not np.array_equal(key_m[om][pos], key_x)):
            raise Refused("an MRECV without its MCAST")
        self.mrecv_mcast = np.full(self.N, -1, np.int64)
        if len(mr):
            self.mrecv_mcast[mr] = mc[om][pos]
        self.sends, self.recvs, self.mcasts, self.mrecvs = sends, recvs, mc, mr

    def _fin_ties(self) -> None:
        """A FIN leaves right after its member's last MRECV completes, before the steps
        that MRECV releases; with no MRECV, after everything its post starts (the tie
        :meth:`__init__` gave it)."""
        if not self.fin_of:
            return
        mr = self.mrecvs
        for q, f0 in self.fin_of.items():
            n = self.g.reqs[q][3]
            sel = mr[self.q[mr] == q]
            if len(sel):
                last = np.full(n, -1, np.int64)
                np.maximum.at(last, self.local[sel], self.tie[sel])
                self.tie[f0:f0 + n] = np.where(last >= 0, last + 1, self.tie[f0:f0 + n])

    # -- routes and flows -------------------------------------------------------------
    def _flows(self) -> None:
        sim, fr = self.sim, self.fr
        kind, N = self.kind, self.N
        cap = sim.net.capacity
        msg = np.flatnonzero((kind == SEND) | (kind == FIN))
        self.msg = msg
        pairs = self.rank[msg] * sim.P + self.global_peer[msg]
        upairs, inv = _unique(pairs, sim.P * sim.P)
        links, lats, rates = [], np.empty(len(upairs)), np.empty(len(upairs))
        for j, pr in enumerate(upairs.tolist()):
            lk, lat = sim._route(pr // sim.P, pr % sim.P)
            links.append(lk)
            lats[j] = lat
            rates[j] = float(cap[lk].min())
        self.route_links = links                       # per route id
        self.lat = np.zeros(N)
        self.lat[msg] = lats[inv]
        self.route = np.full(N, -1, np.int64)
        self.route[msg] = inv
        nb = self.nbytes[msg]
        wire = nb.copy()
        if fr.message_overhead:
            wire = nb + -(-nb // fr.message_payload) * fr.message_overhead
        self.wire = np.zeros(N, np.int64)
        self.wire[msg] = wire
        self.dur = np.zeros(N)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.dur[msg] = np.where(wire > 0, wire / rates[inv], 0.0)
        self.rate = np.zeros(N)
        self.rate[msg] = rates[inv]
        self.mcap = np.full(N, math.inf)    # a stream's pacing cap (event mode)
        self.goodput = np.ones(N)            # payload / wire bytes of a flow (event mode)
        w = wire > 0
        self.goodput[msg[w]] = nb[w] / wire[w]
        # multicast: per MCAST its stream's datagrams, pacing and tree
        mc = self.mcasts
        nroute = len(links)
        mtu = sim._ecfg.mtu_nbytes
        pace = sim._ecfg.pacing_gbps
        self.t_eos = np.zeros(N)          # offsets from the stream's first not_before
        self.t_next = np.zeros(N)
        self.recv_lat: dict[int, np.ndarray] = {}
        self.dgram_sizes: dict[int, np.ndarray] = {}     # per MCAST: its datagrams' payloads
        self.ndatagrams = 0
        for m in mc.tolist():
            q = int(self.q[m])
            nbm = int(self.nbytes[m])
            sizes, self.t_eos[m], self.t_next[m], w, c = stream_shape(
                nbm, self.g.reqs[q][1], mtu, pace, fr)
            self.dgram_sizes[m] = np.array(sizes, dtype=np.int64)
            self.ndatagrams += len(sizes) + 1                # + EOS
            ep = int(self.ep[m])
            tl = sim._tree(ep)
            if nbm:
                r = min(float(cap[tl].min()), c)
                self.mcap[m] = c
                self.goodput[m] = nbm / w
                self.wire[m] = w
                self.rate[m] = r
                self.dur[m] = w / r
            links.append(tl)
            self.route[m] = nroute
            nroute += 1
        self.paced = bool(pace)
        # per MRECV: the latency from its root
        mr = self.mrecvs
        if len(mr):
            roots = self.ep[self.mrecv_mcast[mr]]
            me = self.ep[mr]
            o = np.argsort(roots, kind="stable")
            ur, first = np.unique(roots[o], return_index=True)
            bounds = np.r_[first, len(o)]
            row = np.full(int(max(self.ep.max(), 0)) + 1, np.nan)
            lat = np.empty(len(mr))
            for j, root in enumerate(ur.tolist()):
                row.fill(np.nan)
                for x, eps in sim._groups(root):
                    row[eps] = x
                seg = o[bounds[j]:bounds[j + 1]]
                lat[seg] = row[me[seg]]
            self.lat[mr] = lat

    # -- edges ------------------------------------------------------------------------
    def _edges_static(self) -> None:
        """The edges no channel order changes, made once for every walk: dependencies
        (a step's own, and a FIN's on its member's MRECVs) by destination; each RECV's SEND
        and each MRECV's MCAST (its one arrival); and all of them by source (successors).
        The channels' and pacers' edges are one pointer per node, made per order
        (:meth:`_chain`)."""
        g, N, ns = self.g, self.N, self.g.nsteps
        ix = np.int32 if N < 2**31 - 1 else np.int64     # node numbers: half the memory
        self.ix = ix
        mr, r = self.mrecvs, self.recvs
        dep_src, dep_cnt = [g.dep_flat], [g.dep_counts]
        fin = np.zeros(0, np.int64)
        if self.fin_of and len(mr):                      # FIN waits for its member's MRECVs
            fin = np.array([self.fin_of[int(qq)] for qq in self.q[mr].tolist()],
                           dtype=np.int64) + self.local[mr]
            dep_src.append(mr[np.argsort(fin, kind="stable")])
        dep_cnt.append(np.bincount(fin - ns, minlength=N - ns) if len(fin)
                       else np.zeros(N - ns, np.int64))
        self.dep_src = np.concatenate(dep_src).astype(ix)
        cnt = np.concatenate(dep_cnt)
        self.dep_ptr = np.zeros(N + 1, np.int64)
        np.cumsum(cnt, out=self.dep_ptr[1:])
        # the arrival a RECV (its SEND's arrive) or an MRECV (its MCAST's drain) waits for
        self.arr_src = np.full(N, -1, ix)
        self.arr_src[r] = self.recv_send[r]
        self.arr_src[mr] = self.mrecv_mcast[mr]
        self.indeg0 = cnt + (self.arr_src >= 0)
        src = np.concatenate([g.dep_flat, mr, self.recv_send[r], self.mrecv_mcast[mr]])
        dst = np.concatenate([np.repeat(np.arange(ns, dtype=ix), g.dep_counts),
                              fin.astype(ix), r.astype(ix), mr.astype(ix)])
        self.succ = dst[np.argsort(src, kind="stable")]
        self.succ_ptr = np.zeros(N + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=N), out=self.succ_ptr[1:])
        self._bufs = None

    def drop_walk_edges(self) -> None:
        """Free what only the walk reads (before the events mode)."""
        for name in ("dep_src", "dep_ptr", "arr_src", "indeg0", "succ", "succ_ptr"):
            setattr(self, name, None)

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
        r_of_c = route[ci]
        lens = np.array([len(self.route_links[r]) for r in r_of_c.tolist()], np.int64)
        if not lens.sum():
            return
        lk = np.concatenate([self.route_links[r] for r in r_of_c.tolist()])
        cnt = np.bincount(lk, minlength=len(cap))
        shared = cnt > 1
        if not shared.any():
            return
        # flows on shared links: (link, time, +-rate) events
        ur = np.unique(route)
        rl_sh = {r: self.route_links[r][shared[self.route_links[r]]] for r in ur.tolist()}
        per = np.array([len(rl_sh[r]) for r in route.tolist()], np.int64)
        sel = per > 0
        if not sel.any():
            return
        f2, per = flows[sel], per[sel]
        links = np.concatenate([rl_sh[r] for r in self.route[f2].tolist()])
        fr = np.repeat(f2, per)
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
        for r, w in enumerate(per_route.tolist()):
            if w:
                lk = self.route_links[r]
                np.add.at(lb, lk[lk < nlinks], w)
        sim.net.flows_started += len(flows)
        sim.datagrams += self.ndatagrams
        # completion per (request, member)
        tmax = 0.0
        key = self.q * (1 << 32) + self.local
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


def _unique(x: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` for ``0 <= x < bound``; without a sort when
    ``bound`` is no bigger than a few times ``len(x)``."""
    if bound > 4 * len(x):
        return np.unique(x, return_inverse=True)
    seen = np.zeros(bound, bool)
    seen[x] = True
    ids = np.cumsum(seen) - 1
    return np.flatnonzero(seen), ids[x]
