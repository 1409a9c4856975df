"""What a vector schedule's ``counts`` mean, per collective (MPI's ``v`` collectives).

=============== =============================== ========================= =====================
collective      ``counts``                       ``send`` elements, rank r  ``recv`` elements, rank r
=============== =============================== ========================= =====================
allgather       P ints: rank p's block           counts[r]                  sum(counts)
gather          P ints: rank p's block           counts[r]                  sum(counts) (root)
scatter         P ints: rank p's block           sum(counts) (root)         counts[r]
reduce_scatter  P ints: rank p's result          sum(counts)                counts[r]
alltoall        P x P: counts[i][j] from i to j  sum(counts[r])             sum(counts[i][r])
=============== =============================== ========================= =====================

Blocks are packed in rank order (MPI's displacements when they are the prefix sums).
"""

from __future__ import annotations

from ..collectives import Collective
from ..errors import InvalidArgument
from .ir import Layout, PerRank, per_rank

ROWS = (Collective.ALLGATHER, Collective.GATHER, Collective.SCATTER,
        Collective.REDUCE_SCATTER)
VECTOR = ROWS + (Collective.ALLTOALL,)


def check_counts(collective: Collective, nranks: int, counts):
    """``counts`` as nested tuples of ints, or InvalidArgument saying what is wrong."""
    P = nranks
    if collective not in VECTOR:
        raise InvalidArgument(f"{collective} takes no counts (vector forms: "
                              f"{', '.join(c.value for c in VECTOR)})")

    def row(xs, what):
        try:
            out = tuple(int(x) for x in xs)
        except (TypeError, ValueError):
            raise InvalidArgument(f"{what} must be {P} integers, got {xs!r}") from None
        if len(out) != P or any(x < 0 for x in out):
            raise InvalidArgument(f"{what} must be {P} non-negative integers, got {xs!r}")
        return out

    if collective is Collective.ALLTOALL:
        try:
            rows = list(counts)
        except TypeError:
            rows = []
        if len(rows) != P:
            raise InvalidArgument(f"alltoall counts must be {P} rows of {P} integers "
                                  f"(counts[i][j]: elements rank i sends rank j)")
        return tuple(row(r, f"alltoall counts row {i}") for i, r in enumerate(rows))
    return row(counts, f"{collective} counts")


def vector_sizes(collective: Collective, nranks: int, counts) -> list[tuple[int, int]]:
    """Per rank, (send elements, recv elements) of a vector call (the table above)."""
    P, c = nranks, collective
    if c is Collective.ALLTOALL:
        return [(sum(counts[r]), sum(counts[i][r] for i in range(P))) for r in range(P)]
    total = sum(counts)
    if c in (Collective.ALLGATHER, Collective.GATHER):
        return [(counts[r], total) for r in range(P)]
    return [(total, counts[r]) for r in range(P)]      # scatter, reduce_scatter


def vector_layouts(collective: Collective, nranks: int, counts, sub: int = 1):
    """(send, recv) layouts of a vector call: each rank's own block(s) exactly as big as
    its counts say, cut into ``sub`` pieces per part (the uniform algorithms' shapes:
    one part for a rank's own block, P parts for the gathered/scattered buffer)."""
    P, c = nranks, collective
    if c is Collective.ALLTOALL:
        send = per_rank(Layout.uneven(counts[r], sub) for r in range(P))
        recv = per_rank(Layout.uneven([counts[i][r] for i in range(P)], sub)
                        for r in range(P))
        return send, recv
    whole = Layout.uneven(counts, sub)
    own = per_rank(Layout(counts[r], 1, sub) for r in range(P))
    if c in (Collective.ALLGATHER, Collective.GATHER):
        return own, whole
    return whole, own


def total_elements(collective: Collective, nranks: int, counts) -> int:
    """nccl-tests' S of a vector call in elements: the largest buffer of any rank."""
    return max(max(s, r) for s, r in vector_sizes(collective, nranks, counts))


__all__ = ["check_counts", "vector_sizes", "vector_layouts", "total_elements", "PerRank",
           "VECTOR"]
