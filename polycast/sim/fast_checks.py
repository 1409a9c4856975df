"""What the fast path's modes share (polycast/sim/fast_walk.py, fast_stream.py,
fast_host_ring.py): a multicast stream's shape as the engine's pacer sends it, the
contention check on links, the quantisation of times by which channel order is judged,
and the stream modes' post times and commit."""

from __future__ import annotations

import math

import numpy as np

from ..engine.wire import HEADER_NBYTES
from .fast_kinds import Refused


def stream_shape(nbytes: int, itemsize: int, mtu: int, pace_gbps, fr):
    """A multicast of ``nbytes`` as the engine's pacer sends it: (datagram payloads, the
    end-of-stream datagram's offset from the first, the pacer's next free slot, wire bytes,
    the wire rate its pacing allows)."""
    ce = max(1, mtu // itemsize) * itemsize
    nfull, last = divmod(nbytes, ce)
    sizes = [ce] * nfull + ([last] if last else [])
    per = 8.0 / (pace_gbps * 1e9) if pace_gbps else 0.0
    tot = sum(s + HEADER_NBYTES for s in sizes) * per
    w, c = 0, math.inf
    if nbytes:
        w = fr.datagram_wire(sizes)
        if len(sizes) > 1 and pace_gbps:
            span = sum(s + HEADER_NBYTES for s in sizes[:-1]) * per
            if span > 0:
                c = (w - fr.datagram_wire(sizes[-1])) / span
    return sizes, tot, tot + HEADER_NBYTES * per, w, c


def links_fit(links, st, dr, rate, cap) -> None:
    """Refuse unless, on every link, the solo rates of the flows in flight at once (flow i
    on ``links[i]`` from ``st[i]`` to ``dr[i]`` at ``rate[i]``) fit its capacity."""
    tol = np.abs(dr) * 1e-12 + 1e-18
    t = np.concatenate([st, dr - tol])
    d = np.concatenate([rate, -rate])
    isstart = np.concatenate([np.ones(len(st), np.int8), np.zeros(len(dr), np.int8)])
    lk2 = np.concatenate([links, links])
    o = np.lexsort((isstart, t, lk2))
    lk2, d = lk2[o], d[o]
    cs = np.cumsum(d)
    first = np.flatnonzero(np.r_[True, lk2[1:] != lk2[:-1]])
    offs = np.repeat(np.r_[0.0, cs[first[1:] - 1]], np.diff(np.r_[first, len(lk2)]))
    load = cs - offs
    over = load > cap[lk2] * (1 + 1e-9)
    if over.any():
        j = int(np.flatnonzero(over)[0])
        raise Refused(f"flows share link {int(lk2[j])} beyond its capacity "
                      f"({load[j] / cap[lk2[j]]:.3g}x): max-min sharing runs the engines")


def _quantum(t: np.ndarray) -> float | None:
    """The batch tolerance of times ``t`` (relative to the largest), or None when all are
    0 or not finite."""
    scale = float(np.nanmax(np.abs(t))) if len(t) else 0.0
    if not scale or not np.isfinite(scale):
        return None
    return scale * 1e-12


def _quantize(t: np.ndarray, quantum: float | None | bool = False) -> np.ndarray:
    """Start times that the event loop would see as one instant (driver's batch tolerance)
    made equal, for ordering. ``quantum``: that of a larger array ``t`` is part of
    (:func:`_quantum`); by default ``t``'s own."""
    q = _quantum(t) if quantum is False else quantum
    if q is None:
        return np.nan_to_num(t)
    return np.round(np.nan_to_num(t) / q)


def post_times(sim, comm: int, P: int) -> np.ndarray:
    eps = sim._comm_eps[comm]
    local_of = {e: i for i, e in enumerate(eps)}
    post = np.full(P, np.nan)
    for ev in sim._heap:                                # (t, seq, _POST, endpoint, req, _)
        post[local_of[ev[3]]] = ev[0]
    return post


def commit(sim, group, post, comp, events: int, levels: int, stats: dict) -> None:
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
