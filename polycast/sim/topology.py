"""Network topologies for the simulator: nodes, directed links, routing, multicast trees.

A :class:`Topology` is a graph of nodes — ranks (GPUs / processes), host-internal switches
(NVSwitch-like, when a host runs several ranks), and network switches — joined by
**directed** links, each with a bandwidth (bytes/s), a latency (s) and a layer label
(``intra-host``, ``host-leaf``, ``leaf-spine``, ``spine-core``). Every physical cable is two
directed links, one each way (full duplex). Switches add ``switch_latency_s`` per hop.

Every topology here is a tree of levels (ranks at the bottom) in which each node *covers* a
contiguous range of ranks (those below it). That gives routing without tables:

* **Unicast** (deterministic ECMP): climb from the source, choosing among the up links by a
  hash of ``(src, dst, node)``, until the node covers the destination; then descend, the
  child covering the destination being unique (parallel links, e.g. several NICs, are again
  chosen by the hash). Routes are minimal up-down routes, as in a real fat tree.
* **Multicast**: one replication tree per root: the up chain is chosen by a hash of the
  root alone, up to the first node covering every rank, and every node on the chain copies
  down into all of its other children. Each link appears once, every rank is reached once.

Constructors: :func:`single_switch`, :func:`leaf_spine`, :func:`fat_tree`, and
:func:`parse_topology` for the CLI's ``--topology`` strings.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument, UnknownName
from ..units import parse_rate
from .framing import Framing, make_framing

LAYERS = ("intra-host", "host-leaf", "leaf-spine", "spine-core")

# Defaults: a 400 Gbit/s InfiniBand/RoCE-like fabric.
DEFAULT_LINK = "400Gbps"
DEFAULT_LINK_LATENCY_S = 0.25e-6      # cable + SerDes + NIC, per link
DEFAULT_SWITCH_LATENCY_S = 0.3e-6     # per switch traversed (cut-through)
DEFAULT_NVLINK = "3600Gbps"           # 450 GB/s each way per GPU (NVLink 4)
DEFAULT_NVLINK_LATENCY_S = 0.1e-6

_MASK = 0xFFFFFFFFFFFFFFFF


def _mix(*values: int) -> int:
    """A deterministic 64-bit hash (splitmix64 over the values); Python's hash() of ints is
    the identity and would give poor ECMP spreading."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h


_M0, _M1, _M2 = (np.uint64(x) for x in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                          0x94D049BB133111EB))


def _mix_array(*values: np.ndarray) -> np.ndarray:
    """:func:`_mix` of arrays, element by element (uint64 arithmetic wraps as ``& _MASK``)."""
    h = np.full(len(values[0]), _M0, np.uint64)
    for v in values:
        h = (h ^ np.asarray(v).astype(np.uint64)) * _M1
        h ^= h >> np.uint64(31)
        h *= _M2
        h ^= h >> np.uint64(29)
    return h


_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zµ]*)\s*$")


