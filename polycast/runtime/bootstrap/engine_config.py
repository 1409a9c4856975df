"""The engine configuration of a rank, from its explicit arguments and its environment.

One builder for every way a rank's engines are made (``polycast.init`` in-process, and the
offload process on a rank's behalf), so both see the same MTU, pacing, timeout and secret.
"""

from __future__ import annotations

import os
from typing import Mapping

from ...engine.config import EngineConfig
from ...errors import InvalidArgument


def engine_config(world, timeout_s: float, *, mtu_nbytes: int | None = None,
                  pacing_gbps: float | None = None,
                  env: Mapping[str, str] | None = None) -> EngineConfig:
    """For a connected ``world`` (:func:`polycast.runtime.bootstrap.world.connect`): ``mtu_nbytes``
    (else POLYCAST_MTU, else what one datagram of this job's network carries),
    ``pacing_gbps`` (else POLYCAST_PACING_GBPS, else none), ``timeout_s``, and the job's
    key (``world.key``, from POLYCAST_SECRET: the MAC key of every message and datagram)."""
    from ..transport.mcast import datagram_payload_nbytes
    env = os.environ if env is None else env
    key = world.key
    try:
        mtu = mtu_nbytes or int(env.get("POLYCAST_MTU", 0) or 0) or \
            datagram_payload_nbytes(world.job_id, world.single_host, key)
        pace = pacing_gbps if pacing_gbps is not None else \
            (float(env["POLYCAST_PACING_GBPS"]) if env.get("POLYCAST_PACING_GBPS") else None)
    except ValueError as exc:
        raise InvalidArgument(f"POLYCAST_MTU / POLYCAST_PACING_GBPS: {exc}") from None
    config = EngineConfig(mtu_nbytes=mtu, pacing_gbps=pace, op_timeout_s=timeout_s,
                          secret=key)             # per job, from POLYCAST_SECRET
    config.validate()
    return config
