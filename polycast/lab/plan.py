"""What a lab is made of: a pure description, computed before anything is built.

A lab is a leaf-spine cluster emulated with network namespaces on one Linux machine::

    <name>-h0 .. <name>-h3        <name>-h4 .. <name>-h7        hosts: eth0 10.77.0.(k+1)/24
        |  |  |  |                    |  |  |  |                 host links (host-leaf)
     [br0 in <name>-leaf0]         [br0 in <name>-leaf1]         leaves: a bridge each
              \\ up                     / up                     uplinks (leaf-spine)
               [br0 in <name>-spine]                             the spine: a bridge

One leaf means no spine (a flat LAN on one bridge). Every link is a veth pair, shaped in
each direction by ``tbf`` at its sender's end (the host's eth0, the leaf's host port, the
leaf's uplink port, the spine's leaf port), so the egress queue of a switch port is a real,
bounded buffer (``buffer_s`` of the link's rate: beyond it the kernel drops, as a switch
does). The bridges flood multicast (IGMP snooping off: no querier needed, every host gets
every group, as a switch without snooping does), so a datagram crosses each link of its
tree once. There is one spine (several would make loops that need spanning tree);
oversubscription is the uplink's rate against a leaf's host links. Host links may be left
unshaped while the uplinks are shaped (``--link none --uplink 1Gbps``): hosts then send as
fast as their CPUs go and only the uplink limits traffic between leaves.

:class:`LabPlan` holds the shape and names; :meth:`LabPlan.links` lists every directed link
with where it is shaped and where its byte counter is read; :meth:`LabPlan.sim_topology`
builds the simulator's topology of the same shape and rates, with the same placement of
hosts under leaves. Nothing here touches the machine (see :mod:`polycast.lab.netns`).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from ..errors import InvalidArgument
from ..units import parse_rate

SUBNET = "10.77.0"                   # host k is SUBNET.(k+1)/24, inside the lab only
HOST_IFNAME = "eth0"                 # every host's one interface (its link to the leaf)
MAX_HOSTS = 250
DEFAULT_NAME = "pclab"
DEFAULT_MTU = 9000
DEFAULT_BUFFER_S = 0.05              # tbf latency: the egress queue holds 50 ms at the rate
_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")


@dataclass(frozen=True)
class Link:
    """One direction of a cable: ``src`` sends to ``dst``.

    Shaped by tbf on ``(shape_ns, shape_dev)`` (the sender's end). Its bytes are read from
    the kernel's counters of ``(count_ns, count_dev)``, ``count_dir`` ("tx" or "rx") — for
    every link a leaf's end, so that one ``ip -s link`` per leaf reads them all."""
    src: str
    dst: str
    layer: str                       # "host-leaf" or "leaf-spine", as the simulator names them
    rate_bps: float | None           # bits/s; None: not shaped
    shape_ns: str
    shape_dev: str
    count_ns: str
    count_dev: str
    count_dir: str

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"


@dataclass(frozen=True)
class LabPlan:
    name: str = DEFAULT_NAME
    hosts: int = 8
    leaves: int = 2
    link_bps: float | None = 1e9     # host link, bits/s each way (None: unshaped)
    uplink_bps: float | None = None  # leaf uplink, bits/s each way (None: 1:1 with the hosts)
    mtu: int = DEFAULT_MTU
    buffer_s: float = DEFAULT_BUFFER_S
    mcast_route: bool = True         # hosts route 224.0.0.0/4 via eth0 (tests try without)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def parse(cls, name: str = DEFAULT_NAME, hosts: int = 8, leaves: int = 2,
              link: str | float | None = "1Gbps", uplink: str | float | None = None,
              mtu: int | str = DEFAULT_MTU, buffer: str | float | None = None) -> "LabPlan":
        """A plan from user input (rates like ``1Gbps``, ``200Mbit/s``; ``uplink`` may be a
        rate or an oversubscription ``4:1``); raises :class:`InvalidArgument` naming what
        is wrong."""
        link_bps = None if link in (None, "", "none") else _rate("--link", link)
        if isinstance(uplink, str) and ":" in uplink:
            if link_bps is None:
                raise InvalidArgument(f"--uplink {uplink}: an oversubscription needs a --link "
                                      "rate; with unshaped host links give the uplink a rate, "
                                      "e.g. --uplink 1Gbps")
            ratio = _oversub(uplink)
            per_leaf = _hosts_per_leaf(_int("--hosts", hosts), _int("--leaves", leaves))
            uplink_bps = link_bps * per_leaf / ratio
        else:
            uplink_bps = None if uplink in (None, "") else _rate("--uplink", uplink)
        try:
            mtu_v = int(mtu)
        except (TypeError, ValueError):
            raise InvalidArgument(f"--mtu {mtu!r}: give a whole number of bytes, e.g. 9000") from None
        if buffer is None:
            buf = DEFAULT_BUFFER_S
        else:
            from ..sim.topology import parse_seconds
            buf = parse_seconds(buffer)
        plan = cls(name=name, hosts=_int("--hosts", hosts), leaves=_int("--leaves", leaves),
                   link_bps=link_bps, uplink_bps=uplink_bps, mtu=mtu_v, buffer_s=buf)
        plan.validate()
        return plan

    def validate(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidArgument(f"lab name {self.name!r}: 1-16 lower-case letters and digits, "
                                  "starting with a letter (it prefixes every namespace)")
        if not isinstance(self.hosts, int) or not 1 <= self.hosts <= MAX_HOSTS:
            raise InvalidArgument(f"--hosts {self.hosts!r}: 1..{MAX_HOSTS}")
        if not isinstance(self.leaves, int) or not 1 <= self.leaves <= self.hosts:
            raise InvalidArgument(f"--leaves {self.leaves!r}: 1..hosts ({self.hosts})")
        _hosts_per_leaf(self.hosts, self.leaves)
        if self.uplink_bps is not None and self.leaves == 1:
            raise InvalidArgument("--uplink needs --leaves >= 2 (one leaf has no uplink)")
        for what, v in (("--link", self.link_bps), ("--uplink", self.uplink_bps)):
            if v is not None and not (1e5 <= v <= 1e11):
                raise InvalidArgument(f"{what} {v:g} bit/s: use 100Kbps..100Gbps")
        if not isinstance(self.mtu, int) or not 576 <= self.mtu <= 65535:
            raise InvalidArgument(f"--mtu {self.mtu!r}: 576..65535 bytes")
        if not 0.001 <= self.buffer_s <= 10:
            raise InvalidArgument(f"--buffer {self.buffer_s!r} s: 1ms..10s of the link's rate")

    # -- derived -------------------------------------------------------------------------
    @property
    def hosts_per_leaf(self) -> int:
        return _hosts_per_leaf(self.hosts, self.leaves)

    @property
    def uplink_rate_bps(self) -> float | None:
        """The uplink's rate: as set, else 1:1 with a leaf's host links (None: unshaped —
        one leaf, or unshaped host links and no uplink rate)."""
        if self.leaves == 1:
            return None
        if self.uplink_bps is not None:
            return self.uplink_bps
        return None if self.link_bps is None else self.link_bps * self.hosts_per_leaf

    @property
    def shaped(self) -> bool:
        """Some link is shaped by tbf (host links, uplinks or both)."""
        return self.link_bps is not None or self.uplink_rate_bps is not None

    @property
    def oversub(self) -> float:
        """A leaf's host bandwidth over its uplink bandwidth (1.0: non-blocking; ``inf``
        with unshaped host links and a shaped uplink: the hosts can send as fast as their
        CPUs let them, so only the uplink is a bottleneck)."""
        up = self.uplink_rate_bps
        if up is None:
            return 1.0
        if self.link_bps is None:
            return math.inf
        return self.link_bps * self.hosts_per_leaf / up

    def host_ns(self, k: int) -> str:
        return f"{self.name}-h{k}"

    def leaf_ns(self, i: int) -> str:
        return f"{self.name}-leaf{i}"

    @property
    def spine_ns(self) -> str:
        return f"{self.name}-spine"

    def leaf_of(self, k: int) -> int:
        return k // self.hosts_per_leaf

    @staticmethod
    def addr(k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def namespaces(self) -> list[str]:
        """Every namespace of the lab, in build order (switches first)."""
        out = [self.spine_ns] if self.leaves > 1 else []
        out += [self.leaf_ns(i) for i in range(self.leaves)]
        out += [self.host_ns(k) for k in range(self.hosts)]
        return out

    def links(self) -> list[Link]:
        """Every directed link: per host up and down, per leaf up and down."""
        out = []
        for k in range(self.hosts):
            h, leaf = f"h{k}", f"leaf{self.leaf_of(k)}"
            lns = self.leaf_ns(self.leaf_of(k))
            out.append(Link(h, leaf, "host-leaf", self.link_bps, self.host_ns(k), HOST_IFNAME,
                            lns, h, "rx"))
            out.append(Link(leaf, h, "host-leaf", self.link_bps, lns, h, lns, h, "tx"))
        if self.leaves > 1:
            up = self.uplink_rate_bps
            for i in range(self.leaves):
                lns, leaf = self.leaf_ns(i), f"leaf{i}"
                out.append(Link(leaf, "spine", "leaf-spine", up, lns, "uplink", lns, "uplink", "tx"))
                out.append(Link("spine", leaf, "leaf-spine", up, self.spine_ns, leaf,
                                lns, "uplink", "rx"))
        return out

    def describe(self) -> str:
        def r(bps):
            return "unshaped" if bps is None else _rate_text(bps)
        text = (f"lab {self.name}: {self.hosts} hosts, {self.leaves} "
                f"{'leaf' if self.leaves == 1 else 'leaves'} ({self.hosts_per_leaf} hosts each), "
                f"host links {r(self.link_bps)}")
        if self.leaves > 1 and self.link_bps is None and self.uplink_rate_bps is not None:
            text += f", uplinks {r(self.uplink_rate_bps)} (the only shaped links)"
        elif self.leaves > 1:
            text += f", uplinks {r(self.uplink_rate_bps)} ({self.oversub:g}:1)"
        return text + f", MTU {self.mtu}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "LabPlan":
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})

    # -- the simulator's view --------------------------------------------------------------
    def sim_topology(self, latency_s: float = 0.0, switch_latency_s: float = 0.0,
                     ranks_per_host: int = 1, intra_host_bps: float | None = None,
                     link_bps: float | None = None):
        """The simulator's :class:`~polycast.sim.topology.Topology` of this lab: host k
        holds rank slots ``k*R .. k*R+R-1`` (``R = ranks_per_host``; with R > 1 they are
        joined by ``intra_host_bps`` links through a host node, the lab's shared-memory
        rings), the same leaves, one spine with one uplink per leaf at the uplink rate,
        link rates equal to the shaped rates, carrying frames of the lab's MTU (Ethernet,
        IPv4, TCP or UDP headers: the simulator's ``tcp`` framing). ``link_bps`` stands in
        for unshaped host links (a rate the hosts' CPUs sustain, measured by the caller)."""
        from ..sim.framing import make_framing
        from ..sim.topology import Topology
        host_bps = self.link_bps if self.link_bps is not None else link_bps
        if host_bps is None:
            raise InvalidArgument("the lab's host links are unshaped: give the simulator a "
                                  "host link rate (link_bps) or build the lab with --link")
        R = ranks_per_host
        if not isinstance(R, int) or R < 1:
            raise InvalidArgument(f"ranks_per_host must be a positive integer, got {R!r}")
        if R > 1 and not (intra_host_bps and intra_host_bps > 0):
            raise InvalidArgument("several ranks per host need intra_host_bps > 0 (the rate "
                                  "between ranks of one host)")
        # Ethernet + IPv4 + TCP/UDP at the lab's MTU (tbf counts the Ethernet header, not
        # the preamble, FCS and gap the preset adds: 24 bytes a frame, 0.3 % at MTU 9000)
        topo = Topology("lab", self.hosts * R, self.describe(), switch_latency_s,
                        framing=make_framing("tcp", self.mtu))
        topo.ranks_per_host = R
        for k in range(self.hosts):
            for j in range(R):
                topo.add_node("rank", f"h{k}" if R == 1 else f"h{k}r{j}")
        attach = list(range(self.hosts))
        if R > 1:
            attach = []
            for k in range(self.hosts):
                node = topo.add_node("host", f"h{k}")
                for j in range(R):
                    topo.connect(k * R + j, node, intra_host_bps / 8.0, 0.0, "intra-host")
                attach.append(node)
        leaves = [topo.add_node("switch", f"leaf{i}", switch_latency_s)
                  for i in range(self.leaves)]
        bw = host_bps / 8.0
        topo.host_link_bw = bw
        for k in range(self.hosts):
            topo.connect(attach[k], leaves[self.leaf_of(k)], bw, latency_s, "host-leaf")
        if self.leaves > 1:
            up = self.uplink_rate_bps
            if up is None:                 # unshaped uplinks: 1:1 with the stand-in rate
                up = host_bps * self.hosts_per_leaf
            spine = topo.add_node("switch", "spine", switch_latency_s)
            for leaf in leaves:
                topo.connect(leaf, spine, up / 8.0, latency_s, "leaf-spine")
        return topo.finish()


