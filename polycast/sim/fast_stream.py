"""The fast path's stream mode: a template schedule timed position by position, O(P) memory.

A ring allgather at 8,192 ranks is 134 million steps; the walk (:mod:`polycast.sim.fast`)
holds every one of them, and their graph, at once. But every rank runs the same program
up to a shift (:class:`~polycast.schedule.compact.Template`), and every input of a step
comes from an earlier program position: its dependencies (same rank), the previous
message on its channel (same rank), the message it receives (sent at an earlier position
of its peer). Program-position order is then a topological order of the walk's graph, so
the same longest-path times come out of one pass over the L positions, each a handful of
P-wide numpy operations, keeping only what a later position reads: every rank's post
time, completion so far, each channel's free time, the messages in flight, and the done
times of the positions still depended on.

The walk's two checks hold here too, computed as the pass goes:

* **Channel order.** The pass assumes a channel's messages leave in program order (the
  walk's first order). Each message's start must not be earlier than its channel's
  previous one; pairs that are earlier by round-off are kept and judged at the end with
  the walk's own quantisation (:func:`polycast.sim.fast_checks._quantize`, which needs the
  largest time). A channel that really reorders refuses the mode.
* **No binding contention.** Routes are fixed per (source, destination), and a ring uses
  P channels; links that more than one channel crosses are found from the routes alone,
  and only the flows of channels through such links are kept, then checked with the
  walk's sweep (:func:`polycast.sim.fast_checks.links_fit`). On a fat tree a ring shares none.

Every number is computed by the walk's own expressions in the same order (max of the
inputs, start + duration, drain + latency), so times are the walk's, bit for bit.
"""

from __future__ import annotations

import numpy as np

from .errors import SimulationError
from .fast_checks import commit, post_times
from .fast_kinds import COPY, RECV, SEND, Refused

_NEG = -np.inf


def form_of(sim):
    """The one posted request's :class:`Template` or :class:`TokenMulticast`, or None when
    the stream mode does not cover the run (several requests, a schedule without such a
    form, the NIC model)."""
    if len(sim._reqs) != 1 or sim.cfg.nic is not None or sim._innet:
        return None
    sched = sim._reqs[0][0]
    t = getattr(sched, "form", None)
    if t is None or "columns" in vars(sched):
        return None
    return t


def walk_fits(sim, why: str) -> None:
    """Before the walk builds a template's columns: raise TooLarge (naming ``why`` the
    stream mode refused) when they would not fit the memory limit."""
    from ..algorithms import estimate
    for sched, _, _ in sim._reqs:
        if getattr(sched, "form", None) is None or "columns" in vars(sched):
            continue
        estimate.check(sched.collective, sched.algorithm, sched.nranks,
                       sched.options.get("nchunks", 1), 1, compact=True, stream=False,
                       why=f"the fast path's stream mode refused ({why}) and ")


def run(sim, form) -> str:
    """Time ``sim``'s one request (``form``: a template, a token multicast or a host
    ring) and commit its results as the walk would; returns ``"stream"``. Raises Refused
    before changing anything."""
    from ..schedule.compact import HostRing, TokenMulticast
    if isinstance(form, TokenMulticast):
        return _run_token_multicast(sim, form)
    if isinstance(form, HostRing):
        from .fast_host_ring import run_host_ring
        return run_host_ring(sim, form)
    return _run_template(sim, form)


def _order_holds(late_pairs: list, emit_max: float) -> bool:
    """Whether message pairs a channel sends in program order but whose starts came out
    earlier-then-later only by round-off pass the walk's own test (its quantisation of
    times, scaled by the largest start time ``emit_max``)."""
    from .fast_checks import _quantize
    if not late_pairs:
        return True
    lp = np.concatenate(late_pairs, axis=1)
    n = lp.shape[1]
    q = _quantize(np.r_[lp[0], lp[1], emit_max])
    return bool((q[n:2 * n] >= q[:n]).all())


