"""Broadcast algorithms: the root's ``send`` (count elements) ends in every rank's ``recv``.

Most of them walk a tree rooted at the root and pipeline the buffer through it in
``nchunks`` pieces: a rank forwards piece s to its children as soon as piece s arrived.
The tree helpers here (:func:`dbtree_rooted`, :func:`binomial_rooted`...) are shared with
:mod:`polycast.algorithms.reduce`, which walks the same trees upwards.

Trees built rooted at rank 0 (NCCL's tree 0, the binomial tree in relative ranks) are
re-rooted by relabelling: tree rank t is rank ``(t + root) mod P``.
"""

from __future__ import annotations

from ..graph.trees import binary_tree, binomial_tree, nccl_dbtree
from ..schedule.ir import Layout
from .phases import Flow, Shape, shape, tree_broadcast
from .registry import Spec, register


def _relabelled(tree, shift: int) -> Shape:
    """``tree`` (from :mod:`polycast.graph.trees`) with rank x renamed (x + shift) mod P."""
    P = tree.nranks
    return shape(tree, lambda x: (x + shift) % P)


def _bfs(root: int, children: list[list[int]]) -> list[int]:
    order = [root]
    for r in order:                       # grows while walked: a breadth-first order
        order.extend(children[r])
    return order


def reroot(t: Shape, new_root: int) -> Shape:
    """The tree with ``new_root`` as root: cut ``new_root`` from its parent and hang the old
    root under it as its first child (it heads the bigger part). Every other link is kept,
    so a rank's load differs from the original tree's only at the two ranks involved."""
    if new_root == t.root:
        return t
    parent, children = list(t.parent), [list(c) for c in t.children]
    children[parent[new_root]].remove(new_root)
    parent[new_root] = -1
    parent[t.root] = new_root
    children[new_root].insert(0, t.root)
    return Shape(new_root, parent, children, _bfs(new_root, children))


def chain_tree(P: int, root: int) -> Shape:
    """root -> root+1 -> ... -> root-1 (mod P)."""
    parent = [-1 if r == root else (r - 1) % P for r in range(P)]
    children = [[(r + 1) % P] if (r + 1) % P != root else [] for r in range(P)]
    return Shape(root, parent, children, [(root + i) % P for i in range(P)])


def star_tree(P: int, root: int) -> Shape:
    """The root is every other rank's parent (``direct``/``linear``)."""
    parent = [-1 if r == root else root for r in range(P)]
    children = [[] for _ in range(P)]
    children[root] = [(root + i) % P for i in range(1, P)]
    return Shape(root, parent, children, [(root + i) % P for i in range(P)])


def binomial_rooted(P: int, root: int) -> Shape:
    """The binomial tree (:func:`polycast.graph.trees.binomial_tree`), children largest
    subtree first (ceil(log2 P) rounds)."""
    return shape(binomial_tree(P, root))


def dbtree_rooted(P: int, root: int) -> tuple[Shape, Shape]:
    """NCCL's double binary tree, both trees rooted at ``root``.

    Both trees are relabelled by the same shift (so the complementary shape, odd ranks
    interior in one tree and leaves in the other, is kept); tree 0 then has its root at
    ``root``. Tree 1's root lands elsewhere, so ``root`` is cut from its tree-1 parent and
    tree 1's old root hangs under ``root``: one extra hop for half the data, every other
    link exactly NCCL's.
    """
    t0, t1 = nccl_dbtree(P)
    return _relabelled(t0, root), reroot(_relabelled(t1, root), root)


# --------------------------------------------------------------------------------------


def pipelined_broadcast(spec: Spec, name: str, trees: list[Shape]):
    """Pipelined broadcast down ``trees``: part h of the buffer goes down ``trees[h]``
    in ``nchunks`` pieces; each rank receives piece s from its parent, then forwards it to
    its children in order, before piece s+1. The root sends from its input."""
    k = spec.nchunks
    lay = Layout(spec.count, len(trees), k)
    b = spec.builder(name, lay, lay)
    fl = Flow(b, ["recv"] * spec.nranks)
    for s in range(k):
        for h, t in enumerate(trees):
            tree_broadcast(fl, t, (h * k + s,))
    fl.finish(spec.root, b.blocks("recv"))
    return b.build()