def parse_seconds(text: str | float) -> float:
    """Parse ``"1us"``, ``"300ns"``, ``"2ms"``, ``"0.5s"`` (or a number of seconds)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _TIME.match(str(text))
        unit = m.group(2) if m else None
        if not m or unit not in _TIME_UNITS:
            raise InvalidArgument(f"cannot parse time {text!r}; use e.g. 1us, 300ns, 2ms, 0.5s")
        value = float(m.group(1)) * _TIME_UNITS[unit]
    if value < 0 or not math.isfinite(value):
        raise InvalidArgument(f"time must be >= 0, got {text!r}")
    return value



@dataclass
class Topology:
    """A built network. Ranks are nodes ``0..nranks-1``. Use the constructors below."""

    kind: str
    nranks: int
    description: str
    switch_latency_s: float
    ranks_per_host: int = 1
    host_link_bw: float = 0.0                               # bytes/s of one host link
    framing: Framing = field(default_factory=make_framing)  # headers per packet (framing.py)
    # nodes
    node_kind: list[str] = field(default_factory=list)     # "rank", "host", "switch"
    node_name: list[str] = field(default_factory=list)
    node_lo: list[int] = field(default_factory=list)        # covered ranks [lo, hi)
    node_hi: list[int] = field(default_factory=list)
    node_hop_s: list[float] = field(default_factory=list)   # latency added when traversed
    up: list[list[int]] = field(default_factory=list)       # up link ids per node
    down: list[list[int]] = field(default_factory=list)     # down link ids per node
    # links (directed)
    link_src: list[int] = field(default_factory=list)
    link_dst: list[int] = field(default_factory=list)
    link_bw: list[float] = field(default_factory=list)      # bytes/s
    link_lat: list[float] = field(default_factory=list)     # seconds
    link_layer: list[str] = field(default_factory=list)

    # -- construction -------------------------------------------------------------------
    def add_node(self, kind: str, name: str, hop_s: float = 0.0) -> int:
        self.node_kind.append(kind)
        self.node_name.append(name)
        self.node_lo.append(0)
        self.node_hi.append(0)
        self.node_hop_s.append(hop_s)
        self.up.append([])
        self.down.append([])
        return len(self.node_kind) - 1

    def connect(self, lower: int, upper: int, bw_bytes: float, lat_s: float,
                layer: str) -> None:
        """A full-duplex cable: an up link lower->upper and a down link upper->lower."""
        if not bw_bytes > 0:
            raise InvalidArgument(f"link bandwidth must be > 0, got {bw_bytes} bytes/s "
                                  f"({self.node_name[lower]} - {self.node_name[upper]})")
        for s, d, lst in ((lower, upper, self.up[lower]), (upper, lower, self.down[upper])):
            lst.append(len(self.link_src))
            self.link_src.append(s)
            self.link_dst.append(d)
            self.link_bw.append(float(bw_bytes))
            self.link_lat.append(float(lat_s))
            self.link_layer.append(layer)

    def finish(self) -> "Topology":
        """Compute covered ranges bottom-up and the arrays the network model uses."""
        n = len(self.node_kind)
        for r in range(self.nranks):
            self.node_lo[r], self.node_hi[r] = r, r + 1
        # Nodes were added bottom-up, so one pass in creation order settles every range.
        for v in range(self.nranks, n):
            kids = [self.link_dst[l] for l in self.down[v]]
            if kids:
                self.node_lo[v] = min(self.node_lo[k] for k in kids)
                self.node_hi[v] = max(self.node_hi[k] for k in kids)
        # Per node: distinct children sorted by range, each with its parallel links.
        self._down_lo: list[list[int]] = []
        self._down_par: list[list[list[int]]] = []
        for v in range(n):
            groups: dict[int, list[int]] = {}
            for l in self.down[v]:
                groups.setdefault(self.link_dst[l], []).append(l)
            kids = sorted(groups, key=lambda k: self.node_lo[k])
            self._down_lo.append([self.node_lo[k] for k in kids])
            self._down_par.append([groups[k] for k in kids])
        self.bandwidth = np.array(self.link_bw, dtype=np.float64)
        self.latency = np.array(self.link_lat, dtype=np.float64)
        self.layer_index = np.array([LAYERS.index(x) for x in self.link_layer], dtype=np.int64)
        self._routes: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self._trees: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._subtrees: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        return self

    # -- queries ------------------------------------------------------------------------
    @property
    def nlinks(self) -> int:
        return len(self.link_src)

    @property
    def nswitches(self) -> int:
        return sum(1 for k in self.node_kind if k == "switch")

    def covers(self, node: int, rank: int) -> bool:
        return self.node_lo[node] <= rank < self.node_hi[node]

    def _down_link(self, node: int, rank: int, h: int) -> int:
        i = bisect_right(self._down_lo[node], rank) - 1
        par = self._down_par[node][i]
        return par[h % len(par)] if len(par) > 1 else par[0]

    def route(self, src: int, dst: int) -> tuple[np.ndarray, float]:
        """(link ids, path latency in s) of the ECMP route src -> dst (cached)."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        if src == dst or not (0 <= src < self.nranks and 0 <= dst < self.nranks):
            raise InvalidArgument(f"no route {src} -> {dst} among {self.nranks} ranks")
        links: list[int] = []
        lat = 0.0
        node = src
        h = _mix(src, dst)
        while not (self.node_lo[node] <= dst < self.node_hi[node]):
            ups = self.up[node]
            l = ups[_mix(h, node) % len(ups)] if len(ups) > 1 else ups[0]
            links.append(l)
            node = self.link_dst[l]
            lat += self.link_lat[l] + self.node_hop_s[node]
        while node != dst:
            l = self._down_link(node, dst, _mix(h, node))
            links.append(l)
            node = self.link_dst[l]
            lat += self.link_lat[l] + self.node_hop_s[node]
        out = (np.array(links, dtype=np.int64), lat)
        self._routes[key] = out
        return out

    def routes(self, src: np.ndarray, dst: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`route` of many pairs at once, as arrays: ``(ptr, links, lat)`` where pair
        ``i``'s links are ``links[ptr[i]:ptr[i + 1]]`` and its latency ``lat[i]`` -- the same
        links and the same float sums as :meth:`route`, one tree level per numpy pass
        instead of one Python loop per pair (a 1,024-rank alltoall routes ~1 M pairs)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        bad = (src == dst) | (src < 0) | (src >= self.nranks) | (dst < 0) | (dst >= self.nranks)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidArgument(f"no route {int(src[i])} -> {int(dst[i])} among "
                                  f"{self.nranks} ranks")
        a = self._route_arrays()
        lo, hi, hop, ldst, llat = a["lo"], a["hi"], a["hop"], a["ldst"], a["llat"]
        n = len(src)
        h = _mix_array(src, dst)
        node = src.copy()
        lat = np.zeros(n)
        cols: list[tuple[np.ndarray, np.ndarray]] = []     # per hop: (pairs, their link)
        idx = np.arange(n)
        while len(idx):
            nd, d = node[idx], dst[idx]
            hh = _mix_array(h[idx], nd)
            up = ~((lo[nd] <= d) & (d < hi[nd]))
            l = np.empty(len(idx), np.int64)
            u = np.flatnonzero(up)
            if len(u):                                  # climb: an up link by the hash
                nu = nd[u]
                cnt = a["up_ptr"][nu + 1] - a["up_ptr"][nu]
                l[u] = a["up_flat"][a["up_ptr"][nu] + (hh[u] % cnt.astype(np.uint64))
                                    .astype(np.int64)]
            w = np.flatnonzero(~up)
            if len(w):                                  # descend: the child covering dst
                nw = nd[w]
                g = np.searchsorted(a["grp_key"], nw * (self.nranks + 1) + d[w], "right") - 1
                p0 = a["par_ptr"][g]
                cnt = a["par_ptr"][g + 1] - p0
                l[w] = a["par_flat"][p0 + (hh[w] % cnt.astype(np.uint64)).astype(np.int64)]
            nxt = ldst[l]
            node[idx] = nxt
            lat[idx] += llat[l] + hop[nxt]
            cols.append((idx, l))
            idx = idx[nxt != d]
        length = np.zeros(n, np.int64)
        for k, (i, _) in enumerate(cols):
            length[i] = k + 1
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum(length, out=ptr[1:])
        links = np.empty(int(ptr[-1]), np.int64)
        for k, (i, l) in enumerate(cols):               # hop k of pair i
            links[ptr[i] + k] = l
        return ptr, links, lat

    def _route_arrays(self) -> dict:
        """The node and link lists as arrays for :meth:`routes` (made once): up links per
        node, and per node its children by range (``grp_key`` = node * (nranks + 1) + the
        child's first rank, sorted) with each child's parallel links."""
        a = self.__dict__.get("_rarrays")
        if a is not None:
            return a
        up_len = [len(u) for u in self.up]
        up_ptr = np.zeros(len(self.up) + 1, np.int64)
        np.cumsum(up_len, out=up_ptr[1:])
        keys, par_len, par_flat = [], [], []
        for v, (los, pars) in enumerate(zip(self._down_lo, self._down_par)):
            for lo_, par in zip(los, pars):
                keys.append(v * (self.nranks + 1) + lo_)
                par_len.append(len(par))
                par_flat.extend(par)
        par_ptr = np.zeros(len(par_len) + 1, np.int64)
        np.cumsum(par_len, out=par_ptr[1:])
        a = {"lo": np.asarray(self.node_lo, np.int64), "hi": np.asarray(self.node_hi, np.int64),
             "hop": np.asarray(self.node_hop_s, np.float64),
             "ldst": np.asarray(self.link_dst, np.int64), "llat": self.latency,
             "up_ptr": up_ptr,
             "up_flat": np.asarray([l for u in self.up for l in u], np.int64),
             "grp_key": np.asarray(keys, np.int64), "par_ptr": par_ptr,
             "par_flat": np.asarray(par_flat, np.int64)}
        self.__dict__["_rarrays"] = a
        return a

    def _subtree(self, node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Links of the replication tree below ``node``, and the ranks it reaches with
        their latency from node (arrays: a fat tree's root covers every rank)."""
        hit = self._subtrees.get(node)
        if hit is not None:
            return hit
        links: list = []
        ranks: list = []
        lats: list = []
        for par in self._down_par[node]:
            l = par[_mix(node, 0x6D) % len(par)] if len(par) > 1 else par[0]
            child = self.link_dst[l]
            d = self.link_lat[l] + self.node_hop_s[child]
            links.append(np.array([l], dtype=np.int64))
            if child < self.nranks:
                ranks.append(np.array([child], dtype=np.int64))
                lats.append(np.array([d]))
            else:
                sub_links, sub_ranks, sub_lats = self._subtree(child)
                links.append(sub_links)
                ranks.append(sub_ranks)
                lats.append(d + sub_lats)
        cat = lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt)  # noqa
        out = (cat(links, np.int64), cat(ranks, np.int64), cat(lats, np.float64))
        self._subtrees[node] = out
        return out

    def mcast_tree(self, root: int) -> tuple[np.ndarray, np.ndarray]:
        """(link ids, latency from root per rank) of root's multicast tree over all ranks.

        The latency of the root itself is 0 (it does not receive its own datagrams)."""
        hit = self._trees.get(root)
        if hit is not None:
            return hit
        links: list = []
        lat = np.zeros(self.nranks, dtype=np.float64)
        node, below, acc = root, -1, 0.0
        h = _mix(root, 0xC0FFEE)
        while True:
            for par in self._down_par[node]:
                child = self.link_dst[par[0]]
                if child == below:
                    continue
                l = par[_mix(node, 0x6D) % len(par)] if len(par) > 1 else par[0]
                d = acc + self.link_lat[l] + self.node_hop_s[child]
                links.append(np.array([l], dtype=np.int64))
                if child < self.nranks:
                    lat[child] = d
                else:
                    sub_links, sub_ranks, sub_lats = self._subtree(child)
                    links.append(sub_links)
                    lat[sub_ranks] = d + sub_lats
            if self.node_lo[node] <= 0 and self.node_hi[node] >= self.nranks:
                break
            ups = self.up[node]
            l = ups[_mix(h, node) % len(ups)] if len(ups) > 1 else ups[0]
            links.append(np.array([l], dtype=np.int64))
            below, node = node, self.link_dst[l]
            acc += self.link_lat[l] + self.node_hop_s[node]
        out = (np.concatenate(links) if links else np.zeros(0, np.int64), lat)
        self._trees[root] = out
        return out

    def mcast_tree_within(self, root: int, members) -> tuple[np.ndarray, np.ndarray]:
        """(link ids, latency from root per rank) of root's multicast tree pruned to the
        ranks ``members`` (a communicator's group, root among them): the links of
        :meth:`mcast_tree` that lead to a member, climbing only to the first node that
        covers every member. Latencies are the full tree's (valid for members). Cached."""
        m = np.unique(np.asarray(members, dtype=np.int64))
        key = (root, m.tobytes())
        cache = self.__dict__.setdefault("_group_trees", {})
        hit = cache.get(key)
        if hit is not None:
            return hit
        links, lat = self.mcast_tree(root)
        lo = np.asarray(self.node_lo)
        hi = np.asarray(self.node_hi)
        src = np.asarray(self.link_src)[links]
        dst = np.asarray(self.link_dst)[links]
        down = (lo[src] <= lo[dst]) & (hi[dst] <= hi[src]) & (hi[dst] - lo[dst] < hi[src] - lo[src])
        # a down link is kept when a member lies below it; an up link while the node it
        # leaves does not yet cover every member
        below = np.searchsorted(m, hi[dst]) > np.searchsorted(m, lo[dst])
        covers_all = (lo[src] <= m[0]) & (m[-1] < hi[src])
        keep = np.where(down, below, ~covers_all)
        out = (links[keep], lat)
        cache[key] = out
        return out

    def summary(self) -> str:
        by_layer: dict[str, int] = {}
        for x in self.link_layer:
            by_layer[x] = by_layer.get(x, 0) + 1
        layers = ", ".join(f"{k} {v // 2}" for k, v in by_layer.items())
        return (f"{self.description}: {self.nranks} ranks, {self.nswitches} switches, "
                f"{self.nlinks // 2} cables ({layers})")


# -- constructors ---------------------------------------------------------------------------

def _bytes_per_s(rate) -> float:
    return parse_rate(rate) / 8.0


def _hosts(topo: Topology, nranks: int, ranks_per_host: int, nvlink, nvlink_latency_s
           ) -> list[int]:
    """Create the rank nodes (and host switches when several ranks share a host); return
    the node that attaches each host to the network."""
    for r in range(nranks):
        topo.add_node("rank", f"rank{r}")
    topo.ranks_per_host = ranks_per_host
    if ranks_per_host == 1:
        return list(range(nranks))
    bw = _bytes_per_s(nvlink)
    attach = []
    for h in range(math.ceil(nranks / ranks_per_host)):
        node = topo.add_node("host", f"host{h}")
        for r in range(h * ranks_per_host, min(nranks, (h + 1) * ranks_per_host)):
            topo.connect(r, node, bw, nvlink_latency_s, "intra-host")
        attach.append(node)
    return attach


def _check_common(nranks: int, ranks_per_host: int, nics: int) -> None:
    if not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgument(f"nodes must be a positive integer, got {nranks!r}")
    if not isinstance(ranks_per_host, int) or ranks_per_host < 1:
        raise InvalidArgument(f"ranks_per_host must be a positive integer, got {ranks_per_host!r}")
    if not isinstance(nics, int) or nics < 1:
        raise InvalidArgument(f"nics must be a positive integer, got {nics!r}")
    if nics > 1 and ranks_per_host == 1:
        raise InvalidArgument(f"nics={nics} with ranks_per_host=1: a host of one rank has "
                              "one link; give ranks_per_host > 1 or drop nics")
    if nranks % ranks_per_host:
        raise InvalidArgument(f"ranks_per_host={ranks_per_host} does not divide {nranks} "
                              f"ranks into whole hosts")


def _attach(topo: Topology, host: int, switch: int, bw: float, lat: float, nics: int) -> None:
    topo.host_link_bw = bw
    # A host with several NICs (only when several ranks share it) has parallel links.
    for _ in range(nics if host >= topo.nranks else 1):
        topo.connect(host, switch, bw, lat, "host-leaf")


def single_switch(nranks: int, link=DEFAULT_LINK, latency_s: float = DEFAULT_LINK_LATENCY_S,
                  switch_latency_s: float = DEFAULT_SWITCH_LATENCY_S, ranks_per_host: int = 1,
                  nvlink=DEFAULT_NVLINK, nvlink_latency_s: float = DEFAULT_NVLINK_LATENCY_S,
                  nics: int = 1, framing: Framing | str | None = None,
                  mtu: int | None = None) -> Topology:
    """Every host on one non-blocking switch."""
    _check_common(nranks, ranks_per_host, nics)
    fr = make_framing(framing, mtu)
    topo = Topology("switch", nranks, f"single switch, {_rate_text(link)} links"
                    + _framing_text(fr), switch_latency_s, framing=fr)
    hosts = _hosts(topo, nranks, ranks_per_host, nvlink, nvlink_latency_s)
    sw = topo.add_node("switch", "switch0", switch_latency_s)
    bw = _bytes_per_s(link)
    for h in hosts:
        _attach(topo, h, sw, bw, latency_s, nics)
    return topo.finish()


def leaf_spine(nranks: int, hosts_per_leaf: int = 16, oversub: float = 1.0,
               link=DEFAULT_LINK, latency_s: float = DEFAULT_LINK_LATENCY_S,
               switch_latency_s: float = DEFAULT_SWITCH_LATENCY_S, ranks_per_host: int = 1,
               nvlink=DEFAULT_NVLINK, nvlink_latency_s: float = DEFAULT_NVLINK_LATENCY_S,
               nics: int = 1, framing: Framing | str | None = None,
               mtu: int | None = None) -> Topology:
    """Two levels: leaves of ``hosts_per_leaf`` hosts, each leaf linked once to every spine.

    ``oversub`` = host bandwidth / uplink bandwidth of a leaf. There are
    ``ceil(hosts_per_leaf * nics / oversub)`` spines; the uplink speed is set so that a leaf's
    uplinks carry exactly ``1/oversub`` of its host links."""
    _check_common(nranks, ranks_per_host, nics)
    if not isinstance(hosts_per_leaf, int) or hosts_per_leaf < 1:
        raise InvalidArgument(f"hosts_per_leaf must be a positive integer, got {hosts_per_leaf!r}")
    if not oversub > 0 or not math.isfinite(oversub):
        raise InvalidArgument(f"oversub must be a positive ratio (1 = non-blocking), got {oversub!r}")
    bw = _bytes_per_s(link)
    fr = make_framing(framing, mtu)
    topo = Topology("leafspine", nranks,
                    f"leaf-spine, {hosts_per_leaf} hosts/leaf, oversubscription {oversub:g}:1, "
                    f"{_rate_text(link)} links" + _framing_text(fr), switch_latency_s,
                    framing=fr)
    hosts = _hosts(topo, nranks, ranks_per_host, nvlink, nvlink_latency_s)
    nleaves = math.ceil(len(hosts) / hosts_per_leaf)
    leaves = []
    for i in range(nleaves):
        leaf = topo.add_node("switch", f"leaf{i}", switch_latency_s)
        for h in hosts[i * hosts_per_leaf:(i + 1) * hosts_per_leaf]:
            _attach(topo, h, leaf, bw, latency_s, nics)
        leaves.append(leaf)
    if nleaves > 1:
        host_links = hosts_per_leaf * (nics if ranks_per_host > 1 else 1)
        nspines = max(1, math.ceil(host_links / oversub))
        up_bw = host_links * bw / oversub / nspines
        for j in range(nspines):
            spine = topo.add_node("switch", f"spine{j}", switch_latency_s)
            for leaf in leaves:
                topo.connect(leaf, spine, up_bw, latency_s, "leaf-spine")
    return topo.finish()


def fat_tree(nranks: int, radix: int = 32, link=DEFAULT_LINK,
             latency_s: float = DEFAULT_LINK_LATENCY_S,
             switch_latency_s: float = DEFAULT_SWITCH_LATENCY_S, ranks_per_host: int = 1,
             nvlink=DEFAULT_NVLINK, nvlink_latency_s: float = DEFAULT_NVLINK_LATENCY_S,
             nics: int = 1, framing: Framing | str | None = None,
             mtu: int | None = None) -> Topology:
    """Three-level k-ary fat tree of radix-k switches (Al-Fares et al.): k pods of k/2 edge
    and k/2 aggregation switches, (k/2)^2 cores, k^3/4 host ports, non-blocking. Hosts fill
    edge switches in order; only switches with hosts below them are built (no cores when
    one pod suffices). With several NICs per host, each NIC takes an edge port."""
    _check_common(nranks, ranks_per_host, nics)
    if not isinstance(radix, int) or radix < 2 or radix % 2:
        raise InvalidArgument(f"fat tree radix must be an even integer >= 2, got {radix!r}")
    half = radix // 2
    nhosts = math.ceil(nranks / ranks_per_host)
    per_host = nics if ranks_per_host > 1 else 1
    ports = nhosts * per_host
    capacity = radix ** 3 // 4
    if ports > capacity:
        need = 2
        while need ** 3 // 4 < ports:
            need += 2
        raise InvalidArgument(
            f"fattree radix={radix} has {capacity} host ports (k^3/4), too few for {nhosts} "
            f"hosts x {per_host} NIC(s); use radix >= {need}")
    bw = _bytes_per_s(link)
    fr = make_framing(framing, mtu)
    topo = Topology("fattree", nranks, f"fat tree radix {radix}, {_rate_text(link)} links"
                    + _framing_text(fr), switch_latency_s, framing=fr)
    hosts = _hosts(topo, nranks, ranks_per_host, nvlink, nvlink_latency_s)
    # Host ports in order: port i of edge e of pod p holds NIC/host number p*half^2+e*half+i.
    hosts_per_edge = max(1, half // per_host)     # keep a host's NICs on one edge switch
    nedges = math.ceil(nhosts / hosts_per_edge)
    npods = math.ceil(nedges / half)
    edges = []
    for e in range(nedges):
        edge = topo.add_node("switch", f"edge{e // half}.{e % half}", switch_latency_s)
        for h in hosts[e * hosts_per_edge:(e + 1) * hosts_per_edge]:
            _attach(topo, h, edge, bw, latency_s, nics)
        edges.append(edge)
    if nedges == 1:
        return topo.finish()
    aggs = []
    for p in range(npods):
        pod_aggs = [topo.add_node("switch", f"agg{p}.{j}", switch_latency_s)
                    for j in range(half)]
        for edge in edges[p * half:(p + 1) * half]:
            for agg in pod_aggs:
                topo.connect(edge, agg, bw, latency_s, "leaf-spine")
        aggs.append(pod_aggs)
    if npods > 1:
        for j in range(half):
            for c in range(half):
                core = topo.add_node("switch", f"core{j}.{c}", switch_latency_s)
                for pod_aggs in aggs:
                    topo.connect(pod_aggs[j], core, bw, latency_s, "spine-core")
    return topo.finish()


def _framing_text(fr: Framing) -> str:
    """Said in descriptions only when it is not the default (descriptions of default
    topologies stay as they were)."""
    default = make_framing()
    return "" if fr == default else f", {fr.describe()}"


def _rate_text(rate) -> str:
    if isinstance(rate, str):
        return rate
    return f"{parse_rate(rate) / 1e9:g}Gbps"


# -- the --topology parser ------------------------------------------------------------------

TOPOLOGY_FORMS = (
    "switch",
    "leafspine:hosts_per_leaf=16,oversub=2",
    "fattree:radix=32",
    "(any of them) +ranks_per_host=8,nvlink=3600Gbps,nics=8,latency=250ns,"
    "switch_latency=300ns,link=400Gbps,framing=tcp|udp|ib|none,mtu=9000",
)

_COMMON_KEYS = {"ranks_per_host": int, "nvlink": str, "nvlink_latency": parse_seconds,
                "nics": int, "latency": parse_seconds, "switch_latency": parse_seconds,
                "link": str, "framing": str, "mtu": int}
_KINDS = {
    "switch": (single_switch, {}),
    "leafspine": (leaf_spine, {"hosts_per_leaf": int, "oversub": float}),
    "fattree": (fat_tree, {"radix": int}),
}
_RENAME = {"latency": "latency_s", "switch_latency": "switch_latency_s",
           "nvlink_latency": "nvlink_latency_s"}


def parse_topology(text: str, nranks: int, link=None, framing: str | None = None,
                   **defaults) -> Topology:
    """Build a topology from a ``--topology`` string (see ``TOPOLOGY_FORMS``).

    ``link`` (a rate) and ``framing`` (a :mod:`~polycast.sim.framing` preset name) apply
    unless the string sets ``link=`` / ``framing=``; ``defaults`` are keyword arguments of
    the constructor the string's keys override."""
    forms = "; ".join(TOPOLOGY_FORMS)
    kind, _, rest = str(text).strip().partition(":")
    kind = kind.strip().lower().replace("-", "").replace("_", "")
    kind = {"leafspine": "leafspine", "fattree": "fattree", "singleswitch": "switch"}.get(kind, kind)
    if kind not in _KINDS:
        raise UnknownName("topology kind", text.split(":")[0], TOPOLOGY_FORMS[:3]) from None
    ctor, keys = _KINDS[kind]
    allowed = {**keys, **_COMMON_KEYS}
    kwargs = dict(defaults)
    if link is not None:
        kwargs["link"] = link
    if framing is not None:
        kwargs["framing"] = framing
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in allowed:
            raise InvalidArgument(
                f"bad topology option {item!r} for {kind}; valid keys: "
                f"{', '.join(sorted(allowed))}; valid forms: {forms}")
        try:
            parsed = allowed[key](value.strip())
        except ValueError as e:
            raise InvalidArgument(f"bad value for topology option {key}: {value!r} ({e})") from None
        kwargs[_RENAME.get(key, key)] = parsed
    for rate_key in ("link", "nvlink"):
        if rate_key in kwargs:
            try:
                parse_rate(kwargs[rate_key])
            except InvalidArgument as e:
                raise InvalidArgument(f"topology {rate_key}: {e}") from None
    return ctor(nranks, **kwargs)
