"""Reduce algorithms: the op over every rank's ``send`` (count elements) ends in the root's
``recv``.

Each walks a tree (:mod:`polycast.algorithms.broadcast`'s helpers) upwards with
:func:`polycast.algorithms.phases.tree_reduce`, pipelined in
``nchunks`` pieces: a rank combines piece s of its own input with piece s of each child's
partial result and passes it to its parent. The partial result builds up in ``recv`` on
the root and in ``tmp`` elsewhere (``send`` is read-only input; a non-root's ``recv`` is
not its to use). Leaves pass their input on straight from ``send``.
"""

from __future__ import annotations

from ..schedule.ir import Layout
from .broadcast import binomial_rooted, chain_tree, dbtree_rooted
from .phases import Flow, Shape, tree_reduce
from .registry import Spec, register


def pipelined_reduce(spec: Spec, name: str, trees: list[Shape]):
    """Pipelined reduce up ``trees``: part h of the buffer is reduced up ``trees[h]`` in
    ``nchunks`` pieces. A parent combines its smallest subtree first (likely ready first):
    reductions into one block run in program order, and an early message waits in the
    receiver's buffer, never blocking its sender."""
    P, R, k = spec.nranks, spec.root, spec.nchunks
    lay = Layout(spec.count, len(trees), k)
    b = spec.builder(name, lay, lay, lay if P > 1 else None)
    fl = Flow(b, ["recv" if r == R else "tmp" for r in range(P)])
    for s in range(k):
        for h, t in enumerate(trees):
            tree_reduce(fl, t, (h * k + s,))
    fl.finish(R, b.blocks("recv"))
    return b.build()


@register("reduce", "binomial", "binomial tree, ceil(log2 P) rounds; pipelined in "
          "nchunks pieces")
def binomial(spec: Spec):
    return pipelined_reduce(spec, "binomial", [binomial_rooted(spec.nranks, spec.root)])


@register("reduce", "chain", "pipelined chain root-1 -> ... -> root+1 -> root; every "
          "rank sends S at most")
def chain(spec: Spec):
    return pipelined_reduce(spec, "chain", [chain_tree(spec.nranks, spec.root)])


@register("reduce", "dbtree", "NCCL's double binary tree: each half of the buffer is "
          "reduced up one tree, pipelined; every rank sends about S")
def dbtree(spec: Spec):
    return pipelined_reduce(spec, "dbtree", list(dbtree_rooted(spec.nranks, spec.root)))