def _int(what: str, v) -> int:
    try:
        out = int(v)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} {v!r}: give a whole number") from None
    if out != v and str(out) != str(v).strip():
        raise InvalidArgument(f"{what} {v!r}: give a whole number")
    return out


def _rate(what: str, text) -> float:
    try:
        return parse_rate(text)
    except InvalidArgument as e:
        raise InvalidArgument(f"{what}: {e}") from None


def _oversub(text: str) -> float:
    a, _, b = text.partition(":")
    try:
        ratio = float(a) / float(b)
    except (ValueError, ZeroDivisionError):
        ratio = math.nan
    if not (ratio > 0 and math.isfinite(ratio)):
        raise InvalidArgument(f"--uplink {text!r}: an oversubscription is N:M with N, M > 0, "
                              "e.g. 4:1, or give a rate, e.g. 1Gbps")
    return ratio


def _hosts_per_leaf(hosts: int, leaves: int) -> int:
    if leaves < 1 or hosts < 1:
        raise InvalidArgument(f"--hosts {hosts} and --leaves {leaves} must be >= 1")
    per = math.ceil(hosts / leaves)
    if math.ceil(hosts / per) != leaves:
        raise InvalidArgument(f"{hosts} hosts do not fill {leaves} leaves (hosts fill leaves "
                              f"{per} at a time); use --hosts a multiple of --leaves")
    return per


def _rate_text(bps: float) -> str:
    for unit, m in (("Gbps", 1e9), ("Mbps", 1e6), ("Kbps", 1e3)):
        if bps >= m:
            return f"{bps / m:g}{unit}"
    return f"{bps:g}bps"

