"""The user-facing communicator: mpi4py-style collectives on numpy arrays.

>>> import numpy as np, polycast
>>> comm = polycast.init()                        # from polycast run / torchrun / mpiexec / srun
>>> x = np.full(4, comm.rank, np.float32)
>>> comm.Allreduce(polycast.IN_PLACE, x, op="sum")
>>> req = comm.Iallgather(x, out)                 # non-blocking; req.Wait()

Every call builds the schedule of the chosen algorithm (``algorithm=`` keyword, else the
environment's ``POLYCAST_<COLLECTIVE>_ALGO``, else ``auto``), registers the arrays (bad
sizes or dtypes raise InvalidArgument before anything is sent) and posts it to the
progress thread. Every wait is bounded by the communicator's timeout (POLYCAST_TIMEOUT,
default 60 s).

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
* These calls complete before they return: the ``I``-variants return an already completed
  request.

Otherwise ``auto`` picks the engine's schedule by these rules.

Large messages are pipelined: ``nchunks`` is chosen so a block is about 1 MiB (at most 32; finer pipelining measured slower with 4 ranks on 2 cores).
"""

from __future__ import annotations

import atexit
import collections
import functools
import hashlib
import operator
import os
import pickle
import threading
import warnings

import numpy as np

from .algorithms import build, get, supported
from .collectives import Collective, ReduceOp
from .errors import InvalidArgument, PolycastError, UnknownName
from .runtime import symm as _symm
from .runtime.driver import Driver, Request

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


class _InPlace:
    def __repr__(self) -> str:
        return "polycast.IN_PLACE"


IN_PLACE = _InPlace()
UNDEFINED = -32766          # Split color for "not in any new communicator" (as MPI.UNDEFINED)


@functools.lru_cache(maxsize=256)
def _is_multicast(coll: Collective, name: str) -> bool:
    return get(coll, name).multicast        # cached: the registry is fixed once loaded


# Per-call constants, computed once (str(dtype) alone measured ~5 us, a third of the
# comm layer's cost of an 8-byte allreduce).
_DTYPE_NAMES: dict = {}
_OP_NAMES: dict = {}


def _dtype_name(dt: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt)
    return name


def _op_name(op) -> str:
    try:
        name = _OP_NAMES.get(op)
    except TypeError:                   # unhashable: let parse name the problem
        return ReduceOp.parse(op).value
    if name is None:
        name = ReduceOp.parse(op).value
        if len(_OP_NAMES) < 64:
            _OP_NAMES[op] = name
    return name


