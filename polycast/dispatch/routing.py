"""Which path a call takes on one host: the user's symmetric buffers (SYMM), ordinary
arrays staged through the communicator's staging segment (STAGED, the ``auto`` path), or
None (the engine's schedules). The answer depends only on what every rank shares, so ranks
never take different paths. Every function takes the communicator's
:class:`~polycast.dispatch.call.Dispatch` (``d``), which keeps the answers that cannot
change."""

from __future__ import annotations

import numpy as np

from ..collectives import Collective
from ..errors import CollectiveTimeout, PeerLost, PolycastError
from ..runtime.transport.shm import shm_available

NAME = "symm"
SYMM, STAGED = "symm", "staged"
_STAGED = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE,
           Collective.BROADCAST)


def _symmetric(st, coll: Collective, sendbuf, recvbuf, in_place: bool) -> bool:
    src = recvbuf if in_place else sendbuf
    if coll is Collective.REDUCE_SCATTER:
        return st.find(src) is not None
    if coll is Collective.ALLGATHER:
        return st.find(recvbuf) is not None or st.find(src) is not None
    if coll is Collective.ALLREDUCE:
        return st.find(recvbuf) is not None
    return False


def members_on_one_host(d) -> bool:
    """From what the rendezvous told every rank (no message): the same answer everywhere,
    since every member sees every other member on its own host or none does. It cannot
    change, so it is kept (asked once, not per call)."""
    got = d.one_host
    if got is None:
        comm = d.comm
        world = getattr(comm._driver, "world", None)
        if world is None or not shm_available():
            got = False
        elif world.single_host:
            got = True
        else:
            peers = world.peers
            got = all(w == world.rank or (w in peers and peers[w].same_host)
                      for w in comm.members)
        d.one_host = got
    return got


def route(d, coll: Collective, algorithm: str | None, sendbuf, recvbuf,
          in_place: bool) -> str | None:
    """Which symm path a call takes: SYMM (``algorithm="symm"``, or ``auto`` with the
    user's symmetric buffers, where every rank must have allocated the buffers peers
    read so: the source of reduce-scatter, the source or the whole recvbuf of allgather, the
    recvbuf of allreduce), STAGED (``auto`` with ordinary arrays on
    one host: :func:`auto_staged`), or None (the engine)."""
    comm = d.comm
    name = algorithm or comm.config.algorithm(coll) or "auto"
    if name == NAME:
        return SYMM
    name = name.lower()
    if name == NAME:
        return SYMM
    if name != "auto" or not comm.config.symm:
        return None
    st = d.symm
    # (without a symm_empty allocation no buffer can be symmetric: skip looking)
    if (st is not None and st.nuser and not (st.usable_reason or st.bar.broken)
            and comm.size > 1 and _symmetric(st, coll, sendbuf, recvbuf, in_place)):
        return SYMM
    buf = recvbuf if coll is not Collective.BROADCAST else sendbuf
    if coll in _STAGED:
        nbytes = getattr(recvbuf if in_place or coll is not Collective.REDUCE_SCATTER
                         else sendbuf, "nbytes", None)
        # (the planner's kept answer first, as _planner_wants keys it)
        got = d.symm_answers.get((coll, nbytes, comm.mcast_error is None))
        if not (got if got is not None else _planner_wants(d, coll, nbytes)):
            return None
        # The common case, _staged_ok's checks inline: a state that takes calls.
        if (st is not None and type(buf) is np.ndarray and not buf.dtype.hasobject
                and comm.size > 1 and not comm._freed and _takes_calls(st)):
            return STAGED
    return STAGED if _staged_ok(d, coll, buf) else None


def _planner_wants(d, coll: Collective, nbytes: int | None) -> bool:
    """Whether the planner (polycast.planner: the one place choices are made) runs an
    ``auto`` call of ``nbytes`` (S) through symmetric memory; None: any size may. The
    answers are kept per collective and size (a call repeats its sizes)."""
    comm = d.comm
    if nbytes is None or comm.size < 2 or not members_on_one_host(d):
        return nbytes is None
    cache = d.symm_answers
    key = (coll, nbytes, comm.mcast_error is None)    # as choice.plan's key
    got = cache.get(key)
    if got is None:
        from . import choice
        if len(cache) > 1024:           # bounded: many distinct sizes just re-ask
            cache.clear()
        got = cache[key] = choice.symm_wins(comm, coll, nbytes)
    return got


def auto_staged(d, coll: Collective, algorithm: str | None, buf,
                nbytes: int | None = None) -> bool:
    """Whether an ``auto`` call with ordinary arrays takes the staged symm path: the
    collective is allgather, reduce-scatter, allreduce or broadcast, the communicator has
    2+ ranks all on one host, POLYCAST_SYMM is not 0, and symmetric memory has not been
    refused on this communicator (other hosts, a failed allocation, a lost peer). All of it
    is the same on every rank (``buf`` only gives the dtype, which ranks share), so ranks
    never take different paths. The first such call makes the communicator's symmetric
    state (collective: every rank is making the same call). The planner decides whether
    the call's size (``nbytes``, S; else ``buf``'s) is faster there than on the engine."""
    comm = d.comm
    if algorithm is not None and algorithm.lower() != "auto":
        return False
    asked = comm.config.algorithm(coll)
    if asked and asked != "auto" or not comm.config.symm:
        return False
    if nbytes is None and isinstance(buf, np.ndarray) and buf.size:
        nbytes = buf.nbytes
    if coll in _STAGED and not _planner_wants(d, coll, nbytes):
        return False
    return _staged_ok(d, coll, buf)


def _staged_ok(d, coll: Collective, buf) -> bool:
    comm = d.comm
    if coll not in _STAGED or comm.size < 2 or comm._freed:
        return False
    if not isinstance(buf, np.ndarray) or buf.dtype.hasobject:
        return False
    st = d.symm
    if st is None:
        if d.symm_creating or d.symm_refused or not members_on_one_host(d):
            return False
        try:
            st = d.symm_state(create=True)
        except (PeerLost, CollectiveTimeout):
            raise
        except PolycastError as exc:        # raised on every rank: all take the engine
            d.symm_refused = str(exc)
            return False
    return _takes_calls(st)


def _takes_calls(st) -> bool:
    """Whether a communicator's symmetric state takes staged calls now."""
    return not (st.usable_reason or st.bar.broken or st.growing or st.auto_refused)
