"""Allreduce algorithms. ``send`` and ``recv`` hold ``count`` elements, cut alike into
parts (as the algorithm splits the work) of ``nchunks`` pieces each. Partial sums live in
``recv`` (each block copied out of the read-only ``send`` the first time something is
reduced into it)."""

from __future__ import annotations

from ..graph.trees import binomial_tree, nccl_dbtree
from ..schedule.ir import Layout
from .phases import (Flow, chunk_blocks, mcast_round, parse_roots, pow2_below,
                     recursive_doubling, recursive_halving, ring_allgather,
                     ring_reduce_scatter, shape, tree_broadcast, tree_reduce)
from .registry import Spec, register


def _setup(spec: Spec, name: str, parts: int, **options):
    lay = Layout(spec.count, parts, spec.nchunks)
    b = spec.builder(name, lay, lay, **options)
    return b, Flow(b, ["recv"] * spec.nranks)


def _finish(fl: Flow):
    b = fl.b
    for r in range(b.nranks):
        fl.finish(r, b.blocks("recv"))
    return b.build()


@register("allreduce", "ring", "ring reduce-scatter then ring allgather over P parts, "
          "pipelined in nchunks pieces; sends 2(P-1)/P of the buffer per rank")
def ring(spec: Spec):
    P, k = spec.nranks, spec.nchunks
    b, fl = _setup(spec, "ring", P)
    ranks = list(range(P))
    seg = lambda i, s: (i * k + s,)  # noqa: E731
    ring_reduce_scatter(fl, ranks, seg, k)
    ring_allgather(fl, ranks, seg, k)
    return _finish(fl)


def dbtree_allreduce(fl: Flow, trees, k: int) -> None:
    """Half ``t`` of the buffer is reduced up tree ``t`` and broadcast back down it, piece
    by piece; both halves run at once (NCCL's double binary tree allreduce)."""
    for s in range(k):
        for t, tree in enumerate(trees):
            tree_reduce(fl, tree, (t * k + s,))
        for t, tree in enumerate(trees):
            tree_broadcast(fl, tree, (t * k + s,))


@register("allreduce", "dbtree", "NCCL's double binary tree: each half reduced up one tree "
          "and broadcast down it, pipelined; log-depth latency, about 2x the buffer per rank")
def dbtree(spec: Spec):
    b, fl = _setup(spec, "dbtree", 2)
    dbtree_allreduce(fl, [shape(t) for t in nccl_dbtree(spec.nranks)], spec.nchunks)
    return _finish(fl)


@register("allreduce", "binomial", "binomial-tree reduce to rank 0, then binomial-tree "
          "broadcast from it, pipelined in nchunks pieces")
def binomial(spec: Spec):
    b, fl = _setup(spec, "binomial", 1)
    tree = shape(binomial_tree(spec.nranks, 0))
    for s in range(spec.nchunks):
        tree_reduce(fl, tree, (s,))
        tree_broadcast(fl, tree, (s,))
    return _finish(fl)


def _fold(fl: Flow, P: int, p2: int, blocks) -> None:
    """Ranks p2.. hand their whole input to rank r - p2, which reduces it in."""
    for e in range(p2, P):
        fl.xfer(e, e - p2, blocks, reduce=True)


def _unfold(fl: Flow, P: int, p2: int, blocks) -> None:
    for e in range(p2, P):
        fl.xfer(e - p2, e, blocks)


@register("allreduce", "recdoubling", "log2(P) exchanges of the whole buffer with partners "
          "at doubling distance; any P (extra ranks fold into a partner and get the result)")
def recdoubling(spec: Spec):
    P, k = spec.nranks, spec.nchunks
    b, fl = _setup(spec, "recdoubling", 1)
    p2 = pow2_below(P)
    for s in range(k):
        _fold(fl, P, p2, (s,))
    mask = 1
    while mask < p2:
        for s in range(k):
            fl.round([(r, r ^ mask, (s,)) for r in range(p2)], reduce=True)
        mask <<= 1
    for s in range(k):
        _unfold(fl, P, p2, (s,))
    return _finish(fl)


@register("allreduce", "rabenseifner", "recursive-halving reduce-scatter then "
          "recursive-doubling allgather; any P (extra ranks fold into a partner first)")
def rabenseifner(spec: Spec):
    """Rabenseifner's algorithm over p2 parts (p2 the largest power of two <= P). The
    standard fold handles other P: rank p2+i reduces its input into rank i before, and gets
    the result from rank i after."""
    P, k = spec.nranks, spec.nchunks
    p2 = pow2_below(P)
    b, fl = _setup(spec, "rabenseifner", p2)
    for s in range(k):
        _fold(fl, P, p2, chunk_blocks(range(p2), k, s))
    groups = [[v] for v in range(p2)]
    recursive_halving(fl, groups, k)
    recursive_doubling(fl, groups, k)
    for s in range(k):
        _unfold(fl, P, p2, chunk_blocks(range(p2), k, s))
    return _finish(fl)


@register("allreduce", "mcast", "ring reduce-scatter, then every rank multicasts its reduced "
          "part once (`roots` streams at a time, token passing); sends about S(P-1)/P + S/P",
          multicast=True, options=("roots",))
def mcast(spec: Spec):
    P, k = spec.nranks, spec.nchunks
    roots = parse_roots(spec)
    b, fl = _setup(spec, "mcast", P, roots=roots)
    ranks = list(range(P))
    ring_reduce_scatter(fl, ranks, lambda i, s: (i * k + s,), k)
    mcast_round(b, ranks, lambda r: b.blocks("recv", r), roots)
    if P > 1:
        for r in range(P):
            fl.put(r, b.blocks("recv"))
    return _finish(fl)
