"""The world communicator: :func:`init` joins the job, :func:`finalize` leaves it."""

from __future__ import annotations

import atexit
import dataclasses
import threading

from .. import config
from ..errors import InvalidArgument
from ..runtime.driver import Driver
from .communicator import Comm

_WORLD: Comm | None = None
_WORLD_LOCK = threading.Lock()


def init(*, rank: int | None = None, size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None,
         timeout: float | None = None, transport: str | None = None, env=None,
         mtu_nbytes: int | None = None, pacing_gbps: float | None = None,
         progress: str | None = None) -> Comm:
    """Join the job and return the world communicator (calling it again returns the same
    one). The job is described by the environment (see :mod:`polycast.runtime.bootstrap.env`:
    polycast run, torchrun, mpiexec, srun), or explicitly by ``rank``, ``size``,
    ``master_addr`` and ``master_port`` (all four; every rank on one host is assumed when the
    address is a loopback one). The settings are read now, once (:mod:`polycast.config`:
    the ``POLYCAST_*`` variables); these arguments take precedence over them:
    ``transport``: "auto", "shm" or "tcp" (else POLYCAST_TRANSPORT); ``timeout``: seconds
    every wait is bounded by (else POLYCAST_TIMEOUT, default 60); ``progress``: "thread"
    (in-process, the default) or "offload" (one process per host carries every local rank's
    communication: :mod:`polycast.runtime.offload`; else POLYCAST_PROGRESS); ``mtu_nbytes``
    and ``pacing_gbps`` (else POLYCAST_MTU, POLYCAST_PACING_GBPS)."""
    global _WORLD
    from ..runtime.bootstrap.env import detect
    with _WORLD_LOCK:
        if _WORLD is not None and not _WORLD._freed:
            return _WORLD
        if timeout is not None and not timeout > 0:
            raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        explicit = (rank, size, master_addr, master_port)
        if any(v is not None for v in explicit):
            if any(v is None for v in explicit):
                raise InvalidArgument("init() with an explicit job needs all of rank, size, "
                                      f"master_addr and master_port; got rank={rank!r}, "
                                      f"size={size!r}, master_addr={master_addr!r}, "
                                      f"master_port={master_port!r}")
            local = master_addr.startswith("127.") or master_addr == "localhost"
            env = {"POLYCAST_RANK": str(rank), "POLYCAST_SIZE": str(size),
                   "POLYCAST_LOCAL_RANK": str(rank if local else 0),
                   "POLYCAST_LOCAL_SIZE": str(size if local else 1),
                   "POLYCAST_MASTER_ADDR": master_addr,
                   "POLYCAST_MASTER_PORT": str(master_port)}
        job = detect(env)
        cfg = config.current(rank=job.rank).replace(
            transport=transport, timeout_seconds=None if timeout is None else float(timeout),
            progress=progress, mtu_nbytes=mtu_nbytes, pacing_gbps=pacing_gbps)
        job = dataclasses.replace(job, timeout_seconds=cfg.timeout_seconds)
        if cfg.progress == "offload":
            from ..runtime.offload.client import attach
            driver = attach(job, cfg)
            _WORLD = Comm(driver, 0, list(range(job.size)), job.timeout_seconds,
                          driver.world_mcast_error, cfg)
        else:
            _WORLD = open_comm(job, cfg)
        atexit.register(finalize)
        return _WORLD


def open_comm(job, cfg: config.Config | None = None, *, store=None) -> Comm:
    """Connect the ranks of ``job`` (a :class:`polycast.runtime.bootstrap.env.JobEnv`) and
    return their communicator, with its own progress thread and connections, under the
    settings ``cfg`` (default: :func:`polycast.config.current`, read now). :func:`init`
    makes the world so; polycast.torch makes one per process group, rendezvousing through
    torch's ``store`` (see :func:`polycast.runtime.bootstrap.world.connect`). Closed by
    :func:`close_comm`."""
    from ..runtime.bootstrap.engine_config import engine_config
    from ..runtime.bootstrap.world import connect
    cfg = cfg if cfg is not None else config.current(rank=job.rank)
    world = connect(job, cfg, store=store)
    driver = Driver(world, engine_config(world, cfg), cfg)
    try:
        err = driver.add_comm(0, list(range(world.size)))
    except BaseException:
        driver.close()
        raise
    return Comm(driver, 0, list(range(world.size)), job.timeout_seconds, err, cfg)


def close_comm(comm: Comm) -> None:
    """Say goodbye to the peers of a communicator :func:`open_comm` made, free its
    symmetric memory and stop its progress thread (each step does nothing the second
    time)."""
    comm._freed = True
    comm._dispatch.free()
    comm._driver.close()


def finalize() -> None:
    """Close the world: say goodbye to the peers and stop the progress thread."""
    global _WORLD
    with _WORLD_LOCK:
        w, _WORLD = _WORLD, None
    if w is not None:
        close_comm(w)


def world() -> Comm:
    if _WORLD is None or _WORLD._freed:
        raise InvalidArgument("polycast.init() has not been called")
    return _WORLD


__all__ = ["Comm", "Request", "IN_PLACE", "UNDEFINED", "init", "finalize", "world",
           "UnknownName"]
