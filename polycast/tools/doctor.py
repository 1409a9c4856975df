"""Checks of a machine for polycast (``polycast doctor``): shared memory, multicast on
loopback and on a chosen interface, socket buffer limits, the open-file limit. Each check
returns a :class:`Check` with a status and, when it is not ``ok``, what to change.

Only loopback is probed by default (a join there never leaves the host). A real interface
is inspected (up, MULTICAST flag, address, MTU) without joining a group, unless ``probe``
asks for a join with TTL 0 (nothing is forwarded, but the kernel announces the membership
on that LAN with IGMP).
"""

from __future__ import annotations

import os
import resource
import select
import socket
import time
from dataclasses import asdict, dataclass

from ..config import current
from ..errors import InvalidArgument
from ..runtime.transport import mcast, native

OK, WARN, FAIL = "ok", "warn", "FAIL"
SHM_MIN_FREE_NBYTES = 1 << 30       # a few 64 MiB collectives on 8 ranks, with room
NOFILE_MIN = 4096                   # sockets per peer, shm segments, groups per comm
IFF_UP, IFF_MULTICAST = 0x1, 0x1000


@dataclass
class Check:
    name: str
    status: str                     # ok | warn | FAIL
    found: str                      # what the machine has
    change: str = ""                # what to do about it (empty when ok)

    def as_dict(self) -> dict:
        return asdict(self)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_shm(path: str = "/dev/shm") -> Check:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Check("shared memory", FAIL, f"{path}: {exc}",
                     f"mount a tmpfs on {path} (mount -t tmpfs -o size=8G tmpfs {path})")
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    found = f"{path}: {_gib(free)} free of {_gib(total)}"
    try:
        from multiprocessing import shared_memory
        seg = shared_memory.SharedMemory(create=True, size=1 << 20)
        seg.close()
        seg.unlink()
    except OSError as exc:
        return Check("shared memory", FAIL, f"{found}; cannot create a segment: {exc}",
                     f"make {path} writable for this user")
    if free < SHM_MIN_FREE_NBYTES:
        return Check("shared memory", WARN, found,
                     f"give {path} at least {_gib(SHM_MIN_FREE_NBYTES)} (docker: --shm-size=8g; "
                     f"else mount -o remount,size=8G {path}); large collectives on the "
                     "shared-memory and symmetric-memory paths need buffers per rank there")
    return Check("shared memory", OK, found)


def check_rings() -> Check:
    """Which shm rings run: the compiled helper (runtime/transport/_ring.c) or the Python fallback."""
    if native.ring is not None:
        if not current().hooks.native:
            return Check("shm rings", WARN, "pure Python: the native=0 test hook is set",
                         "unset POLYCAST_TEST_HOOKS to use the compiled rings (~2 us less "
                         "CPU per message on each side)")
        return Check("shm rings", OK, "compiled hot path (polycast.runtime.transport._ring)")
    return Check("shm rings", WARN, f"pure Python: {native.why_not}",
                 "install a C compiler and the Python headers (e.g. apt-get install gcc "
                 "python3-dev), then reinstall polycast (pip install -e .): the compiled "
                 "rings take ~2 us less CPU per message on each side and run on arm64")


def check_sim_network() -> Check:
    """Which network model the simulator runs: compiled (polycast/sim/_network*.c) or Python."""
    from ..sim import network
    if network.compiled is None:
        return Check("sim network model", WARN, f"pure Python: {network.why_not}",
                     "install a C compiler and the Python headers, then reinstall polycast: "
                     "the compiled model makes contended simulations (alltoall, collectives "
                     "at once) several times faster")
    if not current().hooks.sim_native:
        return Check("sim network model", WARN, "pure Python: the sim_native=0 test hook "
                     "is set", "unset POLYCAST_TEST_HOOKS to simulate with the compiled model "
                     "(several times faster where flows contend)")
    return Check("sim network model", OK, "compiled (polycast.sim._network)")


def _if_flags(name: str) -> int | None:
    try:
        with open(f"/sys/class/net/{name}/flags") as fh:
            return int(fh.read(), 16)
    except (OSError, ValueError):
        return None


def _if_mtu(name: str) -> int | None:
    try:
        with open(f"/sys/class/net/{name}/mtu") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def interface_names() -> list[str]:
    return [n for _, n in socket.if_nameindex()]


def probe_multicast(address: str, timeout_s: float = 1.0) -> str | None:
    """Join a private group on the interface with ``address``, send one datagram with TTL
    0, and read it back. Returns None when it came back, else why not."""
    job = f"doctor-{os.getpid()}-{time.monotonic_ns()}"
    try:
        sock, (group, port) = mcast.open_group(job, 0, True, interface=address)
    except mcast.MulticastUnavailable as exc:
        return str(exc)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
        token = os.urandom(16)
        sock.sendto(token, (group, port))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                if sock.recv(64) == token:
                    return None
            except BlockingIOError:
                continue
        return f"a datagram sent to {group}:{port} did not come back within {timeout_s:g} s"
    except OSError as exc:
        return f"sending to {group}:{port} failed: {exc}"
    finally:
        sock.close()


