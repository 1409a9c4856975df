"""Which engine schedule a call runs, and how finely it is pipelined: the one place a
communicator chooses (the planner replaces these rules; nothing else in polycast.comm
decides an algorithm).

The ``auto`` tuner for the engine's schedules (rules, first supported one wins; but see
"Symmetric memory" below, which comes first on one host). Multicast: broadcasts of 1 MiB and
more use ``mcast`` when every rank is on one host and the multicast group was joined;
otherwise multicast and hierarchical algorithms are only used when asked for:

=============== ============================ ==================================
collective      below 64 KiB per rank          64 KiB and above
=============== ============================ ==================================
broadcast       binomial                       scatter_ring, chain
reduce          binomial                       chain
allreduce       recdoubling, binomial          ring
allgather       recdoubling, bruck, ring       ring
reduce_scatter  rechalving, ring               ring
scatter/gather  binomial                       linear
alltoall        bruck, pairwise                pairwise
barrier         dissemination                  (no data)
=============== ============================ ==================================

Symmetric memory comes first under ``auto`` when every rank of the communicator is on one
host (see :mod:`polycast.runtime.symm`):

* Allgather, Reduce_scatter_block and Allreduce whose buffers come from ``comm.symm_empty``
  use ``symm``: peers read each other's arrays directly (every rank must pass such
  buffers; which ones: :func:`polycast.runtime.symm.wanted`).
* Allgather, Reduce_scatter_block, Allreduce and Bcast of ordinary arrays go *staged*: the
  input is copied into a per-communicator symmetric staging buffer (allocated collectively
  by the first such call, grown to the next power of two when a call needs more, freed
  with the communicator) and the symm collective runs from there
  (:func:`polycast.runtime.symm.auto_staged`). The choice depends only on what every rank
  shares (one host, the collective, POLYCAST_SYMM), never on a rank's buffers, so ranks
  never take different paths; ranks passing different sizes all raise MismatchError.
  Measured with 4 ranks on 2 cores at 16 MiB (bench/symm.py, bench/peers.py): see
  :mod:`polycast.runtime.symm`.
* ``POLYCAST_SYMM=0`` turns both off; an explicit ``algorithm=`` (or
  POLYCAST_<COLLECTIVE>_ALGO) other than ``auto`` always runs that engine schedule; a
  communicator whose ranks are on several hosts, or whose symmetric memory failed (an
  allocation refused, a peer lost), uses the table above.
* The ``I``-variants return at once with a pending request; the collective runs on the
  communicator's symm worker thread meanwhile (:mod:`polycast.runtime.symm.queue`).

Otherwise ``auto`` picks the engine's schedule by these rules.

Large messages are pipelined: ``nchunks`` is chosen so a block is about 1 MiB (at most 32;
finer pipelining measured slower with 4 ranks on 2 cores).
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable

from ..algorithms import build, get, supported
from ..collectives import Collective
from ..errors import PolycastError

SMALL_NBYTES = 64 << 10
BLOCK_NBYTES = 1 << 20
MAX_NCHUNKS = 32

# On one host with a working multicast group, multicast broadcast measured 1.04-1.13 GB/s
# busbw against scatter_ring's 0.82-0.97 at 16 MiB with 4 ranks on 2 cores (polycast bench);
# multicast allreduce and allgather lost to ring there, so they stay opt-in.
_AUTO_MCAST = (Collective.BROADCAST,)
MCAST_MIN_NBYTES = 1 << 20

_AUTO_RULES = {
    Collective.BROADCAST: (("binomial",), ("scatter_ring", "chain", "binomial")),
    Collective.REDUCE: (("binomial",), ("chain", "binomial")),
    Collective.ALLREDUCE: (("recdoubling", "binomial"), ("ring",)),
    Collective.ALLGATHER: (("recdoubling", "bruck", "ring"), ("ring",)),
    Collective.REDUCE_SCATTER: (("rechalving", "ring"), ("ring",)),
    Collective.SCATTER: (("binomial",), ("linear",)),
    Collective.GATHER: (("binomial",), ("linear",)),
    Collective.ALLTOALL: (("bruck", "pairwise"), ("pairwise",)),
    Collective.BARRIER: (("dissemination",), ("dissemination",)),
}


@functools.lru_cache(maxsize=256)
def is_multicast(coll: Collective, name: str) -> bool:
    return get(coll, name).multicast        # cached: the registry is fixed once loaded


def choose_algorithm(comm, coll: Collective, nbytes: int, algorithm: str | None) -> str:
    """The engine schedule a call of ``comm`` would use (see the module docstring for
    ``auto``). Under ``auto`` on one host, calls of ordinary arrays take the staged symm
    path first: :meth:`Comm.takes_symm` says whether they do."""
    name = algorithm or os.environ.get(f"POLYCAST_{coll.name}_ALGO") or "auto"
    name = name.lower()
    P = comm.size
    ok = comm._supported.get(coll)
    if ok is None:          # the registry is fixed once loaded: ask once per collective
        ok = comm._supported[coll] = supported(coll, P)
    if name != "auto":
        if name not in ok:
            get(coll, name)          # unknown names: UnknownName with the choices
            build(coll, name, P, 0)  # known but unsupported: Unsupported with the reason
        if is_multicast(coll, name) and comm.mcast_error:
            fallback = choose_algorithm(comm, coll, nbytes, "auto")
            warnings.warn(f"polycast: {coll} algorithm {name!r} needs multicast, which is "
                          f"unavailable ({comm.mcast_error}); using {fallback!r}",
                          RuntimeWarning, stacklevel=5)
            return fallback
        return name
    if (coll in _AUTO_MCAST and nbytes >= MCAST_MIN_NBYTES and "mcast" in ok
            and comm.mcast_error is None
            and getattr(getattr(comm._driver, "world", None), "single_host", False)):
        return "mcast"
    small, large = _AUTO_RULES[coll]
    for cand in (small if nbytes < SMALL_NBYTES else large):
        if cand in ok:
            return cand
    plain = [a for a in ok if not is_multicast(coll, a) and not get(coll, a).hierarchical]
    if not plain:
        raise PolycastError(f"no point-to-point {coll} algorithm for {P} ranks "
                            f"(registered: {', '.join(ok) or 'none'})")
    return plain[0]


def pipeline_nchunks(coll: Collective, algo: str, total_nbytes: int,
                     parts: Callable[[], int]) -> int:
    """How many chunks a part of the largest buffer (``total_nbytes``) is cut into;
    ``parts()`` is the number of parts the unpipelined schedule cuts it into (P for a
    ring, 2 for a double tree, 1 for a chain), asked only when pipelining is considered."""
    if total_nbytes > 2 * BLOCK_NBYTES and not is_multicast(coll, algo):
        # Pipeline in messages of about BLOCK_NBYTES.
        return int(min(MAX_NCHUNKS, max(1, total_nbytes // (parts() * BLOCK_NBYTES))))
    return 1