def _shared_drains(st: np.ndarray, work: float, kc: np.ndarray) -> np.ndarray:
    """Drain times of flows of ``work`` wire bytes each that start at ``st`` (H, m) and,
    row by row, share one link of capacity ``kc`` (H,) evenly, the only narrowing of
    their paths: n in flight move at kc/n each (max-min's answer). Equal work: they
    finish in start order. One pass over the rows' events at once."""
    H, m = st.shape
    order = np.argsort(st, axis=1, kind="stable")
    s = np.take_along_axis(st, order, 1)
    left = np.full((H, m), float(work))
    drain = np.full((H, m), np.nan)
    rows = np.arange(H)
    col = np.arange(m)[None, :]
    t = s[:, 0].copy()
    a = np.zeros(H, np.int64)             # flows [d, a) are in flight, [0, d) drained
    d = np.zeros(H, np.int64)
    tiny = float(work) * 1e-12
    for _ in range(2 * m + 1):
        n = a - d
        if not (n > 0).any() and (a >= m).all():
            break
        ta = np.where(a < m, s[rows, np.minimum(a, m - 1)], np.inf)
        rate = kc / np.maximum(n, 1)
        tc = np.where(n > 0, t + left[rows, np.minimum(d, m - 1)] / rate, np.inf)
        ev = np.minimum(ta, tc)
        ev = np.where(np.isfinite(ev), ev, t)
        fly = (col >= d[:, None]) & (col < a[:, None])
        left = np.where(fly, left - ((ev - t) * rate)[:, None], left)
        t = ev
        done = fly & (tc <= ta)[:, None] & (left <= tiny)
        drain = np.where(done, t[:, None], drain)
        d = d + done.sum(axis=1)
        a = a + ((ta < tc) | ((ta == tc) & np.isfinite(ta)))
    out = np.empty_like(drain)
    np.put_along_axis(out, order, drain, 1)
    return out


