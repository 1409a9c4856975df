"""Reduction ops: the predefined ones MPI users reach for, and user-defined ones.

>>> polycast.SUM, polycast.BAND, polycast.MAXLOC          # predefined (also by name: "sum")
>>> def absmax(invec, inoutvec, dtype):                   # mpi4py's signature: the result
...     np.maximum(np.abs(invec), np.abs(inoutvec), out=inoutvec)     # goes into inoutvec
>>> ABSMAX = polycast.Op.Create(absmax, commute=True)
>>> comm.Allreduce(x, y, op=ABSMAX)

Reductions are applied where data lands, by the driver's memory operations
(:mod:`polycast.memory`), so every process must know every op by the same name: ops made by
:meth:`Op.Create` are numbered in creation order (``user:0``, ``user:1``, ...) and every rank
must create them in the same order (as MPI programs do). The name travels in the call
signature, so ranks passing different ops raise MismatchError.

Which dtypes an op takes (MPI's rules, in numpy's terms; anything else is InvalidArgument
before anything moves, on every rank):

========================= =====================================================
op                        dtypes
========================= =====================================================
sum, prod                 integers, floats, complex
min, max                  integers, floats
avg (polycast's)          integers (floor division, as NCCL), floats, complex
land, lor, lxor           integers, bool
band, bor, bxor           integers (signed and unsigned), bool
maxloc, minloc            pairs: a structured dtype of two fields (value, index),
                          e.g. ``polycast.ops.pair_dtype("f8")``
user-defined              any fixed-size dtype (the function decides)
========================= =====================================================

A user op with ``commute=False`` is applied in rank order (MPI's guarantee for
non-commutative ops): the communicator gathers the inputs and folds them in order rather
than running a tree or ring schedule, which is slower; say ``commute=True`` when you can.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from .collectives import ReduceOp
from .errors import InvalidArgument, UnknownName

_INT = "iu"
_NUM = "iuf"


def _land(a, b, out):
    np.logical_and(a != 0, b != 0, out=out, casting="unsafe")


def _lor(a, b, out):
    np.logical_or(a != 0, b != 0, out=out, casting="unsafe")


def _lxor(a, b, out):
    np.logical_xor(a != 0, b != 0, out=out, casting="unsafe")


def _loc(better):
    def combine(a, b, out):
        va, vb = a[a.dtype.names[0]], b[b.dtype.names[0]]
        ia, ib = a[a.dtype.names[1]], b[b.dtype.names[1]]
        take_b = better(vb, va) | ((vb == va) & (ib < ia))
        res = np.where(take_b, b, a)
        out[...] = res
    return combine


class Op:
    """A reduction op. Predefined ones are module constants (``polycast.SUM``...);
    :meth:`Create` makes user-defined ones."""

    __slots__ = ("name", "combine", "commute", "kinds", "pairs", "fn", "_freed")

    def __init__(self, name: str, combine, commute: bool = True, kinds: str = "",
                 pairs: bool = False, fn=None) -> None:
        self.name = name
        self.combine = combine          # combine(a, b, out=...): out = a op b, in place
        self.commute = commute
        self.kinds = kinds              # numpy dtype kinds taken ("" with fn: any)
        self.pairs = pairs              # takes (value, index) pairs
        self.fn = fn                    # the user's function, for user ops
        self._freed = False

    def __repr__(self) -> str:
        return f"<polycast.Op {self.name}>"

    def __reduce__(self):
        # Pickled (e.g. into a Ray task) by name: predefined ops are the same object there.
        if self.name in _BY_NAME and _BY_NAME[self.name] is self and self.fn is None:
            return (get, (self.name,))
        raise TypeError(f"{self!r}: user ops cannot be pickled; create them on every rank")

    @property
    def builtin(self) -> bool:
        """One of the five every path implements (sum, prod, min, max, avg), symmetric
        memory included."""
        return self.name in _BUILTIN

    @classmethod
    def Create(cls, fn: Callable, commute: bool = False) -> "Op":
        """A user op from ``fn(invec, inoutvec, dtype)`` which stores ``invec op
        inoutvec`` into ``inoutvec`` (numpy arrays; returning an array instead is also
        accepted). Call it on every rank, in the same order."""
        if not callable(fn):
            raise InvalidArgument(f"Op.Create needs a callable, got {type(fn).__name__}")

        def combine(a, b, out):
            # The engine folds an incoming block b into the local one a: out = b op a
            # (MPI's invec op inoutvec, the schedule IR's order). Only the scan schedules
            # rely on it (polycast.algorithms.scan); other collectives take
            # non-commutative ops through the ordered path (see the module docstring).
            res = fn(b, out if out is a else a, out.dtype)
            if res is not None and res is not out:
                out[...] = res
        with _LOCK:
            op = cls(f"user:{len(_USER)}", combine, bool(commute), "", False, fn)
            _USER.append(op)
            _BY_NAME[op.name] = op
        return op

    def Free(self) -> None:
        """Forget a user op (its name is not reused)."""
        if self.fn is None:
            raise InvalidArgument(f"{self!r} is predefined and cannot be freed")
        self._freed = True
        _BY_NAME.pop(self.name, None)

    def Is_commutative(self) -> bool:
        return self.commute

    def Reduce_local(self, inbuf, inoutbuf) -> None:
        """``inoutbuf = inbuf op inoutbuf`` on this process (mpi4py's Op.Reduce_local);
        buffers or message specs of the same count and dtype."""
        from .buffers import message       # comm imports ops: import when used
        a = message(inbuf, "inbuf")
        b = message(inoutbuf, "inoutbuf", writable=True)
        if a.size != b.size or a.dtype != b.dtype:
            raise InvalidArgument(f"Reduce_local: inbuf ({a.size} x {a.dtype}) and "
                                  f"inoutbuf ({b.size} x {b.dtype}) must match")
        self.check(b.dtype, "Reduce_local: ")
        if self.fn is not None:
            res = self.fn(a, b, b.dtype)
            if res is not None and res is not b:
                b[...] = res
        else:
            self.combine(a, b, out=b)       # (np.maximum/minimum: out by keyword)

    def check(self, dtype: np.dtype, where: str = "") -> None:
        """InvalidArgument unless this op can combine elements of ``dtype``."""
        if self._freed:
            raise InvalidArgument(f"{where}{self!r} was freed")
        if self.fn is not None:
            return
        if self.pairs:
            if dtype.names is None or len(dtype.names) != 2:
                raise InvalidArgument(f"{where}op {self.name} needs (value, index) pairs: a "
                                      f"structured dtype of two fields such as "
                                      f"polycast.ops.pair_dtype('f8'), got {dtype}")
            v, i = (dtype.fields[n][0] for n in dtype.names)
            if v.kind not in _NUM or i.kind not in _INT:
                raise InvalidArgument(f"{where}op {self.name} needs a numeric value and an "
                                      f"integer index, got fields {v} and {i}")
            return
        if dtype.kind not in self.kinds or dtype.names is not None:
            raise InvalidArgument(f"{where}op {self.name} cannot combine {dtype} elements "
                                  f"(it takes {_kinds_text(self.kinds)})")

    def __call__(self, x, y):
        """``x op y`` on Python objects or arrays (used by the object methods)."""
        if self.pairs:
            (vx, ix), (vy, iy) = x, y
            better = (vx > vy) if self.name == "maxloc" else (vx < vy)
            return x if better or (vx == vy and ix <= iy) else y
        if self.name in _PY:
            return _PY[self.name](x, y)
        a, b = np.asarray(x), np.asarray(y)
        out = np.array(a, copy=True)
        self.combine(a, b, out=out)
        return out if out.ndim else out[()]


def _kinds_text(kinds: str) -> str:
    names = {"i": "signed integers", "u": "unsigned integers", "f": "floats",
             "c": "complex", "b": "bool"}
    return ", ".join(names[k] for k in kinds)


def pair_dtype(value="f8", index="i4") -> np.dtype:
    """The (value, index) dtype MAXLOC and MINLOC combine (as MPI's FLOAT_INT and kin)."""
    return np.dtype([("value", value), ("index", index)])


_LOCK = threading.Lock()
_USER: list[Op] = []

SUM = Op("sum", np.add, kinds="iufc")
PROD = Op("prod", np.multiply, kinds="iufc")
MIN = Op("min", np.minimum, kinds=_NUM)
MAX = Op("max", np.maximum, kinds=_NUM)
AVG = Op("avg", np.add, kinds="iufc")           # summed, divided once at the end
LAND = Op("land", _land, kinds="iub")
LOR = Op("lor", _lor, kinds="iub")
LXOR = Op("lxor", _lxor, kinds="iub")
BAND = Op("band", np.bitwise_and, kinds="iub")
BOR = Op("bor", np.bitwise_or, kinds="iub")
BXOR = Op("bxor", np.bitwise_xor, kinds="iub")
MAXLOC = Op("maxloc", _loc(np.greater), pairs=True)
MINLOC = Op("minloc", _loc(np.less), pairs=True)

PREDEFINED = (SUM, PROD, MIN, MAX, AVG, LAND, LOR, LXOR, BAND, BOR, BXOR, MAXLOC, MINLOC)
_BY_NAME: dict[str, Op] = {op.name: op for op in PREDEFINED}
_BUILTIN = frozenset(o.value for o in ReduceOp)
_PY = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "min": min, "max": max,
       "land": lambda a, b: bool(a) and bool(b), "lor": lambda a, b: bool(a) or bool(b),
       "lxor": lambda a, b: bool(a) != bool(b), "band": lambda a, b: a & b,
       "bor": lambda a, b: a | b, "bxor": lambda a, b: a ^ b}


def get(op) -> Op:
    """An :class:`Op` from an Op, a :class:`~polycast.ReduceOp` or a name (``"sum"``,
    ``"MAX"``, ``"band"``); UnknownName listing the choices otherwise."""
    if isinstance(op, Op):
        if op._freed:
            raise InvalidArgument(f"{op!r} was freed")
        return op
    if isinstance(op, ReduceOp):
        return _BY_NAME[op.value]
    if isinstance(op, str):
        found = _BY_NAME.get(op.lower())
        if found is not None:
            return found
    raise UnknownName("reduction op", op, [o.name for o in PREDEFINED])
