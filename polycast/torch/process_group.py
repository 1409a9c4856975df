"""``ProcessGroupPolycast``: torch.distributed's process group interface over a polycast
communicator.

torch 2.13 lets a backend's creator return a Python subclass of ``ProcessGroup``: that
object *is* the group. Its methods are reached from Python (``dist.all_reduce``, FSDP2's
``all_gather_into_tensor``) and from C++ through the pybind trampoline (DDP's reducer,
``_broadcast_coalesced``), under the names below; each turns into calls of
:mod:`polycast.torch.ops`. The identity methods (``getBackendName``, ``setGroupName``...)
are what ``init_device_mesh`` and friends need.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading

import torch.distributed as dist

from .. import config
from ..collectives import Collective
from ..errors import InvalidArgument, PolycastError
from . import ops, p2p
from ..comm.lifecycle import close_comm
from .rendezvous import open_comm

BACKEND_NAME = "polycast"
_C = Collective             # short, for the method table of ProcessGroupPolycast


@dataclasses.dataclass
class Options:
    """Backend options: ``dist.init_process_group("polycast",
    pg_options=polycast.torch.Options(allgather="mcast"))`` (also ``new_group``).

    One algorithm per collective (names as ``polycast algos`` lists them, or "auto"); a
    collective left None follows ``POLYCAST_<COLLECTIVE>_ALGO``, else ``auto``.
    ``timeout_seconds`` bounds every wait of the group (default: POLYCAST_TIMEOUT if set,
    else the timeout given to init_process_group/new_group)."""

    broadcast: str | None = None
    reduce: str | None = None
    allreduce: str | None = None
    allgather: str | None = None
    reduce_scatter: str | None = None
    scatter: str | None = None
    gather: str | None = None
    alltoall: str | None = None
    barrier: str | None = None
    timeout_seconds: float | None = None

    def algorithm(self, coll: Collective) -> str | None:
        return getattr(self, coll.value, None)      # scan/exscan: torch has none

    def validate(self, comm) -> None:
        """Unknown or unsupported algorithm names raise now, naming the choices."""
        for coll in Collective:
            name = self.algorithm(coll)
            if name is not None:
                comm.choose_algorithm(coll, 0, name)
        if self.timeout_seconds is not None and not self.timeout_seconds > 0:
            raise InvalidArgument(f"Options.timeout_seconds must be > 0, got "
                                  f"{self.timeout_seconds!r}")


def _timeout_seconds(options: Options, timeout, cfg) -> float:
    """Options.timeout_seconds, else POLYCAST_TIMEOUT when set, else torch's timeout, else
    POLYCAST_TIMEOUT's default."""
    if options.timeout_seconds is not None:
        return float(options.timeout_seconds)
    if cfg.is_set("timeout_seconds"):
        return cfg.timeout_seconds
    if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
        return timeout.total_seconds()
    return cfg.timeout_seconds


class ProcessGroupPolycast(dist.ProcessGroup):
    """A torch process group whose collectives run on polycast (CPU tensors)."""

    def __init__(self, store, rank: int, size: int, timeout=None,
                 options: Options | None = None) -> None:
        super().__init__(rank, size)
        if options is not None and not isinstance(options, Options):
            raise InvalidArgument(f"pg_options for the polycast backend must be "
                                  f"polycast.torch.Options, got {type(options).__name__}")
        self.options = options or Options()
        cfg = config.current(rank=rank)         # the group's settings, read once
        self.comm = open_comm(store, rank, size, _timeout_seconds(self.options, timeout, cfg),
                              cfg)
        try:
            self.options.validate(self.comm)
        except BaseException:
            close_comm(self.comm)
            raise
        self._group_name = ""
        self._group_desc = ""
        self._lock = threading.Lock()

    # -- identity -------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return (f"<ProcessGroupPolycast {self._group_name or '?'} rank {self.comm.rank}/"
                f"{self.comm.size}>")

    def shutdown(self) -> None:
        close_comm(self.comm)

    def abort(self) -> None:
        close_comm(self.comm)

    def _guard(self, coll: _C, fn, *args):
        """Run an op; if this rank's tensors fail a check before Comm was called, the call
        is still refused on every rank (Comm.refuse), so the peers raise at once naming
        this rank instead of waiting or pairing this call with our next one."""
        try:
            return fn(self, *args)
        except (PolycastError, ValueError, TypeError) as exc:
            if getattr(exc, "polycast_comm_refused", False) or self.comm._freed:
                raise
            raise self.comm.refuse(coll, exc, algorithm=self.options.algorithm(coll)) \
                from None

    # -- collectives (torch's names; options objects as torch passes them) -----------------
    def broadcast(self, tensors, opts=None):
        return self._guard(_C.BROADCAST, ops.broadcast, tensors, _root(opts))

    def allreduce(self, tensors, opts=None):
        return self._guard(_C.ALLREDUCE, ops.allreduce, tensors, _op(opts))

    def allreduce_coalesced(self, tensors, opts=None):
        return self._guard(_C.ALLREDUCE, ops.allreduce_coalesced, tensors, _op(opts))

    def reduce(self, tensors, opts=None):
        return self._guard(_C.REDUCE, ops.reduce, tensors, _root(opts), _op(opts))

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._guard(_C.ALLGATHER, ops.allgather, output_tensors, input_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._guard(_C.ALLGATHER, ops.allgather_coalesced, output_lists, input_list)

    def all_gather_single(self, output, input, opts=None):
        return self._guard(_C.ALLGATHER, ops.all_gather_single, output, input)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._guard(_C.ALLGATHER, ops.all_gather_single_coalesced, outputs, inputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._guard(_C.REDUCE_SCATTER, ops.reduce_scatter, output_tensors,
                           input_tensors, _op(opts))

    def reduce_scatter_single(self, output, input, opts=None):
        return self._guard(_C.REDUCE_SCATTER, ops.reduce_scatter_single, output, input,
                           _op(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._guard(_C.REDUCE_SCATTER, ops.reduce_scatter_single_coalesced, outputs,
                           inputs, _op(opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._guard(_C.GATHER, ops.gather, output_tensors, input_tensors, _root(opts))

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._guard(_C.SCATTER, ops.scatter, output_tensors, input_tensors,
                           _root(opts))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._guard(_C.ALLTOALL, ops.alltoall, output_tensors, input_tensors)

    def all_to_all_single(self, output, input, output_split_sizes=None,
                          input_split_sizes=None, opts=None):
        return self._guard(_C.ALLTOALL, ops.all_to_all_single, output, input,
                           output_split_sizes, input_split_sizes)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._guard(_C.BARRIER, ops.barrier)

    # -- point to point: not collective, so no _guard (bad input raises on this rank) ----
    def send(self, tensors, dstRank: int, tag: int = 0):
        return p2p.send(self, tensors, dstRank, tag)

    def recv(self, tensors, srcRank: int, tag: int = 0):
        return p2p.recv(self, tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return p2p.recv(self, tensors, None, tag)


def _root(opts) -> int:
    return opts.rootRank if opts is not None else 0


def _op(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def create(dist_options, backend_options=None) -> ProcessGroupPolycast:
    """The creator torch calls (``register_backend(..., extended_api=True)``)."""
    return ProcessGroupPolycast(dist_options.store, dist_options.group_rank,
                                dist_options.group_size, dist_options.timeout,
                                backend_options)
