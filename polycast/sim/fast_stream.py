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
    """Time ``sim``'s one request (``form``: a template or a token multicast) and commit
    its results as the walk would; returns ``"stream"``. Raises Refused before changing
    anything."""
    from ..schedule.compact import TokenMulticast
    if isinstance(form, TokenMulticast):
        return _run_token_multicast(sim, form)
    return _run_template(sim, form)


def _post_times(sim, comm: int, P: int) -> np.ndarray:
    eps = sim._comm_eps[comm]
    local_of = {e: i for i, e in enumerate(eps)}
    post = np.full(P, np.nan)
    for ev in sim._heap:                                # (t, seq, _POST, endpoint, req, _)
        post[local_of[ev[3]]] = ev[0]
    return post


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


def _commit(sim, group, post, comp, events: int, levels: int, stats: dict) -> None:
    """Results into ``sim`` as the walk's commit leaves them (link bytes already added)."""
    comp = np.maximum(comp, post)
    for i, g in enumerate(group.tolist()):
        tl = sim.timelines[g]
        tl.posted[0] = float(post[i])
        tl.completed[0] = float(comp[i])
    sim._pending = 0
    sim._heap.clear()
    sim.now = float(comp.max())
    sim.events = events
    sim.fast_levels = levels
    sim._fast_stats = {"completed": len(group), "failed": 0, "recovered_bytes": 0, **stats}


def _run_token_multicast(sim, form) -> str:
    """A token-ring multicast allgather. Each rank's multicast waits for its token from
    r-1 (rank order is a topological order) and passes it on when its pacer is done, so
    the start of every stream follows from a scalar pass over the ranks, whatever the
    network does. The streams' flows then drain in start order: alone at the solo rate
    (the walk's numbers exactly); where streams of several token sequences overlap, each
    at min(pacing cap, C/n) -- max-min's answer when every tree crosses, into every rank
    but its root, a last link of the narrowest capacity C of any tree (checked per tree;
    else refused), since then n concurrent flows share such a link and no link has more
    of them. Every receiver's MRECVs reduce to the latest stream arriving there, taken
    root by root (P-wide), so the P^2 MRECVs are never held."""
    from .fast_checks import stream_shape
    from .fast_kinds import SILENT_RTO
    _, itemsize, comm = sim._reqs[0]
    if comm:
        raise Refused("the stream mode times a multicast on the world communicator only")
    P = form.nranks
    post = _post_times(sim, comm, P)
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
    # the token and the FIN go to r+1 without payload: no wire bytes, no duration
    lat_next = np.array([sim._route(r, (r + 1) % P)[1] for r in range(P)])
    # recovery timeout per member: every byte it multicasts or receives (as the walk's)
    rate_gbps = ecfg.pacing_gbps or ecfg.line_rate_gbps
    parts_b = form.parts.astype(np.int64) * itemsize
    tot_r = (nbm + (parts_b.sum() - parts_b)).astype(np.float64)
    rto = ecfg.recovery_timeout_s + 2 * tot_r * 8 / (rate_gbps * 1e9)
    # 1. the token chain: every stream's start (t0) and its multicast step's done
    t0 = np.empty(P)
    tok_emit = np.full(P, _NEG)          # each token SEND's start (-inf: none)
    tok_arr = _NEG
    post_l = post.tolist()
    for r in range(P):
        pt = post_l[r]
        ready = max(pt, tok_arr) if not firsts[r] else pt   # the token RECV's done
        t0[r] = ready
        if not firsts[r + 1]:
            mdone = max(ready + t_next, ready) if pace else ready
            tok_emit[r] = mdone
            tok_arr = mdone + lat_next[r]
    mdone = np.maximum(t0 + t_next, t0) if pace else t0.copy()
    emit_max = float(max(np.max(np.abs(post)), np.max(np.abs(t0)), np.max(np.abs(mdone))))
    # 2. the streams' flows in start order
    last_in = np.full(P, _NEG)           # per receiver: its latest stream arrival
    late = False
    flows = 0
    lat_of: dict[int, np.ndarray] = {}
    active: list[list] = []              # [root, bytes left, solo rate, narrow, evenly]
    now = _NEG
    link_dst = np.asarray(topo.link_dst)

    def arrived(root: int, dr: float) -> None:
        nonlocal late
        arr = dr + (lat_of.pop(root)[node] + host_lat)
        arr[root] = _NEG
        late = late or bool((np.maximum(post, arr) - post > SILENT_RTO * rto).any())
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
            for a in active:
                a[1] -= rate * (t_end - now)
            now = t_end
            for a in [a for a in active if a[1] <= w * 1e-12]:
                active.remove(a)
                arrived(a[0], t_end)

    for r in np.argsort(t0, kind="stable").tolist():
        links = sim._tree(r)
        _, lat_of[r] = topo.mcast_tree(int(node[r]))
        start = float(t0[r])
        if not nbm:                                   # nothing to drain: arrives at t0
            arrived(r, start)
            continue
        np.add.at(lb, links[links < nlinks], float(w))
        flows += 1
        kc = float(cap[links].min())
        net = links[links < nlinks]                   # (host ports: not judged here)
        last = net[link_dst[net] < P]                 # the links into the receivers
        evenly = len(net) == len(links) and len(last) == P - 1 and \
            bool((cap[last] == kc).all())
        advance(start)
        now = start
        active.append([r, float(w), min(kc, c), kc, evenly])
        if len(active) > 1 and not (len(active) < P and all(a[4] for a in active)
                                    and all(a[3] == kc for a in active)):
            raise Refused("multicast streams overlap on trees without a common narrowest "
                          "last link into every receiver (max-min would not share evenly)")
    advance(np.inf)
    if late:
        raise Refused("a stream arrives later than the engines' recovery timeout")
    # FIN to r+1 after every stream arrived (after the token on the same channel)
    mrecv_done = np.maximum(post, last_in)
    fin_ready = np.maximum(post, mrecv_done)
    emit_max = max(emit_max, float(np.max(np.abs(fin_ready))))
    has_tok = np.isfinite(tok_emit)
    bad = has_tok & (fin_ready < tok_emit)
    if bad.any() and not _order_holds([np.stack([tok_emit[bad], fin_ready[bad]])],
                                      emit_max):
        raise Refused("a FIN would leave before its channel's token")
    fin_st = np.maximum(fin_ready, tok_emit)       # after the token (it drains at once)
    fin_arrive = fin_st + lat_next
    comp = np.maximum(np.maximum(np.maximum(post, mdone), mrecv_done), fin_st)
    comp = np.maximum(comp, np.roll(fin_arrive, 1))
    sim.net.link_bytes += lb
    sim.net.flows_started += flows
    sim.datagrams += P * (len(sizes) + 1)
    ntok = int((~firsts[1:]).sum())
    _commit(sim, group, post, comp, form.nsteps + P, P,
            {"messages_out": ntok + P, "message_bytes_out": 0,
             "datagrams_out": P * (len(sizes) + 1)})
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
    post = _post_times(sim, comm, P)
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
    _commit(sim, group, post, comp, nsteps, L,
            {"messages_out": messages, "message_bytes_out": message_bytes,
             "datagrams_out": 0})
    return "stream"
