"""The communicator's core: who it is, how a call becomes a posted schedule, and how
communicators are made and freed. The methods users call are mixed in from
:mod:`.collectives` (buffers) and :mod:`.objects` (pickled Python objects)."""

from __future__ import annotations

import collections
import hashlib
import threading

import numpy as np

from .. import config as _config
from .. import ops as _ops
from ..algorithms import build
from ..collectives import Collective
from ..errors import InvalidArgument, PolycastError
from ..schedule.guard import agreed
from ..dispatch import routing as _routing
from ..runtime import symm as _symm
from ..runtime.driver import Driver, Request
from ..dispatch import choice
from ..buffers import dtype_name

# The collectives that may take the staged symmetric-memory path (Comm.refuse).
_SYMM_STAGED = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER,
                Collective.BROADCAST)
_NO_BUFFER = np.empty(0, np.uint8)
_UINT8 = np.dtype(np.uint8)
_CALLS_MAX = 256
# MPI.UNDEFINED: a Split color for "not in any new communicator" (and Waitany's "none")
from ..runtime.driver.request import UNDEFINED  # noqa: E402


class CommCore:
    """Identity, schedule cache, posting, Split/Dup/Free (see :class:`polycast.Comm`)."""

    def __init__(self, driver: Driver, comm_id: int, members: list[int],
                 timeout_seconds: float, mcast_error: str | None = None,
                 config: _config.Config | None = None) -> None:
        """``config``: the communicator's settings (polycast.config), taken once when its
        job was joined and kept: the environment is not read again."""
        self._driver = driver
        self.config = config if config is not None else _config.current()
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
        self._calls: dict = {}      # call arguments -> what _derive made of them
        # (collective, algorithm, op or root) -> [DirectCall]: repeated calls the compiled
        # replay runs whole, taken straight there (runtime/driver/direct.py)
        self._direct: dict = {}
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
        """The engine schedule a call of ``nbytes`` (the collective's size S, as
        nccl-tests counts it) would use (:func:`.choice.choose_algorithm`)."""
        return choice.choose_algorithm(self, coll, nbytes, algorithm)

    def plan(self, coll, nbytes: int, symm: bool = True):
        """The planner's :class:`~polycast.planner.Choice` for an ``auto`` call of
        ``nbytes`` (S), with every candidate's estimate (``.explain()``)."""
        return choice.plan(self, Collective.parse(coll), nbytes, symm)

    def _schedule(self, coll: Collective, algo: str, count: int, root: int, nbytes: int):
        """The schedule for this call of ``nbytes`` (S), pipelined as the planner says."""
        nchunks = choice.pipeline_nchunks(self, coll, algo, nbytes)
        return self._built(coll, algo, count, root, nchunks)

    def _built(self, coll: Collective, algo: str, count: int, root: int, nchunks: int,
               counts=None):
        """The schedule, from this communicator's cache (schedules are pure data);
        ``counts``: a vector call's (polycast.schedule.vector)."""
        P = self.size
        key = (coll, algo, count, root, nchunks, counts)
        with self._lock:
            sched = self._schedules.get(key)
            if sched is None:
                # agreed(): no rank may finish a call another rank refused (see
                # polycast.schedule.guard), so rooted schedules get an entry barrier.
                sched = agreed(build(coll, algo, P, count, root=root, nchunks=nchunks,
                                     counts=counts,
                                     max_schedule_nbytes=self.config.max_schedule_nbytes))
                self._schedules[key] = sched
                if len(self._schedules) > 64:
                    self._schedules.popitem(last=False)
            else:
                self._schedules.move_to_end(key)
        return sched

    # -- posting a call -----------------------------------------------------------------
    def _post(self, coll: Collective, send: np.ndarray | None, recv: np.ndarray | None,
              count: int, root: int = 0, op=None, algorithm: str | None = None,
              dtype: np.dtype | None = None, after=None) -> Request:
        if self._freed:
            raise InvalidArgument(f"{self!r} was freed")
        dt = dtype if dtype is not None else (
            send.dtype if send is not None else (recv.dtype if recv is not None else _UINT8))
        # What the call derives from its arguments (root check, op, algorithm, pipelining,
        # schedule, dtype) depends only on them and this communicator (its configuration is
        # fixed): a repeated call takes it from the memo. An entry is keyed by every
        # argument that can change the answer, so it never serves a call that differs.
        # Under POLYCAST_DEBUG every call takes the full path (it logs).
        key = None
        if type(count) is int and type(root) is int and not self.config.debug_level:
            key = (coll, count, root, op, algorithm, dt, self.mcast_error)
            try:
                hit = self._calls.get(key)
            except TypeError:                   # an unhashable argument: the full path
                key = hit = None
        else:
            hit = None
        if hit is None:
            hit = self._derive(coll, count, root, op, algorithm, dt)
            if key is not None and hit[4]:
                if len(self._calls) >= _CALLS_MAX:
                    self._calls.clear()         # bounded: a call repeats its arguments
                self._calls[key] = hit
        sched, itemsize, dtname, opname, _ = hit
        return self._post_built(sched, send, recv, itemsize, dtname, opname, after)

    def _derive(self, coll: Collective, count: int, root, op, algorithm, dtype):
        """(schedule, itemsize, dtype name, op name, whether it may be memoized) of a call;
        raises what the call's arguments are refused with."""
        if coll.rooted:
            root = self._check_root(root)
        opname = ""
        if coll.has_op:
            opname = _ops.get(op if op is not None else "sum").name
        dt = np.dtype(dtype)
        nbytes = coll.total_elements(self.size, count) * dt.itemsize
        algo = self.choose_algorithm(coll, nbytes, algorithm)
        sched = self._schedule(coll, algo, count, root if coll.rooted else 0, nbytes)
        asked = (algorithm or self.config.algorithm(coll) or "auto").lower()
        if self.config.debug_level:
            choice.log(self, coll, nbytes, algo, sched.options.get("nchunks", 1),
                       auto=algo == choice.plan(self, coll, nbytes, False).algorithm
                       and asked == "auto")
        # A multicast algorithm asked for without multicast falls back with a warning on
        # every call: not memoized, so the warning stays.
        memo = asked == "auto" or asked == algo
        return sched, dt.itemsize, dtype_name(dt), opname, memo

    def _post_built(self, sched, send, recv, itemsize: int, dtname: str, opname: str,
                    after) -> Request:
        """Register this rank's arrays for ``sched`` and post it to the driver."""
        drv = self._driver
        req_id = drv.new_request_id()
        drv.buffers.register(req_id, sched, self.rank, send, recv, opname or None)
        rank = self.rank
        req = Request(req_id, self.id, lambda: f"rank {rank}: {sched.describe()}",
                      self.timeout_seconds)
        req.on_done = after
        drv.post(self.id, req, sched, itemsize, dtname, opname)
        return req

    def _direct_keep(self, req, key: tuple, send, recv) -> None:
        """A call ``key`` = (collective, algorithm, op or root) with these arrays was just
        posted (an I-variant) or completed: when the compiled replay ran it whole, keep its
        shape so the next such call goes straight there
        (:mod:`polycast.runtime.driver.direct`). Only
        calls whose path cannot change with the arrays: an explicit engine algorithm, or
        ``auto`` where symmetric memory cannot take it (POLYCAST_SYMM=0, other hosts)."""
        shape = getattr(req, "replay", None)
        if shape is None or self._freed:
            return
        coll, algorithm = key[0], key[1]
        if algorithm is None or algorithm.lower() == "auto":
            if self.config.symm and _routing._members_on_one_host(self):
                return
        elif algorithm.lower() == _routing.NAME:
            return
        for arr in (send, recv):
            # (arrays the helper would refuse on every call are not worth keeping)
            if arr is not None and (type(arr) is not np.ndarray
                                    or not arr.flags.c_contiguous):
                return
        if send is not None and recv is not None \
                and (send is recv or np.shares_memory(send, recv)):
            return                      # aliased (taken as IN_PLACE): the full path's
        make = getattr(self._driver, "direct_call", None)
        if make is None or self.config.debug_level:
            return
        kept = self._direct.setdefault(key, [])
        dt = (recv if recv is not None else send).dtype if (recv is not None
                                                             or send is not None) else None
        sizes = (-1 if send is None else send.size, -1 if recv is None else recv.size)
        for dc in kept:     # kept already (its calls are refused: arrays it cannot take)
            if dc.dtype is dt and (dc.nsend, dc.nrecv) == sizes and dc.schedule is shape[0]:
                return
        dc = make(self.id, shape, send, recv, self.timeout_seconds)
        if dc is not None:
            kept.insert(0, dc)
            del kept[4:]                # a few sizes a key; the newest first

    # -- registered memory ------------------------------------------------------------------
    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A new array to use as a buffer of this rank's calls. With progress="offload" it
        lies in the rank's registered memory, which the offload process uses in place (no
        staging copies, see :mod:`polycast.runtime.offload`); in-process it is a plain
        ``np.empty``. Not collective."""
        alloc = getattr(self._driver, "empty", None)
        return alloc(shape, dtype) if alloc is not None else np.empty(shape, dtype)

    def _check_root(self, root) -> int:
        if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < self.size:
            raise InvalidArgument(f"root {root!r} out of range: valid roots are "
                                  f"0..{self.size - 1}")
        return int(root)

    def _refused(self, call: str, exc: BaseException) -> BaseException:
        """A call failed its checks on this rank before it was posted: the engine still
        takes the call's turn and aborts the peers' call with the reason (so every rank
        raises, and every rank's next call matches). Returns the error to raise here:
        InvalidArgument (a raw TypeError/ValueError from checking becomes one)."""
        err = exc
        if not isinstance(exc, PolycastError):
            if not isinstance(exc, (TypeError, ValueError, IndexError, OverflowError,
                                    AttributeError, BufferError)):
                return exc                      # not an argument problem: as it is
            err = InvalidArgument(f"{call}: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
        refuse = getattr(self._driver, "refuse", None)
        if not self._freed and refuse is not None:
            try:
                refuse(self.id, f"rank {self.rank}: {err}")
            except PolycastError:
                pass                            # a dead progress thread: nobody to tell
        return err

    def refuse(self, coll, exc: BaseException, *, algorithm: str | None = None
               ) -> BaseException:
        """This rank cannot make its next ``coll`` call: a check made *outside* Comm
        failed (polycast.torch's on a tensor). Takes the call's turn on the path every rank
        takes for it (symmetric memory or the engine), so the peers raise at once naming
        this rank and every rank's next call matches, as when Comm's own checks fail.
        Returns the error to raise here."""
        coll = Collective.parse(coll)
        if coll in _SYMM_STAGED and _routing.auto_staged(self, coll, algorithm, _NO_BUFFER):
            err = exc if isinstance(exc, InvalidArgument) else \
                InvalidArgument(f"{coll}: {exc}")
            try:
                with _symm.common._telling_peers(self, coll.value):
                    raise err       # joins the call's opening barrier as "cannot take part"
            except InvalidArgument:
                return err
        return self._refused(coll.value, exc)

    # -- symmetric memory (one host) ------------------------------------------------------
    def takes_symm(self, coll: Collective, dtype, algorithm: str | None = None,
                   nbytes: int | None = None) -> bool:
        """Whether an ``auto`` call of ``coll`` on ordinary arrays of ``dtype`` (of
        ``nbytes``, the collective's size S; None: of any size the planner sends there)
        runs through symmetric memory (staged) rather than an engine schedule. Collective
        the first time on a communicator (it may set up the symmetric state): call it on
        every rank."""
        return _routing.auto_staged(self, Collective.parse(coll), algorithm,
                                 np.empty(0, np.dtype(dtype)), nbytes)

    def symm_empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A new array in shared memory that every rank of this (single-host) communicator
        maps; collective: every rank calls it with the same shape and dtype. Allgather,
        Reduce_scatter_block and Allreduce then take ``algorithm="symm"`` (and pick it under
        ``auto``) with it as the source buffer: each rank reads its peers' arrays directly
        (no copy into the staging buffer that ``auto`` uses for ordinary arrays).
        Freed with the communicator. See :mod:`polycast.runtime.symm`. With
        progress="offload" the offload process carries every call, so this is registered
        memory (:meth:`empty`) and the "symm" algorithm is not available."""
        if getattr(self._driver, "empty", None) is not None:
            return self.empty(shape, dtype)
        arr = _symm.alloc(self, shape, dtype)
        # Calls now route by buffer (symmetric or not): no more one-call fast path.
        self._symm_state.bar.fast_off()
        return arr

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

    def _make_child(self, comm_id: int, members: list[int], config=None) -> "Comm":
        """A new communicator of ``members`` on this one's driver, with this one's settings
        (or ``config``: tests make one with other settings so)."""
        err = self._driver.add_comm(comm_id, members)
        return type(self)(self._driver, comm_id, members, self.timeout_seconds, err,
                          config if config is not None else self.config)

    def Free(self) -> None:
        if self._freed:
            return
        self._freed = True
        self._direct = {}
        _symm.free(self)
        if self.id == 0:
            # The world, or a communicator polycast.torch made with lifecycle.open_comm: it
            # owns its driver (a freed world is made anew by init()).
            self._driver.close()
        else:
            self._driver.free_comm(self.id)

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> None:
        self.Free()

    def stats(self):
        """The engine's counters for this communicator (messages, drops, recovery...)."""
        return self._driver.stats(self.id)
