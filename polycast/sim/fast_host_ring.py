"""The stream mode for the hierarchical ring allgather over hosts (``hring``,
:class:`~polycast.schedule.compact.HostRing`): H hosts of R ranks, each rank with one port
into its host (the host model of :mod:`polycast.sim.topology`: an up and a down link per
rank), the leaders' ring on the network.

The run has two phases, and each is timed as the engines' max-min sharing would:

* **Start-up, inside each host.** The gather (local j passes shards j.. to j-1) and the
  first broadcast message of every hop (local j passes its own host's shards 0..j to j+1)
  run at once and share the ranks' ports: a few dozen flows per host, timed by a small
  exact event loop with max-min rates (:func:`_startup`). Hosts whose ranks post at the
  same times run it once between them.
* **The ring, and the broadcast of each block it brings.** The leaders' ring flows move at
  their solo rate (the network's narrowest link, checked: at most half the leader's port,
  and flows of several ring channels on one network link fit it, the walk's sweep). A
  block goes down the host's chain as it arrives: from the leader it shares the leader's
  port with the ring's next flow, which starts with it and outlasts it (checked per
  block), so it moves at what that flow leaves of the port; every later hop is alone on
  its ports. Every host at once, one ring step at a time (H-wide arrays).

What the model takes for granted is checked, else the run is refused (and goes to the walk
or the events mode): the hosts' internal routes are one port per rank, alike on every
host and crossed by nothing else; each port's start-up flows have drained before its
first ring or broadcast flow (per port, per host).
"""

from __future__ import annotations

import heapq

import numpy as np

from .fast_checks import commit, links_fit, post_times
from .fast_kinds import Refused

_NEG = -np.inf


