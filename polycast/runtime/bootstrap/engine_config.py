"""The engine configuration of a rank, from its job's settings and its connected world.

One builder for every way a rank's engines are made (``polycast.init`` in-process, and the
offload process on a rank's behalf), so both see the same MTU, pacing, timeout, buffer
bounds and secret.
"""

from __future__ import annotations

import dataclasses

from ...config import Config
from ...engine.config import EngineConfig


def engine_config(world, cfg: Config) -> EngineConfig:
    """For a connected ``world`` (:func:`polycast.runtime.bootstrap.world.connect`) under
    the settings ``cfg``: the MTU (POLYCAST_MTU, else what one datagram of this job's
    network carries), pacing (POLYCAST_PACING_GBPS, else none), the world's timeout, the
    early buffer and eager bounds (POLYCAST_MAX_EARLY_NBYTES, POLYCAST_EAGER_MAX_NBYTES,
    else the engine's) and the job's key (``world.key``, from POLYCAST_SECRET: the MAC key
    of every message and datagram)."""
    from ..transport.mcast import datagram_payload_nbytes
    key = world.key
    mtu = cfg.mtu_nbytes or datagram_payload_nbytes(world.job_id, world.single_host, key,
                                                    cfg.mcast_interface)
    bounds = {name: getattr(cfg, name) for name in ("max_early_nbytes", "eager_max_nbytes")
              if getattr(cfg, name) is not None}
    config = dataclasses.replace(
        EngineConfig(mtu_nbytes=mtu, pacing_gbps=cfg.pacing_gbps,
                     op_timeout_s=world.timeout_seconds, secret=key), **bounds)
    config.validate()
    return config
