"""Scatter and gather algorithms.

scatter: part r of the root's ``send`` (P parts of count elements) ends in rank r's
``recv``. gather: rank r's ``send`` ends in part r of the root's ``recv``. Every part is cut
into ``nchunks`` pieces (block = part * nchunks + piece).

The binomial forms work in relative ranks v = r - root: v's subtree is the ranks
[v, v + size(v)) (size = v's lowest set bit, clipped to P), so a rank that forwards holds
the parts of its subtree in ``tmp`` part ``u - v`` for relative rank u. ``tmp`` has as many
parts as the biggest non-root subtree (the largest power of two below P).
"""

from __future__ import annotations

from ..schedule.ir import Layout, per_rank
from .broadcast import binomial_rooted
from .registry import Spec, register


def _layouts(spec: Spec):
    """(whole: P parts, one: 1 part) layouts, both cut into nchunks pieces per part; with
    ``counts`` (Gatherv/Scatterv) part p of whole and rank p's one hold counts[p]."""
    P, k = spec.nranks, spec.nchunks
    if spec.counts is not None:
        return (Layout.uneven(spec.counts, k),
                per_rank(Layout(c, 1, k) for c in spec.counts))
    return Layout(P * spec.count, P, k), Layout(spec.count, 1, k)


def _binomial_plan(spec: Spec):
    """(tree, span(v) -> range of relative ranks in v's subtree, tmp layout or None)."""
    P, k = spec.nranks, spec.nchunks
    top = 1 << (P - 1).bit_length()

    def span(v: int) -> range:
        low = v & -v if v else top
        return range(v, min(v + low, P))

    tree = binomial_rooted(P, spec.root)
    # The root's children head the biggest subtrees; only ranks with children use tmp.
    biggest = max((len(span((c - spec.root) % P)) for c in tree.children[spec.root]),
                  default=0)
    tmp = Layout(biggest * spec.count, biggest, k) if biggest > 1 else None
    if tmp is not None and spec.counts is not None:
        # tmp part j of relative rank v holds relative rank v+j's block (none past P)
        R = spec.root
        tmp = per_rank(Layout.uneven([spec.counts[(v + j + R) % P] if v + j < P else 0
                                      for j in range(biggest)], k)
                       for v in ((r - R) % P for r in range(P)))
    return tree, span, tmp


@register("scatter", "linear", "the root sends each rank its part directly; root sends "
          "(P-1)/P of its buffer, one hop", options=("counts",))
def scatter_linear(spec: Spec):
    P, R = spec.nranks, spec.root
    whole, one = _layouts(spec)
    b = spec.builder("linear", whole, one)
    b.copy(R, "send", b.blocks("send", R), "recv", b.blocks("recv"))
    for i in range(1, P):
        r = (R + i) % P
        b.send(R, r, "send", b.blocks("send", r))
        b.recv(r, R, "recv", b.blocks("recv"))
    return b.build()


@register("scatter", "binomial", "binomial tree, ceil(log2 P) rounds; each rank passes "
          "its subtree's parts on; pipelined in nchunks pieces", options=("counts",))
def scatter_binomial(spec: Spec):
    P, R, k = spec.nranks, spec.root, spec.nchunks
    whole, one = _layouts(spec)
    tree, span, tmp = _binomial_plan(spec)
    b = spec.builder("binomial", whole, one, tmp)
    b.copy(R, "send", b.blocks("send", R), "recv", b.blocks("recv"))
    for r in range(P):
        v = (r - R) % P
        kids = tree.children[r]
        for s in range(k):
            if r == R:
                # The root sends straight from its input: relative u is rank u + root.
                for c in kids:
                    b.send(r, c, "send", [((u + R) % P) * k + s for u in span((c - R) % P)])
                continue
            if not kids:
                b.recv(r, tree.parent[r], "recv", (s,))
                continue
            b.recv(r, tree.parent[r], "tmp", [(u - v) * k + s for u in span(v)])
            for c in kids:
                b.send(r, c, "tmp", [(u - v) * k + s for u in span((c - R) % P)])
            b.copy(r, "tmp", (s,), "recv", (s,))        # relative part 0 is its own
    return b.build()


@register("gather", "linear", "every rank sends its buffer to the root directly; root "
          "receives (P-1) parts, one hop", options=("counts",))
def gather_linear(spec: Spec):
    P, R = spec.nranks, spec.root
    whole, one = _layouts(spec)
    b = spec.builder("linear", one, whole)
    b.copy(R, "send", b.blocks("send"), "recv", b.blocks("recv", R))
    for i in range(1, P):
        r = (R + i) % P
        b.send(r, R, "send", b.blocks("send"))
        b.recv(R, r, "recv", b.blocks("recv", r))
    return b.build()


@register("gather", "binomial", "binomial tree, ceil(log2 P) rounds; each rank collects "
          "its subtree's parts and passes them up; pipelined in nchunks pieces",
          options=("counts",))
def gather_binomial(spec: Spec):
    P, R, k = spec.nranks, spec.root, spec.nchunks
    whole, one = _layouts(spec)
    tree, span, tmp = _binomial_plan(spec)
    b = spec.builder("binomial", one, whole, tmp)
    b.copy(R, "send", b.blocks("send"), "recv", b.blocks("recv", R))
    for r in range(P):
        v = (r - R) % P
        kids = list(reversed(tree.children[r]))      # smallest subtree is ready first
        if r != R and kids:
            b.copy(r, "send", b.blocks("send"), "tmp", b.blocks("tmp", 0))
        for s in range(k):
            if r == R:
                for c in kids:
                    b.recv(r, c, "recv", [((u + R) % P) * k + s for u in span((c - R) % P)])
                continue
            if not kids:
                b.send(r, tree.parent[r], "send", (s,))
                continue
            for c in kids:
                b.recv(r, c, "tmp", [(u - v) * k + s for u in span((c - R) % P)])
            b.send(r, tree.parent[r], "tmp", [(u - v) * k + s for u in span(v)])
    return b.build()
