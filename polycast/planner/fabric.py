"""What the planner knows of the machine: a :class:`Fabric` (link classes, latencies,
capabilities, host costs) and a :class:`CommShape` (ranks, hosts x ranks per host).

A fabric is a hierarchy of **levels** as NCCL's topology is of link classes: a rank's own
port, then groups of ranks (a host, a leaf switch, a pod, the whole fabric), each group
linked to the next level by ``uplinks`` links of ``uplink_gbps``. Two ranks whose smallest
common group is at level ``i`` exchange a message with ``levels[i].latency_s`` of one-way
latency, and their traffic crosses the uplinks of every smaller group. Ranks are placed in
order (rank r in slot r), as the simulator's default placement and ``polycast run`` do.

Fabrics come from a simulated :class:`~polycast.sim.topology.Topology`
(:func:`from_topology`: exact link rates and latencies), from a ``--topology`` string
(:func:`modelled`), or from the runtime's view of this machine plus a calibration profile
(:func:`polycast.planner.profile.local_fabric`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import InvalidArgument


@dataclass(frozen=True)
class Level:
    """One link class: groups of ``ranks`` ranks (the last level holds everyone)."""

    name: str                  # "host", "leaf", "pod", "fabric", ...
    ranks: int                 # ranks per group (math.inf-like big number for the top)
    latency_s: float           # one-way latency of a message whose smallest common group is this
    uplinks: int = 0           # links from one group to the next level (0 at the top)
    uplink_gbps: float = 0.0   # Gbit/s of each uplink


@dataclass(frozen=True)
class Fabric:
    """The machine as the cost model sees it. Hashable: estimates are cached per fabric."""

    name: str
    port_gbps: float                    # a rank's own link (Gbit/s)
    levels: tuple[Level, ...]           # innermost first; the last spans every rank
    multicast: bool = False             # switch-replicated multicast (mcast algorithms)
    innet: bool = False                 # in-network reduction (innet algorithms)
    symm: bool = False                  # ranks of a host may map each other's memory
    msg_overhead_s: float = 0.0         # host CPU per message handled (send or receive)
    reduce_gbps: float = math.inf       # rate a rank combines received data (Gbit/s)
    host_gbps: float = math.inf         # all ranks of a host together (memory/CPU bound)
    cores: int = 0                      # cores per host (0: a core per rank)
    mcast_pacing: float = 1.0           # share of the port a multicast stream may use
    min_chunk_nbytes: int = 64 << 10    # smallest block worth pipelining
    latency_scale: float = 1.0          # calibration of a modelled fabric (simulation)
    bandwidth_scale: float = 1.0
    symm_costs: tuple = ()              # (name, value) pairs: the symm path's calibration
    source: str = "built-in"            # where the numbers come from (for --explain)
    extra: tuple = field(default=(), compare=True)   # (name, value) pairs, shown by explain

    # -- queries --------------------------------------------------------------------------
    def level_of(self, a: int, b: int) -> int:
        """Index of the smallest level whose group holds ranks ``a`` and ``b``."""
        for i, lv in enumerate(self.levels):
            if a // lv.ranks == b // lv.ranks:
                return i
        return len(self.levels) - 1

    def latency(self, a: int, b: int) -> float:
        return self.levels[self.level_of(a, b)].latency_s

    def span(self, nranks: int) -> int:
        """Index of the smallest level holding ``nranks`` ranks (the levels a call uses)."""
        for i, lv in enumerate(self.levels):
            if nranks <= lv.ranks:
                return i
        return len(self.levels) - 1

    @property
    def key(self) -> tuple:
        """What estimates depend on (everything but the name and source)."""
        return (self.port_gbps, self.levels, self.multicast, self.innet, self.msg_overhead_s,
                self.reduce_gbps, self.host_gbps, self.cores, self.mcast_pacing,
                self.min_chunk_nbytes)

    @property
    def scales(self) -> tuple[float, float]:
        return self.latency_scale, self.bandwidth_scale

    def describe(self) -> str:
        parts = [f"port {self.port_gbps:g} Gbit/s"]
        for lv in self.levels:
            up = (f", {lv.uplinks} x {lv.uplink_gbps:g} Gbit/s up" if lv.uplinks else "")
            size = "all" if lv.ranks >= TOP else str(lv.ranks)
            parts.append(f"{lv.name} ({size} ranks, {lv.latency_s * 1e6:.2f} us{up})")
        caps = [c for c, ok in (("multicast", self.multicast), ("in-network reduction",
                                                                  self.innet),
                                ("symmetric memory", self.symm)) if ok]
        if self.msg_overhead_s:
            parts.append(f"{self.msg_overhead_s * 1e6:.1f} us per message")
        return (f"{self.name}: " + "; ".join(parts)
                + (f"; {', '.join(caps)}" if caps else "") + f" [{self.source}]")

    def with_(self, **changes) -> "Fabric":
        return replace(self, **changes)


TOP = 1 << 40           # group size of the outermost level: every rank


@dataclass(frozen=True)
class CommShape:
    """The communicator as the planner sees it: what every rank shares."""

    nranks: int
    ranks_per_host: int = 1

    def __post_init__(self):
        if not isinstance(self.nranks, int) or self.nranks < 1:
            raise InvalidArgument(f"nranks must be a positive integer, got {self.nranks!r}")
        if (not isinstance(self.ranks_per_host, int) or self.ranks_per_host < 1
                or self.nranks % self.ranks_per_host):
            raise InvalidArgument(f"ranks_per_host must divide nranks {self.nranks}, got "
                                  f"{self.ranks_per_host!r}")

    @property
    def hosts(self) -> int:
        return self.nranks // self.ranks_per_host

    @property
    def single_host(self) -> bool:
        return self.hosts == 1

    def __str__(self) -> str:
        if self.ranks_per_host > 1:
            return f"{self.nranks} ranks ({self.hosts} hosts x {self.ranks_per_host})"
        return f"{self.nranks} ranks"


# -- fabrics of the simulator ---------------------------------------------------------------

def from_topology(topo, name: str | None = None) -> Fabric:
    """The fabric of a simulated topology: every level's group size, uplinks and rates, and
    the latency of a message between rank 0 and the first rank of each level, read from the
    topology's own routes (so link and switch latencies are exactly the simulator's)."""
    P = topo.nranks
    # Rates are payload rates: a link carries headers too (sim/framing.py).
    good = topo.framing.goodput()
    port_bw = (topo.link_bw[topo.up[0][0]] if topo.up[0] else topo.host_link_bw) * good
    levels: list[Level] = []
    node, prev, nswitch = 0, 1, 0
    names = _LEVEL_NAMES.get(topo.kind, ())
    while True:
        ups = topo.up[node]
        if not ups:
            break
        parent = topo.link_dst[ups[0]]
        lo, hi = topo.node_lo[parent], topo.node_hi[parent]
        top = lo <= 0 and hi >= P
        # Every node covering exactly this range is part of the group (a pod's aggs).
        peers = [v for v in range(P, len(topo.node_kind))
                 if topo.node_lo[v] == lo and topo.node_hi[v] == hi]
        uplinks = [] if top else [l for v in peers for l in topo.up[v]]
        lat = float(topo.route(0, prev)[1]) if prev < P else 0.0
        if topo.node_kind[parent] == "host":
            label = "host"
        else:
            label = names[nswitch] if nswitch < len(names) else f"level{nswitch}"
            nswitch += 1
        levels.append(Level(label, TOP if top else hi - lo, lat, len(uplinks),
                            float(topo.link_bw[uplinks[0]] * good * 8 / 1e9)
                            if uplinks else 0.0))
        if top:
            break
        node, prev = parent, hi - lo
    if not levels:                      # one rank: nothing to cross
        levels.append(Level("fabric", TOP, 0.0))
    scales, source = _modelled_calibration(topo.description)
    return Fabric(name or topo.description, float(port_bw * 8 / 1e9), tuple(levels),
                  multicast=True, innet=True, symm=False, source=source,
                  latency_scale=scales[0], bandwidth_scale=scales[1])


def _modelled_calibration(description: str) -> tuple[tuple[float, float], str]:
    """The scales ``polycast tune --calibrate --topology`` fitted for this kind of
    fabric, if the profile has them."""
    from . import profile
    prof = profile.load()
    entry = (prof or {}).get("modelled", {}).get(description)
    if not entry:
        return (1.0, 1.0), "simulated topology"
    return ((float(entry["latency_scale"]), float(entry["bandwidth_scale"])),
            f"simulated topology, calibrated {prof.get('created', '?')}")


_LEVEL_NAMES = {"fattree": ("leaf", "pod", "core"), "leafspine": ("leaf", "spine"),
                "switch": ("switch",)}


def modelled(topology: str, nranks: int, link=None) -> Fabric:
    """The fabric of a ``--topology`` string (as ``polycast sim`` reads it) at ``nranks``."""
    from ..sim.topology import parse_topology
    topo = parse_topology(topology, nranks, link=link)
    return from_topology(topo, f"{topology} @ {nranks}")
