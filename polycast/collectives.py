"""The collectives, the reduction ops, and the buffer conventions every layer shares.

Buffer conventions (``count`` is always the per-call element count as mpi4py/NCCL use it):

=============== ====================== ====================== ==========================
collective      ``send`` elements       ``recv`` elements       result
=============== ====================== ====================== ==========================
broadcast       count (root only)      count                  root's send on every rank
reduce          count                  count (root only)      op over ranks at root
allreduce       count                  count                  op over ranks everywhere
allgather       count                  P*count                block r = rank r's send
reduce_scatter  P*count                count                  rank r gets op of block r
scatter         P*count (root only)    count                  rank r gets root's block r
gather          count                  P*count (root only)    block r = rank r's send
alltoall        P*count                P*count                recv block p = p's block r
barrier         0                      0                      nobody leaves early
scan            count                  count                  op over ranks 0..r, in order
exscan          count                  count                  op over ranks 0..r-1 (rank 0:
                                                              recv left as it was)
=============== ====================== ====================== ==========================
"""

from __future__ import annotations

import enum

from .errors import InvalidArgument, UnknownName


class Collective(str, enum.Enum):
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCE_SCATTER = "reduce_scatter"
    SCATTER = "scatter"
    GATHER = "gather"
    ALLTOALL = "alltoall"
    BARRIER = "barrier"
    SCAN = "scan"
    EXSCAN = "exscan"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: "str | Collective") -> "Collective":
        if isinstance(name, Collective):
            return name
        key = str(name).lower().replace("-", "_")
        key = {"bcast": "broadcast", "reducescatter": "reduce_scatter",
               "all_gather": "allgather", "all_reduce": "allreduce",
               "all_to_all": "alltoall"}.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise UnknownName("collective", name, [c.value for c in cls]) from None

    @property
    def has_op(self) -> bool:
        """True if the collective combines data with a reduction op."""
        return self in (Collective.REDUCE, Collective.ALLREDUCE, Collective.REDUCE_SCATTER,
                        Collective.SCAN, Collective.EXSCAN)

    @property
    def ordered(self) -> bool:
        """A prefix (scan): its op need not commute, blocks combine in rank order."""
        return self in (Collective.SCAN, Collective.EXSCAN)

    @property
    def rooted(self) -> bool:
        return self in (Collective.BROADCAST, Collective.REDUCE, Collective.SCATTER,
                        Collective.GATHER)

    def busbw_factor(self, nranks: int) -> float:
        """nccl-tests' bus-bandwidth factor (specs/measures.md)."""
        if nranks <= 1:
            return 1.0 if self in (Collective.BROADCAST, Collective.REDUCE) else 0.0
        if self is Collective.ALLREDUCE:
            return 2.0 * (nranks - 1) / nranks
        if self in (Collective.BROADCAST, Collective.REDUCE, Collective.BARRIER):
            return 1.0
        return (nranks - 1) / nranks

    def buffer_counts(self, nranks: int, count: int) -> tuple[int, int]:
        """(send elements, recv elements) per the table above."""
        P = nranks
        return {
            Collective.BROADCAST: (count, count),
            Collective.REDUCE: (count, count),
            Collective.ALLREDUCE: (count, count),
            Collective.ALLGATHER: (count, P * count),
            Collective.REDUCE_SCATTER: (P * count, count),
            Collective.SCATTER: (P * count, count),
            Collective.GATHER: (count, P * count),
            Collective.ALLTOALL: (P * count, P * count),
            Collective.BARRIER: (0, 0),
            Collective.SCAN: (count, count),
            Collective.EXSCAN: (count, count),
        }[self]

    def total_elements(self, nranks: int, count: int) -> int:
        """nccl-tests' S in elements: the size algbw divides by.

        For allgather and reduce_scatter that is the whole gathered buffer (count x P); for
        the others the larger of the two per-rank buffers.
        """
        return max(self.buffer_counts(nranks, count))


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: "str | ReduceOp") -> "ReduceOp":
        if isinstance(name, ReduceOp):
            return name
        try:
            return cls(str(name).lower())
        except ValueError:
            raise UnknownName("reduction op", name, [o.value for o in cls]) from None


def check_rank_args(nranks: int, root: int, count: int) -> None:
    """Validate the arguments every schedule generator takes."""
    if not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgument(f"nranks must be a positive integer, got {nranks!r}")
    if not isinstance(root, int) or not 0 <= root < nranks:
        raise InvalidArgument(f"root {root!r} out of range: valid roots are 0..{nranks - 1}")
    if not isinstance(count, int) or count < 0:
        raise InvalidArgument(f"count must be a non-negative integer, got {count!r}")


def count_for_nbytes(collective: Collective, nranks: int, nbytes: int, itemsize: int) -> int:
    """Per-call element count whose nccl-tests size S (:meth:`Collective.total_elements`
    x itemsize) is ``nbytes``; an error when ``nbytes`` does not split evenly."""
    if nbytes < 0:
        raise InvalidArgument(f"size must be >= 0 bytes, got {nbytes}")
    total, unit = collective.total_elements(nranks, 1), itemsize
    if collective is Collective.BARRIER:
        return 0
    if nbytes % (total * unit):
        raise InvalidArgument(
            f"{collective} of {nbytes} bytes over {nranks} ranks: the size must be a "
            f"multiple of {total * unit} bytes ({total} x {unit}-byte elements)")
    return nbytes // (total * unit)


DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64")


def parse_dtype(name):
    """A numpy dtype from a name (``"float32"``) or dtype-like; numeric types only."""
    import numpy as np
    try:
        dt = np.dtype(name)
    except TypeError:
        raise UnknownName("dtype", name, DTYPES) from None
    if dt.kind not in "iuf":
        raise UnknownName("dtype", name, DTYPES)
    return dt
