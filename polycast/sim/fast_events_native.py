"""The events mode's loop in C (polycast/sim/_events.c, in the compiled network module): the
plan's arrays handed over once, the loop run on the compiled network state with no Python
per event, the results left where :meth:`fast_events._EventRun.commit` reads them.

It covers what most runs need; a run with a NIC model or in-network reduction combining
runs the Python loop (:func:`why_not`), as does every run without the compiled network
model (not built, or the ``sim_native=0`` test hook)."""

from __future__ import annotations

import math

import numpy as np

from .fast_kinds import COPY, FIN, MCAST, MRECV, RECV, SEND
from .network import TIME_RTOL, compiled


def why_not(ev) -> str | None:
    """Why the compiled loop cannot run ``ev`` (an _EventRun), or None when it can."""
    if not ev.net.native or getattr(compiled, "run_events", None) is None:
        return "the compiled network model is not in use"
    if ev.nic is not None:
        return "a NIC model (SimConfig.nic)"
    if ev.innet_expect:
        return "in-network reduction"
    return None


def _csr(counts: np.ndarray) -> np.ndarray:
    ptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def arrays(ev, succ_ptr: np.ndarray, succ: np.ndarray, roots: np.ndarray,
           roots_mem: np.ndarray) -> dict:
    """The loop's inputs (and the output arrays it fills) for _EventRun ``ev``."""
    plan, g, N = ev.plan, ev.plan.g, ev.N
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)        # noqa: E731
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)      # noqa: E731
    kind = i64(plan.kind)
    ep, peer = i64(plan.ep), i64(plan.peer)
    # channels as dense ids: a message's (endpoint, peer), a stream's endpoint (_chan)
    msg = (kind == SEND) | (kind == FIN)
    key = np.where(msg, ep * ev.W + peer + 1, np.where(kind == MCAST, ep * ev.W, -1))
    chan = np.full(N, -1, np.int64)
    has = key >= 0
    chan[has] = np.unique(key[has], return_inverse=True)[1]
    # the links of every flow-carrying node (its route or multicast tree)
    flows = np.flatnonzero(has & (i64(plan.wire) > 0))
    flat, lens = plan.route_links.gather(plan.route[flows])
    nl = np.zeros(N, np.int64)
    nl[flows] = lens
    # per MCAST its MRECV groups (latency, nodes), in the loop's order
    M = int(sum(ev.nmem))
    ng = np.zeros(N, np.int64)
    g_lat, g_len, g_nodes = [], [], []
    for m in sorted(ev.mgroups):
        groups = ev.mgroups[m]
        ng[m] = len(groups)
        for lat, nodes in groups:
            g_lat.append(lat)
            g_len.append(len(nodes))
            g_nodes.extend(nodes)
    fin_of = np.full(len(ev.nmem), -1, np.int64)
    for q, f in ev.fin_of.items():
        fin_of[q] = f
    post_t = np.concatenate([np.asarray(r[6], np.float64)[:r[3]] for r in g.reqs]) \
        if g.reqs else np.zeros(0)
    return {
        "kind": kind, "q": i64(plan.q), "local": i64(plan.local), "mem": i64(ev.mem),
        "wire": i64(plan.wire), "nbytes": i64(plan.nbytes), "ep": ep, "chan": chan,
        "recv_of_send": ev.recv_of_send, "lat": f64(plan.lat), "t_eos": f64(plan.t_eos),
        "t_next": f64(plan.t_next), "mcap": f64(plan.mcap), "goodput": f64(plan.goodput),
        "post_t": f64(post_t), "deps_left": i64(ev.deps_left).copy(),
        "succ_ptr": i64(succ_ptr), "succ": i64(succ),
        "lk_ptr": _csr(nl), "lk": np.ascontiguousarray(flat, dtype=np.int32),
        "mbase": i64(ev.mbase), "nmem": i64(ev.nmem), "fin_of": fin_of, "mq": i64(ev.mq),
        "mfin": np.asarray(ev.mfin, np.int8), "steps_left": i64(ev.steps_left).copy(),
        "mrecv_left": i64(ev.mrecv_left).copy(),
        "roots_ptr": _csr(np.bincount(roots_mem, minlength=M)), "roots": i64(roots),
        "mg_ptr": _csr(ng), "g_ptr": _csr(np.asarray(g_len, np.int64)),
        "g_nodes": i64(g_nodes), "g_lat": f64(g_lat),
        "done_t": np.full(N, math.nan), "start_t": np.full(N, math.nan),
        "completed": np.full(M, math.nan),
        "pacer": np.zeros(int(ep.max(initial=0)) + 1),
    }


def run(ev, a: dict) -> tuple[int, float, int, int]:
    """Run the loop; (status, now, pending, events): status 0 done, 1 deadlock, 2 past
    max_time_s, 3 past max_events (the caller raises as the Python loop does)."""
    cfg = ev.sim.cfg
    return compiled.run_events(ev.net._c, a, (SEND, RECV, COPY, MCAST, MRECV, FIN),
                               bool(ev.paced), TIME_RTOL, float(cfg.max_time_s),
                               int(cfg.max_events))
