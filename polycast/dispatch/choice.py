"""How a communicator's call is planned: an explicit algorithm runs as asked; ``auto`` asks
the planner (:mod:`polycast.planner`), which is the one place choices are made -- engine
schedule or symmetric memory, and how finely it is pipelined.

``auto`` on a communicator:

* the candidates are the engine algorithms of the collective that run on its ranks, plus
  multicast ones when its multicast group is up and every rank is on one host, plus the
  symmetric-memory path (``symm``) for allgather, reduce-scatter, allreduce and broadcast
  when every rank is on one host and POLYCAST_SYMM is not 0 (:mod:`polycast.runtime.symm`);
* each is estimated on this machine's fabric: the calibration profile written by
  ``polycast tune --calibrate``, or the built-in model (:mod:`polycast.planner.local`);
* the fastest runs. Choices are made per power-of-two size class, from what every rank
  of the communicator shares (its size, one host or not, its multicast and symmetric
  memory, the host's profile), so every rank makes the same one;
* ``POLYCAST_DEBUG=INFO`` prints each choice once per class with the reason,
  ``POLYCAST_DEBUG=TRACE`` every call (:mod:`polycast.debug`).

An explicit ``algorithm=`` (or POLYCAST_<COLLECTIVE>_ALGO) other than ``auto`` always
runs that engine schedule, pipelined as the planner would pipeline it (POLYCAST_NCHUNKS=K
forces K chunks per part on every call: experiments, calibration); ``symm`` asks for the
user's symmetric buffers (:func:`polycast.dispatch.routing.wanted`). The answers are kept
by the communicator's dispatch (:class:`Plans`).
"""

from __future__ import annotations

import functools
import warnings

from ..algorithms import build, get, supported
from ..collectives import Collective
from ..errors import PolycastError
from ..planner import CommShape, choose, estimate
from .. import debug as _debug
from ..planner import profile as _profile
from ..planner.local import local_fabric


@functools.lru_cache(maxsize=256)
def is_multicast(coll: Collective, name: str) -> bool:
    return get(coll, name).multicast        # cached: the registry is fixed once loaded


def _one_host(comm) -> bool:
    world = getattr(comm._driver, "world", None)
    if world is None:
        return True
    if world.single_host:
        return True
    peers = world.peers
    return all(w == world.rank or (w in peers and peers[w].same_host) for w in comm.members)


class Plans:
    """What the planner answered for one communicator (its dispatch keeps it): every
    answer depends only on what its ranks share, so it is asked once."""

    __slots__ = ("fabrics", "shape", "choices", "supported", "vector")

    def __init__(self) -> None:
        self.fabrics: dict = {}         # (symm on offer, multicast up) -> Fabric
        self.shape: CommShape | None = None
        self.choices: dict = {}         # (collective, size class, symm, multicast) -> Choice
        self.supported: dict = {}       # collective -> the algorithms that run on its ranks
        self.vector: dict = {}          # vector calls' choices (polycast.comm.vector)


def fabric(comm, symm: bool):
    """The communicator's fabric (kept; ``symm``: whether symmetric memory is still on
    offer -- it goes when an allocation was refused on every rank)."""
    cache = comm._dispatch.plans.fabrics
    key = (symm, comm.mcast_error is None)
    fab = cache.get(key)
    if fab is None:
        one = _one_host(comm)
        try:
            kinds = set(comm.transports().values()) if comm.size > 1 else {"shm"}
        except AttributeError:      # a driver without transports (tests): shared memory
            kinds = {"shm"}
        transport = "shm" if kinds <= {"shm"} else "tcp"
        fab = local_fabric(single_host=one, transport=transport,
                           multicast=one and comm.mcast_error is None, symm=symm,
                           prof=_profile.load(_profile.default_path(comm.config)) if one else None)
        cache[key] = fab
    return fab


def shape(comm) -> CommShape:
    """Hosts x ranks per host as every rank sees it: one host, or (ranks of other hosts
    being grouped in ways this rank cannot see) one rank per host."""
    plans = comm._dispatch.plans
    sh = plans.shape
    if sh is None:
        sh = plans.shape = CommShape(comm.size, comm.size if _one_host(comm) else 1)
    return sh


def plan(comm, coll: Collective, nbytes: int, symm: bool):
    """The planner's choice for a call of ``nbytes`` (nccl-tests' S) on ``comm``, cached
    per power-of-two size class (the estimate is made at the class's middle)."""
    k = nbytes.bit_length()
    key = (coll, k, symm, comm.mcast_error is None)
    cache = comm._dispatch.plans.choices
    hit = cache.get(key)
    if hit is None:
        rep = 0 if nbytes == 0 else (3 << (k - 2) if k >= 2 else nbytes)
        hit = choose(coll, rep, shape(comm), fabric(comm, symm))
        cache[key] = hit
    return hit


def choose_algorithm(comm, coll: Collective, nbytes: int, algorithm: str | None) -> str:
    """The engine schedule a call of ``nbytes`` (S) would use. Under ``auto`` on one host,
    calls of ordinary arrays may take the symm path first (:func:`symm_wins`)."""
    name = algorithm or comm.config.algorithm(coll) or "auto"
    name = name.lower()
    P = comm.size
    known = comm._dispatch.plans.supported
    ok = known.get(coll)
    if ok is None:          # the registry is fixed once loaded: ask once per collective
        ok = known[coll] = supported(coll, P)
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
    c = plan(comm, coll, nbytes, symm=False)
    if not c.candidates:
        raise PolycastError(f"no {coll} algorithm for {P} ranks")
    return c.algorithm


def pipeline_nchunks(comm, coll: Collective, algo: str, nbytes: int) -> int:
    """How finely ``algo`` is pipelined for a call of ``nbytes`` (S): the planner's depth
    for ``auto``'s choice, and the planner's best depth for an algorithm asked by name."""
    forced = comm.config.nchunks
    if forced:
        return forced
    c = plan(comm, coll, nbytes, symm=False)
    if c.algorithm == algo:
        return c.nchunks
    key = ("nchunks", coll, algo, nbytes.bit_length())
    cache = comm._dispatch.plans.choices
    k = cache.get(key)
    if k is None:
        fab = fabric(comm, False)
        try:
            k = estimate(coll, algo, nbytes, shape(comm), fab).nchunks
        except PolycastError:
            k = 1
        cache[key] = k
    return k


def symm_wins(comm, coll: Collective, nbytes: int) -> bool:
    """Whether ``auto`` runs this call (ordinary arrays, one host, symmetric memory on
    offer) through symmetric memory rather than an engine schedule."""
    return plan(comm, coll, nbytes, symm=True).algorithm == "symm"


def log(comm, coll: Collective, nbytes: int, algorithm: str, nchunks: int,
        auto: bool) -> None:
    """POLYCAST_DEBUG: the choice of this call (INFO once per size class, TRACE always)."""
    lvl = comm.config.debug_level
    if not lvl:
        return
    detail = "asked for"
    if auto:
        c = plan(comm, coll, nbytes, symm=algorithm == "symm")
        detail = f"est {c.estimate_seconds * 1e6:.1f} us; " + "; ".join(c.reasons[1:])
    _debug.log_choice(comm.rank, comm.id, coll, nbytes, algorithm, nchunks, detail, lvl)
