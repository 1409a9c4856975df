"""A schedule's cost on a fabric, read from the schedule itself.

This is how a newly registered algorithm gets a cost for free: nothing here knows any
algorithm by name. The schedule is walked twice along its dependency order (the order
the verifier and :mod:`polycast.schedule.traffic` use):

1. **Phases.** Every message gets a phase: the number of message hops before it along the
   dependencies, and after the previous message of its channel (a rank's messages to one
   peer leave in order, as the drivers' channels are FIFO; one root's multicasts too).
   The messages of one phase run together -- a ring's step, a tree's level, one stage of
   a pipeline's fill -- so each one's rate is its share of the resources the phase loads:
   the sender's port (split over the peers it sends to in that phase), the receiver's
   port, and the uplinks of every host/leaf/pod group it leaves or enters, onto which
   static ECMP hashes the phase's flows so that they collide (:func:`collision`).
   Multicast loads the root's port once, enters each group holding receivers once, and
   runs at most at the pacing the protocol gives it; in-network reduction (``innet``)
   loads a destination's port and each group once per destination, as the switches
   combine the senders' messages.
2. **Time.** A message drains ``bytes / rate`` after it starts and arrives one link-class
   latency (plus the host's per-message cost) later; a step starts when its dependencies
   are done and a send when its channel is free; a send is done when it has drained. Times are kept as lines
   ``a + b * S`` in the collective's size S, and each step keeps the upper envelope of
   the lines of the paths into it, so one walk gives the time at every size:
   ``time(S) = max_i (a_i + b_i * S)`` -- latency-bound paths (a tree's depth) and
   bandwidth-bound ones (a pipeline's port) both survive, and a pipeline's latency hides
   behind its transfers as it does on the wire.

Reliable multicast adds its completion handshake (one FIN to the ring successor,
specs/mcast-protocol.md). Hosts with a CPU cost per message (the real runtime) add it to
every hop, and a host with fewer cores than ranks is bounded by the total work its ranks
do (:meth:`Terms.time`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

from ..schedule.graph import global_order, match_messages
from ..schedule.ir import Kind, Schedule

MAX_LINES = 5          # lines kept per step: the envelope of a few paths is plenty


@dataclass(frozen=True)
class Terms:
    """One schedule on one fabric: ``time(S) = max_i (a_i + b_i * S)`` (``lines``, b in
    seconds per byte of S), plus the host bound of a fabric with CPU costs."""

    lines: tuple[tuple[float, float], ...]
    hops: int                   # messages on the longest chain (phases included)
    phases: int                 # message phases
    messages: int               # most messages one rank handles (sends + receives)
    host_messages: int          # most messages the ranks of one host handle together
    host_bytes_per_byte: float  # most bytes the ranks of one host move, per byte of S
    bound: str                  # the resource that bounds the most loaded phase
    fanout: int = 1             # most peers one rank sends to in one phase

    @property
    def latency_s(self) -> float:
        """The time of an empty message (the latency term)."""
        return max(a for a, _ in self.lines)

    @property
    def seconds_per_byte(self) -> float:
        """The slope for large sizes (the bandwidth term)."""
        return max(b for _, b in self.lines)

    def time(self, nbytes: float, fabric) -> float:
        ls, bs = fabric.latency_scale, fabric.bandwidth_scale
        t = max(a * ls + b * bs * nbytes for a, b in self.lines)
        if fabric.cores and fabric.msg_overhead_s:
            t = max(t, self.host_messages * fabric.msg_overhead_s / fabric.cores)
        if fabric.host_gbps < math.inf:
            t = max(t, nbytes * self.host_bytes_per_byte * 8 / (fabric.host_gbps * 1e9))
        return t


def analyze(s: Schedule, fabric, innet: bool = False) -> Terms:
    """The cost terms of schedule ``s`` on ``fabric`` (see the module docstring)."""
    P = s.nranks
    total = s.collective.total_elements(P, s.count)
    if P == 1:
        return Terms(((0.0, 0.0),), 0, 0, 0, 0, 0.0, "one rank")
    m = match_messages(s)
    order, stuck = global_order(s, m.sender)
    if stuck:
        raise ValueError(f"{s.describe()} deadlocks; the verifier says where")
    progs = s.programs
    inv = 1.0 / total if total else 0.0
    sizes = [lv.ranks for lv in fabric.levels]
    nlev = len(sizes)
    receivers: dict[int, list[int]] = {}
    for (root, rank) in m.mrecvs:
        receivers.setdefault(root, []).append(rank)

    # -- pass 1: phases and what each phase loads --------------------------------------
    phase = [[0] * len(p) for p in progs]
    channel: dict[tuple[int, int], int] = {}
    phases: dict[int, _Phase] = {}
    crossed: dict[tuple[int, int], list] = {}    # message -> uplink groups it loads
    size_of: dict[tuple[int, int], float] = {}   # message -> its bytes, per byte of S
    sender = m.sender
    for rank, idx in order:
        st = progs[rank][idx]
        row = phase[rank]
        h = max((row[d] for d in st.deps), default=0)
        kind = st.kind
        if kind is Kind.RECV or kind is Kind.MRECV:
            snode = sender.get((rank, idx))
            if snode is not None:
                h = max(h, phase[snode[0]][snode[1]] + 1)
        elif kind is Kind.SEND or kind is Kind.MCAST:
            key = (rank, st.peer if kind is Kind.SEND else -1)
            last = channel.get(key)
            if last is not None and last >= h:
                h = last + 1
            channel[key] = h
            ph = phases.get(h)
            if ph is None:
                ph = phases[h] = _Phase()
            x = s.step_nelems(st, rank) * inv if st.blocks else 0.0
            size_of[(rank, idx)] = x
            if kind is Kind.SEND:
                crossed[(rank, idx)] = ph.send(rank, st.peer, x, nlev, sizes, innet)
            else:
                crossed[(rank, idx)] = ph.mcast(rank, receivers.get(rank, ()), x, nlev, sizes)
        row[idx] = h
    for ph in phases.values():
        ph.settle(fabric, s)

    # -- pass 2: times as envelopes of lines a + b*S ------------------------------------
    lat_of = [lv.latency_s + fabric.msg_overhead_s for lv in fabric.levels]
    level_of = fabric.level_of
    done: list[list] = [[None] * len(p) for p in progs]     # step -> lines when complete
    drained: dict[tuple[int, int], tuple] = {}              # sender node -> drain lines
    chan_free: dict[tuple[int, int], tuple] = {}            # channel -> lines when free
    zero = ((0.0, 0.0),)
    for rank, idx in order:
        st = progs[rank][idx]
        row = done[rank]
        deps = st.deps
        if not deps:
            start = zero
        elif len(deps) == 1:
            start = row[deps[0]]
        else:
            start = _merge([row[d] for d in deps])
        kind = st.kind
        if kind is Kind.SEND or kind is Kind.MCAST:
            key = (rank, st.peer if kind is Kind.SEND else -1)
            free = chan_free.get(key)
            if free is not None:
                start = _merge2(start, free) if start is not free else start
            x = size_of[(rank, idx)]
            if x:
                per_byte = phases[phase[rank][idx]].per_byte(
                    rank, st.peer, kind is Kind.MCAST, crossed[(rank, idx)]) * x
                end = tuple((a, b + per_byte) for a, b in start)
            else:
                end = start
            chan_free[key] = end
            drained[(rank, idx)] = end
            row[idx] = end              # a send completes when its last byte has left
        elif kind is Kind.RECV or kind is Kind.MRECV:
            snode = sender.get((rank, idx))
            if snode is not None:
                lat = lat_of[level_of(snode[0], rank)]
                got = drained[snode]
                arrive = ((got[0][0] + lat, got[0][1]),) if len(got) == 1 else \
                    tuple((a + lat, b) for a, b in got)
                start = arrive if start is zero else _merge2(start, arrive)
            row[idx] = start
        else:
            row[idx] = start
    final = zero
    seen = set()
    for row in done:
        for lines in row:
            if lines is not None and id(lines) not in seen:
                seen.add(id(lines))
                final = _merge2(final, lines)
    if m.mcasts:
        # Reliable multicast completes with one FIN from each rank to its ring successor
        # (specs/mcast-protocol.md): one more message latency, the widest such pair's.
        fin = max(lat_of[level_of(r, (r + 1) % P)] for r in range(P))
        final = tuple((a + fin, b) for a, b in final)
    hops = max((max(row, default=0) for row in phase), default=0)
    worst, bound = -1.0, "nothing to send"
    host_msgs, host_bytes, msgs = 0, 0.0, 0
    for ph in phases.values():
        if ph.worst > worst:
            worst, bound = ph.worst, ph.bound
        msgs += max(ph.nmsg.values(), default=0)
        host_msgs += ph.host_messages(fabric)
        host_bytes += ph.host_bytes(fabric)
    fanout = max((len(p) for ph in phases.values() for p in ph.peers_out.values()), default=1)
    return Terms(final, hops + 1 if phases else 0, len(phases), msgs, host_msgs, host_bytes,
                 bound, fanout)


def _merge(groups) -> tuple:
    """Upper envelope (over S >= 0) of the union of line sets (each sorted by slope,
    steepest first): drop lines another beats at every size, keep at most MAX_LINES."""
    it = iter(groups)
    out = next(it)
    for g in it:
        if g is not out:
            out = _merge2(out, g)
    return out


def _merge2(p: tuple, q: tuple) -> tuple:
    if len(p) == 1 and len(q) == 1:         # the common case, kept cheap
        (a1, b1), (a2, b2) = p[0], q[0]
        if a1 >= a2 and b1 >= b2:
            return p
        if a2 >= a1 and b2 >= b1:
            return q
        return (p[0], q[0]) if b1 > b2 else (q[0], p[0])
    # Sort by slope descending, then intercept descending; keep lines not dominated.
    pts = sorted(set(p + q), key=lambda ln: (-ln[1], -ln[0]))
    out = []
    best_a = -math.inf
    for a, b in pts:
        if a > best_a:          # a smaller slope must have a larger intercept to matter
            out.append((a, b))
            best_a = a
    if len(out) > 2:
        out = _hull(out)
    if len(out) > MAX_LINES:
        # Keep the steepest, the highest intercept and the ones between, evenly.
        step = (len(out) - 1) / (MAX_LINES - 1)
        out = [out[round(i * step)] for i in range(MAX_LINES)]
    return tuple(out)


def _hull(lines):
    """Lines (slope descending, intercept ascending) on the upper envelope for S >= 0."""
    hull: list = []
    for ln in lines:
        while len(hull) >= 2:
            (a1, b1), (a2, b2) = hull[-2], hull[-1]
            a3, b3 = ln
            # hull[-1] is useless if the crossing of 1 and 3 is at or below that of 1 and 2.
            if (a3 - a1) * (b1 - b2) >= (a2 - a1) * (b1 - b3):
                hull.pop()
            else:
                break
        hull.append(ln)
    return hull


class _Phase:
    """What the messages of one phase put on each resource (bytes as fractions of S)."""

    __slots__ = ("out", "inn", "peers_out", "peers_in", "nmsg", "cross", "combined",
                 "pace", "port", "rate", "worst", "bound")

    def __init__(self) -> None:
        self.out: dict[int, float] = {}        # rank -> bytes it sends
        self.inn: dict[int, float] = {}        # rank -> bytes it receives
        self.peers_out: dict[int, set] = {}    # rank -> channels it sends on
        self.peers_in: dict[int, set] = {}     # rank -> channels it receives from
        self.nmsg: dict[int, int] = {}         # rank -> messages it sends or receives
        self.cross: dict[tuple, list] = {}     # (level, group, way) -> [bytes, pairs]
        self.combined: set = set()             # innet: what the switches already carry
        self.rate: dict[tuple, float] = {}     # (level, group, way) -> seconds per byte
        self.worst = 0.0
        self.bound = "rank ports"

    def _count(self, rank: int) -> None:
        self.nmsg[rank] = self.nmsg.get(rank, 0) + 1

    def _cross(self, keys: list, lv: int, group: int, way: str, x: float, pair) -> None:
        # Flows are told apart by (source, destination): ECMP hashes the pair, so one
        # pair's messages share a route and never collide with each other.
        key = (lv, group, way)
        acc = self.cross.get(key)
        if acc is None:
            self.cross[key] = [x, {pair}]
        else:
            acc[0] += x
            acc[1].add(pair)
        keys.append(key)

    def send(self, a: int, b: int, x: float, nlev: int, sizes, innet: bool) -> list:
        """Account one message; returns the uplink groups it loads."""
        self._count(a)
        self._count(b)
        keys: list = []
        if x <= 0.0:
            return keys
        self.out[a] = self.out.get(a, 0.0) + x
        self.peers_out.setdefault(a, set()).add(b)
        if not innet:
            self.inn[b] = self.inn.get(b, 0.0) + x
            self.peers_in.setdefault(b, set()).add(a)
        elif (-1, b) not in self.combined:          # the destination gets one message
            self.combined.add((-1, b))
            self.inn[b] = self.inn.get(b, 0.0) + x
            self.peers_in.setdefault(b, set()).add(-1)
        for lv in range(nlev - 1):
            ga, gb = a // sizes[lv], b // sizes[lv]
            if ga == gb:
                break
            if not innet:
                self._cross(keys, lv, ga, "out", x, (a, b))
                self._cross(keys, lv, gb, "in", x, (a, b))
                continue
            # The switches combine the senders' messages to one destination: a group
            # sends it up once, the destination's group takes it in once.
            if (lv, ga, b) not in self.combined:
                self.combined.add((lv, ga, b))
                self._cross(keys, lv, ga, "out", x, (ga, b))
            else:
                keys.append((lv, ga, "out"))
            if (lv, "in", b) not in self.combined:
                self.combined.add((lv, "in", b))
                self._cross(keys, lv, gb, "in", x, (gb, b))
            else:
                keys.append((lv, gb, "in"))
        return keys

    def mcast(self, root: int, receivers, x: float, nlev: int, sizes) -> list:
        """Account one multicast; returns the uplink groups it loads."""
        self._count(root)
        for r in receivers:
            self._count(r)
        keys: list = []
        if x <= 0.0:
            return keys
        self.out[root] = self.out.get(root, 0.0) + x
        self.peers_out.setdefault(root, set()).add(-1)
        for r in receivers:
            self.inn[r] = self.inn.get(r, 0.0) + x
            self.peers_in.setdefault(r, set()).add(-1 - root)
        # Up once out of every group of the root that misses receivers; down once into
        # every group holding receivers but not the root.
        for lv in range(nlev - 1):
            size = sizes[lv]
            groot = root // size
            into = {r // size for r in receivers} - {groot}
            if not into:
                break
            self._cross(keys, lv, groot, "out", x, (root, -1))
            for g in into:
                self._cross(keys, lv, g, "in", x, (root, -1))
        return keys

    def settle(self, fabric, s: Schedule) -> None:
        """Per-byte cost of every loaded uplink group, and the phase's bottleneck."""
        self.port = port = fabric.port_gbps * 1e9 / 8
        self.pace = max(1, int(s.options.get("roots", 1) or 1)) / fabric.mcast_pacing
        busiest = max(max(self.out.values(), default=0.0), max(self.inn.values(), default=0.0))
        self.worst = busiest / port
        for key, (x, pairs) in self.cross.items():
            level = fabric.levels[key[0]]
            if not level.uplinks:
                continue
            # The busiest of the group's uplinks sets the pace of the flows on it.
            per_byte = collision(len(pairs), level.uplinks) / (level.uplink_gbps * 1e9 / 8)
            self.rate[key] = per_byte
            t = x / len(pairs) * per_byte
            if t > self.worst:
                self.worst, self.bound = t, f"{level.name} uplinks"

    def per_byte(self, a: int, b: int, mcast: bool, keys: list) -> float:
        """Seconds per byte of one message of this phase from ``a`` to ``b`` (or
        multicast), crossing the uplink groups ``keys``."""
        # A rank's port is shared by its channels of the phase (max-min fair); so is the
        # receiver's, and a multicast stream runs at most at its pacing.
        n = len(self.peers_out.get(a, ()))
        if mcast:
            n = max(n, max((len(p) for p in self.peers_in.values()), default=1), self.pace)
        else:
            n = max(n, len(self.peers_in.get(b, ())))
        t = max(n, 1) / self.port
        for key in keys:
            per_byte = self.rate.get(key, 0.0)
            if per_byte > t:
                t = per_byte
        return t

    def host_messages(self, fabric) -> int:
        if not fabric.cores:
            return 0
        per_host: dict[int, int] = {}
        size = fabric.levels[0].ranks
        for r, n in self.nmsg.items():
            per_host[r // size] = per_host.get(r // size, 0) + n
        return max(per_host.values(), default=0)

    def host_bytes(self, fabric) -> float:
        if fabric.host_gbps == math.inf:
            return 0.0
        per_host: dict[int, float] = {}
        size = fabric.levels[0].ranks
        for d in (self.out, self.inn):
            for r, x in d.items():
                per_host[r // size] = per_host.get(r // size, 0.0) + x
        return max(per_host.values(), default=0.0)


@lru_cache(maxsize=4096)
def collision(flows: int, links: int) -> float:
    """Expected load of the busiest of ``links`` links when ``flows`` flows are hashed onto
    them independently (static ECMP), in flows: at least 1, ``flows/links`` for a perfect
    spread. A flow crosses an up link and a down link, each chosen by its own hash, so the
    busiest of the two sides is taken. Deterministic (a seeded estimate)."""
    if links <= 1 or flows <= 1:
        return max(1.0, flows / max(links, 1))
    if flows > 64 * links:
        # Many flows per link: the mean plus the normal tail of the largest of 2*links bins.
        mean = flows / links
        return mean + math.sqrt(2 * mean * math.log(2 * links))
    rng = random.Random(flows * 7919 + links)
    trials = 64
    acc = 0
    for _ in range(trials):
        worst = 0
        for _side in range(2):
            bins = [0] * links
            for _ in range(flows):
                bins[rng.randrange(links)] += 1
            worst = max(worst, max(bins))
        acc += worst
    return acc / trials
