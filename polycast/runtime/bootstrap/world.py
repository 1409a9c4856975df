"""Bootstrap: from the environment to connected peers.

1. The master rank serves the rendezvous store (:mod:`polycast.runtime.bootstrap.store`).
2. Every rank listens on a TCP port and publishes ``host:port`` and its host id.
3. Rank r connects to every lower rank and accepts every higher one (a hello frame names
   the rank and job), so each pair has exactly one TCP connection.
4. Peers on the same host (unless POLYCAST_TRANSPORT=tcp) also get a pair of shared-memory
   rings when both can run them (runtime/shm.rings_unavailable_reason); the TCP connection then only carries doorbells and detects a dead peer.
5. A final store barrier; the master then closes the store (later communicators are made
   with collectives, not the store).

A caller that already runs a key-value store (torch.distributed hands its backends one)
passes it as ``connect(..., store=...)``: steps 2-5 then go through it, nothing listens
on the master port, and the store is left open (see :class:`KeyValueStore`).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Protocol

from ... import debug
from ...config import Config, current
from ...errors import CollectiveTimeout, PolycastError
from ..transport import cma, native
from ..transport.shm import Ring, ring_path, rings_unavailable_reason
from ..transport.tcp import TcpLink
from . import auth
from .env import JobEnv, host_id
from .store import PortInUse, StoreClient, StoreServer

_HELLO = struct.Struct("!4sI")
_MAGIC = b"PCst"


@dataclass
class Peer:
    rank: int
    tcp: TcpLink
    ring_in: Ring | None = None       # this peer -> us
    ring_out: Ring | None = None      # us -> this peer
    same_host: bool = False
    pid: int = 0                      # its process id (meaningful on the same host)

    @property
    def transport(self) -> str:
        return "shm" if self.ring_out is not None else "tcp"


@dataclass
class World:
    rank: int
    size: int
    job_id: str
    single_host: bool
    timeout_seconds: float
    peers: dict[int, Peer] = field(default_factory=dict)
    local_rank: int = 0
    # The key of every message and datagram (runtime/bootstrap/auth.py), None without POLYCAST_SECRET.
    key: bytes | None = field(default=None, repr=False)
    # Ranks whose rings we read but whose memory we may not read directly, and why
    # (runtime/transport/cma.py); the others send large payloads single-copy.
    single_copy_refused: dict[int, str] = field(default_factory=dict)


class KeyValueStore(Protocol):
    """What the bootstrap needs of a rendezvous store (:class:`StoreClient` is one).
    Every call is bounded; ``wait`` raises CollectiveTimeout when the key does not come."""

    def set(self, key: str, value: bytes | str) -> None: ...
    def wait(self, key: str, timeout: float | None = None) -> bytes: ...
    def add(self, key: str, amount: int = 1) -> int: ...


def _local_ip_towards(addr: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _peer_pid(theirs: dict, mine: dict) -> int:
    """The peer's pid if it means the same process here (same host, same pid namespace:
    diagnostics look it up in /proc), else 0."""
    if theirs.get("host") != mine["host"] or not mine["pidns"] or \
            theirs.get("pidns") != mine["pidns"]:
        return 0
    return int(theirs.get("pid", 0))


def _offer_single_copy(world: World, rings_in: dict, info: dict, me: dict,
                       secret: bytes | None, cfg: Config) -> None:
    """Probe, per ring we read, whether we can read its writer's memory
    (runtime/transport/cma.py) and tell the writer through the ring; say what was decided at
    POLYCAST_DEBUG=INFO."""
    off = cma.disabled_reason(secret, cfg.hooks.cma)
    refused = {}
    for r, ring in rings_in.items():
        why = off or cma.probe(_peer_pid(info[r], me), info[r].get("cma"))
        ring.set_cma_verdict(why is None)
        if why is not None:
            refused[r] = why
    world.single_copy_refused = refused
    if cfg.debug_level >= debug.INFO and rings_in:
        debug.info(world.rank, native.describe(cfg.hooks))
        ok = sorted(set(rings_in) - set(refused))
        msg = f"single-copy (CMA) reads from ranks {ok}" if ok else "single-copy (CMA) off"
        if refused:
            msg += "; shm rings for " + "; ".join(f"rank {r}: {why}"
                                                 for r, why in sorted(refused.items()))
        debug.info(world.rank, msg)


def _barrier(store: StoreClient, name: str, size: int, timeout: float) -> None:
    # The last to arrive releases the others and does not wait itself: the master may
    # close the store as soon as it is through the final barrier.
    if store.add(f"barrier/{name}", 1) == size:
        store.set(f"barrier/{name}/done", b"1")
    else:
        store.wait(f"barrier/{name}/done", timeout)


def connect(env: JobEnv, cfg: Config | None = None,
            store: KeyValueStore | None = None) -> World:
    """Rendezvous and connect every pair of ranks under the settings ``cfg`` (transport,
    ring size, secret...; default: :func:`polycast.config.current`); bounded by
    ``env.timeout_seconds``. ``store``: rendezvous through this store (its keys must be
    private to this group of ranks) instead of serving one at
    ``env.master_addr:master_port``."""
    cfg = cfg if cfg is not None else current(rank=env.rank)
    choice = cfg.transport
    timeout = env.timeout_seconds
    deadline = time.monotonic() + timeout
    ring_nbytes = cfg.shm_ring_nbytes
    use_native = native.in_use(cfg.hooks)
    secret = auth.secret_key(cfg.secret)
    server = None
    own_store = store is None
    if own_store and env.rank == 0:
        bind = env.master_addr if env.master_addr.startswith("127.") else "0.0.0.0"
        server = StoreServer(bind, env.master_port, secret)
    listener = None
    try:
        if own_store:
            store = StoreClient(env.master_addr, env.master_port, timeout, secret)
        if env.rank == 0:
            # Unique per start, even when the launcher reuses ids (torchrun's default run id
            # is "none"): two jobs never share a multicast group or shared-memory names,
            # and keys of an earlier run with the same secret never verify in this one.
            store.set("job_id", (env.job_id + "-" if env.job_id else "")
                      + secrets.token_hex(6))
        job_id = store.wait("job_id", timeout).decode()
        key = auth.job_key(secret, job_id)
        loopback = env.single_host and env.master_addr.startswith("127.")
        my_ip = "127.0.0.1" if loopback else _local_ip_towards(env.master_addr)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((my_ip if loopback else "0.0.0.0", 0))
        listener.listen(max(16, env.size))
        # Rings are used between two ranks of a host only when both can run them (a CPU
        # without x86's store order runs only the compiled rings: runtime/transport/native.py).
        rings_why = None if choice == "tcp" else rings_unavailable_reason(use_native)
        me = {"addr": my_ip, "port": listener.getsockname()[1], "host": host_id(cfg.host_id),
              "pid": os.getpid(), "pidns": _pid_namespace(), "cma": cma.probe_info(),
              "rings": choice != "tcp" and rings_why is None}
        store.set(f"rank/{env.rank}", json.dumps(me))
        info = {}
        for r in range(env.size):
            info[r] = json.loads(store.wait(f"rank/{r}", max(0.1, deadline - time.monotonic())))
        world = World(env.rank, env.size, job_id,
                      len({i["host"] for i in info.values()}) == 1, timeout,
                      local_rank=env.local_rank, key=key)
        socks = _connect_pairs(env.rank, env.size, info, listener,
                               auth.derive(key, "pairs", job_id), deadline)
        use_shm = me["rings"]
        if choice == "shm" and rings_why is not None:
            raise PolycastError(f"POLYCAST_TRANSPORT=shm is not possible: {rings_why}")
        same = {r for r in range(env.size)
                if r != env.rank and info[r]["host"] == me["host"]}
        if choice == "shm" and same != set(range(env.size)) - {env.rank}:
            raise PolycastError("POLYCAST_TRANSPORT=shm needs every rank on one host; ranks "
                                f"{sorted(set(range(env.size)) - same - {env.rank})} are not")
        ringed = {r for r in same if info[r].get("rings")} if use_shm else set()
        if choice == "shm" and ringed != same:
            raise PolycastError("POLYCAST_TRANSPORT=shm is not possible: ranks "
                                f"{sorted(same - ringed)} cannot run the shm rings")
        rings_in: dict[int, Ring] = {}
        if use_shm:
            for r in ringed:
                path = ring_path(job_id, r, env.rank)
                rings_in[r] = Ring.create(path, ring_nbytes, use_native)
            _offer_single_copy(world, rings_in, info, me, secret, cfg)
        _barrier(store, "rings-made", env.size, max(0.1, deadline - time.monotonic()))
        rings_out: dict[int, Ring] = {}
        if use_shm:
            for r in ringed:
                rings_out[r] = Ring.attach(ring_path(job_id, env.rank, r), ring_nbytes,
                                           use_native)
        _barrier(store, "rings-mapped", env.size, max(0.1, deadline - time.monotonic()))
        for ring in rings_in.values():
            ring.unlink()          # both sides have it mapped: nothing can leak now
        for r, sock in socks.items():
            world.peers[r] = Peer(r, TcpLink(sock, r), rings_in.get(r), rings_out.get(r),
                                  r in same, _peer_pid(info[r], me))
        _barrier(store, "connected", env.size, max(0.1, deadline - time.monotonic()))
        if not own_store:
            return world            # the caller's store outlives us: nothing to close
        # The master closes the store only once every rank said it is done with it (a
        # rank still waiting for a barrier reply must not find the store gone).
        if env.rank != 0:
            store.set(f"done/{env.rank}", b"1")
        else:
            for r in range(1, env.size):
                store.wait(f"done/{r}", max(0.1, deadline - time.monotonic()))
        store.close()
        return world
    except (socket.timeout, TimeoutError) as exc:
        raise CollectiveTimeout(f"rank {env.rank}: rendezvous did not finish within "
                                f"{timeout:g} s ({exc})") from None
    finally:
        if listener is not None:
            listener.close()
        if server is not None:
            server.close()


def _connect_pairs(rank: int, size: int, info: dict, listener: socket.socket, key: bytes,
                   deadline: float) -> dict[int, socket.socket]:
    """One TCP connection per pair: rank r connects to every lower rank and accepts every
    higher one. Each starts with the challenge-response of runtime/bootstrap/auth.py under ``key``
    (the job's, derived from the secret; public values without one), then a hello naming
    the connecting rank, so a stray or hostile connection is refused and counted."""
    socks: dict[int, socket.socket] = {}
    for r in range(rank):
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollectiveTimeout(f"rank {rank}: could not connect to rank {r} in time")
        s = socket.create_connection((info[r]["addr"], info[r]["port"]), timeout=left)
        try:
            auth.connect_handshake(s, key, _HELLO.pack(_MAGIC, r))
        except (auth.AuthenticationFailed, OSError) as exc:
            s.close()
            raise auth.AuthenticationFailed(
                f"rank {rank}: rank {r} refused the connection or could not prove it is "
                f"part of this job ({auth.ENV} must be the same on every rank): "
                f"{exc}") from None
        s.sendall(_HELLO.pack(_MAGIC, rank))
        socks[r] = s
    refused = 0
    while len(socks) < size - 1:
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(range(size)) - set(socks) - {rank})
            raise CollectiveTimeout(f"rank {rank}: ranks {missing} did not connect in time"
                                    + (f" ({refused} connection(s) refused: wrong or no "
                                       f"{auth.ENV})" if refused else ""))
        listener.settimeout(left)
        s, _ = listener.accept()
        s.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
        try:
            auth.accept_handshake(s, key, _HELLO.pack(_MAGIC, rank))
            data = auth.recv_exact(s, _HELLO.size)
        except (auth.AuthenticationFailed, OSError):
            refused += 1
            s.close()       # a stray connection (another job, a port scanner, a forger)
            continue
        magic, peer = _HELLO.unpack(data)
        if magic != _MAGIC or not rank < peer < size or peer in socks:
            refused += 1
            s.close()
            continue
        socks[peer] = s
    return socks


__all__ = ["World", "Peer", "connect", "KeyValueStore", "PortInUse"]