def _maxmin(links: list, capl: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows crossing ``links`` (a list of link lists) of capacities
    ``capl``: progressive filling, the most constrained link first."""
    rate = np.zeros(len(links))
    free = np.array(capl, dtype=np.float64)
    todo = list(range(len(links)))
    while todo:
        cnt = np.zeros(len(free))
        for i in todo:
            cnt[links[i]] += 1
        share = np.full(len(free), np.inf)
        on = cnt > 0
        share[on] = free[on] / cnt[on]
        lk = int(np.argmin(share))
        s = float(share[lk])
        keep = []
        for i in todo:
            if lk in links[i]:
                rate[i] = s
                free[links[i]] -= s
            else:
                keep.append(i)
        todo = keep
    return rate


def _startup(post, R: int, wire_of, nb: int, lat_g, lat_b, lk_g, lk_b, capl) -> dict:
    """One host's start-up (posts ``post`` per local rank): channel ("g", j), j >= 1, sends
    shards j..R-1 to j-1 (shard j after the copy, each other once received from j+1);
    channel ("b", j), j <= R-2, sends shards 0..j to j+1 (after the copy and, j >= 1, the
    receipt of shards 0..j-1 from j-1). A channel sends one message at a time, in the
    order they become ready; a flow drains at its max-min rate, its message arriving one
    latency later. Returns the times the later phase starts from."""
    chans: dict = {}
    for j in range(1, R):
        chans[("g", j)] = {"n": R - j, "w": wire_of(nb), "lat": lat_g[j], "links": lk_g[j],
                           "ready": [None] * (R - j), "next": 0, "busy": False,
                           "last": _NEG}
    for j in range(R - 1):
        chans[("b", j)] = {"n": 1, "w": wire_of((j + 1) * nb), "lat": lat_b[j],
                           "links": lk_b[j], "ready": [None], "next": 0, "busy": False,
                           "last": _NEG}
    heap: list = []
    seq = [0]
    done = np.array(post, dtype=np.float64)         # per local: its latest step done
    gdone = float(post[0])                          # the leader's gather received

    def push(t, what, key=None, i=0):
        seq[0] += 1
        heapq.heappush(heap, (t, seq[0], what, key, i))

    def ready(key, i, t):
        chans[key]["ready"][i] = t
        push(t, "wake")

    for j in range(1, R):
        ready(("g", j), 0, float(post[j]))
    ready(("b", 0), 0, float(post[0]))

    def arrive(key, i, t):
        nonlocal gdone
        kind, j = key
        dst = j - 1 if kind == "g" else j + 1
        rd = max(float(post[dst]), t)
        done[dst] = max(done[dst], rd)
        if kind == "g":
            if dst == 0:
                gdone = max(gdone, rd)
            else:                                   # forward shard j + i: its index at dst
                ready(("g", dst), j + i - dst, rd)
        else:
            if dst <= R - 2:
                ready(("b", dst), 0, max(float(post[dst]), rd))

    active: list = []                               # [key, bytes left]
    now = float(np.min(post))
    flows = 0
    while True:
        while heap and heap[0][0] <= now:           # arrivals and wake-ups due now
            _, _, what, key, i = heapq.heappop(heap)
            if what == "arrive":
                arrive(key, i, now)
        started = False
        for key, c in chans.items():
            i = c["next"]
            if c["busy"] or i >= c["n"] or c["ready"][i] is None or c["ready"][i] > now:
                continue
            c["next"] += 1
            started = True
            if c["w"] > 0:
                c["busy"] = True
                active.append([key, float(c["w"])])
                flows += 1
            else:
                c["last"] = max(c["last"], now)
                done[key[1]] = max(done[key[1]], now)
                push(now + c["lat"], "arrive", key, i)
        if started:
            continue                                # a zero-byte message may arrive now
        if not active:
            if not heap:
                break
            now = heap[0][0]
            continue
        rate = _maxmin([chans[a[0]]["links"] for a in active], capl)
        t_end = [now + a[1] / r for a, r in zip(active, rate)]
        t_next = min(min(t_end), heap[0][0] if heap else np.inf)
        keep = []
        for a, r, te in zip(active, rate.tolist(), t_end):
            if te <= t_next:
                c = chans[a[0]]
                c["busy"] = False
                c["last"] = te
                done[a[0][1]] = max(done[a[0][1]], te)
                push(te + c["lat"], "arrive", a[0], c["next"] - 1)
            else:
                a[1] -= r * (t_next - now)
                keep.append(a)
        active = keep
        now = t_next
    for c in chans.values():
        if c["next"] < c["n"]:
            raise Refused("a host's start-up did not finish (internal)")
    g_last = np.full(R, _NEG)                       # last gather drain out of local j
    b_last = np.full(R, _NEG)                       # own-host broadcast drain out of j
    for (kind, j), c in chans.items():
        (g_last if kind == "g" else b_last)[j] = c["last"]
    return {"gdone": gdone, "done": done, "g_last": g_last, "b_last": b_last,
            "flows": flows}


def _host_routes(sim, H: int, R: int):
    """Per host: each rank's port out (``lg``) and in (``ld``), from the routes j -> j-1
    (gather) and j -> j+1 (broadcast) inside it, their latencies, and the route leader ->
    next leader; checked to be one port per rank, alike on every host, no port shared."""
    gl = np.zeros((H, R, 2), np.int64)               # route j -> j-1 (j >= 1)
    bl = np.zeros((H, R, 2), np.int64)               # route j -> j+1 (j <= R-2)
    lat_g = np.zeros((H, R))
    lat_b = np.zeros((H, R))
    ring_links, lat_r = [], np.zeros(H)
    for h in range(H):
        base = h * R
        for j in range(R):
            r = base + j
            for d, rows, lat in ((-1, gl, lat_g), (1, bl, lat_b)):
                if 0 <= j + d < R:
                    lk, lat[h, j] = sim._route(r, r + d)
                    if len(lk) != 2:
                        raise Refused("a host's internal route is not one port out, one in")
                    rows[h, j] = lk
        if H > 1:
            lk, lat_r[h] = sim._route(base, ((h + 1) % H) * R)
            ring_links.append(lk)
    lg = np.zeros((H, R), np.int64)
    ld = np.zeros((H, R), np.int64)
    if R > 1:
        lg[:, 0], lg[:, 1:] = bl[:, 0, 0], gl[:, 1:, 0]
        ld[:, 0], ld[:, 1:] = gl[:, 1, 1], bl[:, :R - 1, 1]
        if not ((gl[:, 1:R - 1, 0] == bl[:, 1:R - 1, 0]).all()
                and (gl[:, 2:, 1] == bl[:, :R - 2, 1]).all()):
            raise Refused("a host's internal routes do not share each rank's port")
        if len(np.unique(np.concatenate([lg.ravel(), ld.ravel()]))) != 2 * H * R:
            raise Refused("ranks share a port inside a host")
        cap = sim.net.capacity
        for a in (lat_g, lat_b, cap[lg], cap[ld]):
            if not (a == a[:1]).all():
                raise Refused("hosts differ inside (latencies or port speeds)")
    return lg, ld, lat_g, lat_b, ring_links, lat_r


def run_host_ring(sim, form) -> str:
    """Time ``sim``'s one ``hring`` allgather request (see the module's docstring) and
    commit its results as the walk would. Raises Refused before changing anything."""
    _, itemsize, comm = sim._reqs[0]
    if comm:
        raise Refused("the stream mode times a hierarchical ring on the world "
                      "communicator only")
    if sim.net.host_bw is not None:
        raise Refused("the host model's ports are not a host's internal ports")
    P, R = form.nranks, form.ranks_per_host
    H = P // R
    fr = sim.topo.framing
    cap = sim.net.capacity
    nlinks = sim.net.nlinks
    wire_of = fr.message_wire
    nb = int(form.nelems) * itemsize
    B = R * nb
    wB = wire_of(B)
    post = post_times(sim, comm, P)
    PH = post.reshape(H, R)
    lg, ld, lat_g, lat_b, ring_links, lat_r = _host_routes(sim, H, R)
    # 1. start-up, once per pattern of posts
    comp = PH.copy()
    gdone = PH[:, 0].copy()
    g_last = np.full((H, R), _NEG)
    b_last = np.full((H, R), _NEG)
    flows = 0
    if R > 1:
        pats, inv = np.unique(PH, axis=0, return_inverse=True)
        if len(pats) > 64:
            raise Refused("more than 64 patterns of post times across hosts")
        # local links: 0..R-1 ports out, R..2R-1 ports in
        lk_g = {j: [j, R + j - 1] for j in range(1, R)}
        lk_b = {j: [j, R + j + 1] for j in range(R - 1)}
        capl = np.concatenate([cap[lg[0]], cap[ld[0]]])
        for k, row in enumerate(pats):
            s = _startup(row, R, wire_of, nb, lat_g[0], lat_b[0], lk_g, lk_b, capl)
            on = inv.ravel() == k
            comp[on] = s["done"]
            gdone[on] = s["gdone"]
            g_last[on] = s["g_last"]
            b_last[on] = s["b_last"]
            flows += s["flows"] * int(on.sum())
    # 2. the ring, and each block down the chain
    rate_b = np.minimum(cap[lg[:, :R - 1]], cap[ld[:, 1:]]) if R > 1 else np.zeros((H, 0))
    msgs = H * (R * (R - 1) // 2 + (R - 1))
    mbytes = H * (sum((R - j) * nb for j in range(1, R)) + sum((j + 1) * nb
                                                                for j in range(R - 1)))
    if H > 1:
        rate_r = np.array([cap[lk].min() for lk in ring_links])
        lens = np.array([len(lk) for lk in ring_links], np.int64)
        all_lk = np.concatenate(ring_links)
        if R > 1:
            if not ((all_lk[np.cumsum(lens) - lens] == lg[:, 0]).all()
                    and (all_lk[np.cumsum(lens) - 1] == np.roll(ld[:, 0], -1)).all()):
                raise Refused("a leader's ring route does not leave and enter by its ports")
            inner = np.zeros(len(cap), bool)
            inner[lg[:, 1:]] = True
            inner[ld[:, 1:]] = True
            if inner[all_lk].any():
                raise Refused("the leaders' ring crosses a local rank's port")
            if (rate_r > cap[lg[:, 0]] / 2).any():
                raise Refused("the ring's rate is over half the leader's port")
            # the leader's first hop, beside the ring's flow: what that flow leaves of the port
            rate_sh = np.minimum(cap[ld[:, 1]], cap[lg[:, 0]] - rate_r)
        # network links that several ring channels cross: their flows checked at the end
        use = np.bincount(all_lk, minlength=len(cap))
        ch_of = np.repeat(np.arange(H), lens)
        watch = np.unique(ch_of[(use[all_lk] > 1) & (all_lk < nlinks)])
        kept_st, kept_dr = [], []
        post0 = PH[:, 0]
        free_r = np.full(H, _NEG)
        dur_r = wB / rate_r if wB else np.zeros(H)
        st = np.maximum(gdone, free_r)
        dr = st + dur_r
        first_ring = st
        bfree = b_last.copy()                         # each hop's channel: own message out
        first_ready = None
        for t in range(H - 1):
            if len(watch):
                kept_st.append(st[watch]), kept_dr.append(dr[watch])
            rd = np.maximum(post0, np.roll(dr + lat_r, 1))     # ring step t received
            comp[:, 0] = np.maximum(comp[:, 0], np.maximum(rd, dr))
            if t + 1 < H - 1:
                nst = np.maximum(rd, dr)
                ndr = nst + dur_r
            else:
                nst = ndr = np.full(H, np.inf)
            if R > 1:
                ready = rd
                hop_ready = [ready]
                b0 = np.maximum(ready, bfree[:, 0])
                if wB:
                    solo = b0 + wB / rate_b[:, 0]
                    shared = b0 + wB / rate_sh
                    covered = (nst <= b0) & (ndr >= shared)
                    alone = (dr <= b0) & (nst >= solo)
                    if not (covered | alone).all():
                        raise Refused("a block leaves the leader while the ring's flows "
                                      "start or end beside it")
                    e = np.where(covered, shared, solo)
                else:
                    e = b0
                bfree[:, 0] = e
                comp[:, 0] = np.maximum(comp[:, 0], e)
                arr = e + lat_b[:, 0]
                for j in range(1, R):
                    rj = np.maximum(PH[:, j], arr)
                    comp[:, j] = np.maximum(comp[:, j], rj)
                    if j == R - 1:
                        break
                    hop_ready.append(rj)
                    s_ = np.maximum(rj, bfree[:, j])
                    e = s_ + wB / rate_b[:, j] if wB else s_
                    bfree[:, j] = e
                    comp[:, j] = np.maximum(comp[:, j], e)
                    arr = e + lat_b[:, j]
                if first_ready is None:
                    first_ready = np.stack(hop_ready, axis=1)      # (H, R-1)
            st, dr = nst, ndr
        # every port's start-up flows drained before its first ring or broadcast flow
        if R > 1:
            up_first = first_ready.copy()               # flows out of local j (j <= R-2)
            up_first[:, 0] = np.minimum(up_first[:, 0], first_ring)
            up_last = np.maximum(g_last[:, :R - 1], b_last[:, :R - 1])
            dn_last = np.maximum(np.c_[g_last[:, 2:], np.full((H, 1), _NEG)],
                                 b_last[:, :R - 1])     # into local j + 1
            if ((up_last > up_first).any() or (dn_last > first_ready).any()
                    or (g_last[:, 1] > np.roll(first_ring, 1)).any()):
                raise Refused("a host still gathers when its ring or broadcast starts")
        if len(watch):
            rl = [ring_links[c][(use[ring_links[c]] > 1) & (ring_links[c] < nlinks)]
                  for c in watch.tolist()]
            per = np.array([len(x) for x in rl], np.int64)
            sts = np.stack(kept_st, axis=1)             # (watched, H-1)
            drs = np.stack(kept_dr, axis=1)
            links = np.concatenate([np.repeat(x, H - 1) for x in rl])
            n_of = lambda a: np.concatenate([np.tile(a[i], per[i])          # noqa: E731
                                             for i in range(len(rl))])
            links_fit(links, n_of(sts), n_of(drs),
                      np.repeat(rate_r[watch], per * (H - 1)), cap)
        msgs += H * (H - 1) * R
        mbytes += H * (H - 1) * R * B
        if wB:
            flows += H * (H - 1) * R
    # commit: link bytes per route
    lb = sim.net.link_bytes
    w_nb = wire_of(nb)
    if R > 1:
        gw = np.array([0] + [(R - j) * w_nb for j in range(1, R)], np.float64)
        bw = np.array([wire_of((j + 1) * nb) + (H - 1) * wB for j in range(R - 1)],
                      np.float64)
        for links, w in ((np.stack([lg[:, 1:], ld[:, :R - 1]], axis=2), gw[1:]),
                         (np.stack([lg[:, :R - 1], ld[:, 1:]], axis=2), bw)):
            wts = np.broadcast_to(w[None, :, None], links.shape)
            ok = (links < nlinks) & (wts > 0)
            np.add.at(lb, links[ok], wts[ok])
    if H > 1 and wB:
        for lk in ring_links:
            np.add.at(lb, lk[lk < nlinks], float((H - 1) * wB))
    sim.net.flows_started += flows
    group = np.arange(P, dtype=np.int64)
    commit(sim, group, post, comp.ravel(), form.nsteps, 1 + (R - 1) + 3 * H,
            {"messages_out": msgs, "message_bytes_out": mbytes, "datagrams_out": 0})
    return "stream"