def _gather_to_leaders(sim, form, post, itemsize, lb):
    """hmcast's first phase: every local's shard to its leader, all at once. Per host the
    R - 1 flows must share one link that is the narrowest of all their paths (the
    leader's port) and no link with another host's; then they drain as
    :func:`_shared_drains` says. Returns (per leader: its last shard's RECV done, per
    rank: its SEND's done (-inf for leaders), the latest drain, flows, wire bytes)."""
    P, R = form.nranks, form.ranks_per_host
    H = P // R
    fr = sim.topo.framing
    cap = sim.net.capacity
    nb = int(form.gather_nelems) * itemsize
    wire = fr.message_wire(nb) if nb else 0
    srcs = np.flatnonzero(np.arange(P) % R)
    lat = np.empty(len(srcs))
    routes = []
    for i, r in enumerate(srcs.tolist()):
        lk, lat[i] = sim._route(r, r - r % R)
        routes.append(lk)
    st = post[srcs].reshape(H, R - 1)               # a SEND is ready at its post
    if wire:
        lens = np.array([len(x) for x in routes], np.int64)
        lk = np.concatenate(routes)
        host = np.repeat(srcs // R, lens)
        pair = np.unique(host * len(cap) + lk)      # (host, link), once per host
        if len(np.unique(pair % len(cap))) != len(pair):
            raise Refused("two hosts' gathers cross one link")
        kc = np.full(H, np.inf)
        np.minimum.at(kc, host, cap[lk])
        narrow = cap[lk] == kc[host]
        key, use = np.unique(host[narrow] * len(cap) + lk[narrow], return_counts=True)
        common = np.zeros(H, bool)
        common[key[use == R - 1] // len(cap)] = True
        if not common.all():
            raise Refused("a host's gather flows do not share their narrowest link")
        drain = _shared_drains(st, wire, kc)
        for r_lk in routes:
            np.add.at(lb, r_lk[r_lk < sim.net.nlinks], float(wire))
    else:
        drain = st.copy()
    arrive = drain.ravel() + lat
    got = np.maximum(post[srcs - srcs % R], arrive).reshape(H, R - 1).max(axis=1)
    send_done = np.full(P, _NEG)
    send_done[srcs] = drain.ravel()
    return got, send_done, float(drain.max()), (len(srcs) if wire else 0), nb


def _run_token_multicast(sim, form) -> str:
    """A token-ring multicast allgather (over hosts' leaders when R > 1). Each root's
    multicast waits for its token from the root before it (root order is a topological
    order) and, over hosts, for its locals' shards (:func:`_gather_to_leaders`, all
    drained before the first stream starts, else refused), and passes the token on when
    its pacer is done, so the start of every stream follows from a scalar pass over the
    roots, whatever the network does. The streams' flows then drain in start order:
    alone at the solo rate (the walk's numbers exactly); where n streams overlap, each at
    min(pacing cap, C/n) -- max-min's answer when all of them cross one link of the
    narrowest capacity C of any of their links (checked as each stream starts; else
    refused), since then that link shares C n ways and no link has more of them. Every
    receiver's MRECVs reduce to the latest stream arriving there, taken root by root
    (P-wide), so the P x H MRECVs are never held, nor a tree once its stream is out."""
    from .fast_checks import stream_shape
    from .fast_kinds import SILENT_RTO
    _, itemsize, comm = sim._reqs[0]
    if comm:
        raise Refused("the stream mode times a multicast on the world communicator only")
    P, R = form.nranks, form.ranks_per_host
    H = P // R
    roots = np.arange(H, dtype=np.int64) * R
    post = post_times(sim, comm, P)
    group = np.arange(P, dtype=np.int64)
    ecfg = sim._ecfg
    topo = sim.topo
    cap = sim.net.capacity
    nlinks = sim.net.nlinks
    lb = np.zeros_like(sim.net.link_bytes)        # added to the network's once accepted
    pace = ecfg.pacing_gbps
    node = np.asarray(sim._node, dtype=np.int64)
    host_lat = sim.cfg.host_latency_s
    firsts = form.firsts
    nbm = int(form.mcast_nelems) * itemsize
    sizes, _, t_next, w, c = stream_shape(nbm, itemsize, ecfg.mtu_nbytes, pace, topo.framing)
    # 0. over hosts: the locals' shards to their leaders
    got, send_done, g_drain, g_flows, g_nb = np.full(H, _NEG), np.full(P, _NEG), _NEG, 0, 0
    if R > 1:
        got, send_done, g_drain, g_flows, g_nb = _gather_to_leaders(sim, form, post,
                                                                    itemsize, lb)
    # the token and the FIN go without payload: no wire bytes, no duration
    lat_next = np.array([sim._route(int(x), int(roots[(i + 1) % H]))[1]
                         for i, x in enumerate(roots.tolist())])
    lat_fin = lat_next if R == 1 else np.array([sim._route(r, (r + 1) % P)[1]
                                                for r in range(P)])
    # recovery timeout per member: every byte it multicasts or receives (as the walk's)
    rate_gbps = ecfg.pacing_gbps or ecfg.line_rate_gbps
    parts_b = form.parts.astype(np.int64) * itemsize
    own = np.zeros(P, np.int64)
    own[roots] = parts_b
    tot_r = (np.where(group % R == 0, nbm, 0) + parts_b.sum() - own).astype(np.float64)
    rto = ecfg.recovery_timeout_s + 2 * tot_r * 8 / (rate_gbps * 1e9)
    # 1. the token chain: every stream's start (t0) and its multicast step's done
    t0 = np.empty(H)
    tok_emit = np.full(H, _NEG)          # each token SEND's start (-inf: none)
    tok_arr = _NEG
    post_l = post[roots].tolist()
    got_l = got.tolist()
    for i in range(H):
        ready = max(post_l[i], got_l[i])
        if not firsts[i]:
            ready = max(ready, tok_arr)                     # the token RECV's done
        t0[i] = ready
        if not firsts[i + 1]:
            mdone = max(ready + t_next, ready) if pace else ready
            tok_emit[i] = mdone
            tok_arr = mdone + lat_next[i]
    mdone = np.maximum(t0 + t_next, t0) if pace else t0.copy()
    emit_max = float(max(np.max(np.abs(post)), np.max(np.abs(t0)), np.max(np.abs(mdone))))
    if nbm and g_drain > t0.min():
        raise Refused("a stream starts while a host still gathers its shards")
    # 2. the streams' flows in start order
    last_in = np.full(P, _NEG)           # per receiver: its latest stream arrival
    flows = g_flows
    lat_of: dict[int, np.ndarray] = {}
    active: list[list] = []              # [root, bytes left, solo rate, narrowest, links]
    on_narrow = np.zeros(len(cap), np.int64)   # active streams per narrowest link
    now = _NEG
    ident = bool((node == group).all())

    def arrived(root: int, dr: float) -> None:
        lat = lat_of.pop(root)
        lat = lat if ident else lat[node]
        arr = dr + (lat + host_lat) if host_lat else dr + lat
        arr[root] = _NEG
        np.maximum(last_in, arr, out=last_in)

    def advance(until: float) -> None:
        """Drain the flows in flight up to ``until``: alone at its solo rate, n of them
        at min(c, C/n) each."""
        nonlocal now
        while active:
            n = len(active)
            rate = active[0][2] if n == 1 else min(c, active[0][3] / n)
            left = min(a[1] for a in active)
            t_end = now + left / rate
            if t_end > until:
                for a in active:
                    a[1] -= rate * (until - now)
                now = until
                return
            # the flows that had the least left end now: zeroed, not subtracted (a residue of
            # rounding, drained in a time below now's float resolution, never ended: a hang)
            for a in active:
                a[1] = 0.0 if a[1] <= left else a[1] - rate * (t_end - now)
            now = t_end
            for a in [a for a in active if a[1] <= w * 1e-12]:
                active.remove(a)
                on_narrow[a[4]] -= 1                 # (a tree crosses a link once)
                arrived(a[0], t_end)

    for i in np.argsort(t0, kind="stable").tolist():
        r = int(roots[i])
        cached = int(node[r]) in topo._trees
        links = sim._tree(r)
        _, lat_of[r] = topo.mcast_tree(int(node[r]))
        if not cached:                   # held only while its stream is in flight
            topo._trees.pop(int(node[r]), None)
            sim._host_links.pop((r, -1), None)
        start = float(t0[i])
        if not nbm:                                   # nothing to drain: arrives at t0
            arrived(r, start)
            continue
        lb[links if sim.net.host_bw is None else links[links < nlinks]] += float(w)
        flows += 1
        cap_l = cap[links]
        kc = float(cap_l.min())
        narrow = links[cap_l == kc]
        advance(start)
        now = start
        active.append([r, float(w), min(kc, c), kc, narrow])
        on_narrow[narrow] += 1
        n = len(active)
        if n > 1 and not (all(a[3] == kc for a in active)
                          and bool((on_narrow[narrow] == n).any())):
            raise Refused("multicast streams overlap without a narrowest link that all of "
                          "them cross (max-min would not share evenly)")
    advance(np.inf)
    # (the latest arrival decides: an MRECV starts at its post)
    if (np.maximum(post, last_in) - post > SILENT_RTO * rto).any():
        raise Refused("a stream arrives later than the engines' recovery timeout")
    # FIN to r+1 after every stream arrived (after the token on the same channel: R = 1)
    mrecv_done = np.maximum(post, last_in)
    fin_ready = np.maximum(post, mrecv_done)
    emit_max = max(emit_max, float(np.max(np.abs(fin_ready))))
    fin_st = fin_ready
    if R == 1:
        has_tok = np.isfinite(tok_emit)
        bad = has_tok & (fin_ready < tok_emit)
        if bad.any() and not _order_holds([np.stack([tok_emit[bad], fin_ready[bad]])],
                                          emit_max):
            raise Refused("a FIN would leave before its channel's token")
        fin_st = np.maximum(fin_ready, tok_emit)   # after the token (it drains at once)
    fin_arrive = fin_st + lat_fin
    comp = np.maximum(np.maximum(post, mrecv_done), np.maximum(fin_st, send_done))
    comp[roots] = np.maximum(comp[roots], mdone)
    comp = np.maximum(comp, np.roll(fin_arrive, 1))
    sim.net.link_bytes += lb
    sim.net.flows_started += flows
    ndg = H * (len(sizes) + 1)
    sim.datagrams += ndg
    ntok = int((~firsts[1:]).sum())
    commit(sim, group, post, comp, form.nsteps + P, P,
            {"messages_out": ntok + P + (P - H), "message_bytes_out": (P - H) * g_nb,
             "datagrams_out": ndg})
    return "stream"


def _run_template(sim, t) -> str:
    """A template, position by position (see the module's docstring)."""
    from .fast_checks import links_fit
    sched, itemsize, comm = sim._reqs[0]
    P = t.nranks
    L = t.length
    kind, delta, tag = t.kind.astype(np.int64), t.delta, t.tag
    if not np.isin(kind, (SEND, RECV, COPY)).all():
        raise Refused("the stream mode times unicast templates only")
    if L > sim.cfg.max_events:
        # the bound is on Python-level work: here one P-wide batch per program position
        raise SimulationError(f"more than {sim.cfg.max_events} events (program positions "
                              "of a template); raise SimConfig.max_events for a bigger run")
    group = np.asarray(sim._comm_group[comm], dtype=np.int64)
    post = post_times(sim, comm, P)
    fr = sim.topo.framing
    cap = sim.net.capacity
    r = np.arange(P, dtype=np.int64)
    # channels: one per (rank, offset) that sends; their routes, rates, latencies
    send_pos = np.flatnonzero(kind == SEND)
    offs = np.unique(delta[send_pos]).tolist()
    chan = {}
    route_links = []
    for d in offs:
        peer = (r + d) % P
        lat = np.empty(P)
        rate = np.empty(P)
        first = len(route_links)
        for i, (a, b) in enumerate(zip(group.tolist(), group[peer].tolist())):
            lk, la = sim._route(a, b)
            route_links.append(lk)
            lat[i] = la
            rate[i] = float(cap[lk].min())
        chan[d] = {"lat": lat, "rate": rate, "free": np.full(P, _NEG),
                   "emit": np.full(P, _NEG), "wire": np.zeros(P, np.int64),
                   "flows": np.zeros(P, np.int64), "first": first}
    # links more than one channel crosses (every channel counted: a superset of the walk's
    # channels that carry a flow, narrowed at the end)
    nlk = len(cap)
    lens = np.array([len(x) for x in route_links], np.int64)
    all_lk = np.concatenate(route_links) if route_links else np.zeros(0, np.int64)
    use = np.bincount(all_lk, minlength=nlk)
    shared = use > 1
    ch_of_lk = np.repeat(np.arange(len(route_links)), lens)
    watch_ch = np.unique(ch_of_lk[shared[all_lk]])
    watched = {}                                      # offset -> local ranks watched
    for d in offs:
        f = chan[d]["first"]
        w = watch_ch[(watch_ch >= f) & (watch_ch < f + P)] - f
        if len(w):
            watched[d] = w
    kept = []                                         # (channel ids, start, drain) per flow set
    # positions still read later: done times kept until their last reader
    ptr = t.dep_ptr
    last_read = t.last_read()
    done_of: dict[int, np.ndarray] = {}
    drop_at: dict[int, list] = {}
    for p_, j_ in enumerate(last_read.tolist()):
        if j_ >= 0:
            drop_at.setdefault(j_, []).append(p_)
    inflight: dict[tuple[int, int], list] = {}        # (offset, tag) -> arrive vectors
    comp = np.full(P, _NEG)
    emit_max = 0.0
    late_pairs = []                                   # (earlier, later) emits out of order
    messages = 0
    message_bytes = 0
    nsteps = P * L
    for j in range(L):
        k = int(kind[j])
        ready = post
        for p_ in t.dep_flat[ptr[j]:ptr[j + 1]].tolist():
            ready = np.maximum(ready, done_of[p_])
        m = float(np.max(np.abs(ready)))
        if m > emit_max:
            emit_max = m
        if k == COPY:
            dn = ready
        elif k == SEND:
            d = int(delta[j])
            c = chan[d]
            nb = t.nelems_at(j) * itemsize
            wire = nb
            if fr.message_overhead:
                wire = nb + -(-nb // fr.message_payload) * fr.message_overhead
            bad = ready < c["emit"]
            if bad.any():
                late_pairs.append(np.stack([c["emit"][bad], ready[bad]]))
            c["emit"] = ready
            with np.errstate(divide="ignore", invalid="ignore"):
                dur = np.where(wire > 0, wire / c["rate"], 0.0)
            st = np.maximum(ready, c["free"])
            dr = st + dur
            c["free"] = dr
            dn = dr
            inflight.setdefault((d, int(tag[j])), []).append((dr + c["lat"], nb))
            c["wire"] += wire
            c["flows"] += wire > 0
            messages += P
            message_bytes += int(nb.sum())
            w = watched.get(d)
            if w is not None:
                on = w[wire[w] > 0]
                if len(on):
                    kept.append((on + c["first"], st[on], dr[on], c["rate"][on]))
        else:                                          # RECV: its sender is r + delta
            d = int(delta[j])
            q = inflight.get(((P - d) % P, int(tag[j])))
            if not q:
                raise Refused("a RECV whose SEND comes later in the program (the stream "
                              "mode needs senders first)")
            arr, nb = q.pop(0)
            if not q:
                del inflight[((P - d) % P, int(tag[j]))]
            src = (r + d) % P
            if not np.array_equal(nb[src], t.nelems_at(j) * itemsize):
                raise Refused("a RECV expects another size than its SEND carries")
            dn = np.maximum(ready, arr[src])
        if last_read[j] >= 0:
            done_of[j] = dn
        for p_ in drop_at.pop(j, ()):
            del done_of[p_]
        comp = np.maximum(comp, dn)
    if inflight:
        raise Refused("a message without its match")
    # channel order: pairs earlier by round-off only (the walk's quantisation)
    if not _order_holds(late_pairs, emit_max):
        raise Refused("a channel's messages start out of program order")
    # contention on links more than one flow-carrying channel crosses
    if kept:
        has_flow = np.concatenate([chan[d]["flows"] > 0 for d in offs])
        use = np.bincount(all_lk[has_flow[ch_of_lk]], minlength=nlk)
        shared = use > 1
        ch = np.concatenate([x[0] for x in kept])
        st = np.concatenate([x[1] for x in kept])
        dr = np.concatenate([x[2] for x in kept])
        rate = np.concatenate([x[3] for x in kept])
        rl = [route_links[c][shared[route_links[c]]] for c in range(len(route_links))]
        per = np.array([len(rl[c]) for c in ch.tolist()], np.int64)
        if per.sum():
            links = np.concatenate([rl[c] for c in ch.tolist()])
            links_fit(links, np.repeat(st, per), np.repeat(dr, per), np.repeat(rate, per),
                      cap)
    # commit, as the walk's commit does
    lb = sim.net.link_bytes
    nlinks = sim.net.nlinks
    flows = 0
    for d in offs:
        c = chan[d]
        for i, w in enumerate(c["wire"].tolist()):
            if w:
                lk = route_links[c["first"] + i]
                np.add.at(lb, lk[lk < nlinks], float(w))
        flows += int(c["flows"].sum())
    sim.net.flows_started += flows
    commit(sim, group, post, comp, nsteps, L,
            {"messages_out": messages, "message_bytes_out": message_bytes,
             "datagrams_out": 0})
    return "stream"