@register("broadcast", "direct", "the root sends the whole buffer to every rank; "
          "root sends (P-1)S, one hop")
def direct(spec: Spec):
    return pipelined_broadcast(spec, "direct", [star_tree(spec.nranks, spec.root)])


@register("broadcast", "binomial", "binomial tree, ceil(log2 P) rounds; pipelined in "
          "nchunks pieces")
def binomial(spec: Spec):
    return pipelined_broadcast(spec, "binomial", [binomial_rooted(spec.nranks, spec.root)])


@register("broadcast", "chain", "pipelined chain root -> root+1 -> ...; every rank "
          "sends S at most; P-1+nchunks-1 steps of latency")
def chain(spec: Spec):
    return pipelined_broadcast(spec, "chain", [chain_tree(spec.nranks, spec.root)])


@register("broadcast", "bintree", "pipelined binary tree (NCCL's tree 0, relabelled to "
          "the root); interior ranks send 2S")
def bintree(spec: Spec):
    return pipelined_broadcast(spec, "bintree", [_relabelled(binary_tree(spec.nranks), spec.root)])


@register("broadcast", "dbtree", "NCCL's double binary tree: each half of the buffer goes "
          "down one tree, pipelined; every rank sends about S")
def dbtree(spec: Spec):
    return pipelined_broadcast(spec, "dbtree", list(dbtree_rooted(spec.nranks, spec.root)))


@register("broadcast", "scatter_ring", "van de Geijn: binomial scatter of P parts, then a "
          "ring allgather; about 2S per rank, bandwidth-optimal for large buffers")
def scatter_ring(spec: Spec):
    """Relative rank v = r - root owns part v. The root scatters parts down the binomial
    tree (a subtree of v covers parts [v, v + size)), then the parts circulate on the ring
    v -> v+1. A rank already holds its subtree's parts after the scatter, so the ring skips
    delivering those (for the root: everything, so the ring's link into the root is idle);
    that saves sum(size - 1) part transfers over MPICH's plain ring."""
    P, R, k = spec.nranks, spec.root, spec.nchunks
    lay = Layout(spec.count, P, k)
    b = spec.builder("scatter_ring", lay, lay)
    b.copy(R, "send", b.blocks("send"), "recv", b.blocks("recv"))
    top = 1 << (P - 1).bit_length()

    def span(v: int) -> range:             # the parts of v's binomial subtree
        low = v & -v if v else top
        return range(v, min(v + low, P))

    tree = binomial_rooted(P, R)
    for r in range(P):
        v = (r - R) % P
        src = "send" if r == R else "recv"
        for s in range(k):
            if r != R:
                b.recv(r, tree.parent[r], "recv", [p * k + s for p in span(v)])
            for c in tree.children[r]:
                b.send(r, c, src, [p * k + s for p in span((c - R) % P)])
    for r in range(P):
        v = (r - R) % P
        mine, theirs = span(v), span((v + 1) % P)
        nxt, prv = (r + 1) % P, (r - 1) % P
        for i in range(P - 1):
            out_part, in_part = (v - i) % P, (v - i - 1) % P
            for s in range(k):
                if out_part not in theirs:
                    b.send(r, nxt, "recv", (out_part * k + s,))
                if in_part not in mine:
                    b.recv(r, prv, "recv", (in_part * k + s,))
    return b.build()


@register("broadcast", "mcast", "the root multicasts the buffer once; root sends S, "
          "one hop", multicast=True)
def mcast(spec: Spec):
    P, R, k = spec.nranks, spec.root, spec.nchunks
    lay = Layout(spec.count, 1, k)
    b = spec.builder("mcast", lay, lay)
    b.copy(R, "send", b.blocks("send"), "recv", b.blocks("recv"))
    if P > 1:
        b.mcast(R, "send", b.blocks("send"))
    for r in range(P):
        if r != R:
            b.mrecv(r, R, "recv", b.blocks("recv"))
    return b.build()
