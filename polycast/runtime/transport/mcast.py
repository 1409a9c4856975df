"""UDP multicast sockets for the multicast algorithms.

The group address (in 239.255.0.0/16, the IPv4 organisation-local scope) and the port are
derived from the job id and the communicator id, so two jobs or two communicators never
share a group. On one host the group lives on the loopback interface with TTL 0 (nothing
leaves the host) and IP_MULTICAST_LOOP on (the other ranks are local). On several hosts
the TTL is 1 and the interface is POLYCAST_MCAST_IF (an interface address) or, when unset,
:func:`default_interface`: the one the kernel routes the group through, else the only
non-loopback IPv4 interface that is up.
"""

from __future__ import annotations

import hashlib
import socket
import struct

from ...engine.wire import header_nbytes
from ...errors import PolycastError

RCVBUF_NBYTES = 64 << 20
SNDBUF_NBYTES = 4 << 20
MAX_DATAGRAM_NBYTES = 65507
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


class MulticastUnavailable(PolycastError):
    """The multicast group cannot be set up on this host or network."""


def group_for(job_id: str, comm_id: int, root: int | None = None) -> tuple[str, int]:
    """The communicator's group, or with ``root`` the group of that root's streams only (the
    offload process's receive workers each join the groups of the roots they own)."""
    key = f"{job_id}/{comm_id}" if root is None else f"{job_id}/{comm_id}/root/{root}"
    d = hashlib.blake2b(key.encode(), digest_size=6).digest()
    # Avoid .0 and .255 in the last byte (some stacks treat them oddly) and port < 20000.
    addr = f"239.255.{d[0]}.{1 + d[1] % 254}"
    port = 20000 + int.from_bytes(d[2:4], "big") % 40000
    return addr, port


def _interfaces() -> list[tuple[str, str]]:
    """(name, IPv4 address) of every interface that has one (Linux ioctl; [] elsewhere)."""
    try:
        import fcntl
    except ImportError:
        return []
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915,          # SIOCGIFADDR
                                  struct.pack("256s", name[:15].encode()))
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), 0x8913,   # SIOCGIFFLAGS
                                      struct.pack("256s", name[:15].encode()))[16:18])[0]
            except OSError:
                continue
            if flags & 0x1:                                    # IFF_UP
                out.append((name, socket.inet_ntoa(raw[20:24])))
    return out


