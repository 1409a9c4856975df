"""The trees collective algorithms are built on.

* NCCL's bit-trick binary tree (tree 0) and its complement (tree 1), which together form
  the double binary tree (specs/dbtree.md; NCCL 2.8.3+ ``ncclGetBtree``/``ncclGetDtree``).
  They are reproduced exactly, child slots included, so that someone who reads NCCL's
  ``Trees [c] down0/down1/down2->rank->up`` log lines sees the same shape here.
* The binomial tree of binomial broadcast/reduce.
* The hierarchical dbtree: a chain inside each host and the double binary tree across
  hosts, with NCCL's TREE / SPLIT_TREE / BALANCED_TREE choice of which local ranks carry
  the host-to-host links.

Everything here is pure data and pure functions (no numpy, no I/O): algorithm generators
walk these structures to emit schedules, and ``polycast tree`` draws them.

Two shapes are returned. :class:`Tree` keeps NCCL's two child *slots* (child0, child1),
because the slot is meaningful (it is the "child type" a parent uses to tell its children
apart, and tree 1 keeps the slots of the relabelled computation). :class:`KaryTree` has an
ordered list of any number of children, for binomial trees and the hierarchical form where
a rank can have up to three. Both offer the same walking helpers (``parent``,
``children``, ``bfs_order``, ``depth``...), and ``Tree.as_kary()`` converts.
"""

from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass

from ..errors import InvalidArgument, UnknownName

#: Marks an empty parent or child slot, as in NCCL.
NONE = -1

#: Hierarchical patterns -> (local rank carrying the child0 host link, ... child1 link).
#: The parent link of a host is always on its local rank 0 (the head of its chain).
TREE_PATTERNS: dict[str, tuple[int, int]] = {
    "tree": (0, 0),        # NCCL_TOPO_PATTERN_TREE
    "split": (1, 1),       # NCCL_TOPO_PATTERN_SPLIT_TREE
    "balanced": (1, 0),    # NCCL_TOPO_PATTERN_BALANCED_TREE: child0Index = 1, child1Index = 0
}
_PATTERN_ALIASES = {"split_tree": "split", "balanced_tree": "balanced"}


# --------------------------------------------------------------------------- data


class _Walk:
    """Walking helpers shared by :class:`Tree` and :class:`KaryTree`.

    Subclasses provide ``root``, ``nodes`` (one per rank, in rank order, each with a
    ``parent``) and ``children(rank)``.
    """

    root: int
    nodes: list

    @property
    def nranks(self) -> int:
        return len(self.nodes)

    def parent(self, rank: int) -> int:
        """The parent of ``rank``, or -1 for the root."""
        return self.nodes[rank].parent

    def children(self, rank: int) -> list[int]:   # pragma: no cover - abstract
        raise NotImplementedError

    def is_leaf(self, rank: int) -> bool:
        return not self.children(rank)

    def leaves(self) -> list[int]:
        return [r for r in range(self.nranks) if self.is_leaf(r)]

    def interior(self) -> list[int]:
        """Ranks with at least one child: the ones that forward data."""
        return [r for r in range(self.nranks) if not self.is_leaf(r)]

    def bfs_order(self) -> list[int]:
        """Ranks level by level from the root, children in their stored order.

        This is an order in which a broadcast can be scheduled: every rank comes after its
        parent. Reversed, it is an order for a reduce (every rank after its children).
        Ranks not reachable from the root (a malformed tree) are left out.
        """
        order, queue, seen = [], deque([self.root]), {self.root}
        while queue:
            r = queue.popleft()
            order.append(r)
            for c in self.children(r):
                if c not in seen:         # guards against cycles in hand-built trees
                    seen.add(c)
                    queue.append(c)
        return order

    def levels(self) -> list[int]:
        """The number of edges from the root to each rank, in rank order (-1 if unreachable)."""
        level = [NONE] * self.nranks
        for r in self.bfs_order():
            p = self.parent(r)
            level[r] = 0 if r == self.root else level[p] + 1
        return level

    def depth(self) -> int:
        """Edges on the longest root-to-leaf path (0 for a lone root).

        A pipelined broadcast or reduce pays this many hops of latency.
        """
        return max(self.levels())


@dataclass(frozen=True)
class TreeNode:
    """One rank of an NCCL binary tree: its parent and its two child slots (-1 = none)."""

    rank: int
    parent: int = NONE
    child0: int = NONE
    child1: int = NONE


