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
  the walk's own quantisation (:func:`polycast.sim.fast._quantize`, which needs the
  largest time). A channel that really reorders refuses the mode.
* **No binding contention.** Routes are fixed per (source, destination), and a ring uses
  P channels; links that more than one channel crosses are found from the routes alone,
  and only the flows of channels through such links are kept, then checked with the
  walk's sweep (:func:`polycast.sim.fast.links_fit`). On a fat tree a ring shares none.

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
    from .fast import _quantize
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
    """A token-ring multicast allgather, the walk's graph taken rank by rank: each rank's
    multicast waits for its token (from r-1: rank order is a topological order), and every
    receiver's MRECVs reduce to the latest stream arriving there, taken root by root
    (P-wide), so the P^2 MRECVs are never held. Contention: the solo rates of all streams
    in flight at once must fit the narrowest link of any tree (a bound on every link)."""
    from .fast import links_fit, stream_shape
    from .fast_kinds import SILENT_RTO
    _, itemsize, comm = sim._reqs[0]
    if comm:
        raise Refused("the stream mode times a multicast on the world communicator only")
    P = form.nranks
    post = _post_times(sim, comm, P)
    group = np.arange(P, dtype=np.int64)
    ecfg = sim._ecfg
    fr = sim.topo.framing
    cap = sim.net.capacity
    nlinks = sim.net.nlinks
    lb = np.zeros_like(sim.net.link_bytes)        # added to the network's once accepted
    pace = ecfg.pacing_gbps
    paced = bool(pace)
    node = np.asarray(sim._node, dtype=np.int64)
    host_lat = sim.cfg.host_latency_s
    firsts = form.firsts
    nbm = int(form.mcast_nelems) * itemsize
    sizes, t_eos, t_next, w, c = stream_shape(nbm, itemsize, ecfg.mtu_nbytes, pace, fr)
    # the token and the FIN go to r+1 without payload: no wire bytes, no duration
    lat_next = np.array([sim._route(r, (r + 1) % P)[1] for r in range(P)])
    # recovery timeout per member: every byte it multicasts or receives (as the walk's)
    rate_gbps = ecfg.pacing_gbps or ecfg.line_rate_gbps
    parts_b = form.parts.astype(np.int64) * itemsize
    tot_r = (nbm + (parts_b.sum() - parts_b)).astype(np.float64)
    rto = ecfg.recovery_timeout_s + 2 * tot_r * 8 / (rate_gbps * 1e9)
    tok_arr = _NEG                       # the token's arrival at the next rank
    tok_emit = np.full(P, _NEG)          # each token SEND's start (-inf: none)
    done_max = post.copy()               # per rank: its steps' latest done
    last_in = np.full(P, _NEG)           # per receiver: its latest stream arrival
    st_all, dr_all, rate_all = np.zeros(P), np.zeros(P), np.zeros(P)
    emit_max = float(np.max(np.abs(post)))
    min_cap = np.inf
    late = False
    flows = 0
    for r in range(P):
        pt = float(post[r])
        ready = max(pt, tok_arr) if not firsts[r] else pt   # the token RECV's done
        emit_max = max(emit_max, abs(ready))
        links = sim._tree(r)
        _, lat = sim.topo.mcast_tree(int(node[r]))
        dr = ready                                          # t0 = ready: no pacer before
        if nbm:
            kc = float(cap[links].min())
            min_cap = min(min_cap, kc)
            rate = min(kc, c)
            dr = ready + w / rate
            st_all[r], dr_all[r], rate_all[r] = ready, dr, rate
            np.add.at(lb, links[links < nlinks], float(w))
            flows += 1
        mdone = max(ready + t_next, ready) if paced else ready
        done_max[r] = max(done_max[r], mdone)
        arr = dr + (lat[node] + host_lat)                   # every receiver's arrival
        arr[r] = _NEG
        late = late or bool((np.maximum(post, arr) - post > SILENT_RTO * rto).any())
        np.maximum(last_in, arr, out=last_in)
        if not firsts[r + 1]:                               # the token to r+1
            emit_max = max(emit_max, abs(mdone))
            tok_emit[r] = mdone
            tok_arr = mdone + lat_next[r]
    if late:
        raise Refused("a stream arrives later than the engines' recovery timeout")
    if flows and np.isfinite(min_cap):
        on = rate_all > 0
        links_fit(np.zeros(int(on.sum()), np.int64), st_all[on], dr_all[on], rate_all[on],
                  np.array([min_cap]))
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
    comp = np.maximum(np.maximum(done_max, mrecv_done), fin_st)
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
    from .fast import links_fit
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