def _array(buf, what: str) -> np.ndarray:
    if not isinstance(buf, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array (or polycast.IN_PLACE where "
                              f"allowed), got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    return buf.reshape(-1)


class Comm:
    """A communicator. Made by :func:`init` (the world), :meth:`Split` and :meth:`Dup`."""

    def __init__(self, driver: Driver, comm_id: int, members: list[int],
                 timeout_seconds: float, mcast_error: str | None = None) -> None:
        self._driver = driver
        self.id = comm_id
        self.members = members
        self.rank = members.index(driver.rank)
        self.size = len(members)
        self.timeout_seconds = timeout_seconds
        self.mcast_error = mcast_error
        self._splits = 0
        self._freed = False
        self._schedules: collections.OrderedDict = collections.OrderedDict()
        self._supported: dict = {}
        self._lock = threading.Lock()

    # -- identity ---------------------------------------------------------------------------
    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"<polycast.Comm id={self.id} rank={self.rank}/{self.size}>"

    def transports(self) -> dict[int, str]:
        """Transport to each other member (local rank -> "shm" or "tcp")."""
        t = self._driver.transports()
        return {i: t[w] for i, w in enumerate(self.members) if w != self._driver.rank}

    # -- algorithm choice -----------------------------------------------------------------
    def choose_algorithm(self, coll: Collective, nbytes: int, algorithm: str | None) -> str:
        """The engine schedule a call would use (see the module docstring for ``auto``).
        Under ``auto`` on one host, calls of ordinary arrays take the staged symm path
        first: :meth:`takes_symm` says whether they do."""
        name = algorithm or os.environ.get(f"POLYCAST_{coll.name}_ALGO") or "auto"
        name = name.lower()
        P = self.size
        ok = self._supported.get(coll)
        if ok is None:          # the registry is fixed once loaded: ask once per collective
            ok = self._supported[coll] = supported(coll, P)
        if name != "auto":
            if name not in ok:
                get(coll, name)          # unknown names: UnknownName with the choices
                build(coll, name, P, 0)  # known but unsupported: Unsupported with the reason
            if _is_multicast(coll, name) and self.mcast_error:
                fallback = self.choose_algorithm(coll, nbytes, "auto")
                warnings.warn(f"polycast: {coll} algorithm {name!r} needs multicast, which is "
                              f"unavailable ({self.mcast_error}); using {fallback!r}",
                              RuntimeWarning, stacklevel=4)
                return fallback
            return name
        if (coll in _AUTO_MCAST and nbytes >= MCAST_MIN_NBYTES and "mcast" in ok
                and self.mcast_error is None
                and getattr(getattr(self._driver, "world", None), "single_host", False)):
            return "mcast"
        small, large = _AUTO_RULES[coll]
        for cand in (small if nbytes < SMALL_NBYTES else large):
            if cand in ok:
                return cand
        plain = [a for a in ok if not _is_multicast(coll, a) and not get(coll, a).hierarchical]
        if not plain:
            raise PolycastError(f"no point-to-point {coll} algorithm for {P} ranks "
                                f"(registered: {', '.join(ok) or 'none'})")
        return plain[0]

    def _schedule(self, coll: Collective, algo: str, count: int, root: int,
                  total_nbytes: int):
        """The schedule for this call; ``total_nbytes`` is the collective's largest buffer."""
        nchunks = 1
        if total_nbytes > 2 * BLOCK_NBYTES and not _is_multicast(coll, algo):
            # Pipeline in messages of about BLOCK_NBYTES: a part of the largest buffer
            # (P parts for a ring, 2 for a double tree, 1 for a chain) is cut into nchunks.
            parts = max(lay.parts for lay in self._built(coll, algo, count, root, 1).layouts
                        .values())
            nchunks = int(min(MAX_NCHUNKS, max(1, total_nbytes // (parts * BLOCK_NBYTES))))
        return self._built(coll, algo, count, root, nchunks)

    def _built(self, coll: Collective, algo: str, count: int, root: int, nchunks: int):
        """The schedule, from this communicator's cache (schedules are pure data)."""
        P = self.size
        key = (coll, algo, count, root, nchunks)
        with self._lock:
            sched = self._schedules.get(key)
            if sched is None:
                sched = build(coll, algo, P, count, root=root, nchunks=nchunks)
                self._schedules[key] = sched
                if len(self._schedules) > 64:
                    self._schedules.popitem(last=False)
            else:
                self._schedules.move_to_end(key)
        return sched

    # -- the core -------------------------------------------------------------------------
    def _post(self, coll: Collective, send: np.ndarray | None, recv: np.ndarray | None,
              count: int, root: int = 0, op=None, algorithm: str | None = None,
              dtype: np.dtype | None = None, after=None) -> Request:
        if self._freed:
            raise InvalidArgument(f"{self!r} was freed")
        if coll.rooted and not (isinstance(root, int) and 0 <= root < self.size):
            raise InvalidArgument(f"root {root!r} out of range: valid roots are "
                                  f"0..{self.size - 1}")
        opname = ""
        if coll.has_op:
            opname = _op_name(op if op is not None else "sum")
        dt = np.dtype(dtype if dtype is not None else
                      (send.dtype if send is not None else
                       (recv.dtype if recv is not None else np.uint8)))
        nbytes = count * dt.itemsize * (1 if coll in (Collective.BROADCAST, Collective.REDUCE,
                                                      Collective.ALLREDUCE) else 1)
        algo = self.choose_algorithm(coll, nbytes, algorithm)
        sched = self._schedule(coll, algo, count, root if coll.rooted else 0,
                               coll.total_elements(self.size, count) * dt.itemsize)
        drv = self._driver
        req_id = drv.new_request_id()
        drv.buffers.register(req_id, sched, self.rank, send, recv, opname or None)
        rank = self.rank
        req = Request(req_id, self.id, lambda: f"rank {rank}: {sched.describe()}",
                      self.timeout_seconds)
        req.on_done = after
        drv.post(self.id, req, sched, dt.itemsize, _dtype_name(dt), opname)
        return req

    # -- buffer collectives (non-blocking) ------------------------------------------------
    def Ibcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> Request:
        if (isinstance(root, int) and 0 <= root < self.size
                and _symm.auto_staged(self, Collective.BROADCAST, algorithm, buf)):
            req = _symm.staged_bcast(self, buf, root)
            if req is not None:
                return req
        buf = _array(buf, "buf")
        return self._post(Collective.BROADCAST, buf if self.rank == root else None, buf,
                          buf.size, root, algorithm=algorithm)

    def Ireduce(self, sendbuf, recvbuf, op="sum", root: int = 0, *,
                algorithm: str | None = None) -> Request:
        if sendbuf is IN_PLACE:
            if self.rank != root:
                raise InvalidArgument("IN_PLACE in Reduce is only valid at the root")
            recvbuf = _array(recvbuf, "recvbuf")
            sendbuf = recvbuf.copy()
        sendbuf = _array(sendbuf, "sendbuf")
        if self.rank == root:
            recvbuf = _array(recvbuf, "recvbuf")
        else:
            recvbuf = None
        return self._post(Collective.REDUCE, sendbuf, recvbuf, sendbuf.size, root, op,
                          algorithm)

    def Iallreduce(self, sendbuf, recvbuf, op="sum", *, algorithm: str | None = None
                   ) -> Request:
        path = _symm.route(self, Collective.ALLREDUCE, algorithm, sendbuf, recvbuf,
                           sendbuf is IN_PLACE)
        if path is _symm.SYMM:
            return _symm.allreduce(self, sendbuf, recvbuf, op, sendbuf is IN_PLACE)
        if path is _symm.STAGED:
            req = _symm.staged_allreduce(self, sendbuf, recvbuf, op, sendbuf is IN_PLACE)
            if req is not None:
                return req
        recvbuf = _array(recvbuf, "recvbuf")
        # In place: the input is copied first, so every algorithm is safe to use.
        sendbuf = recvbuf.copy() if sendbuf is IN_PLACE else _array(sendbuf, "sendbuf")
        if sendbuf.size != recvbuf.size:
            raise InvalidArgument(f"Allreduce needs equal send and recv sizes, got "
                                  f"{sendbuf.size} and {recvbuf.size}")
        return self._post(Collective.ALLREDUCE, sendbuf, recvbuf, recvbuf.size, 0, op,
                          algorithm)

    def Iallgather(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        path = _symm.route(self, Collective.ALLGATHER, algorithm, sendbuf, recvbuf,
                           sendbuf is IN_PLACE)
        if path is _symm.SYMM:
            return _symm.allgather(self, sendbuf, recvbuf, sendbuf is IN_PLACE)
        if path is _symm.STAGED:
            req = _symm.staged_allgather(self, sendbuf, recvbuf, sendbuf is IN_PLACE)
            if req is not None:
                return req
        recvbuf = _array(recvbuf, "recvbuf")
        if recvbuf.size % self.size:
            raise InvalidArgument(f"Allgather recvbuf of {recvbuf.size} elements is not a "
                                  f"multiple of the {self.size} ranks")
        count = recvbuf.size // self.size
        if sendbuf is IN_PLACE:
            sendbuf = recvbuf[self.rank * count:(self.rank + 1) * count].copy()
        sendbuf = _array(sendbuf, "sendbuf")
        if sendbuf.size != count:
            raise InvalidArgument(f"Allgather: sendbuf has {sendbuf.size} elements, recvbuf "
                                  f"needs {self.size} x {sendbuf.size} = "
                                  f"{self.size * sendbuf.size}, got {recvbuf.size}")
        return self._post(Collective.ALLGATHER, sendbuf, recvbuf, count, 0,
                          algorithm=algorithm)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op="sum", *,
                              algorithm: str | None = None) -> Request:
        path = _symm.route(self, Collective.REDUCE_SCATTER, algorithm, sendbuf, recvbuf,
                           sendbuf is IN_PLACE)
        if path is _symm.SYMM:
            return _symm.reduce_scatter(self, sendbuf, recvbuf, op, sendbuf is IN_PLACE)
        if path is _symm.STAGED:
            req = _symm.staged_reduce_scatter(self, sendbuf, recvbuf, op,
                                              sendbuf is IN_PLACE)
            if req is not None:
                return req
        recvbuf = _array(recvbuf, "recvbuf")
        if sendbuf is IN_PLACE:
            if recvbuf.size % self.size:
                raise InvalidArgument("Reduce_scatter_block IN_PLACE: recvbuf must hold "
                                      f"{self.size} blocks, got {recvbuf.size} elements")
            sendbuf = recvbuf.copy()
            recvbuf = recvbuf[:recvbuf.size // self.size]
        sendbuf = _array(sendbuf, "sendbuf")
        if sendbuf.size != self.size * recvbuf.size:
            raise InvalidArgument(f"Reduce_scatter_block: sendbuf needs {self.size} x "
                                  f"{recvbuf.size} = {self.size * recvbuf.size} elements, "
                                  f"got {sendbuf.size}")
        return self._post(Collective.REDUCE_SCATTER, sendbuf, recvbuf, recvbuf.size, 0, op,
                          algorithm)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                 ) -> Request:
        after = None
        if recvbuf is IN_PLACE:
            if self.rank != root:
                raise InvalidArgument("IN_PLACE in Scatter is only valid at the root")
            sendbuf = _array(sendbuf, "sendbuf")
            recvbuf = np.empty(sendbuf.size // self.size, sendbuf.dtype)
        recvbuf = _array(recvbuf, "recvbuf")
        if self.rank == root:
            sendbuf = _array(sendbuf, "sendbuf")
            if sendbuf.size != self.size * recvbuf.size:
                raise InvalidArgument(f"Scatter: sendbuf needs {self.size} x {recvbuf.size} "
                                      f"elements, got {sendbuf.size}")
        else:
            sendbuf = None
        return self._post(Collective.SCATTER, sendbuf, recvbuf, recvbuf.size, root,
                          algorithm=algorithm, after=after)

    def Igather(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None
                ) -> Request:
        if sendbuf is IN_PLACE:
            if self.rank != root:
                raise InvalidArgument("IN_PLACE in Gather is only valid at the root")
            recvbuf = _array(recvbuf, "recvbuf")
            n = recvbuf.size // self.size
            sendbuf = recvbuf[root * n:(root + 1) * n].copy()
        sendbuf = _array(sendbuf, "sendbuf")
        if self.rank == root:
            recvbuf = _array(recvbuf, "recvbuf")
            if recvbuf.size != self.size * sendbuf.size:
                raise InvalidArgument(f"Gather: recvbuf needs {self.size} x {sendbuf.size} "
                                      f"elements, got {recvbuf.size}")
        else:
            recvbuf = None
        return self._post(Collective.GATHER, sendbuf, recvbuf, sendbuf.size, root,
                          algorithm=algorithm)

    def Ialltoall(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> Request:
        recvbuf = _array(recvbuf, "recvbuf")
        sendbuf = recvbuf.copy() if sendbuf is IN_PLACE else _array(sendbuf, "sendbuf")
        if sendbuf.size != recvbuf.size or sendbuf.size % self.size:
            raise InvalidArgument(f"Alltoall needs equal send and recv sizes divisible by "
                                  f"{self.size} ranks, got {sendbuf.size} and {recvbuf.size}")
        return self._post(Collective.ALLTOALL, sendbuf, recvbuf, sendbuf.size // self.size,
                          0, algorithm=algorithm)

    def Ibarrier(self, *, algorithm: str | None = None) -> Request:
        return self._post(Collective.BARRIER, None, None, 0, 0, algorithm=algorithm)

    # -- blocking forms -------------------------------------------------------------------
    def Bcast(self, buf, root: int = 0, **kw) -> None:
        self.Ibcast(buf, root, **kw).Wait()

    def Reduce(self, sendbuf, recvbuf, op="sum", root: int = 0, **kw) -> None:
        self.Ireduce(sendbuf, recvbuf, op, root, **kw).Wait()

    def Allreduce(self, sendbuf, recvbuf, op="sum", **kw) -> None:
        self.Iallreduce(sendbuf, recvbuf, op, **kw).Wait()

    def Allgather(self, sendbuf, recvbuf, **kw) -> None:
        self.Iallgather(sendbuf, recvbuf, **kw).Wait()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op="sum", **kw) -> None:
        self.Ireduce_scatter_block(sendbuf, recvbuf, op, **kw).Wait()

    def Scatter(self, sendbuf, recvbuf, root: int = 0, **kw) -> None:
        self.Iscatter(sendbuf, recvbuf, root, **kw).Wait()

    def Gather(self, sendbuf, recvbuf, root: int = 0, **kw) -> None:
        self.Igather(sendbuf, recvbuf, root, **kw).Wait()

    def Alltoall(self, sendbuf, recvbuf, **kw) -> None:
        self.Ialltoall(sendbuf, recvbuf, **kw).Wait()

    def Barrier(self, **kw) -> None:
        self.Ibarrier(**kw).Wait()

    # -- symmetric memory (one host) ------------------------------------------------------
    def takes_symm(self, coll: Collective, dtype, algorithm: str | None = None) -> bool:
        """Whether an ``auto`` call of ``coll`` on ordinary arrays of ``dtype`` runs through
        symmetric memory (staged) rather than an engine schedule. Collective the first time
        on a communicator (it may set up the symmetric state): call it on every rank."""
        return _symm.auto_staged(self, Collective.parse(coll), algorithm,
                                 np.empty(0, np.dtype(dtype)))

    def symm_empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A new array in shared memory that every rank of this (single-host) communicator
        maps; collective: every rank calls it with the same shape and dtype. Allgather,
        Reduce_scatter_block and Allreduce then take ``algorithm="symm"`` (and pick it under
        ``auto``) with it as the source buffer: each rank reads its peers' arrays directly
        (no copy into the staging buffer that ``auto`` uses for ordinary arrays).
        Freed with the communicator. See :mod:`polycast.runtime.symm`."""
        return _symm.alloc(self, shape, dtype)

    # -- Python objects (pickle) ----------------------------------------------------------
    @staticmethod
    def _dumps(obj) -> np.ndarray:
        return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)

    def bcast(self, obj=None, root: int = 0):
        n = np.array([0], np.int64)
        data = self._dumps(obj) if self.rank == root else None
        if self.rank == root:
            n[0] = data.size
        self.Bcast(n, root)
        buf = data.copy() if self.rank == root else np.empty(int(n[0]), np.uint8)
        self.Bcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def _padded_allgather(self, data: np.ndarray) -> list:
        sizes = np.empty(self.size, np.int64)
        self.Allgather(np.array([data.size], np.int64), sizes)
        width = int(sizes.max())
        mine = np.zeros(width, np.uint8)
        mine[:data.size] = data
        out = np.empty(width * self.size, np.uint8)
        self.Allgather(mine, out)
        return [pickle.loads(out[i * width:i * width + int(sizes[i])].tobytes())
                for i in range(self.size)]

    def allgather(self, obj) -> list:
        return self._padded_allgather(self._dumps(obj))

    def gather(self, obj, root: int = 0):
        data = self._dumps(obj)
        sizes = np.empty(self.size, np.int64)
        self.Allgather(np.array([data.size], np.int64), sizes)
        width = int(sizes.max())
        mine = np.zeros(width, np.uint8)
        mine[:data.size] = data
        out = np.empty(width * self.size, np.uint8) if self.rank == root else None
        self.Gather(mine, out, root)
        if self.rank != root:
            return None
        return [pickle.loads(out[i * width:i * width + int(sizes[i])].tobytes())
                for i in range(self.size)]

    def scatter(self, objs=None, root: int = 0):
        if self.rank == root:
            if objs is None or len(objs) != self.size:
                raise InvalidArgument(f"scatter at the root needs a sequence of {self.size} "
                                      f"objects, got {objs!r:.80}")
            parts = [self._dumps(o) for o in objs]
            width = max(p.size for p in parts)
            sizes = np.array([p.size for p in parts], np.int64)
            send = np.zeros(width * self.size, np.uint8)
            for i, p in enumerate(parts):
                send[i * width:i * width + p.size] = p
            meta = np.array([width], np.int64)
        else:
            sizes, send, meta = np.empty(self.size, np.int64), None, np.empty(1, np.int64)
        self.Bcast(meta, root)
        self.Bcast(sizes, root)
        width = int(meta[0])
        mine = np.empty(width, np.uint8)
        self.Scatter(send, mine, root)
        return pickle.loads(mine[:int(sizes[self.rank])].tobytes())

    def allreduce(self, obj, op="sum"):
        """Reduce Python objects with ``op`` (sum/prod/min/max or a 2-argument callable)."""
        values = self.allgather(obj)
        if callable(op):
            fn = op
        else:
            name = ReduceOp.parse(op)
            fn = {ReduceOp.SUM: operator.add, ReduceOp.PROD: operator.mul,
                  ReduceOp.MIN: min, ReduceOp.MAX: max}.get(name)
            if fn is None:
                raise InvalidArgument(f"allreduce of objects supports sum, prod, min, max or "
                                      f"a callable, got {op!r}")
        return functools.reduce(fn, values)

    # -- communicators ----------------------------------------------------------------------
    def _child_id(self, what: str) -> int:
        self._splits += 1
        d = hashlib.blake2b(f"{self.id}/{self._splits}/{what}".encode(),
                            digest_size=4).digest()
        return (int.from_bytes(d, "big") | 1) & 0xFFFFFFFF     # never 0, the world's id

    def Split(self, color: int = 0, key: int = 0) -> "Comm | None":
        """Ranks with the same ``color`` form a new communicator, ordered by (key, rank).
        ``color=polycast.UNDEFINED`` takes part but gets None."""
        pairs = self.allgather((color, key))
        # Same id on every member: from the parent's id, its split count and the color
        # (never Python's hash(), which differs between processes).
        cid = self._child_id(f"split/{color!r}")
        if color == UNDEFINED:
            return None
        group = sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)
        members = [self.members[r] for _, r in group]
        return self._make_child(cid, members)

    def Dup(self) -> "Comm":
        self.Barrier()      # every member makes the child in the same order
        return self._make_child(self._child_id("dup"), list(self.members))

    def _make_child(self, comm_id: int, members: list[int]) -> "Comm":
        err = self._driver.add_comm(comm_id, members)
        return Comm(self._driver, comm_id, members, self.timeout_seconds, err)

    def Free(self) -> None:
        if self._freed:
            return
        self._freed = True
        _symm.free(self)
        if self.id == 0:
            finalize()
        else:
            self._driver.free_comm(self.id)

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> None:
        self.Free()

    def stats(self):
        """The engine's counters for this communicator (messages, drops, recovery...)."""
        return self._driver.stats(self.id)


# -- the world --------------------------------------------------------------------------------
_WORLD: Comm | None = None
_WORLD_LOCK = threading.Lock()


def init(*, rank: int | None = None, size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None,
         timeout: float | None = None, transport: str | None = None, env=None,
         mtu_nbytes: int | None = None, pacing_gbps: float | None = None) -> Comm:
    """Join the job and return the world communicator (calling it again returns the same
    one). The job is described by the environment (see :mod:`polycast.runtime.env`: polycast
    run, torchrun, mpiexec, srun), or explicitly by ``rank``, ``size``, ``master_addr`` and
    ``master_port`` (all four; every rank on one host is assumed when the address is a
    loopback one). ``transport``: "auto", "shm" or "tcp" (else POLYCAST_TRANSPORT);
    ``timeout``: seconds every wait is bounded by (else POLYCAST_TIMEOUT, default 60)."""
    global _WORLD
    from .engine.engine import EngineConfig
    from .runtime.env import detect, timeout_from_env
    from .runtime.mcast import datagram_payload_nbytes
    from .runtime.world import connect
    with _WORLD_LOCK:
        if _WORLD is not None and not _WORLD._freed:
            return _WORLD
        explicit = (rank, size, master_addr, master_port)
        if any(v is not None for v in explicit):
            if any(v is None for v in explicit):
                raise InvalidArgument("init() with an explicit job needs all of rank, size, "
                                      f"master_addr and master_port; got rank={rank!r}, "
                                      f"size={size!r}, master_addr={master_addr!r}, "
                                      f"master_port={master_port!r}")
            local = master_addr.startswith("127.") or master_addr == "localhost"
            job = detect({"POLYCAST_RANK": str(rank), "POLYCAST_SIZE": str(size),
                          "POLYCAST_LOCAL_RANK": str(rank if local else 0),
                          "POLYCAST_LOCAL_SIZE": str(size if local else 1),
                          "POLYCAST_MASTER_ADDR": master_addr,
                          "POLYCAST_MASTER_PORT": str(master_port),
                          **({"POLYCAST_TIMEOUT": os.environ["POLYCAST_TIMEOUT"]}
                             if os.environ.get("POLYCAST_TIMEOUT") else {})})
        else:
            job = detect(env)
        if timeout is not None:
            if timeout <= 0:
                raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
            from dataclasses import replace
            job = replace(job, timeout_seconds=float(timeout))
        world = connect(job, transport)
        secret = os.environ.get("POLYCAST_SECRET")
        mtu = mtu_nbytes or int(os.environ.get("POLYCAST_MTU", 0) or datagram_payload_nbytes(
            world.job_id, world.single_host, secret.encode() if secret else None))
        pace = pacing_gbps if pacing_gbps is not None else \
            (float(os.environ["POLYCAST_PACING_GBPS"]) if os.environ.get("POLYCAST_PACING_GBPS")
             else None)
        config = EngineConfig(mtu_nbytes=mtu, pacing_gbps=pace,
                              op_timeout_s=job.timeout_seconds,
                              secret=secret.encode() if secret else None)
        driver = Driver(world, config)
        err = driver.add_comm(0, list(range(world.size)))
        _WORLD = Comm(driver, 0, list(range(world.size)), job.timeout_seconds, err)
        atexit.register(finalize)
        return _WORLD


def finalize() -> None:
    """Close the world: say goodbye to the peers and stop the progress thread."""
    global _WORLD
    with _WORLD_LOCK:
        w, _WORLD = _WORLD, None
    if w is not None:
        w._freed = True
        _symm.free(w)
        w._driver.close()


def world() -> Comm:
    if _WORLD is None:
        raise InvalidArgument("polycast.init() has not been called")
    return _WORLD


__all__ = ["Comm", "Request", "IN_PLACE", "UNDEFINED", "init", "finalize", "world",
           "UnknownName"]