@dataclass(frozen=True)
class Tree(_Walk):
    """An NCCL binary tree: the root and one :class:`TreeNode` per rank, in rank order."""

    root: int
    nodes: list[TreeNode]

    def children(self, rank: int) -> list[int]:
        """The non-empty child slots of ``rank`` in NCCL order (child0, then child1)."""
        node = self.nodes[rank]
        return [c for c in (node.child0, node.child1) if c != NONE]

    def child_slot(self, rank: int) -> int:
        """The slot (0 or 1) ``rank`` occupies in its parent; -1 for the root.

        NCCL calls it the child type; a parent uses it to tell its two children apart.
        """
        p = self.nodes[rank].parent
        if p == NONE:
            return NONE
        return 0 if self.nodes[p].child0 == rank else 1

    def as_kary(self) -> KaryTree:
        """The same tree with children as ordered lists (child0 first), losing slot identity."""
        return KaryTree(self.root, [KaryNode(n.rank, n.parent, tuple(self.children(n.rank)))
                                    for n in self.nodes])


@dataclass(frozen=True)
class KaryNode:
    """One rank of a tree with any number of children, in the order the rank serves them."""

    rank: int
    parent: int = NONE
    children: tuple[int, ...] = ()


@dataclass(frozen=True)
class KaryTree(_Walk):
    """A rooted tree with ordered children: binomial trees and the hierarchical dbtree."""

    root: int
    nodes: list[KaryNode]

    def children(self, rank: int) -> list[int]:
        return list(self.nodes[rank].children)


# --------------------------------------------------------------------------- checks


def _count(what: str, value) -> int:
    """``value`` as an int >= 1, or a clear :class:`InvalidArgument`."""
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{what} must be an integer, got {value!r}") from None
    if n < 1:
        raise InvalidArgument(f"{what} must be at least 1, got {n}")
    return n


def _rank(what: str, value, n: int) -> int:
    try:
        r = operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{what} must be an integer, got {value!r}") from None
    if not 0 <= r < n:
        raise InvalidArgument(f"{what} {r} out of range for {n} ranks (0..{n - 1})")
    return r


def tree_pattern(name: str) -> str:
    """The canonical hierarchical pattern name: "tree", "split" or "balanced".

    Accepts NCCL's spellings too ("SPLIT_TREE", "balanced-tree"...).
    """
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else None
    key = _PATTERN_ALIASES.get(key, key)
    if key not in TREE_PATTERNS:
        raise UnknownName("tree pattern", name, [*TREE_PATTERNS, *_PATTERN_ALIASES])
    return key


# --------------------------------------------------------------------------- NCCL trees


