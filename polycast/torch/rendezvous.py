"""A process group's polycast communicator, connected through the store torch hands us.

torch.distributed gives a backend's creator a key-value store private to the group (a
``PrefixStore`` over the job's store: under torchrun the agent's TCPStore at
MASTER_ADDR:MASTER_PORT). polycast's bootstrap (:func:`polycast.runtime.world.connect`)
runs through it, so a process group needs no second port; the ranks then talk over shared
memory on one host and TCP across hosts, and get symmetric memory and multicast exactly
as ``polycast.init()``'s communicator does, because the group *is* such a communicator.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from ..errors import CollectiveTimeout, PolycastError
from ..runtime.env import JobEnv

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class TorchStore:
    """torch's ``Store`` seen as polycast's :class:`~polycast.runtime.world.KeyValueStore`."""

    def __init__(self, store: "dist.Store", timeout_seconds: float) -> None:
        self._store = store
        self.timeout_seconds = timeout_seconds

    def set(self, key: str, value: bytes | str) -> None:
        self._store.set(key, value)

    def wait(self, key: str, timeout: float | None = None) -> bytes:
        seconds = self.timeout_seconds if timeout is None else timeout
        try:
            self._store.wait([key], datetime.timedelta(seconds=seconds))
        except dist.DistStoreError as exc:
            raise CollectiveTimeout(f"rendezvous: key {key!r} not in torch's store within "
                                    f"{seconds:g} s (a rank did not arrive?): {exc}") from None
        return self._store.get(key)

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._store.add(key, int(amount)))


def _store_host(store) -> str | None:
    """The address of the TCPStore under a chain of PrefixStores (None if there is none)."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def job_for(store, rank: int, size: int, timeout_seconds: float) -> JobEnv:
    """Where this rank sits, for the bootstrap: the store's host decides which address the
    rank listens on (loopback when the store is on this host's loopback)."""
    host = _store_host(store) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if host == "localhost" or host == "::1":
        host = "127.0.0.1"
    local = host in _LOOPBACK or host.startswith("127.")
    return JobEnv(rank=rank, size=size, local_rank=rank if local else 0,
                  local_size=size if local else 1, master_addr=host, master_port=0,
                  launcher="torch", job_id="", timeout_seconds=timeout_seconds)


def open_comm(store, rank: int, size: int, timeout_seconds: float):
    """Connect the group's ranks through ``store`` and return their polycast ``Comm``
    (its own progress thread and connections; closed by :func:`close_comm`)."""
    from ..comm import Comm
    from ..engine.engine import EngineConfig
    from ..runtime.driver import Driver
    from ..runtime.mcast import datagram_payload_nbytes
    from ..runtime.world import connect
    job = job_for(store, rank, size, timeout_seconds)
    world = connect(job, store=TorchStore(store, timeout_seconds))
    # The engine configuration polycast.init() builds (secret, MTU, pacing).
    secret = os.environ.get("POLYCAST_SECRET")
    mtu = int(os.environ.get("POLYCAST_MTU", 0) or datagram_payload_nbytes(
        world.job_id, world.single_host, secret.encode() if secret else None))
    pace = (float(os.environ["POLYCAST_PACING_GBPS"])
            if os.environ.get("POLYCAST_PACING_GBPS") else None)
    config = EngineConfig(mtu_nbytes=mtu, pacing_gbps=pace, op_timeout_s=timeout_seconds,
                          secret=secret.encode() if secret else None)
    driver = Driver(world, config)
    try:
        err = driver.add_comm(0, list(range(size)))
    except PolycastError:
        driver.close()
        raise
    return Comm(driver, 0, list(range(size)), timeout_seconds, err)


def close_comm(comm) -> None:
    """Free the communicator's symmetric memory and stop its progress thread."""
    from ..runtime import symm
    if comm._freed:
        return
    comm._freed = True
    symm.free(comm)
    comm._driver.close()
