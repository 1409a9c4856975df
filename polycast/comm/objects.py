"""mpi4py's lowercase methods: any picklable Python object, moved as bytes by the buffer
collectives."""

from __future__ import annotations

import functools
import pickle

import numpy as np

from .. import ops as _ops
from ..errors import InvalidArgument


class ObjectMethods:
    """Mixed into :class:`polycast.Comm`; uses its buffer collectives."""

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
        """Reduce Python objects with ``op`` (a polycast op or its name, or a 2-argument
        callable), in rank order."""
        values = self.allgather(obj)       # first: a bad op here must not strand peers
        return functools.reduce(_object_op(op), values)

    def reduce(self, obj, op="sum", root: int = 0):
        """``op`` over every rank's object, in rank order, at ``root`` (None elsewhere)."""
        values = self.gather(obj, root)
        return functools.reduce(_object_op(op), values) if self.rank == root else None

    def scan(self, obj, op="sum"):
        """``obj_0 op ... op obj_rank``."""
        values = self.allgather(obj)
        return functools.reduce(_object_op(op), values[:self.rank + 1])

    def exscan(self, obj, op="sum"):
        """``obj_0 op ... op obj_(rank-1)``; None on rank 0 (as mpi4py)."""
        values = self.allgather(obj)
        return functools.reduce(_object_op(op), values[:self.rank]) if self.rank else None

    def alltoall(self, objs) -> list:
        """``objs[i]`` goes to rank i; returns what each rank sent this one."""
        try:
            if objs is None or len(objs) != self.size:
                raise InvalidArgument(f"alltoall needs a sequence of {self.size} objects, "
                                      f"got {objs!r:.80}")
            parts = [self._dumps(o) for o in objs]
        except Exception as exc:
            raise self._refused("alltoall", exc)
        scounts = np.array([p.size for p in parts], np.int64)
        rcounts = np.empty(self.size, np.int64)
        self.Alltoall(scounts, rcounts)
        recv = np.empty(int(rcounts.sum()), np.uint8)
        self.Alltoallv([np.concatenate(parts) if parts else recv, scounts.tolist()],
                       [recv, rcounts.tolist()])
        offs = np.concatenate(([0], np.cumsum(rcounts)))
        return [pickle.loads(recv[offs[i]:offs[i + 1]].tobytes()) for i in range(self.size)]

    def barrier(self) -> None:
        self.Barrier()


def _object_op(op):
    if callable(op) and not isinstance(op, _ops.Op):
        return op
    opx = _ops.get(op)
    if opx.fn is not None:
        raise InvalidArgument(f"{opx!r} works on buffers; for objects pass a 2-argument "
                              "callable")
    return opx