def _largest_pow2_below(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def nccl_tree0(rank: int, n: int) -> tuple[int, int, int]:
    """``(parent, child0, child1)`` of ``rank`` in NCCL's tree 0 over ``n`` ranks (-1 = none).

    The bit-trick tree rooted at 0 (specs/dbtree.md): a rank's lowest set bit b says how
    big its subtree is, so parents and children are found by flipping bits, with no
    tree built. Odd ranks are leaves, which is what lets tree 1 use them as its interior.
    """
    n = _count("nranks", n)
    rank = _rank("rank", rank, n)
    if rank == 0:
        # The root's lone child is > 0, so it sits in slot child1 (it is "right" of 0).
        return NONE, NONE, (_largest_pow2_below(n) if n > 1 else NONE)
    b = rank & -rank
    parent = (rank ^ b) | (b << 1)
    if parent >= n:
        parent = rank ^ b
    h = b >> 1
    if h == 0:
        return parent, NONE, NONE
    # child0 = rank - h is always in range; child1 shrinks its offset until it fits.
    m = h
    while m and rank + m >= n:
        m >>= 1
    return parent, rank - h, (rank + m if m else NONE)


def nccl_tree1(rank: int, n: int) -> tuple[int, int, int]:
    """``(parent, child0, child1)`` of ``rank`` in NCCL's complementary tree 1.

    Even n: tree 0 mirrored (r -> n-1-r), root n-1. Odd n: tree 0 shifted by one
    (r -> r+1 mod n), root 1, because a mirror would map odd ranks onto odd ranks and the
    leaves of tree 0 would stay leaves. Slots are kept from the relabelled computation, as
    NCCL does, so in tree 1 child0 may be the larger rank.
    """
    n = _count("nranks", n)
    rank = _rank("rank", rank, n)
    if n % 2 == 0:
        src, relabel = n - 1 - rank, (lambda x: n - 1 - x)
    else:
        src, relabel = (rank - 1) % n, (lambda x: (x + 1) % n)
    return tuple(NONE if x == NONE else relabel(x) for x in nccl_tree0(src, n))


def _tree_of(links, n: int) -> Tree:
    nodes = [TreeNode(r, *links(r, n)) for r in range(n)]
    root = next(node.rank for node in nodes if node.parent == NONE)
    return Tree(root, nodes)


def binary_tree(n: int) -> Tree:
    """NCCL's tree 0 over ``n`` ranks as a :class:`Tree` (root 0)."""
    return _tree_of(nccl_tree0, _count("nranks", n))


def nccl_dbtree(n: int) -> tuple[Tree, Tree]:
    """NCCL's double binary tree over ``n`` ranks: ``(tree 0, tree 1)``.

    Each tree carries half of the data; for even n no rank is interior in both, for odd n
    only rank 0 is, so every rank's links are busy in one tree while idle in the other.
    """
    n = _count("nranks", n)
    return _tree_of(nccl_tree0, n), _tree_of(nccl_tree1, n)


# --------------------------------------------------------------------------- binomial


def binomial_tree(n: int, root: int = 0) -> KaryTree:
    """The binomial tree of binomial broadcast/reduce over ``n`` ranks rooted at ``root``.

    Works on relative ranks v = (r - root) mod n: v's parent is v with its lowest set bit
    cleared, and v's children are v + m for m = (lowest set bit)/2, /4, ..., 1 while in
    range. Children are listed largest subtree first, the order in which a binomial
    broadcast sends to them so the biggest subtree starts soonest. Depth is floor(log2 n)
    (a broadcast takes ceil(log2 n) rounds: the root's children are served one per round).
    """
    n = _count("nranks", n)
    root = _rank("root", root, n)
    span_of_root = 1 << (n - 1).bit_length()       # smallest power of two >= n
    nodes = []
    for r in range(n):
        v = (r - root) % n
        low = v & -v if v else span_of_root
        parent = NONE if v == 0 else (v - low + root) % n
        kids, m = [], low >> 1
        while m:
            if v + m < n:
                kids.append((v + m + root) % n)
            m >>= 1
        nodes.append(KaryNode(r, parent, tuple(kids)))
    return KaryTree(root, nodes)


# --------------------------------------------------------------------------- hierarchical


def host_local(rank: int, ranks_per_host: int) -> tuple[int, int]:
    """``(host, local rank)`` of a rank in the host-major numbering rank = host*R + local."""
    return divmod(rank, ranks_per_host)


def hierarchical_dbtree(hosts: int, ranks_per_host: int,
                        pattern: str = "tree") -> tuple[KaryTree, KaryTree]:
    """The double binary tree across hosts with a chain inside each host.

    NCCL builds its trees over nodes, not ranks (specs/dbtree.md, "Across nodes only"):
    local ranks 0 -> 1 -> ... -> R-1 of a host form a chain, the host's local rank 0 links
    to its parent host, and ``pattern`` says which local rank links to the child hosts
    (each child host is entered at its local rank 0):

    * ``"tree"``: local 0 for both child hosts;
    * ``"split"``: local 1 for both (local 0 if R == 1);
    * ``"balanced"``: local 1 for child0 (0 if R == 1), local 0 for child1 -- NCCL's
      ``ncclTopoPreset`` (``child0Index = 1``, ``child1Index = 0``).

    Ranks are host-major (rank = host*R + local). Each rank's children are ordered as
    NCCL fills its ``down[]`` array: the next rank on the chain first, then the child0
    host, then the child1 host, so a rank has at most three children. With R == 1 (any
    pattern) this equals ``tuple(t.as_kary() for t in nccl_dbtree(hosts))``.
    """
    H = _count("hosts", hosts)
    R = _count("ranks_per_host", ranks_per_host)
    links = tuple(min(local, R - 1) for local in TREE_PATTERNS[tree_pattern(pattern)])
    return tuple(_hierarchical(host_tree, R, links) for host_tree in nccl_dbtree(H))


def _hierarchical(host_tree: Tree, R: int, links: tuple[int, int]) -> KaryTree:
    N = host_tree.nranks * R
    parent = [NONE] * N
    children: list[list[int]] = [[] for _ in range(N)]
    # Chains first: in NCCL the chain successor is down[0], set before the host links.
    for host in range(host_tree.nranks):
        for local in range(1, R):
            r = host * R + local
            parent[r] = r - 1
            children[r - 1].append(r)
    for node in host_tree.nodes:
        for slot, child_host in enumerate((node.child0, node.child1)):
            if child_host == NONE:
                continue
            src, dst = node.rank * R + links[slot], child_host * R
            parent[dst] = src
            children[src].append(dst)
    return KaryTree(host_tree.root * R,
                    [KaryNode(r, parent[r], tuple(children[r])) for r in range(N)])