def default_interface(group: str, port: int) -> str:
    """The interface address for a multi-host group when POLYCAST_MCAST_IF is unset: the
    source address of the kernel's route to the group (a multicast or default route),
    else the only non-loopback IPv4 interface that is up. Raises MulticastUnavailable
    naming the candidates when neither settles it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((group, port))
            addr = s.getsockname()[0]
            if addr != "0.0.0.0":
                return addr
        except OSError:
            pass
    candidates = [(n, a) for n, a in _interfaces() if not a.startswith("127.")]
    if len(candidates) == 1:
        return candidates[0][1]
    raise MulticastUnavailable(
        f"no route to multicast group {group} and "
        + (f"{len(candidates)} candidate interfaces" if candidates else "no interface")
        + ": set POLYCAST_MCAST_IF to the address of the interface facing the other hosts"
        + (" (one of: " + ", ".join(f"{a} ({n})" for n, a in candidates) + ")"
           if candidates else ""))


def datagram_payload_nbytes(job_id: str, single_host: bool, secret: bytes | None,
                            interface: str | None = None) -> int:
    """The engine's ``mtu_nbytes`` for this job's multicast: large on one host (loopback
    has a 64 KiB MTU), else what fits one frame of the interface facing the other hosts
    (its MTU less the IP and UDP headers and ours), so that one lost IP fragment never
    costs a whole larger datagram."""
    if single_host:
        return 60000
    ours = header_nbytes(secret) + 28                      # + IPv4 (20) and UDP (8)
    try:
        group, port = group_for(job_id, 0)
        addr = interface or default_interface(group, port)
        name = next(n for n, a in _interfaces() if a == addr)
        with open(f"/sys/class/net/{name}/mtu") as fh:
            mtu = int(fh.read())
    except (OSError, StopIteration, ValueError, MulticastUnavailable):
        mtu = 1500                                          # Ethernet's, the common case
    return max(64, min(65000, mtu - ours))


def _interface_for(group: str, port: int, single_host: bool, interface: str | None) -> str:
    """``interface`` (the configuration's POLYCAST_MCAST_IF), else loopback on one host,
    else :func:`default_interface`."""
    return interface or ("127.0.0.1" if single_host else default_interface(group, port))


def open_sender(job_id: str, comm_id: int, root: int, single_host: bool,
                interface: str | None = None) -> tuple[socket.socket, tuple[str, int]]:
    """A non-blocking UDP socket that sends to ``root``'s group of the communicator and
    joins nothing (it would only read its own stream back)."""
    group, port = group_for(job_id, comm_id, root)
    iface = _interface_for(group, port, single_host, interface)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_NBYTES)
        except OSError:
            pass
        _sending_options(sock, iface, single_host)
    except OSError as exc:
        sock.close()
        raise MulticastUnavailable(f"cannot send to multicast group {group}:{port} on "
                                   f"interface {iface}: {exc}") from None
    return sock, (group, port)


def _sending_options(sock: socket.socket, iface: str, single_host: bool) -> None:
    """What a socket that sends to a group needs, joined or not: the interface, loopback
    delivery (ranks of this host are receivers too), TTL 0 on one host (never leaves it),
    1 across hosts, and non-blocking sends."""
    if iface != "0.0.0.0":
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(iface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0 if single_host else 1)
    sock.setblocking(False)


def open_group(job_id: str, comm_id: int, single_host: bool,
               interface: str | None = None,
               root: int | None = None) -> tuple[socket.socket, tuple[str, int]]:
    """A non-blocking UDP socket joined to the communicator's group (or to ``root``'s
    group of it), ready to send to it."""
    group, port = group_for(job_id, comm_id, root)
    iface = _interface_for(group, port, single_host, interface)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        for opt, size in ((socket.SO_RCVBUF, RCVBUF_NBYTES), (socket.SO_SNDBUF, SNDBUF_NBYTES)):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, size)
            except OSError:
                pass
        # Past net.core.rmem_max when allowed (CAP_NET_ADMIN): a receiver descheduled for a
        # few ms must not drop a stream; this changes only this socket, never the system.
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < RCVBUF_NBYTES:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_NBYTES)
            except OSError:
                pass
        # Binding to the group address filters out other groups on the same port.
        sock.bind((group, port))
        mreq = socket.inet_aton(group) + socket.inet_aton(iface)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        _sending_options(sock, iface, single_host)
    except OSError as exc:
        sock.close()
        raise MulticastUnavailable(
            f"cannot join multicast group {group}:{port} on interface {iface}: {exc}; "
            "set POLYCAST_MCAST_IF to a multicast-capable interface address") from None
    return sock, (group, port)


SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
# Offset of the wire header's ``src`` field seen by a UDP socket filter: the filter sees the
# packet from the UDP header (8 bytes); ``src`` is bytes 16..20 of polycast's header.
_SRC_OFFSET = 8 + 16


def drop_own_datagrams(sock: socket.socket, src_rank: int) -> bool:
    """Attach a classic BPF filter that drops datagrams whose header names ``src_rank``
    as the source: with IP_MULTICAST_LOOP on, a root would otherwise receive (and copy)
    its whole stream back. Returns False where filters are unavailable (then the engine
    drops them, counted as own datagrams)."""
    import ctypes

    def ins(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)
    prog = b"".join([
        ins(0x20, 0, 0, _SRC_OFFSET),            # ld [src]      (BPF_LD|BPF_W|BPF_ABS)
        ins(0x15, 0, 1, src_rank & 0xFFFFFFFF),  # jeq #rank     (BPF_JMP|BPF_JEQ|BPF_K)
        ins(0x06, 0, 0, 0),                      # ret #0: drop
        ins(0x06, 0, 0, 0xFFFFFFFF),             # ret #-1: whole datagram
    ])
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = struct.pack("HL", len(prog) // 8, ctypes.addressof(buf))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True
