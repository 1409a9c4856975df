"""The fabric of a real communicator: this machine's link classes from the calibration
profile (or the built-in model), and what the communicator may use.

Everything here must be the same on every rank of a communicator, since ranks that plan
differently would run different schedules: whether every member is on one host (from the
rendezvous, identical everywhere), the transport, multicast and symmetric memory as the
communicator agreed them, and the profile of the host -- on one host every rank reads the
same file; a communicator spanning hosts uses the built-in model for its network, as
hosts may have been calibrated differently.
"""

from __future__ import annotations

import os

from . import profile as _profile
from .fabric import TOP, Fabric, Level

LOCAL_MIN_CHUNK_NBYTES = 256 << 10     # a Python engine's message costs ~10 us: no finer


def local_fabric(*, single_host: bool, transport: str = "shm", multicast: bool = False,
                 symm: bool = False, prof: dict | None = None, cores: int | None = None
                 ) -> Fabric:
    """This machine as the planner sees it. ``prof``: a loaded profile (None: the
    built-in model)."""
    use = prof if (prof is not None and single_host) else None
    links = dict(_profile.BUILTIN_LINKS)
    source = "built-in model"
    if use is not None:
        links.update(use.get("links", {}))
        source = f"profile {use.get('created', '?')}"
    kind = transport if transport in links else "shm"
    lk = links[kind]
    name = f"this host ({kind})" if single_host else f"hosts over {kind}"
    pacing = (use or {}).get("multicast", _profile.BUILTIN_MULTICAST).get("pacing", 1.0)
    symm_table = (use or {}).get("symm") or _profile.BUILTIN_SYMM
    return Fabric(
        name=name, port_gbps=float(lk["port_gbps"]),
        levels=(Level("host" if single_host else "network", TOP, float(lk["latency_s"])),),
        multicast=multicast, innet=False, symm=symm and single_host,
        msg_overhead_s=float(lk["msg_overhead_s"]),
        host_gbps=float(lk["host_gbps"]) if single_host else float("inf"),
        cores=(cores if cores is not None else (os.cpu_count() or 1)) if single_host else 0,
        mcast_pacing=float(pacing), min_chunk_nbytes=LOCAL_MIN_CHUNK_NBYTES,
        symm_costs=tuple(sorted((c, tuple(sorted((p, tuple(ab)) for p, ab in t.items())))
                                for c, t in symm_table.items())),
        source=source)
