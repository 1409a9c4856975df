"""Reference results: what every collective must produce, computed directly with numpy.

``reference(collective, inputs, root=..., op=...)`` maps the per-rank ``send`` arrays to the
expected per-rank ``recv`` arrays (None where a rank receives nothing, e.g. non-roots of
reduce and gather), following the conventions table of :mod:`polycast.collectives`.
``make_inputs`` makes deterministic inputs whose reductions are exact in every dtype
(small integers: sums stay far below float16's 2048 exact-integer limit; products use
+-1 and +-2 only, whose partial products grow monotonically, so the result does not depend
on the order of reduction; integer overflow wraps identically in any order).
"""

from __future__ import annotations

import numpy as np

from .collectives import Collective, ReduceOp
from .errors import InvalidArgument
from .memory import apply_avg

DTYPES = ("float32", "float64", "float16", "int32", "int64", "int8", "uint8")

_REDUCE = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
           ReduceOp.MAX: np.maximum, ReduceOp.AVG: np.add}


def _dtype(dtype) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"unknown dtype {dtype!r}; valid choices: "
                              f"{', '.join(DTYPES)}") from None


def make_inputs(collective: str | Collective, nranks: int, count: int, dtype="float32",
                root: int = 0, seed: int = 0, op: str | ReduceOp = "sum") -> list[np.ndarray]:
    """Deterministic ``send`` arrays for every rank (sized per the collective's convention).

    Every rank gets an array, roots or not (a non-root's is simply unused where the
    convention says so). Values are small integers chosen so reductions are exact.
    """
    coll = Collective.parse(collective)
    dt = _dtype(dtype)
    nsend, _ = coll.buffer_counts(nranks, count)
    rng = np.random.default_rng([seed, nranks, count, root])
    ropt = ReduceOp.parse(op) if coll.has_op else None
    unsigned = np.issubdtype(dt, np.unsignedinteger)
    out = []
    for _ in range(nranks):
        if ropt is ReduceOp.PROD:
            choices = np.array([1, 2] if unsigned else [-2, -1, 1, 1, 2])
        elif unsigned:
            choices = np.arange(0, 8)
        else:
            choices = np.arange(-4, 5)
        out.append(rng.choice(choices, size=nsend).astype(dt))
    return out


def reference(collective: str | Collective, inputs: list[np.ndarray], root: int = 0,
              op: str | ReduceOp = "sum") -> list[np.ndarray | None]:
    """The expected ``recv`` array of every rank (None where the rank receives nothing)."""
    coll = Collective.parse(collective)
    P = len(inputs)
    if P < 1:
        raise InvalidArgument("reference needs the inputs of at least one rank")
    if not 0 <= root < P:
        raise InvalidArgument(f"root {root} out of range: valid roots are 0..{P - 1}")
    x = [np.asarray(a).reshape(-1) for a in inputs]
    dt = x[0].dtype

    def reduce_all(arrs: list[np.ndarray]) -> np.ndarray:
        ropt = ReduceOp.parse(op)
        acc = arrs[0].copy()
        for a in arrs[1:]:
            _REDUCE[ropt](acc, a, out=acc)
        if ropt is ReduceOp.AVG:
            apply_avg(acc, P)
        return acc

    if coll is Collective.BROADCAST:
        return [x[root].copy() for _ in range(P)]
    if coll is Collective.ALLREDUCE:
        r = reduce_all(x)
        return [r.copy() for _ in range(P)]
    if coll is Collective.REDUCE:
        return [reduce_all(x) if r == root else None for r in range(P)]
    if coll is Collective.ALLGATHER:
        g = np.concatenate(x)
        return [g.copy() for _ in range(P)]
    if coll is Collective.GATHER:
        return [np.concatenate(x) if r == root else None for r in range(P)]
    count = x[0].size // P if P else 0
    if coll is Collective.REDUCE_SCATTER:
        return [reduce_all([a[r * count:(r + 1) * count] for a in x]) for r in range(P)]
    if coll is Collective.SCATTER:
        return [x[root][r * count:(r + 1) * count].copy() for r in range(P)]
    if coll is Collective.ALLTOALL:
        return [np.concatenate([x[p][r * count:(r + 1) * count] for p in range(P)])
                for r in range(P)]
    if coll is Collective.BARRIER:
        return [np.zeros(0, dt) for _ in range(P)]
    if coll is Collective.SCAN:
        return [reduce_all(x[:r + 1]) for r in range(P)]
    if coll is Collective.EXSCAN:        # rank 0's recv is not written (MPI: undefined)
        return [None] + [reduce_all(x[:r]) for r in range(1, P)]
    raise InvalidArgument(f"no reference for {coll}")  # pragma: no cover
