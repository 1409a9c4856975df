"""The fast path's graph and plan (:mod:`polycast.sim.fast`): every posted step as arrays
(:class:`_Graph`), and for one simulation the FIN nodes, the matches (RECV -> SEND,
MRECV -> MCAST), the routes, flow durations and multicast streams, and the edges no
channel order changes (:class:`_Plan`). The walk over them, its checks and the results
are :mod:`.fast_walk`'s (:class:`_Plan`'s mixin :class:`~.fast_walk.Walk`)."""

from __future__ import annotations

import math
import numpy as np

from .fast_checks import stream_shape
from .fast_kinds import FIN, MCAST, MRECV, RECV, SEND, Refused
from .fast_walk import Walk


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


class _Plan(Walk):
    """Routes, flow durations and the graph's edges for one simulation."""

    def __init__(self, sim, g: _Graph) -> None:
        self.sim, self.g = sim, g
        topo = sim.topo
        self.fr = topo.framing
        ns = g.nsteps
        kind = g.kind
        # FIN nodes: one per (request, member) of a request that multicasts.
        fin_q, fin_local, fin_ep, fin_rank, fin_post = [], [], [], [], []
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
        self.N = ns + nf
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
        links, lats = _routes(sim, upairs // sim.P, upairs % sim.P)
        rates = np.minimum.reduceat(cap[links.flat], links.ptr[:-1]) if len(upairs) \
            else np.zeros(0)
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


class _Routes:
    """The links of every route id: the unicast routes as one flat array with offsets
    (``links[r]`` is a view), then the multicast trees, appended one by one."""

    def __init__(self, ptr: np.ndarray, flat: np.ndarray) -> None:
        self.ptr, self.flat = ptr, flat
        self.ptr_list = ptr.tolist()            # the offsets as ints (the event loop's)
        self.nunicast = len(ptr) - 1            # route ids from here on are trees
        self.trees: list[np.ndarray] = []

    def __len__(self) -> int:
        return self.nunicast + len(self.trees)

    def __getitem__(self, r: int) -> np.ndarray:
        if r < self.nunicast:
            return self.flat[self.ptr_list[r]:self.ptr_list[r + 1]]
        return self.trees[r - self.nunicast]

    def append(self, links: np.ndarray) -> None:
        self.trees.append(links)

    def gather(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The links of routes ``r`` one after another (each route's in its order), and
        how many each route has."""
        r = np.asarray(r, dtype=np.int64)
        uni = r < self.nunicast
        lens = np.empty(len(r), np.int64)
        ru = r[uni]
        lens[uni] = self.ptr[ru + 1] - self.ptr[ru]
        rt = r[~uni].tolist()
        lens[~uni] = [len(self.trees[x - self.nunicast]) for x in rt]
        out = np.empty(int(lens.sum()), np.int64)
        first = np.cumsum(lens) - lens
        lu = lens[uni]
        k = np.arange(int(lu.sum())) - np.repeat(np.cumsum(lu) - lu, lu)
        out[np.repeat(first[uni], lu) + k] = self.flat[np.repeat(self.ptr[ru], lu) + k]
        for x, at in zip(rt, first[~uni].tolist()):
            tree = self.trees[x - self.nunicast]
            out[at:at + len(tree)] = tree
        return out, lens


def _routes(sim, src: np.ndarray, dst: np.ndarray) -> tuple[_Routes, np.ndarray]:
    """:meth:`~polycast.sim.driver.Simulation._route` of many (src, dst) rank pairs at once:
    the topology's routes (:meth:`~polycast.sim.topology.Topology.routes`) between the
    ranks' nodes, then the hosts' send and receive ports and software latency with the
    host model."""
    node = np.asarray(sim._node, dtype=np.int64)
    ptr, flat, lat = sim.topo.routes(node[src], node[dst])
    if sim.net.host_bw is None and not sim.cfg.host_latency_s:
        return _Routes(ptr, flat), lat
    if sim.net.host_bw is not None:                 # [route..., send port, receive port]
        lens = np.diff(ptr)
        out = np.empty(len(flat) + 2 * len(src), np.int64)
        ptr2 = ptr + 2 * np.arange(len(ptr))
        at = np.repeat(ptr2[:-1] - ptr[:-1], lens) + np.arange(len(flat))
        out[at] = flat
        out[ptr2[1:] - 2] = sim.net.send_port(src)
        out[ptr2[1:] - 1] = sim.net.recv_port(dst)
        ptr, flat = ptr2, out
    return _Routes(ptr, flat), lat + sim.cfg.host_latency_s


def _unique(x: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` for ``0 <= x < bound``; without a sort when
    ``bound`` is no bigger than a few times ``len(x)``."""
    if bound > 4 * len(x):
        return np.unique(x, return_inverse=True)
    seen = np.zeros(bound, bool)
    seen[x] = True
    ids = np.cumsum(seen) - 1
    return np.flatnonzero(seen), ids[x]
