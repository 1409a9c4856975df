"""A process group's polycast communicator, connected through the store torch hands us.

torch.distributed gives a backend's creator a key-value store private to the group (a
``PrefixStore`` over the job's store: under torchrun the agent's TCPStore at
MASTER_ADDR:MASTER_PORT). polycast's bootstrap (:func:`polycast.runtime.bootstrap.world.connect`)
runs through it, so a process group needs no second port; the ranks then talk over shared
memory on one host and TCP across hosts, and get symmetric memory and multicast exactly
as ``polycast.init()``'s communicator does, because the group *is* such a communicator.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from ..errors import CollectiveTimeout
from ..runtime.bootstrap.env import JobEnv

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class TorchStore:
    """torch's ``Store`` seen as polycast's :class:`~polycast.runtime.bootstrap.world.KeyValueStore`."""

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


def open_comm(store, rank: int, size: int, timeout_seconds: float, cfg=None):
    """Connect the group's ranks through ``store`` and return their polycast ``Comm``
    (its own progress thread and connections; closed by ``close_comm``), under the
    settings ``cfg`` (polycast.config; default: read now)."""
    from ..comm.lifecycle import open_comm as _open
    return _open(job_for(store, rank, size, timeout_seconds), cfg,
                 store=TorchStore(store, timeout_seconds))


def bound_store_wait() -> None:
    """Under polycast's launchers (``polycast run``, ``polycast lab run``: POLYCAST_JOB_ID
    is set), torch's ``env://`` and ``tcp://`` rendezvous wait for the job's store at most
    the job's timeout (POLYCAST_TIMEOUT, as every polycast wait), not torch's 30-minute
    default, and a store that cannot be reached is a polycast error naming its address.
    torch has no public hook for this: the two handlers in its registry are wrapped (once;
    jobs torch's own launchers start are left alone)."""
    if not os.environ.get("POLYCAST_JOB_ID"):
        return
    import importlib
    rdzv = importlib.import_module("torch.distributed.rendezvous")  # (dist.rendezvous: a function)
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict):
        return
    for scheme in ("env", "tcp"):
        handler = handlers.get(scheme)
        if handler is not None and not getattr(handler, "polycast_bounded", False):
            handlers[scheme] = _bounded(handler, scheme)


def _bounded(handler, scheme: str):
    from ..runtime.bootstrap.env import timeout_from_env

    def bounded(url: str, timeout: datetime.timedelta | None = None, **kwargs):
        seconds = timeout_from_env()
        if timeout is None or timeout.total_seconds() > seconds:
            timeout = datetime.timedelta(seconds=seconds)
        gen = handler(url, timeout=timeout, **kwargs)
        try:
            first = next(gen)
        except (dist.DistError, RuntimeError) as exc:
            where = (f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
                     if scheme == "env" else url)
            raise CollectiveTimeout(
                f"torch's store at {where} ({scheme}://) not reached within "
                f"{timeout.total_seconds():g} s (POLYCAST_TIMEOUT): {exc}") from exc
        yield first
        yield from gen
    bounded.polycast_bounded = True
    return bounded
