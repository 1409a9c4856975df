"""Framing: the bytes a link carries beyond the payload, per packet.

A message of ``n`` payload bytes leaves as ``ceil(n / payload_per_packet)`` packets, each
carrying ``overhead_nbytes`` more on the wire than its payload; the simulator's flows move
those wire bytes (``link_bytes`` counts them) and a link of rate B moves payload at its
goodput ``B * payload / (payload + overhead)``.

Presets (``--framing`` or the topology option ``framing=``; ``mtu=`` changes the MTU):

========  ===================================================================  ==========
name      messages (the reliable channel) / datagrams (multicast)               goodput
========  ===================================================================  ==========
``tcp``   Ethernet + IPv4 + TCP (timestamps) / Ethernet + IPv4 + UDP, MTU 9000  99.0 % /
          (the default: polycast's own runtime stack, on jumbo frames)           99.3 %
``udp``   Ethernet + IPv4 + UDP both ways, MTU 9000                             99.3 %
``ib``    InfiniBand RC / UD, 4096-byte MTU                                     99.4 % /
                                                                                99.2 %
``none``  no headers (the ideal link: payload at the full rate)                 100 %
========  ===================================================================  ==========

Ethernet's per-packet cost on the wire is 38 bytes: preamble and start delimiter (8),
header (14), FCS (4) and the inter-frame gap (12); inside the MTU sit IPv4 (20) and TCP
with timestamps (32) or UDP (8). InfiniBand's is the local route header (8), the base
transport header (12), the invariant and variant CRCs (4 + 2), and for UD datagrams the
datagram extended header (8); its MTU is the payload. A datagram larger than a packet's
payload is cut into packets the same way (IP fragmentation carries no UDP header after
the first fragment: the difference, 8 bytes per fragment, is left out).

Not modelled: control messages without payload (tokens, FIN) are latency only, as
before; TCP acknowledgements on the reverse path; the 64-byte minimum Ethernet frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument, UnknownName

ETH_WIRE_NBYTES = 8 + 14 + 4 + 12      # preamble+SFD, header, FCS, inter-frame gap
IPV4_NBYTES, TCP_TS_NBYTES, UDP_NBYTES = 20, 32, 8
IB_RC_NBYTES = 8 + 12 + 4 + 2          # LRH, BTH, ICRC, VCRC
IB_UD_NBYTES = IB_RC_NBYTES + 8        # + DETH


@dataclass(frozen=True)
class Framing:
    """Per-packet payload and overhead for messages and for datagrams (``payload`` 0:
    no framing)."""

    name: str
    mtu_nbytes: int = 0
    message_payload: int = 0           # payload bytes per packet of a message
    message_overhead: int = 0          # wire bytes per packet beyond its payload
    datagram_payload: int = 0
    datagram_overhead: int = 0

    @property
    def ideal(self) -> bool:
        return self.message_overhead == 0 and self.datagram_overhead == 0

    def message_wire(self, nbytes: int) -> int:
        """Wire bytes of a message of ``nbytes`` payload bytes."""
        if not self.message_overhead or nbytes <= 0:
            return nbytes
        return nbytes + -(-nbytes // self.message_payload) * self.message_overhead

    def datagram_wire(self, sizes) -> int:
        """Wire bytes of datagrams of payload ``sizes`` (an int or an array), summed."""
        if not self.datagram_overhead:
            return int(np.sum(sizes))
        s = np.asarray(sizes, dtype=np.int64)
        return int(s.sum() + (-(-s // self.datagram_payload)).sum() * self.datagram_overhead)

    def goodput(self, datagrams: bool = False) -> float:
        """Payload bytes per wire byte of full packets."""
        if datagrams:
            p, o = self.datagram_payload, self.datagram_overhead
        else:
            p, o = self.message_payload, self.message_overhead
        return p / (p + o) if o else 1.0

    def describe(self) -> str:
        if self.ideal:
            return "no framing"
        return f"{self.name} framing, MTU {self.mtu_nbytes}"


def ethernet_tcp(mtu: int = 9000) -> Framing:
    return Framing("tcp", mtu, mtu - IPV4_NBYTES - TCP_TS_NBYTES,
                   ETH_WIRE_NBYTES + IPV4_NBYTES + TCP_TS_NBYTES,
                   mtu - IPV4_NBYTES - UDP_NBYTES, ETH_WIRE_NBYTES + IPV4_NBYTES + UDP_NBYTES)


def ethernet_udp(mtu: int = 9000) -> Framing:
    p, o = mtu - IPV4_NBYTES - UDP_NBYTES, ETH_WIRE_NBYTES + IPV4_NBYTES + UDP_NBYTES
    return Framing("udp", mtu, p, o, p, o)


def infiniband(mtu: int = 4096) -> Framing:
    return Framing("ib", mtu, mtu, IB_RC_NBYTES, mtu, IB_UD_NBYTES)


NO_FRAMING = Framing("none")
PRESETS = {"tcp": (ethernet_tcp, 9000, 576), "udp": (ethernet_udp, 9000, 576),
           "ib": (infiniband, 4096, 256), "none": (None, 0, 0)}
DEFAULT_FRAMING = "tcp"


def make_framing(name: str | Framing | None = None, mtu: int | None = None) -> Framing:
    """A preset by name (default :data:`DEFAULT_FRAMING`), at ``mtu`` bytes if given."""
    if isinstance(name, Framing):
        if mtu is not None and mtu != name.mtu_nbytes:
            return make_framing(name.name, mtu)
        return name
    key = (name or DEFAULT_FRAMING).strip().lower()
    if key not in PRESETS:
        raise UnknownName("framing", name, tuple(PRESETS))
    ctor, default_mtu, min_mtu = PRESETS[key]
    if ctor is None:
        if mtu is not None:
            raise InvalidArgument("framing none has no MTU (drop mtu=)")
        return NO_FRAMING
    mtu = default_mtu if mtu is None else mtu
    if isinstance(mtu, bool) or not isinstance(mtu, int) or mtu < min_mtu or mtu > 65535:
        raise InvalidArgument(f"mtu for {key} framing must be an integer in "
                              f"[{min_mtu}, 65535] bytes, got {mtu!r}")
    return ctor(mtu)
