"""One dispatch: which path runs a communicator's call, and what the communicator keeps so
that a repeated call takes that path again at once.

A :class:`polycast.Comm` method (made from the collective's :class:`Form` by
:func:`methods`) hands over one call description -- the Form, its buffers, the op or the
root, the algorithm asked for, blocking or not -- to its :class:`Dispatch`, which tries, in
this order, once for every collective:

1. a kept compiled symmetric-memory call (one host, ``auto``): the compiled helper checks
   the arrays itself and runs a call of a kept shape whole, with no Python between
   (runtime/symm/_symm_fast.c); this step runs in the method's own frame, through
   ``Dispatch.fast``, so that it costs no more Python than a method written by hand;
2. a kept direct call into the compiled replay (the engine path: a call whose shape the
   replay ran whole before; runtime/driver/direct.py);
3. the route (:mod:`.routing`): the user's symmetric buffers, ordinary arrays staged
   through symmetric memory, or
4. the engine: the planner's algorithm (:mod:`.choice`), its schedule (kept per shape),
   the arrays registered and the schedule posted.

Each kept thing answers "not mine" having done nothing, and the next step runs; the first
call of a shape takes steps 3-4, which check the arguments and raise what they are refused
with on every rank. The planner is the policy (which algorithm, symmetric memory or not);
this module carries it out and owns what the communicator keeps for it: the symmetric-memory
state, the kept calls, the per-call memo and the schedules.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import ops as _ops
from ..algorithms import build
from ..buffers import IN_PLACE, dtype_name
from ..collectives import Collective
from ..errors import InvalidArgument
from ..runtime.driver import Request
from ..runtime.symm import SymmState
from ..runtime.symm.common import _tell_peers
from ..schedule.guard import agreed
from . import choice, routing

_UINT8 = np.dtype(np.uint8)
_CALLS_MAX = 256            # the per-call memo's bound (a call repeats its arguments)
_SCHEDULES_MAX = 64         # schedules kept per communicator
# Routing asks symmetric memory about "an ordinary array" when a rank's buffer is anything
# else, so every rank takes the same path whatever it passed (bad arguments included).
_PROBE = np.empty(0, np.uint8)


def _probe(buf):
    if type(buf) is np.ndarray and not buf.dtype.hasobject:
        return buf
    return _PROBE


@dataclass(frozen=True, eq=False)
class Form:
    """How one collective takes each path: what :meth:`Dispatch.call` needs besides the
    call's arguments. The functions are the collective's (the API layer defines them):

    * ``prepare(comm, send, recv, opr) -> (send, opr, routed)``: the op parsed (or the root
      looked at), ``routed``: whether symmetric memory may take the call; raises what the
      call is refused with;
    * ``check(comm, send, recv, opr) -> args``: the arguments checked, for the staged and
      engine paths;
    * ``symm(dispatch, send, recv, opr, in_place, blocking) -> Request``: the user's
      symmetric buffers (None: not offered);
    * ``staged(state, args, blocking) -> Request | None``: ordinary arrays through symmetric
      memory (None: the engine takes it);
    * ``engine(comm, args, algorithm) -> Request | callable``: post the schedule; a callable
      is run after (a non-commutative op's reduction in rank order, made of other calls).
    """

    coll: Collective
    name: str                    # the call, in error messages ("Allreduce")
    prepare: Callable
    check: Callable
    engine: Callable
    symm: Callable | None = None
    staged: Callable | None = None
    fast: int = -1               # the compiled symm helper's kind (-1: never kept there)
    keeps: bool = False          # repeated calls kept as direct calls into the replay
    key_type: type | None = None     # the op's or root's type a kept call needs (None: any)
    keeps_send: bool = True      # (a broadcast keeps its buffer as recv only)


class Dispatch:
    """The paths of one communicator's calls (see the module docstring)."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.symm: SymmState | None = None      # symmetric memory, once made
        self.symm_creating = False              # (its making runs object collectives)
        self.symm_refused: str | None = None    # why it was refused on every rank
        # (collective, algorithm, op or root) -> [DirectCall]: repeated calls the compiled
        # replay runs whole, taken straight there (runtime/driver/direct.py)
        self.direct: dict = {}
        self.calls: dict = {}           # call arguments -> what _derive made of them
        self.schedules: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()
        self.plans = choice.Plans()     # the planner's answers for this communicator
        self.one_host: bool | None = None       # every member on this host (asked once)
        self.symm_answers: dict = {}    # (collective, S, multicast) -> symm wins (planner)
        # Step 1's entry: the compiled helper's ``call``, bound once, while it keeps calls
        # (EpochBarrier.fast sets and clears it); None: step 1 declines at once.
        self.fast: Callable | None = None

    # -- the one ladder ----------------------------------------------------------------------
    # Step 1 (the kept compiled call) runs in the method's own frame: see :func:`methods`.
    def fast_done(self, form: Form, got, blocking: bool):
        """The end of a step-1 call the compiled helper took (``got``: True, or what
        EpochBarrier.fast_rest finishes): None (``blocking``), else its Request."""
        bar = self.symm.bar
        if blocking:
            return None if got is True else bar.fast_rest(got)
        return bar.fast_request(got, form.coll.value)

    def call(self, form: Form, send, recv, opr, algorithm: str | None, blocking: bool):
        """Steps 2-4 of one call (step 1 declined it): None once done (``blocking``), else
        its Request."""
        key = None
        if form.keeps and (form.key_type is None or type(opr) is form.key_type):
            key = (form.coll, algorithm, opr)
            if self.direct:
                for dc in self.direct.get(key, ()):
                    got = dc.call(send, recv, opr, not blocking)
                    if got is not False:
                        return None if blocking else got
        req = self.route(form, send, recv, opr, algorithm, blocking)
        if blocking:
            req.Wait()
        if key is not None and getattr(req, "replay", None) is not None:
            self.keep(req, key, send if form.keeps_send else None, recv)
        return None if blocking else req

    def route(self, form: Form, send, recv, opr, algorithm, blocking: bool) -> Request:
        """Steps 3-4: symmetric memory where the route says so, else the engine."""
        comm = self.comm
        try:
            send, opr, routed = form.prepare(comm, send, recv, opr)
        except Exception as exc:
            raise comm._refused(form.name, exc)
        if routed:
            in_place = send is IN_PLACE
            path = routing.route(self, form.coll, algorithm, _probe(send), _probe(recv),
                                 in_place)
            if path is routing.SYMM and form.symm is not None:
                return form.symm(self, send, recv, opr, in_place, blocking)
            if path is routing.STAGED:
                try:
                    args = form.check(comm, send, recv, opr)
                except InvalidArgument:
                    _tell_peers(self.symm, form.coll.value)
                    raise
                req = form.staged(self.symm, args, blocking)
                if req is not None:
                    return req
        try:
            got = form.engine(comm, form.check(comm, send, recv, opr), algorithm)
        except Exception as exc:
            raise comm._refused(form.name, exc)
        return got if isinstance(got, Request) else got()

    # -- the engine path ------------------------------------------------------------------
    def post(self, coll: Collective, send: np.ndarray | None, recv: np.ndarray | None,
             count: int, root: int = 0, op=None, algorithm: str | None = None,
             dtype: np.dtype | None = None, after=None) -> Request:
        """Post a call's schedule to the engine (the arrays checked by the caller)."""
        comm = self.comm
        if comm._freed:
            raise InvalidArgument(f"{comm!r} was freed")
        dt = dtype if dtype is not None else (
            send.dtype if send is not None else (recv.dtype if recv is not None else _UINT8))
        # What the call derives from its arguments (root check, op, algorithm, pipelining,
        # schedule, dtype) depends only on them and this communicator (its configuration is
        # fixed): a repeated call takes it from the memo. An entry is keyed by every
        # argument that can change the answer, so it never serves a call that differs.
        # Under POLYCAST_DEBUG every call takes the full path (it logs).
        key = None
        if type(count) is int and type(root) is int and not comm.config.debug_level:
            key = (coll, count, root, op, algorithm, dt, comm.mcast_error)
            try:
                hit = self.calls.get(key)
            except TypeError:                   # an unhashable argument: the full path
                key = hit = None
        else:
            hit = None
        if hit is None:
            hit = self._derive(coll, count, root, op, algorithm, dt)
            if key is not None and hit[4]:
                if len(self.calls) >= _CALLS_MAX:
                    self.calls.clear()          # bounded: a call repeats its arguments
                self.calls[key] = hit
        sched, itemsize, dtname, opname, _ = hit
        return self.post_built(sched, send, recv, itemsize, dtname, opname, after)

    def _derive(self, coll: Collective, count: int, root, op, algorithm, dtype):
        """(schedule, itemsize, dtype name, op name, whether it may be memoized) of a call;
        raises what the call's arguments are refused with."""
        comm = self.comm
        if coll.rooted:
            root = comm._check_root(root)
        opname = ""
        if coll.has_op:
            opname = _ops.get(op if op is not None else "sum").name
        dt = np.dtype(dtype)
        nbytes = coll.total_elements(comm.size, count) * dt.itemsize
        algo = choice.choose_algorithm(comm, coll, nbytes, algorithm)
        nchunks = choice.pipeline_nchunks(comm, coll, algo, nbytes)
        sched = self.schedule(coll, algo, count, root if coll.rooted else 0, nchunks)
        asked = (algorithm or comm.config.algorithm(coll) or "auto").lower()
        if comm.config.debug_level:
            choice.log(comm, coll, nbytes, algo, sched.options.get("nchunks", 1),
                       auto=algo == choice.plan(comm, coll, nbytes, False).algorithm
                       and asked == "auto")
        # A multicast algorithm asked for without multicast falls back with a warning on
        # every call: not memoized, so the warning stays.
        memo = asked == "auto" or asked == algo
        return sched, dt.itemsize, dtype_name(dt), opname, memo

    def schedule(self, coll: Collective, algo: str, count: int, root: int, nchunks: int,
                 counts=None):
        """The schedule, from this communicator's cache (schedules are pure data);
        ``counts``: a vector call's (polycast.schedule.vector)."""
        comm = self.comm
        key = (coll, algo, count, root, nchunks, counts)
        with self.lock:
            sched = self.schedules.get(key)
            if sched is None:
                # agreed(): no rank may finish a call another rank refused (see
                # polycast.schedule.guard), so rooted schedules get an entry barrier.
                sched = agreed(build(coll, algo, comm.size, count, root=root, nchunks=nchunks,
                                     counts=counts,
                                     max_schedule_nbytes=comm.config.max_schedule_nbytes))
                self.schedules[key] = sched
                if len(self.schedules) > _SCHEDULES_MAX:
                    self.schedules.popitem(last=False)
            else:
                self.schedules.move_to_end(key)
        return sched

    def post_built(self, sched, send, recv, itemsize: int, dtname: str, opname: str,
                   after=None) -> Request:
        """Register this rank's arrays for ``sched`` and post it to the driver."""
        comm = self.comm
        drv = comm._driver
        req_id = drv.new_request_id()
        drv.buffers.register(req_id, sched, comm.rank, send, recv, opname or None)
        rank = comm.rank
        req = Request(req_id, comm.id, lambda: f"rank {rank}: {sched.describe()}",
                      comm.timeout_seconds)
        req.on_done = after
        drv.post(comm.id, req, sched, itemsize, dtname, opname)
        return req

    # -- kept direct calls ---------------------------------------------------------------
    def keep(self, req, key: tuple, send, recv) -> None:
        """A call ``key`` = (collective, algorithm, op or root) with these arrays was just
        posted (an I-variant) or completed: when the compiled replay ran it whole, keep its
        shape so the next such call goes straight there (runtime/driver/direct.py). Only
        calls whose path cannot change with the arrays: an explicit engine algorithm, or
        ``auto`` where symmetric memory cannot take it (POLYCAST_SYMM=0, other hosts)."""
        comm = self.comm
        shape = getattr(req, "replay", None)
        if shape is None or comm._freed:
            return
        algorithm = key[1]
        if algorithm is None or algorithm.lower() == "auto":
            if comm.config.symm and routing.members_on_one_host(self):
                return
        elif algorithm.lower() == routing.NAME:
            return
        for arr in (send, recv):
            # (arrays the helper would refuse on every call are not worth keeping)
            if arr is not None and (type(arr) is not np.ndarray
                                    or not arr.flags.c_contiguous):
                return
        if send is not None and recv is not None \
                and (send is recv or np.shares_memory(send, recv)):
            return                      # aliased (taken as IN_PLACE): the full path's
        make = getattr(comm._driver, "direct_call", None)
        if make is None or comm.config.debug_level:
            return
        kept = self.direct.setdefault(key, [])
        dt = (recv if recv is not None else send).dtype if (recv is not None
                                                             or send is not None) else None
        sizes = (-1 if send is None else send.size, -1 if recv is None else recv.size)
        for dc in kept:     # kept already (its calls are refused: arrays it cannot take)
            if dc.dtype is dt and (dc.nsend, dc.nrecv) == sizes and dc.schedule is shape[0]:
                return
        dc = make(comm.id, shape, send, recv, comm.timeout_seconds)
        if dc is not None:
            kept.insert(0, dc)
            del kept[4:]                # a few sizes a key; the newest first

    # -- symmetric memory ----------------------------------------------------------------
    def symm_state(self, create: bool = False) -> SymmState | None:
        """The communicator's symmetric state; ``create``: make it now if there is none
        (collective: every rank is making the same call)."""
        st = self.symm
        if st is None and create:
            # Making the state runs object allgathers on this communicator: they must take
            # the engine, not the auto symm path that would make the state again.
            self.symm_creating = True
            try:
                st = self.symm = SymmState(self.comm)
            finally:
                self.symm_creating = False
        return st

    def free(self) -> None:
        """Forget what is kept and free the symmetric memory (the communicator is freed)."""
        self.direct = {}
        self.fast = None
        st, self.symm = self.symm, None
        if st is not None:
            st.free()


# -- the methods -------------------------------------------------------------------------
# Each buffer collective's two methods (blocking and I-form) are made here from its Form, so
# the ladder is written once and step 1 (a kept compiled call: a small call's whole cost in
# Python is this frame) runs in the method's own frame, one attribute away from the helper,
# as cheap as a method with the step written into it by hand; a call step 1 declines goes
# on to Dispatch.call. Generated from source (as dataclasses makes __init__) so that each
# method keeps mpi4py's signature: its parameter names, keywords and defaults.
_METHOD = '''\
def {name}(self, {params}*, algorithm: str | None = None) -> {returns}:
    d = self._dispatch
{step1}    return d.call(form, {args}, algorithm, {blocking})
'''
_STEP1 = '''\
    fast = d.fast
    if fast is not None and algorithm is None:
        got = fast({kind}, {args}, {nonblocking})
        if got is not False:
            return {done}
'''


def methods(form: Form, params: str, args: str):
    """(the blocking method, the I-form) of ``form`` for :class:`polycast.Comm`:
    ``params`` their parameters in mpi4py's names and defaults (``"sendbuf, recvbuf,
    op='sum'"``), ``args`` the call's send buffer, recv buffer and op or root in those
    names (``"sendbuf, recvbuf, op"``)."""
    made = []
    for blocking in (True, False):
        name = form.name if blocking else "I" + form.name[0].lower() + form.name[1:]
        step1 = ""
        if form.fast >= 0:
            step1 = _STEP1.format(
                kind=form.fast, args=args, nonblocking=not blocking,
                done="None if got is True else d.fast_done(form, got, True)" if blocking
                else "d.fast_done(form, got, False)")
        src = _METHOD.format(name=name, params=f"{params}, " if params else "",
                             returns="None" if blocking else "Request", step1=step1,
                             args=args, blocking=blocking)
        space = {"form": form, "Request": Request}
        exec(compile(src, f"<polycast.Comm.{name}>", "exec"), space)
        fn = space[name]
        fn.__qualname__ = f"Comm.{name}"
        fn.__module__ = "polycast"
        fn.__doc__ = (f"mpi4py's ``{name}``{'' if blocking else ': returns its Request'} "
                      f"(the path: :mod:`polycast.dispatch.call`).")
        made.append(fn)
    return tuple(made)