def check_loopback_multicast() -> Check:
    why = probe_multicast("127.0.0.1")
    flags = _if_flags("lo")
    if why:
        fix = "ip route add 239.255.0.0/16 dev lo if routing sends the group elsewhere"
        if flags is not None and not flags & IFF_MULTICAST:
            fix = "ip link set lo multicast on; " + fix
        return Check("multicast on loopback", FAIL, why,
                     fix + "; or choose algorithms that avoid multicast")
    return Check("multicast on loopback", OK, "a datagram to a 239.255.x.x group came back "
                 "(TTL 0)")


def check_interface(name: str, probe: bool = False) -> Check:
    """An interface for multi-host multicast: up, MULTICAST, an IPv4 address, its MTU."""
    label = f"multicast on {name}"
    flags = _if_flags(name)
    addrs = {n: a for n, a in mcast._interfaces()}
    if flags is None:
        return Check(label, FAIL, f"no interface {name!r}",
                     f"choose one of: {', '.join(interface_names())}")
    problems, fixes = [], []
    if not flags & IFF_UP:
        problems.append("down")
        fixes.append(f"ip link set {name} up")
    addr = addrs.get(name)
    if addr is None:
        problems.append("no IPv4 address")
        fixes.append(f"give {name} an IPv4 address (polycast's groups are IPv4)")
    mtu = _if_mtu(name)
    found = f"{name}: {'up' if flags & IFF_UP else 'down'}, " \
            f"{'MULTICAST' if flags & IFF_MULTICAST else 'no MULTICAST'}, " \
            f"address {addr or 'none'}, MTU {mtu}"
    if problems:
        return Check(label, FAIL, found, "; ".join(fixes))
    if probe:
        why = probe_multicast(addr)
        if why:
            return Check(label, FAIL, f"{found}; probe: {why}",
                         "check the interface's multicast route (ip route get 239.255.1.1) "
                         "and firewall rules for UDP to 239.255.0.0/16")
        found += "; a datagram to a group came back (TTL 0)"
    else:
        found += "; not joined (--probe joins a group there)"
        if not flags & IFF_MULTICAST:
            return Check(label, WARN, found, f"ip link set {name} multicast on (a NIC "
                         "without the flag may not join groups; --probe tries)")
    if mtu is not None and mtu < 1500:
        return Check(label, WARN, found, f"an MTU of {mtu} makes small datagrams: more "
                     "per-datagram cost; 9000 (jumbo frames) where the network allows")
    return Check(label, OK, found + f"; POLYCAST_MCAST_IF={addr} selects it")


def _sysctl(name: str) -> int | None:
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_socket_buffers() -> list[Check]:
    out = []
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    for key, want, what in (("net.core.rmem_max", mcast.RCVBUF_NBYTES,
                             "multicast receive buffer"),
                            ("net.core.wmem_max", mcast.SNDBUF_NBYTES,
                             "multicast send buffer")):
        have = _sysctl(key)
        name = key
        if have is None:
            out.append(Check(name, WARN, "unknown (no /proc/sys)",
                             f"check {key} is at least {want}"))
        elif have >= want:
            out.append(Check(name, OK, f"{have} bytes (polycast asks {want} per socket)"))
        elif root and key == "net.core.rmem_max":
            out.append(Check(name, OK, f"{have} bytes; running as root, polycast forces "
                                       f"{want} per socket (SO_RCVBUFFORCE)"))
        else:
            out.append(Check(name, WARN, f"{have} bytes, below the {want} polycast asks for "
                                         f"its {what}",
                             f"sysctl -w {key}={want} (a receiver descheduled for a few ms "
                             "then drops datagrams and pays for recovery)"))
    return out


def check_open_files(need: int = NOFILE_MIN) -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    found = f"soft {soft}, hard {'unlimited' if hard == resource.RLIM_INFINITY else hard}"
    if soft != resource.RLIM_INFINITY and soft < need:
        target = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
        return Check("open files", WARN, found,
                     f"ulimit -n {target} before polycast run (each rank keeps sockets per "
                     f"peer, shared-memory segments and multicast groups: {need} or more)")
    return Check("open files", OK, found)


def run_checks(interface: str | None = None, probe: bool = False) -> list[Check]:
    """Every check; ``interface`` (a name) adds the multi-host multicast check."""
    if interface is not None and interface not in interface_names():
        raise InvalidArgument(f"--iface {interface!r}: no such interface here (have: "
                              f"{', '.join(interface_names())})")
    checks = [check_shm(), check_rings(), check_sim_network(), check_loopback_multicast()]
    if interface is not None:
        checks.append(check_interface(interface, probe))
    checks += check_socket_buffers()
    checks.append(check_open_files())
    return checks

