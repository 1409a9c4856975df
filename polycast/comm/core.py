"""The communicator's core: who it is, how communicators are made and freed, and the
symmetric-memory and refusal hooks. A call's path and what is kept for it are the
communicator's dispatch's (:class:`polycast.dispatch.Dispatch`); the methods users call are
mixed in from :mod:`.collectives` (buffers), :mod:`.vector`, :mod:`.objects` (pickled
Python objects) and the others."""

from __future__ import annotations

import hashlib

import numpy as np

from .. import config as _config
from ..collectives import Collective
from ..dispatch import Dispatch, choice
from ..dispatch import routing as _routing
from ..errors import InvalidArgument, PolycastError
from ..runtime.driver import Driver, Request
from ..runtime.symm.common import _telling_peers

# The collectives that may take the staged symmetric-memory path (Comm.refuse).
_SYMM_STAGED = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER,
                Collective.BROADCAST)
_NO_BUFFER = np.empty(0, np.uint8)
# MPI.UNDEFINED: a Split color for "not in any new communicator" (and Waitany's "none")
from ..runtime.driver.request import UNDEFINED  # noqa: E402


class CommCore:
    """Identity, Split/Dup/Free, refusals, symmetric memory (see :class:`polycast.Comm`)."""

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
        self._dispatch = Dispatch(self)     # which path each call takes, what is kept

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

    def _post(self, coll: Collective, send, recv, count: int, root: int = 0, op=None,
              algorithm: str | None = None, dtype=None, after=None) -> Request:
        """Post a call's schedule to the engine (its arrays checked by the caller)."""
        return self._dispatch.post(coll, send, recv, count, root, op, algorithm, dtype, after)

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
        d = self._dispatch
        if coll in _SYMM_STAGED and _routing.auto_staged(d, coll, algorithm, _NO_BUFFER):
            err = exc if isinstance(exc, InvalidArgument) else \
                InvalidArgument(f"{coll}: {exc}")
            try:
                with _telling_peers(d.symm, coll.value):
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
        return _routing.auto_staged(self._dispatch, Collective.parse(coll), algorithm,
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
        if self._freed:
            raise InvalidArgument(f"{self!r} was freed")
        st = self._dispatch.symm_state(create=True)
        arr = st.alloc(shape, dtype)
        # Calls now route by buffer (symmetric or not): no more one-call fast path.
        st.bar.fast_off()
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
        self._dispatch.free()
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
