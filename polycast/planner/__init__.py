"""The planner: collective + size + communicator + fabric -> algorithm, and why.

The layer between the API and the schedules (DESIGN.md). ``auto`` everywhere -- ``Comm``,
the torch backend (through ``Comm``), ``polycast sim --algo auto``, ``polycast bench`` and
``polycast tune`` -- asks :func:`choose`; nothing else picks an algorithm.

>>> from polycast.planner import choose, CommShape, modelled
>>> c = choose("allgather", 64 << 20, CommShape(188), modelled("fattree:radix=32", 188))
>>> c.algorithm, c.nchunks                            # doctest: +SKIP
('mcast', 1)
>>> print(c.explain())                                # doctest: +SKIP
"""

import math

from .choose import SYMM, Choice, candidates, choose, symm_estimate
from .cost import Estimate, estimate
from .fabric import CommShape, Fabric, Level, from_topology, modelled

__all__ = ["Choice", "CommShape", "Estimate", "Fabric", "Level", "SYMM", "candidates",
           "choose", "choose_on_topology", "estimate", "from_topology", "modelled",
           "symm_estimate"]


def choose_on_topology(collective, nbytes: int, topo, root: int = 0, *,
                       host_gbps: float | None = None, host_latency_s: float = 0.0) -> Choice:
    """``auto`` on a simulated topology (``polycast sim --algo auto``, sweeps, the check):
    the communicator is every rank of ``topo``, hosts x ranks per host as it is built;
    ``host_gbps``/``host_latency_s``: the simulator's host model, when it is on."""
    rph = topo.ranks_per_host if topo.nranks % topo.ranks_per_host == 0 else 1
    fab = from_topology(topo)
    if host_gbps is not None or host_latency_s:
        fab = fab.with_(port_gbps=min(fab.port_gbps, host_gbps or math.inf),
                        msg_overhead_s=host_latency_s)
    return choose(collective, nbytes, CommShape(topo.nranks, rph), fab, root=root)
